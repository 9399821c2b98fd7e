"""What the benchmarks that run jobs share: their own console (database, Redis, Celery worker, web server,
local cluster on a bridge and subnet of their own), loading the engine image onto nodes, a job's
containers made by hand as the runtime makes them (the floor a benchmark sets the console beside), and
reading a job's stages back from its log lines, its events and the Celery worker's own log.

Not a benchmark: the benchmarks under bench/ import it (each stays runnable alone, as
`.venv/bin/python bench/NAME.py`). Call `environment()` before Django is set up.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))
STATE_ROOT = Path("/var/lib/training-console")


def environment(name: str, subnet: str, bridge: str, prefix: str) -> Path:
    """Point the console at this benchmark's own database, node directories and local cluster; returns its var dir."""
    var = BASE_DIR / "var" / f"bench-{name}"
    os.environ.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        CONSOLE_VAR_DIR=str(var),
        NODE_WORK_ROOT=str(STATE_ROOT / f"bench-{name}-jobs"),
        LOCALCLUSTER_SUBNET=subnet,
        LOCALCLUSTER_BRIDGE=bridge,
        LOCALCLUSTER_PREFIX=prefix,
        LOCALCLUSTER_STATE_DIR=str(STATE_ROOT / f"bench-{name}-cluster"),
        # Each benchmark loads the images it uses, outside what it times; a prefetch would run under its figures.
        IMAGE_PREFETCH="0",
    )
    return var


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def busy_seconds() -> float:
    """CPU seconds this machine has spent busy (all cores, every process), from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def test_runs() -> str:
    """The test runs (pytest, .ci/run) on this machine now: the benchmarks and the tests disturb each other."""
    found = subprocess.run(["pgrep", "-af", r"pytest|\.ci/run"], capture_output=True, text=True).stdout.splitlines()
    mine = {str(os.getpid()), str(os.getppid())}
    found = [line for line in found if line.split()[0] not in mine]
    return "; ".join(line[:80] for line in found) or "none"


def time_limit(seconds: int) -> None:
    """Bound the whole benchmark: past `seconds` a TimeoutError unwinds it, so its finally blocks take everything down."""

    def expired(_signum, _frame):
        raise TimeoutError(f"the benchmark ran past its {seconds} s limit")

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)


def in_process_console(prefix: str) -> tuple[str, Callable[..., int]]:
    """Django set up in this process on a SQLite database of its own, migrated, with what a job needs (a user,
    an engine version, a spec, a code directory); returns the scratch folder and a maker of jobs' ids."""
    import tempfile

    scratch = tempfile.mkdtemp(prefix=prefix)
    os.environ.update(DJANGO_SETTINGS_MODULE="console.settings", CONSOLE_VAR_DIR=scratch, LOG_LEVEL="WARNING")
    import django

    from console.state import prepare

    prepare()  # var/, the secret key, the SQLite files: before the settings are read
    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from jobs.models import CodeDirectory, Engine, EngineVersion, ResourceSpec, TrainingJob

    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create_user("bench")
    version = EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="bench")
    code_dir = CodeDirectory.objects.create(name="bench", path=scratch)
    spec = ResourceSpec.objects.create(name="bench", cpu_cores=1, memory_gb=1)

    def new_job(**fields) -> int:
        return TrainingJob.objects.create(name="bench", owner=owner, engine_version=version, code_dir=code_dir,
                                          spec=spec, node_count=2, boot_file="train.py", bind_args="", x_args="",
                                          mca_args="", tune_prefixes="MA_", **fields).pk

    return scratch, new_job


