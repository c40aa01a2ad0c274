"""bench/plan-tune.sh: is `cohort plan --tune`'s pick at least as fast as the
example's hand-set job?

For each example: `cohort plan EXAMPLE --tune` writes EXAMPLE.tuned.yaml; then
the hand-set job and the tuned one run side by side, alternating, REPEATS
times each for STEPS steps, and their throughputs (the median of the steps
after the first two) are compared.

  ./bench/plan-tune.sh [--repeats 3] [--steps 40] [--only fashion-mnist,gpt-kjv] [--json FILE]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

from plan_accuracy import COHORT, ROOT, RUN_SETS, cpu, run, sets, steady

EXAMPLES = [("fashion-mnist", "examples/fashion-mnist.yaml", []),
            ("gpt-kjv", "examples/gpt-kjv.yaml", [])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    work = args.keep or tempfile.mkdtemp(prefix="cohort-plan-tune.")
    os.makedirs(work, exist_ok=True)
    print(f"cpu: {cpu()}", flush=True)
    results = []
    try:
        for name, rel, overrides in EXAMPLES:
            if only and name not in only:
                continue
            job = os.path.join(ROOT, rel)
            d = os.path.join(work, name)
            os.makedirs(d, exist_ok=True)
            tuned = os.path.join(d, "tuned.yaml")
            with open(os.path.join(d, "tune.json"), "w") as f, open(os.path.join(d, "tune.log"), "w") as log:
                r = subprocess.run([COHORT, "plan", job, "--tune", "--json", "--output", tuned] + sets(overrides),
                                   stdout=f, stderr=log, timeout=7200)
            if r.returncode != 0:
                raise SystemExit(f"plan-tune: cohort plan --tune failed for {name} ({d}/tune.log)")
            t = json.load(open(os.path.join(d, "tune.json")))["tune"]
            picked = t["tried"][t["best"]]["setting"]
            speeds = {"hand-set": [], "tuned": []}
            for k in range(args.repeats):
                for label, path in (("hand-set", job), ("tuned", tuned)):
                    rd = os.path.join(d, f"{label}-{k}")
                    over = overrides + RUN_SETS + [f"training.max_steps={args.steps}"]
                    run([COHORT, "run", path, "--run-dir", rd] + sets(over), rd + ".log")
                    speeds[label].append(steady(rd)[1])
            hand, tun = statistics.median(speeds["hand-set"]), statistics.median(speeds["tuned"])
            row = {"example": name, "picked": picked, "tried": len(t["tried"]),
                   "ran": sum(1 for x in t["tried"] if x["ran"]), "hand_set_samples_per_s": speeds["hand-set"],
                   "tuned_samples_per_s": speeds["tuned"], "ratio": tun / hand}
            results.append(row)
            print(f"{name}: tried {row['tried']} ({row['ran']} ran); picked {picked}\n"
                  f"  hand-set {hand:.1f} samples/s {['%.1f' % s for s in speeds['hand-set']]}, "
                  f"tuned {tun:.1f} {['%.1f' % s for s in speeds['tuned']]}: {tun / hand:.2f}x", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        json.dump({"cpu": cpu(), "examples": results}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
