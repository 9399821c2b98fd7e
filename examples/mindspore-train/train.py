"""A data-parallel training loop for the console's MindSpore engine (CPU).

The platform starts MindSpore's cluster for the ranks mpirun started, so this calls plain
mindspore.communication.init(). Every rank fits the same linear model (the same seed, so the same
starting parameters) on its own shard of a synthetic data set, in a data-parallel context whose
gradients are averaged across ranks (nn.DistributedGradReducer). Each rank prints its host and loss at
each step, the checksum of the averaged gradient of its last step and of its final parameters: the
ranks must agree on both.

It meets the console's checkpoint contract: with MA_CHECKPOINT_DIR (an s3:// or obs:// train_url), rank 0
saves the parameters every --checkpoint_every steps (a MindSpore .ckpt) and says so in
$MA_CHECKPOINT_DIR/checkpoint.json; given MA_RESUME_FROM every rank loads it and goes on after its step. On
the notice before a stop (MA_CHECKPOINT_SIGNAL) the ranks agree on a step, save and end. With --data_url (an
s3:// or obs:// input is a local folder by then), rank 0 says how many files and bytes it holds.

Run by the platform as:  mpirun ... python train.py [--steps=N --lr=X]
"""

import argparse
import json
import os
import signal
import socket
import sys
import time
from datetime import UTC, datetime

import numpy as np


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_url", default="")
    parser.add_argument("--train_url", default="")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--samples_per_rank", type=int, default=256)
    parser.add_argument("--checkpoint_every", type=int, default=5)
    parser.add_argument("--step_seconds", type=float, default=0.0)
    known, _ = parser.parse_known_args()
    return known


NOTICED = []


def save(ms, net, folder, step):
    """Rank 0: the parameters, then the manifest naming them (each written aside, then renamed)."""
    os.makedirs(folder, exist_ok=True)
    name = f"step-{step}.ckpt"
    ms.save_checkpoint(net, os.path.join(folder, "partial.ckpt"), append_dict={"step": step})
    os.replace(os.path.join(folder, "partial.ckpt"), os.path.join(folder, name))
    manifest = os.path.join(folder, "checkpoint.json")
    with open(manifest + ".tmp", "w") as out:
        json.dump({"step": step, "path": name, "time": datetime.now(UTC).isoformat(timespec="milliseconds")}, out)
    os.replace(manifest + ".tmp", manifest)


def main():
    args = parse_args()
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_context(device_target="CPU")
    init()
    rank, size = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True, device_num=size)
    ms.set_seed(0)
    host = socket.gethostname()
    scheduler = f"{os.environ.get('MS_SCHED_HOST', '?')}:{os.environ.get('MS_SCHED_PORT', '?')}"
    print(f"rank {rank}/{size} on host {host} mindspore {ms.__version__} data parallel, scheduler {scheduler}", flush=True)
    if rank == 0:
        print("parameters: " + json.dumps(sys.argv[1:]), flush=True)
    if rank == 0 and args.data_url and os.path.isdir(args.data_url):
        found = [os.path.join(top, name) for top, _, names in os.walk(args.data_url) for name in names]
        print(f"data_url: {len(found)} files, {sum(os.path.getsize(path) for path in found)} bytes", flush=True)

    rng = np.random.default_rng(1234 + rank)
    true_weights = np.linspace(-1.0, 1.0, args.features).astype(np.float32)
    features = rng.normal(size=(args.samples_per_rank, args.features)).astype(np.float32)
    targets = (features @ true_weights + rng.normal(scale=0.01, size=args.samples_per_rank)).astype(np.float32)
    x, y = ms.Tensor(features), ms.Tensor(targets.reshape(-1, 1))

    net = nn.Dense(args.features, 1)
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=args.lr)
    grad_fn = ms.value_and_grad(lambda data, label: loss_fn(net(data), label), None, optimizer.parameters)
    reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True, degree=size)

    folder, first = os.environ.get("MA_CHECKPOINT_DIR", ""), 1
    name = os.environ.get("MA_CHECKPOINT_SIGNAL", "")
    if name and hasattr(signal, name):
        signal.signal(getattr(signal, name), lambda *_: NOTICED.append(True))
    resume_from = os.environ.get("MA_RESUME_FROM", "")
    if resume_from:
        saved = ms.load_checkpoint(resume_from)
        first = int(saved.pop("step").asnumpy()) + 1
        ms.load_param_into_net(net, saved)
        if rank == 0:
            print(f"resumed from {resume_from} after step {first - 1}", flush=True)
    agree = ms.ops.AllReduce()

    averaged = None
    for step in range(first, args.steps + 1):
        loss, gradients = grad_fn(x, y)
        averaged = reducer(gradients)
        optimizer(averaged)
        print(f"rank {rank} host {host} step={step} loss={float(loss.asnumpy()):.6f}", flush=True)
        # Every rank learns of the notice at the same step (any rank's counts).
        noticed = float(agree(ms.Tensor([1.0 if NOTICED else 0.0], ms.float32)).asnumpy()[0]) > 0
        if rank == 0 and folder and (noticed or step % args.checkpoint_every == 0):
            save(ms, net, folder, step)
        if noticed:
            print(f"rank {rank} ends at step {step} after the notice", flush=True)
            return
        if args.step_seconds:
            time.sleep(args.step_seconds)

    gradient_sum = sum(float(gradient.asnumpy().astype(np.float64).sum()) for gradient in averaged)
    weight_sum = sum(float(parameter.asnumpy().astype(np.float64).sum()) for parameter in net.trainable_params())
    print(f"rank {rank} averaged gradient checksum {gradient_sum:.9f}", flush=True)
    print(f"rank {rank} final weights checksum {weight_sum:.9f}", flush=True)


if __name__ == "__main__":
    main()
