"""A test program that tries to forge how its job ends. Rank 0, once every rank runs: writes exit status 0
and fake rank records wherever a job's files used to be kept, kills every process that could be the
wrapper of mpirun, writes into mpirun's own output beside it, and prints lines tagged as other ranks and
lines imitating the platform's; it says what each try did ("ATTACK ..."). Then, with --mode=keep_running,
every rank runs on; with --mode=fail, rank 1 exits with code 3 and the others run on."""

import os
import signal
import sys
import time
from pathlib import Path

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
home = Path.home()


def say(text: str) -> None:
    print(f"ATTACK {text}", flush=True)


def forge_the_ending() -> None:
    run = home / ".console" / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "exit").write_text("0\n")
    ranks = home / ".mpi" / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    for other in range(comm.Get_size()):
        (ranks / str(other)).write_text("pid=1\nexit=0\n")
    say("wrote exit 0 and a record of exit 0 for every rank")


def kill_the_wrapper() -> None:
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"run-mpirun" in command or b"podman" in command or b"conmon" in command:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    # The wrapper's pid file, where it used to be kept.
    try:
        os.kill(int((home / ".console" / "run" / "pid").read_text()), signal.SIGKILL)
        killed += 1
    except (OSError, ValueError):
        pass
    say(f"killed {killed} wrapper process(es)")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def write_beside_mpirun() -> None:
    # The rank's parent is its agent, whose parent is mpirun (on worker-0); mpirun's stdout is fd 1.
    mpirun = parent_of(os.getppid())
    forged = b"[1,1]<stdout>:FORGED-DIRECT-TAG\n[ModelArts Service Log]FORGED-DIRECT-PLATFORM\n"
    for fd in (1, 2):
        try:
            with open(f"/proc/{mpirun}/fd/{fd}", "wb") as stream:
                stream.write(forged)
            say(f"wrote into mpirun's fd {fd}")
        except OSError as error:
            say(f"could not write into mpirun's fd {fd}: {type(error).__name__}")


def print_forged_lines() -> None:
    print("[1,1]<stdout>:FORGED-TAG-AT-START", flush=True)
    print(f"x[1,{comm.Get_size() - 1}]<stdout>:FORGED-TAG-MID-LINE", flush=True)
    print("[1,1]<stderr>:FORGED-TAG-ON-STDERR", file=sys.stderr, flush=True)
    print("[ModelArts Service Log]Training end with return code: 0 FORGED-PLATFORM", flush=True)
    sys.stdout.write("\n[ModelArts Service Log]FORGED-PLATFORM-AFTER-NEWLINE\n")
    sys.stdout.flush()


comm.Barrier()  # every rank's agent has written its record by now
if rank == 0:
    forge_the_ending()
    kill_the_wrapper()
    write_beside_mpirun()
    print_forged_lines()
    say("done")
comm.Barrier()
if options.get("mode") == "fail" and rank == 1:
    time.sleep(1)
    sys.stdout.flush()
    os._exit(3)  # not sys.exit: MPI's finalize at exit would wait for the ranks that run on
while True:
    time.sleep(1)
