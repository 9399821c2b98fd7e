"""The job page's card of a failed job held for debugging ("release now", its owner's) and of its evidence bundles."""

from django import template

from jobs.submission.holds import owned_bundles

register = template.Library()


@register.inclusion_tag("jobs/_debug_hold_panel.html", takes_context=True)
def debug_hold_panel(context: template.Context, job) -> dict:
    user = context["request"].user
    owner = user.is_authenticated and user.pk == job.owner_id
    return {"job": job, "held": job.is_held_for_debugging, "owner": owner, "csrf_token": context.get("csrf_token"),
            "bundles": list(owned_bundles(user, job.pk)) if owner else []}
