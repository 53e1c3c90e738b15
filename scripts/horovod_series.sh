#!/usr/bin/env bash
# Horovod as hvd_train builds it: 0.28.1's pristine sdist with the patch series of
# patches/horovod-0.28.1 applied (its `series` file, and each patch's header for what and why),
# labelled with the series it carries. scripts/install.sh builds the wheel from that source;
# the tests check the same series against the same sdist.
#
#   bash scripts/horovod_series.sh files        # the patches this stack applies, in order
#   bash scripts/horovod_series.sh version      # 0.28.1+hvdtrain.g1a2b3c4d: the installed version
#   bash scripts/horovod_series.sh sdist [PY]   # the sdist's path, downloaded first with PY's pip
#                                               # when not cached (default python3)
#   bash scripts/horovod_series.sh apply DIR    # applies the series to the unpacked sdist DIR
#
# The version's local label is `hvdtrain.g` and the first 8 hex digits of the SHA-256 of the
# applied patches' diffs, in order: a changed diff is another version (and another cached wheel),
# and `hvd-train doctor` and summary.json's `versions` show which series a Horovod carries.
# (`hvdtrain`, not `hvd_train`: PEP 440 normalizes `_` in a local label to `.`; the `g`, as in
# `git describe`, keeps an all-digit hash from losing its leading zeros the same way.)
# HVD_TRAIN_TF picks the stack (scripts/stack.sh): a patch guarded XLA_OPS=no in `series`
# applies only where the stack sets XLA_OPS=no.
set -euo pipefail
cd "$(dirname "$0")/.."

HOROVOD_VERSION=0.28.1
SERIES=patches/horovod-$HOROVOD_VERSION
# The sdist on PyPI (pip checks the index's hash too; this one also holds for a cached copy).
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
SDIST_DIR="${HVD_TRAIN_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/hvd_train}/horovod-sdist"

# shellcheck source=scripts/stack.sh
. scripts/stack.sh

# series_files: the patches that apply on this stack, one path a line.
series_files() {
  stack_select >/dev/null
  local name guard
  while read -r name guard; do
    case "$name" in ""|\#*) continue ;; esac
    case "$guard" in
      "") ;;
      XLA_OPS=*) [ "$XLA_OPS" = "${guard#XLA_OPS=}" ] || continue ;;
      *) echo "$SERIES/series: unknown guard '$guard' for $name" >&2; return 1 ;;
    esac
    [ -f "$SERIES/$name" ] || { echo "$SERIES/series names $name, which is not there" >&2; return 1; }
    echo "$SERIES/$name"
  done < "$SERIES/series"
}

# The label hashes the diffs alone, from each patch's first `diff`/`---` line: a header is
# documentation, and editing one rebuilds nothing.
series_version() {
  local files
  files=$(series_files)
  # shellcheck disable=SC2086  # paths without spaces
  echo "$HOROVOD_VERSION+hvdtrain.g$(awk 'FNR == 1 { body = 0 } /^(diff |--- )/ { body = 1 } body' $files | sha256sum | cut -c1-8)"
}

sdist() {
  local py=${1:-python3} path="$SDIST_DIR/horovod-$HOROVOD_VERSION.tar.gz" tmp
  if [ ! -f "$path" ]; then
    mkdir -p "$SDIST_DIR"
    tmp=$(mktemp -d "$SDIST_DIR/.download.XXXXXX")
    "$py" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "horovod==$HOROVOD_VERSION" >&2
    mv "$tmp/horovod-$HOROVOD_VERSION.tar.gz" "$path"  # a rename: never half a file
    rm -rf "$tmp"
  fi
  echo "$SDIST_SHA256  $path" | sha256sum -c --quiet - >&2 \
    || { echo "$path is not Horovod $HOROVOD_VERSION's sdist (SHA-256 differs): remove it" >&2; return 1; }
  echo "$path"
}

apply() {
  local dir=$1 file version init
  for file in $(series_files); do
    # --fuzz=0: a patch applies where its context says, or not at all.
    patch -p1 --forward --batch --fuzz=0 -d "$dir" -i "$PWD/$file" \
      || { echo "$file does not apply to $dir" >&2; return 1; }
  done
  version=$(series_version)
  init="$dir/horovod/__init__.py"
  grep -qx "__version__ = '$HOROVOD_VERSION'" "$init" \
    || { echo "$init does not say __version__ = '$HOROVOD_VERSION'" >&2; return 1; }
  sed -i "s/^__version__ = '$HOROVOD_VERSION'\$/__version__ = '$version'/" "$init"
  echo "labelled $init: $version"
}

case "${1:-}" in
  files) series_files ;;
  version) series_version ;;
  sdist) sdist "${2:-}" ;;
  apply) [ -d "${2:-}" ] || { echo "usage: horovod_series.sh apply SDIST_DIR" >&2; exit 2; }; apply "$2" ;;
  *) echo "usage: bash scripts/horovod_series.sh files | version | sdist [PYTHON] | apply SDIST_DIR" >&2; exit 2 ;;
esac
