"""The back office: specs, pools, nodes, engines, launcher defaults, and a read-only view of jobs."""

import base64
import binascii
import json
import re
from typing import TYPE_CHECKING

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, Q
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from jobs import node_facts, node_keys
from jobs.allocation import waiting_reason
from jobs.images.availability import being_prepared, nodes_holding
from jobs.launch.command_builder import ENV_NAME_RE, SAFE_VALUE_RE
from jobs.launch.masking import mask_shell_text, masked
from jobs.models import (
    Attempt,
    Engine,
    EngineVersion,
    IllegalTransition,
    JobStatus,
    LauncherDefaults,
    Node,
    ResourcePool,
    ResourceSpec,
    SharedPath,
    Storage,
    TrainingJob,
    UserStoreKeys,
    Worker,
)
from jobs.object_store.client import ObjectStore, StoreError
from jobs.pages.capacity import console_processes
from jobs.results.checkpoints import lost_work_totals
from jobs.secret_box import seal_secret
from jobs.submission import task_queue
from jobs.submission.force_release import force_release_job, force_release_node
from jobs.submission.holds import end_holds_now
from jobs.submission.jobs import request_stop

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise

# The CSS class of each state's badge (static/admin_console/nodes.css: the CSP allows no inline style).
STATE_CLASSES = {
    Node.DisplayState.READY: "node-state-ready",
    Node.DisplayState.BUSY: "node-state-busy",
    Node.DisplayState.DRAINING: "node-state-draining",
    Node.DisplayState.NOT_READY: "node-state-notready",
}


