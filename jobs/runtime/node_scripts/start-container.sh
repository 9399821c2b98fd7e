#!/bin/sh
# Starts one worker's container on a node, as root, from the bundle the console uploaded into WORKDIR.
# The container is a set of namespaces (hostname, mounts, PIDs) around an sshd on the job's port:
# mpirun on worker-0 reaches the other workers through those sshds, as on the reference platform.
# Usage: start-container.sh WORKDIR HOSTNAME JOB_USER PREFERRED_UID
set -eu
workdir=$1 hostname=$2 user=$3 uid=$4

if ! id -u "$user" >/dev/null 2>&1; then
    if getent passwd "$uid" >/dev/null 2>&1; then
        useradd --create-home --home-dir "/home/$user" --shell /bin/bash "$user"
    else
        useradd --create-home --home-dir "/home/$user" --shell /bin/bash --uid "$uid" "$user"
    fi
fi
# A new account is locked ("!"), and sshd refuses key logins to locked accounts; "*" means keys only.
usermod --password '*' "$user"
mkdir -p "/home/$user" /run/sshd

cd "$workdir"
mkdir -p home/user-job-dir
tar -xf bundle.tar
tar -xf code.tar -C home/user-job-dir
# Where each rank's fork agent records how the rank ended (see rank-agent.sh).
mkdir -p home/.mpi/ranks
rm -f bundle.tar code.tar
chown -R "$user:" home
chmod 755 home
chmod 700 home/.ssh
chmod 600 home/.ssh/*
chmod 600 etc/ssh_host_ed25519_key

# --kill-child: ending this unshare ends the container's first process, and with it every process
# of the PID namespace, so one kill stops the whole worker.
# The inner script is run by the container's own shell: its variables expand there, not here.
# shellcheck disable=SC2016
setsid unshare --uts --mount --pid --fork --kill-child --propagation private sh -c '
    hostname "$1"
    mount -t tmpfs -o mode=1777,size=50% tmpfs /dev/shm
    mount --bind "$2/home" "/home/$3"
    mount --bind "$2/etc/hosts" /etc/hosts
    exec /usr/sbin/sshd -D -e -f "$2/etc/sshd_config"
' container "$hostname" "$workdir" "$user" </dev/null >"$workdir/container.log" 2>&1 &
launcher=$!
echo "$launcher" >container.pid

# The PID namespace's identity is what "every process of this worker" means when it is torn down.
tries=0
while :; do
    child=$(pgrep -P "$launcher" | head -n 1 || true)
    if [ -n "$child" ]; then
        pidns=$(readlink "/proc/$child/ns/pid" || true)
        [ -n "$pidns" ] && [ "$pidns" != "$(readlink /proc/self/ns/pid)" ] && break
    fi
    tries=$((tries + 1))
    if [ "$tries" -gt 100 ] || ! kill -0 "$launcher" 2>/dev/null; then
        echo "the container did not start:" >&2
        cat "$workdir/container.log" >&2
        exit 1
    fi
    sleep 0.05
done
echo "$pidns" >container.pidns
echo "pid=$launcher pidns=$pidns"
