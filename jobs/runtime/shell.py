"""The relay of a terminal in a job's container: one SSH session to the worker's node running `podman exec -it`
as the job's user in the job's container, its terminal's output written to the session's channel and what the
user types read from it (jobs.shell_channel).

What a user types only ever reaches the terminal of a process already running as the job's user inside the
job's container: the command run on the node is the console's own, made of names the console chose. The
session ends when the user closes it, the shell exits, nobody types for SHELL_IDLE_SECONDS, or the job's
containers go away (its end, or the end of a failed job's hold); its opening and its end, who and for how long,
are the job's events.
"""

import asyncio
import logging
import shlex
import time
from dataclasses import dataclass

import asyncssh
from asgiref.sync import sync_to_async
from django.conf import settings

from jobs import shell_channel
from jobs.launch.plan import SshTarget
from jobs.models import JobEvent, JobStatus, TrainingJob, Worker
from jobs.runtime.containers import CONTAINER_HOME, JOB_UID
from jobs.runtime.ssh import NodeError, connect

logger = logging.getLogger(__name__)

# The shell the user gets: bash where the image has it.
LOGIN_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"
# How often the relay looks whether the job still has its containers.
JOB_LOOK_SECONDS = 5.0
READ_CHUNK = 4096


@dataclass(frozen=True)
class ShellTarget:
    node: SshTarget
    container_name: str


def exec_command(container_name: str) -> str:
    """`podman exec` with a terminal, as the job's user (never root), in the job's home inside its container."""
    return shlex.join(["podman", "exec", "--interactive", "--tty", "--user", f"{JOB_UID}:{JOB_UID}",
                       "--workdir", CONTAINER_HOME, "--env", f"HOME={CONTAINER_HOME}",
                       "--env", "TERM=xterm-256color", container_name, "sh", "-c", LOGIN_SHELL])


def containers_kept(job: TrainingJob) -> bool:
    return job.status == JobStatus.RUNNING or job.is_held_for_debugging


def shell_target(session: shell_channel.ShellSession) -> ShellTarget | str:
    """Where the session's shell runs, or why there is none now."""
    job = TrainingJob.objects.filter(pk=session.job_id).first()
    if job is None:
        return "the job is gone"
    if not containers_kept(job):
        return "the job's containers are gone (it is no longer running)"
    worker = Worker.objects.select_related("node").filter(job=job, index=session.worker_index).first()
    if worker is None or worker.node is None or not worker.container_name:
        return f"worker-{session.worker_index} has no container"
    return ShellTarget(node=worker.node.ssh_target(), container_name=worker.container_name)


def still_kept(job_id: int) -> bool:
    job = TrainingJob.objects.filter(pk=job_id).first()
    return job is not None and containers_kept(job)


def record(job_id: int, message: str) -> None:
    JobEvent.objects.create(job_id=job_id, kind="shell", message=message)


def duration_words(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class ShellRelay:
    """One session: SSH process <-> channel, until one side ends."""

    def __init__(self, session: shell_channel.ShellSession):
        self.session = session
        self.ended: str | None = None
        self.last_input = time.monotonic()

    def end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason

    async def run(self) -> str:
        if not await shell_channel.mark_started(self.session.id):
            # Its reader stopped waiting before a thread was free: nobody would see this shell.
            return "nobody waits for it any more"
        target = await sync_to_async(shell_target)(self.session)
        if isinstance(target, str):
            await shell_channel.write_end(self.session.id, target)
            return target
        started = time.monotonic()
        await sync_to_async(record)(self.session.job_id, f"{self.session.user_name} opened a shell in "
                                                         f"worker-{self.session.worker_index}")
        try:
            await self.relay(target)
        except (NodeError, OSError, asyncssh.Error) as error:
            self.end(f"the connection to the node failed: {error}")
        finally:
            reason = self.ended or "the terminal closed"
            await shell_channel.write_end(self.session.id, reason)
            await sync_to_async(record)(
                self.session.job_id, f"{self.session.user_name}'s shell in worker-{self.session.worker_index} "
                                     f"closed after {duration_words(time.monotonic() - started)}: {reason}")
        return reason

    async def relay(self, target: ShellTarget) -> None:
        connection = await connect(target.node)
        async with connection:
            process = await connection.create_process(
                exec_command(target.container_name), term_type="xterm-256color",
                term_size=(self.session.columns, self.session.rows), encoding="utf-8", errors="replace",
                stderr=asyncssh.STDOUT)
            tasks = [asyncio.create_task(self.pump_output(process)), asyncio.create_task(self.pump_input(process)),
                     asyncio.create_task(self.watch_job())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            process.close()

    async def pump_output(self, process: asyncssh.SSHClientProcess) -> None:
        while True:
            text = await process.stdout.read(READ_CHUNK)
            if not text:
                # A shell ends with its container too: say which it was.
                kept = await sync_to_async(still_kept)(self.session.job_id)
                self.end("the shell exited" if kept else "the job's containers are gone")
                return
            await shell_channel.write_output(self.session.id, text)

    async def pump_input(self, process: asyncssh.SSHClientProcess) -> None:
        while True:
            message = await shell_channel.next_input(self.session.id, wait_seconds=1.0)
            if message is None:
                if time.monotonic() - self.last_input > settings.SHELL_IDLE_SECONDS:
                    self.end(f"nothing was typed for {duration_words(settings.SHELL_IDLE_SECONDS)}")
                    return
                continue
            self.last_input = time.monotonic()
            kind = message.get("kind")
            if kind == "close":
                self.end(f"{self.session.user_name} closed it")
                return
            if kind == "resize":
                columns, rows = message.get("columns"), message.get("rows")
                if isinstance(columns, int) and isinstance(rows, int):
                    process.change_terminal_size(columns, rows)
            elif kind == "data" and isinstance(message.get("data"), str):
                process.stdin.write(message["data"])
                # A shell that does not read holds what was typed in SSH's window, not in this process.
                await process.stdin.drain()

    async def watch_job(self) -> None:
        """Ends the session once the job's containers are gone; meanwhile the session's lease is renewed."""
        while True:
            await asyncio.sleep(JOB_LOOK_SECONDS)
            await shell_channel.renew(self.session.id)
            if not await sync_to_async(still_kept)(self.session.job_id):
                self.end("the job's containers are gone")
                return


def relay_session(session_id: str) -> str:
    """Run one session to its end (in the task's thread); why it ended."""
    session = shell_channel.session(session_id)
    if session is None:
        return "no such session"

    async def relay_and_close() -> str:
        try:
            return await ShellRelay(session).run()
        finally:
            await shell_channel.close_async_client()

    return asyncio.run(relay_and_close())
