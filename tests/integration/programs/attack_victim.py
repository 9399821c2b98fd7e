"""The victim of an attack test: rank 0 runs a small TCP service of the job's own (what a job's data loader or
parameter server would be) and prints whatever reaches it, so anything another job sends shows in this
job's log; every rank then waits for the test to say the attack is over, and the job completes."""

import json
import os
import socket
import sys
import threading
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
released = os.path.join(os.path.expanduser("~"), options.get("release_file", "attack-over"))
deadline = time.monotonic() + float(options.get("seconds", "300"))


def serve(listener: socket.socket) -> None:
    while True:
        connection, peer = listener.accept()
        with connection:
            connection.settimeout(2)
            try:
                received = connection.recv(200)
            except OSError:
                received = b""
        print(f"VICTIM RECEIVED from {peer[0]}: {received!r}", flush=True)


if rank == 0:
    service = socket.socket()
    service.bind(("0.0.0.0", 0))
    service.listen()
    threading.Thread(target=serve, args=(service,), daemon=True).start()
    print("VICTIM " + json.dumps({"rank": rank, "service_port": service.getsockname()[1]}), flush=True)
while not os.path.exists(released) and time.monotonic() < deadline:
    time.sleep(0.2)
comm.Barrier()
print(f"VICTIM DONE rank {rank}", flush=True)
