"""The OpenAPI description of the API (drf-spectacular): the answers the views build by hand, the error shape
every route shares, and the two log routes that are plain async Django views rather than DRF ones.

`manage.py spectacular --validate --fail-on-warn` (in `make check`) keeps it whole: a route or field it cannot
describe is a failure.
"""

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

API_PREFIX = "/api/v1/"
# Every route may answer these; the bodies are ApiError. A 503 (with Retry-After): the database could not take the
# request just now and nothing was done (console.database_busy).
ERRORS_EVERY_ROUTE = ("400", "401", "403", "404", "429", "503")
ERRORS_WITH_A_BODY = ("413", "415")


class ApiError(serializers.Serializer):
    """Marks the error shape; its schema is written by ApiErrorExtension (DRF serializers cannot say
    `additionalProperties`)."""


class ApiErrorExtension(OpenApiSerializerExtension):
    target_class = ApiError

    def map_serializer(self, auto_schema, direction):
        return {
            "type": "object",
            "description": 'Every error: `{"detail": "..."}` for the request as a whole, or `{"field": ["message", '
                           '...]}` naming each field that is wrong (`non_field_errors` for the fields together).',
            "properties": {"detail": {"type": "string", "description": "What is wrong with the request as a whole."}},
            "additionalProperties": {"type": "array", "items": {"type": "string"},
                                     "description": "The field's messages."},
        }


class ConsoleAutoSchema(AutoSchema):
    """drf-spectacular's schema, with the error answers each route can give and its path's parts described."""

    def get_override_parameters(self):
        parameters = list(super().get_override_parameters())
        if "{id}" in self.path:
            thing = "code directory" if "/code-dirs/" in self.path else "job"
            parameters.append(OpenApiParameter("id", int, OpenApiParameter.PATH, description=f"The {thing}'s id."))
        if "{path}" in self.path:
            parameters.append(OpenApiParameter("path", str, OpenApiParameter.PATH,
                                               description="The file's path in the job's train_url."))
        return parameters

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        codes = ERRORS_EVERY_ROUTE + (ERRORS_WITH_A_BODY if self.method in ("POST", "PUT", "PATCH") else ())
        for code in codes:
            if code not in responses:
                responses[code] = self._get_response_for_code(ApiError, code, direction=direction)
        return responses


def error_ref() -> dict:
    return {"$ref": "#/components/schemas/ApiError"}


def _job_id_parameter() -> dict:
    return {"in": "path", "name": "id", "required": True, "schema": {"type": "integer"},
            "description": "The job's id."}


# Log queries, shared by the log routes.
LOG_FILTERS = [
    OpenApiParameter("worker", int, description="Only this worker's lines (its index)."),
    OpenApiParameter("rank", int, description="Only this rank's lines."),
    OpenApiParameter("stream", str, enum=["stdout", "stderr", "system"], description="Only this stream's lines."),
    OpenApiParameter("system", str, description="0, false or off hides the platform's own lines."),
    OpenApiParameter("q", str, description="Only lines holding this text, case-blind (up to 200 characters)."),
    OpenApiParameter("regex", str, description=(
        "1, true or on: `q` is a regular expression in RE2 syntax (case-sensitive unless it starts with (?i); "
        "no back-references or lookaround)."
    )),
    OpenApiParameter("level", str, enum=["warning", "error"], description=(
        "Only lines that look like errors (a traceback, an exception or error name, an NCCL warning, a non-zero "
        "exit) or, with warning, like warnings or errors."
    )),
    OpenApiParameter("limit", int, description="At most this many lines (1-5000)."),
]
AFTER = OpenApiParameter("after", int, description="A sequence number: the lines after it (0: from the start).")


def _raw_parameters(parameters: list[OpenApiParameter]) -> list[dict]:
    raw = []
    for parameter in parameters:
        schema: dict = {"type": "integer" if parameter.type is int else "string"}
        if parameter.enum:
            schema["enum"] = list(parameter.enum)
        if parameter.type is int:
            schema["minimum"] = 0
        raw.append({"in": "query", "name": parameter.name, "required": False, "schema": schema,
                    "description": parameter.description})
    return raw


def _errors(*codes: str) -> dict:
    return {code: {"description": "An error.", "content": {"application/json": {"schema": error_ref()}}}
            for code in codes}


