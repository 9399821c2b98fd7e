"""A terminal in a job's container over the API (the page's terminal uses the same routes):

- POST /api/v1/training-jobs/<id>/shells opens one in a worker ({"worker", "columns", "rows"});
- POST .../shells/<session>/input sends what was typed ({"text"}), a new size ({"columns", "rows"}) or
  {"close": true};
- GET .../shells/<session>/output is the terminal's output as Server-Sent Events ("output" events of
  {"text"}, then one "end" event of {"reason"}), resumable with Last-Event-ID.

Only the job's owner, and a session only by the user who opened it (anyone else: 404, and nothing is sent on).
"""

import json
import time

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import shell_channel
from jobs.api.log_events import StreamSlots, _error, api_user, holding_slot
from jobs.submission.access import visible_jobs
from jobs.submission.shells import ShellRefused, open_shell, own_session

from .schema import ApiError

# A quiet terminal's stream carries a comment this often, so that proxies keep it open.
KEEPALIVE_SECONDS = 15.0
shell_streams = StreamSlots()


class ShellOpenSerializer(serializers.Serializer):
    worker = serializers.IntegerField(default=0, min_value=0, help_text="The worker's index (0: worker-0).")
    columns = serializers.IntegerField(default=80, min_value=shell_channel.TERMINAL_COLUMNS[0],
                                       max_value=shell_channel.TERMINAL_COLUMNS[1],
                                       help_text="The terminal's width in characters.")
    rows = serializers.IntegerField(default=24, min_value=shell_channel.TERMINAL_ROWS[0],
                                    max_value=shell_channel.TERMINAL_ROWS[1], help_text="The terminal's height in lines.")


class ShellInputSerializer(serializers.Serializer):
    text = serializers.CharField(required=False, trim_whitespace=False, allow_blank=True,
                                 max_length=shell_channel.INPUT_CHUNK_MAX_CHARS, help_text="What was typed.")
    columns = serializers.IntegerField(required=False, min_value=shell_channel.TERMINAL_COLUMNS[0],
                                       max_value=shell_channel.TERMINAL_COLUMNS[1],
                                       help_text="A new width in characters (with rows).")
    rows = serializers.IntegerField(required=False, min_value=shell_channel.TERMINAL_ROWS[0],
                                    max_value=shell_channel.TERMINAL_ROWS[1], help_text="A new height in lines (with columns).")
    close = serializers.BooleanField(required=False, default=False, help_text="End the session.")

    def validate(self, attrs):
        resize = ("columns" in attrs, "rows" in attrs)
        if any(resize) and not all(resize):
            raise serializers.ValidationError("A new size needs both columns and rows.")
        if "text" not in attrs and not any(resize) and not attrs.get("close"):
            raise serializers.ValidationError("Send text, a new size (columns and rows), or close.")
        return attrs


def refusal(error: ShellRefused) -> Response:
    return Response({error.field: error.message if error.field == "detail" else [error.message]}, status=error.status)


