"""bench/elastic.sh: how long an elastic job takes to train again after a
membership change, by phase, and how many steps it loses.

cohort (`cohort agent`, store:// on loopback, one node per agent, 1 rank each,
the job of tests/elastic: simple_cnn on synthetic 1x8x8 data, batch 8, rank
0's forward slowed by 8 ms so a step takes ~10 ms):
  loss  3 nodes, one killed with SIGKILL (agent and rank) mid-epoch; the two
        others go on. Phases: detection (kill -> a survivor's rank sees its
        collective fail), hold (writing its state to memory), rendezvous (the
        new round frozen, elastic.last_call_s included), start and take-up
        (the ranks started, the state put together across the nodes), first
        step (the first step applied at the new size).
  join  2 nodes, a third arrives: from the re-form request to the first step
        with 3.
torchrun (Debian's python3-torch, `python3 -m torch.distributed.run
--rdzv-backend=c10d`, --nnodes 2:3, the same shapes in bench/peers/
elastic_step.py, which checkpoints every 50 steps as a torchrun script must;
bench/peers/torchrun.py fixes Debian's torchrun for Python 3.11, see there),
tuned (--rdzv_conf last_call_timeout=1, cohort's last call) and with its
defaults:
  loss  as above: kill -> first step at the new size; steps redone (those
        since the script's last checkpoint).

Each scenario runs REPEATS times; the median and the range are printed, with
the CPU. Times come from the logs' millisecond timestamps (UTC) and the
sample log (COHORT_TEST_SAMPLE_LOG).
"""

import datetime
import glob
import os
import re
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
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch

JOB = """name: elastic-bench
model: {{arch: simple_cnn, num_classes: 4, width: 4, hidden: 16, batch_norm: false, dropout: 0.0}}
data:
  train: {{kind: synthetic, size: 4096, shape: [1, 8, 8], seed: 3}}
  loader_threads: 1
distribution: {{nodes: 2, procs_per_node: 1, threads_per_rank: 1, timeout_s: 60, straggler_factor: 0}}
training: {{epochs: 3, batch_size: 8, seed: 7, log_every: 50, optimizer: {{name: sgd, lr: 0.05}}}}
output: {{dir: {runs}, progress: "off"}}
checkpoint: {{every_steps: 100}}
elastic: {{last_call_s: {last_call}, node_timeout_s: 3, state_dir: {shm}}}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_time(line):
    """Seconds since the epoch of a cohort log line's timestamp (UTC)."""
    m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})", line)
    if not m:
        return None
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def first_time(paths, pattern, after=0.0):
    best = None
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    if pattern in line:
                        t = log_time(line)
                        if t is not None and t >= after and (best is None or t < best):
                            best = t
        except FileNotFoundError:
            pass
    return best


def sample_lines(d):
    """(round, step, unix time) of every step applied (the sample log's
    "<round> <step> -1 <ms>" lines)."""
    out = []
    for p in glob.glob(os.path.join(d, "samples-*.txt")):
        with open(p) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2] == "-1":
                    out.append((int(parts[0]), int(parts[1]), int(parts[3]) / 1000.0))
    return out


def lost_steps(lines):
    """Steps applied in a round at or after where the next round took up."""
    first = {}
    for rd, s, _ in lines:
        first[rd] = min(first.get(rd, s), s)
    rounds = sorted(first)
    lost = set()
    for rd, s, _ in lines:
        later = [first[r] for r in rounds if r > rd]
        if later and s >= later[0]:
            lost.add(s)
    return len(lost)


def wait_until(pred, limit):
    end = time.time() + limit
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


class CohortRun:
    def __init__(self, last_call=1):
        self.dir = tempfile.mkdtemp(prefix="cohort-elastic-bench.")
        self.samples = os.path.join(self.dir, "samples")
        self.shm = os.path.join("/dev/shm", os.path.basename(self.dir))
        os.makedirs(self.samples)
        os.makedirs(self.shm)
        self.job = os.path.join(self.dir, "job.yaml")
        with open(self.job, "w") as f:
            f.write(JOB.format(runs=os.path.join(self.dir, "runs"), shm=self.shm, last_call=last_call))
        self.rdzv = "store://127.0.0.1:%d/bench" % free_port()
        self.run = os.path.join(self.dir, "run")
        self.env = dict(os.environ, COHORT_TEST_SAMPLE_LOG=self.samples,
                        COHORT_FAULT="slow8@rank0:step0:always")
        self.agents = {}

    def start(self, node, nnodes):
        self.agents[node] = subprocess.Popen(
            [COHORT, "agent", self.job, "--nnodes", nnodes, "--rdzv", self.rdzv, "--node-id", node,
             "--run-dir", self.run],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def steps(self):
        return max((s for _, s, _ in sample_lines(self.samples)), default=0)

    def kill(self, node):
        p = self.agents[node]
        os.killpg(p.pid, signal.SIGKILL)  # the agent and its ranks
        p.wait()

    def finish(self):
        for p in self.agents.values():
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        codes = {n: p.returncode for n, p in self.agents.items()}
        return codes

    def logs(self, pattern):
        return glob.glob(os.path.join(self.run, "logs", pattern))

    def cleanup(self):
        for p in self.agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)


