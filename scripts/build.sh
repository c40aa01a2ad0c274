#!/bin/sh
# Configures and builds cohort into ./build (Release, Ninja, ccache when
# present). Extra arguments go to cmake's configure step.
#
# --sanitize LIST [--target T] (first arguments): a separate build with
# -fsanitize=LIST (COHORT_SANITIZE in CMakeLists.txt) into build-asan for
# address,undefined, build-tsan for thread, build-san-LIST otherwise; without
# benchmarks and examples, which no test runs; only target T if given (e.g.
# tests-unit). See docs/security.md.
set -eu
cd "$(dirname "$0")/.."
dir=build
target=
if [ "${1:-}" = --sanitize ]; then
  [ $# -ge 2 ] || { echo "usage: $0 --sanitize LIST [--target T] [cmake args]" >&2; exit 2; }
  sanitize=$2
  shift 2
  if [ "${1:-}" = --target ] && [ $# -ge 2 ]; then
    target=$2
    shift 2
  fi
  case $sanitize in
    address,undefined) dir=build-asan ;;
    thread) dir=build-tsan ;;
    *) dir=build-san-$(echo "$sanitize" | tr , -) ;;
  esac
  set -- -DCOHORT_SANITIZE="$sanitize" -DCOHORT_BUILD_BENCH=OFF \
    -DCOHORT_BUILD_EXAMPLES=OFF "$@"
fi
# ccache + precompiled headers: see CMakeLists.txt.
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$dir" -j "$(nproc)" ${target:+--target "$target"}
