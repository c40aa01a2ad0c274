#!/bin/sh
# bench/serve-llm.sh [--label NAME] [--concurrency 1,8,32] [--seconds S] [--pairs P] [--run RUN]:
# `cohort serve` generating text with a GPT against a PyTorch peer server
# of the same weights (bench/peers/llm_server.py: its own key/value cache,
# continuous batching), same threads and allocator (tcmalloc and glibc), in
# the same run: tokens/s and time to first token at 1, 8 and 32 clients,
# and peak memory per concurrent generation. See bench/serve_llm.py;
# docs/benchmarks.md ("Serving a language model"). About 8 minutes on 2 cores.
set -eu
cd "$(dirname "$0")/.."
[ -x build/cli/cohort ] || { echo "serve-llm.sh: build cohort first (scripts/build.sh)" >&2; exit 2; }
exec timeout -s TERM 3600 /usr/bin/python3 bench/serve_llm.py "$@"
