#!/bin/sh
# Installs what cohort needs (Debian 12), builds it with its tests and runs
# the whole suite with CTest. Extra arguments go to ctest (e.g. -L unit).
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Azurite, the blob storage emulator the storage tests start, pinned by
# tests/azurite/package-lock.json: installed when missing or out of date.
if [ ! -f tests/azurite/node_modules/.package-lock.json ] ||
   [ tests/azurite/package-lock.json -nt tests/azurite/node_modules/.package-lock.json ]; then
  (cd tests/azurite && npm ci --no-audit --no-fund)
fi
./scripts/build.sh
cd build
exec ctest --output-on-failure --timeout 900 -j "$(nproc)" "$@"
