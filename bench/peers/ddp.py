#!/usr/bin/python3
"""PyTorch's own DDP on synthetic data: the baseline cohort's DDP bench runs
side by side (Debian's python3-torch and python3-torchvision).

    /usr/bin/python3 bench/peers/ddp.py --arch resnet18 --size 32 --batch 32 \
        --world 2 --steps 40 --warmup 10 --port 29555

Each rank: torchvision's model, gloo process group on 127.0.0.1, 1 intra-op
thread, SGD with momentum, a fixed random batch (no data loading), timed
over --steps steps after --warmup. Prints one JSON line: images/s over all
ranks and per-phase means (forward, backward+allreduce, optimizer) of rank 0.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision


def run(rank, args, out):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.arch)(num_classes=args.classes)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, args.classes, (args.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
            phases = {k: 0.0 for k in phases}
        t0 = time.perf_counter()
        loss = loss_fn(ddp(x), y)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["optimizer"] += t3 - t2
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        out.put({
            "peer": "pytorch_ddp", "arch": args.arch, "size": args.size, "batch": args.batch,
            "world": args.world, "threads": args.threads, "steps": args.steps,
            "images_per_s": args.batch * args.world * args.steps / elapsed,
            "step_ms": 1000 * elapsed / args.steps,
            "phase_ms": {k: 1000 * v / args.steps for k, v in phases.items()},
            "torch": torch.__version__,
        })
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--port", type=int, default=29555)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, args, out)) for r in range(args.world)]
    for pr in procs:
        pr.start()
    result = out.get(timeout=3600)
    for pr in procs:
        pr.join(timeout=600)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
