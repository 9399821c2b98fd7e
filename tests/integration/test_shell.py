"""A terminal in a running job's container, end to end: `tc shell` against the console's web server under
uvicorn, its relay on a real Celery worker, SSH to a local node and `podman exec` into the job's container.
What is typed runs there as the job's user; a stranger is refused and nothing is run; the sessions are the
job's events."""

import subprocess

import pytest
from django.contrib.auth import get_user_model

from jobs import shell_channel
from jobs.models import ApiToken, JobStatus
from tests.integration.helpers import submit_program, wait_for
from tests.integration.test_cli import TC, Tc
from tests.integration.test_log_streaming import web_server  # noqa: F401 - the fixture, found by name


@pytest.fixture
def running_job(api):
    job = submit_program(api, "hang.py", parameters=[{"name": "rank", "value": "-1"}])
    wait_for(job, [JobStatus.RUNNING], timeout=240)
    yield job
    api.post(f"/api/v1/training-jobs/{job.pk}/stop")


def tc_for(user, port: int, home) -> Tc:
    return Tc(f"http://127.0.0.1:{port}", ApiToken.issue(user, "shell")[1], home)


def test_the_owner_types_into_a_worker_and_it_runs_there_as_the_jobs_user(
        web_server, owner, running_job, tmp_path):  # noqa: F811 - web_server is the fixture imported above
    tc = tc_for(owner, web_server, tmp_path)
    typed = "echo answer-$((6*7)); id -u; hostname; ls /home/ma-user >/dev/null && echo home-ok\nexit\n"
    done = subprocess.run([str(TC), "shell", str(running_job.pk), "--worker", "1"], input=typed, text=True,
                          capture_output=True, env=tc.env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "answer-42" in done.stdout
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "1000" in lines, done.stdout
    worker = running_job.workers.get(index=1)
    assert worker.hostname in lines, done.stdout
    assert "home-ok" in lines
    assert "the shell exited" in done.stderr
    events = list(running_job.events.filter(kind="shell").values_list("message", flat=True))
    assert events[0] == "owner opened a shell in worker-1"
    assert events[1].startswith("owner's shell in worker-1 closed after ") and events[1].endswith("the shell exited")


def test_a_stranger_who_may_see_the_job_cannot_open_a_terminal_and_nothing_runs(
        web_server, running_job, tmp_path):  # noqa: F811
    admin = get_user_model().objects.create_superuser("watcher", password="watcher-password")
    tc = tc_for(admin, web_server, tmp_path)
    done = subprocess.run([str(TC), "shell", str(running_job.pk)], input="touch /tmp/intruded\n", text=True,
                          capture_output=True, env=tc.env, timeout=60)
    assert done.returncode != 0
    assert "Only the job's owner may open a terminal" in done.stderr
    assert not running_job.events.filter(kind="shell").exists()
    assert shell_channel.open_sessions_of(admin.pk) == 0


def test_a_terminal_ends_when_its_job_ends(web_server, owner, api, running_job, tmp_path):  # noqa: F811
    tc = tc_for(owner, web_server, tmp_path)
    shell = subprocess.Popen([str(TC), "shell", str(running_job.pk)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=tc.env)
    try:
        assert shell.stdin is not None
        shell.stdin.write("echo ready-$((1+1))\n")
        shell.stdin.flush()
        wait_for_event(running_job, "opened a shell")
        api.post(f"/api/v1/training-jobs/{running_job.pk}/stop")
        out, err = shell.communicate(timeout=120)
    finally:
        shell.kill()
    assert "ready-2" in out
    assert "the job's containers are gone" in err


def wait_for_event(job, words: str, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not job.events.filter(kind="shell", message__contains=words).exists():
        assert time.monotonic() < deadline, f"no shell event saying {words!r}"
        time.sleep(0.3)
