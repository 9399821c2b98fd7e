"""A worker's container on a node of a Slurm pool without root: started by the Slurm job's own step.

The batch script (jobs.slurm.batch.STEP_SCRIPT) runs one `srun` task per node, which waits for its node's start
script in the job's folder and runs it. The console, logged in as the Slurm user, prepares the worker as on any
node, then writes that script: it starts the container with the user's rootless Podman, waits on it, and removes it
on SIGTERM. So the container's cgroups are made below the step's (Slurm's memory and CPU limits hold it, its CPU
time is the job's), and a `scancel`, a preemption or a time limit ends it, which Slurm's proctrack alone would not
do on these cgroups (it signals the step's own processes, not the container's, below them).
"""

import asyncio
import re
import shlex
from pathlib import Path

import asyncssh

from jobs.launch.plan import JobPlan, WorkerPlan
from jobs.runtime.containers import GPUS_LABEL, NO_GPUS, device_options, gpu_indices, image_command, run_options
from jobs.runtime.ssh import NodeError, run_checked

# Defines remove_step_cgroups, which the teardown runs too (jobs.runtime.teardown).
STEP_CGROUPS = (Path(__file__).resolve().parent / "node_scripts" / "step-cgroups.sh").read_text()
# How long the step may take to start a prepared worker's container (the image is in the user's store by then;
# the first start on a node makes the user's Podman's own state, 25 s measured on a busy machine).
START_SECONDS = 120.0
POLL_SECONDS = 0.5
# On SIGTERM the container stays this long for the console to end it itself (its ranks given their notice): Slurm
# sends it to a step as a preemption's grace begins, not only at the end. Within KillWait (30 s by default), after
# which Slurm kills the step and would leave the container (its cgroups are below the step's, out of its reach),
# with 10 s left for the container's removal and its cgroups' (podman is slow to start on a busy node).
HOLD_AT_MOST_SECONDS = 20
HOLD_AFTER_GRACE_SECONDS = 10


def hold_seconds(plan: JobPlan) -> int:
    """How long a SIGTERM leaves the container to the console: the job's checkpoint grace and its teardown."""
    return min(plan.checkpoint_grace_seconds + HOLD_AFTER_GRACE_SECONDS, HOLD_AT_MOST_SECONDS)
# What the user's Podman reads from the login's environment (the node's settings): the step gets them too.
PODMAN_VARIABLES = ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "XDG_RUNTIME_DIR")

# Writes the start script (stdin) at $1, whole or not at all, after the login's Podman settings: a value with a
# quote in it is left out rather than quoted (these are a site's paths).
WRITE_SCRIPT = r"""umask 077
file=$1
rm -f -- "${file%/*}/start.failed" "${file%/*}/start.log"
{
    echo '#!/bin/bash'
    for name in """ + " ".join(PODMAN_VARIABLES) + r"""; do
        eval "value=\${$name-}"
        case $value in ""|*"'"*) continue ;; esac
        printf "export %s='%s'\n" "$name" "$value"
    done
    cat
} >"$file.new" && mv "$file.new" "$file"
"""

# What the poll prints: "failed" and the start's output, or the container's state ("absent" before the step ran it),
# and once it runs, the cgroups of its first process.
POLL_SCRIPT = """if [ -e "$2/start.failed" ]; then echo failed; tail -c 2000 "$2/start.log"; exit 0; fi
found=$(podman container inspect --format '{{.State.Status}} {{.State.Pid}}' "$1" 2>/dev/null) || { echo absent; exit 0; }
echo "${found% *}"
if [ "${found% *}" = running ]; then cat "/proc/${found##* }/cgroup" 2>/dev/null; fi"""
# A Slurm step's cgroup, on cgroup v1 (/slurm_<node>/uid_<u>/job_<id>/step_0/...) as on v2 (.../job_<id>/step_0/...).
STEP_CGROUP = re.compile(r"/job_\d+/step_[^/]+(/|$)")


def start_path(worker: WorkerPlan) -> str:
    """Where the step's task on the worker's node looks for its start script (jobs.slurm.batch.STEP_SCRIPT)."""
    return f"{worker.workdir}/start-{worker.node.label}"


