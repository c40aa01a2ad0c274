#!/bin/sh
# Quick start: install what cohort needs to build and run (Debian 12), build
# the cohort programs only, and train the example job: a small CNN on
# Fashion-MNIST with 2 ranks on this machine. Extra arguments go to
# `cohort run` (e.g. --set training.epochs=2).
#
# A line per stage, the build's progress as it goes, and each stage's time;
# a stage that fails names itself and its log (build/quickstart/<stage>.log)
# and shows the log's last lines. The tests are not built: scripts/test.sh
# builds and runs them (configuring build/ with -DCOHORT_BUILD_TESTS=ON).
set -eu
cd "$(dirname "$0")/.."
logs=build/quickstart
mkdir -p "$logs"
begin=$(date +%s)
times=""

# failed NAME LOG STATUS: says which stage failed and where to read why.
failed() {
  echo "quickstart: stage '$1' failed (exit $3); its log is $2, which ends:" >&2
  tail -n 25 "$2" | sed 's/^/  | /' >&2
  exit 1
}

# stage N NAME LOG: starts a stage; done_stage NAME: ends it.
stage() {
  echo "[$1/3] $2 (log: $3)"
  started=$(date +%s)
}
done_stage() {
  took=$(($(date +%s) - started))
  times="$times, $1 ${took} s"
  echo "      $1: done in ${took} s"
}

# 1. The packages, only those building and running cohort needs.
log=$logs/install.log
stage 1 "installing Debian's packages for building and running cohort" "$log"
./scripts/install-deps.sh --run >"$log" 2>&1 || failed install "$log" $?
grep -E "^cohort: (installing|all dependencies)" "$log" | cut -c1-160 | sed 's/^/      /' || true
done_stage install

# 2. The two programs of the command line (cohort, cohort-torch) and the
# libraries they link; ninja's "[k/N]" lines become a progress line every
# tenth of the way.
log=$logs/build.log
stage 2 "building cohort (the library and the command line, not the tests)" "$log"
status=$logs/build.status
rm -f "$status"
{
  if ./scripts/build.sh --target cohort_cli -DCOHORT_BUILD_TESTS=OFF -DCOHORT_BUILD_BENCH=OFF \
    -DCOHORT_BUILD_EXAMPLES=OFF 2>&1; then echo 0 >"$status"; else echo $? >"$status"; fi
} | tee "$log" | awk '
  /^\[[0-9]+\/[0-9]+\]/ {
    split(substr($1, 2, length($1) - 2), kn, "/")
    pct = int(100 * kn[1] / kn[2])
    if (pct >= next_pct) {
      printf "      build %3d%% (%d of %d steps)\n", pct, kn[1], kn[2]
      fflush()
      next_pct = (int(pct / 10) + 1) * 10
    }
  }'
[ "$(cat "$status" 2>/dev/null)" = 0 ] || failed build "$log" "$(cat "$status" 2>/dev/null || echo ?)"
done_stage build

# 3. Training, its output as it comes (and in the log).
log=$logs/train.log
stage 3 "training examples/fashion-mnist.yaml on 2 ranks" "$log"
status=$logs/train.status
rm -f "$status"
{
  if ./build/cli/cohort run examples/fashion-mnist.yaml "$@" 2>&1; then echo 0 >"$status"; else echo $? >"$status"; fi
} | tee "$log"
[ "$(cat "$status" 2>/dev/null)" = 0 ] || failed training "$log" "$(cat "$status" 2>/dev/null || echo ?)"
done_stage train

echo "quickstart: done in $(($(date +%s) - begin)) s (${times#, })"
