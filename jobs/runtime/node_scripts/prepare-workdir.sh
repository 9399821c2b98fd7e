#!/bin/sh
# Lays out one worker's files on its node, as root, from the bundle the console uploaded into WORKDIR:
# the job's home (keys, environment, hostfile, tune file, the rank agent, the sshd's configuration and
# host key) with the code under user-job-dir, owned by the job's uid. The container mounts only home.
# Usage: prepare-workdir.sh WORKDIR UID
set -eu
workdir=$1 uid=$2

cd "$workdir"
mkdir -p home/user-job-dir
tar --no-same-owner --no-same-permissions -xf bundle.tar
tar --no-same-owner --no-same-permissions -xf code.tar -C home/user-job-dir
# Where each rank's fork agent records how the rank ended (see rank-agent.sh).
mkdir -p home/.mpi/ranks
rm -f bundle.tar code.tar
chown -R "$uid:$uid" home
# Nothing of the job's runs with more than the job's rights (the mount is nosuid too).
chmod -R ug-s,o-w home
chmod 755 home
chmod 700 home/.ssh home/.sshd
chmod 600 home/.ssh/* home/.sshd/ssh_host_ed25519_key
chmod 755 home/.mpi/rank-agent.sh
echo prepared
