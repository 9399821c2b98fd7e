"""Rate limits: login failures (the sign-in page, the admin's), bad API tokens per address, live log streams per user."""

import asyncio
import gc
import json

import pytest
from asgiref.sync import async_to_sync
from django.core.cache import cache
from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_started
from django.db import close_old_connections
from django.test import AsyncClient
from django.urls import reverse
from rest_framework.test import APIClient

from jobs.api import log_events as follow
from jobs.api.log_events import StreamSlots, holding_slot
from jobs.models import ApiToken, JobStatus, TrainingJob
from tests.fixtures import password_of
from tests.unit.log_helpers import quiet_redis, rank_line, store  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_redis", "fresh_counters")]
JOBS = "/api/v1/training-jobs"


@pytest.fixture
def fresh_counters():
    """The token failures are counted in the cache, which outlives a test's database."""
    cache.clear()
    yield
    cache.clear()


# Logins: django-axes, per username and address.

@pytest.mark.parametrize("url_name", ["login", "admin:login"])
def test_logins_are_refused_for_a_while_after_five_failures(client, staff, teammate, settings, url_name):
    url, name = reverse(url_name), staff.username
    for _attempt in range(settings.AXES_FAILURE_LIMIT - 1):
        answer = client.post(url, {"username": name, "password": "wrong"})
        assert answer.status_code == 200 and not answer.wsgi_request.user.is_authenticated
    assert client.post(url, {"username": name, "password": "wrong"}).status_code == 429
    # Now even the right password is refused from this address...
    locked = client.post(url, {"username": name, "password": password_of(name)})
    assert locked.status_code == 429 and "too many login attempts" in locked.content.decode().lower()
    assert "_auth_user_id" not in client.session
    # ...but not from another address, nor for another username from this one.
    elsewhere = client.post(url, {"username": name, "password": password_of(name)}, REMOTE_ADDR="10.1.2.3")
    assert elsewhere.status_code == 302
    client.logout()
    if url_name == "login":
        assert client.post(url, {"username": "teammate", "password": password_of("teammate")}).status_code == 302


def test_a_success_resets_the_count(client, owner, settings):
    url = reverse("login")
    for _round in range(2):
        for _attempt in range(settings.AXES_FAILURE_LIMIT - 1):
            assert client.post(url, {"username": "owner", "password": "wrong"}).status_code == 200
        assert client.post(url, {"username": "owner", "password": password_of("owner")}).status_code == 302
        client.logout()


def test_the_lockout_ends_after_the_cooloff(client, owner, settings):
    from axes.models import AccessAttempt

    url = reverse("login")
    for _attempt in range(settings.AXES_FAILURE_LIMIT):
        client.post(url, {"username": "owner", "password": "wrong"})
    assert client.post(url, {"username": "owner", "password": password_of("owner")}).status_code == 429
    # The cool-off is counted from the last failure: move it back past LOGIN_COOLOFF_MINUTES.
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - settings.AXES_COOLOFF_TIME * 2)
    assert client.post(url, {"username": "owner", "password": password_of("owner")}).status_code == 302


# API tokens: a counter per client address.

def test_bad_tokens_from_one_address_are_refused_with_a_json_429(owner, settings):
    token = ApiToken.issue(owner, "good")[1]
    unused_token = ApiToken.issue(owner, "not used yet")[1]
    assert APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {token}").status_code == 200
    for attempt in range(settings.API_TOKEN_FAILURE_LIMIT):
        scheme = "Token" if attempt % 2 else "Bearer"
        answer = APIClient().get(JOBS, HTTP_AUTHORIZATION=f"{scheme} tc_guess{attempt}")
        assert answer.status_code == 401, answer.content
    refused = APIClient().get(JOBS, HTTP_AUTHORIZATION="Token tc_guess-more")
    assert refused.status_code == 429
    assert "Too many failed token attempts" in refused.json()["detail"]
    assert 0 < int(refused["Retry-After"]) <= settings.API_TOKEN_FAILURE_WINDOW_SECONDS
    # A good token not yet seen from there is refused too, unread, until the window ends; another address is
    # not, and a token already used from this address goes on working (tests/security/test_token_lockout.py).
    assert APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {unused_token}").status_code == 429
    assert APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {unused_token}", REMOTE_ADDR="10.9.9.9").status_code == 200
    assert APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {token}").status_code == 200
    # A malformed header counts as a failure as well; the session way in is not affected.
    signed_in = APIClient()
    signed_in.force_login(owner)
    assert signed_in.get(JOBS).status_code == 200


def test_good_tokens_do_not_count(owner, settings):
    token = ApiToken.issue(owner, "good")[1]
    for _attempt in range(settings.API_TOKEN_FAILURE_LIMIT + 5):
        assert APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_the_window_ends(owner, settings, monkeypatch):
    import time

    # The clock the counter and the cache's expiry read, moved by hand: no waiting, no timing.
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])
    settings.API_TOKEN_FAILURE_LIMIT = 2
    settings.API_TOKEN_FAILURE_WINDOW_SECONDS = 60
    for _attempt in range(2):
        assert APIClient().get(JOBS, HTTP_AUTHORIZATION="Token nope").status_code == 401
    now[0] += 59
    refused = APIClient().get(JOBS, HTTP_AUTHORIZATION="Token nope")
    assert refused.status_code == 429 and int(refused["Retry-After"]) <= 2
    now[0] += 2
    assert APIClient().get(JOBS, HTTP_AUTHORIZATION="Token nope").status_code == 401


