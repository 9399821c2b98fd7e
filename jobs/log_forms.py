"""What a reader may ask of a job's log beyond the filters: older lines, the tail, a resume point."""

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from .forms import LogQueryForm


class LogReadForm(LogQueryForm):
    """The filters plus a direction: `after` a cursor (following), `before` one (older lines), or the `tail`."""

    before = forms.IntegerField(min_value=1, required=False)
    tail = forms.BooleanField(required=False)

    def clean(self):
        cleaned = super().clean()
        given = [name for name in ("after", "before", "tail") if cleaned.get(name) not in (None, False)]
        if len(given) > 1:
            raise ValidationError(_("Ask for one of after, before or tail, not %(given)s together.")
                                  % {"given": ", ".join(given)})
        return cleaned


def event_cursor(last_event_id: str | None, after: int | None) -> int:
    """Where a follower resumes: the browser's Last-Event-ID (a sequence number) wins over `after`."""
    if last_event_id:
        try:
            value = int(last_event_id)
        except ValueError:
            raise ValidationError(_("Last-Event-ID must be a sequence number.")) from None
        if value < 0:
            raise ValidationError(_("Last-Event-ID must be a sequence number."))
        return value
    return after or 0
