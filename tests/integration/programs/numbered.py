"""A test program: each rank prints a numbered sequence, "SEQ <rank> <n>" on stdout and every tenth
number also as "ERRSEQ <rank> <n>" on stderr, at a steady pace, so a test can check that none is lost,
doubled or reordered while it does things to the console in the middle."""

import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
count = int(options.get("count", "1000"))
per_second = float(options.get("per_second", "0"))  # per rank; 0 prints as fast as it can
burst = 50

comm.Barrier()
started = time.monotonic()
for number in range(count):
    print(f"SEQ {rank} {number}")
    if number % 10 == 0:
        print(f"ERRSEQ {rank} {number}", file=sys.stderr)
    if per_second and number % burst == burst - 1:
        sys.stdout.flush()
        ahead = started + (number + 1) / per_second - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
sys.stdout.flush()
sys.stderr.flush()
comm.Barrier()