def cohort_loss():
    r = CohortRun()
    try:
        r.start("a", "2:3")
        wait_until(lambda: r.agents["a"].poll() is not None or os.path.exists(os.path.join(r.run, "job.yaml")), 10)
        time.sleep(0.3)  # a hosts the store
        r.start("b", "2:3")
        r.start("c", "2:3")
        if not wait_until(lambda: r.steps() > 150, 120):
            raise RuntimeError("the job did not start")
        t_kill = time.time()
        r.kill("c")
        codes = r.finish()
        ranks = r.logs("rank-*.log")
        agents = r.logs("agent-*.log")
        lines = sample_lines(r.samples)
        rounds = sorted({rd for rd, _, _ in lines})
        new_round = rounds[-1]
        t_first = min(t for rd, _, t in lines if rd == new_round)
        t_broke = first_time(ranks, "the round broke", t_kill - 1)
        t_held = first_time(ranks, "held in", t_kill - 1)
        t_frozen = first_time(agents, "round %d: node" % new_round, t_kill - 1)
        t_resumed = first_time(ranks, "resumed from", t_kill - 1)
        redone = lost_steps(lines)
        ok = all(c == 0 for n, c in codes.items() if n != "c")
        return {"detection": t_broke - t_kill, "hold": t_held - t_broke, "rendezvous": t_frozen - t_held,
                "start and take-up": t_resumed - t_frozen, "first step": t_first - t_resumed,
                "total": t_first - t_kill, "steps redone": redone, "completed": ok}
    finally:
        r.cleanup()


def cohort_join():
    r = CohortRun()
    try:
        r.start("a", "2:3")
        time.sleep(0.3)
        r.start("b", "2:3")
        if not wait_until(lambda: r.steps() > 150, 120):
            raise RuntimeError("the job did not start")
        r.start("c", "2:3")
        codes = r.finish()
        ranks = r.logs("rank-*.log")
        agents = r.logs("agent-*.log")
        lines = sample_lines(r.samples)
        new_round = sorted({rd for rd, _, _ in lines})[-1]
        t_first = min(t for rd, _, t in lines if rd == new_round)
        t_asked = first_time(agents, "wait to join")
        t_held = first_time(ranks, "held in")
        t_frozen = first_time(agents, "round %d: node" % new_round)
        t_resumed = first_time(ranks, "resumed from")
        return {"to the step boundary and hold": t_held - t_asked, "rendezvous": t_frozen - t_held,
                "start and take-up": t_resumed - t_frozen, "first step": t_first - t_resumed,
                "total": t_first - t_asked,
                "steps redone": lost_steps(lines),
                "completed": all(c == 0 for c in codes.values())}
    finally:
        r.cleanup()


# torchrun as its users tune it for fast recovery: the rendezvous' last call
# (30 s by default) as short as cohort's elastic.last_call_s. Of the c10d
# backend's settings only join, last_call, close and read timeouts can be
# set in this torch (its keep-alive is fixed at 5 s x 3); the agent checks
# its workers every 0.5 s (--monitor_interval, 5 s by default) either way.
TORCHRUN_TUNED = "last_call_timeout=1"


