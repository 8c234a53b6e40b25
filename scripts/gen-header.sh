#!/usr/bin/env bash
# Regenerates include/hccn.h from capi/ with the pinned cbindgen.
set -euo pipefail
cd "$(dirname "$0")/.."
HCCN_UPDATE_HEADER=1 cargo test -q -p hccn-capi --test header committed_header_is_current
echo "include/hccn.h regenerated"
