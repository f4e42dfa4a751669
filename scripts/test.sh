#!/usr/bin/env bash
# Runs every test: formatting, lints, unit and property tests, a longer
# property-test ("fuzz") pass over the decoders and the parser, the Debian
# package's build and checks (scripts/package.sh), and the
# namespace integration tests (root), on the user path and again on the
# kernel (eBPF) path. Installs what it needs first.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare qemu-system-x86 busybox-static cpio dpkg-dev man-db bash-completion python3 etcd-client util-linux libcap2-bin containernetworking-plugins podman runc iptables conntrack   # QEMU guests (lab/build-guest.sh); the package checks; python3, etcdctl, setpriv and capsh for lab tests; host-local, podman and runc for the CNI tests; iptables and conntrack for the NAT lab
prepare_libvirt
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy 2>/dev/null || true

step() { echo; echo "== $* (at ${SECONDS} s)"; }
# Runs a test command and fails when it fails or when no test ran in it (a
# filter that matches nothing passes silently otherwise).
tests() {
  local out rc=0 n
  out=$(mktemp "${TMPDIR:-/tmp}/vnet-tests.XXXXXX")
  "$@" 2>&1 | tee "$out" || rc=$?
  n=$(grep -Eo '^test result: [A-Za-z]+\. [0-9]+ passed' "$out" | awk '{s += $4} END {print s + 0}')
  rm -f "$out"
  [ "$rc" = 0 ] || exit "$rc"
  [ "$n" -gt 0 ] || die "no test ran in: $*"
  echo "($n tests passed)"
}
# Every lab this run makes carries its tag, so the check at the end counts
# what this run left behind, not the namespaces of a bench running meanwhile.
export VNET_LAB_TAG="t$$"
step "fmt";    cargo fmt --all -- --check
step "clippy"; cargo clippy --workspace --all-targets -- -D warnings
step "shape: no function over 120 lines outside tests, no import cycle in vnetd"; python3 scripts/shape.py
step "unit and property tests"
tests cargo test --workspace
step "fuzz: decoders and parser, 20000 cases each (the test build: overflow checks and debug assertions on)"
# `never_panic` matches every never_panics* and *_never_panic property. The
# test build (already made above) checks overflows as a release build with
# them on would, without a second release build of everything (2-3 minutes).
tests env PROPTEST_CASES=20000 cargo test -p vnet-wire -p vnet-control -- never_panic
tests env PROPTEST_CASES=2000 cargo test -p vnetd -- any_line_gets_one_closing_reply
step "Debian package: build and check (file list, unit, man pages, completions)"
bash scripts/package.sh
# The QEMU guests (TCG) take a core each: they run one test at a time, and
# once (a vhost-user guest's rings are vnetd's whatever the data path; a
# TAP guest is a netdev, which vnetd puts on the kernel path by default).
# The libvirt test's guest too; and alone, it never sees the installed
# package's own libvirt hook, which the package test puts in place for a
# while.
qemu=(qemu_ vhost_user libvirt_)
# The floods take a core or more as fast as a script can send: alone, so
# they neither slow the timing-bound tests (a relocation's lost pings) nor
# are slowed by them. (`vhost_user` above also matches the load generator's
# test, which spins a core on each side.)
floods=(a_flood_of_ a_vms_broadcast_storm)
# Adaptive polling gives the CPU up when another thread wants it, so whether
# a ping-pong is polled depends on what else runs: alone too.
polling=(adaptive_dispatch_polls_through)
serial=("${qemu[@]}" "${floods[@]}" "${polling[@]}")
# Needs two packages, one of a previous revision: run by
# scripts/upgrade-test.sh (two release builds), not here.
by_hand=(an_upgrade_from_the_previous_package)
# Tests whose traffic never takes the kernel path (secured, TCP and TLS
# links are the user path's), that put their VMs on TAPs themselves (the
# user path's workers, the baselines without vnet), or that test no data
# path (the control endpoint, the CNI plugin's refusals, its address pool
# and garbage collection, what the cluster accepts from etcd, the saved
# configuration): once, on the user path pass. (The kernel pass keeps the
# cluster tests that move traffic: its maps follow the same table.)
user_only=(rekeying_ encrypted_links_ a_handshake_initiation_replayed tcp_link_ tls_ a_tls_control a_secured_link_follows a_restarted_peer_at_a_new a_tap_is_known_for quickstart_commands a_cluster_across_nats hosts_behind_nats_
    ten_thousand_slow a_thousand_control an_unprivileged_client a_state_dir_or_ca_others cni_malformed cni_unknown_version
    cni_missing_netns cni_vnetd_not_running every_baseline_ bridged_baseline_ adaptive_dispatch_polls_under_load
    workers_run_on many_streams_are_read an_encrypted_links_65000 secured_links_agree
    cluster_records_a_stranger a_forged_claim_or_host_record a_mac_defined_again_on_another a_revoked_host_is_cut each_wrong_etcd_credential a_host_whose_certificate_expires a_cluster_line_in_the_config
    saved_runtime_changes cni_an_exhausted_subnet cni_gc_removes cni_a_hundred_parallel_adds cni_config_values_holding)
# Tests that put their VMs on the kernel path themselves whatever the pass
# (the kernel maps' own tests): once, on the kernel pass.
kernel_only=(kernel_path_carries_unicast a_network_of_100000_macs a_change_the_kernel_maps_refuse)
step "namespace integration tests (root), user path"
cargo build --workspace --bins
tests cargo test -p vnet-lab --test lab -- --ignored --test-threads=2 "${serial[@]/#/--skip=}" "${by_hand[@]/#/--skip=}" "${kernel_only[@]/#/--skip=}"
step "QEMU guests (TCG) on TAP and vhost-user, the floods and the polling test, one at a time"
tests cargo test -p vnet-lab --test lab -- --ignored --test-threads=1 "${serial[@]}"
step "namespace integration tests (root), again with every VM on the kernel (eBPF) path"
tests env VNET_LAB_DATAPATH=kernel cargo test -p vnet-lab --test lab -- --ignored --test-threads=2 "${serial[@]/#/--skip=}" "${user_only[@]/#/--skip=}" "${by_hand[@]/#/--skip=}"
step "the floods on the kernel path, one at a time"
tests env VNET_LAB_DATAPATH=kernel cargo test -p vnet-lab --test lab -- --ignored --test-threads=1 "${floods[@]}"
left=$(ip netns list | grep -c "^vl$VNET_LAB_TAG-" || true)
[ "$left" = 0 ] || die "$left lab namespaces were left behind"
echo; echo "all tests passed"
