#!/usr/bin/env bash
# Where the kernel path's cycles go, beside the routed baseline (no overlay:
# the same VMs on veths, IP routing in the hosts). For each, a two-host lab,
# one iperf3 TCP stream VM A -> VM B, `perf record -a -g` (software
# cpu-clock: this VM has no hardware counters) in the middle of it, and:
# the rate, the machine's CPU seconds per GB (from /proc/stat, as the bench
# counts them) and the top kernel symbols.
# usage: bench/profile-kernel.sh [seconds]   (as root; after cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-4}
command -v perf >/dev/null || { apt-get install -y -qq linux-perf >/dev/null; }
out=$(mktemp -d)
lab=
cleanup() {
    if [ -n "$lab" ]; then kill -INT "$lab" 2>/dev/null || true; wait "$lab" 2>/dev/null || true; fi
    rm -rf "$out"
}
trap cleanup EXIT
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
for case in routed kernel; do
    if [ "$case" = routed ]; then
        target/release/vnet-lab up --overlay routed > "$out/up.log" 2>&1 &
    else
        target/release/vnet-lab up --datapath kernel --vm-mtu 1438 > "$out/up.log" 2>&1 &
    fi
    lab=$!
    for _ in $(seq 100); do grep -q Ctrl-C "$out/up.log" && break; sleep 0.1; done
    a=$(grep -o "ns vl[^ ]*h0v0" "$out/up.log" | awk '{print $2}'); b=${a%h0v0}h1v0
    ip netns exec "$a" ping -c 2 -i 0.2 10.88.1.1 >/dev/null
    ip netns exec "$b" iperf3 -s -1 -B 10.88.1.1 >/dev/null 2>&1 &
    sleep 0.3
    t0=$(busy)
    ip netns exec "$a" iperf3 -c 10.88.1.1 -t $((secs + 3)) -J > "$out/iperf.json" &
    sleep 1.5
    perf record -q -a -g -e cpu-clock -F 2000 -o "$out/perf.data" -- sleep "$secs" 2>/dev/null
    wait %2 2>/dev/null || true
    t1=$(busy)
    python3 - "$out/iperf.json" "$t0" "$t1" "$case" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["end"]["sum_received"]
gb = r["bytes"] / 1e9
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / 100.0
print(f"== {sys.argv[4]}: {r['bits_per_second'] / 1e9:.2f} Gbit/s, {cpu / gb:.2f} CPU s/GB")
EOF
    perf report -i "$out/perf.data" --no-children --sort sym --stdio -g none 2>/dev/null \
        | grep -E "^ +[0-9]" | head -"${TOP:-22}" || true
    kill -INT "$lab" 2>/dev/null || true; wait "$lab" 2>/dev/null || true; lab=
done
