#!/bin/sh
# One look at a worker's container, as its node's root: whether it runs, and what it uses.
# Prints "state=running|stopped|gone|error", then, for a running one, "cpu_ns=N mem=N limit=N" from its
# cgroup (v1 or v2), "disk=N disk_limit=N disk_free=N" (bytes: what the job's home and the container's
# writable layer hold, the container's disk limit label, what the node's disk has left; disk is left
# empty when counting took too long) and, where the container has GPUs, "gpu_util=N gpu_mem_mib=N".
# Which GPUs: those its label training-console.gpus names (comma-separated indices, or "none"), which on a
# Slurm node are the step's; GPU_INDICES, the plan's, for a container started without the label.
# Usage: worker-usage.sh CONTAINER_NAME [GPU_INDICES]
set -u
name=$1 gpus=${2:-}

# One line each: running and pid, the disk limit label, the writable layer, the job's home on the node, the
# GPUs label.
format='{{.State.Running}} {{.State.Pid}}
{{index .Config.Labels "training-console.disk-limit"}}
{{.GraphDriver.Data.UpperDir}}
{{range .Mounts}}{{if eq .Destination "/home/ma-user"}}{{.Source}}{{end}}{{end}}
{{index .Config.Labels "training-console.gpus"}}'
# Its warnings apart (a rootless Podman may print one), or they would be read as the lines above.
if ! answer=$(podman container inspect --format "$format" "$name" 2>/dev/null); then
    answer=$(podman container inspect --format '{{.Id}}' "$name" 2>&1 >/dev/null)
    case "$answer" in
        *"no such"*) echo "state=gone" ;;
        *) echo "state=error $(echo "$answer" | tr -d '\n' | cut -c1-200)" ;;
    esac
    exit 0
fi
first=$(echo "$answer" | sed -n 1p)
disk_limit=$(echo "$answer" | sed -n 2p | tr -cd '0-9')
upper=$(echo "$answer" | sed -n 3p)
home=$(echo "$answer" | sed -n 4p)
given=$(echo "$answer" | sed -n 5p)
case $given in
    none) gpus= ;;
    *[0-9]*) gpus=$(echo "$given" | tr -cd '0-9,') ;;
esac
running=${first% *} pid=${first#* }
if [ "$running" != true ]; then
    echo "state=stopped"
    exit 0
fi
echo "state=running"

read_number() { [ -r "$1" ] && head -c 32 "$1" | tr -cd '0-9'; }
v2=$(sed -n 's/^0:://p' "/proc/$pid/cgroup" 2>/dev/null)
if [ -n "$v2" ] && [ -e "/sys/fs/cgroup$v2/cpu.stat" ]; then
    dir=/sys/fs/cgroup$v2
    usec=$(sed -n 's/^usage_usec //p' "$dir/cpu.stat")
    cpu=$(( ${usec:-0} * 1000 ))
    mem=$(read_number "$dir/memory.current")
    limit=$(read_number "$dir/memory.max")
else
    memory=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' "/proc/$pid/cgroup")
    cpuacct=$(sed -n 's/^[0-9]*:[a-z,]*cpuacct[a-z,]*:\(.*\)$/\1/p' "/proc/$pid/cgroup")
    cpu=$(read_number "/sys/fs/cgroup/cpuacct$cpuacct/cpuacct.usage")
    mem=$(read_number "/sys/fs/cgroup/memory$memory/memory.usage_in_bytes")
    limit=$(read_number "/sys/fs/cgroup/memory$memory/memory.limit_in_bytes")
fi
echo "cpu_ns=${cpu:-} mem=${mem:-} limit=${limit:-}"

# The disk: counted only for a container that carries a limit. du's total counts a file linked into both
# places once; a count cut short by the timeout (millions of files) says nothing, rather than stall the
# probe the console waits on. Root counts as root: no link the job plants is followed (-P is du's default).
if [ -n "$disk_limit" ] && [ -d "$home" ]; then
    set -- "$home"
    [ -d "${home%/*}/cache" ] && set -- "$@" "${home%/*}/cache"
    [ -n "$upper" ] && [ -d "$upper" ] && set -- "$@" "$upper"
    # Only the total line, which a du cut short never prints (the paths given are absolute, never "total").
    disk=$(timeout 2 du -scxB1 "$@" 2>/dev/null | awk -F '\t' '$2 == "total" { print $1 }' | tr -cd '0-9')
    free=$(df -PB1 "$home" 2>/dev/null | awk 'NR == 2 { print $4 }' | tr -cd '0-9')
    echo "disk=${disk:-} disk_limit=$disk_limit disk_free=${free:-}"
fi

if [ -n "$gpus" ] && command -v nvidia-smi >/dev/null 2>&1; then
    timeout 10 nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -i "$gpus" 2>/dev/null |
        awk -F', *' '{ util += $1; mem += $2; n++ } END { if (n) printf "gpu_util=%d gpu_mem_mib=%d\n", util / n, mem }'
fi

# The ranks of this worker that have ended on their own ("rank-ended rank=N exit=C at=T" or "signal=S"): the
# rank agents' records (rank-agent.sh), read as the job's user, as the teardown reads them. They are the job's
# own claim; the console warns of one that did not end as 0 and, if the job does not end, ends it failed, and
# no longer counts any of them as silent (a rank that printed its last line and exited is not hung).
if [ -d "$home/.mpi/ranks" ] && command -v setpriv >/dev/null 2>&1; then
    owner=$(stat -c '%u:%g' "$home" 2>/dev/null) || owner=0:0
    if [ "${owner%:*}" != 0 ]; then
        # The inner script expands its variables as the job's user, not here.
        # shellcheck disable=SC2016
        timeout 2 setpriv --reuid="${owner%:*}" --regid="${owner#*:}" --clear-groups -- sh -c '
            for record in "$1"/*; do
                rank=${record##*/}
                case "$rank" in ""|*[!0-9]*) continue ;; esac
                [ -f "$record" ] || continue
                grep -q "^stop=" "$record" && continue
                ended=$(grep -m 1 -E "^(exit=(0|[1-9][0-9]{0,2})|signal=[0-9]{1,2})$" "$record")
                [ -n "$ended" ] && echo "rank-ended rank=$rank $ended at=$(date -r "$record" +%s)"
            done' sh "$home/.mpi/ranks" 2>/dev/null
    fi
fi
# The node's clock as the answer leaves: the records' times above are in it, and the console reads them in its own.
echo "node_time=$(date +%s)"
