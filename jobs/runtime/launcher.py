"""Launch: run the background command on worker-0 and stream every rank's output into the job's log."""

import asyncio
import shlex
import signal as signals

import asyncssh
from django.conf import settings

from jobs.launch.plan import JobPlan
from jobs.logs.sink import LogSink
from jobs.models import LogStream
from jobs.runtime.mpirun_output import MpirunOutput
from jobs.runtime.ssh import connect
from jobs.runtime.ssh_output import STDERR, STDOUT, BoundedOutput


async def _pump(output: BoundedOutput, plan: JobPlan, sink: LogSink) -> None:
    """mpirun's stdout and stderr, each read back into its ranks' lines, into the sink until the session ends."""
    streams = {STDOUT: MpirunOutput(LogStream.STDOUT, plan.rank_workers, settings.LOG_LINE_MAX_BYTES),
               STDERR: MpirunOutput(LogStream.STDERR, plan.rank_workers, settings.LOG_LINE_MAX_BYTES)}
    # Ends when the channel closes: mpirun exited, or the container went away under us (a stop, a
    # lost node); what was read is kept either way.
    while (chunk := await output.read()) is not None:
        data, datatype = chunk
        await sink.add_many(streams.get(datatype, streams[STDOUT]).feed(data))
    for stream in streams.values():
        await sink.add_many(stream.finish())


async def launch(plan: JobPlan, sink: LogSink) -> int | None:
    """Run mpirun on worker-0; return its exit code, or None when the session was cut before it ended."""
    worker0 = plan.workers[0]
    connection = await connect(plan.container_target(worker0))
    async with sink, connection:
        command = f"cd {shlex.quote(plan.working_dir)} && exec {shlex.join(plan.argv)}"
        channel, output = await connection.create_session(BoundedOutput, command, encoding="utf-8", errors="replace")
        await _pump(output, plan, sink)
        try:
            await asyncio.wait_for(channel.wait_closed(), timeout=10)
        except (TimeoutError, asyncssh.Error, OSError):
            pass
        status = channel.get_exit_status()
        signal = channel.get_exit_signal()
    if status is not None and status >= 0:
        return status
    if signal:
        return 128 + _signal_number(signal[0])
    return None


def _signal_number(name: str) -> int:
    try:
        return int(getattr(signals, f"SIG{name}"))
    except (AttributeError, TypeError):
        return 0
