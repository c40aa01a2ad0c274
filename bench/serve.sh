#!/bin/sh
# bench/serve.sh [--seconds S] [--size PX] [--repeats R] [--concurrency 1,8,32]:
# `cohort serve` with ResNet-18 under wrk, dynamic batching on and off,
# against the same model in ONNX Runtime (Node.js) and TorchScript in a
# Python HTTP server, in the same run. See bench/serve.py; docs/benchmarks.md.
set -eu
cd "$(dirname "$0")/.."
[ -x build/cli/cohort ] || { echo "serve.sh: build cohort first (scripts/build.sh)" >&2; exit 2; }
command -v wrk >/dev/null || { echo "serve.sh: wrk missing (scripts/install-deps.sh installs it)" >&2; exit 2; }
[ -d tests/onnxruntime/node_modules/onnxruntime-node ] ||
  (cd tests/onnxruntime && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund)
exec /usr/bin/python3 bench/serve.py "$@"
