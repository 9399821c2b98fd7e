"""The user's own API tokens: make one (shown once, never again), see when each was last used, revoke one."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from jobs.models import ApiToken

MAX_TOKENS_PER_USER = 20


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=64, label=gettext_lazy("Name"),
                           help_text=gettext_lazy("What the token is for, e.g. 'laptop' or 'CI'."))

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError(_("Give the token a name."))
        if ApiToken.objects.filter(user=self.user, name=name).exists():
            raise forms.ValidationError(_("You already have a token of that name."))
        if ApiToken.objects.filter(user=self.user).count() >= MAX_TOKENS_PER_USER:
            raise forms.ValidationError(_("You have %(count)s tokens, the most allowed: revoke one first.")
                                        % {"count": MAX_TOKENS_PER_USER})
        return name


@login_required
def token_list(request):
    new_token = ""
    form = ApiTokenForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        _record, new_token = ApiToken.issue(request.user, form.cleaned_data["name"])
        form = ApiTokenForm(user=request.user)
    # Rendered, not redirected: the token is on this one answer and kept nowhere else.
    response = render(request, "jobs/tokens.html", {
        "tokens": ApiToken.objects.filter(user=request.user), "form": form, "new_token": new_token})
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_revoke(request, pk: int):
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    token.delete()
    messages.success(request, _("Token %(name)s revoked: it no longer opens the API.") % {"name": token.name})
    return redirect("token-list")
