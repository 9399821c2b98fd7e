#!/bin/sh
# Lays out one worker's files on its node, as root, from the bundle the console uploaded into WORKDIR:
# the job's home (keys, environment, hostfile, tune file, the rank agent, the sshd's configuration and
# host key) with the code under user-job-dir, owned by the job's uid. The container mounts only home.
# Usage: prepare-workdir.sh WORKDIR UID [layout|own]
#   layout: only lay the files out, all root's (what the node fetches for the job goes in next, root's too);
#   own: then give home to the job's uid. Neither: both at once.
set -eu
workdir=$1 uid=$2 step=${3:-all}

cd "$workdir"
if [ "$step" != own ]; then
# What an earlier attempt of the job left here (a teardown that could not reach the node) must not pass
# for this one's: its run folder (root's, beside home: see run-mpirun.sh) would make mpirun's start a
# no-op. rm does not follow the links in them.
rm -rf home run cache
mkdir -p home/user-job-dir
# The job's local disk, /cache in the container as on the reference (its node's SSD): counted against the
# spec's disk limit with home (worker-usage.sh), gone with the worker's folder at the teardown.
mkdir -p cache
tar --no-same-owner --no-same-permissions -xf bundle.tar
tar --no-same-owner --no-same-permissions -xf code.tar -C home/user-job-dir
# Where each rank's fork agent records how the rank ended (see rank-agent.sh).
mkdir -p home/.mpi/ranks
# The platform's local data folders: train_url's is the job's to write (jobs.launch.data_paths); the
# input, when fetched, is mounted read-only over modelarts/inputs.
mkdir -p home/modelarts/inputs home/modelarts/outputs/train_url_0
rm -f bundle.tar code.tar
fi
[ "$step" = layout ] && { echo laid out; exit 0; }
# Modes first, while everything is still root's: once the job's uid owns the tree, a process of that
# uid on the node could swap a path for a link, and root must not follow it.
chmod -R ug-s,o-w home
chmod 700 home
chmod 700 home/.ssh home/.sshd
chmod 600 home/.ssh/* home/.sshd/ssh_host_ed25519_key
chmod 755 home/.mpi/rank-agent.sh
chown -R "$uid:$uid" home
chmod 700 cache
chown "$uid:$uid" cache
# The job's keys and code are for its container alone: other accounts of the node may not list the work
# directory, and home is the job uid's only (the teardown reads the rank records as that uid, through it).
chmod 711 "$workdir"
echo prepared
