"""The user's own keys to the object stores that take them: set, replace or remove them, one store at a time.

The keys are checked against the store before they are kept (a bucket the user names, asked for with them),
then sealed; no page shows them back, not even in part: a store's row says only when they were set.
"""

import re

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from jobs.launch.data_paths import is_data_location
from jobs.models import FINAL_STATES, Storage, TrainingJob, UserStoreKeys
from jobs.object_store.client import ObjectStore, StoreError
from jobs.object_store.urls import BUCKET, parse_object_url

# What S3, OBS, Ceph and SeaweedFS hand out: access key ids of letters and digits (a few stores add . _ - + / =),
# secrets of printable ASCII. Nothing else can be a key, so a pasted line break or space is a mistake.
ACCESS_KEY = re.compile(r"[A-Za-z0-9._~+/=-]{3,128}")
SECRET_KEY = re.compile(r"[!-~]{8,256}")


class StoreKeysForm(forms.Form):
    # Write-only, as the admin's keys are: a form shown again after an error is empty.
    access_key = forms.CharField(label=gettext_lazy("Access key"), max_length=128,
                                 widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}))
    secret_key = forms.CharField(label=gettext_lazy("Secret key"), max_length=256,
                                 widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}))
    bucket = forms.CharField(label=gettext_lazy("A bucket these keys reach"), max_length=63, help_text=gettext_lazy(
        "The console asks the store for this bucket with your keys before it keeps them."))

    def clean_access_key(self) -> str:
        text = self.cleaned_data["access_key"]
        if not ACCESS_KEY.fullmatch(text):
            raise forms.ValidationError(_("An access key is 3 to 128 letters, digits and . _ ~ + / = -."))
        return text

    def clean_secret_key(self) -> str:
        text = self.cleaned_data["secret_key"]
        if not SECRET_KEY.fullmatch(text):
            raise forms.ValidationError(_("A secret key is 8 to 256 printable characters, without spaces."))
        return text

    def clean_bucket(self) -> str:
        text = self.cleaned_data["bucket"].strip()
        if not BUCKET.fullmatch(text) or ".." in text:
            raise forms.ValidationError(_("3 to 63 lower-case letters, digits, dots and hyphens."))
        return text

    def store_takes_them(self, storage: Storage) -> bool:
        """Whether the store answers the keys for the bucket named; says why not on the form otherwise."""
        access = storage.access_with(self.cleaned_data["access_key"], self.cleaned_data["secret_key"])
        bucket = self.cleaned_data["bucket"]
        try:
            found = ObjectStore(access).bucket_exists(bucket)
        except StoreError as error:
            self.add_error(None, _("The %(store)s store did not take these keys: %(why)s") % {
                "store": storage.name, "why": error})
            return False
        if not found:
            self.add_error("bucket", _("The %(store)s store has no bucket %(bucket)s.") % {
                "store": storage.name, "bucket": bucket})
            return False
        return True


def jobs_reaching_with_keys(user, storage: Storage) -> list[int]:
    """The user's jobs not yet over whose input (data_url, data_url_1 ...) or train_url is another bucket of this store: they reach it
    with the user's keys (at their start, and at each upload of their output), so removing the keys fails them."""
    own = storage.user_bucket(user.pk, user.get_username())
    found = []
    for job in TrainingJob.objects.filter(owner=user).exclude(status__in=FINAL_STATES).order_by("pk"):
        for name, value in job.parameter_pairs():
            url = parse_object_url(value) if is_data_location(name) else None
            if url is not None and url.bucket != own and Storage.answering(url.scheme, job.pool_id) == storage:
                found.append(job.pk)
                break
    return found


def _form_prefix(storage_id: int) -> str:
    return f"store-{storage_id}"


def _page(request, refused: StoreKeysForm | None = None, refused_store: int | None = None):
    # The stores that take users' keys, and any the user still keeps keys to (an administrator may have
    # stopped taking them since): those can only be removed.
    stores = Storage.objects.filter(Q(enabled=True, users_may_bring_keys=True) | Q(user_keys__user=request.user)).distinct()
    kept = {keys.storage_id: keys.set_at for keys in UserStoreKeys.objects.filter(user=request.user)}
    rows = [{
        "storage": storage,
        "set_at": kept.get(storage.pk),
        "takes_keys": storage.enabled and storage.users_may_bring_keys,
        "own_bucket": storage.user_bucket(request.user.pk, request.user.get_username()),
        "needed_by": jobs_reaching_with_keys(request.user, storage) if storage.pk in kept else [],
        "form": refused if refused is not None and storage.pk == refused_store
        else StoreKeysForm(prefix=_form_prefix(storage.pk)),
    } for storage in stores]
    response = render(request, "jobs/store_keys.html", {"rows": rows})
    response["Cache-Control"] = "no-store"
    return response


@login_required
def store_keys_page(request):
    return _page(request)


@login_required
@require_POST
def store_keys_set(request, storage_id: int):
    storage = get_object_or_404(Storage, pk=storage_id, enabled=True, users_may_bring_keys=True)
    form = StoreKeysForm(request.POST, prefix=_form_prefix(storage.pk))
    if not (form.is_valid() and form.store_takes_them(storage)):
        return _page(request, form, storage.pk)
    UserStoreKeys.keep(request.user, storage, form.cleaned_data["access_key"], form.cleaned_data["secret_key"])
    messages.success(request, _("Your keys to the %(store)s store are kept, sealed: your jobs, links and data "
                                "browser use them for the buckets other than your own.") % {"store": storage.name})
    return redirect("store-keys")


@login_required
@require_POST
def store_keys_remove(request, storage_id: int):
    keys = UserStoreKeys.objects.filter(user=request.user, storage_id=storage_id).select_related("storage").first()
    if keys is None:
        raise Http404
    needed_by = jobs_reaching_with_keys(request.user, keys.storage)
    keys.delete()
    messages.success(request, _("Your keys to that store are removed: the console no longer uses them."))
    if needed_by:
        messages.warning(request, _("Job(s) %(jobs)s reach another bucket of that store with them: they fail at their "
                                    "start, or their outputs are no longer uploaded, unless you set keys again.")
                         % {"jobs": ", ".join(f"#{pk}" for pk in needed_by)})
    return redirect("store-keys")
