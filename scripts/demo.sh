#!/usr/bin/env bash
# Builds vnet, brings up a two-host lab in network namespaces, shows ARP,
# ping and iperf3 from VM A to VM B across the overlay, and removes the lab.
# Extra arguments go to `vnet-lab demo` (e.g. --format raw, --seconds 10).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare
cargo build --release --bins
exec target/release/vnet-lab demo "$@"