class TrainingJobShells(APIView):
    @extend_schema(summary="Open a terminal in a worker's container (the job's owner, while it has containers)",
                   request=ShellOpenSerializer,
                   responses={201: inline_serializer("ShellSession", {
                       "id": serializers.CharField(help_text="The terminal's id."),
                       "worker": serializers.IntegerField(help_text="The worker it runs in."),
                       "input_url": serializers.CharField(help_text="Where to POST what is typed."),
                       "output_url": serializers.CharField(help_text="Its output, as Server-Sent Events.")}),
                              400: ApiError, 403: ApiError, 409: ApiError, 429: ApiError, 503: ApiError})
    def post(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        asked = ShellOpenSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        try:
            session = open_shell(request.user, job, asked.validated_data["worker"], asked.validated_data["columns"],
                                 asked.validated_data["rows"])
        except ShellRefused as error:
            return refusal(error)
        base = f"/api/v1/training-jobs/{job.pk}/shells/{session.id}"
        return Response({"id": session.id, "worker": session.worker_index, "input_url": f"{base}/input",
                         "output_url": f"{base}/output"}, status=status.HTTP_201_CREATED)


class TrainingJobShellInput(APIView):
    @extend_schema(summary="Type into a terminal, resize it or close it", request=ShellInputSerializer,
                   parameters=[OpenApiParameter("session_id", str, OpenApiParameter.PATH,
                                                description="The terminal's id, as POST /shells answered it.")],
                   responses={204: None, 400: ApiError, 404: ApiError, 410: ApiError, 429: ApiError})
    def post(self, request, pk, session_id):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        session = own_session(request.user, job, session_id)
        if session is None:
            return Response({"detail": "No such terminal."}, status=status.HTTP_404_NOT_FOUND)
        sent = ShellInputSerializer(data=request.data)
        sent.is_valid(raise_exception=True)
        values = sent.validated_data
        try:
            if "columns" in values:
                shell_channel.send_resize(session.id, values["columns"], values["rows"])
            if values.get("text"):
                shell_channel.send_input(session.id, values["text"])
            if values.get("close"):
                shell_channel.request_close(session.id)
        except shell_channel.InputRefused as error:
            return Response({"detail": str(error)}, status=status.HTTP_429_TOO_MANY_REQUESTS,
                            headers={"Retry-After": "1"})
        except shell_channel.SessionOver as error:
            return Response({"detail": str(error)}, status=status.HTTP_410_GONE)
        except redis.RedisError:
            return Response({"detail": "The console's message broker does not answer: try again shortly."},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(status=status.HTTP_204_NO_CONTENT)


def sse(kind: str, payload: dict, event_id: str | None = None) -> str:
    return (f"id: {event_id}\n" if event_id else "") + f"event: {kind}\ndata: " + json.dumps(payload) + "\n\n"


async def why_over(session_id: str, waited: float) -> str:
    """Why a quiet session is over from the reader's side ("" while it may go on): no worker took it in time, or
    the worker holding it went away without a word. Said once for all: a relay that would start later then
    opens nothing, and the user's place is freed."""
    reason = ""
    if waited > settings.SHELL_START_SECONDS:
        if not await shell_channel.was_started(session_id):
            reason = "no worker of the console took the terminal (is the shells worker running?)"
        elif await shell_channel.is_gone(session_id):
            reason = "the console's worker holding the terminal went away"
    if reason:
        await shell_channel.write_end(session_id, reason)
    return reason


def output_events(session_id: str, after: str):
    async def stream():
        cursor = after
        opened = time.monotonic()
        while True:
            try:
                entries = await shell_channel.read_output(session_id, cursor, KEEPALIVE_SECONDS)
                reason = "" if entries else await why_over(session_id, time.monotonic() - opened)
            except redis.RedisError:
                reason = "the console lost its message broker"
            if reason:
                yield sse("end", {"reason": reason})
                return
            if not entries:
                yield ": still open\n\n"
            for entry in entries:
                cursor = entry["id"]
                if entry["kind"] == "end":
                    yield sse("end", {"reason": entry["text"]}, cursor)
                    return
                yield sse("output", {"text": entry["text"]}, cursor)

    return stream()


@require_GET
async def job_shell_output(request, pk: int, session_id: str):
    user, refused = await api_user(request)
    if refused is not None:
        return refused
    job = await sync_to_async(lambda: visible_jobs(user).filter(pk=pk).first())()
    session = await sync_to_async(own_session)(user, job, session_id) if job is not None else None
    if session is None:
        return _error(404, "No such terminal.")
    after = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
    if not shell_channel.valid_stream_id(after):
        return _error(400, {"after": ["Not a position in the terminal's output."]})
    # Each reader holds a connection to Redis while it waits: a user holds a few, never the process' all.
    release = shell_streams.take(user.pk, settings.SHELLS_PER_USER * 2)
    if release is None:
        return _error(429, "Too many terminal streams are open: close a terminal's page first.", Retry_After="5")
    response = StreamingHttpResponse(holding_slot(output_events(session.id, after), release),
                                     content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