@admin.register(ResourceSpec)
class ResourceSpecAdmin(admin.ModelAdmin):
    list_display = ["name", "display", "processes_per_node", "network", "max_nodes", "node_count"]
    list_filter = ["network"]
    search_fields = ["name", "gpu_model"]
    fieldsets = [
        (None, {"fields": ["name"]}),
        (_("Per node"), {"fields": ["gpu_count", "gpu_model", "cpu_cores", "memory_gb", "cpu_slots_per_node", "disk_gb"]}),
        (_("Between nodes"), {"fields": ["network", "max_nodes"]}),
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(nodes_total=Count("nodes"))

    @admin.display(description=_("flavor"))
    def display(self, spec):
        return spec.display

    @admin.display(description=_("nodes"), ordering="nodes_total")
    def node_count(self, spec):
        return spec.nodes_total


class ResourcePoolAdminForm(forms.ModelForm):
    slurm_url = forms.URLField(label=_("slurmrestd's address"), required=False, assume_scheme="http",
                               help_text=ResourcePool._meta.get_field("slurm_url").help_text)
    # Write-only, as a node's key: sealed when saved and never rendered back.
    slurm_token = forms.CharField(
        label=_("Slurm token"), required=False, strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text=_("A JWT for the Slurm user (`scontrol token username=U lifespan=S`): it expires. Stored sealed and "
                    "never shown again; leave empty to keep the saved one."))
    slurm_jwt_key = forms.CharField(
        label=_("Slurm JWT key (base64)"), required=False, strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text=_("Instead of a token: the cluster's HS256 key (`base64 -w0 jwt_hs256.key`), from which the console "
                    "makes a short-lived token for each look. Stored sealed and never shown again."))

    class Meta:
        model = ResourcePool
        fields = ["name", "kind", "backend", "slurm_url", "slurm_partition", "slurm_user", "slurm_account",
                  "slurm_token", "slurm_jwt_key", "slurm_root_ssh"]

    def clean_slurm_user(self):
        user = self.cleaned_data.get("slurm_user", "")
        if user and not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", user):
            raise forms.ValidationError(_("A Slurm user is a Unix account name: lower-case letters, digits, '_', '.', '-'."))
        if user == "root":
            raise forms.ValidationError(_("The console does not submit as root: name the Slurm user the site gave it."))
        return user

    def clean_slurm_token(self):
        token = self.cleaned_data.get("slurm_token", "")
        if token and not re.fullmatch(r"[A-Za-z0-9_=.-]+", token):
            raise forms.ValidationError(_("A JWT holds only letters, digits and '-', '_', '.', '='."))
        return token

    def clean_slurm_jwt_key(self):
        text = self.cleaned_data.get("slurm_jwt_key", "")
        if text:
            try:
                key = base64.b64decode(text, validate=True)
            except (ValueError, binascii.Error):
                raise forms.ValidationError(_("This is not base64.")) from None
            if len(key) < 16:
                raise forms.ValidationError(_("An HS256 key this short is refused: Slurm's are 32 bytes or more."))
        return text

    def clean(self):
        cleaned = super().clean() or {}
        pool = self.instance
        moved = [field for field in ("backend", "slurm_url", "slurm_partition", "slurm_user", "slurm_root_ssh")
                 if pool.pk and field in cleaned and cleaned[field] != getattr(pool, field)]
        if moved and TrainingJob.objects.filter(pool=pool, slurm_job_id__isnull=False, slurm_released=False).exists():
            # Their Slurm jobs would never be given back, nor their queued ones looked at where they are; and a batch
            # job submitted for one way of reaching the nodes cannot serve the other (only STEP_SCRIPT starts
            # containers).
            raise forms.ValidationError(_("This pool's jobs hold Slurm jobs: its backend, slurmrestd's address, "
                                          "partition, Slurm user and root SSH can change once they have ended."))
        if cleaned.get("backend") == ResourcePool.Backend.SLURM and not (
                cleaned.get("slurm_token") or cleaned.get("slurm_jwt_key") or self.instance.sealed_slurm_token
                or self.instance.sealed_slurm_jwt_key):
            raise forms.ValidationError(_("A Slurm pool needs a token or the cluster's JWT key."))
        return cleaned

    def save(self, commit=True):
        pool = super().save(commit=False)
        if self.cleaned_data.get("slurm_token"):
            pool.sealed_slurm_token, pool.sealed_slurm_jwt_key = seal_secret(self.cleaned_data["slurm_token"]), ""
        if self.cleaned_data.get("slurm_jwt_key"):
            pool.sealed_slurm_jwt_key, pool.sealed_slurm_token = seal_secret(self.cleaned_data["slurm_jwt_key"]), ""
        if commit:
            pool.save()
        return pool


@admin.register(ResourcePool)
class ResourcePoolAdmin(admin.ModelAdmin):
    form = ResourcePoolAdminForm
    list_display = ["name", "kind", "backend", "node_count", "ready_count", "queue_length", "slurm_status"]
    list_filter = ["kind", "backend"]
    readonly_fields = ["slurm_status", "slurm_checked_at", "node_access"]
    actions = ["check_slurm"]

    def get_fieldsets(self, request, obj=None):
        return [(None, {"fields": ["name", "kind", "backend"]}),
                (_("Slurm"), {"fields": ["slurm_url", "slurm_partition", "slurm_user", "slurm_account", "slurm_token",
                                         "slurm_jwt_key", "slurm_root_ssh", "node_access", "slurm_status",
                                         "slurm_checked_at"],
                              "description": _("Only for a pool whose backend is Slurm: Slurm allocates its nodes, "
                                               "the console launches the jobs on them.")})]

    @admin.display(description=_("how the console reaches the nodes"))
    def node_access(self, pool):
        if not pool.is_slurm:
            return _("as root over SSH, on the nodes it owns")
        if pool.slurm_root_ssh:
            return _("as root over SSH, on the nodes Slurm allocates: an administrator's choice for this pool; the "
                     "containers run outside Slurm's cgroups, under the console's network policy")
        return _("as the Slurm user %(user)s, never as root: the job's Slurm step runs its containers with that "
                 "user's rootless Podman, in Slurm's cgroups of the job (its limits and accounting); register the "
                 "nodes with that user and its key. The site's firewall stands for the console's network policy "
                 "(nftables, which needs root).") % {"user": pool.slurm_user or "?"}

    @admin.action(description=_("Check the selected Slurm pools' connection now"), permissions=["change"])
    def check_slurm(self, request, queryset):
        pools = [pool for pool in queryset if pool.is_slurm]
        for pool in pools:
            task_queue.check_slurm_pool_soon(pool.pk)
        self.message_user(request, _("%(count)s Slurm pool(s) will be checked within seconds; their status column "
                                     "says what was found.") % {"count": len(pools)})

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            nodes_total=Count("nodes", distinct=True),
            nodes_ready=Count(
                "nodes",
                filter=Q(nodes__enabled=True, nodes__draining=False, nodes__state=Node.State.READY,
                         nodes__allocated_to__isnull=True),
                distinct=True,
            ),
            queued=Count("jobs", filter=Q(jobs__status=JobStatus.PENDING), distinct=True),
        )

    @admin.display(description=_("nodes"), ordering="nodes_total")
    def node_count(self, pool):
        url = reverse("admin:jobs_node_changelist") + f"?pool__id__exact={pool.pk}"
        return format_html('<a href="{}">{}</a>', url, pool.nodes_total)

    @admin.display(description=_("free"), ordering="nodes_ready")
    def ready_count(self, pool):
        return pool.nodes_ready

    @admin.display(description=_("queued jobs"), ordering="queued")
    def queue_length(self, pool):
        return pool.queued


