#!/bin/sh
# A job's mpirun, started by the node's root outside worker-0's container and detached from the console:
# a wrapper in a session of its own runs `podman exec` of mpirun in the container as the job's user, its
# output goes to two files of the run folder (mpirun's rank tags kept) and podman exec's exit status,
# which is mpirun's, to a third. The run folder is root's, beside the job's home and never inside it: the
# job can neither write these files nor see or signal the wrapper, so how the run ended is mpirun's word.
# The console can go away (a crash, a deploy, a reboot of its host) and follow it again.
#
#   run-mpirun.sh start RUN_DIR PODMAN_EXEC_ARGV...   start it, once: a second start does nothing;
#       stdin holds mpirun's variables, kept as RUN_DIR/env for podman exec's --env-file
#   run-mpirun.sh follow RUN_DIR STDOUT_OFFSET STDERR_OFFSET
#       print each file from its byte offset (stdout on stdout, stderr on stderr) until the wrapper has
#       ended and everything is printed; exit 0 once the status is recorded, 76 when it ended without one
#   run-mpirun.sh status RUN_DIR      print the recorded exit status
set -u
mode=$1 run=$2
shift 2

case "$mode" in
start)
    umask 077
    # Whatever stood at the path is not trusted: the folder must be root's own, mode 0700.
    mkdir -p "$run" || exit 70
    [ -d "$run" ] && [ ! -L "$run" ] && [ "$(stat -c %u "$run")" = 0 ] || exit 70
    chmod 700 "$run" || exit 70
    # mkdir is atomic: a console that retries a start whose answer it lost never starts a second mpirun.
    mkdir "$run/started" 2>/dev/null || exit 0
    cat >"$run/env" || exit 70
    : >"$run/stdout"
    : >"$run/stderr"
    # The inner shell expands its own variables; its status file appears whole (written, then renamed).
    # shellcheck disable=SC2016
    setsid sh -c 'run=$1; shift; echo "$$" >"$run/pid.new" && mv "$run/pid.new" "$run/pid"
        "$@" </dev/null >>"$run/stdout" 2>>"$run/stderr"
        echo "$?" >"$run/exit.new" && mv "$run/exit.new" "$run/exit"' sh "$run" "$@" </dev/null >/dev/null 2>&1 &
    tries=0
    while [ ! -s "$run/pid" ] && [ "$tries" -lt 100 ]; do
        sleep 0.05
        tries=$((tries + 1))
    done
    [ -s "$run/pid" ] || exit 72
    ;;
follow)
    tries=0
    while [ ! -s "$run/pid" ] && [ "$tries" -lt 100 ]; do
        sleep 0.05
        tries=$((tries + 1))
    done
    pid=$(cat "$run/pid" 2>/dev/null) || exit 76
    # tail's own notices must not pass for mpirun's output. It looks whether the wrapper is still there
    # every -s seconds: that is how late the end of a job can be seen (a look costs next to nothing).
    tail -c +"$(($1 + 1))" --pid="$pid" -s 0.05 -f "$run/stdout" 2>/dev/null &
    tail -c +"$(($2 + 1))" --pid="$pid" -s 0.05 -f "$run/stderr" >&2 2>/dev/null &
    wait
    [ -s "$run/exit" ] || exit 76
    ;;
status)
    [ -f "$run/exit" ] && head -c 8 "$run/exit"
    ;;
*)
    exit 64
    ;;
esac
