#!/usr/bin/env bash
# The full soak: OPS (default 10000) random collectives on 4 ranks under hccnrun, every result
# checked exactly; prints each rank's SOAK line (VmRSS after malloc_trim by tenth of the run, and
# open descriptors at warm-up, peak and end).
#   bash benches/soak.sh [OPS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
ops=${1:-10000}
seed=${2:-7}
cargo build --release -p hccn-tools --bin hccnrun -p hccn-tests --bin hccn-soak
exec target/release/hccnrun -n 4 -- target/release/hccn-soak "$ops" "$seed"