class LabelsField(forms.CharField):
    """Node labels typed as `key=value` lines, kept as a JSON object."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 40})

    def prepare_value(self, value):
        if isinstance(value, dict):
            return "\n".join(f"{key}={item}" for key, item in value.items())
        return value

    def to_python(self, value):
        labels = {}
        for number, line in enumerate((value or "").splitlines(), start=1):
            if not line.strip():
                continue
            key, sep, item = line.partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(_("Line %(n)s: write key=value."), params={"n": number})
            labels[key.strip()] = item.strip()
        return labels


class NodeAdminForm(forms.ModelForm):
    # Write-only: the saved key is sealed and never rendered back into the page.
    private_key = forms.CharField(
        label=_("SSH private key"),
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 70, "autocomplete": "off", "spellcheck": "false"}),
        help_text=_("OpenSSH private key the console logs in with (no passphrase). It is stored sealed and never "
                    "shown again; leave empty to keep the saved key."),
    )
    labels = LabelsField(required=False, help_text=_("One key=value per line."))

    class Meta:
        model = Node
        fields = ["name", "address", "ssh_port", "ssh_user", "private_key", "host_key", "spec", "pool", "enabled",
                  "draining", "labels"]
        help_texts = {
            "host_key": _("The node's OpenSSH host key, e.g. 'ssh-ed25519 AAAA…'. Leave empty to pin the key the "
                          "node shows at its first check; a node that later shows another key is refused."),
        }

    def clean_private_key(self):
        text = self.cleaned_data.get("private_key", "")
        if not text.strip():
            if not self.instance.sealed_private_key:
                raise forms.ValidationError(_("A new node needs the private key the console logs in with."))
            return ""
        data = text.strip().encode()
        loader = serialization.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data else serialization.load_pem_private_key
        try:
            loader(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as error:
            raise forms.ValidationError(_("This is not a usable private key: %(error)s"), params={"error": error}) from None
        return text.strip() + "\n"

    def clean_host_key(self):
        text = " ".join(self.cleaned_data.get("host_key", "").split())
        if not text:
            return ""
        try:
            key = serialization.load_ssh_public_key(text.encode())
        except (ValueError, UnsupportedAlgorithm) as error:
            raise forms.ValidationError(_("This is not an OpenSSH public key: %(error)s"), params={"error": error}) from None
        return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode().strip()

    def save(self, commit=True):
        node = super().save(commit=False)
        if self.cleaned_data.get("private_key"):
            node.private_key = self.cleaned_data["private_key"]
        if commit:
            node.save()
        return node


class DisplayStateFilter(admin.SimpleListFilter):
    """Filter by the state the list shows, which combines health, the switches and the allocation."""

    title = _("state")
    parameter_name = "display_state"
    HEALTHY = Q(enabled=True, state=Node.State.READY)
    CONDITIONS = {
        Node.DisplayState.READY: HEALTHY & Q(draining=False, allocated_to__isnull=True),
        Node.DisplayState.BUSY: HEALTHY & Q(draining=False, allocated_to__isnull=False),
        Node.DisplayState.DRAINING: HEALTHY & Q(draining=True),
        Node.DisplayState.NOT_READY: ~HEALTHY,
    }

    def lookups(self, request, model_admin):
        return Node.DisplayState.choices

    def queryset(self, request, queryset):
        chosen = self.value()
        condition = self.CONDITIONS.get(Node.DisplayState(chosen)) if chosen in self.CONDITIONS else None
        return queryset.filter(condition) if condition is not None else queryset


# What reaching a node depends on: a change to any of these calls for a fresh check.
CONNECTION_FIELDS = {"address", "ssh_port", "ssh_user", "private_key", "host_key"}


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    form = NodeAdminForm
    list_display = ["name", "endpoint", "spec", "pool", "state_badge", "job", "last_seen", "health_summary",
                    "label_list"]
    list_filter = [DisplayStateFilter, "pool", "spec", "enabled"]
    search_fields = ["name", "address"]
    list_select_related = ["spec", "pool", "allocated_to"]
    readonly_fields = ["state_badge", "job", "last_seen", "last_checked_at", "last_check_message", "images", "health_facts",
                       "login_key"]
    actions = ["check_now", "drain", "enable", "force_release"]

    class Media:
        css = {"all": ["admin_console/nodes.css"]}
    fieldsets = [
        (None, {"fields": ["name", "spec", "pool", "labels"]}),
        (_("SSH"), {"fields": ["address", "ssh_port", "ssh_user", "login_key", "private_key", "host_key"]}),
        (_("Scheduling"), {"fields": ["enabled", "draining", "state_badge", "job"]}),
        (_("Health"), {"fields": ["last_seen", "last_checked_at", "last_check_message", "images", "health_facts"]}),
    ]

    def changelist_view(self, request, extra_context=None):
        # A hung beat checks no node: a node whose link came back would stay NotReady with nothing said.
        return super().changelist_view(request, {**(extra_context or {}), **console_processes()})

    def get_fieldsets(self, request, obj=None):
        # The private key is a write-only form field. Without the change permission Django renders every field
        # read-only from the model, and the model's `private_key` unseals: a viewer gets the key's public half.
        if self.has_change_permission(request, obj):
            return self.fieldsets
        return [(title, {**options, "fields": [name for name in options["fields"] if name != "private_key"]})
                for title, options in self.fieldsets]

    @admin.display(description=_("login key"))
    def login_key(self, node):
        return node_keys.public_summary(node.sealed_private_key) or "-"

    @admin.display(description=_("SSH"))
    def endpoint(self, node):
        return f"{node.ssh_user}@{node.address}:{node.ssh_port}"

    @admin.display(description=_("state"), ordering="state")
    def state_badge(self, node):
        return format_html('<strong class="node-state {}" title="{}">{}</strong>', STATE_CLASSES[node.display_state],
                           node.display_state_reason, Node.DisplayState(node.display_state).label)

    @admin.display(description=_("job"))
    def job(self, node):
        if not node.allocated_to_id:
            return "-"
        url = reverse("admin:jobs_trainingjob_change", args=[node.allocated_to_id])
        return format_html('<a href="{}">{}</a>', url, node.allocated_to)

    @admin.display(description=_("last health check"))
    def health_summary(self, node):
        problems = node_facts.spec_contradictions(node.health, node.spec)
        found = node_facts.facts_summary(node.health)
        if node.state != Node.State.READY:
            found = node.state_message
        warnings = format_html_join("", '<br><span class="node-warning">⚠ {}</span>',
                                    ((problem,) for problem in problems))
        return format_html("{}{}", found or "-", warnings)

    @admin.display(description=_("labels"))
    def label_list(self, node):
        return ", ".join(f"{key}={value}" for key, value in node.labels.items())

    @admin.display(description=_("engine images"))
    def images(self, node):
        """Which engine versions' images the last health check found here, and what bringing them last did."""
        held = set(node.health.get("images") or [])
        rows = [(version, _("here") if version.image in held else _("missing"))
                for version in EngineVersion.objects.exclude(image="").select_related("engine")]
        listed = format_html_join("", "<li>{} {}: {}</li>", ((version.engine.name, version.version, where)
                                                                for version, where in rows))
        transfer = node.image_transfer or {}
        last = format_html("<p>{} <span class=\"quiet\">({})</span></p>", transfer["text"], transfer.get("at", "")) \
            if transfer.get("text") else ""
        return format_html("<ul>{}</ul>{}", listed, last)

    @admin.display(description=_("facts"))
    def health_facts(self, node):
        return format_html("<pre>{}</pre>", _pretty(node.health))

    def save_model(self, request, node, form, change):
        if not change:
            # Not schedulable before a check has reached it.
            node.state, node.state_message = Node.State.NOT_READY, "waiting for its first health check"
        super().save_model(request, node, form, change)
        if not change or CONNECTION_FIELDS & set(form.changed_data):
            # By a worker after the commit, never in the request: SSH takes seconds, and may hang until its timeout.
            node_ids = [node.pk]
            transaction.on_commit(lambda: self._queue_check(request, node_ids))
        if node.enabled and (not change or {"enabled", *CONNECTION_FIELDS} & set(form.changed_data)):
            # A new or newly enabled node takes the engine images now, not with its first job of each engine.
            prefetched = [node.pk]
            transaction.on_commit(lambda: task_queue.prefetch_images_soon(prefetched))

    def _queue_check(self, request, node_ids: list[int]) -> None:
        if task_queue.check_nodes_soon(node_ids):
            self.message_user(request, _("A health check of %(count)s node(s) is queued: their state and facts "
                                         "show in the list within seconds.") % {"count": len(node_ids)})
        else:
            self.message_user(request, _("The health check could not be queued (is the broker up?); the periodic "
                                         "check will come."), messages.WARNING)

    @admin.action(description=_("Check the selected nodes now"), permissions=["change"])
    def check_now(self, request, queryset):
        self._queue_check(request, list(queryset.values_list("pk", flat=True)))

    @admin.action(description=_("Drain the selected nodes (finish the current job, take no new one)"),
                  permissions=["change"])
    def drain(self, request, queryset):
        count = queryset.update(draining=True)
        self.message_user(request, _("%(count)s node(s) draining.") % {"count": count})

    @admin.action(description=_("Force release the selected nodes (their job has ended or is gone)"),
                  permissions=["change"])
    def force_release(self, request, queryset):
        return confirm_force_release(
            self, request, queryset, "force_release", force_release_node,
            _("A node is freed only when no live job holds it; it stays out of service until a health check "
              "has removed what its last job left."))

    @admin.action(description=_("Enable the selected nodes (and stop draining them)"), permissions=["change"])
    def enable(self, request, queryset):
        node_ids = list(queryset.values_list("pk", flat=True))
        count = queryset.update(enabled=True, draining=False)
        task_queue.wake_dispatcher()
        # An enabled node takes the engine images now, not with its first job of each engine.
        transaction.on_commit(lambda: task_queue.prefetch_images_soon(node_ids))
        self.message_user(request, _("%(count)s node(s) enabled.") % {"count": count})


