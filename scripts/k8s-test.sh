#!/usr/bin/env bash
# Issue 49's Kubernetes lab, by hand (not in the README's 30-minute test
# command; a clean clone passes it): installs what it needs, builds
# Kubernetes and containerd from the Go module proxy once
# (scripts/k8s-build.sh, cached under target/k8s/), builds vnet, then runs
# the lab's Kubernetes tests (`k8s::by_hand::*` in
# crates/vnet-lab/tests/lab/k8s.rs, `netpol::by_hand::*` in netpol.rs, and
# `k8s_up::by_hand::*`: `vnet-lab k8s up` and its SIGTERM): a control plane
# on the lab's etcd and three nodes with their own containerd and kubelet,
# vnet applied with
# `kubectl apply -f packaging/kubernetes/vnet.yaml`.
#   sudo ./scripts/k8s-test.sh [TEST-NAME-FILTER]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare runc iptables busybox-static containernetworking-plugins util-linux gcc libc6-dev
cd "$(dirname "$0")/.."
started=$(date +%s)
bash scripts/k8s-build.sh
cargo build --workspace --bins -q
cargo test -p vnet-lab --test lab --no-run -q
export VNET_LAB_TAG="k$$"
log=/tmp/vnet-k8s-test-$$.log
status=0
cargo test -p vnet-lab --test lab -- --ignored --nocapture --test-threads 1 \
    "k8s::by_hand::${1:-}" "netpol::by_hand::${1:-}" "k8s_up::by_hand::${1:-}" \
    >"$log" 2>&1 || status=1
grep -E "^k8s: |^test |test result|panicked" -A1 "$log" | grep -v "^--" || true
n=$(passed "$log")
[ "$status" -eq 0 ] || { echo "k8s-test: FAILED, $n passed, $(($(date +%s) - started)) s (log: $log)"; exit 1; }
# The filter must have run a test: a renamed test passes as 0 run. With
# no filter, each of the three rooms must have run one (the status says
# they passed; a renamed module runs nothing otherwise).
[ "$n" -gt 0 ] || { echo "k8s-test: no test ran (log: $log)"; exit 1; }
if [ -z "${1:-}" ]; then
    for room in k8s netpol k8s_up; do
        grep -q "^test $room::by_hand::" "$log" || { echo "k8s-test: no $room::by_hand test ran (log: $log)"; exit 1; }
    done
fi
echo "k8s-test: $n passed, status $status, $(($(date +%s) - started)) s (log: $log)"
exit $status
