#!/bin/sh
# Configures and builds cohort into ./build (Release, Ninja, ccache when
# present). Extra arguments go to cmake's configure step.
set -eu
cd "$(dirname "$0")/.."
# ccache + precompiled headers: see CMakeLists.txt.
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
