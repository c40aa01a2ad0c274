#!/bin/sh
# bench/zero-memory.sh: what distribution.zero saves, per rank.
#
#   ./bench/zero-memory.sh [N_EMBD] [N_LAYER]      # default 512 8 (~25M parameters)
#
# Trains examples/gpt-kjv.yaml's model widened to N_EMBD x N_LAYER with
# AdamW for 6 steps (batch 2 x 128 tokens per rank, fp32) at ZeRO stages 0
# to 3 on 2 and 3 ranks, each run in its own processes, all in this one
# run. Prints, per rank, the bytes of parameters, gradients and optimizer
# state it held (its log's "memory held" line; at stage 3 also the most of
# the gathered units it held at once, at stage 2 of the full gradients in
# flight) and its peak resident memory,
# and each run's tokens/s (summary.json, steps 3-6 over all ranks) with its
# ratio to stage 0 at the same world size. Needs ./scripts/prepare-kjv.sh's
# data.
set -eu
cd "$(dirname "$0")/.."
./scripts/prepare-kjv.sh >&2
embd="${1:-512}"
layers="${2:-8}"
out=$(mktemp -d /tmp/cohort-zero-memory.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; gpt n_embd $embd x $layers layers, AdamW, fp32"
for ranks in 2 3; do
  for zero in 0 1 2 3; do
    ./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/z$zero-$ranks" \
        --set distribution.procs_per_node=$ranks --set distribution.zero=$zero \
        --set model.n_embd=$embd --set model.n_layer=$layers --set model.n_head=8 \
        --set model.block_size=128 --set training.batch_size=2 --set training.precision=fp32 \
        --set training.optimizer.name=adamw --set training.max_steps=6 --set training.log_every=2 \
        --set data.eval.kind=none --set checkpoint.enabled=false --set output.save_final=false \
        --set output.progress=off >"$out/log" 2>&1 || { tail -20 "$out/log"; exit 1; }
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
line = re.compile(r"memory held: parameters ([\d.]+) MB, gradients ([\d.]+) MB, optimizer state ([\d.]+) MB "
                  r"\(ZeRO stage (\d)\); peak resident (\d+) MB")
units = re.compile(r"at most ([\d.]+) MB of gathered units at once .*the largest unit is ([\d.]+) MB")
grads = re.compile(r"ZeRO stage 2: at most ([\d.]+) MB of full gradients")
rows = {}
print("ranks | zero | rank | parameters MB | gradients MB | optimizer state MB | gathered units at once MB (largest unit) | peak RSS MB")
for ranks in (2, 3):
    for zero in (0, 1, 2, 3):
        for r in range(ranks):
            text = open(f"{out}/z{zero}-{ranks}/logs/rank-{r}.log").read()
            p, g, o, _, peak = (float(x) for x in line.search(text).groups())
            u = units.search(text)
            g2 = grads.search(text)
            gathered = (f"{float(u.group(1)):.1f} ({float(u.group(2)):.1f})" if u
                        else f"{float(g2.group(1)):.1f} (gradients)" if g2 else "-")
            rows[ranks, zero, r] = (p, g, o, peak)
            print(f"{ranks:>5} | {zero:>4} | {r:>4} | {p:>13.1f} | {g:>12.1f} | {o:>18.1f} | {gathered:>41} | {peak:>11.0f}")
print("ranks | zero | tokens/s | vs stage 0 | optimizer state per rank / stage 0's")
summary = {}
for ranks in (2, 3):
    base = json.load(open(f"{out}/z0-{ranks}/summary.json"))["train_tokens_per_s"]
    for zero in (0, 1, 2, 3):
        tps = json.load(open(f"{out}/z{zero}-{ranks}/summary.json"))["train_tokens_per_s"]
        share = max(rows[ranks, zero, r][2] for r in range(ranks)) / rows[ranks, 0, 0][2]
        summary[f"z{zero}-{ranks}"] = {"tokens_per_s": tps, "optimizer_share": share}
        print(f"{ranks:>5} | {zero:>4} | {tps:>8.0f} | {tps / base:>10.3f} | {share:.3f} (1/N = {1 / ranks:.3f})")
print(json.dumps({"bench": "zero_memory", "runs": summary}))
PY
