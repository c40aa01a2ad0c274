#!/bin/sh
# Makes the token datasets examples/gpt-kjv.yaml trains on: the King James
# Bible as Debian's bible-kjv prints it (about 4.3 MB of English), tokenized
# byte by byte, the last 10% held out for validation.
#
#   ./scripts/prepare-kjv.sh [DST]     # default /var/tmp/cohort-data/kjv
#
# Needs bible-kjv and bible-kjv-text (scripts/install-deps.sh installs them)
# and a built cohort (scripts/build.sh). Skipped when DST already holds both
# datasets.
set -eu
cd "$(dirname "$0")/.."
dst="${1:-/var/tmp/cohort-data/kjv}"
if [ -f "$dst/train/dataset.json" ] && [ -f "$dst/val/dataset.json" ]; then
  echo "cohort: $dst holds the token datasets already"
  exit 0
fi
if ! command -v bible >/dev/null 2>&1; then
  echo "cohort: the bible program is missing (apt-get install bible-kjv bible-kjv-text, or ./scripts/install-deps.sh)" >&2
  exit 2
fi
mkdir -p "$(dirname "$dst")"
bible -l80 Gen1:1-Rev22:21 | ./build/cli/cohort data tokenize - "$dst"
