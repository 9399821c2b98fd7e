#!/bin/sh
# Run inside a worker's container as the job's user (podman exec): each live Python rank's stacks, as
# py-spy dumps them, after a header "@@ rank=R pid=P". A rank is a process mpirun started (it has
# OMPI_COMM_WORLD_RANK in its environment) whose program is Python. A failed dump says why, never stops the rest.
# $1: the seconds each dump may take.
limit="${1:-15}"
found=0
for dir in /proc/[0-9]*; do
  pid="${dir#/proc/}"
  [ "$pid" = "$$" ] && continue
  rank=$(tr '\0' '\n' < "$dir/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p' | head -n 1)
  [ -n "$rank" ] || continue
  case "$(readlink "$dir/exe" 2>/dev/null)" in
    *python*) ;;
    *) continue ;;
  esac
  found=1
  echo "@@ rank=$rank pid=$pid"
  if ! command -v py-spy >/dev/null 2>&1; then
    echo "py-spy failed: it is not installed in this image"
    continue
  fi
  timeout "$limit" py-spy dump --pid "$pid" 2>&1
  status=$?
  [ "$status" -eq 0 ] || echo "py-spy failed: exit status $status"
done
[ "$found" -eq 1 ] || echo "@@ none"
