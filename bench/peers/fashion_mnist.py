#!/usr/bin/python3
"""PyTorch baseline for time to accuracy on Fashion-MNIST, run as
examples/fashion-mnist.yaml runs cohort: PyTorch's DistributedDataParallel
over gloo, 2 ranks x 1 intra-op thread (and one inter-op), each rank a
batch of 64 (global 128) from its share of every epoch's order, the
weights and images channels-last as cohort lays them out; the same
network (two 3x3 convolutions of 32 and 64 channels with BatchNorm, ReLU and
2x2 max-pool, a 128-unit hidden layer, dropout 0.25), SGD (lr 0.1, momentum
0.9, Nesterov, weight decay 5e-4), cosine schedule with half an epoch of
warm-up over --epochs, evaluation by rank 0 after every epoch on the 10,000
test images.

    bench/launch_env.py run tcmalloc 1 /usr/bin/python3 bench/peers/fashion_mnist.py --epochs 4

Runs every epoch (so that both sides can be compared at the same epoch) and
prints one JSON line: each evaluation with the seconds from --start
(interpreter start-up and data loading included), and the seconds to the
first at or above --target.
"""
import argparse
import gzip
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_harness  # noqa: E402

DIR = "/usr/share/datasets/fashion-mnist"
BATCH = 128  # global


def load(kind):
    with gzip.open(f"{DIR}/{kind}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DIR}/{kind}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(self.drop(x))


def rank(r, args, out):
    launch = ddp_harness.init_rank(r, args, out)
    if launch is None:
        return
    torch.manual_seed(args.seed)
    xtr, ytr = load("train")
    xte, yte = load("t10k")
    # Channels-last, as cohort lays out this network's convolutions.
    model = nn.parallel.DistributedDataParallel(Net().to(memory_format=torch.channels_last))
    xtr = xtr.contiguous(memory_format=torch.channels_last)
    xte = xte.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    per_rank = BATCH // args.world
    steps_per_epoch = math.ceil(len(xtr) / BATCH)
    total = steps_per_epoch * args.epochs
    warmup = steps_per_epoch // 2
    evals, reached, step = [], None, 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        # One order per epoch, the same on every rank; rank r takes every
        # world-th sample of it (DistributedSampler's cut), padded by wrapping.
        order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        need = steps_per_epoch * BATCH
        order = torch.cat([order, order[:need - len(order)]])[r::args.world]
        for i in range(steps_per_epoch):
            idx = order[i * per_rank:(i + 1) * per_rank]
            lr = 0.1 * (step + 1) / warmup if step < warmup else \
                0.5 * 0.1 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
            for g in opt.param_groups:
                g["lr"] = lr
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        if r == 0:
            model.eval()
            with torch.no_grad():
                correct = sum((model.module(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                              for i in range(0, len(xte), 1000))
            top1 = correct / len(xte)
            seconds = time.time() - args.start
            evals.append({"epoch": epoch, "top1": top1, "seconds": seconds})
            if reached is None and top1 >= args.target:
                reached = seconds
        dist.barrier()
    if r == 0:
        out.put({"peer": "pytorch_fashion_mnist", "launch": launch, "world": args.world,
                 "target": args.target, "seconds_to_target": reached, "evals": evals})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--target", type=float, default=0.91)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--start", type=float, default=None,
                   help="Unix time the measurement starts at (default: now); the caller's launch time")
    ddp_harness.add_launch_arguments(p)
    args = p.parse_args()
    if args.start is None:
        args.start = time.time()
    return ddp_harness.spawn(rank, args)


if __name__ == "__main__":
    sys.exit(main())