def test_the_log_stream_counts_bad_tokens_with_the_rest_of_the_api(make_job, owner, settings):
    job = make_job(owner=owner)
    token = ApiToken.issue(owner, "good")[1]
    path = f"{JOBS}/{job.pk}/log/events"

    async def get(token_value):
        return await AsyncClient().get(path, headers={"Authorization": f"Token {token_value}"})

    for _attempt in range(settings.API_TOKEN_FAILURE_LIMIT - 1):
        assert async_to_sync(get)("bad").status_code == 401
    assert APIClient().get(JOBS, HTTP_AUTHORIZATION="Token bad").status_code == 401
    refused = async_to_sync(get)(token)
    assert refused.status_code == 429 and "Retry-After" in refused
    assert "Too many failed token attempts" in json.loads(refused.content)["detail"]


# Live log streams: at most LOG_STREAMS_PER_USER open per user.

@pytest.fixture
def slots(monkeypatch):
    """The streams open in this process, counted afresh for each test."""
    fresh = StreamSlots()
    monkeypatch.setattr(follow, "stream_slots", fresh)
    return fresh


@pytest.fixture
def running_job(make_job, owner):
    job = make_job(owner=owner, name="live")
    store(job, [rank_line(0, "hello")])
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    return job


def test_the_twenty_first_stream_of_one_user_is_a_json_429(running_job, owner, teammate, make_job, settings, slots):
    assert settings.LOG_STREAMS_PER_USER == 20
    token = ApiToken.issue(owner, "t")[1]
    other_job = make_job(owner=teammate, name="theirs")
    other_token = ApiToken.issue(teammate, "t")[1]

    async def scenario():
        client, headers = AsyncClient(), {"Authorization": f"Token {token}"}
        path = f"{JOBS}/{running_job.pk}/log/events"
        opened = [await client.get(path, headers=headers) for _ in range(20)]
        assert [response.status_code for response in opened] == [200] * 20
        assert slots.open_count(owner.pk) == 20
        refused = await client.get(path, headers=headers)
        assert refused.status_code == 429 and refused["Content-Type"] == "application/json"
        assert "20 live log streams are open already" in json.loads(refused.content)["detail"]
        # Another user has slots of their own.
        theirs = await client.get(f"{JOBS}/{other_job.pk}/log/events", headers={"Authorization": f"Token {other_token}"})
        assert theirs.status_code == 200
        assert slots.open_count(teammate.pk) == 1
        # A stream that ends gives its slot back: the job ends, one follower reads to the end.
        await TrainingJob.objects.filter(pk=running_job.pk).aupdate(status=JobStatus.COMPLETED)
        body = b"".join([chunk async for chunk in opened.pop().streaming_content])
        assert b"event: end" in body
        assert slots.open_count(owner.pk) == 19
        again = await client.get(path, headers=headers)
        assert again.status_code == 200
        for response in [*opened, again]:
            b"".join([chunk async for chunk in response.streaming_content])
        assert slots.open_count(owner.pk) == 0

    async_to_sync(scenario)()


def test_a_slot_comes_back_when_a_stream_ends_fails_or_is_dropped_unstarted(slots):
    async def events(fail=False):
        yield "one"
        if fail:
            raise RuntimeError("the database went away")
        yield "two"

    async def scenario():
        ended = holding_slot(events(), slots.take(1, 3))
        assert [part async for part in ended] == ["one", "two"]
        failed = holding_slot(events(fail=True), slots.take(1, 3))
        with pytest.raises(RuntimeError):
            [part async for part in failed]
        assert slots.open_count(1) == 0
        unstarted = [holding_slot(events(), slots.take(1, 3)) for _ in range(3)]
        assert slots.take(1, 3) is None
        unstarted.clear()
        gc.collect()
        assert slots.open_count(1) == 0

    async_to_sync(scenario)()


def test_a_client_that_goes_away_gives_its_stream_back(running_job, owner, slots):
    """Through the ASGI handler as uvicorn drives it: the disconnect cancels the stream, and the slot is free."""
    token = ApiToken.issue(owner, "t")[1]
    path = f"{JOBS}/{running_job.pk}/log/events"

    async def one_stream(gone: asyncio.Event, started: asyncio.Event, sent: list):
        async def receive():
            if not sent:
                sent.append("request")
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message.get("type") == "http.response.body" and message.get("body"):
                started.set()

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
                 "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": [(b"host", b"testserver"), (b"authorization", f"Token {token}".encode())],
                 "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
        await ASGIHandler()(scope, receive, send)

    async def scenario():
        gone, started, sent = asyncio.Event(), asyncio.Event(), []
        task = asyncio.create_task(one_stream(gone, started, sent))
        await asyncio.wait_for(started.wait(), 10)
        assert sent[1]["status"] == 200
        assert slots.open_count(owner.pk) == 1
        gone.set()
        await asyncio.wait_for(task, 10)
        assert slots.open_count(owner.pk) == 0

    # As Django's test client does: the handler's request_started would close the test's connection.
    request_started.disconnect(close_old_connections)
    try:
        async_to_sync(scenario)()
    finally:
        request_started.connect(close_old_connections)
