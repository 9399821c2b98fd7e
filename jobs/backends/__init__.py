"""Who gives a queued job its nodes: one small interface, a backend per kind of pool.

- `console_nodes`: the console's own allocator over the SSH hosts it owns (jobs.allocation).
- `slurm`: a Slurm partition: Slurm allocates, the console launches on the nodes it gave.

The Celery tasks call `dispatch`, `watch` and `release` for every backend; nothing else in the run asks which
backend a job has: once a job has workers, preparing, launching, following and tearing down are the same.
"""

from typing import Protocol

from jobs.backends import console_nodes, slurm


class Backend(Protocol):
    def dispatch(self) -> list[int]:
        """Give queued jobs their nodes where it can; returns the jobs now Creating (their runs are queued)."""

    def watch(self) -> list[int]:
        """Look at the running jobs as the backend sees them; returns the jobs it asked to stop."""

    def release(self) -> None:
        """Give back what jobs that ended still hold of the backend."""


BACKENDS: tuple[Backend, ...] = (console_nodes.CONSOLE_NODES, slurm.SLURM)


def dispatch() -> list[int]:
    return [job_id for backend in BACKENDS for job_id in backend.dispatch()]


def watch() -> list[int]:
    return [job_id for backend in BACKENDS for job_id in backend.watch()]


def release() -> None:
    for backend in BACKENDS:
        backend.release()
