#!/usr/bin/env bash
# The main job: builds hccn and runs a 4-rank allreduce sweep from 8 B to 64 MiB, printing the
# nccl-tests style bandwidth table (with a correctness check of every element).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --workspace
exec target/release/hccnrun -n "${RANKS:-4}" -- target/release/hccn-perf --op allreduce --dtype fp32 -b 8 -e 64M -f 4 -c
