#!/usr/bin/env bash
# Kubernetes' own network conformance tests on the Kubernetes lab (issue
# 67): builds `e2e.test` and agnhost from the k8s.io/kubernetes module at
# the lab's version (scripts/k8s-build.sh --e2e, cached under target/k8s),
# brings the lab up with the suite's images (`vnet-lab k8s up
# --e2e-images`: three nodes, vnet applied from packaging/kubernetes/vnet.yaml,
# CoreDNS), runs the suite against it, prints passed, failed and skipped
# (each skip's reason, each failure's first line), stops the lab with
# SIGTERM and checks that it left nothing.
#
# The images the suite runs are made without a registry, under the names
# it asks for (crates/vnet-lab/src/k8s/e2e.rs): agnhost from its Go
# package with Debian's bash, dig (bind9-dnsutils), curl, nc
# (netcat-openbsd), ip, ss and getent; jessie-dnsutils from the same tools;
# busybox from Debian's busybox-static; nginx from Debian's nginx package
# (unpacked here, not installed: no service starts); pause from the lab's
# own C source.
#   sudo ./scripts/k8s-e2e.sh [FOCUS-REGEX | netpol]
# (default '\[sig-network\].*\[Conformance\]'; `netpol`: every `Netpol`
# test but the SCTP connectivity ones, which vnet's classifier cannot judge;
# VNET_E2E_SKIP=REGEX skips the tests it matches (`--ginkgo.skip`);
# VNET_E2E_DATAPATH=user for the user path; VNET_K8S_PROXY_MODE=nftables
# for kube-proxy's nftables mode, iptables by default as kubeadm's.)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare runc iptables busybox-static containernetworking-plugins util-linux gcc libc6-dev \
    bind9-dnsutils netcat-openbsd curl bash nftables
cd "$(dirname "$0")/.."
started=$(date +%s)
focus=${1:-'\[sig-network\].*\[Conformance\]'}
skip=${VNET_E2E_SKIP:-}
if [ "$focus" = netpol ]; then
    focus='Netpol'
    skip=${skip:-'SCTPConnectivity'}
fi
skipping=()
[ -n "$skip" ] && skipping=(--ginkgo.skip="$skip")
bash scripts/k8s-build.sh --e2e
BIN=$(bash scripts/k8s-build.sh --print-dir)
if [ ! -x "$BIN/nginx" ]; then
    d=$(mktemp -d)
    (cd "$d" && apt-get download -qq nginx >/dev/null 2>&1 && dpkg -x nginx_*.deb root)
    cp "$d/root/usr/sbin/nginx" "$BIN/nginx"
    rm -rf "$d"
fi
cargo build -q -p vnetd -p vnetctl -p vnet-cni -p vnet-lab --bins
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
out="$PWD/target/k8s/e2e-$(date -u +%Y%m%dT%H%M%S)"
mkdir -p "$out"
echo "k8s-e2e: results in $out (kube-proxy: ${VNET_K8S_PROXY_MODE:-iptables}, pods: ${VNET_E2E_DATAPATH:-kernel} path)"

datapath=()
[ -n "${VNET_E2E_DATAPATH:-}" ] && datapath=(--datapath "$VNET_E2E_DATAPATH")
export VNET_LAB_TAG="e$$"
"$target_dir/debug/vnet-lab" k8s up --e2e-images "${datapath[@]}" --ready-file "$out/ready" \
    >"$out/up.log" 2>&1 &
up=$!
stop_lab() {
    kill -TERM "$up" 2>/dev/null || true
    wait "$up" 2>/dev/null || true
}
trap stop_lab EXIT
t0=$(date +%s)
while [ ! -s "$out/ready" ]; do
    kill -0 "$up" 2>/dev/null || { cat "$out/up.log"; die "the lab did not come up"; }
    [ $(($(date +%s) - t0)) -lt 900 ] || { tail -30 "$out/up.log"; die "the lab not up within 900 s"; }
    sleep 2
