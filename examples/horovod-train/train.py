"""A data-parallel training loop for the console's Horovod engine (PyTorch on the CPU).

Every rank fits the same linear model on its own shard of a synthetic data set; hvd.DistributedOptimizer
averages the gradients across ranks at each step (MPI allreduce), and hvd.broadcast_parameters starts
every rank from rank 0's parameters. Each rank prints its host and its loss at each step, and at the
end a checksum of its own final parameters: the ranks must agree.

It meets the console's checkpoint contract: with MA_CHECKPOINT_DIR (an s3:// or obs:// train_url), rank 0
saves the model and the optimizer every --checkpoint_every steps and says so in
$MA_CHECKPOINT_DIR/checkpoint.json; given MA_RESUME_FROM (an automatic restart, a requeue, a Rebuild that
resumes) or a manifest brought back with train_url ("bring train_url back"), it goes on after that step. On
the notice before a stop (MA_CHECKPOINT_SIGNAL) the ranks save at the next step and end. With --data_url,
rank 0 says what it found there.

Run by the platform as:  mpirun ... python train.py [--steps=N --lr=X --fail_rank=R]
"""

import argparse
import json
import os
import signal
import socket
import sys
import time
import traceback
from datetime import UTC, datetime

import horovod.torch as hvd
import torch


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_url", default="")
    parser.add_argument("--train_url", default="")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--samples_per_rank", type=int, default=256)
    parser.add_argument("--checkpoint_every", type=int, default=1)
    parser.add_argument("--step_seconds", type=float, default=0.0)
    parser.add_argument("--fail_rank", type=int, default=-1, help="this rank raises at the first step (to try failures)")
    known, _ = parser.parse_known_args()
    return known


NOTICED = []


def resume_point(folder):
    """The checkpoint to start from: MA_RESUME_FROM, else the one a manifest brought back with train_url names."""
    if os.environ.get("MA_RESUME_FROM"):
        return os.environ["MA_RESUME_FROM"]
    manifest = os.path.join(folder, "checkpoint.json") if folder else ""
    if manifest and os.path.exists(manifest):
        with open(manifest) as found:
            return os.path.join(folder, json.load(found)["path"])
    return ""


def save(folder, step, model, optimizer):
    """The checkpoint, then the manifest naming it (each written aside, then renamed)."""
    os.makedirs(folder, exist_ok=True)
    name = f"step-{step}.pt"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
               os.path.join(folder, name + ".tmp"))
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
    manifest = os.path.join(folder, "checkpoint.json")
    with open(manifest + ".tmp", "w") as out:
        json.dump({"step": step, "path": name, "time": datetime.now(UTC).isoformat(timespec="milliseconds")}, out)
    os.replace(manifest + ".tmp", manifest)


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    host = socket.gethostname()
    print(f"rank {rank}/{size} on host {host} horovod size={size} local_size={hvd.local_size()} "
          f"cross_size={hvd.cross_size()} mpi={hvd.mpi_enabled()}", flush=True)
    if rank == 0:
        print("parameters: " + json.dumps(sys.argv[1:]), flush=True)

    generator = torch.Generator().manual_seed(1234 + rank)
    true_weights = torch.linspace(-1.0, 1.0, args.features, dtype=torch.float64)
    features = torch.randn(args.samples_per_rank, args.features, generator=generator, dtype=torch.float64)
    targets = features @ true_weights + 0.01 * torch.randn(args.samples_per_rank, generator=generator, dtype=torch.float64)

    torch.manual_seed(rank)  # different starting points on purpose: the broadcast makes them rank 0's
    model = torch.nn.Linear(args.features, 1, dtype=torch.float64)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    folder = os.environ.get("MA_CHECKPOINT_DIR", "")
    name = os.environ.get("MA_CHECKPOINT_SIGNAL", "")
    if name and hasattr(signal, name):
        signal.signal(getattr(signal, name), lambda *_: NOTICED.append(True))
    checkpoint = resume_point(folder)
    first = 1
    if rank == 0 and args.data_url and os.path.isdir(args.data_url):
        found = [os.path.join(top, name) for top, _, names in os.walk(args.data_url) for name in names]
        print(f"data_url: {len(found)} files, {sum(os.path.getsize(path) for path in found)} bytes", flush=True)
    if rank == 0 and checkpoint and os.path.exists(checkpoint):
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first = saved["step"] + 1
        print(f"resumed from {checkpoint} after step {saved['step']}", flush=True)
    last = args.steps  # in all: a resumed run goes on to the same last step
    first = int(hvd.broadcast_object(first, root_rank=0))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for step in range(first, last + 1):
        if rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(features).squeeze(1), targets)
        loss.backward()
        optimizer.step()
        average = hvd.allreduce(loss.detach(), name="loss", op=hvd.Average).item()
        print(f"rank {rank} host {host} step={step} loss={loss.item():.6f} average_loss={average:.6f}", flush=True)
        # Every rank learns of the notice at the same step (any rank's counts).
        noticed = hvd.allreduce(torch.tensor([1.0 if NOTICED else 0.0]), name="notice", op=hvd.Sum).item() > 0
        if rank == 0 and folder and (noticed or step % args.checkpoint_every == 0 or step == last):
            save(folder, step, model, optimizer)
        if noticed:
            print(f"rank {rank} ends at step {step} after the notice", flush=True)
            hvd.shutdown()
            return
        if args.step_seconds:
            time.sleep(args.step_seconds)

    weights = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    print(f"rank {rank} final weights checksum {weights.sum().item():.12f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 - any failure: see below
        # Fail fast: end this rank now, before Horovod's exit handler shuts the others down (they would then
        # raise HorovodInternalError themselves, and could be reported before the rank that really failed);
        # mpirun ends the job when it sees this rank's exit status.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
