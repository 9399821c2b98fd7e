"""Launch: mpirun started detached on worker-0's node, its output followed by byte offset into the log.

mpirun does not hang on the console's SSH session, and how it ends is not the job's to say: the node's
root starts run-mpirun.sh, which runs `podman exec` of mpirun in worker-0's container as the job's user
from a wrapper in a session of its own, outside the container, with mpirun's stdout and stderr in files
of a root-owned run folder beside the job's home (rank tags kept) and podman exec's exit status, which
is mpirun's, in a third. No process of the job can write those files or signal the wrapper: a Completed
job is one whose mpirun exited 0. The console follows the two files from byte offsets that are stored
with the lines they cover (TrainingJob.launch_cursor, see LogSink.add_many), so a console process that
takes up a Running job after another one went away (a crash, a deploy, a reboot of its host) goes on
where the stored log ends: no line lost, none stored twice. A session that is cut is simply followed again.
"""

import asyncio
import codecs
import logging
import re
import shlex
from dataclasses import dataclass
from typing import TypedDict, cast

import asyncssh
from django.conf import settings

from jobs.launch.plan import JobPlan, WorkerPlan
from jobs.logs.sink import LogSink
from jobs.logs.store import LogRecord
from jobs.models import LogStream
from jobs.runtime.containers import CONTAINER_HOME, JOB_UID, as_node_root
from jobs.runtime.mpirun_output import MpirunOutput, ReaderState
from jobs.runtime.preparation import NODE_SCRIPTS, environment_file
from jobs.runtime.ssh import NodeError, connect
from jobs.runtime.ssh_output import STDERR, STDOUT, BoundedOutput

logger = logging.getLogger(__name__)

RUN_SCRIPT = (NODE_SCRIPTS / "run-mpirun.sh").read_text()
# Where seal-tools.sh puts the launch's programs in each container, unreadable to the job: mpirun, orted
# and ssh run from there as non-dumpable processes, which no rank can open (/proc/<pid>/fd) or trace to
# write into mpirun's output beside it.
SEALED_TOOLS = "/opt/training-console/bin"
# Run in the container as the job's user: the sealed programs first, where the image let them be sealed.
SEALED_LAUNCH = (f'dir={SEALED_TOOLS}; '
                 '[ -x "$dir/orted" ] && export OMPI_MCA_orte_launch_agent="$dir/orted"; '
                 '[ -x "$dir/ssh" ] && export OMPI_MCA_plm_rsh_agent="$dir/ssh"; '
                 'PATH="$dir:$PATH" exec "$@"')
ENDED_WITHOUT_STATUS = 76
EXIT_CODE = re.compile(r"[0-9]{1,3}", re.ASCII)
FOLLOW_RETRY_SECONDS = 1.0
# Once the job is being stopped, how long the follow waits for mpirun's end before giving up on it
# (the node of worker-0 may be the one that stopped answering).
STOP_GRACE_SECONDS = 20.0


class StreamCursor(TypedDict):
    offset: int
    reader: ReaderState


class RunEnding(TypedDict):
    """How the run ended, kept before its teardown: a process that takes the run up after it died there
    ends the job the same way, instead of finding the containers gone and calling the job lost."""

    outcome: str
    exit_code: int | None
    message: str


class LaunchCursor(TypedDict, total=False):
    """Where the follow stands in each of mpirun's output files (kept in TrainingJob.launch_cursor)."""

    stdout: StreamCursor
    stderr: StreamCursor
    ended: RunEnding
    # The worker of each rank as the run was launched: a run taken up again places them the same, whatever
    # an administrator changed in the spec or the launcher defaults since.
    rank_workers: list[int]


