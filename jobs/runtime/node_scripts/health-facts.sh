#!/bin/sh
# What a node has, for the console's health check: one "@@ section" header per fact, then the fact;
# "!absent" when a tool is not installed. Read by jobs.node_facts.parse_facts. Always exits 0: a missing
# tool is a fact, not a failed check.
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
echo "@@ podman"
if command -v podman >/dev/null 2>&1; then podman --version 2>&1 | head -n 1; else echo "!absent"; fi
echo "@@ images"
command -v podman >/dev/null 2>&1 && timeout 20 podman images --noheading --format '{{.Repository}}:{{.Tag}}' 2>/dev/null
echo "@@ cdi"
if [ -f /etc/cdi/nvidia.yaml ] || [ -f /var/run/cdi/nvidia.yaml ] || [ -f /etc/cdi/nvidia.json ]; then echo yes; else echo no; fi
echo "@@ disk"
# The size and free space (bytes) of the file system that holds the work root ($1), or of the nearest folder
# above it that exists (a node that has run no job yet has none).
where=${1:-/}
while [ ! -e "$where" ] && [ "$where" != / ]; do where=$(dirname "$where"); done
df -PB1 "$where" 2>/dev/null | awk 'NR == 2 { print $2, $4 }'
echo "@@ containers"
# Job containers by their unique names, with their state and where their files are (a label set when the
# container was made); an ended job's that is still here is a teardown that failed.
command -v podman >/dev/null 2>&1 && timeout 20 podman ps --all --noheading \
    --filter label=training-console.job \
    --format '{{.Names}}|{{index .Labels "training-console.workdir"}}|{{.State}}' 2>/dev/null
exit 0
