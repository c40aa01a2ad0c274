#!/bin/sh
# bench/tensor.sh: tensor parallelism against data parallelism and a
# pipeline on the same machine, and what a split holds per rank, in one run.
#
#   ./bench/tensor.sh [ROUNDS] [N_EMBD] [N_LAYER]      # default 2 256 8
#
# Part 1, throughput. Trains examples/gpt-kjv.yaml's model at N_EMBD x
# N_LAYER (8 heads, block_size 128, AdamW, fp32) on 2 ranks of 1 thread,
# global batch 8 windows per step, 14 steps each:
#   dp      R = 2: data parallelism, batch 4 per rank
#   tp      T = 2: each layer split over both ranks, batch 8
#   tp-sp   T = 2 with distribution.sequence_parallel
#   pp      P = 2: a pipeline of N_LAYER/2 blocks per stage, 1F1B, 4
#           micro-batches of 2
# ROUNDS times, interleaved. Prints each run's tokens/s (summary.json, over
# the whole run) with its ratio to dp in the same round, and for tp the
# bytes its exchanges carried per step against Megatron's count (4 sums of
# batch x block_size x n_embd per block).
#
# Part 2, memory. The same model with batch 16 x 128 tokens (activations
# weigh), 4 steps, at T = 1, 2 and 4 (4 ranks on however many cores), and
# T = 2 and 4 with sequence parallelism: each rank's parameters, gradients
# and optimizer state (its log's "memory held" line) and peak resident
# memory, and the state as a fraction of T = 1's; then the same at batch 1,
# and the difference (what 16 x 128 tokens' activations added) as a
# fraction of T = 1's.
# Needs ./scripts/prepare-kjv.sh's data. Then JSON lines.
set -eu
cd "$(dirname "$0")/.."
./scripts/prepare-kjv.sh >&2
rounds="${1:-2}"
embd="${2:-256}"
layers="${3:-8}"
half=$((layers / 2))
out=$(mktemp -d /tmp/cohort-tensor.XXXXXX)
trap 'rm -rf "$out"' EXIT
/usr/bin/python3 - <<'PY'
flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
import os
print(f"cpu: {model}, {os.cpu_count()} cores; features: " +
      " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags))
PY
echo "gpt n_embd $embd x $layers layers, 8 heads, block 128, AdamW, fp32; $rounds rounds"
train() {  # tag, ranks, further --set arguments
  tag=$1
  ranks=$2
  shift 2
  ./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/$tag" \
      --set distribution.procs_per_node="$ranks" --set distribution.threads_per_rank=1 \
      --set model.n_embd="$embd" --set model.n_layer="$layers" --set model.n_head=8 \
      --set model.block_size=128 --set training.precision=fp32 \
      --set training.optimizer.name=adamw --set training.log_every=2 \
      --set data.eval.kind=none --set checkpoint.enabled=false --set output.save_final=false \
      --set output.progress=off "$@" >"$out/log" 2>&1 || { tail -30 "$out/log"; exit 1; }
}
r=1
while [ "$r" -le "$rounds" ]; do
  echo "round $r" >&2
  train "dp-$r" 2 --set training.batch_size=4 --set training.max_steps=14
  train "tp-$r" 2 --set training.batch_size=8 --set training.max_steps=14 --set distribution.tensor=2
  train "tp-sp-$r" 2 --set training.batch_size=8 --set training.max_steps=14 --set distribution.tensor=2 \
      --set distribution.sequence_parallel=true
  train "pp-$r" 2 --set training.batch_size=2 --set training.max_steps=14 --set distribution.pipeline.stages=2 \
      --set distribution.pipeline.micro_batches=4 --set "distribution.pipeline.split=[$half,$half]"
  r=$((r + 1))
done
echo "memory runs" >&2
for b in 16 1; do
  suffix=$([ "$b" = 1 ] && echo "-b1" || true)
  train "mem-t1$suffix" 1 --set training.batch_size=$b --set training.max_steps=4
  for t in 2 4; do
    train "mem-t$t$suffix" $t --set training.batch_size=$b --set training.max_steps=4 --set distribution.tensor=$t
    train "mem-t$t-sp$suffix" $t --set training.batch_size=$b --set training.max_steps=4 \
        --set distribution.tensor=$t --set distribution.sequence_parallel=true
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def summary(tag):
    return json.load(open(f"{out}/{tag}/summary.json"))
print("round | run   | tokens/s | vs dp | exchanged per step (tp: sums MB, all-gathers MB; Megatron's 4 x B x S x H per block MB)")
runs = {}
for r in range(1, rounds + 1):
    base = summary(f"dp-{r}")["train_tokens_per_s"]
    for kind in ("dp", "tp", "tp-sp", "pp"):
        s = summary(f"{kind}-{r}")
        tps = s["train_tokens_per_s"]
        runs.setdefault(kind, []).append(tps / base)
        t = s.get("tensor")
        extra = (f"{t['sum_bytes_per_step'] / 1e6:.2f}, {t['gather_bytes_per_step'] / 1e6:.2f}; "
                 f"{t['block_sum_bytes_per_step_expected'] / 1e6:.2f}") if t else ""
        print(f"{r:>5} | {kind:<5} | {tps:>8.0f} | {tps / base:>5.3f} | {extra}")
line = re.compile(r"memory held: parameters ([\d.]+) MB, gradients ([\d.]+) MB, optimizer state ([\d.]+) MB "
                  r"\(ZeRO stage \d\); peak resident (\d+) MB")
print("run       | rank | parameters MB | gradients MB | optimizer state MB | state / T=1's | peak RSS MB | "
      "at batch 1 | activations MB | activations / T=1's")
memory = {}
whole = None
acts = None
for tag, ranks in (("mem-t1", 1), ("mem-t2", 2), ("mem-t2-sp", 2), ("mem-t4", 4), ("mem-t4-sp", 4)):
    for rank in range(ranks):
        text = open(f"{out}/{tag}/logs/rank-{rank}.log").read()
        p, g, o, peak = (float(x) for x in line.search(text).groups())
        small = float(line.search(open(f"{out}/{tag}-b1/logs/rank-{rank}.log").read()).groups()[3])
        state = p + g + o
        # What batch 16 x 128 tokens adds over batch 1: the activations.
        act = peak - small
        if whole is None:
            whole, acts = state, act
        memory.setdefault(tag, []).append({"state_mb": state, "peak_rss_mb": peak, "activations_mb": act})
        print(f"{tag:<9} | {rank:>4} | {p:>13.1f} | {g:>12.1f} | {o:>18.1f} | {state / whole:>13.3f} | {peak:>11.0f} | "
              f"{small:>10.0f} | {act:>14.0f} | {act / acts:>.3f}")
print(json.dumps({"bench": "tensor", "ratio_to_dp": runs, "memory": memory}))
PY
