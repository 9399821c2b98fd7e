#!/bin/sh
# Open MPI's fork agent for every rank of a job (OMPI_MCA_orte_fork_agent): orted runs this script with
# the rank's command line as its arguments. It runs the rank, records how the rank ended in
# ~/.mpi/ranks/<rank>, which the teardown reads back, and then ends the way the rank did, so mpirun
# still reports the rank's own exit code or signal.
#
# Signals need no forwarding: mpirun (and the console's stop) signal the rank's whole process group,
# which holds this script and the rank, SIGTERM first and SIGKILL moments later. So the record is
# written with shell builtins only, and the stop signal first.
record="${HOME:-/home/ma-user}/.mpi/ranks/${OMPI_COMM_WORLD_RANK:-unknown}"

# A background job of a script starts with SIGINT and SIGQUIT ignored; where env can, the rank gets
# them back as a rank started by orted directly has them.
restore_signals=
env --default-signal=INT,QUIT true 2>/dev/null && restore_signals="env --default-signal=INT,QUIT --"

# The rank gets the agent's stdin and stderr (a background job would otherwise read /dev/null); the
# shell's own notices ("Killed") go nowhere, so the log holds only what the rank printed.
exec 3<&0 4>&2 2>/dev/null

# mpirun tags each piece of a rank's output with the rank ("[1,3]<stdout>:"), and a tag may fall
# mid-line when another rank's piece lands between two writes of a line: a rank that printed a tag-shaped
# text would pass for another rank. So where the container holds the sealed sed (see seal-tools.sh), the
# rank's output goes through it, which writes a space into anything shaped like a tag ("[1,3] <stdout>:"),
# line by line; the agent then lets go of Open MPI's pipes, so only the sealed filter, which no process
# of the job can open or trace, holds them. The filters ignore the stop signals: they end when the rank
# and its children have closed their output, so a rank's last words on a stop still reach the log.
filter=/opt/training-console/bin/sed
untag='s/\(\[[0-9]*,[0-9]*\]\)</\1 </g'
# Each line goes out as soon as it is whole, but is read in blocks: `sed -u` reads a byte a system call,
# which held a flooding rank to a fifth of its pace; stdbuf makes sed's output line-buffered instead.
untag_lines() {
    export LC_ALL=C
    command -v stdbuf >/dev/null 2>&1 && exec stdbuf -oL "$filter" -e "$untag"
    exec "$filter" -u -e "$untag"
}
fifos=
if [ -x "$filter" ] && fifos=$(mktemp -d 2>/dev/null) && mkfifo -m 600 "$fifos/out" "$fifos/err"; then
    (trap '' HUP INT QUIT TERM USR1 USR2; untag_lines <"$fifos/out" 3<&- 4>&-) &
    (trap '' HUP INT QUIT TERM USR1 USR2; untag_lines <"$fifos/err" >&4 3<&- 4>&-) &
    $restore_signals "$@" <&3 >"$fifos/out" 2>"$fifos/err" 3<&- 4>&- &
    rank_pid=$!
    exec >/dev/null 4>&-
else
    [ -n "$fifos" ] && rm -rf "$fifos"
    fifos=
    $restore_signals "$@" <&3 2>&4 3<&- 4>&- &
    rank_pid=$!
fi
echo "pid=$rank_pid" >"$record"

stopped=
for name in HUP INT QUIT TERM USR1 USR2; do
    # The signal's name is fixed when the trap is set, on purpose; $record is read when it fires.
    # shellcheck disable=SC2064
    trap "echo stop=$name >>\"\$record\"; stopped=1" "$name"
done

while :; do
    wait "$rank_pid"
    status=$?
    # wait also returns when a trapped signal arrives while the rank still runs.
    kill -0 "$rank_pid" 2>/dev/null || break
done
# If that last wait was cut short by a signal, the shell may still hold the rank's real status.
wait "$rank_pid"
again=$?
[ "$again" -ne 127 ] && status=$again

signal=
if [ "$status" -gt 128 ]; then
    # The shell's 128+N: the rank died of signal N. (A rank that exits with such a code itself reads the same.)
    signal=$((status - 128))
    echo "signal=$signal" >>"$record"
else
    echo "exit=$status" >>"$record"
fi
[ -n "$fifos" ] && rm -rf "$fifos"
# orted SIGKILLs all its ranks' groups as soon as one of them ends after its SIGTERM; a moment's
# wait gives the agents beside this one the time to record that SIGTERM too.
[ -n "$stopped" ] && sleep 0.2

if [ -n "$signal" ]; then
    trap - HUP INT QUIT TERM USR1 USR2
    # dash and bash both know -c: no core file from re-raising the rank's own signal.
    # shellcheck disable=SC3045
    ulimit -c 0
    kill -s "$signal" $$ 2>/dev/null
    # A signal whose default is to be ignored does not end the agent; the code still tells.
fi
exit "$status"
