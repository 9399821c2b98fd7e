#!/bin/sh
# What a node has, for the console's health check: one "@@ section" header per fact, then the fact;
# "!absent" when a tool is not installed. $1 is the root of the job work directories, where an ended
# job's container must not linger. Read by jobs.node_facts.parse_facts.
echo "@@ cpu"; getconf _NPROCESSORS_ONLN 2>/dev/null || nproc
echo "@@ memory"; grep '^MemTotal:' /proc/meminfo
echo "@@ interfaces"; ls /sys/class/net
echo "@@ rdma"
for port in /sys/class/infiniband/*/ports/*; do
    [ -d "$port" ] || continue
    device=${port#/sys/class/infiniband/}; device=${device%%/*}
    echo "$device ${port##*/} $(cat "$port/link_layer" 2>/dev/null) $(cat "$port/state" 2>/dev/null)"
done
echo "@@ gpus"
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 20 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>&1 || echo "!error $?"
else
    echo "!absent"
fi
echo "@@ openmpi"
if command -v mpirun >/dev/null 2>&1; then mpirun --version 2>&1 | head -n 1; else echo "!absent"; fi
echo "@@ python"
if command -v python3 >/dev/null 2>&1; then python3 --version 2>&1; else echo "!absent"; fi
echo "@@ containers"
for marker in "$1"/*/worker-*/container.pidns; do
    [ -f "$marker" ] || continue
    pidns=$(cat "$marker"); count=0
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/ns/pid" 2>/dev/null)" = "$pidns" ] && count=$((count + 1))
    done
    echo "${marker%/container.pidns} $count"
done
