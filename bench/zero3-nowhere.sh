#!/bin/sh
# bench/zero3-nowhere.sh: a GPT whose float32 parameters and AdamW state are
# at least twice one rank's memory limit trains on 4 ranks (docs/zero.md,
# "Built, loaded and saved unit by unit").
#
#   ./bench/zero3-nowhere.sh [N_LAYER] [LIMIT_MIB] [STEPS]   # as root; default 78 1400 6
#
# The model of tests/parallel/zero3_memory_test.cc (n_embd 512, heads of 64,
# block_size 32, the byte tokenizer: N_LAYER 78 is 246.0M parameters, 2816
# MiB with AdamW's state) on 4 ranks started as `cohort worker`, 4 machines
# of one rank each, every rank in a memory cgroup of its own limited to
# LIMIT_MIB (cgroup v1 or v2). Two layouts: ZeRO stage 3, and 4 pipeline
# stages (8 micro-batches of 1, split auto); batch 1 x 32 tokens per rank, STEPS steps,
# a checkpoint every 2, compute.allocator: map. Then 5 ranks, each in a cgroup
# of the same limit, go on at stage 3 from the stage-3 run's newest
# checkpoint for 2 more steps: a checkpoint cut otherwise than the run, read
# one unit at a time. Then the zero3 run is exported (ONNX, TorchScript) in
# a cgroup of EXPORT_MIB (400). Then LoRA (rank 8 on attn, the merged
# final.pt saved) adapts the zero3 run's final.pt as its frozen base on 4
# ranks at stage 3, each in a cgroup of LORA_MIB (700, less than the base's
# 939 MiB of float32). Prints the CPU, each rank's
# peak resident memory (its log's figure) against the limit, steps/s of the
# steps after the first, and each run's exit.
set -eu
cd "$(dirname "$0")/.."
layers="${1:-78}"
limit_mib="${2:-1400}"
steps="${3:-6}"
bin="${COHORT_BIN:-build/cli/cohort}"
. bench/memory-cgroup.sh zero3-nowhere.sh
out=$(mktemp -d /tmp/cohort-zero3-nowhere.XXXXXX)
cleanup() {
  for r in 0 1 2 3 4; do rmdir "$base/cohort-zero3-nowhere.$$.$r" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT
for r in 0 1 2 3 4; do
  mkdir "$base/cohort-zero3-nowhere.$$.$r"
  echo $((limit_mib * 1048576)) > "$base/cohort-zero3-nowhere.$$.$r/$limit_file"
done
sed -n 1,3000p README.md docs/*.md > "$out/corpus.txt"
"$bin" data tokenize "$out/corpus.txt" "$out/tok" --no-progress >/dev/null

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;" \
     "$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
echo "model: n_layer $layers, n_embd 512; limit $limit_mib MiB per rank; $steps steps"

# run TAG DISTRIBUTION [RANKS [STEPS [RESUME [MODEL_KEYS [OUTPUT_KEYS]]]]]:
# the ranks (4), each in its cgroup; prints the figures.
run() {
  tag=$1
  ranks=${3:-4}
  total=${4:-$steps}
  resume=${5:-}
  model_more=${6:-}
  output_more=${7:-}
  cat > "$out/$tag.yaml" <<EOF
name: $tag
model: {arch: gpt, n_layer: $layers, n_head: 8, n_embd: 512, block_size: 32$model_more}
data:
  train: {kind: tokens, path: $out/tok/train}
  loader_threads: 1
distribution: $2
training: {max_steps: $total, batch_size: 1, precision: fp32, log_every: 1, optimizer: {name: adamw, lr: 0.0003}}
checkpoint: {every_steps: 2, every_epochs: 0, when_behind: wait}
output: {progress: off$output_more}
compute: {allocator: map}
EOF
  port=$((20000 + $$ % 20000))
  pids=""
  for r in $(seq 0 $((ranks - 1))); do
    RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    COHORT_MACHINE_ID=machine-$r sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh \
      "$base/cohort-zero3-nowhere.$$.$r" "$bin" worker "$out/$tag.yaml" --run-dir "$out/$tag" \
      ${resume:+--resume "$resume"} \
      > "$out/$tag-$r.out" 2>&1 &
    pids="$pids $!"
  done
  r=0
  for p in $pids; do
    code=0
    wait "$p" || code=$?
    peak=$(grep -o 'peak resident [0-9]*' "$out/$tag/logs/rank-$r.log" 2>/dev/null | awk '{print $3}' | sort -n | tail -1)
    echo "$tag rank $r: exit $code, peak resident ${peak:-?} MiB of $(($(cat "$base/cohort-zero3-nowhere.$$.$r/$limit_file") / 1048576))"
    grep -o 'cut otherwise than this run: one unit at a time' "$out/$tag/logs/rank-$r.log" 2>/dev/null | head -1 || true
    r=$((r + 1))
  done
  python3 - "$out/$tag/metrics.jsonl" "$tag" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
times = [r["time"] for r in rows if "time" in r and "loss" in r]
if len(times) > 2:
    print(f"{sys.argv[2]}: {(len(times) - 2) / (times[-1] - times[1]):.3f} steps/s (steps 2..{len(times)})")
EOF
}
run zero3 "{zero: 3, threads_per_rank: 1, max_restarts: 0}"
run pipeline "{threads_per_rank: 1, max_restarts: 0, pipeline: {stages: 4, micro_batches: 8}}"
newest=$(ls -d "$out"/zero3/checkpoints/step-* | sort -t- -k2 -n | tail -1)
run zero3-on-5 "{zero: 3, threads_per_rank: 1, max_restarts: 0}" 5 $((steps + 2)) "$newest"

# The zero3 run exported in rank 0's cgroup at EXPORT_MIB (default 400, less
# than half the float32 parameters): each format's exit, peak resident
# memory (GNU time's maximum resident set size) and seconds.
export_mib="${EXPORT_MIB:-400}"
echo $((export_mib * 1048576)) > "$base/cohort-zero3-nowhere.$$.0/$limit_file"
for format in onnx torchscript; do
  code=0
  sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$base/cohort-zero3-nowhere.$$.0" \
    /usr/bin/time -v "$bin" export "$out/zero3" --format "$format" --out "$out/export.$format" \
    > "$out/export-$format.out" 2>&1 || code=$?
  rss=$(awk -F': ' '/Maximum resident set size/ {print int($2 / 1024)}' "$out/export-$format.out")
  secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$out/export-$format.out")
  size=$(du -m "$out/export.$format" 2>/dev/null | cut -f1)
  echo "export $format: exit $code, peak resident ${rss:-?} MiB of $export_mib, ${size:-?} MiB written, $secs"
  rm -f "$out/export.$format"
done

# LoRA over the zero3 run's final.pt, at LORA_MIB per rank.
lora_mib="${LORA_MIB:-700}"
for r in 0 1 2 3; do echo $((lora_mib * 1048576)) > "$base/cohort-zero3-nowhere.$$.$r/$limit_file"; done
run lora "{zero: 3, threads_per_rank: 1, max_restarts: 0}" 4 "$steps" "" \
  ", init_from: $out/zero3/model/final.pt, lora: {rank: 8, targets: [attn]}" ", merge_lora: true"
grep -o '[0-9]* parameters train, [0-9]* are frozen' "$out/lora/logs/rank-0.log" | head -1
