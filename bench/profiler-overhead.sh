#!/bin/bash
# bench/profiler-overhead.sh: what `cohort run --profile` costs the steps it records.
#
#   ./bench/profiler-overhead.sh [PAIRS] [FIRST-LAST]    # default 6 pairs, steps 20-39
#
# Trains examples/gpt-kjv.yaml (2 ranks) to step LAST + 1, alternately
# without and with --profile FIRST-LAST, PAIRS times, and prints each run's
# steps/s over those steps (rank 0's metrics.jsonl, a record every step),
# the medians, their ratio, each run's peak resident memory of rank 0, and
# the CPU and load average: on a shared machine the runs alternate so that
# the others' load falls on both sides.
set -eu
cd "$(dirname "$0")/.."
pairs="${1:-6}"
range="${2:-20-39}"
first="${range%-*}"
last="${range#*-}"
./scripts/prepare-kjv.sh >&2
out=$(mktemp -d /tmp/cohort-profiler-overhead.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq "$pairs"); do
  for mode in off on; do
    dir="$out/$mode-$rep"
    extra=()
    [ "$mode" = on ] && extra=(--profile "$range")
    ./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$dir" --set "training.max_steps=$((last + 1))" \
      --set training.log_every=1 --set data.eval.limit=32 --set checkpoint.enabled=false "${extra[@]}" \
      >"$dir.out" 2>"$dir.err"
    peak=$(sed -n 's/.*peak resident \([0-9]*\) MB.*/\1/p' "$dir.err" | tail -1)
    python3 - "$dir/metrics.jsonl" "$mode" "$rep" "$first" "$last" "$peak" <<'PY'
import json, sys
path, mode, rep, first, last, peak = sys.argv[1:]
t = {}
for line in open(path):
    j = json.loads(line)
    if j.get("event") == "train":
        t[j["step"]] = j["time"]
steps = int(last) - int(first) + 1
print(f"{mode:3} {rep}: {steps / (t[int(last)] - t[int(first) - 1]):.3f} steps/s, peak resident {peak} MB")
PY
  done
done | tee "$out/results"
python3 - "$out/results" <<'PY'
import statistics, sys
runs = {"off": [], "on": []}
for line in open(sys.argv[1]):
    mode, rest = line.split(None, 1)
    runs[mode].append(float(rest.split(":")[1].split()[0]))
off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
print(f"median steps/s: without {off:.3f}, with {on:.3f}; with/without {on / off:.3f}")
PY
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
