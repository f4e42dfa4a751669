#!/usr/bin/env bash
# The soak: three lab hosts under mixed traffic (ping, TCP, UDP,
# broadcasts) while routes change every ~100 ms, an underlay goes down for
# a second every 10 s and a VM relocates every 10 s, for MINUTES (default
# 2; CI runs the test's 1-minute form). Checks no panic, every ping sent
# and none lost away from a move or an outage, no frame malformed, refused
# by network or spoofed, and that vnetd's RSS does not grow; the report
# goes to results/soak-DATE.txt.
# Usage: sudo scripts/soak.sh [MINUTES]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
minutes=${1:-2}
prepare
cargo build -q --workspace --bins
mkdir -p results
report="$PWD/results/soak-$(date +%Y%m%d-%H%M%S).txt"
VNET_SOAK_SECS=$((minutes * 60)) VNET_SOAK_REPORT="$report" \
    cargo test -q -p vnet-lab --test lab -- --ignored --nocapture --exact \
    operations::both_alone::soak_mixed_traffic_under_route_churn_link_flaps_and_relocations
echo "report: $report"
