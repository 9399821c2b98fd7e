#!/bin/sh
# Ends every process of one worker's container and removes its files; prints what is left (ideally 0).
# Usage: stop-container.sh WORKDIR
set -u
workdir=$1
pidns=$(cat "$workdir/container.pidns" 2>/dev/null || true)

processes_in_container() {
    [ -n "$pidns" ] || return 0
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/ns/pid" 2>/dev/null)" = "$pidns" ] && echo "${proc#/proc/}"
    done
}

# Ranks get a moment to exit on SIGTERM; unshare itself ignores SIGTERM, so it is not asked.
processes_in_container | xargs -r kill -TERM 2>/dev/null
tries=0
while [ -n "$(processes_in_container)" ] && [ "$tries" -lt 50 ]; do
    # A process that ignored the first signal gets the one it cannot ignore.
    [ "$tries" -ge 10 ] && processes_in_container | xargs -r kill -KILL 2>/dev/null
    tries=$((tries + 1))
    sleep 0.1
done
left=$(processes_in_container | wc -l)
if [ "$left" -eq 0 ]; then
    rm -rf "$workdir"
fi
echo "left=$left"
