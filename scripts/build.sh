#!/bin/sh
# Configures and builds cohort into ./build (Release, Ninja, lld and ccache
# when present). Extra arguments go to cmake's configure step.
#
#   scripts/build.sh [--target T] [cmake args]   # build/, everything or only target T
#   scripts/build.sh --sanitize LIST [--target T] [cmake args]
#
# --sanitize LIST: a separate build with -fsanitize=LIST (COHORT_SANITIZE in
# CMakeLists.txt) into build-asan for address,undefined, build-tsan for
# thread, build-san-LIST otherwise; without benchmarks and examples, which
# no test runs. --target T: only T (e.g. cohort_cli, the two programs of the
# command line; tests-unit). See docs/security.md.
set -eu
cd "$(dirname "$0")/.."
dir=build
target=
sanitize=
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) [ $# -ge 2 ] || { echo "usage: $0 [--sanitize LIST] [--target T] [cmake args]" >&2; exit 2; }
                sanitize=$2; shift 2 ;;
    --target) [ $# -ge 2 ] || { echo "usage: $0 [--sanitize LIST] [--target T] [cmake args]" >&2; exit 2; }
              target=$2; shift 2 ;;
    *) break ;;
  esac
done
if [ -n "$sanitize" ]; then
  case $sanitize in
    address,undefined) dir=build-asan ;;
    thread) dir=build-tsan ;;
    *) dir=build-san-$(echo "$sanitize" | tr , -) ;;
  esac
  set -- -DCOHORT_SANITIZE="$sanitize" -DCOHORT_BUILD_BENCH=OFF \
    -DCOHORT_BUILD_EXAMPLES=OFF "$@"
  # ASan+UBSan with clang when it has its runtimes (libclang-rt-14-dev):
  # at -O0 it compiled a LibTorch unity batch in 6.9 s and the precompiled
  # header in 5.5 s, where GCC took 13.4 s and 19 s.
  if [ "$sanitize" = address,undefined ] && command -v clang++ >/dev/null 2>&1 &&
     [ -f "$(clang++ -print-resource-dir)/lib/linux/libclang_rt.asan-x86_64.a" ]; then
    set -- -DCMAKE_CXX_COMPILER=clang++ "$@"
  fi
fi
# ccache + precompiled headers: see CMakeLists.txt. With the clone as the
# base directory, paths are hashed relative to it: another clone of the
# same commit (CI's, a colleague's) hits what this one compiled.
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$dir" -j "$(nproc)" ${target:+--target "$target"}
