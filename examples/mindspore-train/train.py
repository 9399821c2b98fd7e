"""A data-parallel training loop for the console's MindSpore engine (CPU).

The platform starts MindSpore's cluster for the ranks mpirun started, so this calls plain
mindspore.communication.init(). Every rank fits the same linear model (the same seed, so the same
starting parameters) on its own shard of a synthetic data set, in a data-parallel context whose
gradients are averaged across ranks (nn.DistributedGradReducer). Each rank prints its host and loss at
each step, the checksum of the averaged gradient of its last step and of its final parameters: the
ranks must agree on both.

Run by the platform as:  mpirun ... python train.py [--steps=N --lr=X]
"""

import argparse
import json
import os
import socket
import sys

import numpy as np


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_url", default="")
    parser.add_argument("--train_url", default="")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--samples_per_rank", type=int, default=256)
    known, _ = parser.parse_known_args()
    return known


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

    averaged = None
    for step in range(1, args.steps + 1):
        loss, gradients = grad_fn(x, y)
        averaged = reducer(gradients)
        optimizer(averaged)
        print(f"rank {rank} host {host} step={step} loss={float(loss.asnumpy()):.6f}", flush=True)

    gradient_sum = sum(float(gradient.asnumpy().astype(np.float64).sum()) for gradient in averaged)
    weight_sum = sum(float(parameter.asnumpy().astype(np.float64).sum()) for parameter in net.trainable_params())
    print(f"rank {rank} averaged gradient checksum {gradient_sum:.9f}", flush=True)
    print(f"rank {rank} final weights checksum {weight_sum:.9f}", flush=True)


if __name__ == "__main__":
    main()
