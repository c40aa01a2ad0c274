#!/bin/sh
# bench/gpt-kjv.sh: examples/gpt-kjv.yaml against its targets.
#
#   ./bench/gpt-kjv.sh [--set key=value ...]    # extra overrides for both runs
#
# Trains the example twice, one run after the other: as written (2 ranks x
# batch 16) and on 1 rank with the same global batch (batch 32, the
# machine's cores as its threads). Prints the CPU, the unigram baseline of
# the text (the validation set's cross-entropy under the training set's byte
# frequencies, in nats per token), each run's wall time, tokens/s and final
# validation loss and perplexity, the two runs' relative difference, and a
# sample from the 2-rank model. About 20 minutes on 2 cores.
set -eu
cd "$(dirname "$0")/.."
./scripts/prepare-kjv.sh >&2
data=/var/tmp/cohort-data/kjv
out=$(mktemp -d /tmp/cohort-gpt-kjv.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); bf16 instructions: $(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for ranks in 2 1; do
  batch=$((32 / ranks))
  start=$(date +%s)
  ./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/run-$ranks" \
      --set distribution.procs_per_node=$ranks --set training.batch_size=$batch \
      --set output.progress=off "$@" >"$out/log-$ranks" 2>&1 || { tail -20 "$out/log-$ranks"; exit 1; }
  echo "$(( $(date +%s) - start ))" >"$out/seconds-$ranks"
done
./build/cli/cohort generate "$out/run-2" --prompt "And God said" --tokens 300 --seed 1 \
    --top-k 10 >"$out/sample" 2>/dev/null
/usr/bin/python3 - "$data" "$out" <<'PY'
import json, math, struct, sys
data, out = sys.argv[1], sys.argv[2]

def counts(path):
    m = json.load(open(f"{path}/dataset.json"))
    c = [0] * m["vocab_size"]
    for s in m["shards"]:
        b = open(f"{path}/{s['name']}", "rb").read()[16:]
        for t in struct.unpack(f"<{len(b) // 2}H", b):
            c[t] += 1
    return c

train, val = counts(f"{data}/train"), counts(f"{data}/val")
n = sum(train)
unigram = -sum(v * math.log(max(train[t], 0.5) / n) for t, v in enumerate(val) if v) / sum(val)
print(f"unigram baseline: {unigram:.4f} nats per token (perplexity {math.exp(unigram):.2f})")
print("ranks x batch | wall s | tokens/s | val loss | perplexity")
loss = {}
for ranks in (2, 1):
    s = json.load(open(f"{out}/run-{ranks}/summary.json"))
    secs = int(open(f"{out}/seconds-{ranks}").read())
    loss[ranks] = s["eval"]["loss"]
    print(f"{ranks} x {32 // ranks:<9} | {secs:>6} | {s['train_tokens_per_s']:>8.0f} | "
          f"{s['eval']['loss']:.4f}   | {s['eval']['perplexity']:.3f}")
print(f"1 rank against 2 ranks: {100 * (loss[1] - loss[2]) / loss[2]:+.2f}% validation loss")
print("sample (2 ranks, --top-k 10 --seed 1):")
print(open(f"{out}/sample").read())
print(json.dumps({"bench": "gpt_kjv", "unigram": unigram, "loss_2_ranks": loss[2], "loss_1_rank": loss[1]}))
PY
