#!/usr/bin/env bash
# Builds vnet, brings up a two-host lab in network namespaces, shows ARP,
# ping and iperf3 from VM A to VM B across the overlay, and removes the lab;
# then the same with vnet's in-kernel (eBPF) fast path.
# Extra arguments go to both `vnet-lab demo` runs (e.g. --format raw, --seconds 10).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare
cargo build --release --bins
echo "===== vnetd's user-space path ====="
target/release/vnet-lab demo "$@"
echo; echo "===== vnetd's in-kernel (eBPF) fast path ====="
target/release/vnet-lab demo --datapath kernel "$@"
