#!/usr/bin/env python3
"""Which namespace (root) lab test runs in which step of scripts/test.sh.

Reads the lab's test list (`cargo test -p vnet-lab --test lab -- --ignored
--list`) on stdin and writes one file of exact test names per step into
DIR (argv[1]): user, user-alone, kernel, kernel-alone.

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


def main() -> int:
    out = Path(sys.argv[1])
    names = [l[: -len(": test")] for l in sys.stdin.read().splitlines() if l.endswith(": test")]
    if not names:
        print("lab-plan: the lab lists no test", file=sys.stderr)
        return 1
    steps = {"user": [], "user-alone": [], "kernel": [], "kernel-alone": []}
    by_hand = 0
    for n in names:
        parts = n.split("::")
        if len(parts) != 3 or parts[1] not in STEPS:
            print(f"lab-plan: {n}: expected ROOM::PASS::NAME with PASS one of {', '.join(STEPS)}",
                  file=sys.stderr)
            return 1
        by_hand += not STEPS[parts[1]]
        for s in STEPS[parts[1]]:
            steps[s].append(n)
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
