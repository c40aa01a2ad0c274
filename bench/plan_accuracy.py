"""bench/plan-accuracy.sh: how close `cohort plan` comes to the runs it predicts.

For each configuration: `cohort plan --json` (its own probes), then the real
run with `--plan` (cohort run on this machine, or `cohort worker` ranks on two
network-namespace hosts), and the comparison of the predicted peak resident
memory (per rank) and throughput with the measured ones:
  memory      rank 0's peak resident memory (summary.json peak_rss_mb; every
              rank's is in its log, the largest is shown too)
  throughput  the median of the steps after the first two (metrics.jsonl,
              one record per step), as the plan's probes measure it

  ./bench/plan-accuracy.sh [--only NAME[,NAME...]] [--json FILE] [--steps-scale X]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COHORT = os.path.join(ROOT, "build/cli/cohort")
GPT = os.path.join(ROOT, "examples/gpt-kjv.yaml")
RESNET = os.path.join(ROOT, "examples/resnet50-synthetic.yaml")

# name, job, --set overrides, nodes, ranks per node, steps of the real run,
# extra `cohort plan` options.
COMMON_IMAGES = ["training.epochs=1000", "data.train.size=512"]
CONFIGS = [
    ("resnet18-1x1-zero0", RESNET,
     COMMON_IMAGES + ["model.arch=resnet18", "data.train.shape=[3,112,112]", "training.batch_size=16"], 1, 1, 20, []),
    ("resnet50-1x2-zero1", RESNET, COMMON_IMAGES + ["distribution.zero=1"], 1, 2, 12, []),
    ("resnet18-1x2-zero3-cl", RESNET,
     COMMON_IMAGES + ["model.arch=resnet18", "data.train.shape=[3,112,112]", "training.batch_size=16",
                      "distribution.zero=3", "model.memory_format=channels_last"], 1, 2, 20, []),
    ("gpt-1x2-zero0", GPT, ["training.precision=fp32"], 1, 2, 30, []),
    ("gpt-1x2-zero2-recompute", GPT, ["training.precision=fp32", "distribution.zero=2", "model.recompute=blocks"],
     1, 2, 30, []),
    ("gpt85m-1x2-zero3", GPT,
     ["training.precision=fp32", "model.n_layer=12", "model.n_head=12", "model.n_embd=768", "training.batch_size=2",
      "distribution.zero=3"], 1, 2, 10, []),
    ("gpt-2x1-zero1-netns", GPT, ["training.precision=fp32", "distribution.zero=1",
                                  "distribution.threads_per_rank=1"], 2, 1, 30, ["--cores-per-node", "1"]),
    # Split models (docs/plan.md, "Pipelines and tensor splits").
    ("gpt-1x2-tensor2", GPT, ["training.precision=fp32", "distribution.tensor=2"], 1, 2, 30, []),
    ("gpt-1x2-tensor2-sp", GPT, ["training.precision=fp32", "distribution.tensor=2",
                                 "distribution.sequence_parallel=true"], 1, 2, 30, []),
    ("gpt-1x2-tensor2-recompute", GPT, ["training.precision=fp32", "distribution.tensor=2", "model.recompute=blocks"],
     1, 2, 30, []),
    ("gpt-1x2-stages2", GPT, ["training.precision=fp32", "distribution.pipeline.stages=2", "training.batch_size=4"],
     1, 2, 12, []),
    ("gpt-1x2-stages2-m4-gpipe", GPT, ["training.precision=fp32", "distribution.pipeline.stages=2",
                                       "distribution.pipeline.micro_batches=4", "distribution.pipeline.schedule=gpipe",
                                       "training.batch_size=4"], 1, 2, 12, []),
]
PROBED = {"gpt-1x2-zero0"}  # the plan's own two-rank probe runs this very setting


def cpu():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"^Model name:\s*(.*)$", out, re.M)
    flags = re.search(r"^Flags:\s*(.*)$", out, re.M)
    want = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]
    have = [f for f in want if flags and f in flags.group(1).split()]
    return f"{model.group(1) if model else 'unknown'} ({' '.join(have)}), {os.cpu_count()} cores"


def run(argv, log, env=None):
    with open(log, "w") as f:
        r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=3600)
    if r.returncode != 0:
        sys.stderr.write(open(log).read()[-3000:])
        raise SystemExit(f"plan-accuracy: {' '.join(argv[:3])} ... exited {r.returncode} (log {log})")


def steady(run_dir):
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    batch = summary["global_batch"]
    ms = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        if r.get("event") == "train" and r["step"] > 2 and r.get("images_per_s", 0) > 0:
            ms.append(1000 * batch / r["images_per_s"])
    step = statistics.median(ms)
    peaks = []
    logs = os.path.join(run_dir, "logs")
    for name in sorted(os.listdir(logs)):
        for m in re.finditer(r"peak resident (\d+) MB", open(os.path.join(logs, name), errors="replace").read()):
            peaks.append(float(m.group(1)))
    return summary, batch * 1000 / step, max(peaks) if peaks else 0


def sets(overrides):
    out = []
    for o in overrides:
        out += ["--set", o]
    return out


RUN_SETS = ["data.eval.kind=none", "checkpoint.enabled=false", "output.save_final=false", "output.progress=off",
            "training.log_every=1", "output.tensorboard=false"]


class Hosts:
    """Two network-namespace hosts on a bridge (10.213.7.0/24), removed on exit."""

    def __init__(self, n):
        self.n = n
        self.tag = f"cpa{os.getpid() % 10000}"
        self.ip(["link", "add", f"br{self.tag}", "type", "bridge"])
        self.ip(["addr", "add", "10.213.7.1/24", "dev", f"br{self.tag}"])
        self.ip(["link", "set", f"br{self.tag}", "up"])
        for h in range(n):
            self.ip(["netns", "add", self.ns(h)])
            self.ip(["link", "add", f"v{self.tag}{h}", "type", "veth", "peer", "name", f"i{self.tag}{h}"])
            self.ip(["link", "set", f"i{self.tag}{h}", "netns", self.ns(h)])
            self.ip(["link", "set", f"v{self.tag}{h}", "master", f"br{self.tag}"])
            self.ip(["link", "set", f"v{self.tag}{h}", "up"])
            self.ip(["-n", self.ns(h), "addr", "add", f"{self.address(h)}/24", "dev", f"i{self.tag}{h}"])
            self.ip(["-n", self.ns(h), "link", "set", f"i{self.tag}{h}", "up"])
            self.ip(["-n", self.ns(h), "link", "set", "lo", "up"])

    def ns(self, h):
        return f"{self.tag}h{h}"

    def address(self, h):
        return f"10.213.7.{h + 2}"

    @staticmethod
    def ip(args, check=True):
        subprocess.run(["/usr/sbin/ip"] + args, check=check, capture_output=True)

    def close(self):
        for h in range(self.n):
            self.ip(["link", "del", f"v{self.tag}{h}"], False)
            self.ip(["netns", "del", self.ns(h)], False)
        self.ip(["link", "del", f"br{self.tag}"], False)


def real_run(job, overrides, nodes, procs, steps, run_dir, plan, log):
    over = overrides + RUN_SETS + [f"training.max_steps={steps}"]
    if nodes == 1:
        run([COHORT, "run", job, "--run-dir", run_dir, "--procs", str(procs), "--plan", plan] + sets(over), log)
        return
    # Ranks on hosts of their own: `cohort worker` under torchrun's variables.
    os.makedirs(run_dir, exist_ok=True)
    shutil.copy(plan, os.path.join(run_dir, "plan.json"))
    hosts = Hosts(nodes)
    procs_ = []
    try:
        world = nodes * procs
        for h in range(nodes):
            for l in range(procs):
                env = dict(os.environ, RANK=str(h * procs + l), WORLD_SIZE=str(world), LOCAL_RANK=str(l),
                           LOCAL_WORLD_SIZE=str(procs), MASTER_ADDR=hosts.address(0), MASTER_PORT="29517",
                           COHORT_STORE_TOKEN="plan-accuracy-token-0123456789abcdef")
                argv = ["/usr/sbin/ip", "netns", "exec", hosts.ns(h), COHORT, "worker", job, "--run-dir", run_dir,
                        "--set", f"distribution.nodes={nodes}", "--set", f"distribution.procs_per_node={procs}"] + sets(over)
                procs_.append(subprocess.Popen(argv, stdout=open(f"{log}.{h}.{l}", "w"), stderr=subprocess.STDOUT,
                                               env=env))
        codes = [p.wait(timeout=3600) for p in procs_]
        if any(codes):
            raise SystemExit(f"plan-accuracy: ranks on the hosts exited {codes} (logs {log}.*)")
    finally:
        for p in procs_:
            if p.poll() is None:
                p.kill()
                p.wait()
        hosts.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="keep the runs in this directory")
    args = ap.parse_args()
    if not os.access(COHORT, os.X_OK):
        raise SystemExit("plan-accuracy: build cohort first (scripts/build.sh)")
    only = set(filter(None, args.only.split(",")))
    work = args.keep or tempfile.mkdtemp(prefix="cohort-plan-accuracy.")
    os.makedirs(work, exist_ok=True)
    print(f"cpu: {cpu()}", flush=True)
    rows = []
    try:
        for name, job, overrides, nodes, procs, steps, extra in CONFIGS:
            if only and name not in only:
                continue
            d = os.path.join(work, name)
            os.makedirs(d, exist_ok=True)
            plan = os.path.join(d, "plan.json")
            with open(plan, "w") as f, open(os.path.join(d, "plan.log"), "w") as log:
                r = subprocess.run([COHORT, "plan", job, "--json", "--nodes", str(nodes), "--procs-per-node",
                                    str(procs)] + extra + sets(overrides), stdout=f, stderr=log, timeout=3600)
            if r.returncode != 0:
                raise SystemExit(f"plan-accuracy: cohort plan failed for {name} ({d}/plan.log)")
            p = json.load(open(plan))
            real_run(job, overrides, nodes, procs, steps, os.path.join(d, "run"), plan, os.path.join(d, "run.log"))
            summary, sps, max_peak = steady(os.path.join(d, "run"))
            pred_mem = p["predicted"]["memory_mb"]["peak"]
            pred_sps = p["predicted"]["speed"]["samples_per_s"]
            meas_mem = summary["peak_rss_mb"]
            row = {"name": name, "nodes": nodes, "procs_per_node": procs, "setting": p["predicted"]["setting"],
                   "predicted_peak_mb": pred_mem, "measured_peak_mb": meas_mem, "measured_peak_mb_max_rank": max_peak,
                   "memory_error_pct": 100 * (pred_mem - meas_mem) / meas_mem,
                   "predicted_samples_per_s": pred_sps, "measured_samples_per_s": sps,
                   "throughput_error_pct": 100 * (pred_sps - sps) / sps,
                   "probes": p["probes"], "probe_seconds": p["probe_seconds"], "probed_setting": name in PROBED,
                   "summary_plan": summary.get("plan")}
            rows.append(row)
            print(f"{name:28} memory {pred_mem:7.0f} / {meas_mem:7.0f} MB ({row['memory_error_pct']:+5.1f}%)  "
                  f"throughput {pred_sps:8.2f} / {sps:8.2f} samples/s ({row['throughput_error_pct']:+5.1f}%)  "
                  f"plan {p['probe_seconds']:.0f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        json.dump({"cpu": cpu(), "rows": rows}, open(args.json, "w"), indent=1)
    bad = [r["name"] for r in rows if abs(r["memory_error_pct"]) > 10 or abs(r["throughput_error_pct"]) > 20]
    print(f"{len(rows) - len(bad)}/{len(rows)} within 10% (memory) and 20% (throughput)"
          + (f"; outside: {', '.join(bad)}" if bad else ""))


if __name__ == "__main__":
    main()
