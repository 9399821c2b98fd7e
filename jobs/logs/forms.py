"""What a reader may ask of a job's log: filters, a cursor to follow from, older lines, the tail, a resume point."""

import re2
from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from jobs.logs.matching import Level, compile_search_pattern

FALSE_VALUES = ("0", "false", "off")


class LogQueryForm(forms.Form):
    """Which part of a job's log a reader wants: after a cursor, and only some workers, ranks or streams."""

    after = forms.IntegerField(min_value=0, required=False)
    limit = forms.IntegerField(min_value=1, max_value=5000, required=False)
    worker = forms.IntegerField(min_value=0, required=False)
    rank = forms.IntegerField(min_value=0, required=False)
    stream = forms.ChoiceField(choices=[("", "any"), ("stdout", "stdout"), ("stderr", "stderr"), ("system", "system")], required=False)
    system = forms.BooleanField(required=False, initial=True)
    # Taken as typed: "step=17 " (with its space) must not find step=170. Only blanks alone are no search.
    q = forms.CharField(max_length=200, required=False, strip=False)

    def clean_q(self) -> str:
        text = self.cleaned_data.get("q") or ""
        return text if text.strip() else ""
    # `q` is a regular expression (RE2, case-sensitive unless it starts with (?i)), not a plain text.
    regex = forms.BooleanField(required=False)
    level = forms.ChoiceField(choices=Level.CHOICES, required=False)

    def clean_system(self):
        # Unchecked boxes are absent from a query string; only an explicit system=0 hides the platform's lines.
        return self.data.get("system", "1") not in FALSE_VALUES

    def clean_regex(self):
        return self.data.get("regex", "0") not in FALSE_VALUES

    def clean(self):
        cleaned = super().clean()
        assert cleaned is not None  # Form.clean returns cleaned_data, which full_clean has set by now
        if cleaned.get("regex") and cleaned.get("q"):
            try:
                compile_search_pattern(cleaned["q"])
            except re2.error as error:
                reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) else error
                self.add_error("q", _("Not a regular expression this search can run (RE2: no back-references, "
                                      "no lookahead or lookbehind): %(reason)s.") % {"reason": reason})
        return cleaned


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
