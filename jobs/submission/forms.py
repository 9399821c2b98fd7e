"""The job form: the one place a submission is validated, for the web page and the JSON API alike."""

import re
import secrets
from itertools import zip_longest
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Case, IntegerField, When
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from jobs.allocation import runnable_node_count, runnable_nodes
from jobs.backends.slurm import stop_before_limit_seconds
from jobs.code_dirs.service import python_files
from jobs.launch.checkpoint_contract import NOTICE_SIGNALS
from jobs.launch.command_builder import (
    ENV_NAME_RE,
    PARAM_NAME_RE,
    CommandError,
    allowed_options,
    boot_file_path,
    interfaces_named,
    validate_extra_args,
)
from jobs.launch.data_paths import is_data_location, is_input
from jobs.launch.masking import looks_secret
from jobs.launch.platform_env import user_variable_problem
from jobs.models import (
    RANK_EXIT_NEVER,
    CodeDirectory,
    EngineVersion,
    LauncherDefaults,
    ResourcePool,
    ResourceSpec,
    TrainingJob,
    WatchdogAction,
)
from jobs.node_facts import shared_interfaces
from jobs.object_store.urls import has_scheme
from jobs.results.metrics import MetricDefinitionError, validate_metric_definitions
from jobs.results.watchdog import rank_exit_grace
from jobs.row_ids import row_id
from jobs.submission.access import visible_code_dirs
from jobs.submission.object_urls import InputsListed, input_room, object_url_problem
from jobs.submission.shared_paths import shared_path_problem

# The command builder's words for a wrong boot file, in the page's language.
BUILDER_MESSAGES = {
    "must be a path inside the code directory, such as train.py": _("Give a path inside the code directory, such as train.py."),
    "must be a Python file (.py)": _("The boot file must be a Python file (.py)."),
}
# A job's name follows the same rule as a hyperparameter's: 1-64 of letters, digits, '-' and '_'.
NAME_RE = PARAM_NAME_RE
MAX_ENV_VARS = 100
# Variables reach every rank through mpirun's environment on every node: bounded like the parameters.
ENV_VALUE_MAX_CHARS = 4096
ENV_TOTAL_MAX_CHARS = 32768
# Hyperparameters travel as arguments of mpirun's command line on every node: bounded, and plain text (no
# NUL, which no argument can hold; no control character but tab, which terminals and logs would act on; no
# unpaired surrogate, which is not text and could not be shown or stored).
MAX_PARAMETERS = 100
PARAM_VALUE_MAX_CHARS = 4096
PARAMS_TOTAL_MAX_CHARS = 32768
PARAM_FORBIDDEN_CHARACTERS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
AUTO_STOP_CHOICES = [("", _("Off")), ("1", "1 h"), ("2", "2 h"), ("4", "4 h"), ("6", "6 h"), ("custom", _("Custom"))]
AUTO_STOP_PRESETS = {int(value) for value, _label in AUTO_STOP_CHOICES if value.isdigit()}
# The page sends these as they are; hyperparameters and variables come as rows (see page_data).
PAGE_SCALAR_FIELDS = ("name", "description", "engine", "code_dir", "boot_file", "data_url", "train_url", "spec",
                      "pool", "node_count", "extra_args", "auto_stop", "auto_stop_custom", "watchdog_seconds", "watchdog_action",
                      "rank_exit_grace_seconds", "max_restarts", "predownload", "checkpoint_grace_seconds", "checkpoint_signal", "resume_from_job",
                      "debug_hold_minutes")


def form_errors(form: forms.Form) -> dict[str, list[str]]:
    """A form's messages by field, as every JSON answer gives them."""
    return {field: [error["message"] for error in errors] for field, errors in form.errors.get_json_data().items()}


def generated_job_name() -> str:
    """A fresh name like the reference platform offers: readable, and unlikely to repeat."""
    return f"job-{timezone.localtime():%m%d}-{secrets.token_hex(2)}"


def _rows(post, prefix: str) -> list[dict[str, str]]:
    names, values = post.getlist(f"{prefix}_name"), post.getlist(f"{prefix}_value")
    rows = ({"name": name.strip(), "value": value} for name, value in zip_longest(names, values, fillvalue=""))
    return [row for row in rows if row["name"] or row["value"]]


