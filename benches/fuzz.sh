#!/usr/bin/env bash
# Fuzzes every target of fuzz/ for MINUTES minutes each (default 10), starting from the committed
# seed corpus; what the fuzzer learns goes to target/fuzz-corpus/<target>, crashes to
# fuzz/artifacts/<target>/. Exits non-zero on the first crash.
#   bash benches/fuzz.sh [MINUTES] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-hardening.sh
minutes=${1:-10}
shift || true
cd fuzz
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build -O
for t in "${targets[@]}"; do
  mkdir -p "../target/fuzz-corpus/$t"
  echo "== fuzz $t for $minutes min"
  start=$(date +%s)
  cargo +nightly fuzz run -O "$t" "../target/fuzz-corpus/$t" "corpus/$t" -- \
    -max_total_time=$((minutes * 60)) -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 2>&1 \
    | grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)|panicked|SUMMARY|ERROR|Test unit written' || true
  # grep hides libFuzzer's progress lines; the verdict is whether it left a crash behind.
  if compgen -G "artifacts/$t/*" >/dev/null && [ -n "$(find "artifacts/$t" -newermt "@$start" -type f)" ]; then
    echo "fuzz: $t crashed; inputs in fuzz/artifacts/$t/" >&2
    exit 1
  fi
done
echo "fuzz: ${#targets[@]} targets, $minutes min each, no crash"
