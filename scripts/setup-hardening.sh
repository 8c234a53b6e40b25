#!/usr/bin/env bash
# What the hardening checks need, installed once and reused: a nightly toolchain with Miri (and
# rust-src), cargo-fuzz, and valgrind. Later runs find everything present and return at once.
set -euo pipefail

if ! command -v valgrind >/dev/null 2>&1; then
  echo "setup-hardening: installing valgrind"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends valgrind
fi
if ! command -v rustup >/dev/null 2>&1; then
  echo "setup-hardening: rustup is needed for the nightly toolchain (cargo fuzz, Miri)" >&2
  exit 1
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "setup-hardening: installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
installed=$(rustup +nightly component list --installed)
for c in miri rust-src; do
  if ! grep -q "^$c" <<<"$installed"; then
    echo "setup-hardening: adding nightly component $c"
    rustup +nightly component add "$c"
  fi
done
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "setup-hardening: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
echo "setup-hardening: ready ($(cargo +nightly fuzz --version), $(valgrind --version))"
