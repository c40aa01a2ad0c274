#!/usr/bin/python3
"""Writes a small ImageNet-style image folder of JPEGs a model can learn.

    /usr/bin/python3 scripts/make-imagenet-like.py DST --classes 10 --per-class 50 --seed 0
    /usr/bin/python3 scripts/make-imagenet-like.py DST --classes 10 --per-class 100 --val 0.2

Layout: DST/<class>/<class>_<i>.JPEG, as torchvision's ImageFolder reads it,
with class names n00000000, n00000001, ... With --val F, F x per-class more
images per class go to a second folder, --val-dst (default: DST-val).

Images are RGB, of varied sizes around ImageNet's typical 500x375 (width
350-650, height 260-490), JPEG quality 90. Each shows a striped blob whose
colours, stripe angle and frequency depend on the class, at a random place,
size and phase, over a noisy background of random colours: learnable, but not
from one pixel. Output depends only on the arguments (numpy's PCG64 seeded by
(seed, class, index)), whatever --jobs is; 1000 images take ~15 s on 2 cores.

Uses numpy and PIL (Debian's python3-numpy and python3-pil, which
python3-torchvision depends on).
"""
import argparse
import math
import multiprocessing
import os
import sys

import numpy as np
from PIL import Image


def class_style(seed, c):
    rng = np.random.default_rng([seed, c, 1 << 30])
    hue = (c * 0.618034) % 1.0  # spread class colours over the hue circle
    a = np.array(hsv_to_rgb(hue, 0.85, 0.95))
    b = np.array(hsv_to_rgb((hue + 0.5) % 1.0, 0.5, 0.35))
    return {
        "fg": a,
        "bg": b,
        "angle": rng.uniform(0, math.pi),
        "period": rng.uniform(8, 40),  # pixels per stripe at scale 1
        "round": c % 2 == 0,  # ellipse or rectangle
    }


def hsv_to_rgb(h, s, v):
    i = int(h * 6) % 6
    f = h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]


def make_image(style, rng):
    w = int(rng.integers(350, 651))
    h = int(rng.integers(260, 491))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    # Background: a gradient between two random colours.
    c0, c1 = rng.uniform(0, 1, 3).astype(np.float32), rng.uniform(0, 1, 3).astype(np.float32)
    t = ((x * np.float32(rng.uniform(-1, 1) / w) + y * np.float32(rng.uniform(-1, 1) / h))
         % 1.0)[..., None]
    img = c0 + (c1 - c0) * t
    # The class's striped blob at a random place and size.
    size = rng.uniform(0.35, 0.8) * min(w, h)
    cx, cy = rng.uniform(size / 2, w - size / 2), rng.uniform(size / 2, h - size / 2)
    rx, ry = size / 2 * rng.uniform(0.8, 1.25), size / 2
    dx, dy = (x - cx) / rx, (y - cy) / ry
    if style["round"]:
        inside = dx * dx + dy * dy <= 1
    else:
        inside = (np.abs(dx) <= 1) & (np.abs(dy) <= 1)
    angle = style["angle"] + rng.normal(0, 0.1)
    period = style["period"] * size / 200
    u = (x * np.float32(math.cos(angle) / period) + y * np.float32(math.sin(angle) / period)
         + np.float32(rng.uniform(0, 1)))
    s = (0.5 + 0.5 * np.sin(np.float32(2 * math.pi) * u))[..., None]
    fg, bg = style["fg"].astype(np.float32), style["bg"].astype(np.float32)
    img = np.where(inside[..., None], bg + (fg - bg) * s, img)
    img = img * 255 + rng.standard_normal(img.shape, dtype=np.float32) * 12
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def write_one(task):
    dst, seed, c, i = task
    name = f"n{c:08d}"
    img = make_image(class_style(seed, c), np.random.default_rng([seed, c, i]))
    img.save(os.path.join(dst, name, f"{name}_{i}.JPEG"), quality=90)


def write(dst, classes, per_class, seed, first, jobs):
    for c in range(classes):
        os.makedirs(os.path.join(dst, f"n{c:08d}"), exist_ok=True)
    tasks = [(dst, seed, c, i) for c in range(classes) for i in range(first, first + per_class)]
    if jobs <= 1:
        for t in tasks:
            write_one(t)
        return
    with multiprocessing.Pool(jobs) as pool:
        for _ in pool.imap_unordered(write_one, tasks, chunksize=16):
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dst")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val", type=float, default=0.0,
                    help="also write this fraction of per-class images per class to --val-dst")
    ap.add_argument("--val-dst", default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes (default: one per core); the output does not depend on it")
    a = ap.parse_args()
    if a.classes < 1 or a.per_class < 1 or not 0 <= a.val <= 1:
        sys.exit("make-imagenet-like: need --classes >= 1, --per-class >= 1, 0 <= --val <= 1")
    write(a.dst, a.classes, a.per_class, a.seed, 0, a.jobs)
    n_val = round(a.val * a.per_class)
    if n_val > 0:
        # Indices after the training ones: a val image never equals a train image.
        write(a.val_dst or a.dst.rstrip("/") + "-val", a.classes, n_val, a.seed, a.per_class,
              a.jobs)


if __name__ == "__main__":
    main()
