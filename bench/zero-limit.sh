#!/bin/sh
# bench/zero-limit.sh: a model whose training does not fit a memory limit at
# ZeRO stage 0 trains under the same limit at stage 3.
#
#   ./bench/zero-limit.sh [N_EMBD] [N_LAYER]     # as root; default 1024 12 (~152M parameters)
#
# Trains examples/gpt-kjv.yaml's model widened to N_EMBD x N_LAYER (heads of 64) on 2 ranks
# with AdamW (fp32, batch 2 x 128 tokens per rank, 4 steps), each run in a
# memory cgroup of its own (cgroup v1 or v2; needs root) that holds the
# launcher and both ranks:
#   1. stage 0 and stage 3 without a limit: the cgroup's peak usage of each;
#   2. both again with the limit set halfway between those peaks.
# Prints the CPU, each run's peak and exit, and the verdict. compute.allocator
# is `system` here: with `keep` (the default) a rank keeps every page it ever
# used, so what it frees between units is not given back to the machine.
# Needs ./scripts/prepare-kjv.sh's data.
set -eu
cd "$(dirname "$0")/.."
./scripts/prepare-kjv.sh >&2
embd="${1:-1024}"
layers="${2:-12}"
if [ -d /sys/fs/cgroup/memory ]; then
  base=/sys/fs/cgroup/memory; limit_file=memory.limit_in_bytes; peak_file=memory.max_usage_in_bytes
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  base=/sys/fs/cgroup; limit_file=memory.max; peak_file=memory.peak
else
  echo "zero-limit.sh: no memory cgroup here (/sys/fs/cgroup)" >&2
  exit 2
fi
out=$(mktemp -d /tmp/cohort-zero-limit.XXXXXX)
group="$base/cohort-zero-limit.$$"
cleanup() {
  rmdir "$group" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

# run TAG ZERO LIMIT_BYTES|max: the job in a fresh cgroup; prints "exit peak_bytes".
run() {
  rmdir "$group" 2>/dev/null || true
  mkdir "$group"
  if [ "$3" != max ]; then
    echo "$3" >"$group/$limit_file"
    [ -f "$group/memory.memsw.limit_in_bytes" ] && echo "$3" >"$group/memory.memsw.limit_in_bytes"
    [ -f "$group/memory.swap.max" ] && echo 0 >"$group/memory.swap.max"
  fi
  status=0
  sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$group" \
    ./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/$1" \
    --set distribution.procs_per_node=2 --set distribution.zero="$2" \
    --set model.n_embd="$embd" --set model.n_layer="$layers" --set model.n_head=$((embd / 64)) \
    --set model.block_size=128 --set training.batch_size=2 --set training.precision=fp32 \
    --set training.optimizer.name=adamw --set training.max_steps=4 --set training.log_every=1 \
    --set compute.allocator=system --set data.eval.kind=none --set checkpoint.enabled=false \
    --set output.save_final=false --set output.progress=off >"$out/$1.log" 2>&1 || status=$?
  peak=$(cat "$group/$peak_file" 2>/dev/null || echo 0)
  echo "$status $peak"
}

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; gpt n_embd $embd x $layers layers, AdamW, fp32, 2 ranks"
set -- $(run free0 0 max)
exit0=$1 peak0=$2
set -- $(run free3 3 max)
exit3=$1 peak3=$2
mb() { echo $(($1 / 1048576)); }
echo "no limit: stage 0 exit $exit0, peak $(mb "$peak0") MB for the job; stage 3 exit $exit3, peak $(mb "$peak3") MB"
if [ "$exit0" -ne 0 ] || [ "$exit3" -ne 0 ] || [ "$peak3" -ge "$peak0" ]; then
  echo "zero-limit.sh: stage 3 needs no less than stage 0 here; no limit to show" >&2
  tail -5 "$out/free0.log" "$out/free3.log" >&2
  exit 1
fi
limit=$(((peak0 + peak3) / 2))
set -- $(run limited0 0 "$limit")
lexit0=$1
set -- $(run limited3 3 "$limit")
lexit3=$1 lpeak3=$2
echo "limit $(mb "$limit") MB for the job ($(mb $((limit / 2))) MB per rank):"
echo "  stage 0: exit $lexit0$( [ "$lexit0" -ne 0 ] && grep -h -m1 -E 'killed|signal|allocate' "$out/limited0.log" | sed 's/^.*\] /: /' || true)"
echo "  stage 3: exit $lexit3, peak $(mb "$lpeak3") MB"
grep -h "memory held\|at most" "$out/limited3/logs/rank-0.log" 2>/dev/null | sed 's/^.*\] /  stage 3 rank 0: /' || true
verdict=$([ "$lexit0" -ne 0 ] && [ "$lexit3" -eq 0 ] && echo "stage 0 does not fit, stage 3 trains" || echo "not shown")
echo "verdict: $verdict"
printf '{"bench": "zero_limit", "n_embd": %s, "n_layer": %s, "peak_mb": {"stage0": %s, "stage3": %s}, "limit_mb": %s, "exit_under_limit": {"stage0": %s, "stage3": %s}}\n' \
  "$embd" "$layers" "$(mb "$peak0")" "$(mb "$peak3")" "$(mb "$limit")" "$lexit0" "$lexit3"
