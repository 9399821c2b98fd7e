import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_asgi_application()

from django.conf import settings  # noqa: E402  (settings are ready only after the application is built)

if settings.SERVE_STATIC:
    # The embedded console serves its own CSS and scripts; behind a real web server, turn this off.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(application)
