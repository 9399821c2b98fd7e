"""A test program: one rank prints its last line and exits as 0 at once (it uses no MPI, so nothing holds it back);
the others print a heartbeat for a while, then finish as 0 too."""

import os
import sys
import time

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)

print(f"rank {rank} started", flush=True)
if rank == int(options.get("rank", "1")):
    print(f"rank {rank} done", flush=True)
    sys.exit(0)
for beat in range(int(options.get("beats", "40"))):
    print(f"rank {rank} heartbeat {beat}", flush=True)
    time.sleep(0.5)
