#!/bin/sh
# Run by the node's root once a worker's container is up: copies the launch's own programs (mpirun, orted,
# ssh, sed) into a root-owned folder of the container, executable by the job's user but not readable.
# The kernel makes a process that runs a program its user cannot read non-dumpable, so other processes
# of the same uid cannot open its /proc/<pid>/fd or trace it: a rank cannot write into mpirun's output
# beside mpirun (and pass for it or for another rank), nor into the filter that its agent puts between it
# and Open MPI. A program that is not a plain ELF file, or that finds its libraries relative to itself,
# is left as it is (a copy would not run).
# Usage: seal-tools.sh CONTAINER_NAME
set -u
name=$1
# The inner script runs in the container as its root, which has no capabilities there but owns /opt.
# shellcheck disable=SC2016
podman exec --user 0:0 "$name" sh -c '
    dir=/opt/training-console/bin
    mkdir -p "$dir" && chmod 711 /opt/training-console "$dir" || exit 0
    for tool in mpirun orted ssh sed; do
        source=$(command -v "$tool") || continue
        [ "$(head -c 4 "$source" | tr -d "\177")" = ELF ] || continue
        grep -q -a "\$ORIGIN" "$source" && continue
        cp "$source" "$dir/$tool.new" && chmod 711 "$dir/$tool.new" && mv "$dir/$tool.new" "$dir/$tool" && echo "sealed $tool"
    done
    exit 0'
