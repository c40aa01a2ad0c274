#!/bin/sh
# bench/pipeline.sh: pipeline parallelism against data parallelism, and each
# stage's idle time against the schedule's theory, in one run.
#
#   ./bench/pipeline.sh [ROUNDS] [N_EMBD] [N_LAYER]     # default 2 256 8
#
# Trains examples/gpt-kjv.yaml's model at N_EMBD x N_LAYER (blocks of equal
# cost: the stages are balanced) with AdamW in fp32, micro-batches of 4 x
# 128 tokens, on 2 ranks of 1 thread each:
#   dp        data parallelism, accumulate_steps 4 (global batch 32)
#   1f1b-M    a pipeline of 2 stages of N_LAYER/2 blocks each (split by
#             hand: the balanced stages the theory assumes, whatever split
#             auto would measure on a noisy machine), 1F1B, M micro-batches
#             per round (global batch 4 x M), for M = 2, 4, 8, 16
#   gpipe-8   the same with GPipe, M = 8
#   auto-8    1F1B, M = 8, split: auto (rank 0 times the blocks)
# ROUNDS times, the runs interleaved, 14 steps each (the first 2 are
# warm-up in the log; the figures are summary.json's over the whole run).
# Prints the CPU, each run's tokens/s with its ratio to dp in the same round,
# each stage's idle fraction against (P-1)/(M+P-1), its time receiving and
# sending, its parameter + optimizer state and peak resident memory, then
# JSON lines. Needs ./scripts/prepare-kjv.sh's data.
set -eu
cd "$(dirname "$0")/.."
./scripts/prepare-kjv.sh >&2
rounds="${1:-2}"
embd="${2:-256}"
layers="${3:-8}"
half=$((layers / 2))
out=$(mktemp -d /tmp/cohort-pipeline.XXXXXX)
trap 'rm -rf "$out"' EXIT
/usr/bin/python3 - <<'PY'
flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"cpu: {model}; features: " + " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags))
PY
echo "gpt n_embd $embd x $layers layers, block 128, AdamW, fp32, 2 ranks x 1 thread, $rounds rounds"
train() {  # tag, further --set arguments
  tag=$1
  shift
  ./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/$tag" \
      --set distribution.procs_per_node=2 --set distribution.threads_per_rank=1 \
      --set model.n_embd="$embd" --set model.n_layer="$layers" --set model.n_head=8 \
      --set model.block_size=128 --set training.batch_size=4 --set training.precision=fp32 \
      --set training.optimizer.name=adamw --set training.max_steps=14 --set training.log_every=2 \
      --set data.eval.kind=none --set checkpoint.enabled=false --set output.save_final=false \
      --set output.progress=off "$@" >"$out/log" 2>&1 || { tail -30 "$out/log"; exit 1; }
}
r=1
while [ "$r" -le "$rounds" ]; do
  echo "round $r" >&2
  train "dp-$r" --set training.accumulate_steps=4
  for m in 2 4 8 16; do
    train "1f1b-$m-$r" --set distribution.pipeline.stages=2 --set distribution.pipeline.micro_batches=$m \
        --set "distribution.pipeline.split=[$half,$half]"
  done
  train "gpipe-8-$r" --set distribution.pipeline.stages=2 --set distribution.pipeline.micro_batches=8 \
      --set distribution.pipeline.schedule=gpipe --set "distribution.pipeline.split=[$half,$half]"
  train "auto-8-$r" --set distribution.pipeline.stages=2 --set distribution.pipeline.micro_batches=8
  r=$((r + 1))
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = ["1f1b-2", "1f1b-4", "1f1b-8", "1f1b-16", "gpipe-8", "auto-8"]
def summary(tag):
    return json.load(open(f"{out}/{tag}/summary.json"))
print()
print("run      | tokens/s (per round)        | vs dp (median) | stage | idle % | theory % | recv s | end s | send s | state MB | peak RSS MB | held")
results = {}
dp = [summary(f"dp-{r}")["train_tokens_per_s"] for r in range(1, rounds + 1)]
print(f"{'dp':<8} | {', '.join(f'{t:.0f}' for t in dp):<27} | {1.0:>14.3f} |")
for run in runs:
    tps = [summary(f"{run}-{r}")["train_tokens_per_s"] for r in range(1, rounds + 1)]
    ratio = statistics.median(t / d for t, d in zip(tps, dp))
    last = summary(f"{run}-{rounds}")
    stages = last["pipeline"]["per_stage"]
    idle = [statistics.median(summary(f"{run}-{r}")["pipeline"]["per_stage"][s]["idle_frac"]
                              for r in range(1, rounds + 1)) for s in range(len(stages))]
    split = [st["blocks"][1] - st["blocks"][0] for st in stages]
    for s, st in enumerate(stages):
        head = f"{run:<8} | {', '.join(f'{t:.0f}' for t in tps):<27} | {ratio:>14.3f}" if s == 0 else f"{'':<8} | {'':<27} | {'':>14}"
        print(f"{head} | {s:>5} | {100 * idle[s]:>6.1f} | {100 * st['bubble_frac_theory']:>8.1f} | "
              f"{st['recv_s']:>6.2f} | {st['round_end_wait_s']:>5.2f} | {st['send_s']:>6.2f} | {st['state_mb']:>8.1f} | {st['peak_rss_mb']:>11.0f} | "
              f"{st['activations_held_peak']:>4}")
    if run.startswith("auto"):
        print(f"{'':<8}   split chosen in the last round: {split}")
    results[run] = {"tokens_per_s": tps, "vs_dp": ratio, "split": split,
                    "stages": [{"idle_frac": idle[s], "theory": st["bubble_frac_theory"], "recv_s": st["recv_s"],
                                "round_end_wait_s": st["round_end_wait_s"], "send_s": st["send_s"], "state_mb": st["state_mb"], "peak_rss_mb": st["peak_rss_mb"],
                                "held": st["activations_held_peak"]} for s, st in enumerate(stages)]}
whole = summary(f"dp-{rounds}")["memory"]
state = whole["parameter_mb"] + whole["gradient_mb"] + whole["optimizer_state_mb"]
print(f"\ndp: each rank holds the whole model's state: {state:.1f} MB (parameters, gradients, AdamW state)")
print(json.dumps({"bench": "pipeline", "dp_tokens_per_s": dp, "dp_state_mb": state, "runs": results}))
PY