def torchrun_loss(rdzv_conf=None):
    d = tempfile.mkdtemp(prefix="cohort-torchrun-bench.")
    port = free_port()
    # TMPDIR: torchrun's agents keep their logs in /tmp/torchelastic_*,
    # which a killed agent leaves behind; here they go with `d`.
    env = dict(os.environ, STEP_LOG=os.path.join(d, "steps"), CKPT_PATH=os.path.join(d, "ckpt.pt"),
               TOTAL_STEPS="1200", OMP_NUM_THREADS="1", TMPDIR=d)
    script = os.path.join(ROOT, "bench", "peers", "elastic_step.py")
    agents = {}

    def start(node):
        agents[node] = subprocess.Popen(
            [SYSTEM_PYTHON, os.path.join(ROOT, "bench", "peers", "torchrun.py"), "--nnodes", "2:3",
             "--nproc_per_node", "1",
             "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % port, "--rdzv_id", "bench",
             "--max_restarts", "3", "--monitor_interval", "0.5"]
            + (["--rdzv_conf", rdzv_conf] if rdzv_conf else []) + [script],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def steps():
        out = []
        for p in glob.glob(os.path.join(d, "steps.*")):
            with open(p) as f:
                for line in f:
                    s, t, w = line.split()
                    out.append((int(s), int(t) / 1000.0, int(w)))
        return out

    try:
        start("a")
        time.sleep(1.0)  # a hosts the c10d store
        start("b")
        start("c")
        if not wait_until(lambda: any(w == 3 and s > 150 for s, _, w in steps()), 180):
            raise RuntimeError("torchrun did not start")
        before = max(s for s, _, _ in steps())
        t_kill = time.time()
        os.killpg(agents["c"].pid, signal.SIGKILL)
        agents["c"].wait()
        wait_until(lambda: any(w == 2 and t > t_kill for _, t, w in steps()), 180)
        after = [(s, t) for s, t, w in steps() if w == 2 and t > t_kill]
        first = min(after, key=lambda x: x[1]) if after else None
        for n in ("a", "b"):
            try:
                agents[n].wait(timeout=300)
            except subprocess.TimeoutExpired:
                pass
        if not first:
            return {"total": float("nan"), "steps redone": float("nan"), "completed": False}
        return {"total": first[1] - t_kill, "steps redone": before - (first[0] - 1),
                "completed": True}
    finally:
        for p in agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(d, ignore_errors=True)


def accuracy():
    """examples/fashion-mnist.yaml (4 epochs, cosine, linear LR rule at base
    batch 128): a fixed run of 2 ranks (`cohort run`) against an elastic run
    of 1-rank nodes that starts with 2, admits a third in epoch 2 and loses
    one (SIGKILL) in epoch 3. Returns both test top-1."""
    d = tempfile.mkdtemp(prefix="cohort-elastic-acc.")
    shm = os.path.join("/dev/shm", os.path.basename(d))
    os.makedirs(shm)
    job = os.path.join(ROOT, "examples", "fashion-mnist.yaml")
    common = ["--set", "distribution.threads_per_rank=1", "--set", "output.progress=off",
              "--set", "output.dir=" + os.path.join(d, "runs")]
    try:
        subprocess.run([COHORT, "run", job, "--run-dir", os.path.join(d, "fixed")] + common,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rdzv = "store://127.0.0.1:%d/acc" % free_port()
        run_dir = os.path.join(d, "elastic")
        env = dict(os.environ, COHORT_TEST_SAMPLE_LOG=d)
        extra = common + ["--procs", "1", "--set", "distribution.nodes=2", "--set",
                          "elastic.state_dir=" + shm, "--set", "elastic.last_call_s=1"]
        agents = {}

        def start(node):
            agents[node] = subprocess.Popen(
                [COHORT, "agent", job, "--nnodes", "2:3", "--rdzv", rdzv, "--node-id", node,
                 "--run-dir", run_dir] + extra,
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        steps = lambda: max((s for _, s, _ in sample_lines(d)), default=0)
        start("a")
        time.sleep(0.5)
        start("b")
        wait_until(lambda: steps() > 600, 600)   # into epoch 2 (469 steps per epoch on 2)
        start("c")
        wait_until(lambda: steps() > 1100, 600)  # into epoch 3
        os.killpg(agents["b"].pid, signal.SIGKILL)
        agents["b"].wait()
        for n in ("a", "c"):
            agents[n].wait(timeout=900)

        def top1(run):
            import json
            with open(os.path.join(run, "summary.json")) as f:
                return json.load(f)["eval"]["top1"]

        return {"fixed 2 ranks": top1(os.path.join(d, "fixed")), "elastic 2-3-2": top1(run_dir),
                "steps redone": lost_steps(sample_lines(d))}
    finally:
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


def report(name, runs):
    print("\n%s (%d runs)" % (name, len(runs)))
    for key in runs[0]:
        vals = [r[key] for r in runs]
        if isinstance(vals[0], bool):
            print("  %-32s %s" % (key, "all" if all(vals) else "NOT all (%d of %d)" % (sum(vals), len(vals))))
        elif key == "steps redone":
            print("  %-32s %s" % (key, " ".join(str(v) for v in vals)))
        else:
            print("  %-32s median %.3f s (%.3f .. %.3f)" % (key, statistics.median(vals), min(vals), max(vals)))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "accuracy":
        r = accuracy()
        print("fashion-mnist test top-1: fixed 2 ranks %.4f, elastic 2->3->2 nodes %.4f (difference "
              "%.2f points); steps redone %d" % (r["fixed 2 ranks"], r["elastic 2-3-2"],
                                                 100 * (r["elastic 2-3-2"] - r["fixed 2 ranks"]),
                                                 r["steps redone"]))
        return
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
    flags = [f for f in open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
             if f.startswith("avx") or f in ("fma", "f16c", "amx_tile")]
    print("CPU: %s, %d cores; %s" % (cpu, os.cpu_count(), " ".join(flags)))
    report("cohort: a node killed (3 -> 2 nodes)", [cohort_loss() for _ in range(repeats)])
    report("cohort: a node joins (2 -> 3 nodes)", [cohort_join() for _ in range(repeats)])
    if os.path.exists(SYSTEM_PYTHON):
        for title, conf in (("torchrun --rdzv-backend=c10d, tuned (--rdzv_conf %s, as cohort's "
                             "elastic.last_call_s: 1)" % TORCHRUN_TUNED, TORCHRUN_TUNED),
                            ("torchrun --rdzv-backend=c10d, its defaults (last_call_timeout 30 s)", None)):
            try:
                report(title + ": a node killed (3 -> 2 nodes)", [torchrun_loss(conf) for _ in range(repeats)])
            except Exception as e:  # report what was possible
                print("\n%s: could not be measured: %s" % (title, e))


if __name__ == "__main__":
    main()
