#!/usr/bin/python3
"""PyTorch baseline for time to accuracy on Fashion-MNIST: one process with
2 intra-op threads, the same network as examples/fashion-mnist.yaml (two 3x3
convolutions of 32 and 64 channels with BatchNorm, ReLU and 2x2 max-pool, a
128-unit hidden layer, dropout 0.25), batch 128, SGD (lr 0.1, momentum 0.9,
Nesterov, weight decay 5e-4), cosine schedule with half an epoch of warm-up,
evaluation after every epoch on the 10,000 test images.

    /usr/bin/python3 bench/peers/fashion_mnist.py --epochs 8 --target 0.91

Prints a JSON line per evaluation and a last one with the seconds from --start
(interpreter start-up and data loading included) to the first evaluation at or
above --target.
"""
import argparse
import gzip
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DIR = "/usr/share/datasets/fashion-mnist"


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--target", type=float, default=0.91)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start", type=float, default=None,
                   help="Unix time the measurement starts at (default: now); the caller's launch time")
    args = p.parse_args()
    start = time.time() if args.start is None else args.start
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    xtr, ytr = load("train")
    xte, yte = load("t10k")
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    batch = 128
    steps_per_epoch = math.ceil(len(xtr) / batch)
    total = steps_per_epoch * args.epochs
    warmup = steps_per_epoch // 2
    reached = None
    step = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            lr = 0.1 * (step + 1) / warmup if step < warmup else \
                0.5 * 0.1 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
            for g in opt.param_groups:
                g["lr"] = lr
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        model.eval()
        with torch.no_grad():
            correct = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                          for i in range(0, len(xte), 1000))
        top1 = correct / len(xte)
        seconds = time.time() - start
        print(json.dumps({"epoch": epoch, "top1": top1, "seconds": seconds}), flush=True)
        if reached is None and top1 >= args.target:
            reached = seconds
            break
    print(json.dumps({"peer": "pytorch_fashion_mnist", "target": args.target,
                      "seconds_to_target": reached, "epochs": epoch, "top1": top1}), flush=True)


if __name__ == "__main__":
    main()
