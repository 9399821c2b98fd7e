"""What the API refuses, and how: every error is a JSON object, `{"field": ["message", ...]}` for a field that
is wrong, `{"detail": "..."}` for the request as a whole.

- Bodies are JSON objects (JSONObjectParser, the API's one parser; the code-directory upload names its
  own multipart parser). A form-encoded or multipart body on a JSON endpoint is a 415; a body that is not
  an object, not JSON, or nested deeper than MAX_JSON_DEPTH is a 400; one over DATA_UPLOAD_MAX_MEMORY_SIZE
  a 413. A lone surrogate (a JSON escape such as "\\ud800" that is not text) or a NUL (no field takes one, and
  PostgreSQL cannot store it) is a 400 naming every field that holds one.
- Lists page with a bounded limit and offset (BoundedLimitOffsetPagination).
- Errors Django raises under DRF (a body too big, too many fields) become JSON answers too.
- Too many bad tokens from one address are refused for a while (ThrottledTokenAuthentication, a 429).
- A database that cannot take the request (locked past its timeout, away) is a 503 with Retry-After
  (DatabaseBusy, console.database_busy): nothing was changed, and the client may send it again.
"""

import io
import logging
import re

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db.models import QuerySet
from rest_framework import status
from rest_framework.exceptions import APIException, AuthenticationFailed, ParseError, Throttled, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import JSONParser

from console.database_busy import DATABASE_UNAVAILABLE, RETRY_AFTER_SECONDS, busy_message, note_refusal
from console.security import client_address, presented_token, presents_token, token_failures, token_refusal_detail
from jobs.api.auth import HashedTokenAuthentication
from jobs.pages.paging import IdsFirst

# No field of the API nests deeper than a few levels (parameters: a list of objects of scalars).
MAX_JSON_DEPTH = 32
MAX_PAGE_LIMIT = 1000
MAX_PAGE_OFFSET = 10**9
# Not text (a lone surrogate), or text no field takes and PostgreSQL cannot store (NUL).
NOT_STORABLE = re.compile("[\x00\ud800-\udfff]")


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class DatabaseBusy(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "database_busy"

    def __init__(self):
        super().__init__(busy_message())
        # DRF's exception handler turns `wait` into Retry-After, as it does for a throttled request.
        self.wait = RETRY_AFTER_SECONDS


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is too large: at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.")


def _unstorable(text: str) -> str | None:
    found = NOT_STORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "Holds a NUL character, which no field takes."
    return "Holds an unpaired surrogate (\\ud800-\\udfff), which is not text."


def check_json_values(data: dict) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH, lone surrogates and NUL, naming every top-level field they are
    in (one message a field), not only the first.

    Iterative, so that a body the JSON decoder accepted cannot exhaust the stack here.
    """
    if any(_unstorable(field) for field in data):
        raise ParseError("A field name holds a NUL or an unpaired surrogate (\\ud800-\\udfff).")
    problems = {field: [problem] for field, value in data.items() if (problem := _value_problem(value))}
    if problems:
        raise ValidationError(problems)


def _value_problem(value: object) -> str | None:
    """What is wrong with one top-level field's value (the first thing found), or None."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            return f"Nested more than {MAX_JSON_DEPTH} levels deep."
        if isinstance(item, str):
            problem = _unstorable(item)
            if problem:
                return problem
        elif isinstance(item, dict):
            pending.extend((key, depth + 1) for key in item)
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
    return None


class JSONObjectParser(JSONParser):
    """A JSON object, within the body size limit, nested within MAX_JSON_DEPTH and holding only text."""

    def parse(self, stream, media_type=None, parser_context=None):
        # DRF hands JSON parsers request.body, which Django measures against Content-Length; a body sent
        # without one is measured here.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise _too_large()
        try:
            data = super().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested more than {MAX_JSON_DEPTH} levels deep.") from None
        if not isinstance(data, dict):
            raise ParseError("The body must be a JSON object.")
        check_json_values(data)
        return data


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """`?limit` is capped at MAX_PAGE_LIMIT (DRF's cutoff); an `?offset` past MAX_PAGE_OFFSET is refused."""

    max_limit = MAX_PAGE_LIMIT
    limit_query_description = f"How many items to return (at most {MAX_PAGE_LIMIT})."
    offset_query_description = "How many items to skip."

    def get_paginated_response_schema(self, schema):
        described = super().get_paginated_response_schema(schema)
        properties = described["properties"]
        properties["count"]["description"] = "How many items there are in all."
        properties["next"]["description"] = "The next page's URL; null on the last page."
        properties["previous"]["description"] = "The previous page's URL; null on the first page."
        properties["results"] = {**schema, "description": "This page's items."}
        return described

    def paginate_queryset(self, queryset, request, view=None):
        if isinstance(queryset, QuerySet):
            queryset = IdsFirst(queryset)
        return super().paginate_queryset(queryset, request, view)

    def get_offset(self, request):
        offset = super().get_offset(request)
        if offset > MAX_PAGE_OFFSET:
            raise ValidationError({self.offset_query_param: [f"Ensure this value is less than or equal to {MAX_PAGE_OFFSET}."]})
        return offset


class ThrottledTokenAuthentication(HashedTokenAuthentication):
    """The console's token authentication, with failures counted per client address.

    After API_TOKEN_FAILURE_LIMIT bad tokens within API_TOKEN_FAILURE_WINDOW_SECONDS, every token from
    that address that has not authenticated from it before is refused with a 429 (and Retry-After) until
    the window ends, without being looked at: guessing stops, while the users who share the address (all
    of them, behind a proxy that is not trusted) go on with the tokens they already use.
    """

    def authenticate(self, request):
        if not presents_token(request):
            return super().authenticate(request)
        address, token = client_address(request), presented_token(request)
        wait = token_failures.seconds_refused(address, token)
        if wait:
            raise Throttled(wait=wait, detail=token_refusal_detail(wait))
        try:
            authenticated = super().authenticate(request)
        except AuthenticationFailed:
            token_failures.record(address)
            raise
        if authenticated is not None:
            token_failures.remember_success(address, token)
        return authenticated


def field_naming_exception_handler(exc, context):
    # Imported here: rest_framework.views reads the settings that name this module's classes as it loads.
    from rest_framework.views import exception_handler

    if isinstance(exc, RequestDataTooBig):
        exc = _too_large()
    elif isinstance(exc, DATABASE_UNAVAILABLE):
        note_refusal(context["request"], exc)
        exc = DatabaseBusy()
    elif isinstance(exc, SuspiciousOperation):
        # Django's own handler would log these to django.security and answer an HTML 400.
        logging.getLogger(f"django.security.{exc.__class__.__name__}").warning(str(exc))
        exc = ParseError(str(exc) or "Bad request.")
    response = exception_handler(exc, context)
    if response is not None and isinstance(response.data, list):
        response.data = {"non_field_errors": response.data}
    return response
