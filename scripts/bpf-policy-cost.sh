#!/bin/bash
# What a policy costs the kernel path, per packet and per program, as the
# kernel itself counts it (kernel.bpf_stats_enabled: each program's
# run_time_ns and run_cnt, read from vnetd's descriptors in /proc/PID/fdinfo).
#
# A two-host lab on the kernel path (`vnet-lab up --datapath kernel`); from
# VM A to VM B, a ping flood without rules, then with the bench's 100 rules
# (`vnet-kernel-vnet-rules100`: deny by default, 99 rules the traffic never
# matches, the last allowing everything) on both hosts. Prints each
# program's ns per run both ways and the difference; the programs are told
# apart by their tag (the wire program is the one with the fewer ns).
#
# usage: sudo scripts/bpf-policy-cost.sh [PINGS]     (default 100000)
# Leaves the machine as it found it: the lab goes with Ctrl-C's signal on
# every exit, and bpf_stats_enabled is set back.
set -euo pipefail
cd "$(dirname "$0")/.."
pings=${1:-100000}
[ "$(id -u)" = 0 ] || { echo "run as root (network namespaces, bpf stats)" >&2; exit 1; }
cargo build -q --release -p vnet-lab -p vnetd -p vnetctl
work=$(mktemp -d /tmp/vnet-bpf-cost.XXXXXX)
old=$(sysctl -n kernel.bpf_stats_enabled)
up=
cleanup() {
    [ -n "$up" ] && kill -INT "$up" 2>/dev/null && wait "$up" 2>/dev/null || true
    sysctl -qw kernel.bpf_stats_enabled="$old"
    rm -rf "$work"
}
trap cleanup EXIT
sysctl -qw kernel.bpf_stats_enabled=1

# The bench's rules (vnet_lab::bench::policy_requests), as control lines.
{
    echo "policy default deny network 0"
    for i in $(seq 0 98); do
        verb=$([ $((i % 2)) = 0 ] && echo allow || echo deny)
        printf 'rule r%03d %s network 0 priority 100 from net 10.201.%d.0/24 proto tcp port %d\n' \
            "$i" "$verb" "$i" $((1000 + i))
    done
    echo "rule r099 allow network 0 priority 100"
} > "$work/rules.conf"

target/release/vnet-lab up --hosts 2 --datapath kernel > "$work/up.log" 2>&1 &
up=$!
for _ in $(seq 180); do grep -q "Ctrl-C removes" "$work/up.log" && break; sleep 1; done
grep -q "Ctrl-C removes" "$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
controls=$(awk '/^host [0-9]/{print $8}' "$work/up.log")
ns_a=$(awk '/vm: ns/{print $3; exit}' "$work/up.log")
ip_b=$(awk '/vm: ns/{n++; if (n == 2) print $5}' "$work/up.log")
dir=$(dirname "$(awk '/^host 0/{print $8}' "$work/up.log" | sed 's/^unix://')")
pids=$(pgrep -f "vnetd .*$dir/" | tr '\n' ' ')
[ -n "$pids" ] || { echo "no vnetd of the lab's found" >&2; exit 1; }

# Each of the lab's vnetds' programs: pid-tag, run_time_ns, run_cnt.
snap() {
    for p in $pids; do
        for f in /proc/"$p"/fdinfo/*; do
            grep -q prog_tag "$f" 2>/dev/null || continue
            awk -v p="$p" '/prog_tag/{t=$2} /run_time_ns/{r=$2} /run_cnt/{c=$2} END{print p "-" t, r, c}' "$f"
        done
    done | sort -u
}
declare -A ns_per_run
measure() {
    ip netns exec "$ns_a" ping -c 200 -i 0.01 -q "$ip_b" > /dev/null
    snap > "$work/$1.a"
    ip netns exec "$ns_a" ping -f -c "$pings" -q "$ip_b" | tail -2
    snap > "$work/$1.b"
    while read -r key ns runs; do ns_per_run[$1,$key]="$ns $runs"; done < <(
        join "$work/$1.a" "$work/$1.b" | awk '{dc = $5 - $3; if (dc > 1000) printf "%s %.1f %d\n", $1, ($4 - $2) / dc, dc}')
}
measure none
for c in $controls; do target/release/vnetctl --control "$c" apply "$work/rules.conf" > /dev/null; done
measure rules
for c in $controls; do
    target/release/vnetctl --control "$c" --json show policy |
        python3 -c 'import json, sys; print("kernel clock:", json.load(sys.stdin)["kernel_clock"])'
done
echo "program (vnetd pid-tag)          ns/run without rules   with 100 rules   difference"
for k in "${!ns_per_run[@]}"; do
    [ "${k%%,*}" = none ] || continue
    key=${k#*,}
    read -r a _ <<< "${ns_per_run[none,$key]}"
    read -r b _ <<< "${ns_per_run[rules,$key]:-0 0}"
    awk -v k="$key" -v a="$a" -v b="$b" 'BEGIN{printf "%-34s %10.1f %18.1f %14.1f\n", k, a, b, b - a}'
done | sort
