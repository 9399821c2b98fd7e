"""tc's own parts, without a console: reading the event stream, the exit code a job's end gives, job documents
with flags on top, the config file's mode, bad input answered with one line and exit code 2, and a
submission retried with its Idempotency-Key when the answer is lost (a stand-in HTTP server drops it), a 503 sent
again after its Retry-After a few times."""

import json
import os
import stat
import subprocess
import sys
import time

import pytest
from training_console_cli import config
from training_console_cli.api import BUSY_ATTEMPTS, Client
from training_console_cli.documents import line_text, load_document, submission_of, with_flags
from training_console_cli.errors import BadInput, CliError
from training_console_cli.follow import EXIT_ABNORMAL, EXIT_STOPPED, events, exit_code_of

from tests.http_recorder import Answer, Recorder, Request, json_answer


def test_the_event_stream_is_read_into_events_skipping_comments_and_the_retry():
    raw = [b"retry: 1000\n", b"\n", b"event: status\n", b'data: {"status": "Running"}\n', b"\n", b": keep-alive\n",
           b"\n", b"id: 7\n", b'data: {"seq": 7}\n', b"\n", b"event: end\n", b"data: {}\n", b"\n"]
    assert list(events(iter(raw))) == [{"event": "status", "data": '{"status": "Running"}'},
                                       {"id": "7", "data": '{"seq": 7}'}, {"event": "end", "data": "{}"}]


@pytest.mark.parametrize("job, code", [
    ({"status": "Completed", "exit_code": 0}, 0),
    ({"status": "Failed", "exit_code": 3}, 3),
    ({"status": "Failed", "exit_code": None}, 1),
    ({"status": "Terminated", "exit_code": None}, EXIT_STOPPED),
    ({"status": "Abnormal", "exit_code": None}, EXIT_ABNORMAL),
])
def test_a_jobs_end_is_tcs_exit_code(job, code):
    assert exit_code_of(job) == code


