# shellcheck shell=sh
# Defines remove_step_cgroups CONTAINER_ID JOB_ID, which the step's start script (jobs.runtime.slurm_step) and the
# teardown of a container a Slurm step started (stop-worker.sh) both run; JOB_ID may be '*', any Slurm job.
# The container's cgroups, made by the Slurm user's runc below the step's, outlive it on cgroup v1: left, they keep
# Slurm from removing the step's and the job's. They go by the container's id, only below a Slurm job's step, then
# the task's folder above one, once empty (a step that is over: Slurm's own removal came too early). The step's and
# the job's are in root's folders: only Slurm can remove them.
remove_step_cgroups() {
    case $1 in *[!0-9a-f]*|"") return 0 ;; esac
    found=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 9 -depth -type d -name "$1" -path "*/job_$2/step_*" 2>/dev/null)
    # A cgroup whose last process is still exiting cannot be removed yet: a few tries.
    tries=0 left_cgroups=$found
    while [ -n "$left_cgroups" ] && [ "$tries" -lt 20 ]; do
        for folder in $left_cgroups; do rmdir "$folder" 2>/dev/null; done
        left_cgroups=$(for folder in $found; do [ -d "$folder" ] && echo "$folder"; done)
        tries=$((tries + 1)); [ -n "$left_cgroups" ] && sleep 0.2
    done
    for folder in $found; do
        case ${folder%/*} in */task_*) rmdir "${folder%/*}" 2>/dev/null ;; esac
    done
    return 0
}