def _pretty(facts: dict) -> str:
    return json.dumps(facts, indent=2, sort_keys=True) if facts else "-"


class EngineVersionForm(forms.ModelForm):
    class Meta:
        model = EngineVersion
        fields = ["version", "image", "python", "default_env"]

    def clean_default_env(self):
        env = self.cleaned_data.get("default_env") or {}
        if not isinstance(env, dict):
            raise forms.ValidationError(_('Give an object of NAME: value pairs, e.g. {"NCCL_DEBUG": "INFO"}.'))
        for name, value in env.items():
            if not ENV_NAME_RE.match(name):
                raise forms.ValidationError(_("%(name)r is not a valid variable name."), params={"name": name})
            if not isinstance(value, (str, int, float)):
                raise forms.ValidationError(_("The value of %(name)s must be text or a number."), params={"name": name})
            # An MCA parameter reaches the remote orted's command line unquoted: the same rule as for users.
            if name.startswith("OMPI_MCA_") and not SAFE_VALUE_RE.match(str(value)):
                raise forms.ValidationError(_("The value of %(name)s may hold only letters, digits and _ . , : / = + @ %% ^ -."),
                                            params={"name": name})
        return {name: str(value) for name, value in env.items()}


class EngineVersionInline(admin.TabularInline):
    model = EngineVersion
    form = EngineVersionForm
    extra = 0
    readonly_fields = ["image_on_nodes"]

    @admin.display(description=_("image on nodes"))
    def image_on_nodes(self, version):
        if not version.pk or not version.image:
            return "-"
        holding = nodes_holding(version.image)
        state = _("being prepared") if being_prepared(version.image) else ""
        listed = ", ".join(holding) if holding else _("none yet (the nodes are being given it)")
        return f"{listed}{' · ' + str(state) if state else ''}"