def test_flags_lay_over_the_document(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: a\nnode_count: 2\nparameters:\n  - {name: lr, value: '0.1'}\nenv: {A: '1'}\n")
    body = with_flags(load_document(str(path)), {"name": "b", "spec": None}, ["lr=0.2", "steps=3"], ["B=x=y"])
    assert body == {"name": "b", "node_count": 2, "env": {"A": "1", "B": "x=y"},
                    "parameters": [{"name": "lr", "value": "0.2"}, {"name": "steps", "value": "3"}]}
    with pytest.raises(BadInput):
        with_flags({}, {}, ["novalue"], [])


@pytest.mark.parametrize("text", ["- a\n- b\n", "name: [unclosed\n"])
def test_a_document_that_is_not_a_mapping_is_bad_input(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(BadInput):
        load_document(str(path))


def test_a_rebuild_sends_the_writable_fields_only():
    detail = {"id": 1, "name": "a", "status": "Failed", "workers": [], "engine": "MPI", "pool": None}
    assert submission_of(detail, {"name", "engine", "pool"}) == {"name": "a", "engine": "MPI", "pool": None}
    assert submission_of(detail, None) == {"name": "a", "engine": "MPI", "pool": None}
    kept = {**detail, "checkpoints": [{"step": 3}], "attempts": [{"number": 1}], "checkpoint_grace_seconds": 20}
    assert submission_of(kept, None) == {"name": "a", "engine": "MPI", "pool": None, "checkpoint_grace_seconds": 20}


def test_log_lines_are_shown_as_the_consoles_files_show_them_with_controls_made_visible():
    assert line_text({"stream": "system", "rank": None, "text": "up"}) == "[ModelArts Service Log]up"
    assert line_text({"stream": "stdout", "rank": 2, "text": "loss=1\x1b[2J"}) == "[rank 2] loss=1\\x1b[2J"
    # The same controls as the console's log files make visible (a C1 CSI too), tabs kept.
    from training_console_cli.documents import CONTROLS

    from jobs.logs.store import TERMINAL_CONTROLS

    assert CONTROLS.pattern == TERMINAL_CONTROLS.pattern
    assert line_text({"stream": "stdout", "rank": 0, "text": "a\tb\x9b2J"}) == "[rank 0] a\tb\\x9b2J"
    assert line_text({"stream": "stderr", "rank": None, "text": "[ModelArts Service Log]forged"}) == (
        "[mpirun] [ModelArts Service Log]forged"), "an untagged line is mpirun's, never the platform's"


def test_the_config_file_is_written_readable_by_its_owner_only(tmp_path, monkeypatch):
    path = tmp_path / "tc" / "config.json"
    path.parent.mkdir()
    path.write_text("{}")
    path.chmod(0o644)
    monkeypatch.setenv("TC_CONFIG", str(path))
    config.save(config.Settings("http://console:8000", "secret"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    monkeypatch.delenv("TC_URL", raising=False)
    monkeypatch.delenv("TC_TOKEN", raising=False)
    assert config.load() == config.Settings("http://console:8000", "secret")
    monkeypatch.setenv("TC_TOKEN", "from-env")
    assert config.load().token == "from-env"


@pytest.mark.parametrize("argv", [["submit", "--nodes", "two"], ["frobnicate"], ["logs"], ["submit", "missing.yaml"],
                                  ["logs", "1", "--worker", "-1"], ["--url", "ftp://x", "ls"], ["code", "push", "nope"]])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, argv):
    env = {**os.environ, "TC_CONFIG": str(tmp_path / "none.json"), "TC_URL": "http://127.0.0.1:9", "TC_TOKEN": "t"}
    done = subprocess.run([sys.executable, "-m", "training_console_cli", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_submission_whose_answer_is_lost_is_sent_again_with_the_same_idempotency_key():
    def lose_the_first(request: Request) -> Answer | None:
        if len(console.seen) == 1:
            return None
        return json_answer({"id": 1, "name": "a", "status": "Pending"}, status=201)

    with Recorder(answer=lose_the_first) as console:
        assert Client(config.Settings(console.url, "t")).submit({"name": "a"})["id"] == 1
    keys = [request.headers["Idempotency-Key"] for request in console.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0].startswith("tc-")


def busy_answer(wait: str) -> Answer:
    return Answer(503, {"Content-Type": "application/json", "Retry-After": wait},
                  json.dumps({"detail": "The database is busy and could not record this."}).encode())


def test_a_stop_answered_503_is_sent_again_after_its_retry_after_until_the_console_takes_it(capsys):
    def busy_twice(request: Request) -> Answer:
        if len(console.seen) <= 2:
            return busy_answer("1" if len(console.seen) == 1 else "0")
        return json_answer({"id": 7, "name": "a", "status": "Terminating"})

    with Recorder(answer=busy_twice) as console:
        started = time.monotonic()
        stopped = Client(config.Settings(console.url, "t")).post("training-jobs/7/stop")
        waited = time.monotonic() - started

    assert stopped["status"] == "Terminating"
    assert [request.path for request in console.seen] == ["/api/v1/training-jobs/7/stop"] * 3
    assert waited >= 1, "it waited the Retry-After the console named"
    said = capsys.readouterr().err
    assert "the console is busy (HTTP 503): sending it again in 1 s (attempt 2 of 4)" in said
    assert "sending it again in 0 s (attempt 3 of 4)" in said


def test_a_console_that_stays_busy_is_given_up_on_after_a_few_tries_and_tc_says_so():
    with Recorder(answer=lambda request: busy_answer("0")) as console:
        with pytest.raises(CliError) as refused:
            Client(config.Settings(console.url, "t")).post("training-jobs/7/stop")

    assert len(console.seen) == BUSY_ATTEMPTS
    assert str(refused.value) == ("The database is busy and could not record this. (HTTP 503; sent 4 times, the "
                                  "console stayed busy: try again later)")
    assert refused.value.code == 1
