#!/bin/sh
# Ends every process of one worker's container and removes its files. Prints how each rank of the
# worker ended ("rank-record ..." lines, from the fork agent's records) and, last, what is left (ideally 0).
# Usage: stop-container.sh WORKDIR
set -u
workdir=$1
pidns=$(cat "$workdir/container.pidns" 2>/dev/null || true)

processes_in_container() {
    [ -n "$pidns" ] || return 0
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/ns/pid" 2>/dev/null)" = "$pidns" ] || continue
        # A zombie has ended already; it only waits for a parent outside the container to reap it.
        grep -q '^State:[[:space:]]*Z' "$proc/status" 2>/dev/null || echo "${proc#/proc/}"
    done
}

# The container's first process has 1 as its last NSpid.
processes_but_the_first() {
    processes_in_container | while read -r pid; do
        [ "$(sed -n 's/^NSpid:.*[[:space:]]\([0-9]*\)$/\1/p' "/proc/$pid/status" 2>/dev/null)" = 1 ] || echo "$pid"
    done
}

# The ranks first, with a moment to exit on SIGTERM (and their agents to record it): once the
# container's first process ends, the kernel SIGKILLs every other process of it at once.
processes_but_the_first | xargs -r kill -TERM 2>/dev/null
tries=0
while [ -n "$(processes_but_the_first)" ] && [ "$tries" -lt 20 ]; do
    tries=$((tries + 1))
    sleep 0.1
done
# Then everything; unshare itself (outside the container) ignores SIGTERM, so it is not asked.
processes_in_container | xargs -r kill -TERM 2>/dev/null
tries=0
while [ -n "$(processes_in_container)" ] && [ "$tries" -lt 50 ]; do
    # A process that ignored the first signal gets the one it cannot ignore.
    [ "$tries" -ge 10 ] && processes_in_container | xargs -r kill -KILL 2>/dev/null
    tries=$((tries + 1))
    sleep 0.1
done
# The records are written by the job's user, so they are read as that user (a planted link then reads
# nothing it could not read itself), and only rank-numbered files, cut to a few known characters.
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

left=$(processes_in_container | wc -l)
if [ "$left" -eq 0 ]; then
    rm -rf "$workdir"
fi
echo "left=$left"