def best_wall_time(repeat: int, work: Callable[[], object]) -> float:
    """The shortest wall time of `repeat` runs of `work`, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def begin(name: str, parser, limit: int):
    """The benchmark's arguments, with its bound in time (--time-limit), once the machine's load is printed."""
    parser.add_argument("--time-limit", type=int, default=limit, help="seconds before everything is taken down")
    args = parser.parse_args()
    print(f"{name}: {load_line()} at the start; test runs: {test_runs()}", flush=True)
    time_limit(args.time_limit)
    return args


class Console:
    """This benchmark's own console: Redis, the database, a local cluster, a Celery worker and, if asked, the web server."""

    def __init__(self, var: Path, nodes: int, slots: int, web: bool = False):
        self.var, self.nodes, self.slots, self.with_web = var, nodes, slots, web
        self.redis = self.worker = self.web = None
        self.web_port = 0
        self.worker_log = var / "celery-worker.log"

    def __enter__(self) -> Console:
        from console import services

        redis_port = services.free_port()
        os.environ["REDIS_URL"] = os.environ["CELERY_BROKER_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        self.var.mkdir(parents=True, exist_ok=True)
        for stale in [*self.var.glob("console.sqlite3*"), self.worker_log]:
            stale.unlink(missing_ok=True)

        import django

        from console.state import prepare

        prepare()  # var/, the secret key, the SQLite files: before the settings are read
        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        from jobs import localcluster

        quiet = open(os.devnull, "w")
        # What a run of this benchmark that was killed left behind.
        localcluster.down(settings.LOCALCLUSTER_STATE_DIR, bridge=settings.LOCALCLUSTER_BRIDGE,
                          prefix=settings.LOCALCLUSTER_PREFIX)
        shutil.rmtree(settings.NODE_WORK_ROOT, ignore_errors=True)
        self.redis = services.start_redis(redis_port, self.var / "redis.log")
        try:
            call_command("migrate", verbosity=0)
            call_command("seedconsole", password="bench", stdout=quiet)
            call_command("buildimages", stdout=quiet)  # cached by the recipe's hash: under a second when built
            call_command("localcluster", "up", nodes=self.nodes, slots=self.slots, stdout=quiet)
            self.worker = services.start_celery_worker({}, self.worker_log)
            if self.with_web:
                # The server production runs (its HTTP protocol with the header deadline, its proxy policy),
                # so that what a benchmark measures is what a deployment serves.
                self.web_port = services.free_port()
                self.web = services.start_web_server(self.web_port, {}, self.var / "uvicorn.log")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        from django.conf import settings
        from django.core.management import call_command

        from console import services

        signal.alarm(0)
        print(f"test runs on the machine at the end: {test_runs()}", flush=True)
        services.stop(self.web)
        services.stop(self.worker)
        try:
            call_command("localcluster", "down", stdout=open(os.devnull, "w"))
        finally:
            shutil.rmtree(settings.NODE_WORK_ROOT, ignore_errors=True)
            services.stop(self.redis)


async def load_image_on_nodes(nodes, reference: str, archive: Path, concurrency: int = 4) -> list[float]:
    """`podman load` the console's archive of `reference` on every node that lacks it (the nodes share this
    machine's files, so the archive is read in place, not copied); returns each node's seconds."""
    from jobs.runtime.ssh import connect, run_checked

    gate = asyncio.Semaphore(concurrency)

    async def one(node) -> float:
        async with gate:
            started = time.monotonic()
            target = node.ssh_target()
            async with await connect(target) as connection:
                exists = await connection.run(shlex.join(["podman", "image", "exists", reference]), check=False)
                if exists.exit_status != 0:
                    await run_checked(connection, target.label, "loading the image",
                                      ["podman", "load", "--quiet", "--input", str(archive)], timeout=900)
                    await run_checked(connection, target.label, "checking the image",
                                      ["podman", "image", "exists", reference])
            return time.monotonic() - started

    return list(await asyncio.gather(*(one(node) for node in nodes)))


async def prepare_by_hand(plan, worker, code_archive: Path, scratch: Path) -> dict[str, float]:
    """One worker's container as the runtime makes it, with no more steps than it needs; each step timed."""
    from jobs.runtime.containers import JOB_UID, SECCOMP_PROFILE, run_argv, seccomp_path
    from jobs.runtime.preparation import NODE_SCRIPTS, write_worker_bundle
    from jobs.runtime.ssh import connect, run_checked

    times: dict[str, float] = {}
    mark = time.monotonic()

    def took(step: str) -> None:
        nonlocal mark
        now = time.monotonic()
        times[step] = now - mark
        mark = now

    bundle = scratch / f"bundle-{worker.index}.tar"
    write_worker_bundle(plan, worker, bundle)
    connection = await connect(worker.node)
    took("SSH connect (node)")
    async with connection:
        async with connection.start_sftp_client() as sftp:
            await sftp.makedirs(worker.workdir, exist_ok=True)
            await sftp.put(str(bundle), f"{worker.workdir}/bundle.tar")
            await sftp.put(str(code_archive), f"{worker.workdir}/code.tar")
            await sftp.put(str(NODE_SCRIPTS / "prepare-workdir.sh"), f"{worker.workdir}/prepare-workdir.sh")
            await sftp.put(str(SECCOMP_PROFILE), seccomp_path(worker))  # the runtime's argv names it
        took("upload (SFTP: mkdir, bundle, code, script, seccomp profile)")
        await run_checked(connection, worker.node.label, "laying out the job's files",
                          ["sh", f"{worker.workdir}/prepare-workdir.sh", worker.workdir, str(JOB_UID)])
        took("workdir layout (prepare-workdir.sh)")
        await run_checked(connection, worker.node.label, "starting the container", run_argv(plan, worker))
        took("container start (podman run)")
    deadline = time.monotonic() + 15
    while True:  # polled every 10 ms: the floor of the wait, not the console's 100 ms
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(worker.address, plan.sshd_port), 2)
            writer.close()
            break
        except (TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)
    took("sshd port open")
    return times


