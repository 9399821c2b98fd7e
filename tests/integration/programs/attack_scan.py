"""An attack program: rank 0 tries to connect to each target it is given (`--targets=name@host:port,...`; the
host SELF is its own node, the port SSHD its own job's sshd port, as mpirun was told it) as a job of
another user would, sends junk to each it reaches, and reports what it reached as one JSON line:
{"name": "reached ..." or why not}."""

import json
import os
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
JUNK = b"ATTACK-JUNK " + bytes(range(1, 32)) + b"\n"


def attempt(host: str, port: int) -> str:
    try:
        connection = socket.create_connection((host, port), timeout=float(options.get("timeout", "3")))
    except OSError as error:
        return f"not reached: {error}"
    with connection:
        connection.settimeout(1)
        try:
            banner = connection.recv(64)
        except OSError:
            banner = b""
        try:
            connection.sendall(JUNK)
        except OSError:
            pass
    return f"reached: {banner[:40]!r}"


def own_sshd_port() -> int:
    words = os.environ.get("OMPI_MCA_plm_rsh_args", "").split()
    return int(words[words.index("-p") + 1])


if rank == 0:
    own_address = socket.gethostbyname(socket.gethostname())
    found = {}
    for target in filter(None, options.get("targets", "").split(",")):
        name, _, where = target.partition("@")
        host, _, port = where.rpartition(":")
        found[name] = attempt(own_address if host == "SELF" else host, own_sshd_port() if port == "SSHD" else int(port))
    print("ATTACK " + json.dumps(found), flush=True)
comm.Barrier()
