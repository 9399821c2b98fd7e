"""A terminal in a job's container, its web side: what may be sent and when, said as field errors; the command
run on the node is the console's own. The relay itself runs against a real node in
tests/integration/test_shell.py."""

import shlex

import pytest

from jobs import shell_channel
from jobs.models import ApiToken, JobStatus, Worker
from jobs.runtime.shell import duration_words, exec_command
from jobs.submission import task_queue

pytestmark = pytest.mark.django_db


@pytest.fixture
def owners_terminal(make_job, owner, monkeypatch):
    """A running job of the owner's with one open terminal ("s1"); Redis and the queue are replaced by lists."""
    job = make_job(owner=owner, status=JobStatus.RUNNING)
    Worker.objects.create(job=job, index=0, node_name="n0", address="10.0.0.1", hostname="w0", container_name="c0")
    session = shell_channel.ShellSession(id="s1", job_id=job.pk, worker_index=0, user_id=owner.pk,
                                         user_name="owner", columns=80, rows=24)
    typed: list[str] = []
    resized: list[tuple[int, int]] = []
    queued: list[str] = []

    async def read_output(session_id, after, wait_seconds):
        return [{"id": "1-0", "kind": "end", "text": "bye"}]

    monkeypatch.setattr(shell_channel, "session", lambda session_id: session if session_id == "s1" else None)
    monkeypatch.setattr(shell_channel, "open_session", lambda *args, **kwargs: session)
    monkeypatch.setattr(shell_channel, "send_input", lambda session_id, text: typed.append(text))
    monkeypatch.setattr(shell_channel, "send_resize", lambda session_id, columns, rows: resized.append((columns, rows)))
    monkeypatch.setattr(shell_channel, "read_output", read_output)
    monkeypatch.setattr(task_queue, "open_shell", lambda session_id, expires: queued.append(session_id) or True)
    return {"job": job, "typed": typed, "resized": resized, "queued": queued}


@pytest.fixture
def owner_api(client, owner):
    token = ApiToken.issue(owner, "terminal")[1]

    def post(path: str, body) -> tuple[int, dict]:
        response = client.post(path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}")
        return response.status_code, (response.json() if response.content else {})

    return post


@pytest.mark.parametrize("body, field", [
    ({"worker": 5}, "worker"),
    ({"worker": -1}, "worker"),
    ({"worker": "one"}, "worker"),
    ({"columns": 9}, "columns"),
    ({"rows": 100000}, "rows"),
])
def test_a_terminal_asked_for_a_missing_worker_or_an_odd_size_is_a_field_error(owners_terminal, owner_api, body, field):
    status, answer = owner_api(f"/api/v1/training-jobs/{owners_terminal['job'].pk}/shells", body)
    assert status == 400 and field in answer
    assert owners_terminal["queued"] == []


@pytest.mark.parametrize("state", [JobStatus.PENDING, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.TERMINATING])
def test_a_job_without_containers_refuses_a_terminal_and_says_when_one_opens(owners_terminal, owner_api, state):
    job = owners_terminal["job"]
    job.status = state
    job.save(update_fields=["status"])
    status, answer = owner_api(f"/api/v1/training-jobs/{job.pk}/shells", {})
    assert status == 409 and "a terminal opens only while the job runs" in answer["status"][0]
    assert owners_terminal["queued"] == []


def test_a_failed_job_held_for_a_look_inside_opens_a_terminal(owners_terminal, owner_api):
    from datetime import timedelta

    from django.utils import timezone

    job = owners_terminal["job"]
    job.status, job.held_until = JobStatus.FAILED, timezone.now() + timedelta(minutes=5)
    job.save(update_fields=["status", "held_until"])
    status, answer = owner_api(f"/api/v1/training-jobs/{job.pk}/shells", {"worker": 0})
    assert status == 201 and answer["output_url"].endswith("/shells/s1/output")
    assert owners_terminal["queued"] == ["s1"]


def test_a_user_holding_the_most_terminals_is_told_to_close_one(owners_terminal, owner_api, monkeypatch, settings):
    settings.SHELLS_PER_USER = 2

    def full(*args, **kwargs):
        raise shell_channel.TooManySessions(2)

    monkeypatch.setattr(shell_channel, "open_session", full)
    status, answer = owner_api(f"/api/v1/training-jobs/{owners_terminal['job'].pk}/shells", {})
    assert status == 429 and "close one first" in answer["detail"]


@pytest.mark.parametrize("body, words", [
    ({}, "Send text, a new size"),
    ({"columns": 100}, "needs both columns and rows"),
    ({"text": "x" * (shell_channel.INPUT_CHUNK_MAX_CHARS + 1)}, "no more than"),
    ({"text": ["ls"]}, "Not a valid string"),
    ({"columns": 100, "rows": 1}, "greater than or equal to"),
])
def test_what_is_sent_to_a_terminal_is_checked_before_it_goes_on(owners_terminal, owner_api, body, words):
    status, answer = owner_api(f"/api/v1/training-jobs/{owners_terminal['job'].pk}/shells/s1/input", body)
    assert status == 400 and words in str(answer)
    assert owners_terminal["typed"] == [] and owners_terminal["resized"] == []