def start_script(plan: JobPlan, worker: WorkerPlan) -> str:
    """The body of the start script (the step's task runs it with bash, as the Slurm user)."""
    name = shlex.quote(worker.container_name)
    workdir = shlex.quote(worker.workdir)
    return "\n".join([
        # Once read, it is gone: an attempt that follows finds only its own.
        'rm -f -- "$0"',
        # SIGTERM is how Slurm ends a step (scancel, time limit, and a preemption as its grace begins): the console,
        # which sees the same within a watch, ends the container itself after its ranks' notice; what it has not
        # ended within the hold goes here. SIGUSR1/2 come only once the console is done (the job's end): at once.
        # Its container's cgroups go once it has ended (step-cgroups.sh), only below this job's step.
        STEP_CGROUPS,
        'cleanup() { remove_step_cgroups "$cid" "${SLURM_JOB_ID:-none}"; }',
        f"end() {{ podman rm --force --ignore --time 2 {name} >/dev/null 2>&1; cleanup; exit 143; }}",
        # Counted in seconds, not looks: each look starts a podman, which takes a while on a busy node.
        f"hold() {{ hold_until=$((SECONDS + {hold_seconds(plan)})); "
        f"while [ $SECONDS -lt $hold_until ] && podman container exists {name}; do sleep 0.5; done; end; }}",
        "cid=",
        "trap hold TERM",
        "trap end INT USR1 USR2",
        *gpu_choice(worker),
        f'if ! cid=$({shlex.join(run_options(plan, worker))} "${{devices[@]}}" {shlex.join(image_command(plan))} '
        f"2>{workdir}/start.log); then",
        f"    : >{workdir}/start.failed",
        "    exit 1",
        "fi",
        # In the background, so that the trap runs as soon as the signal comes, not when the wait returns.
        f"podman wait {name} >/dev/null 2>&1 &",
        "wait $!",
        "cleanup",
        "",
    ])


def gpu_choice(worker: WorkerPlan) -> list[str]:
    """The lines that set `devices`, the container's GPUs: the ones Slurm gave the step (SLURM_STEP_GPUS, where the
    site's GRES names them) rather than the node's first ones the plan names, which may be another job's on a node
    Slurm shares; none for a spec without GPUs, whatever the step was given."""
    lines = [f"devices=({shlex.join(device_options(worker.gpu_devices))})",
             f"gpus={shlex.quote(gpu_indices(worker.gpu_devices))}"]
    if worker.gpu_devices:
        lines += [
            'if [ -n "${SLURM_STEP_GPUS-}" ]; then devices=() gpus=',
            '    for gpu in ${SLURM_STEP_GPUS//,/ }; do case $gpu in *[!0-9]*) continue ;; esac',
            '        devices+=(--device "nvidia.com/gpu=$gpu"); gpus=${gpus:+$gpus,}$gpu; done',
            "fi",
        ]
    # The container says which, for the watch's GPU readings (worker-usage.sh).
    return [*lines, f'devices+=(--label "{GPUS_LABEL}=${{gpus:-{NO_GPUS}}}")']


def outside_the_step(cgroups: str) -> bool:
    """Whether a process's /proc/PID/cgroup puts it outside a Slurm step: its memory cgroup (v1), or its one
    cgroup (v2), is not below a step's. Podman made it below the step that started it unless the node's Podman
    makes its cgroups elsewhere (systemd's manager)."""
    entries = [line.split(":", 2) for line in cgroups.splitlines() if line.count(":") >= 2]
    memory = [path for _, controllers, path in entries if "memory" in controllers.split(",")]
    paths = memory or [path for _, controllers, path in entries if controllers == ""]
    return not paths or not all(STEP_CGROUP.search(path) for path in paths)


async def start_in_step(connection: asyncssh.SSHClientConnection, plan: JobPlan, worker: WorkerPlan) -> None:
    """Hand the worker's container to the Slurm job's step on its node and wait until it runs."""
    label = worker.node.label
    await run_checked(connection, label, "handing the container to the Slurm job's step",
                      ["sh", "-c", WRITE_SCRIPT, "sh", start_path(worker)], input_text=start_script(plan, worker))
    deadline = asyncio.get_running_loop().time() + START_SECONDS
    while True:
        answer = (await run_checked(connection, label, "looking at the container the step starts",
                                    ["sh", "-c", POLL_SCRIPT, "sh", worker.container_name, worker.workdir])).strip()
        state, _, detail = answer.partition("\n")
        if state == "running":
            if outside_the_step(detail):
                raise NodeError(label, "starting the container in the Slurm job's step",
                                "it runs outside the Slurm job's cgroups, where Slurm's limits and accounting do not "
                                "hold it: the node's Podman must use runc with the cgroupfs manager (docs/slurm.md)")
            return
        if state == "failed":
            raise NodeError(label, "starting the container in the Slurm job's step", detail.strip() or "podman run failed")
        if state in ("exited", "stopped"):
            raise NodeError(label, "starting the container in the Slurm job's step", "the container ended at once")
        if asyncio.get_running_loop().time() > deadline:
            raise NodeError(label, "starting the container in the Slurm job's step",
                            f"the step did not start it within {START_SECONDS:.0f} s (is the Slurm job's srun step running?)")
        await asyncio.sleep(POLL_SECONDS)
