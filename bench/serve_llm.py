"""bench/serve-llm.sh: `cohort serve` generating text against a PyTorch peer
server of the same GPT, with the same threads and allocator, in the same run.

The model: a byte-level GPT of 6 layers, 6 heads, 384 wide, block 256
(10.6 M parameters), trained --steps steps on the King James Bible
(examples/gpt-kjv.yaml's data; speed, not quality, matters here), or the
run given with --run. Both servers load its model/final.pt:

  cohort        cohort serve RUN --max-batch 32 --max-delay-ms D
                --compute-threads T (key/value caches, generation steps of
                concurrent requests batched)
  pytorch peer  bench/peers/llm_server.py: gpt.py's module with its own
                key/value cache per request and continuous batching of the
                steps, padded to the longest cache and masked, up to 32
                generations, under torch.inference_mode

Each side runs with T intra-op threads (--threads, default all cores) and
each allocator of --allocators: tcmalloc (libtcmalloc-minimal4 preloaded,
the tuned setting) and glibc (untuned), set by bench/launch_env.py; the
peer checks it got them. All servers run from the start (an idle one takes
no CPU) and the measurements alternate cohort and peer, --pairs times.

The load: C concurrent clients (--concurrency, default 1,8,32), each sending
streamed requests ({"stream": true}, greedy, max_tokens --max-tokens) one
after the other for --seconds x (1 + C / 8) (a round of 32 generations
takes seconds), client k starting k x 50 ms after the first, prompts of
mixed lengths (8 to 190 bytes; --prompt-lengths).
Printed per point: generated tokens/s over all clients, and p50/p99 time to
first token (from sending the request to reading its first token's line),
pooled over the pairs; then the issue's target at 32 clients (at least 1.5x
the peer's tokens/s with a lower p99 time to first token).

Memory: for each side a fresh server (tcmalloc) answers one request, then
--memory-clients concurrent generations of mixed prompt lengths; the peak
RSS (VmHWM) above the RSS before them, per generation. --label names the
build in that table (cohort's cache is allocated at block_size per
sequence; rerun with the label of another build to compare).
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import launch_env  # noqa: E402
from serve import cpu_line, free_port, stop  # noqa: E402  (bench/serve.py: the same helpers)

COHORT = os.path.join(ROOT, "build", "cli", "cohort")
PYTHON = "/usr/bin/python3"
SIZES = {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256}
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
        "And God said, Let there be light: and there was light. And God saw the light, that it was good: and "
        "God divided the light from the darkness. And God called the light Day, and the darkness he called "
        "Night.")
PROMPT_LENGTHS = [8, 190, 32, 120, 64, 160, 16, 96]
REQUEST_TIMEOUT_S = 120


def prompt(i):
    n = PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)]
    start = (i * 37) % (len(TEXT) - n)
    return TEXT[start:start + n]


def status_kib(pid, key):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def generate(port, body):
    """One streamed request: (seconds to the first token line, tokens, error or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        start = time.monotonic()
        conn.request("POST", "/v1/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None, 0, "status %d: %s" % (resp.status, resp.read()[:200])
        first, tokens, done = None, 0, False
        while True:
            line = resp.readline()
            if not line:
                break
            j = json.loads(line)
            if "error" in j:
                return first, tokens, j["error"]
            if "token" in j:
                tokens += 1
                if first is None:
                    first = time.monotonic() - start
            if j.get("done"):
                done = True
        return first, tokens, None if done else "the stream ended without its summary"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return None, 0, repr(e)
    finally:
        conn.close()


def load(port, clients, seconds, max_tokens, offset=0):
    """`clients` threads sending requests one after the other until `seconds` pass."""
    ttft, tokens, errors, lock = [], [0], [], threading.Lock()
    begin = time.monotonic()
    deadline = begin + seconds

    def client(c):
        i = 0
        time.sleep(0.05 * c)
        while time.monotonic() < deadline:
            body = {"prompt": prompt(offset + c * 101 + i), "max_tokens": max_tokens, "temperature": 0,
                    "stream": True}
            first, n, error = generate(port, body)
            with lock:
                tokens[0] += n
                if first is not None:
                    ttft.append(first)
                if error:
                    errors.append(error)
            i += 1

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 2 * REQUEST_TIMEOUT_S)
    elapsed = time.monotonic() - begin
    return {"tokens": tokens[0], "seconds": elapsed, "ttft": ttft, "errors": errors}


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


class Servers:
    """The servers this run starts, stopped (SIGTERM, then SIGKILL) by pid at the end."""

    def __init__(self, work, run, threads, max_delay_ms):
        self.work, self.run, self.threads, self.max_delay_ms = work, run, threads, max_delay_ms
        self.procs = []

    def start(self, side, allocator):
        port = free_port()
        env = dict(os.environ)
        for key, value in launch_env.environment(allocator, self.threads).items():
            if value:
                env[key] = value
            else:
                env.pop(key, None)
        env.pop("COHORT_BENCH_BIND_CORES", None)
        if side == "cohort":
            cmd = [COHORT, "serve", self.run, "--port", str(port), "--max-batch", "32", "--max-delay-ms",
                   str(self.max_delay_ms), "--compute-threads", str(self.threads), "--threads", "64",
                   "--max-concurrency", "1000", "--max-queue", "1000"]
        else:
            cmd = [PYTHON, os.path.join(ROOT, "bench", "peers", "llm_server.py"),
                   os.path.join(self.run, "model", "final.pt"), str(port), "--max-batch", "32"]
            for k, v in SIZES.items():
                cmd += ["--" + k.replace("_", "-"), str(v)]
        log = open(os.path.join(self.work, "%s-%s-%d.log" % (side, allocator, len(self.procs))), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        deadline = time.monotonic() + 120
        while True:
            if p.poll() is not None:
                sys.exit("%s (%s) exited with %d before answering; see %s" % (side, allocator, p.returncode,
                                                                                log.name))
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    c.close()
                    self.check_allocator(p, side, allocator)
                    return p, port
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.exit("%s (%s) did not answer within 120 s" % (side, allocator))
            time.sleep(0.2)

    def check_allocator(self, p, side, allocator):
        # The peer checks itself (launch_env.verify); for both, the library in the process's maps.
        maps = open("/proc/%d/maps" % p.pid).read()
        loaded = [name for name in ("tcmalloc", "jemalloc") if "lib" + name in maps]
        if loaded != ([] if allocator == "glibc" else [allocator]):
            sys.exit("%s runs with %s, the benchmark expects %s" % (side, loaded or "glibc", allocator))

    def stop_all(self):
        for p in self.procs:
            stop(p)


def train(work, steps):
    subprocess.run([os.path.join(ROOT, "scripts", "prepare-kjv.sh")], check=True, stdout=subprocess.DEVNULL,
                   timeout=1800)
    run = os.path.join(work, "run")
    sets = ["training.max_steps=%d" % steps, "training.batch_size=4", "distribution.procs_per_node=1",
            "checkpoint.enabled=false", "data.eval.kind=none", "output.progress=off", "training.precision=fp32"]
    sets += ["model.%s=%d" % kv for kv in SIZES.items()]
    cmd = [COHORT, "run", os.path.join(ROOT, "examples", "gpt-kjv.yaml"), "--run-dir", run]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit("training failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    return run


def memory(servers, side, clients, max_tokens):
    p, port = servers.start(side, "tcmalloc")
    generate(port, {"prompt": prompt(0), "max_tokens": 4, "temperature": 0, "stream": True})
    idle = status_kib(p.pid, "VmRSS")
    results = [None] * clients

    def one(c):
        results[c] = generate(port, {"prompt": prompt(c), "max_tokens": max_tokens, "temperature": 0,
                                     "stream": True})

    threads = [threading.Thread(target=one, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * REQUEST_TIMEOUT_S)
    peak = status_kib(p.pid, "VmHWM")
    errors = [r[2] for r in results if r is None or r[2]]
    stop(p)
    return {"idle_mib": idle / 1024, "peak_mib": peak / 1024, "per_generation_mib": (peak - idle) / 1024 / clients,
            "errors": len(errors)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="paged cache, continuous batching",
                    help="names the cohort build in the memory table")
    ap.add_argument("--run", help="a trained run of the GPT above (default: train one)")
    ap.add_argument("--steps", type=int, default=20, help="training steps of the run made here")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=5, help="load per measurement, times 1 + clients / 8")
    ap.add_argument("--pairs", type=int, default=2, help="cohort/peer measurements per point, alternated")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads of each side")
    ap.add_argument("--allocators", default="tcmalloc,glibc")
    ap.add_argument("--max-delay-ms", type=float, default=1, help="cohort serve --max-delay-ms")
    ap.add_argument("--prompt-lengths", default=",".join(map(str, PROMPT_LENGTHS)),
                    help="prompt bytes, taken in turn (at most block_size - max_tokens)")
    ap.add_argument("--memory-clients", type=int, default=32, help="0: no memory measurement")
    args = ap.parse_args()
    PROMPT_LENGTHS[:] = [int(n) for n in args.prompt_lengths.split(",")]
    if max(PROMPT_LENGTHS) + args.max_tokens > SIZES["block_size"] or max(PROMPT_LENGTHS) >= len(TEXT):
        sys.exit("serve-llm.sh: prompts of %d bytes and %d tokens pass block_size %d" %
                 (max(PROMPT_LENGTHS), args.max_tokens, SIZES["block_size"]))
    if not os.access(COHORT, os.X_OK):
        sys.exit("serve-llm.sh: build cohort first (scripts/build.sh)")
    # SIGTERM/SIGINT end the run through `finally`: the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("serve-llm.sh: terminated"))
    print(cpu_line(), flush=True)
    work = tempfile.mkdtemp(prefix="cohort-serve-llm-")
    servers = None
    try:
        run = args.run or train(work, args.steps)
        servers = Servers(work, run, args.threads, args.max_delay_ms)
        allocators = args.allocators.split(",")
        levels = [int(c) for c in args.concurrency.split(",")]
        ports = {}
        for allocator in allocators:
            for side in ("cohort", "pytorch peer"):
                ports[(side, allocator)] = servers.start(side, allocator)[1]
        print("model: GPT %s, byte tokens; cohort serve --max-batch 32 --max-delay-ms %g; peer --max-batch 32; "
              "%d intra-op threads each; %d tokens per request, greedy, streamed; prompts of %s bytes" %
              (" ".join("%s=%d" % kv for kv in SIZES.items()), args.max_delay_ms, args.threads, args.max_tokens,
               "/".join(map(str, sorted(PROMPT_LENGTHS)))), flush=True)
        # The same model: a sampled request gives the same tokens on both sides.
        check = {"prompt": TEXT[:100], "max_tokens": 16, "temperature": 0.8, "top_k": 20, "seed": 3}
        answers = {}
        for key, port in ports.items():
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
            c.request("POST", "/v1/generate", body=json.dumps(check))
            answers[key] = json.loads(c.getresponse().read())["tokens"]
            c.close()
        same = len({tuple(a) for a in answers.values()}) == 1
        print("the same sampled tokens on every server: %s" % ("yes" if same else "NO: %s" % answers), flush=True)
        for port in ports.values():
            load(port, 2, 1, 8)  # warm-up
        runs = {}
        for pair in range(args.pairs):
            for c in levels:
                for allocator in allocators:
                    sides = ["cohort", "pytorch peer"] if pair % 2 == 0 else ["pytorch peer", "cohort"]
                    for side in sides:
                        r = load(ports[(side, allocator)], c, args.seconds * (1 + c / 8), args.max_tokens,
                                 offset=pair)
                        runs.setdefault((side, allocator, c), []).append(r)
                        print("  pair %d  %-12s %-8s c=%-3d %7.1f tokens/s  first token p50 %6.0f ms  p99 %6.0f ms"
                              "  (%d requests, %d errors)" %
                              (pair + 1, side, allocator, c, r["tokens"] / r["seconds"],
                               1e3 * percentile(r["ttft"], 50), 1e3 * percentile(r["ttft"], 99), len(r["ttft"]),
                               len(r["errors"])), flush=True)
                        for e in r["errors"][:3]:
                            print("    error: %s" % e, flush=True)
        print()
        print("%-14s %-9s %5s %12s %22s %14s %14s %7s" % ("server", "malloc", "c", "tokens/s", "(runs)",
                                                        "TTFT p50 ms", "TTFT p99 ms", "errors"))
        table = {}
        order = lambda kv: (kv[0][2], allocators.index(kv[0][1]), kv[0][0])  # noqa: E731
        for (side, allocator, c), rs in sorted(runs.items(), key=order):
            rate = statistics.median(r["tokens"] / r["seconds"] for r in rs)
            ttft = [t for r in rs for t in r["ttft"]]
            row = {"tokens_per_s": rate, "runs": [r["tokens"] / r["seconds"] for r in rs],
                   "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
                   "requests": len(ttft), "errors": sum(len(r["errors"]) for r in rs)}
            table["%s|%s|%d" % (side, allocator, c)] = row
            print("%-14s %-9s %5d %12.1f %22s %14.0f %14.0f %7d" % (
                side, allocator, c, rate, " ".join("%.1f" % x for x in row["runs"]), row["ttft_p50_ms"],
                row["ttft_p99_ms"], row["errors"]))
        print()
        for allocator in allocators:
            for c in levels:
                a, b = table.get("cohort|%s|%d" % (allocator, c)), table.get("pytorch peer|%s|%d" % (allocator, c))
                if a and b:
                    print("%s c=%d: cohort %.2fx the peer's tokens/s; TTFT p99 %.0f against %.0f ms" %
                          (allocator, c, a["tokens_per_s"] / b["tokens_per_s"], a["ttft_p99_ms"], b["ttft_p99_ms"]))
        a, b = table.get("cohort|tcmalloc|32"), table.get("pytorch peer|tcmalloc|32")
        if a and b:
            met = a["tokens_per_s"] >= 1.5 * b["tokens_per_s"] and a["ttft_p99_ms"] < b["ttft_p99_ms"]
            print("target at 32 clients (>= 1.5x tokens/s, lower TTFT p99): %s" % ("met" if met else "NOT met"))
        servers.stop_all()
        mem = {}
        if args.memory_clients > 0:
            print()
            print("memory, %d concurrent generations (prompts %s bytes, %d tokens), tcmalloc:" %
                  (args.memory_clients, "/".join(map(str, sorted(PROMPT_LENGTHS))), args.max_tokens))
            print("%-28s %10s %10s %18s %7s" % ("server", "idle MiB", "peak MiB", "MiB per generation", "errors"))
            for side in ("cohort", "pytorch peer"):
                m = memory(servers, side, args.memory_clients, args.max_tokens)
                name = "cohort (%s)" % args.label if side == "cohort" else side
                mem[name] = m
                print("%-28s %10.1f %10.1f %18.2f %7d" % (name, m["idle_mib"], m["peak_mib"],
                                                          m["per_generation_mib"], m["errors"]), flush=True)
        print(json.dumps({"label": args.label, "throughput": table, "memory": mem, "same_tokens": same}))
    finally:
        if servers:
            servers.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
