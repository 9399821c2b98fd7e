#!/bin/sh
# Ends one worker's container and removes its files. Prints how each rank of the worker ended
# ("rank-record ..." lines, from the fork agent's records) and, last, what is left ("left=N": the
# container, its processes, its mounts; ideally 0).
# Usage: stop-worker.sh WORKDIR CONTAINER_NAME [slurm-step]
#   slurm-step: a Slurm step started the container (a pool without root): its cgroups go too (below).
set -u
workdir=$1 name=$2 started_by=${3-}

# A container a Slurm step started: its cgroups go too, by its id (remove_step_cgroups, from step-cgroups.sh, which
# the teardown sends before this script). The step's start script removes them unless it was killed first: srun
# turns a SIGTERM, a scancel's or a time limit's, into a SIGKILL of its tasks at once.
container_id=
if [ "$started_by" = slurm-step ]; then
    container_id=$(podman container inspect --format '{{.Id}}' "$name" 2>/dev/null)
fi

# Two podman commands whatever the container's state (each starts a podman process, a tenth of a second
# of CPU on a busy node): no "exists" asked before or after.
# The ranks first, with a moment to exit on SIGTERM and their agents to record it: kill -1 from inside
# reaches every process of the container but its first (the sshd), which goes with the container after.
# The container is known by its unique name, never by a kernel number. One exec does the kill and the
# wait, counting with the shell's own glob: no child process of the count is in the count, so the first
# process and this shell are 2 once the ranks are gone. A container already gone or stopped fails the
# exec, which is fine: there is nothing to signal.
# shellcheck disable=SC2016
podman exec "$name" sh -c 'kill -TERM -1 2>/dev/null; tries=0
    while [ "$tries" -lt 20 ]; do
        set -- /proc/[0-9]*; [ "$#" -le 2 ] && exit 0
        tries=$((tries + 1)); sleep 0.1
    done' >/dev/null 2>&1
# --ignore: success means the container is not there afterwards, whether it was removed now or before.
container_left=0
podman rm --force --ignore --time 2 "$name" >/dev/null 2>&1 || container_left=1
[ -n "$container_id" ] && remove_step_cgroups "$container_id" '*'

# The records are written by the job's user, so they are read as that user (a planted link then reads
# nothing it could not read itself), and only rank-numbered files, cut to a few known characters. They
# are the job's own claim: any process of the job could have written them, so they add detail to what
# mpirun said (its exit status is root's, in the run folder) and never stand against it.
print_rank_records() {
    [ -d "$workdir/home/.mpi/ranks" ] && command -v setpriv >/dev/null || return 0
    owner=$(stat -c '%u:%g' "$workdir/home") || return 0
    [ "${owner%:*}" != 0 ] || return 0
    # The inner script expands its variables as the job's user, not here.
    # shellcheck disable=SC2016
    setpriv --reuid="${owner%:*}" --regid="${owner#*:}" --clear-groups -- sh -c '
        for record in "$1"/*; do
            rank=${record##*/}
            case "$rank" in ""|*[!0-9]*) continue ;; esac
            [ -f "$record" ] || continue
            ended=$(date -r "$record" +%s.%N 2>/dev/null)
            fields=$(head -c 200 "$record" | tr -c "a-zA-Z0-9=" " ")
            echo "rank-record rank=$rank ended=$ended $fields"
        done' sh "$workdir/home/.mpi/ranks" 2>/dev/null
}
print_rank_records

left=$container_left
mounts=$(grep -c " $workdir" /proc/self/mountinfo 2>/dev/null || true)
left=$((left + ${mounts:-0}))
if [ "$left" -eq 0 ]; then
    rm -rf "$workdir"
    # The job's folder (named after the job) goes too once its last worker's is gone: nothing of the job,
    # not even its name, stays on the node.
    rmdir "${workdir%/*}" 2>/dev/null || true
fi
echo "left=$left"
