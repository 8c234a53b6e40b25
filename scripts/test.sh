#!/usr/bin/env bash
# The whole test suite: formatting, lints, the generated header, unit tests, multi-process
# tests over real sockets, and the C programs under sanitizers. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# valgrind (the C tests), nightly with Miri, cargo-fuzz.
bash scripts/setup-hardening.sh

echo "== format"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== build (libhccn.so, libhccn.a, hccnrun, hccn-perf, test programs)"
cargo build --release --workspace
# Pinned TensorFlow and MindSpore venvs for tests/tests/frameworks_*.rs (reused when present).
bash scripts/setup-frameworks.sh all
bash scripts/setup-python.sh torch  # /opt/hccn/venvs/torch for tests/tests/python*.rs (reused when present)
echo "== tests"
cargo test --release --workspace -- --test-threads=2
echo "== hardening (fuzz briefly, Miri, loom)"
bash scripts/test-hardening.sh