def _kept_if_secret(name: str, value: str) -> dict:
    # A secret is never sent back to a page: the row comes empty, and the old value is kept unless retyped.
    if value and looks_secret(name, value):
        return {"name": name, "value": "", "kept": True}
    return {"name": name, "value": value}


def with_kept_secrets(data: dict, source) -> dict:
    """The page's rows with the rebuilt job's secret values put back where the row was left empty."""
    old_env = {name: str(value) for name, value in source.env.items()}
    old_parameters = {item["name"]: str(item["value"]) for item in source.parameters}
    for key, old in (("env", old_env), ("parameters", old_parameters)):
        for row in data.get(key) or []:
            value = old.get(row["name"], "")
            if row["value"] == "" and value and looks_secret(row["name"], value):
                row["value"] = value
    return data


def page_data(post) -> dict:
    """The creation page's POST in the shape the API posts: rows of name/value become lists.

    Rows left entirely blank are dropped, so an added-but-unused row is not an error.
    """
    data = {key: post.get(key) for key in PAGE_SCALAR_FIELDS if key in post}
    data["parameters"] = _rows(post, "param")
    data["env"] = _rows(post, "env")
    # No metric rows means the defaults; rows given replace them.
    metric_rows = _rows(post, "metric")
    if metric_rows:
        data["metrics"] = [{"name": row["name"], "regex": row["value"]} for row in metric_rows]
    return data


class NameOrIdChoiceField(forms.ModelChoiceField):
    """Accepts an object's id or its name, so API clients can say `"spec": "cpu-2"`."""

    def __init__(self, queryset, name_lookups: tuple[str, ...], **kwargs):
        super().__init__(queryset, **kwargs)
        self.name_lookups = name_lookups
        # Which of several objects of one name a name means: by default the newest.
        self.name_order: tuple[str, ...] = ("-pk",)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        assert self.queryset is not None, "every field of this kind is given its queryset"
        text = str(value).strip()
        number = row_id(text)
        if number is not None:
            found = self.queryset.filter(pk=number).first()
            if found:
                return found
        for lookup in self.name_lookups:
            found = self.queryset.filter(**{lookup: text}).order_by(*self.name_order).first()
            if found:
                return found
        raise ValidationError(_("%(value)s is not one of the available choices."), code="invalid_choice", params={"value": text})


class SecondsOrOffField(forms.Field):
    """Whole seconds (0 and up), or "off" (RANK_EXIT_NEVER); empty is None, the default. JSON's number and the
    page's text alike."""

    MAX_SECONDS = 7 * 24 * 3600

    def to_python(self, value):
        if value in self.empty_values:
            return None
        text = str(value).strip().lower()
        if text == "off":
            return RANK_EXIT_NEVER
        # The length first: int() of thousands of digits raises ValueError (Python's own limit), not a field error.
        if (isinstance(value, bool) or not (text.isascii() and text.isdigit()) or len(text) > 7
                or int(text) > self.MAX_SECONDS):
            raise ValidationError(_("Give a number of seconds from 0 to %(max)s, or off."), params={"max": self.MAX_SECONDS})
        return int(text)


