#!/bin/sh
# bench/tensor-nowhere.sh: a GPT in which one block's float32 weights and
# AdamW state exceed one rank's memory limit trains at distribution.tensor
# 4 on 4 ranks; ZeRO stage 3 on the same 4 ranks cannot, as it gathers a
# whole block (docs/parallelism.md, "Tensor parallelism").
#
#   ./bench/tensor-nowhere.sh [N_EMBD] [N_LAYER] [LIMIT_MIB] [STEPS]   # as root; default 2560 2 1000 4
#
# The byte tokenizer, block_size 32, heads of 128: N_EMBD 2560 makes a
# block 78.7M parameters, 1259 MB with its gradients and AdamW's two
# moments. 4 ranks started as `cohort worker`, 4 machines of one rank each
# (their exchanges over Gloo), every rank in a memory cgroup of its own
# limited to LIMIT_MIB (cgroup v1 or v2); batch 1 x 32 tokens, STEPS steps,
# compute.allocator: map. Prints the CPU, each rank's exit and peak resident
# memory (its log's figure) against the limit, and why a run stopped.
set -eu
cd "$(dirname "$0")/.."
embd="${1:-2560}"
layers="${2:-2}"
limit_mib="${3:-1000}"
steps="${4:-4}"
bin="${COHORT_BIN:-build/cli/cohort}"
. bench/memory-cgroup.sh tensor-nowhere.sh
out=$(mktemp -d /tmp/cohort-tensor-nowhere.XXXXXX)
cleanup() {
  for r in 0 1 2 3; do rmdir "$base/cohort-tensor-nowhere.$$.$r" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT
for r in 0 1 2 3; do
  mkdir "$base/cohort-tensor-nowhere.$$.$r"
  echo $((limit_mib * 1048576)) > "$base/cohort-tensor-nowhere.$$.$r/$limit_file"
done
sed -n 1,3000p README.md docs/*.md > "$out/corpus.txt"
"$bin" data tokenize "$out/corpus.txt" "$out/tok" --no-progress >/dev/null

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;" \
     "$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
/usr/bin/python3 - "$embd" "$limit_mib" <<'PY'
import sys
c, limit = int(sys.argv[1]), int(sys.argv[2])
block = 12 * c * c + 13 * c  # weights and biases
print(f"model: n_embd {c}: a block is {block / 1e6:.1f}M parameters, {16 * block / 2**20:.0f} MiB with its "
      f"gradients and AdamW's two moments; the limit is {limit} MiB per rank")
PY

# run TAG DISTRIBUTION: the 4 ranks, each in its cgroup; prints the figures.
run() {
  tag=$1
  cat > "$out/$tag.yaml" <<EOF
name: $tag
model: {arch: gpt, n_layer: $layers, n_head: $((embd / 128)), n_embd: $embd, block_size: 32, vocab_size: 256}
data:
  train: {kind: tokens, path: $out/tok/train}
  loader_threads: 1
distribution: $2
training: {max_steps: $steps, batch_size: 1, precision: fp32, log_every: 1, optimizer: {name: adamw, lr: 0.0003}}
checkpoint: {enabled: false}
output: {progress: off, save_final: false}
compute: {allocator: map}
EOF
  port=$((20000 + $$ % 20000))
  pids=""
  for r in 0 1 2 3; do
    RANK=$r WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    COHORT_MACHINE_ID=machine-$r sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh \
      "$base/cohort-tensor-nowhere.$$.$r" "$bin" worker "$out/$tag.yaml" --run-dir "$out/$tag" \
      > "$out/$tag-$r.out" 2>&1 &
    pids="$pids $!"
  done
  r=0
  for p in $pids; do
    code=0
    wait "$p" || code=$?
    peak=$(grep -o 'peak resident [0-9]*' "$out/$tag/logs/rank-$r.log" 2>/dev/null | awk '{print $3}' | sort -n | tail -1)
    echo "$tag rank $r: exit $code, peak resident ${peak:-?} MiB of $limit_mib"
    r=$((r + 1))
  done
  grep -h -m1 -E 'error|does not fit|killed' "$out/$tag-0.out" "$out/$tag/logs/rank-0.log" 2>/dev/null | head -2 || true
  grep -h -m1 'epoch 1/1' "$out/$tag/logs/rank-0.log" 2>/dev/null || true
}
run tensor4 "{tensor: 4, threads_per_rank: 1, max_restarts: 0}"
run zero3 "{zero: 3, threads_per_rank: 1, max_restarts: 0}"
