#!/bin/sh
# A soak of elastic training under faults between machines
# (tests/elastic/netsoak.cc): three nodes on test hosts in network
# namespaces, a three-member etcd on three more, random faults for
# --minutes (loss, bandwidth and latency on every link; a node partitioned
# or stopped with SIGSTOP for longer than elastic.node_timeout_s; kill -9 of
# ranks and agents; the etcd leader killed; an etcd member partitioned),
# then the job runs to its end and the figures are printed: faults and
# recoveries, time lost per fault, samples never trained and trained twice
# (both must be 0), and whether the final model loads. docs/benchmarks.md
# has a 30-minute run.
#
#   sudo ./scripts/soak.sh --minutes 30 [--seed S] [--faults K,K...] [--json FILE] [--keep DIR]
#
# Needs root (network namespaces, nftables). Builds what it runs into
# ./build first (scripts/build.sh); installs nothing: run
# scripts/install-deps.sh once before.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "soak.sh: needs root (network namespaces, nftables)" >&2
  exit 2
fi
case " $* " in
  *" --minutes "*) ;;
  *) echo "usage: $0 --minutes N [--seed S] [--faults K,K...] [--json FILE] [--keep DIR]" >&2; exit 2 ;;
esac
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
[ -f build/build.ninja ] || ./scripts/build.sh -DCOHORT_BUILD_BENCH=OFF >/dev/null
cmake --build build -j "$(nproc)" --target cohort_netsoak cohort_cli cohort_test_delay_relay >/dev/null
echo "soak on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
exec ./build/tests/cohort_netsoak "$@"