class FollowedFile:
    """One of mpirun's output files, read from a byte offset: decoded, split into ranks' lines, and where it stands."""

    def __init__(self, stream: str, plan: JobPlan, cursor: StreamCursor | None):
        self.lines = MpirunOutput(stream, plan.rank_workers, settings.LOG_LINE_MAX_BYTES)
        self.offset = 0
        if cursor:
            self.offset = int(cursor.get("offset", 0))
            self.lines.restore(cursor.get("reader") or {})
        self.reopen()

    def reopen(self) -> None:
        """Read again from the offset (a new session): what the decoder held is read again from there."""
        self.start, self.received = self.offset, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> list[LogRecord]:
        records = self.lines.feed(self.decoder.decode(data))
        self.received += len(data)
        held, _ = self.decoder.getstate()
        self.offset = self.start + self.received - len(held)
        return records

    def finish(self) -> list[LogRecord]:
        records = self.lines.feed(self.decoder.decode(b"", final=True)) + self.lines.finish()
        self.offset = self.start + self.received
        return records

    def cursor(self) -> StreamCursor:
        return {"offset": self.offset, "reader": self.lines.snapshot()}


@dataclass(frozen=True)
class FollowEnd:
    """How one follow session ended: mpirun's exit status, mpirun ended without one, or the session was cut."""

    ended: bool
    exit_code: int | None = None


CUT = FollowEnd(ended=False)


def run_dir(worker: WorkerPlan) -> str:
    """The run folder on the worker's node: root's, beside the job's home (the container mounts only home)."""
    return f"{worker.workdir}/run"


def launch_environment(plan: JobPlan, worker: WorkerPlan) -> str:
    """mpirun's variables, as an env file: the worker's platform variables (what its sshd gives every
    session from ~/.ssh/environment) and the account's. In a file of the run folder, not on podman's
    command line, which every account of the node may read."""
    return environment_file({"HOME": CONTAINER_HOME, "USER": plan.user, "LOGNAME": plan.user, **worker.env})


def podman_exec_argv(plan: JobPlan, worker: WorkerPlan, folder: str) -> list[str]:
    """mpirun in the worker's container as the job's user, from the sealed programs where there are some."""
    return ["podman", "exec", "--user", f"{JOB_UID}:{JOB_UID}", "--workdir", plan.working_dir,
            "--env-file", f"{folder}/env", worker.container_name, "sh", "-c", SEALED_LAUNCH, "sh", *plan.argv]