@admin.register(Engine)
class EngineAdmin(admin.ModelAdmin):
    list_display = ["name", "versions"]
    inlines = [EngineVersionInline]

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        # A new version, or one whose image changed, goes to the nodes now, not with its first job on each.
        version_ids = [version.pk for version in formset.new_objects if version.image]
        version_ids += [version.pk for version, changed in formset.changed_objects if "image" in changed and version.image]
        if version_ids:
            transaction.on_commit(lambda: task_queue.prefetch_images_soon(None, version_ids))

    @admin.display(description=_("versions"))
    def versions(self, engine):
        return ", ".join(version.version for version in engine.versions.all())

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("versions")


@admin.register(LauncherDefaults)
class LauncherDefaultsAdmin(admin.ModelAdmin):
    """One row of defaults: the list goes straight to it, and it can be neither added twice nor deleted."""

    fieldsets = [
        (_("mpirun options"), {"fields": ["bind_args", "x_args", "mca_args"]}),
        (_("Tune file and job sshd"), {"fields": ["tune_prefixes", "sshd_port_min", "sshd_port_max"]}),
        (_("Logs, watchdog and outputs"), {"fields": ["log_cap_bytes", "watchdog_seconds", "watchdog_may_stop", "outputs_max_bytes"]}),
        (_("Jobs' network"), {"fields": ["job_allowed_destinations"]}),
        (_("Notice before a stop, and holds of failed jobs"), {"fields": ["checkpoint_grace_max_seconds",
                                                                           "debug_hold_max_minutes"]}),
    ]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        return redirect("admin:jobs_launcherdefaults_change", LauncherDefaults.current().pk)


