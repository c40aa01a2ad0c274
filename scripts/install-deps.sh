#!/bin/sh
# Installs everything cohort needs to build, test and run on Debian 12.
# Idempotent: packages already present are left alone; safe to run again.
#
#   scripts/install-deps.sh         # everything: build, run, the whole test suite
#   scripts/install-deps.sh --run   # only what building and running `cohort` needs
#                                   # (scripts/quickstart.sh): no test tools
set -eu

profile=all
case "${1:-}" in
  --run) profile=run ;;
  "") ;;
  *) echo "usage: $0 [--run]" >&2; exit 2 ;;
esac

# To build cohort (lld: the linker, scripts/build.sh) and run its jobs
# (OpenBLAS for the linear layers, libblas-dev for the CBLAS header and link
# the attention kernel calls it through, libsleef-dev for the header of the
# SLEEF LibTorch links, which ATen's AVX2 and AVX-512 vectors include,
# Fashion-MNIST for the Quick start).
RUN_PKGS="build-essential cmake ninja-build ccache pkg-config lld
libtorch-dev libgloo-dev
libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
zlib1g-dev libxxhash-dev libopenblas0-openmp libblas-dev libsleef-dev libdnnl-dev
libcurl4-openssl-dev libssl-dev libcpp-httplib-dev openssl
libjpeg62-turbo-dev libturbojpeg0-dev libpng-dev
libsentencepiece-dev libicu-dev
dataset-fashion-mnist"

# To build and run the tests, the benchmarks and the fuzzing (chromium: the
# report page's test renders it headless).
TEST_PKGS="git libgtest-dev libgmock-dev libbenchmark-dev
openmpi-bin libopenmpi-dev
python3-sentencepiece bible-kjv bible-kjv-text
python3 python3-torch python3-torchvision python3-protobuf python3-onnx wrk time
libtcmalloc-minimal4 libjemalloc2
clang libclang-rt-14-dev
etcd-client iproute2 nftables
gdb gdbserver
slurmctld slurmd slurm-client munge
chromium"

PKGS=$RUN_PKGS
[ "$profile" = run ] || PKGS="$PKGS $TEST_PKGS"

# Node.js runs Azurite, the blob storage emulator of the storage tests
# (tests/azurite). A node already on PATH (a newer one) is used as it is.
if [ "$profile" = all ] && ! command -v node >/dev/null 2>&1; then
  PKGS="$PKGS nodejs npm"
fi

missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  echo "cohort: installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -q --no-install-recommends $missing
else
  echo "cohort: all dependencies present"
fi

[ "$profile" = all ] || exit 0

# unpack PACKAGE DIR BINARY: Debian's PACKAGE unpacked into DIR, a directory
# of ours, for packages whose installation would start a system service.
# Skipped when DIR/BINARY is there.
unpack() {
  if [ -x "$2/$3" ]; then
    echo "cohort: $1 present in $2"
    return
  fi
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  echo "cohort: unpacking Debian's $1 into $2"
  debs=$(mktemp -d)
  # apt downloads as the _apt user when it can write there.
  chmod 0755 "$debs"
  if [ "$(id -u)" -eq 0 ]; then chown _apt "$debs" 2>/dev/null || true; fi
  if ! (cd "$debs" && apt-get download -q "$1"); then
    $SUDO apt-get update -q
    (cd "$debs" && apt-get download -q "$1")
  fi
  $SUDO mkdir -p "$2"
  $SUDO dpkg-deb -x "$debs"/"$1"_*.deb "$2"
  rm -rf "$debs"
}

# Prometheus' promtool and server, for the /metrics tests (tests/monitor).
# COHORT_PROMETHEUS_DIR (CMake) must name the same directory.
PROMETHEUS_DIR="${COHORT_PROMETHEUS_DIR:-/opt/cohort/prometheus}"
unpack prometheus "$PROMETHEUS_DIR" usr/bin/prometheus
# etcd, which the elastic tests start on free ports (tests/util/etcd.h).
# COHORT_ETCD_DIR (CMake) must name the same directory.
unpack etcd-server "${COHORT_ETCD_DIR:-/opt/cohort/etcd}" usr/bin/etcd
