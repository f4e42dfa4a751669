#!/usr/bin/env bash
# Runs the benchmark: native, kernel VXLAN and every vnet path in one run.
#   scripts/bench.sh           the full matrix (MTU 1500/9000, unshaped/10gbit, 3 repeats)
#   scripts/bench.sh --quick   one condition, one repeat, short runs (under 2 minutes)
# Extra arguments go to `vnet-lab bench` (see --help). Results: results/<timestamp>/.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare sockperf openmpi-bin libopenmpi-dev python3-matplotlib tinc wireguard-go wireguard-tools
cargo build --release --bins
mkdir -p target/bench
mpicc -O2 -o target/bench/mpi_pingpong bench/mpi_pingpong.c
exec target/release/vnet-lab bench --mpi target/bench/mpi_pingpong "$@"