class TrainingJobForm(forms.Form):
    name = forms.CharField(max_length=64)
    description = forms.CharField(max_length=256, required=False)
    engine = NameOrIdChoiceField(EngineVersion.objects.select_related("engine"), ("version", "engine__name"))
    # Narrowed in __init__ to the code directories the submitting user may see (jobs.submission.access.visible_code_dirs).
    code_dir = NameOrIdChoiceField(CodeDirectory.objects.filter(sharing=CodeDirectory.Sharing.EVERYONE), ("name",))
    boot_file = forms.CharField(max_length=512)
    data_url = forms.CharField(max_length=1024, required=False)
    train_url = forms.CharField(max_length=1024, required=False)
    parameters = forms.JSONField(required=False)
    env = forms.JSONField(required=False)
    spec = NameOrIdChoiceField(ResourceSpec.objects.all(), ("name",))
    pool = NameOrIdChoiceField(ResourcePool.objects.all(), ("name",), required=False)
    node_count = forms.IntegerField(min_value=1, initial=1)
    extra_args = forms.CharField(max_length=1024, required=False, strip=False)
    auto_stop_hours = forms.IntegerField(min_value=1, max_value=72, required=False)
    # The page's way of saying auto_stop_hours: a preset or "custom" plus a number of hours.
    auto_stop = forms.ChoiceField(choices=AUTO_STOP_CHOICES, required=False)
    auto_stop_custom = forms.IntegerField(min_value=1, max_value=72, required=False)
    # Metric definitions, a list of {name, regex}; none given means the defaults (loss, accuracy).
    metrics = forms.JSONField(required=False)
    # Seconds a rank may print nothing before the job is suspected hung; empty takes the administrator's default, 0 turns it off.
    watchdog_seconds = forms.IntegerField(min_value=0, max_value=7 * 24 * 3600, required=False)
    # What the watchdog then does: only warn, or stop the job (with its notice); empty takes the administrator's default.
    watchdog_action = forms.ChoiceField(choices=[("", _("The administrator's default")), *WatchdogAction.choices],
                                        required=False)
    # How long the job may go on after a rank ended not as 0 while the others wait, before it fails: seconds (0: at
    # once), "off" (never for this reason), or empty (the RANK_EXIT_GRACE_SECONDS setting).
    rank_exit_grace_seconds = SecondsOrOffField(required=False)
    # Auto restart, as the reference offers it: off (0), or up to 3 more attempts after a restartable failure.
    max_restarts = forms.IntegerField(min_value=0, max_value=3, required=False)
    # Bring an s3:// or obs:// train_url's files back before the start, to resume from a checkpoint there.
    predownload = forms.BooleanField(required=False)
    # The notice before a stop the console decides: this signal to every rank, then up to this many seconds
    # (at most the administrator's maximum) to save a checkpoint. 0 or empty: no notice.
    # The ceiling only keeps the number within the database's column: the administrator's maximum, checked below,
    # is what a user is told of, whatever they typed.
    checkpoint_grace_seconds = forms.IntegerField(min_value=0, max_value=10**9, required=False)
    checkpoint_signal = forms.ChoiceField(choices=[(name, f"SIG{name}") for name in NOTICE_SIGNALS], required=False)
    # After a failure, keep the containers and nodes this many minutes for a look inside (at most the
    # administrator's maximum); 0 or empty: torn down at once.
    debug_hold_minutes = forms.IntegerField(min_value=0, max_value=10**9, required=False)
    # Rebuild's "resume from the last checkpoint": the job (the user's own) whose newest checkpoint this one starts from.
    resume_from_job = forms.IntegerField(min_value=1, max_value=2**63 - 1, required=False)
    # Rebuild: the job (the user's own) this one is a copy of, so the two are seen as one family.
    rebuilt_from = forms.IntegerField(min_value=1, max_value=2**63 - 1, required=False)

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        # A job runs only a code directory its owner may see; with no user, only everyone's.
        # Names are unique per owner, so a name may be the user's own and someone's shared one: the own wins.
        code_dirs = visible_code_dirs(user)
        code_dir_field = self.fields["code_dir"]
        assert isinstance(code_dir_field, NameOrIdChoiceField)
        if user is not None and user.is_authenticated:
            code_dirs = code_dirs.annotate(users_own=Case(When(owner=user, then=1), default=0, output_field=IntegerField()))
            code_dir_field.name_order = ("-users_own", "-pk")
        code_dir_field.queryset = code_dirs
        if not self.is_bound:
            self.initial.setdefault("name", generated_job_name())
            self.initial.setdefault("node_count", 1)
            self.initial.setdefault("engine", EngineVersion.objects.values_list("pk", flat=True).first())
            self.initial.setdefault("spec", ResourceSpec.objects.values_list("pk", flat=True).first())

    @classmethod
    def initial_from_job(cls, job) -> dict:
        """What Rebuild fills the page with: the old job's choices, data_url/train_url back in their fields."""
        fields_given = {item["name"]: item["value"] for item in job.parameters if item["name"] in ("data_url", "train_url")}
        hours = job.auto_stop_hours
        return {
            "name": job.name,
            "description": job.description,
            "engine": job.engine_version_id,
            "code_dir": job.code_dir_id,
            "boot_file": job.boot_file,
            "data_url": fields_given.get("data_url", ""),
            "train_url": fields_given.get("train_url", ""),
            "parameters": [_kept_if_secret(item["name"], str(item["value"])) for item in job.parameters
                           if item["name"] not in fields_given],
            "env": [_kept_if_secret(name, str(value)) for name, value in job.env.items()],
            "spec": job.spec_id,
            "pool": job.pool_id,
            "node_count": job.node_count,
            "extra_args": job.extra_args,
            "auto_stop": "" if hours is None else (str(hours) if hours in AUTO_STOP_PRESETS else "custom"),
            "auto_stop_custom": hours if hours is not None and hours not in AUTO_STOP_PRESETS else None,
            # What the user chose only (empty: the defaults, see job_from_form), so the copy follows the defaults
            # of the day it is submitted.
            "metrics": job.metric_definitions,
            "watchdog_seconds": job.watchdog_seconds,
            "watchdog_action": job.watchdog_action or "",
            "rank_exit_grace_seconds": "off" if job.rank_exit_grace_seconds == RANK_EXIT_NEVER else job.rank_exit_grace_seconds,
            "max_restarts": job.max_restarts,
            "predownload": job.predownload,
            "checkpoint_grace_seconds": job.checkpoint_grace_seconds,
            "checkpoint_signal": job.checkpoint_signal,
            "debug_hold_minutes": job.debug_hold_minutes,
        }

    @property
    def debug_hold_max(self) -> int:
        """The longest hold for debugging a job may ask for, in minutes (the page's field says it)."""
        return LauncherDefaults.current().debug_hold_max_minutes

    @property
    def default_watchdog_stops(self) -> bool:
        """What the watchdog does for a job that chose nothing (the page's hint says it)."""
        return LauncherDefaults.current().watchdog_may_stop

    @property
    def default_rank_exit_grace(self) -> int | None:
        """The seconds after a rank's end for a job that chose nothing; None: never (the page's hint says it)."""
        grace = rank_exit_grace(None)
        return None if grace is None else int(grace)

    @property
    def parameter_rows(self) -> list[dict]:
        return self._rows_of("parameters")

    @property
    def env_rows(self) -> list[dict]:
        """The variables' rows, each wrong one with its own message, to be shown beside it."""
        rows = [dict(row) for row in self._rows_of("env")]
        if self.is_bound and "env" in self.errors:
            seen: set[str] = set()
            for row in rows:
                name = str(row.get("name", ""))
                if name in seen:
                    row["error"] = _("Variable %(name)s is given twice.") % {"name": name}
                else:
                    problem = self._env_problem(name, row.get("value", ""))
                    row["error"] = " ".join(problem.messages) if problem is not None else ""
                seen.add(name)
        return rows

    @property
    def env_errors_beside_rows(self) -> bool:
        return any(row.get("error") for row in self.env_rows)

    @property
    def metric_rows(self) -> list[dict]:
        return [{"name": row.get("name", ""), "value": row.get("regex", "")} for row in self._rows_of("metrics")]

    def _rows_of(self, key: str) -> list[dict]:
        """The rows to show again: what was posted, or what the form started with."""
        value = (self.data if self.is_bound else self.initial).get(key) or []
        if isinstance(value, dict):
            value = [{"name": name, "value": item} for name, item in value.items()]
        return [row for row in value if isinstance(row, dict)]

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if not NAME_RE.match(name):
            raise ValidationError(_("Use 1 to 64 letters, digits, '-' or '_'."))
        return name

    def clean_parameters(self):  # noqa: C901 - one message per way a parameter row can be wrong
        value = self.cleaned_data.get("parameters") or []
        if not isinstance(value, list):
            raise ValidationError(_("Give a list of {name, value} objects."))
        if len(value) > MAX_PARAMETERS:
            raise ValidationError(_("At most %(max)s parameters."), params={"max": MAX_PARAMETERS})
        cleaned, seen, total = [], set(), 0
        for position, item in enumerate(value, start=1):
            if not isinstance(item, dict) or set(item) - {"name", "value"} or "name" not in item:
                raise ValidationError(_("Item %(n)s must be an object with a name and a value."), params={"n": position})
            name, item_value = str(item["name"]), item.get("value", "")
            if not PARAM_NAME_RE.match(name):
                raise ValidationError(_("Parameter name %(name)r must be 1 to 64 of letters, digits, '-' and '_'."), params={"name": name})
            if name in seen:
                raise ValidationError(_("Parameter %(name)s is given twice."), params={"name": name})
            if not isinstance(item_value, (str, int, float, bool)):
                raise ValidationError(_("The value of %(name)s must be text or a number."), params={"name": name})
            text = str(item_value)
            if len(text) > PARAM_VALUE_MAX_CHARS:
                raise ValidationError(_("The value of %(name)s is longer than %(max)s characters."),
                                      params={"name": name, "max": PARAM_VALUE_MAX_CHARS})
            if PARAM_FORBIDDEN_CHARACTERS.search(text):
                raise ValidationError(_("The value of %(name)s cannot hold a NUL or a control character (a tab is allowed)."),
                                      params={"name": name})
            total += len(name) + len(text)
            if total > PARAMS_TOTAL_MAX_CHARS:
                raise ValidationError(_("The parameters are longer than %(max)s characters in all."),
                                      params={"max": PARAMS_TOTAL_MAX_CHARS})
            seen.add(name)
            cleaned.append({"name": name, "value": text})
        return cleaned

    def clean_env(self):
        """The user's variables; every wrong row gets its own message, in the order given."""
        value = self.cleaned_data.get("env") or {}
        problems: list[ValidationError] = []
        if isinstance(value, list):
            value, problems = self._env_pairs_from_rows(value)
        if not isinstance(value, dict):
            raise ValidationError(_("Give an object of NAME: value pairs."))
        if len(value) > MAX_ENV_VARS:
            raise ValidationError(_("At most %(max)s environment variables."), params={"max": MAX_ENV_VARS})
        cleaned = {}
        for name, item_value in value.items():
            problem = self._env_problem(name, item_value)
            if problem is not None:
                problems.append(problem)
            else:
                cleaned[name] = str(item_value)
        total = sum(len(name) + len(text) for name, text in cleaned.items())
        if total > ENV_TOTAL_MAX_CHARS:
            problems.append(ValidationError(_("The environment variables are longer than %(max)s characters in all."),
                                            params={"max": ENV_TOTAL_MAX_CHARS}))
        if problems:
            raise ValidationError(problems)
        return cleaned

    @staticmethod
    def _env_problem(name: str, item_value) -> ValidationError | None:
        """Why one variable is refused (see platform_env.user_variable_problem for the reserved names), or None."""
        if not ENV_NAME_RE.match(name):
            return ValidationError(_("%(name)r is not a valid variable name."), params={"name": name})
        if name.startswith("MA_"):
            return ValidationError(_("%(name)s: names starting with MA_ are reserved for the platform."), params={"name": name})
        if not isinstance(item_value, (str, int, float, bool)):
            return ValidationError(_("The value of %(name)s must be text or a number."), params={"name": name})
        text = str(item_value)
        if len(text) > ENV_VALUE_MAX_CHARS:
            return ValidationError(_("The value of %(name)s is longer than %(max)s characters."),
                                   params={"name": name, "max": ENV_VALUE_MAX_CHARS})
        if any(character in text for character in "\n\r\0"):
            return ValidationError(_("The value of %(name)s cannot hold a line break or a NUL."), params={"name": name})
        reason = user_variable_problem(name, text)
        if reason is not None:
            return ValidationError(_("%(name)s: %(reason)s."), params={"name": name, "reason": reason})
        return None

    @staticmethod
    def _env_pairs_from_rows(rows: list) -> tuple[dict, list[ValidationError]]:
        """Rows of {name, value} (the page's shape) as NAME: value pairs, and what is wrong with the rows
        (not an object, a name given twice)."""
        pairs, problems = {}, []
        for position, row in enumerate(rows, start=1):
            if not isinstance(row, dict) or "name" not in row or set(row) - {"name", "value"}:
                problems.append(ValidationError(_("Item %(n)s must be an object with a name and a value."), params={"n": position}))
                continue
            name = str(row["name"])
            if name in pairs:
                problems.append(ValidationError(_("Variable %(name)s is given twice."), params={"name": name}))
                continue
            pairs[name] = row.get("value", "")
        return pairs, problems

    def clean_watchdog_action(self) -> str | None:
        return self.cleaned_data.get("watchdog_action") or None

    def clean_metrics(self):
        try:
            return validate_metric_definitions(self.cleaned_data.get("metrics"))
        except MetricDefinitionError as error:
            raise ValidationError(str(error)) from None

    def clean_extra_args(self):
        """OPENMPI_EXTRA_ARGS against the users' allow-list, with the administrator's additions of now."""
        text = self.cleaned_data.get("extra_args", "")
        try:
            validate_extra_args(text, self._allowed_options())
        except CommandError as error:
            raise ValidationError(error.message) from None
        return text.strip()

    @staticmethod
    def _allowed_options():
        try:
            return allowed_options(LauncherDefaults.current().extra_options_allowed)
        except CommandError:
            # Stored before it was checked and no longer readable: the built-in list alone.
            return None

    def clean(self) -> dict[str, Any]:  # noqa: C901 - the cross-field checks, each a message on its own field
        cleaned = super().clean()
        assert cleaned is not None  # Form.clean returns cleaned_data, which full_clean has set by now
        code_dir, boot_file = cleaned.get("code_dir"), cleaned.get("boot_file")
        if code_dir and boot_file:
            try:
                boot_file_path(code_dir.name, boot_file)
            except CommandError as error:
                self.add_error("boot_file", BUILDER_MESSAGES.get(error.message, error.message))
            else:
                normalised = "/".join(part for part in boot_file.strip().split("/") if part not in ("", "."))
                if normalised not in python_files(code_dir):
                    self.add_error("boot_file", _("%(file)s is not a Python file of %(dir)s.") % {"file": boot_file, "dir": code_dir.name})
                else:
                    cleaned["boot_file"] = normalised
        spec, node_count = cleaned.get("spec"), cleaned.get("node_count")
        # The page's hint says the limit in the same words (job_form.html, data-node-hint).
        if spec and node_count and node_count > spec.max_nodes:
            self.add_error("node_count", _("This spec allows at most %(max)s nodes.") % {"max": spec.max_nodes})
        elif spec and node_count and "pool" not in self.errors:
            # A job that could never get its nodes is refused now, not left to wait in the queue forever.
            available = runnable_node_count(spec, cleaned.get("pool"))
            if node_count > available:
                self.add_error("node_count", _("The pool has %(count)s node(s) of this spec; ask for at most that many.")
                               % {"count": available})
        if spec and cleaned.get("extra_args") and "pool" not in self.errors:
            self._check_interfaces(cleaned["extra_args"], spec, cleaned.get("pool"))
        named = {item["name"] for item in cleaned.get("parameters") or []}
        for key in ("data_url", "train_url"):
            if cleaned.get(key) and key in named:
                self.add_error("parameters", _("%(name)s is given both as a field and as a parameter.") % {"name": key})
        self._check_object_urls(cleaned)
        if cleaned.get("predownload") and not any(
                has_scheme(text) for text in [cleaned.get("train_url") or "", *(
                    str(item["value"]) for item in cleaned.get("parameters") or [] if item.get("name") == "train_url")]):
            self.add_error("predownload", _("Bringing the output back needs an s3:// or obs:// train_url."))
        self._check_checkpoint_choices(cleaned)
        if "auto_stop" in self.data:
            self._resolve_auto_stop(cleaned)
        self._check_slurm_time_limit(cleaned)
        return cleaned

    def _check_slurm_time_limit(self, cleaned: dict) -> None:
        """On a Slurm pool, auto stop is Slurm's time limit, and the job is stopped its grace, last upload and
        teardown before it (jobs.backends.slurm): a limit no longer than that would be stopped as it starts."""
        pool, hours = cleaned.get("pool"), cleaned.get("auto_stop_hours")
        if pool is None or not hours or pool.backend != ResourcePool.Backend.SLURM:
            return
        before = stop_before_limit_seconds(cleaned.get("checkpoint_grace_seconds") or 0)
        if hours * 3600 <= before:
            self.add_error("checkpoint_grace_seconds", _(
                "On this Slurm pool a job is stopped %(seconds)s s before its auto stop of %(hours)s h (its notice, its "
                "last upload and its teardown), which leaves it no time to run: choose a shorter notice or a later "
                "auto stop.") % {"seconds": before, "hours": hours})

    def _check_interfaces(self, extra_args: str, spec, pool) -> None:
        """An interface OPENMPI_EXTRA_ARGS names (btl_tcp_if_include and the like) must be one every node the job
        may run on has, as their health checks reported (the containers share the node's network): Open MPI
        only warns of an unknown one, ignores the setting, and the ranks then fail in ways that do not say why.
        Nodes that reported nothing (a Slurm pool's may not) are not held against the job."""
        named = interfaces_named(extra_args)
        if not named:
            return
        known = shared_interfaces(runnable_nodes(spec, pool).values_list("health", flat=True))
        if known is None:
            return
        for setting, interface in named:
            if interface not in known:
                self.add_error("extra_args", _(
                    "%(setting)s: %(interface)s is not a network interface of every node this job may run on "
                    "(interfaces they all have: %(known)s).") % {
                        "setting": setting.name, "interface": interface, "known": ", ".join(known) or "–"})
                return

    def _check_checkpoint_choices(self, cleaned: dict) -> None:
        grace = cleaned.get("checkpoint_grace_seconds")
        most = LauncherDefaults.current().checkpoint_grace_max_seconds
        if grace and grace > most:
            self.add_error("checkpoint_grace_seconds",
                           _("The administrator allows at most %(max)s s of notice before a stop.") % {"max": most})
        hold = cleaned.get("debug_hold_minutes")
        longest_hold = LauncherDefaults.current().debug_hold_max_minutes
        if hold and hold > longest_hold:
            self.add_error("debug_hold_minutes", _(
                "The administrator allows a failed job's containers to be kept at most %(max)s minutes.")
                % {"max": longest_hold})
        rebuilt_from = cleaned.get("rebuilt_from")
        if rebuilt_from and not TrainingJob.objects.filter(pk=rebuilt_from, owner_id=getattr(self.user, "pk", None)).exists():
            self.add_error("rebuilt_from", _("Job %(id)s is not one of yours.") % {"id": rebuilt_from})
        source_id = cleaned.get("resume_from_job")
        if source_id:
            owner_id = getattr(self.user, "pk", None)
            source = TrainingJob.objects.filter(pk=source_id, owner_id=owner_id).first() if owner_id else None
            if source is None:
                self.add_error("resume_from_job", _("Job %(id)s is not one of yours.") % {"id": source_id})
            elif source.resume_checkpoint() is None:
                self.add_error("resume_from_job", _("Job %(id)s saved no checkpoint to resume from.") % {"id": source_id})

    def _check_object_urls(self, cleaned: dict) -> None:
        """An s3:// or obs:// data_url, further input (data_url_1 ...) or train_url (a field, or a parameter of that
        name), or a path of a shared file system, the job could not use is refused on the field it was typed in."""
        signed_in = self.user is not None and self.user.is_authenticated
        user_id, username = (self.user.pk, self.user.get_username()) if signed_in else (None, "")
        given = [(key, key, cleaned.get(key) or "") for key in ("data_url", "train_url")]
        given += [("parameters", str(item["name"]), str(item["value"])) for item in cleaned.get("parameters") or []
                  if is_data_location(str(item.get("name")))]
        spec, node_count = cleaned.get("spec"), cleaned.get("node_count")
        # The nodes' disks are read only for a job with an object-store input: most submissions have none.
        room = (input_room(runnable_nodes(spec, cleaned.get("pool")).values_list("health", flat=True), node_count)
                if spec is not None and node_count and "pool" not in self.errors
                and any(is_input(key) and has_scheme(text) for _field, key, text in given) else None)
        listed = InputsListed()
        for field_name, key, text in given:
            if text and field_name not in self.errors:
                problem = (object_url_problem(key, text, user_id, username, cleaned.get("pool"), room, listed)
                           or shared_path_problem(key, text, user_id, username, cleaned.get("pool")))
                if problem:
                    self.add_error(field_name, problem)
        # Two inputs or more: some are further inputs, typed among the parameters.
        too_many = listed.too_many_for(room)
        if too_many and not self.errors:
            self.add_error("parameters", too_many)

    def _resolve_auto_stop(self, cleaned: dict) -> None:
        """The page's choice becomes auto_stop_hours, the one value a job keeps."""
        choice = cleaned.get("auto_stop")
        if choice == "custom":
            hours = cleaned.get("auto_stop_custom")
            if hours is None and "auto_stop_custom" not in self.errors:
                self.add_error("auto_stop_custom", _("Give a number of hours from 1 to 72."))
            cleaned["auto_stop_hours"] = hours
        elif choice:
            cleaned["auto_stop_hours"] = int(choice)
        elif choice == "":
            cleaned["auto_stop_hours"] = None

    def job_parameters(self) -> list[dict[str, str]]:
        """The program's arguments, in the platform's order: data_url, train_url, then hyperparameters."""
        data = self.cleaned_data
        given = [{"name": key, "value": data[key]} for key in ("data_url", "train_url") if data.get(key)]
        return given + data.get("parameters", [])
