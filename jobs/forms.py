"""The job form: the one place a submission is validated, for the web page and the JSON API alike."""

import re

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from .code_dirs import python_files
from .command_builder import CommandError, boot_file_path, validate_extra_args
from .models import CodeDirectory, EngineVersion, ResourcePool, ResourceSpec

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PARAM_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_ENV_VARS = 100
AUTO_STOP_CHOICES = [("", _("Off")), ("1", "1 h"), ("2", "2 h"), ("4", "4 h"), ("6", "6 h"), ("custom", _("Custom"))]


class NameOrIdChoiceField(forms.ModelChoiceField):
    """Accepts an object's id or its name, so API clients can say `"spec": "cpu-2"`."""

    def __init__(self, queryset, name_lookups: tuple[str, ...], **kwargs):
        super().__init__(queryset, **kwargs)
        self.name_lookups = name_lookups

    def to_python(self, value):
        if value in self.empty_values:
            return None
        text = str(value).strip()
        if text.isdigit():
            found = self.queryset.filter(pk=int(text)).first()
            if found:
                return found
        for lookup in self.name_lookups:
            found = self.queryset.filter(**{lookup: text}).order_by("-pk").first()
            if found:
                return found
        raise ValidationError(_("%(value)s is not one of the available choices."), code="invalid_choice", params={"value": text})


class TrainingJobForm(forms.Form):
    name = forms.CharField(max_length=64)
    description = forms.CharField(max_length=256, required=False)
    engine = NameOrIdChoiceField(EngineVersion.objects.select_related("engine"), ("version", "engine__name"))
    code_dir = NameOrIdChoiceField(CodeDirectory.objects.all(), ("name",))
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

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if not NAME_RE.match(name):
            raise ValidationError(_("Use 1 to 64 letters, digits, '-' or '_'."))
        return name

    def clean_parameters(self):
        value = self.cleaned_data.get("parameters") or []
        if not isinstance(value, list):
            raise ValidationError(_("Give a list of {name, value} objects."))
        cleaned, seen = [], set()
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
            seen.add(name)
            cleaned.append({"name": name, "value": str(item_value)})
        return cleaned

    def clean_env(self):
        value = self.cleaned_data.get("env") or {}
        if not isinstance(value, dict):
            raise ValidationError(_("Give an object of NAME: value pairs."))
        if len(value) > MAX_ENV_VARS:
            raise ValidationError(_("At most %(max)s environment variables."), params={"max": MAX_ENV_VARS})
        cleaned = {}
        for name, item_value in value.items():
            if not ENV_NAME_RE.match(name):
                raise ValidationError(_("%(name)r is not a valid variable name."), params={"name": name})
            if name.startswith("MA_"):
                raise ValidationError(_("%(name)s: names starting with MA_ are reserved for the platform."), params={"name": name})
            if not isinstance(item_value, (str, int, float, bool)):
                raise ValidationError(_("The value of %(name)s must be text or a number."), params={"name": name})
            text = str(item_value)
            if any(character in text for character in "\n\r\0"):
                raise ValidationError(_("The value of %(name)s cannot hold a line break or a NUL."), params={"name": name})
            cleaned[name] = text
        return cleaned

    def clean_extra_args(self):
        text = self.cleaned_data.get("extra_args", "")
        try:
            validate_extra_args(text)
        except CommandError as error:
            raise ValidationError(error.message) from None
        return text.strip()

    def clean(self):
        cleaned = super().clean()
        code_dir, boot_file = cleaned.get("code_dir"), cleaned.get("boot_file")
        if code_dir and boot_file:
            try:
                boot_file_path(code_dir.name, boot_file)
            except CommandError as error:
                self.add_error("boot_file", error.message)
            else:
                normalised = "/".join(part for part in boot_file.strip().split("/") if part not in ("", "."))
                if normalised not in python_files(code_dir):
                    self.add_error("boot_file", _("%(file)s is not a Python file of %(dir)s.") % {"file": boot_file, "dir": code_dir.name})
                else:
                    cleaned["boot_file"] = normalised
        spec, node_count = cleaned.get("spec"), cleaned.get("node_count")
        if spec and node_count and node_count > spec.max_nodes:
            self.add_error("node_count", _("This spec allows at most %(max)s nodes.") % {"max": spec.max_nodes})
        named = {item["name"] for item in cleaned.get("parameters") or []}
        for key in ("data_url", "train_url"):
            if cleaned.get(key) and key in named:
                self.add_error("parameters", _("%(name)s is given both as a field and as a parameter.") % {"name": key})
        return cleaned

    def job_parameters(self) -> list[dict[str, str]]:
        """The program's arguments, in the platform's order: data_url, train_url, then hyperparameters."""
        data = self.cleaned_data
        given = [{"name": key, "value": data[key]} for key in ("data_url", "train_url") if data.get(key)]
        return given + data.get("parameters", [])


class LogQueryForm(forms.Form):
    """Which part of a job's log a reader wants: after a cursor, and only some workers, ranks or streams."""

    after = forms.IntegerField(min_value=0, required=False)
    limit = forms.IntegerField(min_value=1, max_value=5000, required=False)
    worker = forms.IntegerField(min_value=0, required=False)
    rank = forms.IntegerField(min_value=0, required=False)
    stream = forms.ChoiceField(choices=[("", "any"), ("stdout", "stdout"), ("stderr", "stderr"), ("system", "system")], required=False)
    system = forms.BooleanField(required=False, initial=True)
    q = forms.CharField(max_length=200, required=False)

    def clean_system(self):
        # Unchecked boxes are absent from a query string; only an explicit system=0 hides the platform's lines.
        return self.data.get("system", "1") not in ("0", "false", "off")
