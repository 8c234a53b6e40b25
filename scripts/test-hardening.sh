#!/usr/bin/env bash
# The hardening checks that need the nightly toolchain (scripts/test.sh runs this; the rogue-
# peer, soak and valgrind tests run with the rest of `cargo test`):
#   1. every fuzz target for SECONDS (default 20) from the committed corpus; any crash fails;
#   2. Miri on the unsafe code it can run: reduce kernels, stream, wire and id decoding, op
#      validation, and the C ABI's handle tables;
#   3. loom model checks of the stream/event synchronisation (a --cfg loom build).
#   bash scripts/test-hardening.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-hardening.sh
seconds=${1:-20}

echo "== fuzz (${seconds}s per target)"
(
  cd fuzz
  cargo +nightly fuzz build -O
  for t in $(cargo +nightly fuzz list); do
    work=$(mktemp -d)
    # The committed corpus is read only: what the run learns goes to a scratch directory.
    if ! cargo +nightly fuzz run -O "$t" "$work" "corpus/$t" -- \
      -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 >"$work.log" 2>&1; then
      tail -60 "$work.log"
      echo "fuzz: target $t crashed; the input is in fuzz/artifacts/$t/" >&2
      exit 1
    fi
    echo "fuzz $t: $(grep -E '^Done' "$work.log" || echo done)"
    rm -rf "$work" "$work.log"
  done
)

echo "== miri"
cargo +nightly miri test -p hccn-runtime --lib -- reduce:: stream:: wire:: unique_id collectives::check
cargo +nightly miri test -p hccn-capi --no-default-features --lib -- ffi::

echo "== loom"
# A build of its own (the cfg changes every crate's hash), kept apart from the normal target dir.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom LOOM_MAX_PREEMPTIONS=3 \
  cargo test -p hccn-runtime --lib --release -- stream::loom_tests
echo "hardening: ok"
