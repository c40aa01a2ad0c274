"""PyTorch's own synchronous checkpoint of ResNet-50 (model + SGD momentum
state): torch.save to a file, flushed and fsync'd. Prints the median of 3
in milliseconds and the file size in bytes. The baseline bench/checkpoint
compares cohort's asynchronous checkpoints with.

    python3 bench/peers/checkpoint_save.py DIR
"""
import os
import statistics
import sys
import time

import torch
import torchvision


def main():
    out = os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "peer-save.pt")
    torch.set_num_threads(1)
    model = torchvision.models.resnet50(num_classes=1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    opt.step()  # creates the momentum buffers
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        with open(out, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        times.append(time.perf_counter() - t0)
    size = os.path.getsize(out)
    os.remove(out)
    print(f"{1000 * statistics.median(times):.1f} {size}")


if __name__ == "__main__":
    main()
