#!/usr/bin/env python3
"""Which namespace (root) lab test runs in which step of scripts/test.sh.

Reads the lab's test list (`cargo test -p vnet-lab --test lab -- --ignored
--list`) on stdin and writes one file of exact test names per step into
DIR (argv[1]): user, user-alone, user-package, kernel, kernel-alone,
kernel-package.

Where a test runs is declared next to it: the lab's tests are in rooms by
area (`crates/vnet-lab/tests/lab/*.rs`), and in each room in a module per
pass, so a test's full name is ROOM::PASS::NAME. The pass module says:

  both          the user pass and the kernel pass, three tests at a time
  both_alone    both passes, one at a time (QEMU guests, floods, timing
                bounds a neighbour could break; each test says why)
  user          the user pass only (secured, TCP and TLS links; the user
                path itself; no data path at all)
  user_alone    the user pass only, one at a time
  kernel        the kernel pass only (the kernel path's own maps)
  kernel_alone  the kernel pass only, one at a time
  by_hand       no step: scripts/upgrade-test.sh or scripts/k8s-test.sh runs it

The alone tests that install a package or boot the systemd test's machine
(PACKAGE below, by exact name) go to the *-package steps instead: test.sh
runs those last, after the package and the machine (built in the
background meanwhile) are done, so the other alone tests need not wait for
the build. A PACKAGE name that names no alone test fails the plan.

A pass is a data path: every vnetd interface of the user pass is on the
user path (VNET_LAB_DATAPATH=user), of the kernel pass on the kernel path;
the lab checks it for every lab it makes (`Lab::check_datapaths`). It fails
on a test whose name has no pass module, and when the lab lists no test.
"""
import sys
from pathlib import Path

STEPS = {
    "both": ["user", "kernel"],
    "both_alone": ["user-alone", "kernel-alone"],
    "user": ["user"],
    "user_alone": ["user-alone"],
    "kernel": ["kernel"],
    "kernel_alone": ["kernel-alone"],
    "by_hand": [],
}

# The alone tests that need scripts/package.sh's and
# scripts/previous-package.sh's packages or lab/build-rootfs.sh's machine
# (`package_deb()`, `previous_package()`, `Machine::boot`, `Machine::start`: the
# quickstart's five machines, which ran in user-alone before the build it
# needs was waited for).
PACKAGE = {
    "integration::both_alone::systemd_runs_the_package_reloads_restarts_and_upgrades_it_without_a_cut_and_stops_clean",
    "integration::user_alone::the_installed_package_runs_the_demo_under_exactly_the_units_capabilities",
    "life::both_alone::an_upgrade_from_the_previous_releases_package_in_cluster_mode_under_a_10ms_ping_and_a_tcp_stream",
    "quickstart::user_alone::quickstart_runs_verbatim_on_machines_with_systemd_and_the_package_and_the_vms_ping",
}


def main() -> int:
    out = Path(sys.argv[1])
    names = [l[: -len(": test")] for l in sys.stdin.read().splitlines() if l.endswith(": test")]
    if not names:
        print("lab-plan: the lab lists no test", file=sys.stderr)
        return 1
    steps = {s: [] for s in ("user", "user-alone", "user-package", "kernel", "kernel-alone", "kernel-package")}
    by_hand = 0
    for n in names:
        parts = n.split("::")
        if len(parts) != 3 or parts[1] not in STEPS:
            print(f"lab-plan: {n}: expected ROOM::PASS::NAME with PASS one of {', '.join(STEPS)}",
                  file=sys.stderr)
            return 1
        by_hand += not STEPS[parts[1]]
        for s in STEPS[parts[1]]:
            steps[s.replace("-alone", "-package") if n in PACKAGE else s].append(n)
    stale = sorted(PACKAGE - {n for n in names if n.split("::")[1].endswith("alone")})
    if stale:
        print(f"lab-plan: PACKAGE names no alone test: {', '.join(stale)}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    for step, tests in steps.items():
        (out / step).write_text("".join(t + "\n" for t in tests))
    runs = sum(len(t) for t in steps.values())
    print(f"lab plan: {len(names)} tests, {runs} runs: "
          + ", ".join(f"{s} {len(t)}" for s, t in steps.items())
          + f", by hand {by_hand}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