async def remove_by_hand(plan, worker) -> None:
    from jobs.runtime.ssh import connect, run_checked

    async with await connect(worker.node) as connection:
        await run_checked(connection, worker.node.label, "removing the container",
                          ["podman", "rm", "--force", "--time", "2", worker.container_name])
        await run_checked(connection, worker.node.label, "removing the files", ["rm", "-rf", worker.workdir])


def bare_plan(owner, nodes, form_data: dict):
    """The plan the runtime would make for this job on these nodes; the job row is kept out of the queue."""
    from django.conf import settings

    from jobs.launch.plan import new_key_pair, plan_job
    from jobs.launch.platform_env import worker_hostname
    from jobs.models import JobStatus, LauncherDefaults, Worker, workers_launch_values
    from jobs.submission.forms import TrainingJobForm
    from jobs.submission.jobs import job_from_form, sshd_port_for

    form = TrainingJobForm(data=form_data)
    assert form.is_valid(), form.errors
    job = job_from_form(form, owner)
    job.status = JobStatus.COMPLETED  # never Pending: no dispatcher takes it
    job.save()
    job.sshd_port = sshd_port_for(job.pk, LauncherDefaults.current())
    job.save(update_fields=["sshd_port"])
    workers = [Worker(job=job, index=index, node=node, node_name=node.name, address=node.address,
                      hostname=worker_hostname(job.dns_name, index)) for index, node in enumerate(nodes)]
    return plan_job(job.launch_values(), workers_launch_values(workers), work_root=settings.NODE_WORK_ROOT, user=settings.JOB_USER,
                    preferred_uid=settings.JOB_USER_PREFERRED_UID, client_key=new_key_pair(), host_key=new_key_pair())


# The Celery worker's log: the console's logging format, and asyncssh's INFO lines (one per connection,
# session, command, exit status), each with its connection and channel.
SSH_LOG = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \[task [^\]]*\] asyncssh[\w.]*: "
                     r"(?:\[conn=(?P<conn>\d+)(?:, chan=(?P<chan>\d+))?\] )?(?P<message>.*)$")
PEER = re.compile(r"(?:Opening SSH connection to|Connected to SSH server at) ([\d.]+), port (\d+)")


@dataclass
class Step:
    name: str
    start: datetime
    end: datetime | None = None

    @property
    def seconds(self) -> float | None:
        return (self.end - self.start).total_seconds() if self.end else None


@dataclass
class SshConnection:
    address: str
    port: int
    opened: datetime
    steps: list[Step] = field(default_factory=list)


