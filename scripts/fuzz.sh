#!/bin/sh
# Fuzzes cohort's parsers of outside input with libFuzzer (docs/security.md).
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--build-only] [target...]
#
# Builds the fuzz targets (fuzz/) with clang, ASan and UBSan into
# ./build-fuzz (only the sources they need; ccache when present), then runs
# each target for N seconds (default 20) over a copy of its seed corpus
# fuzz/corpus/<target>, J targets at a time (default: one per core; each
# libFuzzer process uses one). Prints each target's executions and findings and
# exits 1 if any target found something: its input is saved as
# build-fuzz/findings/<target>/crash-*, leak-*, timeout-* or oom-*. Replay
# one with `build-fuzz/<target>_fuzz <file>`; once fixed, copy it into
# fuzz/corpus/<target>/ so that CTest (label fuzz) keeps it as a test.
# Without target names, every target runs. --build-only builds the targets
# and runs nothing (scripts/test.sh builds them while the suite runs).
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=20
jobs=$(nproc)
targets=""
build_only=
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --jobs=*) jobs="${1#*=}"; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets="$targets $1"; shift ;;
  esac
done
# Every fuzz/<target>_fuzz.cc is a target (fuzz/CMakeLists.txt builds the same).
all=$(for f in fuzz/*_fuzz.cc; do basename "$f" _fuzz.cc; done | tr '\n' ' ')
[ -n "$targets" ] || targets="$all"
for t in $targets; do
  case " $all " in *" $t "*) ;; *) echo "fuzz.sh: no target '$t' (targets: $all)" >&2; exit 2 ;; esac
done

clangxx=$(command -v clang++ || true)
if [ -z "$clangxx" ] || [ ! -f "$(clang++ -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]; then
  echo "fuzz.sh: needs clang++ with libFuzzer (Debian: clang, libclang-rt-14-dev; scripts/install-deps.sh)" >&2
  exit 2
fi

export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
list=$(echo $targets | tr ' ' ';')
cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER="$clangxx" \
  -DCMAKE_BUILD_TYPE= "-DCOHORT_FUZZ_TARGETS=$list" >/dev/null
# shellcheck disable=SC2086
cmake --build build-fuzz -j "$(nproc)" --target $(for t in $targets; do printf '%s_fuzz ' "$t"; done)
[ -z "$build_only" ] || exit 0

# ASan: abort on a report (libFuzzer saves the input); LeakSanitizer on.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
work="$root/build-fuzz/work"
rm -rf "$work"
# One target: its verdict in build-fuzz/findings/<target>/status.
fuzz_one() {
  t=$1
  w="$work/$t"
  rm -f "build-fuzz/findings/$t/status"
  mkdir -p "$w/corpus" "$w/tmp" "build-fuzz/findings/$t"
  cp fuzz/corpus/"$t"/* "$w/corpus/"
  st=0
  # Scratch files of the targets go to $w/tmp, removed after each run.
  TMPDIR="$w/tmp" "build-fuzz/${t}_fuzz" "$w/corpus" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$t/" \
    >"build-fuzz/findings/$t/fuzz.log" 2>&1 || st=$?
  echo "$st" >"build-fuzz/findings/$t/status"
  rm -rf "$w"
}
# `jobs` lanes, each running every jobs-th target in turn.
echo "== fuzzing $(echo $targets | wc -w) targets for ${seconds} s each, $jobs at a time"
lanes=""
lane=0
while [ "$lane" -lt "$jobs" ]; do
  (
    i=0
    for t in $targets; do
      if [ $((i % jobs)) -eq "$lane" ]; then fuzz_one "$t"; fi
      i=$((i + 1))
    done
  ) &
  lanes="$lanes $!"
  lane=$((lane + 1))
done
# shellcheck disable=SC2086
wait $lanes || true
failed=""
summary=""
for t in $targets; do
  log="build-fuzz/findings/$t/fuzz.log"
  status=$(cat "build-fuzz/findings/$t/status" 2>/dev/null || echo 1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$status" -ne 0 ]; then
    failed="$failed $t"
    echo "== $t: FINDING (exit $status): $(ls -t build-fuzz/findings/$t | grep -v -e fuzz.log -e status | head -1)"
    grep -E "cohort fuzz finding|ERROR: |runtime error|terminate called|what\(\)" "$log" | head -5 | sed 's/^/   /'
    echo "   log: $log"
  fi
  verdict="no finding"
  [ "$status" -eq 0 ] || verdict="FINDING"
  summary="$summary
  $t: ${runs:-?} executions in ${seconds} s, $verdict"
done
rm -rf "$work"
echo "== fuzzing summary:$summary"
if [ -n "$failed" ]; then
  echo "fuzz.sh: findings in:$failed (inputs in build-fuzz/findings/)" >&2
  exit 1
fi
