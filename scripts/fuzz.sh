#!/usr/bin/env bash
# Long, coverage-guided fuzzing with libFuzzer, for developers (CI runs the stable smoke driver
# instead; see fuzz/README.md for why).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: 300 s each, every target
#
# Installs cargo-fuzz from crates.io if it is missing and builds with the stable toolchain acting as
# nightly (RUSTC_BOOTSTRAP=1), which is enough for -Zsanitizer and sanitizer-coverage. New corpus
# entries go to fuzz/corpus/<target>/, crashes to fuzz/artifacts/<target>/ (neither is committed).
# Exits non-zero if any target crashed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"

secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sas_token mqtt_packets http_request twin_json query_parse cluster_wire)

command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
cargo fuzz build

crashed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  printf '\n==> %s for %s s\n' "$t" "$secs"
  if ! cargo fuzz run "$t" "corpus/$t" "seeds/$t" -- -dict="dicts/$t.dict" -max_total_time="$secs" \
       -timeout=20 -rss_limit_mb=3072 -max_len=8192 -artifact_prefix="artifacts/$t/" -print_final_stats=1; then
    crashed+=("$t")
  fi
done
if [ ${#crashed[@]} -gt 0 ]; then
  echo "crashed: ${crashed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
