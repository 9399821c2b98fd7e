"""tc's own parts, without a console: reading the event stream, the exit code a job's end gives, job documents
with flags on top, the config file's mode, bad input answered with one line and exit code 2, and a
submission retried with its Idempotency-Key when the answer is lost (a stand-in HTTP server drops it)."""

import os
import stat
import subprocess
import sys

import pytest
from training_console_cli import config
from training_console_cli.api import Client
from training_console_cli.documents import line_text, load_document, submission_of, with_flags
from training_console_cli.errors import BadInput
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
