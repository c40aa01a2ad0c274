#!/bin/sh
# Quick start: install what cohort needs (Debian 12), build it, and train the
# example job: a small CNN on Fashion-MNIST with 2 ranks on this machine.
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
exec ./build/cli/cohort run examples/fashion-mnist.yaml "$@"