class Follow:
    """Start mpirun on worker-0 (once) and follow its output until it ends, across cut sessions."""

    def __init__(self, plan: JobPlan, sink: LogSink, cursor: LaunchCursor | None, stopping: asyncio.Event,
                 patience: float = STOP_GRACE_SECONDS):
        self.plan = plan
        self.patience = patience
        self.sink = sink
        self.stopping = stopping
        self.run_dir = run_dir(plan.workers[0])
        cursor = cursor or {}
        self.files: dict[int | None, FollowedFile] = {STDOUT: FollowedFile(LogStream.STDOUT, plan, cursor.get("stdout")),
                      STDERR: FollowedFile(LogStream.STDERR, plan, cursor.get("stderr"))}

    def cursor(self) -> LaunchCursor:
        return {"stdout": self.files[STDOUT].cursor(), "stderr": self.files[STDERR].cursor(),
                "rank_workers": list(self.plan.rank_workers)}

    async def run(self) -> int | None:
        """mpirun's exit code; None when it ended without one (it was killed) or the job was stopped meanwhile."""
        started = False
        # The node itself, as its root: the run folder and the wrapper are out of the container's reach.
        target = self.plan.workers[0].node
        while True:
            end = CUT
            try:
                connection = await connect(target)
            except NodeError as error:
                logger.info("job %s: following mpirun: %s", self.plan.job_id, error)
            else:
                async with connection:
                    if not started:
                        started = await self.start(connection)
                    if started:
                        end = await self.follow_once(connection)
            if end.ended:
                return end.exit_code
            if self.stopping.is_set():
                return None
            try:
                await asyncio.wait_for(self.stopping.wait(), FOLLOW_RETRY_SECONDS)
            except TimeoutError:
                pass

    async def start(self, connection: asyncssh.SSHClientConnection) -> bool:
        """Start mpirun; False when the session failed before it could tell (the start is tried again:
        one that already happened does nothing). A start that the script refuses fails the run."""
        argv = as_node_root(self.plan.workers[0], ["sh", "-c", RUN_SCRIPT, "run-mpirun", "start", self.run_dir,
                                                   *podman_exec_argv(self.plan, self.plan.workers[0], self.run_dir)])
        try:
            result = await connection.run(shlex.join(argv), input=launch_environment(self.plan, self.plan.workers[0]),
                                          check=False, timeout=settings.SSH_COMMAND_TIMEOUT)
        except (TimeoutError, OSError, asyncssh.Error) as error:
            logger.info("job %s: starting mpirun: %s; trying again", self.plan.job_id, error)
            return False
        if result.exit_status != 0:
            detail = str(result.stderr or "").strip()[-2000:]
            raise NodeError("worker-0", "starting mpirun", f"exit status {result.exit_status}: {detail}")
        return True

    async def exit_status(self, connection: asyncssh.SSHClientConnection) -> FollowEnd:
        argv = as_node_root(self.plan.workers[0], ["sh", "-c", RUN_SCRIPT, "run-mpirun", "status", self.run_dir])
        try:
            result = await connection.run(shlex.join(argv), check=False, timeout=settings.SSH_COMMAND_TIMEOUT)
        except (TimeoutError, OSError, asyncssh.Error) as error:
            logger.info("job %s: reading mpirun's status: %s; following again", self.plan.job_id, error)
            return CUT
        await self.finish()
        # Written by the wrapper from podman exec's status; read as a small number or not at all.
        code = str(result.stdout or "").strip()
        return FollowEnd(ended=True, exit_code=int(code) if EXIT_CODE.fullmatch(code) else None)

    async def follow_once(self, connection: asyncssh.SSHClientConnection) -> FollowEnd:
        out, err = self.files[STDOUT], self.files[STDERR]
        out.reopen()
        err.reopen()
        command = shlex.join(as_node_root(self.plan.workers[0], ["sh", "-c", RUN_SCRIPT, "run-mpirun", "follow", self.run_dir,
                                                                str(out.offset), str(err.offset)]))
        try:
            channel, output = await connection.create_session(BoundedOutput, command, encoding=None)
        except (OSError, asyncssh.Error) as error:
            logger.info("job %s: following mpirun: %s", self.plan.job_id, error)
            return CUT
        pump = asyncio.create_task(self.pump(cast(BoundedOutput, output)))
        stop_seen = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait([pump, stop_seen], return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():
                # Stopping: the teardown ends mpirun, and with it this session, unless worker-0 is gone.
                done, _ = await asyncio.wait([pump], timeout=self.patience)
                if not done:
                    channel.close()
                    pump.cancel()
                    return CUT
            await pump
            try:
                await asyncio.wait_for(channel.wait_closed(), timeout=10)
            except (TimeoutError, asyncssh.Error, OSError):
                pass
        finally:
            stop_seen.cancel()
        status = channel.get_exit_status()
        if status == 0:
            return await self.exit_status(connection)
        if status == ENDED_WITHOUT_STATUS:
            await self.finish()
            return FollowEnd(ended=True)
        if self.stopping.is_set():
            # The stop ended this session with mpirun: what its last lines held unfinished is kept.
            await self.finish()
        return CUT

    async def pump(self, output: BoundedOutput) -> None:
        """Each chunk into its file's lines, stored with where the follow then stands."""
        while (chunk := await output.read()) is not None:
            data, datatype = chunk
            followed = self.files.get(datatype if isinstance(datatype, int) else STDOUT, self.files[STDOUT])
            records = followed.feed(data if isinstance(data, bytes) else data.encode())
            await self.sink.add_many(records, mark=dict(self.cursor()))

    async def finish(self) -> None:
        """mpirun has ended and all it wrote is read: the lines that never got their newline are kept too."""
        for followed in self.files.values():
            await self.sink.add_many(followed.finish(), mark=dict(self.cursor()))


async def launch(plan: JobPlan, sink: LogSink, cursor: LaunchCursor | None = None,
                 stopping: asyncio.Event | None = None, patience: float = STOP_GRACE_SECONDS) -> int | None:
    """Run mpirun on worker-0 and follow it to its end; its exit code, or None when it ended without one.
    `patience`: how long, once the job is being stopped, mpirun's end is waited for."""
    async with sink:
        return await Follow(plan, sink, cursor, stopping or asyncio.Event(), patience).run()
