"""tc against a real console: the web server under uvicorn, a Celery worker and the local cluster. A folder
pushed, a job submitted and its log followed to the end with the job's exit code (0, or the failed rank's),
a running job stopped, a job rebuilt, and a follower whose connection is cut mid-job resuming with no line
missing or doubled."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.models import ApiToken, JobStatus, TrainingJob
from tests.integration.helpers import PROGRAMS, wait_for
from tests.integration.test_log_streaming import web_server  # noqa: F401 - the fixture, found by name

TC = Path(sys.executable).parent / "tc"
SUBMITTED = ("name", "description", "engine_version_id", "code_dir_id", "boot_file", "parameters", "env", "spec_id",
             "pool_id", "node_count", "extra_args", "auto_stop_hours", "metric_definitions", "watchdog_seconds")


class Tc:
    """tc as a user runs it, with the owner's token in its environment."""

    def __init__(self, url: str, token: str, home: Path):
        self.env = {**os.environ, "TC_URL": url, "TC_TOKEN": token, "TC_CONFIG": str(home / "tc.json")}

    def run(self, *argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([str(TC), *argv], capture_output=True, text=True, env=self.env, timeout=timeout)

    def json(self, *argv: str):
        done = self.run(*argv, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def start(self, *argv: str, url: str | None = None) -> subprocess.Popen:
        env = {**self.env, **({"TC_URL": url} if url else {})}
        return subprocess.Popen([str(TC), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture
def tc(web_server, owner, tmp_path):  # noqa: F811 - web_server is the fixture imported above
    return Tc(f"http://127.0.0.1:{web_server}", ApiToken.issue(owner, "cli")[1], tmp_path)


def program_folder(tmp_path: Path, program: str) -> Path:
    folder = tmp_path / f"code-{program.removesuffix('.py')}"
    (folder / "lib").mkdir(parents=True)
    shutil.copy(PROGRAMS / program, folder / program)
    (folder / "lib" / "notes.txt").write_text("pushed with tc\n")
    return folder


def job_file(tmp_path: Path, code_dir: str, boot_file: str, **fields) -> Path:
    body = {"name": "cli-job", "engine": "MPI", "engine_version": "local-mpi4py", "code_dir": code_dir,
            "boot_file": boot_file, "spec": "local-cpu", "node_count": 2, **fields}
    path = tmp_path / "job.yaml"
    path.write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in body.items()) + "\n")
    return path


def rendered_log(job: TrainingJob) -> list[str]:
    from jobs.logs.store import render_line

    return [render_line(line) for line in job.log_lines.order_by("seq")]


def push(tc: Tc, tmp_path: Path, program: str, name: str) -> None:
    pushed = tc.json("code", "push", str(program_folder(tmp_path, program)), "--name", name)
    assert pushed["name"] == name and pushed["file_count"] == 2


def test_a_pushed_folder_runs_and_following_it_prints_the_whole_log_and_exits_0(tc, console, tmp_path):
    push(tc, tmp_path, "probe.py", "cli-probe")
    done = tc.run("submit", str(job_file(tmp_path, "cli-probe", "probe.py")), "--param", "count=20", "--follow")
    assert done.returncode == 0, done.stderr
    job = TrainingJob.objects.get(name="cli-job")
    assert job.status == JobStatus.COMPLETED
    assert done.stdout.splitlines() == rendered_log(job)
    assert sum(bool(re.fullmatch(r"\[rank \d\] SEQ \d \d+", line)) for line in done.stdout.splitlines()) == 80
    listed = tc.json("ls", "--status", "Completed")
    assert [item["id"] for item in listed] == [job.pk]
    assert tc.run("logs", str(job.pk)).stdout.splitlines() == rendered_log(job)


def test_following_a_job_whose_rank_exits_3_exits_3(tc, console, tmp_path):
    push(tc, tmp_path, "probe.py", "cli-exit")
    done = tc.run("submit", str(job_file(tmp_path, "cli-exit", "probe.py")), "--param", "exit_rank=1",
                  "--param", "exit_code=3", "--follow")
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert TrainingJob.objects.get(name="cli-job").status == JobStatus.FAILED
    assert "Failed (exit code 3)" in done.stderr


def test_a_running_job_is_stopped_and_its_follower_exits_non_zero(tc, console, tmp_path):
    push(tc, tmp_path, "probe.py", "cli-stop")
    job = tc.json("submit", str(job_file(tmp_path, "cli-stop", "probe.py")), "--param", "sleep=120")
    follower = tc.start("logs", str(job["id"]), "--follow")
    wait_for(TrainingJob.objects.get(pk=job["id"]), [JobStatus.RUNNING], timeout=120)
    stopped = tc.json("stop", str(job["id"]))
    assert stopped["status"] in (JobStatus.TERMINATING, JobStatus.TERMINATED)
    _out, err = follower.communicate(timeout=120)
    assert follower.returncode == 143, err
    assert TrainingJob.objects.get(pk=job["id"]).status == JobStatus.TERMINATED
    assert tc.json("show", str(job["id"]))["status"] == JobStatus.TERMINATED


def test_a_rebuilt_job_is_the_same_submission_and_runs(tc, console, tmp_path):
    push(tc, tmp_path, "probe.py", "cli-rebuild")
    first = tc.json("submit", str(job_file(tmp_path, "cli-rebuild", "probe.py", description="to rebuild",
                                           env={"MY_FLAG": "1"}, data_url="/cache/data")), "--param", "count=3")
    wait_for(TrainingJob.objects.get(pk=first["id"]), [JobStatus.COMPLETED], timeout=180)
    done = tc.run("rebuild", str(first["id"]), "--follow")
    assert done.returncode == 0, done.stderr
    original, copy = TrainingJob.objects.order_by("pk")
    assert copy.pk != original.pk and copy.status == JobStatus.COMPLETED
    assert {field: getattr(copy, field) for field in SUBMITTED} == {field: getattr(original, field) for field in SUBMITTED}


class CuttableProxy(threading.Thread):
    """A TCP proxy in front of the web server whose open connections can be cut, as a flaky network would."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.connections = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.open += [client, upstream]
                self.connections += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            for end in self.open:
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()
            self.open = []

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_a_follower_whose_connection_is_cut_mid_job_resumes_with_no_line_missing_or_doubled(tc, console, web_server,  # noqa: F811
                                                                                          tmp_path):
    push(tc, tmp_path, "numbered.py", "cli-numbered")
    job = tc.json("submit", str(job_file(tmp_path, "cli-numbered", "numbered.py")),
                  "--param", "count=2000", "--param", "per_second=400")
    proxy = CuttableProxy(web_server)
    proxy.start()
    follower = tc.start("logs", str(job["id"]), "--follow", "--json", url=f"http://127.0.0.1:{proxy.port}")
    seqs: list[int] = []
    reader = threading.Thread(target=lambda: seqs.extend(json.loads(line)["seq"] for line in follower.stdout), daemon=True)
    reader.start()
    try:
        for cut_after in (200, 2000, 5000):
            deadline = time.monotonic() + 120
            while len(seqs) < cut_after and follower.poll() is None:
                assert time.monotonic() < deadline, f"the follower printed {len(seqs)} lines"
                time.sleep(0.05)
            proxy.cut()
        follower.wait(timeout=180)
        reader.join(timeout=30)
    finally:
        proxy.close()
        if follower.poll() is None:
            follower.kill()
    err = follower.stderr.read()
    assert follower.returncode == 0, err
    stored = TrainingJob.objects.get(pk=job["id"])
    assert stored.status == JobStatus.COMPLETED
    assert seqs == list(range(1, stored.log_line_count + 1))
    assert proxy.connections >= 3 and err.count("resuming after line") >= 2, err


def test_a_follower_restarted_mid_job_after_its_last_line_prints_each_line_once(tc, console, tmp_path):
    push(tc, tmp_path, "numbered.py", "cli-restart")
    job = tc.json("submit", str(job_file(tmp_path, "cli-restart", "numbered.py")),
                  "--param", "count=1500", "--param", "per_second=400")
    first = tc.start("logs", str(job["id"]), "--follow", "--json")
    seqs = []
    for line in first.stdout:
        seqs.append(json.loads(line)["seq"])
        if len(seqs) == 1000:
            first.kill()
            break
    first.wait(timeout=30)
    assert TrainingJob.objects.get(pk=job["id"]).status == JobStatus.RUNNING, "the job ended before the restart"
    done = tc.run("logs", str(job["id"]), "--follow", "--json", "--after", str(seqs[-1]))
    assert done.returncode == 0, done.stderr
    seqs += [json.loads(line)["seq"] for line in done.stdout.splitlines()]
    assert seqs == list(range(1, TrainingJob.objects.get(pk=job["id"]).log_line_count + 1))


def test_login_then_a_jobs_outputs_fetched_and_its_nccl_report(tc, console, tmp_path):
    config = tmp_path / "login" / "tc.json"
    env = {name: value for name, value in tc.env.items() if name not in ("TC_URL", "TC_TOKEN")}
    login = subprocess.run([str(TC), "login", "--url", tc.env["TC_URL"], "--token", tc.env["TC_TOKEN"]],
                           capture_output=True, text=True, env={**env, "TC_CONFIG": str(config)}, timeout=60)
    assert login.returncode == 0, login.stderr
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    tc.env = {**env, "TC_CONFIG": str(config)}
    push(tc, tmp_path, "write_output.py", "cli-outputs")
    done = tc.run("submit", str(job_file(tmp_path, "cli-outputs", "write_output.py", train_url="/home/ma-user/outputs")),
                  "--param", "big_bytes=10", "--follow")
    assert done.returncode == 0, done.stderr
    job = TrainingJob.objects.get(name="cli-job")
    listed = tc.run("outputs", str(job.pk), "--get", str(tmp_path / "got"))
    assert listed.returncode == 0, listed.stderr
    assert "checkpoints/step-1.txt" in listed.stdout
    assert (tmp_path / "got" / "result.txt").read_text() == "trained by 4 ranks\n"
    assert (tmp_path / "got" / "checkpoints" / "step-1.txt").read_text() == "weights 1 2 3\n"
    report = tc.json("nccl", str(job.pk))
    assert report["status"] == JobStatus.COMPLETED and report["expected"]["ranks"] == 4
    assert tc.run("nccl", str(job.pk)).returncode == 0


def test_data_pushed_with_tc_is_a_jobs_input_and_its_obs_output_comes_back_with_tc(tc, console, object_store,
                                                                                  owner, tmp_path):
    from jobs.management.commands.localstore import register

    storage = register(object_store.endpoint, object_store.state)
    bucket = f"s3://{storage.user_bucket(owner.pk, owner.username)}"
    assert tc.run("data", "ls").stdout.strip() == f"{bucket}/  (local)"
    dataset = tmp_path / "dataset"
    (dataset / "train").mkdir(parents=True)
    (dataset / "train" / "a.csv").write_text("x,y\n1,2\n")
    (dataset / "labels.txt").write_text("cat\ndog\n")
    pushed = tc.run("data", "push", str(dataset), f"{bucket}/datasets/toy")
    assert pushed.returncode == 0 and "Uploaded 2 file(s), 16 bytes" in pushed.stdout, pushed
    listed = tc.run("data", "ls", f"{bucket}/datasets/toy/").stdout.splitlines()
    assert [line.split()[-1] for line in listed] == [f"{bucket}/datasets/toy/train/", f"{bucket}/datasets/toy/labels.txt"]
    refused = tc.run("data", "ls", "s3://user-999-someone/")
    assert refused.returncode != 0 and "is not yours" in refused.stderr

    shutil.copytree(program_folder(tmp_path, "data_roundtrip.py"), tmp_path / "roundtrip")
    tc.json("code", "push", str(tmp_path / "roundtrip"), "--name", "cli-roundtrip")
    obs = bucket.replace("s3://", "obs://")
    done = tc.run("submit", str(job_file(tmp_path, "cli-roundtrip", "data_roundtrip.py",
                                         data_url=f"{bucket}/datasets/toy/", train_url=f"{obs}/runs/cli/")),
                  "--param", "steps=2", "--follow")
    assert done.returncode == 0, done.stderr
    assert "read 2 files from /home/ma-user/modelarts/inputs/data_url_0/" in done.stdout
    job = TrainingJob.objects.get(name="cli-job")

    fetched = tc.run("outputs", str(job.pk), "--get", str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "got" / "checkpoints" / "step-1.txt").read_text() == "weights after step 1\n" * 100
    got = tc.run("data", "get", f"{obs}/runs/cli/", str(tmp_path / "again"))
    assert got.returncode == 0 and "Saved 2 file(s)" in got.stdout, got
    assert (tmp_path / "again" / "checkpoints" / "step-0.txt").read_text() == "weights after step 0\n" * 100
