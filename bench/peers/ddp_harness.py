"""What the PyTorch DDP peers (ddp.py, gpt.py) share: a rank's process
group, the timed training loop with its phases, and spawning the ranks.

A peer defines `rank(rank, args, out)`, which calls `init_rank`, builds its
model, optimizer and fixed batch, times `timed_steps` and (rank 0)
`out.put`s its result dict with init_rank's report under "launch"; its main
calls `spawn(rank, args)`. With args.report_only, init_rank puts the report
alone (rank 0) and returns None: the rank stops there (the harness's test
of what a peer is started with, bench/launch_env.py).
"""
import json
import os
import queue
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import launch_env  # noqa: E402


def add_launch_arguments(parser):
    """--threads and --report-only, which every peer takes."""
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-only", action="store_true",
                        help="print what the peer runs with (allocator, threads) and stop")


def init_rank(rank, args, out):
    """Cores as cohort binds them (launch_env.bind, under the tuned
    harness), args.threads intra-op threads and one inter-op (as cohort's ranks),
    checked against what the harness expects (launch_env.verify); gloo on
    127.0.0.1:args.port, seed 0. Returns the launch report, or None with
    args.report_only (rank 0 has put it)."""
    launch_env.bind(rank, args.world, args.threads)  # before torch starts its threads
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    launch = launch_env.verify(torch)
    if args.report_only:
        if rank == 0:
            out.put({"peer": os.path.basename(sys.argv[0]), "launch": launch})
        return None
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    return launch


def timed_steps(loss_fn, optimizer, warmup, steps):
    """Runs warmup + steps steps of loss_fn() (forward and loss), backward
    (with DDP's allreduce) and optimizer.step(); returns the seconds of the
    timed steps, all ranks having started them together, and rank's mean ms
    per phase."""
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    start = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
            phases = {k: 0.0 for k in phases}
        t0 = time.perf_counter()
        loss = loss_fn()
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["optimizer"] += t3 - t2
    dist.barrier()
    elapsed = time.perf_counter() - start
    return elapsed, {k: 1000 * v / steps for k, v in phases.items()}


def spawn(rank_fn, args):
    """Starts args.world ranks of rank_fn and prints rank 0's result as one
    JSON line; returns 0, or 1 when a rank failed (its traceback is on
    stderr) or none sent a result: never a wait for a rank that is gone."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_fn, args=(r, args, out)) for r in range(args.world)]
    for pr in procs:
        pr.start()
    while True:
        try:
            result = out.get(timeout=1)
            break
        except queue.Empty:
            failed = [r for r, pr in enumerate(procs) if pr.exitcode not in (None, 0)]
            if failed or all(pr.exitcode == 0 for pr in procs):
                for pr in procs:
                    pr.kill()
                    pr.join()
                why = f"rank(s) {failed} failed" if failed else "no rank sent a result"
                print(f"{os.path.basename(sys.argv[0])}: {why}", file=sys.stderr)
                return 1
    for pr in procs:
        pr.join(timeout=600)
    print(json.dumps(result), flush=True)
    return 0
