#!/usr/bin/python3
"""PyTorch's own DDP on synthetic data: the baseline cohort's DDP bench runs
side by side (Debian's python3-torch and python3-torchvision).

    /usr/bin/python3 bench/peers/ddp.py --arch resnet18 --size 32 --batch 32 \
        --world 2 --steps 40 --warmup 10 --port 29555

Each rank: torchvision's model, gloo process group on 127.0.0.1, 1 intra-op
thread, SGD with momentum, a fixed random batch (no data loading), timed
over --steps steps after --warmup. Prints one JSON line: images/s over all
ranks and per-phase means (forward, backward+allreduce, optimizer) of rank 0.
--memory-format channels_last holds the model and the batch in NHWC, as
cohort does when its `model.memory_format: auto` chose channels_last (the
benchmark passes cohort's choice, so both sides convolve in one layout).
"""
import argparse
import sys

import torch
import torch.distributed as dist
import torchvision

from ddp_harness import add_launch_arguments, init_rank, spawn, timed_steps


def run(rank, args, out):
    launch = init_rank(rank, args, out)
    if launch is None:
        return
    layout = torch.channels_last if args.memory_format == "channels_last" else torch.contiguous_format
    model = getattr(torchvision.models, args.arch)(num_classes=args.classes).to(memory_format=layout)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, args.size, args.size).contiguous(memory_format=layout)
    y = torch.randint(0, args.classes, (args.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    elapsed, phase_ms = timed_steps(lambda: loss_fn(ddp(x), y), opt, args.warmup, args.steps)
    if rank == 0:
        out.put({
            "peer": "pytorch_ddp", "arch": args.arch, "size": args.size, "batch": args.batch,
            "world": args.world, "threads": args.threads, "steps": args.steps,
            "images_per_s": args.batch * args.world * args.steps / elapsed,
            "step_ms": 1000 * elapsed / args.steps,
            "memory_format": args.memory_format,
            "phase_ms": phase_ms,
            "torch": torch.__version__,
            "launch": launch,
        })
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--world", type=int, default=1)
    add_launch_arguments(p)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--memory-format", choices=["contiguous", "channels_last"], default="contiguous")
    p.add_argument("--port", type=int, default=29555)
    args = p.parse_args()
    return spawn(run, args)


if __name__ == "__main__":
    sys.exit(main())
