#!/usr/bin/env bash
# The long chaos run: ROUNDS (default 500) jobs of 4 ranks, each hit by one random fault (kill,
# freeze and resume, exit without destroy, a mismatched call, the store frozen) while it trains
# with checked allreduces; prints hangs, silent wrong results and split decisions (all must be 0)
# and how soon the first error followed each fault.
#   bash benches/chaos.sh [ROUNDS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cargo build --release -p hccn-tools --bin hccnrun -p hccn-tests --bin hccn-netfault -p hccn-benches --bin hccn-chaos
exec target/release/hccn-chaos "${1:-500}" "${2:-7}"