class WorkerInline(admin.TabularInline):
    model = Worker
    fields = ["index", "node_name", "address", "hostname", "state", "message"]
    readonly_fields = ["index", "node_name", "address", "hostname", "state", "message"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    """Jobs as records: looked at and stopped from here, never edited."""

    list_display = ["id", "name", "owner", "status", "spec", "pool", "node_count", "created_at", "started_at",
                    "ended_at", "exit_code"]
    list_filter = ["status", "pool", ("owner", admin.RelatedOnlyFieldListFilter), "created_at"]
    date_hierarchy = "created_at"
    search_fields = ["name", "owner__username"]
    list_select_related = ["owner", "spec", "pool"]
    actions = ["stop_selected", "force_release", "end_debug_holds"]
    inlines = [WorkerInline]
    fieldsets = [
        (None, {"fields": ["name", "description", "owner", "status", "status_message", "queue", "exit_code"]}),
        (_("Program"), {"fields": ["engine_version", "code_dir", "boot_file", "shown_parameters", "shown_env"]}),
        (_("Resources"), {"fields": ["spec", "pool", "node_count", "auto_stop_hours"]}),
        (_("As launched"), {"fields": ["shown_command_template", "shown_command", "hostfile", "tune_file", "bind_args",
                                       "x_args", "mca_args", "shown_extra_args", "tune_prefixes", "sshd_port"]}),
        (_("Times"), {"fields": ["created_at", "started_at", "ended_at", "log_line_count"]}),
    ]

    def get_readonly_fields(self, request, obj=None):
        return [name for _title, options in self.fieldsets for name in options["fields"]]

    @admin.display(description=_("waiting"))
    def queue(self, job):
        return waiting_reason(job) or "-"

    # The job's own values are its owner's: here, as on the API for anyone else, secrets are masked.
    @admin.display(description=_("parameters"))
    def shown_parameters(self, job):
        return format_html("<pre>{}</pre>", "\n".join(
            f"--{item['name']}={masked(item['name'], str(item['value']))}" for item in job.parameters) or "-")

    @admin.display(description=_("environment variables"))
    def shown_env(self, job):
        return format_html("<pre>{}</pre>", "\n".join(
            f"{name}={masked(name, str(value))}" for name, value in job.env.items()) or "-")

    @admin.display(description=_("command template"))
    def shown_command_template(self, job):
        return format_html("<pre>{}</pre>", mask_shell_text(job.command_template) or "-")

    @admin.display(description=_("command"))
    def shown_command(self, job):
        return format_html("<pre>{}</pre>", mask_shell_text(job.command) or "-")

    @admin.display(description="OPENMPI_EXTRA_ARGS")
    def shown_extra_args(self, job):
        return mask_shell_text(job.extra_args) or "-"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_stop_permission(self, request):
        return request.user.has_perm("jobs.change_trainingjob")

    @admin.action(description=_("Stop the selected jobs"), permissions=["stop"])
    def stop_selected(self, request, queryset):
        stopped, refused = 0, []
        # One transaction for all of them: a database that cannot take it (console.database_busy answers) leaves
        # every job as it was, rather than some stopped and the rest not.
        with transaction.atomic():
            for job in queryset:
                try:
                    request_stop(job, by=request.user.get_username())
                    stopped += 1
                except IllegalTransition:
                    refused.append(f"{job.name} ({job.status})")
        if stopped:
            self.message_user(request, _("%(count)s job(s) asked to stop.") % {"count": stopped})
        if refused:
            self.message_user(request, _("Not stoppable: %(jobs)s") % {"jobs": ", ".join(refused)}, messages.WARNING)

    @admin.action(description=_("End the debugging hold of the selected jobs (their containers go, their nodes are freed)"),
                  permissions=["stop"])
    def end_debug_holds(self, request, queryset):
        # A held job keeps its nodes from everyone else's jobs: an admin who needs them back need not wait for
        # the hold's end, nor reach for force release (which would leave the nodes out of service).
        ended = end_holds_now(queryset, f"Ended early by the administrator {request.user.get_username()}")
        if ended:
            self.message_user(request, _("Hold ended for %(count)s job(s); their nodes are freed within seconds.")
                              % {"count": len(ended)})
        if len(ended) < queryset.count():
            self.message_user(request, _("The other selected jobs were not held."), messages.WARNING)

    @admin.action(description=_("Force release the selected jobs (end them without reaching their nodes)"),
                  permissions=["stop"])
    def force_release(self, request, queryset):
        return confirm_force_release(
            self, request, queryset, "force_release", force_release_job,
            _("Each job ends Abnormal at once, without its nodes being reached; its nodes stay out of service "
              "until a health check has removed what the job left on them."))


def confirm_force_release(model_admin, request, queryset, action: str, release, explanation: "str | StrPromise"):
    """Ask first (a page listing what is released), then release each and say how it went; both audited."""
    if request.POST.get("confirmed") != "yes":
        return TemplateResponse(request, "admin/jobs/force_release.html", {
            **model_admin.admin_site.each_context(request), "title": _("Force release?"), "items": list(queryset),
            "explanation": explanation, "action": action, "back": request.get_full_path()})
    released, refused = [], []
    # All or nothing, as a stop of several jobs is.
    with transaction.atomic():
        for item in queryset:
            try:
                release(item, request.user)
                released.append(str(item))
            except IllegalTransition as error:
                refused.append(f"{item}: {error}")
        if released:
            transaction.on_commit(task_queue.check_nodes_soon)
    if released:
        model_admin.message_user(request, _("Force released: %(items)s") % {"items": ", ".join(released)})
    if refused:
        model_admin.message_user(request, _("Not released: %(items)s") % {"items": "; ".join(refused)}, messages.WARNING)
    return None


class StorageAdminForm(forms.ModelForm):
    # Write-only, as node keys are: sealed when saved, never shown back (blank keeps what is stored).
    access_key = forms.CharField(required=False, strip=True, widget=forms.PasswordInput(render_value=False),
                                 help_text=_("Blank keeps the stored key."))
    secret_key = forms.CharField(required=False, strip=True, widget=forms.PasswordInput(render_value=False),
                                 help_text=_("Blank keeps the stored key."))

    class Meta:
        model = Storage
        fields = ["name", "endpoint_url", "region", "path_style", "schemes", "user_bucket_prefix", "pools",
                  "users_may_bring_keys", "enabled"]

    def clean(self):
        cleaned = super().clean() or {}
        given = [bool(cleaned.get("access_key")), bool(cleaned.get("secret_key"))]
        if any(given) and not all(given):
            raise forms.ValidationError(_("Give the access key and the secret key together."))
        if not any(given) and not self.instance.sealed_secret_key:
            raise forms.ValidationError(_("A store needs its access key and secret key."))
        return cleaned

    def save(self, commit=True):
        storage = super().save(commit=False)
        if self.cleaned_data.get("access_key"):
            storage.set_keys(self.cleaned_data["access_key"], self.cleaned_data["secret_key"])
        if commit:
            storage.save()
            self.save_m2m()
        return storage


@admin.register(Storage)
class StorageAdmin(admin.ModelAdmin):
    form = StorageAdminForm
    list_display = ["name", "endpoint_url", "schemes", "users_may_bring_keys", "enabled"]
    fields = ["name", "endpoint_url", "region", "path_style", "schemes", "access_key", "secret_key",
              "user_bucket_prefix", "pools", "users_may_bring_keys", "enabled"]
    filter_horizontal = ["pools"]
    actions = ["check_store"]

    @admin.action(description=_("Check the selected stores answer to their keys"), permissions=["change"])
    def check_store(self, request, queryset):
        for storage in queryset:
            try:
                ObjectStore(storage.access()).bucket_exists(storage.user_bucket(request.user.pk, request.user.get_username()))
            except StoreError as error:
                self.message_user(request, f"{storage.name}: {error}", messages.ERROR)
            else:
                self.message_user(request, _("%(name)s answers, and takes its keys.") % {"name": storage.name})


@admin.register(UserStoreKeys)
class UserStoreKeysAdmin(admin.ModelAdmin):
    """Who keeps their own keys to which store, and since when; an administrator may delete them (a user who left,
    keys known to have leaked), never read or change them: the sealed columns are in no view of this admin."""

    list_display = ["user", "storage", "set_at"]
    list_filter = ["storage"]
    search_fields = ["user__username"]
    list_select_related = ["user", "storage"]
    fields = ["user", "storage", "set_at"]
    readonly_fields = ["user", "storage", "set_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(SharedPath)
class SharedPathAdmin(admin.ModelAdmin):
    list_display = ["name", "path", "writable", "enabled"]
    filter_horizontal = ["pools"]


@admin.register(Attempt)
class AttemptAdmin(admin.ModelAdmin):
    """Each ended attempt and the work it lost since its last checkpoint; read-only (the runs write it), with
    the totals by user and by pool above the list."""

    list_display = ["job", "number", "ended_at", "node_count", "gpu_count", "last_checkpoint_step", "lost_seconds",
                    "lost_node_hours", "lost_gpu_hours"]
    list_filter = ["job__pool", "job__owner"]
    list_select_related = ["job"]
    ordering = ["-ended_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        totals = {"by_user": lost_work_totals("job__owner__username"), "by_pool": lost_work_totals("job__pool__name")}
        return super().changelist_view(request, {**(extra_context or {}), **totals})
