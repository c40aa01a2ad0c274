#!/bin/sh
# bench/serve-kv-memory.sh: the memory of `cohort serve` holding many
# generations at once, with the paged key/value cache (blocks of 16
# positions) and with one block of the whole context per generation (what
# every generation held before the pages: block_size positions made up front).
#
#   ./bench/serve-kv-memory.sh [GENERATIONS] [BLOCK_SIZE]   # default 32, 1024
#
# Trains examples/gpt-kjv.yaml's model (4 layers, 128 wide) at BLOCK_SIZE for
# 2 steps (the weights do not matter here), serves it twice, and sends
# GENERATIONS streamed requests at once, prompts of 5 to 400 bytes, 48 new
# tokens each (--max-batch GENERATIONS: all of them run together). Prints,
# per setting, the cache pool's bytes (from /metrics: blocks x bytes per
# block, at its peak), the server's resident memory before the requests and
# at its peak (VmHWM), and the time the requests took. Needs
# ./scripts/prepare-kjv.sh's data.
set -eu
cd "$(dirname "$0")/.."
./scripts/prepare-kjv.sh >&2
n="${1:-32}"
block="${2:-1024}"
out=$(mktemp -d /tmp/cohort-serve-kv.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
./build/cli/cohort run examples/gpt-kjv.yaml --run-dir "$out/run" \
    --set distribution.procs_per_node=1 --set model.block_size="$block" \
    --set training.precision=fp32 --set training.max_steps=2 --set training.batch_size=2 \
    --set data.eval.kind=none --set checkpoint.enabled=false --set output.progress=off \
    >"$out/train.log" 2>&1 || { tail -20 "$out/train.log"; exit 1; }
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); gpt 4 layers x 4 heads, n_embd 128, block_size $block, fp32;" \
     "$n generations at once, prompts of 5..400 bytes, 48 new tokens each"
printf '%-34s %14s %14s %14s %10s\n' "cache" "pool MiB" "idle RSS MiB" "peak RSS MiB" "seconds"
for blockTokens in "$block" 16; do
  rm -f "$out/port"
  ./build/cli/cohort serve "$out/run" --port 0 --port-file "$out/port" --max-batch "$n" --max-delay-ms 200 \
      --kv-block-tokens "$blockTokens" --threads "$((n + 4))" --max-concurrency "$((n + 4))" \
      >"$out/serve.log" 2>&1 &
  pid=$!
  i=0
  while [ ! -s "$out/port" ]; do
    i=$((i + 1)); [ $i -lt 600 ] || { cat "$out/serve.log"; exit 1; }
    sleep 0.1
  done
  if [ "$blockTokens" = "$block" ]; then what="one block of $block per generation"; else what="paged, blocks of $blockTokens"; fi
  /usr/bin/python3 - "$(cat "$out/port")" "$pid" "$n" "$what" <<'PY'
import json, sys, threading, time, urllib.request
port, pid, n, what = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
base = f"http://127.0.0.1:{port}"
def rss(field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
def metric(name):
    for line in urllib.request.urlopen(base + "/metrics").read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
idle = rss("VmRSS")
words = "and it came to pass in those days that there went out a decree from caesar augustus ".split()
def run(i):
    length = 5 + (i * 395) // max(n - 1, 1)
    prompt = (" ".join(words[(i + k) % len(words)] for k in range(80)))[:length]
    body = json.dumps({"prompt": prompt, "max_tokens": 48, "seed": i, "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        for _ in r:
            pass
peak_pool = 0
stop = False
def watch():
    global peak_pool
    while not stop:
        blocks, size = metric("cohort_serve_kv_cache_blocks"), metric("cohort_serve_kv_cache_block_bytes")
        peak_pool = max(peak_pool, blocks * size)
        time.sleep(0.05)
w = threading.Thread(target=watch)
w.start()
start = time.time()
threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
seconds = time.time() - start
stop = True
w.join()
peak_pool = max(peak_pool, metric("cohort_serve_kv_cache_blocks") * metric("cohort_serve_kv_cache_block_bytes"))
print(f"{what:<34} {peak_pool / 2**20:14.1f} {idle:14.1f} {rss('VmHWM'):14.1f} {seconds:10.1f}")
print(json.dumps({"bench": "serve-kv-memory", "cache": what, "generations": n, "pool_mib": round(peak_pool / 2**20, 1),
                  "idle_rss_mib": round(idle, 1), "peak_rss_mib": round(rss("VmHWM"), 1), "seconds": round(seconds, 2)}))
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
done
