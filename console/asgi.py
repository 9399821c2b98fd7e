import os
from typing import Any

from django.core.asgi import get_asgi_application

from console.state import prepare

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
prepare()  # the state the settings read, made before they are read (console.state)
application: Any = get_asgi_application()

from django.conf import settings  # noqa: E402  (settings are ready only after the application is built)

from console.request_limits import BodyLimits  # noqa: E402
from jobs.api.views import UPLOAD_FIELDS_ALLOWANCE  # noqa: E402

if settings.SERVE_STATIC:
    # The embedded console serves its own CSS and scripts; behind a real web server, turn this off.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(application)

# Outermost: a body over its route's limit, or one sent too slowly, is refused before Django reads it to a file.
application = BodyLimits(application, upload_route="api-code-dirs", upload_allowance=UPLOAD_FIELDS_ALLOWANCE)
