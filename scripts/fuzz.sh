#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz on stable Rust: --sanitizer
# none; overflow checks and debug assertions on) for MINUTES each, growing
# fuzz/corpus/TARGET; a crash is saved under fuzz/artifacts/TARGET and
# fails the run (copy it to fuzz/regressions/TARGET once fixed, so CI
# replays it). Prints executions and coverage per target, for
# docs/RELIABILITY.md. Usage: scripts/fuzz.sh MINUTES [TARGET...]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_cargo
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked -q
minutes=${1:?usage: scripts/fuzz.sh MINUTES [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire control offload stream reasm vhost)
secs=$((minutes * 60))
mkdir -p results/fuzz
for t in "${targets[@]}"; do
    log="results/fuzz/$t-$(date +%Y%m%d-%H%M%S).log"
    echo "== $t: $minutes min (log $log)"
    (cd fuzz && cargo fuzz run --sanitizer none --debug-assertions -j 1 "$t" "corpus/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 -max_len=70000 -timeout=10) >"$log" 2>&1 || {
        tail -30 "$log"
        die "$t: the fuzzer stopped on a finding (fuzz/artifacts/$t)"
    }
    grep -E "^stat::number_of_executed_units|^stat::average_exec_per_sec|^#[0-9]+.*DONE" "$log" | tail -3
    grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9/]+[a-zA-Z]*" "$log" | tail -1
done
