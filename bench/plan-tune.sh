#!/bin/sh
# bench/plan-tune.sh [--repeats N] [--steps S] [--only NAME,...] [--json FILE]:
# `cohort plan --tune` on the examples, and its pick against the hand-set
# job, side by side. See bench/plan_tune.py; docs/plan.md.
set -eu
cd "$(dirname "$0")/.."
[ -x build/cli/cohort ] || { echo "plan-tune.sh: build cohort first (scripts/build.sh)" >&2; exit 2; }
./scripts/prepare-kjv.sh >&2
exec /usr/bin/python3 bench/plan_tune.py "$@"