def add_async_log_routes(result, generator, request, public):
    """The two log routes DRF does not see: plain text after a cursor (or events), and the event stream."""
    paths = result.setdefault("paths", {})
    security: list[dict[str, list]] = [{"tokenAuth": []}, {"cookieAuth": []}]
    events: dict[str, Any] = {
        "description": (
            "Server-Sent Events: `retry`, then one `message` per line (its id is the line's sequence number, its data "
            "a LogLine), `cursor` when filtered-out lines moved the cursor (id = the new cursor), `status` when the "
            "job's state changes ({status, total, dropped}), and `end` ({status, next}) once the job is over and "
            "every line was sent. Reconnect with Last-Event-ID to resume right after the last event seen; "
            "comments keep a quiet stream open."),
        "content": {"text/event-stream": {"schema": {
            "type": "object",
            "description": "One event of the stream.",
            "properties": {
                "event": {"type": "string", "enum": ["message", "status", "cursor", "end"],
                          "description": "The event's kind: message (a log line; the field is then left out), "
                                         "status, cursor or end."},
                "id": {"type": "string", "description": "A line's sequence number (or the cursor's): the "
                                                        "Last-Event-ID to resume after."},
                "data": {"type": "string", "description": "JSON: a LogLine, or the status, cursor or end."},
                "retry": {"type": "integer", "description": "Milliseconds to wait before reconnecting."},
            },
        }}},
    }
    last_event_id = {"in": "header", "name": "Last-Event-ID", "required": False, "schema": {"type": "string"},
                     "description": "The id of the last event seen: the stream resumes after it (wins over `after`)."}
    paths[f"{API_PREFIX}training-jobs/{{id}}/log/events"] = {"get": {
        "operationId": "training_jobs_log_events",
        "summary": "Follow a job's log live",
        "description": "Each user holds at most LOG_STREAMS_PER_USER streams open at once (the next is a 429).",
        "tags": ["training-jobs"],
        "security": security,
        "parameters": [_job_id_parameter(), *_raw_parameters([AFTER, *LOG_FILTERS]), last_event_id],
        "responses": {"200": events, **_errors("400", "401", "404", "405", "429", "503")},
    }}
    paths[f"{API_PREFIX}training-jobs/{{id}}/log"] = {"get": {
        "operationId": "training_jobs_log",
        "summary": "A job's log as plain text after a cursor",
        "description": ("`?offset=N` gives the lines numbered above N (at most 5000), as the log file holds them; "
                        "X-Next-Offset says where to go on. With `Accept: text/event-stream`, the live events of "
                        "/log/events instead."),
        "tags": ["training-jobs"],
        "security": security,
        "parameters": [_job_id_parameter(), {
            "in": "query", "name": "offset", "required": False, "schema": {"type": "integer"},
            "description": "The lines after this sequence number (0: from the start)."}],
        "responses": {
            "200": {
                "description": "The lines, one per line of text (or the events, for Accept: text/event-stream).",
                "headers": {
                    "X-Next-Offset": {"schema": {"type": "integer"}, "description": "The offset to ask for next."},
                    "X-Job-Status": {"schema": {"type": "string"}, "description": "The job's state."},
                },
                "content": {"text/plain": {"schema": {"type": "string"}}, **events["content"]},
            },
            **_errors("400", "401", "403", "404", "405", "429", "503"),
        },
    }}
    paths[f"{API_PREFIX}training-jobs/{{id}}/shells/{{session_id}}/output"] = {"get": {
        "operationId": "training_jobs_shells_output",
        "summary": "A terminal's output, live",
        "description": "The job's owner, for a terminal they opened (POST /shells); anyone else gets a 404.",
        "tags": ["training-jobs"],
        "security": security,
        "parameters": [_job_id_parameter(), {
            "in": "path", "name": "session_id", "required": True, "schema": {"type": "string"},
            "description": "The terminal's id, as POST /shells answered it."}, {
            "in": "query", "name": "after", "required": False, "schema": {"type": "string"},
            "description": "The id of the last event seen (Last-Event-ID wins over it); 0 for all that is kept."},
            {**last_event_id, "description": "The id of the last event seen: the output resumes after it."}],
        "responses": {"200": {
            "description": ("Server-Sent Events: `output` ({text}: what the terminal printed, in order) and at last "
                            "`end` ({reason}: why the terminal closed); comments keep a quiet stream open."),
            "content": {"text/event-stream": {"schema": {
                "type": "object", "description": "One event of the stream.",
                "properties": {
                    "event": {"type": "string", "enum": ["output", "end"], "description": "The event's kind."},
                    "id": {"type": "string", "description": "The Last-Event-ID to resume after."},
                    "data": {"type": "string", "description": "JSON: {text} or {reason}."},
                },
            }}},
        }, **_errors("400", "401", "404", "405")},
    }}
    return result


def binary(description: str, media_type: str = "application/octet-stream") -> dict:
    return {(200, media_type): OpenApiResponse(response={"type": "string", "format": "binary"}, description=description)}
