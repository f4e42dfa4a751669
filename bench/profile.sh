#!/usr/bin/env bash
# Profiles the vnetds of a two-host lab under an iperf3 load with perf
# (software cpu-clock sampling: this VM has no hardware counters) and prints
# where the machine's cycles go: by thread, by symbol, and vnet's counters.
# usage: bench/profile.sh [poll|adaptive|notify] [seconds] [vnet-lab up options...]
#   (as root; after cargo build --release), e.g. `adaptive 4 --links encrypt --vm-mtu 65000`
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-adaptive}; secs=${2:-4}; shift $(( $# < 2 ? $# : 2 ))
command -v perf >/dev/null || { apt-get install -y -qq linux-perf >/dev/null; }
out=$(mktemp -d)
target/release/vnet-lab up --mode "$mode" "$@" > "$out/up.log" 2>&1 &
lab=$!
trap 'kill -INT $lab 2>/dev/null; wait $lab 2>/dev/null; rm -rf "$out"' EXIT
for _ in $(seq 100); do grep -q Ctrl-C "$out/up.log" && break; sleep 0.1; done
a=$(grep -o "ns vl[^ ]*h0v0" "$out/up.log" | awk '{print $2}'); b=${a%h0v0}h1v0
ctl_a=$(grep -o "unix:[^ ]*h0.sock" "$out/up.log"); ctl_b=$(grep -o "unix:[^ ]*h1.sock" "$out/up.log")
ip netns exec "$a" ping -c 2 -i 0.2 10.88.1.1 >/dev/null
ip netns exec "$b" iperf3 -s -1 -B 10.88.1.1 >/dev/null 2>&1 &
sleep 0.3
ip netns exec "$a" iperf3 -c 10.88.1.1 -t $((secs + 3)) > "$out/iperf.txt" &
sleep 1.5
perf record -q -a -g -e cpu-clock -F 2000 -o "$out/perf.data" -- sleep "$secs" 2>/dev/null
wait %2 2>/dev/null || true
echo "== iperf3 (VM A -> VM B over vnet, mode $mode)"; grep -E "receiver" "$out/iperf.txt"
echo "== CPU samples by thread"
perf report -i "$out/perf.data" --no-children --sort comm --stdio -g none 2>/dev/null | grep -E "^ +[0-9]" | head -6 || true
echo "== top symbols (all threads)"
perf report -i "$out/perf.data" --no-children --sort comm,sym --stdio -g none 2>/dev/null | grep -E "^ +[0-9]" | head -25 || true
echo "== vnet counters, sending host"
target/release/vnetctl --control "$ctl_a" --json show stats | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
i = d["interfaces"][0]
print("frames from VM:", i["rx_packets"], "avg bytes:", i["rx_bytes"] // max(i["rx_packets"], 1), "wakeups:", i["wakeups"], "dispatch:", i["dispatch"])'
echo "== vnet counters, receiving host"
target/release/vnetctl --control "$ctl_b" --json show stats | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
i = d["interfaces"][0]; g = d["global"]
print("frames to VM:", i["tx_packets"], "ACK frames from VM:", i["rx_packets"], "whole-frame GRO batches:", g["rx_whole_batches"], "reassembled:", g["reasm_completed"], "link wakeups:", g["link_wakeups"])'
