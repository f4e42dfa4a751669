#!/usr/bin/env bash
# Mutation testing of the pure crates (issue 46), by hand: cargo-mutants
# breaks one line of a crate at a time (a condition inverted, a value
# replaced, a function's body replaced by a default) and runs that crate's
# own tests; a mutant they do not catch is a line no test checks. Not in
# scripts/test.sh (hours on this machine); sharded so that a run fits an
# hour here:
#   ./scripts/mutants.sh                      every crate, every mutant
#   ./scripts/mutants.sh vnet-wire 2/8        shard 2 of 8 of one crate (0/8 the first)
#   ./scripts/mutants.sh --list vnet-core     the mutants only, no build
# Results per crate and shard under results/mutants/CRATE[-K-of-N]/
# (outcomes.json; caught.txt, missed.txt, timeout.txt, unviable.txt);
# the summary line of each is printed, and the missed ones.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_cargo
command -v cargo-mutants >/dev/null || cargo install --locked cargo-mutants
list=0
if [ "${1:-}" = --list ]; then list=1; shift; fi
crates=(vnet-wire vnet-model vnet-core vnet-control vnet-engine vnet-cluster)
[ $# -gt 0 ] && crates=("$1")
shard=${2:-}
# vnet-cluster's scale test at 50 hosts, not 1000: the same checks, 2 s
# a mutant instead of 25 (the thousand are test.sh's).
export VNET_SCALE_HOSTS=50 VNET_SCALE_VMS=10 VNET_SCALE_SIGNED_VMS=2
# The engine's simulator (`sim.rs`: the tests' network, on no data path) is
# the tests' own tool: a mutant of it breaks the harness, not the product.
skip=(--exclude crates/vnet-engine/src/sim.rs)
for c in "${crates[@]}"; do
    if [ "$list" = 1 ]; then
        echo "$c: $(cargo mutants --list -p "$c" "${skip[@]}" | wc -l) mutants"
        continue
    fi
    out="results/mutants/$c${shard:+-${shard/\//-of-}}"
    mkdir -p "$out"
    # A mutant that makes a test loop is stopped at 3x the tests' own time
    # (and 60 s at least); it counts as caught-by-timeout, listed apart.
    cargo mutants -p "$c" "${skip[@]}" ${shard:+--shard "$shard"} --output "$out" \
        --timeout-multiplier 3 --minimum-test-timeout 60 --no-shuffle || true
    m="$out/mutants.out"
    [ -f "$m/outcomes.json" ] || die "cargo mutants wrote no outcomes for $c (see $m)"
    echo "$c${shard:+ shard $shard}: $(wc -l <"$m/caught.txt") caught, $(wc -l <"$m/missed.txt") missed, $(wc -l <"$m/timeout.txt") timed out, $(wc -l <"$m/unviable.txt") unviable"
    sed 's/^/  missed: /' "$m/missed.txt"
done
