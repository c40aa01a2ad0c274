#!/bin/sh
# bench/generate.sh: generation with the key/value cache against without it,
# and tokenization, on the King James Bible.
#
#   ./bench/generate.sh [REPEATS]    # default 3
#
# 1. Trains examples/gpt-kjv.yaml's model (4 x 128 wide, block_size 256) for
#    20 steps on 1 rank: the weights only need to be the example's shapes.
# 2. `cohort generate --tokens 256 --temperature 0 --timing`, with the cache
#    and with --no-kv-cache, alternately, REPEATS times each: tokens/s and
#    the first token's latency (the prompt's forward and one sample), and
#    that both wrote the same text.
# 3. `cohort data tokenize` of the whole text (4.3 MB) with the byte
#    tokenizer and with SentencePiece (bpe, 8000 pieces): the tokens/s it
#    prints (encoding and writing), the time to train the SentencePiece
#    model, and the bytes per token.
# Prints the CPU first. About 3 minutes on 2 cores.
set -eu
cd "$(dirname "$0")/.."
repeats="${1:-3}"
./scripts/prepare-kjv.sh >&2
out=$(mktemp -d /tmp/cohort-generate.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/run" --set training.max_steps=20 \
    --set distribution.procs_per_node=1 --set checkpoint.enabled=false --set data.eval.kind=none \
    --set output.progress=off >"$out/train.log" 2>&1 || { tail -20 "$out/train.log"; exit 1; }
i=1
while [ "$i" -le "$repeats" ]; do
  for mode in cache nocache; do
    flag=""
    [ "$mode" = nocache ] && flag="--no-kv-cache"
    # shellcheck disable=SC2086
    ./build/cli/cohort generate "$out/run" --prompt "And God said" --tokens 256 --temperature 0 \
        --timing $flag >"$out/text-$mode" 2>"$out/timing-$mode-$i"
  done
  cmp -s "$out/text-cache" "$out/text-nocache" || { echo "the cache changed the text" >&2; exit 1; }
  i=$((i + 1))
done
bible -l80 Gen1:1-Rev22:21 >"$out/kjv.txt"
for tok in bytes sentencepiece; do
  start=$(date +%s.%N)
  ./build/cli/cohort data tokenize "$out/kjv.txt" "$out/tok-$tok" --tokenizer "$tok" --vocab-size 8000 \
      --no-progress >"$out/tokenize-$tok"
  end=$(date +%s.%N)
  echo "$start $end" >"$out/wall-$tok"
done
/usr/bin/python3 - "$out" "$repeats" <<'PY'
import re, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
rows = {}
for mode in ("cache", "nocache"):
    rate, first = [], []
    for i in range(1, repeats + 1):
        line = open(f"{out}/timing-{mode}-{i}").read()
        m = re.search(r"([\d.]+) tokens/s; first token ([\d.]+) ms", line)
        rate.append(float(m.group(1)))
        first.append(float(m.group(2)))
    rows[mode] = (statistics.median(rate), min(rate), max(rate), statistics.median(first))
print(f"{'generate 256 tokens':<22} {'tokens/s (median)':>18} {'range':>18} {'first token ms':>15}")
for mode, (med, lo, hi, first) in rows.items():
    name = "key/value cache" if mode == "cache" else "no cache"
    print(f"{name:<22} {med:>18.1f} {f'{lo:.1f} .. {hi:.1f}':>18} {first:>15.1f}")
ratio = rows["cache"][0] / rows["nocache"][0]
print(f"cache / no cache: {ratio:.2f}x tokens/s (the same text)")
print()
for tok in ("bytes", "sentencepiece"):
    text = open(f"{out}/tokenize-{tok}").read()
    m = re.search(r"([\d.]+) MB of text in ([\d.]+) s: (\d+) tokens/s, ([\d.]+) bytes per token", text)
    start, end = map(float, open(f"{out}/wall-{tok}").read().split())
    print(f"tokenize {tok:<14} {int(m.group(3)):>10} tokens/s  {float(m.group(4)):.2f} bytes/token  "
          f"{m.group(1)} MB encoded in {m.group(2)} s; whole command {end - start:.1f} s (training the model included)")
PY
