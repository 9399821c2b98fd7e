#!/bin/sh
# Run inside a worker's container as the job's user (podman exec --user): each live Python rank's stacks, as
# py-spy dumps them, after a header "@@ rank=R pid=P". A rank is a process mpirun started (a NUL-separated
# record OMPI_COMM_WORLD_RANK=<digits> in its environment) whose program is Python. A failed dump says why and
# never stops the rest. The dumps share the budget, each is cut at DUMP_MAX_BYTES, and at most MAX_RANKS go.
# $1: the seconds all the dumps may take together.
budget="${1:-20}"
MAX_RANKS=64
DUMP_MAX_BYTES=65536
ranks=""
count=0
for dir in /proc/[0-9]*; do
  pid="${dir#/proc/}"
  [ "$pid" = "$$" ] && continue
  case "$(readlink "$dir/exe" 2>/dev/null)" in
    *python*) ;;
    *) continue ;;
  esac
  rank=$(grep -z -m 1 '^OMPI_COMM_WORLD_RANK=[0-9][0-9]*$' "$dir/environ" 2>/dev/null | tr -d '\0')
  rank="${rank#OMPI_COMM_WORLD_RANK=}"
  [ -n "$rank" ] || continue
  ranks="$ranks $rank:$pid"
  count=$((count + 1))
  [ "$count" -ge "$MAX_RANKS" ] && break
done
[ "$count" -gt 0 ] || { echo "@@ none"; exit 0; }
# Each dump gets its share, and none outlasts the whole budget: the output comes back before the caller's
# timeout, however many ranks there are (a rank left without time says so).
deadline=$(( $(date +%s) + budget ))
each=$((budget / count))
[ "$each" -ge 2 ] || each=2
for entry in $ranks; do
  rank="${entry%%:*}"
  pid="${entry#*:}"
  echo "@@ rank=$rank pid=$pid"
  if ! command -v py-spy >/dev/null 2>&1; then
    echo "py-spy failed: it is not installed in this image"
    continue
  fi
  left=$((deadline - $(date +%s)))
  if [ "$left" -lt 1 ]; then
    echo "py-spy failed: no time left of the ${budget} s the stacks may take"
    continue
  fi
  [ "$each" -le "$left" ] || each=$left
  # The dump's lines go out behind "| ", so nothing a rank prints (a thread's name) can pass for a header
  # or for this script's own words.
  out=$(mktemp)
  timeout -k 2 "$each" py-spy dump --pid "$pid" > "$out" 2>&1
  status=$?
  head -c "$DUMP_MAX_BYTES" "$out" | sed 's/^/| /'
  echo
  rm -f "$out"
  [ "$status" -eq 0 ] || echo "py-spy failed: exit status $status"
done
