#!/bin/sh
# bench/llama-vs-gpt-kjv.sh: the learning check of a Llama-family model with
# a BPE tokenizer against the byte-level GPT, on the King James Bible.
#
#   ./bench/llama-vs-gpt-kjv.sh [STEPS]     # the GPT's steps; default 600
#
# examples/gpt-kjv.yaml (bytes) and examples/llama-kjv.yaml (a 1024-piece
# BPE that `cohort data tokenize --tokenizer sentencepiece` trains on the
# text) have about the same parameter count (printed). The GPT trains STEPS
# steps; a 40-step run of the Llama measures its speed, and the Llama then
# trains as many steps as take the GPT's training time (run again with the
# steps corrected when the times differ by more than 5%). Both evaluate once,
# at the end, on the whole held-out text (the same last 10% of the bytes for
# both tokenizers), and compare by validation loss per byte, which does not
# depend on the tokenizer. Prints the CPU, each run's parameters, steps,
# training seconds, tokens and bytes per second, and loss per byte. Runs one
# after the other on the whole machine; STEPS 2000 takes about 25 minutes
# on 2 cores.
set -eu
cd "$(dirname "$0")/.."
steps="${1:-600}"
./scripts/prepare-kjv.sh >&2
bytes=/var/tmp/cohort-data/kjv
bpe=/var/tmp/cohort-data/kjv-bpe1024
if [ ! -f "$bpe/train/dataset.json" ]; then
  bible -l80 Gen1:1-Rev22:21 | ./build/cli/cohort data tokenize - "$bpe" --tokenizer sentencepiece \
      --vocab-size 1024 --model-type bpe --no-progress >&2
fi
out=$(mktemp -d /tmp/cohort-llama-gpt.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); bf16 instructions: $(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
run() {  # run NAME JOB STEPS [--set ...]
  name=$1 job=$2 n=$3
  shift 3
  ./build/cli/cohort run "$job" --run-dir "$out/$name" --set training.max_steps="$n" --set training.epochs=1000 \
      --set training.eval_every=0 --set data.eval.limit=0 --set output.progress=off --set checkpoint.enabled=false \
      "$@" >"$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; exit 1; }
}
run gpt examples/gpt-kjv.yaml "$steps" --set data.train.path="$bytes/train" --set data.eval.path="$bytes/val"
run pilot examples/llama-kjv.yaml 40
llama_steps=$(/usr/bin/python3 - "$out" "$steps" <<'PY'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
gpt = json.load(open(f"{out}/gpt/summary.json"))
pilot = json.load(open(f"{out}/pilot/summary.json"))
# Training windows per second are steps per second times the same global batch.
print(max(40, round(steps * pilot["train_images_per_s"] / gpt["train_images_per_s"])))
PY
)
run llama examples/llama-kjv.yaml "$llama_steps"
# A short run's speed is not a long one's (the first steps build kernels):
# once more with the steps scaled by the two training times when they
# differ by more than 5%.
again=$(/usr/bin/python3 - "$out" "$llama_steps" <<'PY'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
def seconds(name):
    s = json.load(open(f"{out}/{name}/summary.json"))
    return s["train_images"] / s["train_images_per_s"]
ratio = seconds("gpt") / seconds("llama")
print(round(steps * ratio) if abs(ratio - 1) > 0.05 else 0)
PY
)
if [ "$again" -gt 0 ]; then
  rm -rf "$out/llama"
  run llama examples/llama-kjv.yaml "$again"
fi
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("model | parameters | steps | training s | tokens/s | bytes/s | val loss per byte | bits per byte")
rows = {}
for name in ("gpt", "llama"):
    s = json.load(open(f"{out}/{name}/summary.json"))
    e = s["eval"]
    steps = s.get("steps", s.get("step", 0))
    bpt = e["loss"] / e["loss_per_byte"]  # bytes per token of the held-out text
    train_s = s["train_images"] / s["train_images_per_s"]
    rows[name] = e["loss_per_byte"]
    print(f"{name:5} | {s['parameters']:>10} | {steps:>5} | {train_s:>10.1f} | {s['train_tokens_per_s']:>8.0f} | "
          f"{s['train_tokens_per_s'] * bpt:>7.0f} | {e['loss_per_byte']:.4f}            | {e['bits_per_byte']:.4f}")
print(f"llama against gpt: {100 * (rows['llama'] - rows['gpt']) / rows['gpt']:+.1f}% validation loss per byte")
print(json.dumps({"bench": "llama_vs_gpt_kjv", "gpt_loss_per_byte": rows["gpt"], "llama_loss_per_byte": rows["llama"]}))
PY
