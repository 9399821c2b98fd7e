"""Jobs made straight in the database for the page tests that need no cluster: a failed job with its card,
a running one whose log and metrics the test writes as a run would (lines stored, then news on Redis)."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from jobs.logs.progress import JobProgressPublisher
from jobs.models import (
    CodeDirectory,
    Engine,
    EngineVersion,
    JobEvent,
    JobStatus,
    LogLine,
    MetricPoint,
    ResourceSpec,
    TrainingJob,
    Worker,
    WorkerState,
)
from tests.browser.helpers import PASSWORD

MPIRUN_WORDS = ("ORTE was unable to reliably start one or more daemons.\n"
                "This usually is caused by:\n* not finding the required libraries and/or binaries on\n  one or more nodes.")


def viewer(username: str = "viewer"):
    users = get_user_model().objects
    return users.filter(username=username).first() or users.create_user(username, password=PASSWORD)


def page_job(owner, name: str, status: str, **fields) -> TrainingJob:
    engine, _ = EngineVersion.objects.get_or_create(engine=Engine.objects.get_or_create(name="MPI")[0], version="pages")
    spec, _ = ResourceSpec.objects.get_or_create(name="pages-cpu", defaults={"cpu_cores": 2, "memory_gb": 4, "cpu_slots_per_node": 2})
    code, _ = CodeDirectory.objects.get_or_create(name="pages-code", defaults={"path": "/nonexistent"})
    start = timezone.now() - timedelta(minutes=5)
    job = TrainingJob.objects.create(
        name=name, owner=owner, engine_version=engine, code_dir=code, boot_file="train.py", spec=spec, node_count=2,
        status=status, bind_args="", x_args="", mca_args="", tune_prefixes="MA_", created_at=start,
        started_at=start + timedelta(seconds=20), command_template="mpirun -np ${OPENMPI_NP} python train.py",
        command="mpirun -np 4 python /home/ma-user/user-job-dir/pages-code/train.py", hostfile="a slots=2\nb slots=2\n",
        **fields)
    JobEvent.objects.create(job=job, kind="state:Pending", message="Job created, waiting for resources", at=start)
    JobEvent.objects.create(job=job, kind="state:Creating", message="Nodes allocated, preparing the containers",
                            at=start + timedelta(seconds=5))
    JobEvent.objects.create(job=job, kind="state:Running", message="Training started", at=start + timedelta(seconds=20))
    for index in range(2):
        Worker.objects.create(job=job, index=index, node_name=f"node-{index}", address=f"10.9.0.{index + 1}",
                              hostname=f"{name}-worker-{index}", state=WorkerState.READY)
    return job


def failed_job(owner, name: str = "broken") -> TrainingJob:
    """A job mpirun could not start on its second node: the card's kind is mpirun_launch."""
    job = page_job(owner, name, JobStatus.FAILED, exit_code=1, ended_at=timezone.now(),
                   status_message="Training end with return code: 1", failure={
                       "kind": "mpirun_launch", "title": "mpirun could not start or reach its daemon on node-1",
                       "rank": None, "worker": None, "node": "node-1", "how": "", "exit_code": 1, "signal": None,
                       "exception": "", "where": "", "last_lines": [], "others": [], "mpirun": MPIRUN_WORDS, "nccl": [],
                       "hints": ["mpirun reaches the other workers over SSH on the job's port: check that every worker's "
                                 "container started and that the nodes can reach each other."]})
    JobEvent.objects.create(job=job, kind="state:Failed", message="Training end with return code: 1")
    write_lines(job, [f"step={step} loss={1 / (step + 1):.4f}" for step in range(30)] + [MPIRUN_WORDS.splitlines()[0]])
    return job


def write_lines(job: TrainingJob, texts: list[str], rank: int | None = 0) -> int:
    """Lines stored as a run stores them, the job's count moved on, and the news published; the last seq."""
    job.refresh_from_db(fields=["log_line_count"])
    first = job.log_line_count + 1
    LogLine.objects.bulk_create([LogLine(job=job, seq=first + offset, worker_index=0 if rank is not None else None,
                                         rank=rank, stream="stdout", text=text) for offset, text in enumerate(texts)])
    last = first + len(texts) - 1
    TrainingJob.objects.filter(pk=job.pk).update(log_line_count=last)
    JobProgressPublisher(job.pk).log_appended(last)
    return last


def write_metric(job: TrainingJob, name: str, values: list[tuple[int, int, float]]) -> None:
    """Points of (rank, step, value), and the job's final values as the monitor keeps them."""
    now = timezone.now()
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name=name, rank=rank, step=step, value=value, at=now, seq=1)
                                     for rank, step, value in values])
    finals = dict(TrainingJob.objects.get(pk=job.pk).final_metrics)
    finals[name] = values[-1][2]
    TrainingJob.objects.filter(pk=job.pk).update(final_metrics=finals)
