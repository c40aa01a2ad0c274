#!/usr/bin/python3
"""One process's training step in plain PyTorch, the peer of bench/step.cc
(Debian's python3-torch and python3-torchvision).

    /usr/bin/python3 bench/peers/step.py --arch resnet18 --size 32 --batch 32 \
        --threads 1 --grads none --allocator system

torchvision's model, SGD with momentum, a fixed random batch, timed over
--steps steps after --warmup. --grads none: zero_grad(set_to_none=True),
autograd hands over fresh gradients; keep: zero_grad() keeps them and
backward adds into them (PyTorch 1.13's default). --allocator keep: glibc
keeps freed memory (mallopt as cohort's compute.allocator: keep). Prints one
JSON line: images/s and minor page faults per step.
"""
import argparse
import ctypes
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import launch_env  # noqa: E402

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--grads", choices=["none", "keep"], default="none")
    p.add_argument("--allocator", choices=["system", "keep"], default="system")
    p.add_argument("--report-only", action="store_true",
                   help="print what the peer runs with (allocator, threads) and stop")
    args = p.parse_args()
    if args.allocator == "keep":
        libc = ctypes.CDLL("libc.so.6")
        assert libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    import torch
    import torchvision
    launch_env.bind(0, 1, args.threads)  # one process: as cohort's one rank
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    launch = launch_env.verify(torch)  # exits 3 when not started as the harness says
    if args.report_only:
        print(json.dumps({"peer": "pytorch_step", "launch": launch}), flush=True)
        return
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.arch)(num_classes=1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 1000, (args.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=args.grads == "none")
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(json.dumps({"peer": "pytorch_step", "images_per_s": args.batch * args.steps / elapsed,
                      "faults_per_step": faults / args.steps, "launch": launch}), flush=True)


if __name__ == "__main__":
    main()
