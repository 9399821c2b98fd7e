"""The console's own system checks (`manage.py check`), registered from console/__init__.py.

Django's deployment checks (`check --deploy`) cover cookies, HSTS and redirects; these cover what a
console started on its local defaults and then exposed would get wrong, whether or not --deploy is asked.
"""

from django.conf import settings
from django.core.checks import Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

# The SECRET_KEY the console once shipped as its default, and the prefixes that say "not for production".
FORMER_EMBEDDED_KEY = "insecure-local-console-key-change-me-in-production-0123456789"
INSECURE_KEY_PREFIXES = ("insecure-local-console-key", "django-insecure")


def _key_is_insecure(key: str) -> bool:
    return not key or key == FORMER_EMBEDDED_KEY or key.lower().startswith(INSECURE_KEY_PREFIXES)


@register(Tags.security)
def check_production_secrets(app_configs=None, **kwargs):
    if settings.DEBUG:
        return []
    warnings = []
    try:
        key = settings.SECRET_KEY
    except ImproperlyConfigured:  # empty
        key = ""
    if _key_is_insecure(key) or any(_key_is_insecure(fallback) for fallback in settings.SECRET_KEY_FALLBACKS):
        warnings.append(Warning(
            "SECRET_KEY is the embedded default (or another value marked insecure) while DEBUG is off.",
            hint="Set SECRET_KEY to a long random value (e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))'): "
                 "it signs sessions and seals the nodes' private keys.",
            id="console.W001",
        ))
    if "*" in settings.ALLOWED_HOSTS:
        warnings.append(Warning(
            "ALLOWED_HOSTS allows every host ('*') while DEBUG is off.",
            hint="Set ALLOWED_HOSTS to the names the console is reached by, e.g. ALLOWED_HOSTS=console.example.org.",
            id="console.W002",
        ))
    return warnings
