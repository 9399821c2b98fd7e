"""A database that cannot take a request just now is a 503 with Retry-After, never a 500.

SQLite's write lock held past its busy timeout ("database is locked"), PostgreSQL's lock or statement timeout,
a connection lost: Django raises OperationalError (InterfaceError for a connection already closed). A 500 says
the console is broken and leaves the user guessing whether the stop or the submission was kept; a 503 says
"not now, nothing was done, try again in RETRY_AFTER_SECONDS", which people and clients (tc) act on. Every write
a request makes is one transaction, so a refused request changed nothing.

- DatabaseBusyMiddleware: a view's exception. The API answers `{"detail": ...}` (its DRF views answer the same
  through jobs.api.errors); a page or the admin shows the message on a page of its own, with a way back.
- server_error (handler500): one raised outside a view (a middleware saving a session), answered without a
  template or the database, which may be what is away.
- Views that can say it where the user clicked do so with busy_message() and busy(): the job form keeps what
  was typed, the job page's stop shows the job page.
"""

import logging
import sys

from django.contrib import admin, messages
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.deprecation import MiddlewareMixin
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views import defaults

from console.security import is_api

# Long enough for a lock held by a burst of writes to pass, short enough that nobody gives up waiting.
RETRY_AFTER_SECONDS = 5
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
ADMIN_PREFIX = "/admin/"

logger = logging.getLogger(__name__)


def busy_message() -> str:
    """What the user is told, in their language."""
    return _("The database is busy and could not record this, so nothing was changed. Try again in %(seconds)s "
             "seconds.") % {"seconds": RETRY_AFTER_SECONDS}


def busy(response: HttpResponse) -> HttpResponse:
    """The response, as a 503 that says when to try again."""
    response.status_code = 503
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def note_refusal(request, error: Exception) -> None:
    logger.warning("database unavailable: %s %s answered 503: %s", request.method, request.path, error)


def _plain_answer(request) -> HttpResponse:
    if is_api(request):
        return busy(JsonResponse({"detail": busy_message()}))
    return busy(HttpResponse(busy_message(), content_type="text/plain; charset=utf-8"))


def _way_back(request) -> str:
    """Where the page the user acted on is: the form's `next`, the referring page of ours, or this one."""
    candidates = [request.POST.get("next", "")] if request.method == "POST" else []
    candidates.append(request.META.get("HTTP_REFERER", ""))
    for candidate in candidates:
        if candidate and url_has_allowed_host_and_scheme(candidate, allowed_hosts={request.get_host()},
                                                         require_https=request.is_secure()):
            return candidate
    return request.get_full_path() if request.method == "GET" else "/"


class DatabaseBusyMiddleware(MiddlewareMixin):
    def process_exception(self, request, exception):
        if not isinstance(exception, DATABASE_UNAVAILABLE):
            return None
        note_refusal(request, exception)
        if is_api(request):
            return _plain_answer(request)
        messages.error(request, busy_message(), fail_silently=True)
        context = {"back": _way_back(request)}
        if request.path_info.startswith(ADMIN_PREFIX):
            template = "admin/database_busy.html"
            context.update(admin.site.each_context(request), title=_("Try again in a few seconds"))
        else:
            template = "database_busy.html"
        try:
            return busy(render(request, template, context))
        except DATABASE_UNAVAILABLE:  # the page itself needs the database (its user, the admin's menu)
            return _plain_answer(request)


def server_error(request) -> HttpResponse:
    """handler500: Django's own 500 page, or the 503 for a database that was away outside a view."""
    error = sys.exc_info()[1]
    if isinstance(error, DATABASE_UNAVAILABLE):
        note_refusal(request, error)
        return _plain_answer(request)
    return defaults.server_error(request)
