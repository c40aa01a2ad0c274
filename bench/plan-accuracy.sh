#!/bin/sh
# bench/plan-accuracy.sh [--only NAME,...] [--json FILE] [--keep DIR]: how
# close `cohort plan` comes to the runs it predicts, on twelve settings
# (ResNet-18/50, the GPT example and a GPT of 85M parameters; ZeRO 0-3;
# recompute; 1-2 ranks on this machine and 2 ranks on two network-namespace
# hosts, which needs root; the GPT example in a tensor split of 2 and in 2
# pipeline stages). See bench/plan_accuracy.py; docs/plan.md.
set -eu
cd "$(dirname "$0")/.."
[ -x build/cli/cohort ] || { echo "plan-accuracy.sh: build cohort first (scripts/build.sh)" >&2; exit 2; }
./scripts/prepare-kjv.sh >&2
exec /usr/bin/python3 bench/plan_accuracy.py "$@"
