#!/bin/sh
# bench/elastic.sh [REPEATS | accuracy]: time from a node's loss, or arrival, to the
# first step at the new size, by phase, and the steps lost; the same loss
# under torchrun's elastic agent (--rdzv-backend=c10d, Debian's
# python3-torch). `accuracy`: an elastic fashion-mnist run (2 -> 3 -> 2
# nodes) against a fixed one. See bench/elastic.py; docs/benchmarks.md.
set -eu
cd "$(dirname "$0")/.."
[ -x build/cli/cohort ] || { echo "elastic.sh: build cohort first (scripts/build.sh)" >&2; exit 2; }
exec /usr/bin/python3 bench/elastic.py "$@"
