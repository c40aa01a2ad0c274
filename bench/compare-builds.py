#!/usr/bin/env python3
"""Two builds of cohort side by side: does a change move training throughput?

  bench/compare-builds.py OLD_COHORT NEW_COHORT [--repeat N] [--quick]

Runs the training jobs of scripts/bench.sh's DDP part (bench/ddp.cc's
synthetic ResNet-18 at 32 px, batch 32, and ResNet-50 at 64 px, batch 8; one
rank with 2 threads and 2 ranks with 1 thread each), a small GPT on 2 ranks
(bench/gpt-kjv.sh's model, if ./scripts/prepare-kjv.sh's data is there), and
examples/fashion-mnist.yaml to the end (time and test top-1), with each
binary in turn, N times (default 3): OLD first in odd pairs, NEW first in
even ones, so that an order effect (a warmer cache, another tenant's
load) does not favour one build. Prints the CPU, then
for every job each pair's rates and the NEW/OLD ratio of the medians, then
JSON lines. Rates are those of bench/run_rate.h: samples over seconds of the
metrics windows after the first (warm-up) one.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu():
    flags, model = [], "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].split()
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
    feats = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores; {' '.join(feats)}"


def synthetic(arch, size, batch, threads, steps, warmup=3):
    return f"""name: compare-{arch}
model: {{arch: {arch}, num_classes: 1000}}
data:
  train: {{kind: synthetic, size: {(warmup + steps) * batch * 2}, shape: [3, {size}, {size}]}}
  loader_threads: 1
distribution: {{threads_per_rank: {threads}}}
training:
  epochs: 1
  max_steps: {warmup + steps}
  batch_size: {batch}
  log_every: {warmup}
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
checkpoint: {{enabled: false}}
output: {{progress: off, save_final: false}}
"""


def rate(run, field):
    windows = []
    first = True
    for line in open(os.path.join(run, "metrics.jsonl")):
        j = json.loads(line)
        if j.get("event") != "train":
            continue
        if first:
            first = False
            continue
        windows.append(j[field])
    if not windows:
        raise SystemExit(f"{run}: no metrics window after the warm-up one")
    return len(windows) / sum(1 / w for w in windows)


def run(binary, args, out):
    r = subprocess.run([binary, "run"] + args + ["--run-dir", out], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{binary} run {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="few steps, no Fashion-MNIST (a smoke test)")
    parser.add_argument("--only", default="", help="only the jobs whose name contains this")
    a = parser.parse_args()
    old, new = os.path.abspath(a.old), os.path.abspath(a.new)
    repeat, quick = a.repeat, a.quick
    print(f"cpu: {cpu()}")
    print(f"old: {old}\nnew: {new}\n")
    tmp = tempfile.mkdtemp(prefix="cohort-compare-")
    jobs = []  # (name, job file, extra args, metric)
    for arch, size, batch, steps in (("resnet18", 32, 32, 30), ("resnet50", 64, 8, 12)):
        for procs, threads in ((1, 2), (2, 1)):
            path = os.path.join(tmp, f"{arch}-{procs}x{threads}.yaml")
            with open(path, "w") as f:
                f.write(synthetic(arch, size, batch, threads, steps if not quick else 6))
            jobs.append((f"{arch} {size}px b{batch} {procs}x{threads}", path, ["--procs", str(procs)], "images_per_s"))
    kjv = "/var/tmp/cohort-data/kjv/train/dataset.json"
    if os.path.exists(kjv):
        jobs.append(("gpt 128x4 (gpt-kjv.yaml) 2x1", os.path.join(ROOT, "examples/gpt-kjv.yaml"),
                     ["--set", "training.max_steps=60", "--set", "training.log_every=10", "--set", "data.eval.kind=none",
                      "--set", "checkpoint.enabled=false", "--set", "output.save_final=false", "--set",
                      "output.progress=off", "--set", "training.precision=fp32",
                      "--set", "distribution.threads_per_rank=1"], "tokens_per_s"))
    if not quick:
        jobs.append(("fashion-mnist.yaml to the end (s)", os.path.join(ROOT, "examples/fashion-mnist.yaml"),
                     ["--set", "output.progress=off"], "wall"))
    results = {}
    jobs = [j for j in jobs if a.only in j[0]]
    for name, path, extra, metric in jobs:
        pairs = []
        for k in range(repeat):
            got = {}
            order = (("old", old), ("new", new)) if k % 2 == 0 else (("new", new), ("old", old))
            for which, binary in order:
                out = os.path.join(tmp, f"{len(results)}-{k}-{which}")
                run(binary, [path] + extra, out)
                if metric == "wall":
                    s = json.load(open(os.path.join(out, "summary.json")))
                    got[which] = (s["wall_time_s"], s.get("eval", {}).get("top1", 0.0))
                else:
                    got[which] = rate(out, metric)
                subprocess.run(["rm", "-rf", out])
            pair = [got["old"], got["new"]]
            pairs.append(pair)
            print(f"  {name}: pair {k + 1}: old {pair[0]}, new {pair[1]}", file=sys.stderr)
        if metric == "wall":
            o = statistics.median(p[0][0] for p in pairs)
            n = statistics.median(p[1][0] for p in pairs)
            tops = [(p[0][1], p[1][1]) for p in pairs]
            print(f"{name:<36} old {o:8.1f}  new {n:8.1f}  new/old {n / o:.3f}   top-1 pairs {tops}")
        else:
            o = statistics.median(p[0] for p in pairs)
            n = statistics.median(p[1] for p in pairs)
            print(f"{name:<36} old {o:8.1f}  new {n:8.1f}  new/old {n / o:.3f}   pairs "
                  + ", ".join(f"{p[0]:.1f}/{p[1]:.1f}" for p in pairs))
        results[name] = {"metric": metric, "pairs": pairs, "old_median": o, "new_median": n, "ratio": n / o}
    subprocess.run(["rm", "-rf", tmp])
    print(json.dumps({"bench": "compare_builds", "cpu": cpu(), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
