"""The user's own webhook: where the console posts when a job of theirs ends, its secret (shown once), a test call.

There is no id in these addresses: each request reaches the signed-in user's webhook and no one else's.
"""

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError, transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from jobs import notifications
from jobs.models import Webhook
from jobs.secret_box import seal_secret


class WebhookForm(forms.Form):
    url = forms.URLField(max_length=500, label=gettext_lazy("URL"), assume_scheme="https",
                         help_text=gettext_lazy("Called with a POST when a job of yours ends."))
    on_failure_only = forms.BooleanField(required=False, label=gettext_lazy("Only when a job fails"),
                                         help_text=gettext_lazy("Failed or Abnormal; not Completed or Terminated."))

    def clean_url(self) -> str:
        url = self.cleaned_data["url"].strip()
        try:
            notifications.check_url(url)
        except notifications.WebhookRefused as refusal:
            raise forms.ValidationError(_("This URL is not called: %(why)s.") % {"why": refusal}) from None
        return url


def _page(request, form: WebhookForm | None = None, new_secret: str = ""):
    webhook = Webhook.objects.filter(user=request.user).first()
    if form is None:
        initial = {"url": webhook.url, "on_failure_only": webhook.on_failure_only} if webhook else {}
        form = WebhookForm(initial=initial)
    # Rendered, not redirected, when it holds a secret: the secret is on this one answer and kept nowhere in clear.
    context = {"webhook": webhook, "form": form, "new_secret": new_secret,
               "email_on": bool(settings.EMAIL_HOST and request.user.email), "email": request.user.email}
    response = render(request, "jobs/webhook.html", context)
    response["Cache-Control"] = "no-store"
    return response


@login_required
def webhook_page(request):
    if request.method != "POST":
        return _page(request)
    form = WebhookForm(request.POST)
    if not form.is_valid():
        return _page(request, form)
    new_secret = ""
    try:
        with transaction.atomic():
            webhook = Webhook.objects.select_for_update().filter(user=request.user).first()
            if webhook is None:
                new_secret = notifications.new_secret()
                webhook = Webhook(user=request.user, sealed_secret=seal_secret(new_secret))
            webhook.url = form.cleaned_data["url"]
            webhook.on_failure_only = form.cleaned_data["on_failure_only"]
            webhook.save()
    except IntegrityError:
        # The same form sent twice at once: the other request made the webhook, and showed its secret.
        return redirect("webhook")
    messages.success(request, _("Webhook saved."))
    if new_secret:
        return _page(request, WebhookForm(initial={"url": webhook.url, "on_failure_only": webhook.on_failure_only}),
                     new_secret)
    return redirect("webhook")


def _rotate(request, webhook: Webhook):
    secret = notifications.new_secret()
    Webhook.objects.filter(pk=webhook.pk).update(sealed_secret=seal_secret(secret))
    messages.success(request, _("A new secret was made: the old one no longer signs the calls."))
    return _page(request, new_secret=secret)


def _remove(request, webhook: Webhook):
    webhook.delete()
    messages.success(request, _("Webhook removed: your jobs' ends are no longer posted."))
    return redirect("webhook")


def _test(request, webhook: Webhook):
    # One attempt: the user waits on this answer, and sees at once what the receiver said.
    delivery = notifications.call_webhook(webhook, notifications.EVENT_TEST, None, retries=0)
    if delivery.ok:
        messages.success(request, _("Test event delivered: %(result)s") % {"result": delivery.result})
    else:
        messages.error(request, _("Test event not delivered: %(result)s") % {"result": delivery.result})
    return redirect("webhook")


ACTIONS = {"rotate": _rotate, "remove": _remove, "test": _test}


@login_required
@require_POST
def webhook_action(request, action: str):
    act = ACTIONS.get(action)
    if act is None:
        raise Http404
    webhook = Webhook.objects.filter(user=request.user).first()
    if webhook is None:
        messages.error(request, _("You have no webhook yet."))
        return redirect("webhook")
    return act(request, webhook)
