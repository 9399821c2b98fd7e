"""Follow, the launch's reader of mpirun's files, with only SSH faked: a session cut mid-line is followed
again from the offset the lines stored so far end at, what the status file says is read as a number or as
no status, and mpirun is started and followed by the node's root, outside the job's reach."""

import asyncio
import json
import shlex
from types import SimpleNamespace

import pytest

from jobs.runtime import launcher
from jobs.runtime.launcher import ENDED_WITHOUT_STATUS, Follow
from jobs.runtime.ssh import NodeError
from jobs.runtime.ssh_output import STDERR, STDOUT

WORKER_0 = SimpleNamespace(index=0, node="node-a as root", workdir="/var/lib/jobs/job-1-worker-0",
                           container_name="job-1-worker-0", rootless=False, env={"MA_NUM_HOSTS": "2", "SECRET_TOKEN": "s3cret"})
PLAN = SimpleNamespace(job_id=1, rank_workers=(0, 1), workers=[WORKER_0], working_dir="/w", user="ma-user",
                       argv=["mpirun", "python", "x.py"])
STDOUT_BYTES = b"[1,0]<stdout>:first line\n[1,1]<stdout>:sec" + "ond ✓ line\n[1,0]<stdout>:third\n".encode()


class Sink:
    """The log sink as the follow sees it: lines in order, and the cursor stored with them."""

    def __init__(self):
        self.lines: list[tuple[int | None, str]] = []
        self.mark: dict | None = None

    async def add_many(self, records, mark=None):
        self.lines += [(record.rank, record.text) for record in records]
        self.mark = json.loads(json.dumps(mark))


class Session:
    """One `follow` session: the bytes after the offsets it was asked for, then an exit status or a cut."""

    def __init__(self, command: str, stdout: bytes, stderr: bytes, cut_after: int | None, status: int | None):
        words = command.split()
        out_offset, err_offset = int(words[-2]), int(words[-1])
        self.chunks = [(stdout[out_offset:], STDOUT), (stderr[err_offset:], STDERR)]
        if cut_after is not None:
            self.chunks = [(stdout[out_offset:out_offset + cut_after], STDOUT)]
        self.status = status

    def get_exit_status(self):
        return self.status

    async def wait_closed(self):
        return None

    def close(self):
        return None


class Connection:
    def __init__(self, script: list[dict], asked: list[str], state):
        self.script, self.asked, self.state = script, asked, state

    async def run(self, command, input=None, check=False, timeout=None):
        """The start (counted) and the status read, as the run-mpirun.sh answers them."""
        if shlex.split(command)[4] == "start":  # sh -c SCRIPT run-mpirun MODE ...
            self.state.starts += 1
            self.state.start_command, self.state.start_input = command, input
            return SimpleNamespace(exit_status=0, stdout="", stderr="")
        return SimpleNamespace(exit_status=0, stdout=self.state.status_file, stderr="")

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def create_session(self, factory, command, encoding=None):
        assert encoding is None, "offsets count bytes"
        self.asked.append(command)
        step = self.script.pop(0)
        channel = Session(command, STDOUT_BYTES, b"", step.get("cut_after"), step["status"])
        output = factory()
        output.connection_made(SimpleNamespace(get_recv_window=lambda: 1 << 20, pause_reading=lambda: None,
                                               resume_reading=lambda: None))
        for data, datatype in channel.chunks:
            if data:
                output.data_received(data, datatype)
        output.connection_lost(None)
        return channel, output


@pytest.fixture
def nodes(monkeypatch):
    state = SimpleNamespace(script=[], asked=[], status_file="0\n", starts=0, targets=[])

    async def connect(target):
        state.targets.append(target)
        if not state.script:
            raise NodeError("worker-0", "SSH", "connection refused")  # the process's last session is over
        return Connection(state.script, state.asked, state)

    monkeypatch.setattr(launcher, "connect", connect)
    monkeypatch.setattr(launcher, "FOLLOW_RETRY_SECONDS", 0.01)
    return state


def follow(cursor=None):
    sink = Sink()
    code = asyncio.run(Follow(PLAN, sink, cursor, asyncio.Event()).run())
    return code, sink


def test_a_session_cut_mid_line_is_followed_again_from_where_the_stored_lines_end(nodes):
    cut = STDOUT_BYTES.index(b"sec") + 3
    nodes.script = [{"cut_after": cut, "status": None}, {"status": 0}]

    code, sink = follow()

    assert code == 0 and nodes.starts == 1, "mpirun is started once, whatever happens to the sessions"
    assert sink.lines == [(0, "first line"), (1, "second ✓ line"), (0, "third")]
    assert nodes.asked[1].endswith(f" {cut} 0"), "the second session asks for the bytes after the first's"
    assert sink.mark["stdout"]["offset"] == len(STDOUT_BYTES)


def test_a_run_taken_up_from_a_stored_cursor_gives_only_the_lines_after_it(nodes):
    nodes.script = [{"cut_after": STDOUT_BYTES.index(b"sec") + 3, "status": None}]
    first = Sink()

    async def until_cut():
        stopping = asyncio.Event()
        task = asyncio.create_task(Follow(PLAN, first, None, stopping).run())
        # Once it tries to connect again, the cut session is over and everything it read is stored.
        while len(nodes.targets) < 2:
            await asyncio.sleep(0.005)
        stopping.set()  # the process goes away after the cut
        await task

    asyncio.run(until_cut())
    nodes.script = [{"status": 0}]
    code, second = follow(first.mark)

    assert first.lines + second.lines == [(0, "first line"), (1, "second ✓ line"), (0, "third")]


@pytest.mark.parametrize("status_file", ["garbage\n", "", "99999999999999999999\n", "²\n", "1 2\n"])
def test_a_status_file_without_a_number_is_no_status_not_an_error(nodes, status_file):
    nodes.status_file = status_file
    nodes.script = [{"status": 0}]
    assert follow()[0] is None


def test_mpirun_ended_without_a_status_is_no_status(nodes):
    nodes.script = [{"status": ENDED_WITHOUT_STATUS}]
    code, sink = follow()
    assert code is None and sink.lines[-1] == (0, "third")


def test_mpirun_is_started_by_the_nodes_root_in_a_run_folder_outside_the_jobs_home(nodes):
    nodes.script = [{"status": 0}]
    follow()

    assert set(nodes.targets) == {"node-a as root"}, "every session is the node's, none the container's"
    words = shlex.split(nodes.start_command)
    run_dir = words[5]
    assert run_dir == f"{WORKER_0.workdir}/run" and not run_dir.startswith(f"{WORKER_0.workdir}/home")
    podman = words[6:]
    assert podman[:4] == ["podman", "exec", "--user", "1000:1000"] and "job-1-worker-0" in podman
    assert podman[-3:] == PLAN.argv, "mpirun's own command line, as the plan made it"
    assert "s3cret" not in nodes.start_command, "variables go in a root-only file, not on a command line"
    assert "SECRET_TOKEN=s3cret\n" in nodes.start_input and "HOME=/home/ma-user\n" in nodes.start_input