def test_keys_and_a_new_size_reach_the_terminal_and_a_full_one_asks_to_wait(owners_terminal, owner_api, monkeypatch):
    path = f"/api/v1/training-jobs/{owners_terminal['job'].pk}/shells/s1/input"
    assert owner_api(path, {"text": "ls -la\r", "columns": 120, "rows": 40})[0] == 204
    assert owners_terminal["typed"] == ["ls -la\r"] and owners_terminal["resized"] == [(120, 40)]

    def full(session_id, text):
        raise shell_channel.InputRefused("the terminal has not taken what was typed before yet: try again")

    monkeypatch.setattr(shell_channel, "send_input", full)
    status, answer = owner_api(path, {"text": "more"})
    assert status == 429 and "try again" in answer["detail"]


def test_an_unknown_terminal_is_not_found(owners_terminal, owner_api):
    status, _answer = owner_api(f"/api/v1/training-jobs/{owners_terminal['job'].pk}/shells/nope/input", {"text": "x"})
    assert status == 404


def test_the_node_runs_podman_exec_as_the_jobs_user_in_the_jobs_container_only():
    argv = shlex.split(exec_command("tc-job-7-w0-abc"))
    assert argv[:4] == ["podman", "exec", "--interactive", "--tty"]
    assert argv[argv.index("--user") + 1] == "1000:1000"
    assert "tc-job-7-w0-abc" in argv and "--privileged" not in argv


@pytest.mark.parametrize("seconds, words", [(5, "5 s"), (125, "2 min 5 s"), (3720, "1 h 2 min")])
def test_a_sessions_length_is_said_in_words(seconds, words):
    assert duration_words(seconds) == words


@pytest.mark.parametrize("cursor, valid", [("0", True), ("1712-3", True), ("1-", False), ("x", False), ("1-2-3", False),
                                           (f"{2**64 - 1}-{2**64 - 1}", True), ("99999999999999999999-0", False),
                                           (f"1-{2**64}", False), ("\u0661", False)])
def test_only_a_stream_position_is_taken_as_where_to_resume(cursor, valid):
    assert shell_channel.valid_stream_id(cursor) is valid


@pytest.mark.parametrize("policy, expected", [
    ("default-src 'self'; style-src 'self'; script-src 'self'",
     "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self'"),
    ("default-src 'self'; style-src 'self' 'unsafe-inline'", "default-src 'self'; style-src 'self' 'unsafe-inline'"),
    ("default-src 'self'", "default-src 'self'; style-src 'self' 'unsafe-inline'"),
    ("default-src 'self'; style-src-elem 'self'", "default-src 'self'; style-src-elem 'self' 'unsafe-inline'; "
                                                 "style-src 'self' 'unsafe-inline'"),
])
def test_only_the_style_directive_is_loosened_for_the_terminal(policy, expected):
    from console.security import policy_with_inline_styles

    assert policy_with_inline_styles(policy) == expected


def test_the_owners_job_page_lets_the_terminal_style_itself_and_a_viewers_page_stays_strict(client, make_job, owner):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    job = make_job(owner=owner, status=JobStatus.RUNNING)
    client.force_login(owner)
    policy = client.get(f"/jobs/{job.pk}")["Content-Security-Policy"]
    assert "style-src 'self' 'unsafe-inline'" in policy and "script-src 'self';" in policy
    finished = make_job(owner=owner, status=JobStatus.COMPLETED)
    page = client.get(f"/jobs/{finished.pk}")
    assert "'unsafe-inline'" not in page["Content-Security-Policy"] and b"data-terminal" not in page.content
    viewer = get_user_model().objects.create_user("viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_trainingjob"))
    client.force_login(viewer)
    page = client.get(f"/jobs/{job.pk}")
    assert "'unsafe-inline'" not in page["Content-Security-Policy"]
    assert b"data-terminal" not in page.content


def test_a_terminal_no_worker_takes_ends_with_words_saying_so(owners_terminal, owner, monkeypatch, settings):
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    settings.SHELL_START_SECONDS = 0

    async def nothing_yet(session_id, after, wait_seconds):
        return []

    async def never_started(session_id):
        return False

    monkeypatch.setattr(shell_channel, "read_output", nothing_yet)
    monkeypatch.setattr(shell_channel, "was_started", never_started)
    token = ApiToken.issue(owner, "terminal")[1]

    async def read() -> str:
        response = await AsyncClient().get(f"/api/v1/training-jobs/{owners_terminal['job'].pk}/shells/s1/output",
                                           headers={"Authorization": f"Token {token}"})
        return "".join([chunk.decode() async for chunk in response.streaming_content])

    body = async_to_sync(read)()
    assert "event: end" in body and "no worker of the console took the terminal" in body
