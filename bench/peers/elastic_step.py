"""The torchrun side of bench/elastic.sh: a small DDP job that an elastic
torchrun agent runs, as a torchrun user writes one. It checkpoints its model,
optimizer and step every CKPT_EVERY steps (torchrun restarts the workers from
scratch after a membership change: whatever they did not save is lost) and
appends "<step> <unix ms> <world size>" per step to $STEP_LOG.<pid>.

Run by bench/elastic.sh only; it needs Debian's python3-torch.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

CKPT_EVERY = int(os.environ.get("CKPT_EVERY", "50"))
TOTAL = int(os.environ.get("TOTAL_STEPS", "1000"))
SLOW_MS = float(os.environ.get("SLOW_MS", "8"))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    ckpt = os.environ["CKPT_PATH"]
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    ddp = nn.parallel.DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(1000 + step * world + rank)
    log = open(f"{os.environ['STEP_LOG']}.{os.getpid()}", "a")
    while step < TOTAL:
        x = torch.randn(8, 1, 8, 8, generator=gen)
        y = torch.randint(0, 4, (8,), generator=gen)
        if rank == 0 and SLOW_MS > 0:
            time.sleep(SLOW_MS / 1000)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        log.write(f"{step} {int(time.time() * 1000)} {world}\n")
        log.flush()
        if rank == 0 and step % CKPT_EVERY == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
