"""The Slurm batch job a console job becomes: what it asks Slurm for, from the launch plan's plain values.

One task per node, each holding that node's share of the spec (its cores for the task, its memory, its GPUs
as GRES): the console starts one engine container per node, as on its own pools, and Open MPI places the
ranks inside them. Slurm owns the allocation's limits and accounting; the console asks for nothing beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.launch.plan import JobValues
from jobs.slurm.rest import JobDescription, SubmitRequest

# slurmrestd runs the script with exactly the environment it is given: this PATH is the one it needs.
SCRIPT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class PoolValues:
    """What a Slurm pool adds to every job it runs (ResourcePool's Slurm settings)."""

    # Whole nodes are the partition's to give (OverSubscribe=EXCLUSIVE, docs/slurm.md): slurmrestd 22.05 refuses
    # v0.0.38's own "exclusive": "true", so the submission does not ask.
    partition: str


# The batch script of a pool whose containers the console runs over its own SSH: it holds the nodes until the
# console is done with them and says how the job ended, so that Slurm's accounting agrees with the console:
# SIGUSR1 completed, SIGUSR2 failed (a cancel for a stopped job).
HOLDER_SCRIPT = """#!/bin/bash
# Holds the allocation while the training console runs this job's containers on its nodes.
trap 'exit 0' USR1
trap 'exit 1' USR2
sleep infinity &
wait
"""

# The batch script of a pool without root: the same holder, and one step with a task per node that runs its node's
# container (jobs.runtime.slurm_step): each task waits for the start script the console writes into its worker's
# folder once the worker is prepared, found by the node's Slurm name below the job's folder (TC_JOB_DIR), and runs
# it until the container ends; then it waits again, for an auto restart's next attempt on the same allocation.
# The job's end (SIGUSR1/2) reaches the start scripts too, which remove what is left of their containers (their
# cgroups included): the tasks wait for them, and the script for the step (within STEP_END_SECONDS), before it ends
# the job, because Slurm kills a step's remaining processes as soon as its task or its job is over.
STEP_END_SECONDS = 20
STEP_SCRIPT = """#!/bin/bash
# Holds the allocation while the training console runs this job; its step runs the job's containers.
code=
trap 'code=0' USR1
trap 'code=1' USR2
srun --kill-on-bad-exit=0 bash -c '
    # SIGTERM (a scancel, a time limit, the start of a preemption grace) reaches the start script too, which keeps
    # its container for the console a while: this task waits for it, or Slurm would kill it with the task.
    trap "stopping=1" TERM USR1 USR2
    while [ -z "${stopping-}" ]; do
        for start in "$TC_JOB_DIR"/worker-*/"start-$SLURMD_NODENAME"; do
            [ -f "$start" ] || continue
            bash "$start" &
            child=$!
            while kill -0 "$child" 2>/dev/null; do wait "$child"; done
        done
        sleep 0.2
    done' &
step=$!
# The job's end signals every process of the job, this sleep included: a new one until the trap has said how it ended.
while [ -z "$code" ]; do
    sleep infinity &
    wait $!
done
tries=0
while [ $tries -lt """ + str(2 * STEP_END_SECONDS) + """ ] && kill -0 $step 2>/dev/null; do tries=$((tries + 1)); sleep 0.5; done
exit $code
"""
COMPLETED_SIGNAL = "SIGUSR1"
FAILED_SIGNAL = "SIGUSR2"


# A console job's Slurm job is named for it (with the console's own tag, jobs.backends.slurm), so that a
# submission whose answer was lost is found again.
JOB_NAME_PREFIX = "tc-"


def batch_request(job: JobValues, pool: PoolValues, script: str, *, name: str, account: str = "", qos: str = "",
                  time_limit_minutes: int | None = None, working_dir: str = "/tmp", job_folder: str = "") -> SubmitRequest:
    """`job_folder`: where the job's workers' folders are on the nodes, for the step of STEP_SCRIPT."""
    description: JobDescription = {
        "name": name,
        "partition": pool.partition,
        # An int, not the [min, max] list the v0.0.38 schema shows: 22.05 reads [2, 2] as one node.
        "nodes": job.node_count,
        "tasks_per_node": 1,
        "cpus_per_task": job.spec.cpu_cores,
        "memory_per_node": job.spec.memory_gb * 1024,
        # A preempted or node-failed job goes back to the queue as the same Slurm job: its next attempt.
        "requeue": True,
        "current_working_directory": working_dir,
        "environment": {"PATH": SCRIPT_PATH, "TC_JOB_ID": str(job.job_id),
                        **({"TC_JOB_DIR": job_folder} if job_folder else {})},
        "standard_output": "/dev/null",
    }
    if job.spec.gpu_count:
        description["gres"] = f"gpu:{job.spec.gpu_count}"
    if account:
        description["account"] = account
    if qos:
        description["qos"] = qos
    if time_limit_minutes:
        description["time_limit"] = time_limit_minutes
    return {"job": description, "script": script}