def step_name(command: str) -> str:
    words = command.split()
    if "prepare-workdir.sh" in command:
        return "workdir layout (prepare-workdir.sh)"
    if words[:3] == ["podman", "image", "exists"]:
        return "image check (podman image exists)"
    if words[:2] == ["podman", "run"]:
        return "container start (podman run)"
    if words[:2] == ["podman", "load"] or words[:2] == ["podman", "pull"]:
        return "image load"
    if words[:2] == ["mkdir", "-p"]:
        return "mkdir"
    if words[:3] == ["sh", "-s", "--"]:
        return "teardown (stop-worker.sh)"
    if "exec mpirun" in command or words[:1] == ["cd"]:
        return "launch session (mpirun)"
    return command[:40]


def _log_time(text: str) -> datetime:
    # The console's log writes local time; the job's rows are aware (UTC).
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").astimezone()


def ssh_connections(log_path: Path, since: datetime, until: datetime) -> list[SshConnection]:
    """The SSH connections the Celery worker opened between `since` and `until`, each with its timed steps:
    connecting (TCP + key exchange + auth), and each session by what it ran (SFTP as "upload (SFTP)")."""
    opening: dict[str, list[datetime]] = {}
    connections: dict[int, SshConnection] = {}
    sessions: dict[tuple[int, int], Step] = {}
    if not log_path.exists():
        return []
    for line in log_path.read_text(errors="replace").splitlines():
        match = SSH_LOG.match(line)
        if not match:
            continue
        at = _log_time(match["at"])
        if at < since or at > until:
            continue
        message = match["message"].strip()
        peer = PEER.match(message)
        if match["conn"] is None:
            if peer and message.startswith("Opening"):
                opening.setdefault(f"{peer[1]}:{peer[2]}", []).append(at)
            continue
        conn = int(match["conn"])
        if peer and message.startswith("Connected"):
            started = (opening.get(f"{peer[1]}:{peer[2]}") or [at]).pop(0)
            connections[conn] = SshConnection(peer[1], int(peer[2]), started, [Step("SSH connect", started)])
            continue
        connection = connections.get(conn)
        if connection is None:
            continue
        if message.startswith("Auth for user") and message.endswith("succeeded"):
            connection.steps[0].end = at
        elif match["chan"] is not None:
            key = (conn, int(match["chan"]))
            if message == "Requesting new SSH session":
                sessions[key] = Step("session", at)
                connection.steps.append(sessions[key])
            elif key in sessions:
                session = sessions[key]
                if message.startswith("Command: "):
                    session.name = step_name(message.removeprefix("Command: "))
                elif message == "Subsystem: sftp" or message == "Starting SFTP client":
                    session.name = "upload (SFTP)"
                elif message.startswith("Received exit status") or (message.startswith("Channel closed")
                                                                    and session.end is None):
                    session.end = at
    return sorted(connections.values(), key=lambda connection: connection.opened)


@dataclass
class Mark:
    """One moment of a job, from its log lines (`LogLine.at`), its events (`JobEvent.at`) or the benchmark's clock."""

    at: datetime
    what: str


def job_marks(job_id: int) -> list[Mark]:
    """The job's state events, its platform lines, and its first and last line of a rank, in time order."""
    from jobs.models import JobEvent, LogLine, LogStream

    marks = [Mark(event.at, f"event {event.kind}") for event in JobEvent.objects.filter(job_id=job_id)]
    for line in LogLine.objects.filter(job_id=job_id, stream=LogStream.SYSTEM).order_by("seq"):
        marks.append(Mark(line.at, f"line: {line.text[:90]}"))
    ranks = LogLine.objects.filter(job_id=job_id, rank__isnull=False).order_by("seq")
    first, last = ranks.first(), ranks.last()
    if first:
        marks.append(Mark(first.at, f"first rank line (rank {first.rank}): {first.text[:60]}"))
        marks.append(Mark(last.at, f"last rank line (rank {last.rank}): {last.text[:60]}"))
    return sorted(marks, key=lambda mark: mark.at)


def first_at(marks: list[Mark], *starts: str) -> datetime | None:
    return next((mark.at for mark in marks if mark.what.startswith(starts)), None)


def last_at(marks: list[Mark], *starts: str) -> datetime | None:
    found = [mark.at for mark in marks if mark.what.startswith(starts)]
    return found[-1] if found else None


def seconds(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start and end else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    line = "| " + " | ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line.format(*headers), rule, *(line.format(*map(str, row)) for row in rows)])
