"""bench/serve.sh: `cohort serve` under load, with dynamic batching on and
off, against the same model in ONNX Runtime (Node.js) and in PyTorch
(TorchScript), all measured in the same run.

The model: ResNet-18 (1000 classes) trained one step on synthetic images of
SIZE x SIZE px (--size, default 224), then exported with `cohort export` as
ONNX and TorchScript. The load: wrk (Debian's), keep-alive connections, each
posting one image per request, for --seconds after a warm-up, at
concurrency 1, 8 and 32; all servers run at once and the measurements are
interleaved, --repeats rounds of them, the median kept.

  cohort, batch 1   cohort serve --max-batch 1 (one forward per request)
  cohort, batched   cohort serve --max-batch 32 --max-delay-ms D
  onnxruntime-node  bench/peers/ort_server.js, one session.run per request
  onnxruntime-node, batched   the same with its batching queue: up to 32
                    requests per session.run, waiting at most D ms
  torchscript       bench/peers/ts_server.py, one forward per request
  torchscript, batched   the same with its batching queue: up to 32 requests
                    per forward, waiting at most D ms (as TorchServe's
                    batch_size and max_batch_delay): the tuned peer

Two bodies: the image as a JPEG (cohort decodes it with its own decoder and
the eval transform) for cohort's two modes, and as JSON pixels
({"inputs": [[C][H][W]]}) for all of them, since the peers have no decoder.
Each server's model uses --threads intra-op threads (default: all cores).

Printed: requests/s, p50 and p99 latency (wrk's), errors, and the issue's
targets: at concurrency 32, batched throughput >= 3x the batch-1 server's,
with p99 below 4x the single-request latency (batch 1, concurrency 1).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COHORT = os.path.join(ROOT, "build", "cli", "cohort")
SYSTEM_PYTHON = "/usr/bin/python3"

JOB = """name: serve-bench
model: {{arch: resnet18, num_classes: 1000}}
data:
  train: {{kind: synthetic, size: 4, shape: [3, {size}, {size}], seed: 1,
          mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}
distribution: {{procs_per_node: 1}}
training: {{epochs: 1, max_steps: 1, batch_size: 2, optimizer: {{name: sgd, lr: 0.01}}}}
output: {{progress: "off"}}
checkpoint: {{enabled: false}}
"""

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = os.getenv("BENCH_TYPE")
local f = io.open(os.getenv("BENCH_BODY"), "rb")
wrk.body = f:read("*a")
f:close()
local bad = 0
response = function(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout + e.status))
end
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_line():
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True,
                         text=True).stdout.strip()
    flags = [f for f in open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
             if f.startswith(("avx", "fma", "amx"))]
    return "CPU: %s, %d cores; %s" % (cpu, os.cpu_count(), " ".join(flags))


def wait_ready(port, proc, what, limit_s=120):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit("%s exited with %d before listening" % (what, proc.returncode))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit("%s did not listen on %d within %d s" % (what, port, limit_s))


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wrk(port, body, ctype, conns, seconds, script):
    env = dict(os.environ, BENCH_BODY=body, BENCH_TYPE=ctype)
    cmd = ["wrk", "-t", str(min(2, conns)), "-c", str(conns), "-d", "%ds" % seconds, "--timeout", "60s",
           "-s", script, "http://127.0.0.1:%d/v1/predict" % port]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 120).stdout
    for line in out.splitlines():
        if line.startswith("RESULT"):
            n, dur_us, p50, p99, errors = (int(v) for v in line.split()[1:])
            return {"rps": n / (dur_us / 1e6), "p50_ms": p50 / 1e3, "p99_ms": p99 / 1e3, "errors": errors,
                    "requests": n}
    sys.exit("wrk printed no result:\n" + out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=5, help="load per measurement")
    ap.add_argument("--size", type=int, default=224, help="image side in px")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="model intra-op threads")
    ap.add_argument("--max-delay-ms", type=float, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="measurements per point, interleaved; the median is kept")
    ap.add_argument("--concurrency", default="1,8,32")
    args = ap.parse_args()
    if not os.access(COHORT, os.X_OK):
        sys.exit("serve.sh: build cohort first (scripts/build.sh)")
    print(cpu_line(), flush=True)
    work = tempfile.mkdtemp(prefix="cohort-serve-bench-")
    procs = []
    try:
        job = os.path.join(work, "job.yaml")
        open(job, "w").write(JOB.format(size=args.size))
        run = os.path.join(work, "run")
        subprocess.run([COHORT, "run", job, "--run-dir", run], check=True, capture_output=True)
        onnx, ts = os.path.join(work, "r18.onnx"), os.path.join(work, "r18.ts.pt")
        subprocess.run([COHORT, "export", run, "--format", "onnx", "--out", onnx], check=True,
                       capture_output=True)
        subprocess.run([COHORT, "export", run, "--format", "torchscript", "--out", ts], check=True,
                       capture_output=True)
        script = os.path.join(work, "post.lua")
        open(script, "w").write(WRK_SCRIPT)
        jpeg, js = os.path.join(work, "image.jpg"), os.path.join(work, "image.json")
        subprocess.run([SYSTEM_PYTHON, "-c", """
import sys, json
from PIL import Image
s = int(sys.argv[3])
img = Image.new("RGB", (s, s))
px = img.load()
for y in range(s):
    for x in range(s):
        px[x, y] = ((x * 7 + y) % 256, (y * 5) % 256, (x * y) % 256)
img.save(sys.argv[1], quality=90)
img = Image.open(sys.argv[1]).convert("RGB")
p = img.load()
json.dump({"inputs": [[[[p[x, y][c] for x in range(s)] for y in range(s)] for c in range(3)]]},
          open(sys.argv[2], "w"))
""", jpeg, js, str(args.size)], check=True)

        def start(kind):
            port = free_port()
            if kind.startswith("cohort"):
                batch = "1" if kind == "cohort, batch 1" else "32"
                cmd = [COHORT, "serve", run, "--port", str(port), "--max-batch", batch, "--max-delay-ms",
                       str(args.max_delay_ms), "--compute-threads", str(args.threads), "--threads", "40",
                       "--max-concurrency", "1000", "--max-queue", "1000"]
            elif kind.startswith("onnxruntime-node"):
                cmd = ["node", os.path.join(ROOT, "bench/peers/ort_server.js"), onnx, str(port),
                       str(args.threads)]
                if kind == "onnxruntime-node, batched":
                    cmd += ["32", str(args.max_delay_ms)]
            else:
                cmd = [SYSTEM_PYTHON, os.path.join(ROOT, "bench/peers/ts_server.py"), ts, str(port),
                       str(args.threads)]
                if kind == "torchscript, batched":
                    cmd += ["32", str(args.max_delay_ms)]
            # TMPDIR: ONNX Runtime's telemetry leaves an empty mat-debug-<pid>.log there.
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, kind + ".log"), "w"),
                                 env=dict(os.environ, TMPDIR=work))
            procs.append(p)
            wait_ready(port, p, kind)
            return p, port

        levels = [int(c) for c in args.concurrency.split(",")]
        plan = [("cohort, batch 1", "jpeg"), ("cohort, batched", "jpeg"), ("cohort, batch 1", "json"),
                ("cohort, batched", "json"), ("onnxruntime-node", "json"), ("onnxruntime-node, batched", "json"),
                ("torchscript", "json"), ("torchscript, batched", "json")]
        # Every server runs from the start (an idle one takes no CPU), and the
        # measurements are interleaved: on a shared machine whose speed drifts,
        # each configuration sees the same drift.
        ports = {kind: start(kind)[1] for kind in ["cohort, batch 1", "cohort, batched", "onnxruntime-node",
                                                   "onnxruntime-node, batched", "torchscript",
                                                   "torchscript, batched"]}
        bodies = {"jpeg": (jpeg, "image/jpeg"), "json": (js, "application/json")}
        for server, body in plan:
            wrk(ports[server], bodies[body][0], bodies[body][1], 2, 3, script)  # warm-up
        results = {}
        for c in levels:
            runs = {key: [] for key in plan}
            for _ in range(args.repeats):
                for server, body in plan:
                    runs[(server, body)].append(wrk(ports[server], bodies[body][0], bodies[body][1], c,
                                                    args.seconds, script))
            for (server, body), rs in runs.items():
                r = sorted(rs, key=lambda x: x["rps"])[len(rs) // 2]
                results[(server, body, c)] = r
                print("%-20s %-4s c=%-3d %8.1f req/s  p50 %8.1f ms  p99 %8.1f ms  errors %d  (req/s of %d runs: %s)" %
                      (server, body, c, r["rps"], r["p50_ms"], r["p99_ms"], r["errors"], len(rs),
                       " ".join("%.1f" % x["rps"] for x in rs)), flush=True)
        print()
        for body in ("jpeg", "json"):
            one = results.get(("cohort, batch 1", body, 1))
            b1 = results.get(("cohort, batch 1", body, 32))
            bb = results.get(("cohort, batched", body, 32))
            if one and b1 and bb:
                print("%s: at c=32 batched/batch-1 throughput %.2fx (target >= 3x); batched p99 %.0f ms = "
                      "%.1fx the single-request latency %.1f ms (target < 4x)" %
                      (body, bb["rps"] / b1["rps"], bb["p99_ms"], bb["p99_ms"] / one["p50_ms"], one["p50_ms"]))
        cb = results.get(("cohort, batched", "json", 32))
        for peer in ("torchscript, batched", "onnxruntime-node, batched"):
            tb = results.get((peer, "json", 32))
            if tb and cb:
                print("json at c=32: cohort batched %.1f req/s against the %s peer's %.1f: %.2fx; "
                      "p99 %.0f ms against %.0f ms" % (cb["rps"], peer, tb["rps"], cb["rps"] / tb["rps"],
                                                       cb["p99_ms"], tb["p99_ms"]))
        print(json.dumps({"|".join(map(str, k)): v for k, v in results.items()}))
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
