#!/usr/bin/env python3
"""Which namespace (root) lab test runs in which step of scripts/test.sh.

Reads the lab's test list (`cargo test -p vnet-lab --test lab -- --ignored
--list`) on stdin and writes one file of exact test names per step into
DIR (argv[1]): user, user-alone, kernel, kernel-alone. It fails, naming
the pattern, when a pattern below matches no test (a test renamed would
otherwise move silently to another step), when a test is both user_only and
kernel_only, or when a test would run in no step (by_hand aside).

A pass is a data path: every vnetd interface of the user pass is on the
user path (VNET_LAB_DATAPATH=user), of the kernel pass on the kernel path;
the lab checks it for every lab it makes (`Lab::check_datapaths`). A test
that names its path in its spec runs on that path in whichever pass runs
it, so it is listed for one pass only (user_only, kernel_only).

Patterns match as libtest filters do: a substring of the test's name.
"""
import sys
from pathlib import Path

# The QEMU guests (TCG) take a core each, and the libvirt tests' guests
# too: alone (and on the user pass: a vhost-user guest's rings are vnetd's
# whatever the path; a TAP guest is a netdev). The static live migration
# runs on both passes: the kernel path serves a guest's TAP netdev too.
QEMU = ["qemu_", "vhost_user", "libvirt_"]
QEMU_ON_BOTH = ["qemu_live_migration_in_static_mode"]
# The floods take a core or more as fast as a script can send: alone, so
# they neither slow the timing-bound tests nor are slowed by them (the
# `vhost_user` pattern also matches the load generator's test, which spins
# a core on each side).
FLOODS = ["a_flood_of_", "a_vms_broadcast_storm"]
# Bounds a neighbour can break: alone. Adaptive polling gives the CPU up
# when another thread wants it, so whether a ping-pong is polled depends on
# what else runs; the hand-overs count every lost 10 ms ping (the kernel
# path's must be 0), and so do systemd's restarts and upgrades (a machine
# booted with systemd-nspawn besides); the 100000-MAC test times a move in
# the kernel's maps; the relocations count pings lost at 10 and 20 ms
# (one lost 16 beside a release build and another test, 3 alone).
TIMING = ["adaptive_dispatch_polls_through", "ten_hand_overs_under", "a_network_of_100000_macs",
          "systemd_runs_the_package", "relocating_a_vm", "cluster_relocation_under", "converges_and_relocates"]
# Tests that install the package: after it is built (test.sh builds it
# in the background during the user pass).
PACKAGE = ["the_installed_package_runs_the_demo", "systemd_runs_the_package"]
ALONE = QEMU + FLOODS + TIMING + PACKAGE
# Needs two packages, one of a previous revision: scripts/upgrade-test.sh
# runs it (two release builds), not test.sh.
BY_HAND = ["an_upgrade_from_the_previous_package"]
# Tests whose traffic never takes the kernel path (secured, TCP and TLS
# links are the user path's), that are about the user path itself (its
# TAPs, workers, merging, polling, the baselines without vnet), or that
# test no data path (the control endpoint, the CNI plugin's refusals, its
# address pool and garbage collection, what the cluster accepts from etcd,
# the saved configuration): once, on the user pass. (The kernel pass keeps
# the cluster tests that move traffic: its maps follow the same table.)
USER_ONLY = [
    "rekeying_", "encrypted_links_", "a_handshake_initiation_replayed", "tcp_link_", "tls_",
    "a_tls_control", "a_secured_link_follows", "a_restarted_peer_at_a_new", "a_tap_is_known_for",
    "quickstart_commands", "a_cluster_across_nats", "hosts_behind_nats_", "ten_thousand_slow",
    "a_thousand_control", "an_unprivileged_client", "a_state_dir_or_ca_others", "cni_malformed",
    "cni_unknown_version", "cni_missing_netns", "cni_vnetd_not_running", "every_baseline_",
    "bridged_baseline_", "adaptive_dispatch_polls_", "workers_run_on", "many_streams_are_read",
    "an_encrypted_links_65000", "secured_links_agree", "cluster_records_a_stranger",
    "a_forged_claim_or_host_record", "a_mac_defined_again_on_another", "a_revoked_host_is_cut",
    "each_wrong_etcd_credential", "a_host_whose_certificate_expires", "a_cluster_line_in_the_config",
    "saved_runtime_changes", "cni_an_exhausted_subnet", "cni_gc_removes", "cni_a_hundred_parallel_adds",
    "cni_config_values_holding", "raw_and_vxlan_links_hand_the_vm_tcp_segments",
    "vhost_user", "libvirt_", "qemu_", "the_installed_package_runs_the_demo",
]
# The kernel maps' own tests (their specs name the kernel path): once, on
# the kernel pass.
KERNEL_ONLY = [
    "kernel_path_carries_unicast", "a_network_of_100000_macs", "a_change_the_kernel_maps_refuse",
    "the_kernel_route_tables_take",
]


def main() -> int:
    out = Path(sys.argv[1])
    names = [l[: -len(": test")] for l in sys.stdin.read().splitlines() if l.endswith(": test")]
    if not names:
        print("lab-plan: the lab lists no test", file=sys.stderr)
        return 1
    groups = {"QEMU": QEMU, "QEMU_ON_BOTH": QEMU_ON_BOTH, "FLOODS": FLOODS, "TIMING": TIMING, "PACKAGE": PACKAGE,
              "BY_HAND": BY_HAND, "USER_ONLY": USER_ONLY, "KERNEL_ONLY": KERNEL_ONLY}
    bad = [f"{g}: `{p}`" for g, ps in groups.items() for p in ps if not any(p in n for n in names)]
    if bad:
        print("lab-plan: patterns that match no lab test (renamed or removed?): " + ", ".join(bad),
              file=sys.stderr)
        return 1
    has = lambda n, ps: any(p in n for p in ps)  # noqa: E731
    both = [n for n in names if has(n, USER_ONLY) and has(n, KERNEL_ONLY)]
    if both:
        print("lab-plan: both user_only and kernel_only: " + ", ".join(both), file=sys.stderr)
        return 1
    steps = {"user": [], "user-alone": [], "kernel": [], "kernel-alone": []}
    for n in names:
        if has(n, BY_HAND):
            continue
        user = not has(n, KERNEL_ONLY)
        kernel = not has(n, USER_ONLY) or has(n, QEMU_ON_BOTH)
        alone = "-alone" if has(n, ALONE) else ""
        if user:
            steps["user" + alone].append(n)
        if kernel:
            steps["kernel" + alone].append(n)
        if not (user or kernel):
            print(f"lab-plan: {n} runs in no step", file=sys.stderr)
            return 1
    out.mkdir(parents=True, exist_ok=True)
    for step, tests in steps.items():
        (out / step).write_text("".join(t + "\n" for t in tests))
    runs = sum(len(t) for t in steps.values())
    print(f"lab plan: {len(names)} tests, {runs} runs: "
          + ", ".join(f"{s} {len(t)}" for s, t in steps.items())
          + f", by hand {sum(has(n, BY_HAND) for n in names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
