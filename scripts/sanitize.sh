#!/bin/sh
# Builds cohort with sanitizers and runs its tests under them; what
# `scripts/test.sh --sanitize LIST` runs once the dependencies are installed.
#
#   scripts/sanitize.sh address,undefined [ctest args]   # build-asan, the whole suite
#   scripts/sanitize.sh thread [ctest args]              # build-tsan, label "threaded"
#
# address,undefined: AddressSanitizer (with LeakSanitizer) and UBSan over
# every test; extra arguments narrow it (e.g. -L unit). thread:
# ThreadSanitizer over the tests of cohort's threads (checkpointer, loader,
# shared-memory exchange, watchdog: label "threaded"), extra arguments added.
# Every report of every process, the tests and the cohort ranks they start,
# is written to <build>/sanitizer-reports/<tool>.<pid>; the run fails if any
# exists, so a report in a rank whose exit code a test ignores still counts.
# Suppressions (tests/sanitizers/*.supp) are for reports inside LibTorch,
# Gloo, OpenMP or glibc only, each with its reason; TSan's reports of frees
# inside LibTorch, which no suppression can name, are set aside by
# tests/sanitizers/tsan_filter.py. See docs/security.md.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
[ $# -ge 1 ] || { echo "usage: $0 address,undefined|thread [--build-only] [ctest args]" >&2; exit 2; }
sanitize=$1
shift
# --build-only: build what the run needs, run nothing (scripts/test.sh builds
# it while the suite runs, then runs it).
build_only=
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
# Builds only the tests that run when the selection is one label of
# tests/CMakeLists.txt (its target tests-<label>); otherwise everything.
target=
case $sanitize in
  address,undefined) dir=build-asan ;;
  thread) dir=build-tsan; target=tests-threaded; set -- -L threaded "$@" ;;
  *) echo "sanitize.sh: address,undefined or thread, not '$sanitize'" >&2; exit 2 ;;
esac
if [ $# -eq 2 ] && [ "$1" = -L ] && grep -Eq "LABELS( [a-z]+)* $2[ )]|LABELS $2\)" tests/CMakeLists.txt; then
  target=tests-$2
fi
./scripts/build.sh --sanitize "$sanitize" ${target:+--target "$target"}
[ -z "$build_only" ] || exit 0

supp=$root/tests/sanitizers
reports=$root/$dir/sanitizer-reports
rm -rf "$reports"
mkdir -p "$reports"
# halt_on_error: a UBSan report aborts the process (-fno-sanitize-recover too).
export ASAN_OPTIONS="log_path=$reports/asan:check_initialization_order=1:strict_init_order=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$reports/ubsan:suppressions=$supp/ubsan.supp:print_stacktrace=1:halt_on_error=1"
# exitcode=0: a process with a TSan report does not fail by its exit code;
# the reports decide, after tests/sanitizers/tsan_filter.py (below).
export TSAN_OPTIONS="log_path=$reports/tsan:suppressions=$supp/tsan.supp:second_deadlock_stack=1:exitcode=0"

status=0
# One CTest test per unit file (all its cases in one process) or per case.
(cd "$dir" && ctest --output-on-failure --no-tests=error --timeout 900 -j "$(($(nproc) * 2))" "$@") || status=$?
for f in "$reports"/*; do
  [ -e "$f" ] || continue
  case $(basename "$f") in tsan.*) continue ;; esac
  echo "=== sanitizer report: $f" >&2
  cat "$f" >&2
  status=1
done
# ThreadSanitizer: reports of frees inside LibTorch (its reference counts
# are not instrumented) are set aside by tests/sanitizers/tsan_filter.py,
# which says why; every other report fails the run.
if ls "$reports"/tsan.* >/dev/null 2>&1; then
  python3 "$supp/tsan_filter.py" "$reports"/tsan.* >&2 || status=1
fi
exit $status