done
echo "k8s-e2e: lab up in $(($(date +%s) - t0)) s"
# shellcheck disable=SC1091
source "$out/ready"
# kube-proxy runs in the mode asked on every node: its rules are there
# (nftables: its table `ip kube-proxy`; iptables: the chain KUBE-SERVICES).
mode=${VNET_K8S_PROXY_MODE:-iptables}
mapfile -t node_ns < <(ip netns list | awk -v p="$PREFIX-h" 'index($1, p) == 1 {print $1}')
[ "${#node_ns[@]}" = 3 ] || die "expected the lab's 3 node namespaces ($PREFIX-h*), found: ${node_ns[*]}"
for ns in "${node_ns[@]}"; do
    t0=$(date +%s)
    until if [ "$mode" = nftables ]; then ip netns exec "$ns" nft list table ip kube-proxy >/dev/null 2>&1
          else ip netns exec "$ns" iptables -w -t nat -S KUBE-SERVICES >/dev/null 2>&1; fi; do
        [ $(($(date +%s) - t0)) -lt 60 ] || die "kube-proxy's $mode rules not on $ns within 60 s"
        sleep 1
    done
    echo "k8s-e2e: $ns: kube-proxy's $mode rules in place"
done

t0=$(date +%s)
status=0
ip netns exec "$NETNS" "$BIN/e2e.test" --kubeconfig="$KUBECONFIG" --kubectl-path="$KUBECTL" \
    --ginkgo.focus="$focus" "${skipping[@]}" --ginkgo.timeout=3h --ginkgo.json-report="$out/report.json" \
    --ginkgo.no-color --dump-logs-on-failure=false --report-dir="$out" \
    >"$out/e2e.log" 2>&1 || status=$?
e2e_s=$(($(date +%s) - t0))

# The verdict from the report, not from e2e.test's status alone (Ginkgo
# exits 0 when the focus matches nothing, or when every test skipped
# itself): no test run, a failure or a skip fails the script.
verdict=0
python3 - "$out/report.json" "$focus" "$skip" <<'EOF' || verdict=$?
import json, re, sys
report, focus = sys.argv[1], re.compile(sys.argv[2])
skip = re.compile(sys.argv[3]) if sys.argv[3] else None
left_out = 0
counts = {"passed": 0, "failed": 0, "skipped": 0}
lines = []
for suite in json.load(open(report)):
    for s in suite.get("SpecReports") or []:
        text = " ".join(s.get("ContainerHierarchyTexts") or []) + " " + s.get("LeafNodeText", "")
        state = s.get("State", "")
        if s.get("LeafNodeType") != "It":
            if state not in ("passed", "skipped"):
                msg = (s.get("Failure") or {}).get("Message", "").strip().splitlines()
                lines.append(f"  {s.get('LeafNodeType')} {state}: {msg[0] if msg else ''}")
            continue
        if not focus.search(text):
            continue  # not selected
        if skip and skip.search(text):
            left_out += 1  # left out on purpose: counted apart, never as passed
            continue
        if s.get("NumAttempts", 0) == 0:
            continue  # not selected
        key = "failed" if state not in ("passed", "skipped") else state
        counts[key] += 1
        if key != "passed":
            msg = (s.get("Failure") or {}).get("Message", "").strip().splitlines()
            loc = (s.get("Failure") or {}).get("Location") or {}
            where = f" ({loc.get('FileName', '').split('/test/e2e/')[-1]}:{loc.get('LineNumber', '')})" if loc else ""
            first = (msg[0] if msg else state)[:200]
            lines.append(f"  {key.upper()}: {text.strip()}\n      {first}{where}")
for l in lines:
    print(l)
print(f"k8s-e2e: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
      + (f", {left_out} left out by VNET_E2E_SKIP" if skip else ""))
if counts["passed"] == 0:
    sys.exit("k8s-e2e: no test passed: the focus matched nothing, or nothing ran")
if counts["failed"] or counts["skipped"]:
    sys.exit("k8s-e2e: a test failed or skipped itself")
EOF

# The lab's exit on SIGTERM, and what it left (nothing, or fail).
trap - EXIT
stop_lab
left=$(
    ip netns list | grep -F "$PREFIX" || true
    ls -d /sys/fs/cgroup/*/"$PREFIX"-h* 2>/dev/null || true
    ps -eo pid=,args= | grep -F "$PREFIX" | grep -v grep || true
)
[ -z "$left" ] || { echo "k8s-e2e: the lab left: $left"; exit 1; }
echo "k8s-e2e: the lab removed on SIGTERM, nothing left (namespaces, cgroups, processes)"
echo "k8s-e2e: suite $e2e_s s, in all $(($(date +%s) - started)) s, e2e.test status $status (log: $out/e2e.log)"
[ "$status" = 0 ] || exit "$status"
exit "$verdict"
