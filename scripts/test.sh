#!/bin/sh
# Installs what cohort needs (Debian 12), builds it with its tests and runs
# the whole suite with CTest. Extra arguments go to ctest (e.g. -L unit).
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
cd build
exec ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@"
