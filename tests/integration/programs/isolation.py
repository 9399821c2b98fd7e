"""A test program: each rank reports what it can reach from inside its container, as one JSON line."""

import json
import os
import shutil
import socket
import subprocess
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)


def can_read(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.read(16)
        return True
    except OSError:
        return False


processes = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                processes.append(handle.read().replace(b"\0", b" ").decode(errors="replace").strip())
        except OSError:
            pass
setuid_program = os.path.join(os.getcwd(), "id-setuid")
setuid_uid = (subprocess.run([setuid_program, "-u"], capture_output=True, text=True).stdout.strip()
              if os.path.exists(setuid_program) else "")
memory_mb = int(options.get("allocate_mb", "0"))
print("ISOLATION " + json.dumps({
    "rank": rank,
    "host": socket.gethostname(),
    "python": shutil.which("python"),
    "executable": sys.executable,
    "uid": os.getuid(),
    "setuid_uid": setuid_uid,
    "reads": {path: can_read(path) for path in options.get("try_read", "").split(",") if path},
    "processes": processes,
    "allreduce": comm.allreduce(rank + 1),
}), flush=True)
comm.Barrier()
if memory_mb and rank == int(options.get("allocate_rank", "0")):
    hog = bytearray(memory_mb * 1024 * 1024)
    for index in range(0, len(hog), 4096):
        hog[index] = 1
    print(f"allocated {memory_mb} MiB", flush=True)
comm.Barrier()
