#!/bin/sh
# Installs what cohort needs (Debian 12), builds it with its tests, runs the
# whole suite with CTest, fuzzes the parsers for a bounded time
# (scripts/fuzz.sh), then runs the unit tests again under ASan+UBSan
# (scripts/sanitize.sh). This is what CI runs (.ci/run). Extra arguments go
# to the first ctest (e.g. -L unit).
# --sanitize address,undefined|thread (first argument): the tests under
# sanitizers instead, in their own build (scripts/sanitize.sh).
set -eu
cd "$(dirname "$0")/.."
# Sanitizers: the option is taken here, run after the installation below.
sanitize=
if [ "${1:-}" = --sanitize ]; then
  [ $# -ge 2 ] || { echo "usage: $0 [--sanitize address,undefined|thread] [ctest args]" >&2; exit 2; }
  sanitize=$2
  shift 2
fi
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
# Sanitizers: build-asan or build-tsan instead of build (docs/security.md).
if [ -n "$sanitize" ]; then
  exec ./scripts/sanitize.sh "$sanitize" "$@"
fi
# Without the benchmarks: no test runs them, and CI's 45 minutes on 2 cores
# have no room for compiling them; scripts/bench.sh builds them.
./scripts/build.sh -DCOHORT_BUILD_BENCH=OFF
status=0
# Two slots per core: a test takes two, one that mostly waits one
# (tests/CMakeLists.txt, WAITS).
(cd build && ctest --output-on-failure --timeout 900 -j "$(($(nproc) * 2))" "$@") || status=$?
# Then fuzz every parser of outside input for a bounded time (docs/security.md):
# COHORT_FUZZ_SECONDS per target (default 10; one target per core at a
# time: about 3.5 minutes in all with the clang build on 2 cores); 0 skips it.
fuzz_seconds="${COHORT_FUZZ_SECONDS:-10}"
if [ "$fuzz_seconds" -gt 0 ]; then
  ./scripts/fuzz.sh --seconds "$fuzz_seconds" || status=1
fi
# Then the unit tests under AddressSanitizer and UBSan, in build-asan
# (docs/security.md, "Sanitizers"; about 10 minutes cold); COHORT_SANITIZE_UNIT=0
# skips it.
if [ "${COHORT_SANITIZE_UNIT:-1}" != 0 ]; then
  ./scripts/sanitize.sh address,undefined -L unit || status=1
fi
exit "$status"
