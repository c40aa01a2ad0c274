"""PyTorch's own ImageNet training input pipeline on a folder of JPEGs: the
baseline bench/decode compares cohort's decoding with.

    python3 bench/peers/decode.py DIR SIZE WORKERS SECONDS

torchvision.datasets.ImageFolder with RandomResizedCrop(SIZE),
RandomHorizontalFlip, ToTensor and Normalize, in a DataLoader with WORKERS
worker processes (each with torch.set_num_threads(1)), batch 32, shuffled.
The first epoch warms up (its time to the first batch, worker start-up
included, is reported apart); then whole epochs run until SECONDS have
passed. Prints one JSON line: images/s in the timed epochs and per worker.
"""
import json
import sys
import time

import torch
import torchvision.datasets as datasets
import torchvision.transforms as T


def init_worker(_):
    torch.set_num_threads(1)


def main():
    root, size, workers, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tf = T.Compose([
        T.RandomResizedCrop(size),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(root, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers,
                                         persistent_workers=True, worker_init_fn=init_worker)
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    startup = time.perf_counter() - t0
    for _ in it:  # rest of the warm-up epoch
        pass
    images, t0 = 0, time.perf_counter()
    while True:
        for x, _ in loader:
            images += x.shape[0]
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    print(json.dumps({"images": images, "seconds": elapsed, "images_per_s": images / elapsed,
                      "images_per_s_per_worker": images / elapsed / workers,
                      "first_batch_s": startup}))


if __name__ == "__main__":
    main()
