#!/bin/sh
# bench/gpt-memory.sh: what model.recompute: blocks saves.
#
#   ./bench/gpt-memory.sh [BLOCK_SIZE]      # default 512
#
# Runs 4 training steps of examples/gpt-kjv.yaml's model at BLOCK_SIZE on 1
# rank, with model.recompute none and blocks, at batch 1 and batch 16, each
# in its own process, and reads rank 0's peak resident memory (summary.json's
# peak_rss_mb). A run's activation memory is taken as peak(batch 16) -
# peak(batch 1): what grows with the batch. Also prints each run's tokens/s,
# the price of recomputing. Needs ./scripts/prepare-kjv.sh's data.
set -eu
cd "$(dirname "$0")/.."
./scripts/prepare-kjv.sh >&2
block="${1:-512}"
out=$(mktemp -d /tmp/cohort-gpt-memory.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); block_size $block, 4 layers x 4 heads, n_embd 128, fp32"
for recompute in none blocks; do
  for batch in 1 16; do
    ./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/$recompute-$batch" \
        --set distribution.procs_per_node=1 --set training.batch_size=$batch \
        --set model.block_size=$block --set model.recompute=$recompute \
        --set training.precision=fp32 --set training.max_steps=4 --set training.log_every=2 \
        --set data.eval.kind=none --set checkpoint.enabled=false --set output.save_final=false \
        --set output.progress=off >"$out/log" 2>&1 || { tail -20 "$out/log"; exit 1; }
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
peak, tps = {}, {}
for r in ("none", "blocks"):
    for b in (1, 16):
        s = json.load(open(f"{out}/{r}-{b}/summary.json"))
        peak[r, b] = s["peak_rss_mb"]
        tps[r, b] = s["train_tokens_per_s"]
print("recompute | peak MB batch 1 | peak MB batch 16 | activations MB | tokens/s batch 16")
act = {}
for r in ("none", "blocks"):
    act[r] = peak[r, 16] - peak[r, 1]
    print(f"{r:<9} | {peak[r, 1]:>15.0f} | {peak[r, 16]:>16.0f} | {act[r]:>14.0f} | {tps[r, 16]:>8.0f}")
print(f"activation memory with blocks: {100 * (1 - act['blocks'] / act['none']):.0f}% less; "
      f"tokens/s {100 * (tps['blocks', 16] / tps['none', 16] - 1):+.0f}%")
print(json.dumps({"bench": "gpt_memory", "peak_mb": {f"{r}-{b}": v for (r, b), v in peak.items()},
                  "activation_saving": 1 - act["blocks"] / act["none"]}))
PY
