#!/usr/bin/env bash
# Runs every test: formatting, lints, unit and property tests, a longer
# property-test ("fuzz") pass over the decoders and the parser, the eBPF
# programs run by the kernel on crafted packets (BPF_PROG_TEST_RUN), the Debian
# package's build and checks (scripts/package.sh), and the
# namespace integration tests (root), on the user path and again on the
# kernel (eBPF) path. Installs what it needs first.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare qemu-system-x86 busybox-static cpio dpkg-dev man-db bash-completion python3 etcd-client util-linux libcap2-bin containernetworking-plugins podman runc iptables conntrack mmdebstrap systemd-container chromium   # QEMU guests (lab/build-guest.sh); the package checks; python3, etcdctl, setpriv and capsh for lab tests; host-local, podman and runc for the CNI tests; iptables and conntrack for the NAT lab; the systemd test's Debian machine (lab/build-rootfs.sh, systemd-nspawn); headless Chromium for the dashboard's lab test
prepare_libvirt
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy 2>/dev/null || true

step() { echo; echo "== $* (at ${SECONDS} s)"; }
# `tests SECONDS COMMAND...` runs a test command under a time limit (a test
# that hangs fails the step, and the lab's signal handler removes its
# namespaces) and fails when it fails, when no test ran in it (a filter
# that matches nothing passes silently otherwise), or when a test said
# SKIPPED (a test that cannot run here fails; it does not pass quietly).
tests() {
  local limit=$1 out rc=0 n
  shift
  out=$(mktemp "${TMPDIR:-/tmp}/vnet-tests.XXXXXX")
  timeout --kill-after=60 "$limit" "$@" 2>&1 | tee "$out" || rc=$?
  n=$(passed "$out")
  if grep -q "SKIPPED" "$out"; then
    grep "SKIPPED" "$out" >&2
    rm -f "$out"
    die "a test said SKIPPED in: $*"
  fi
  rm -f "$out"
  [ "$rc" != 124 ] || die "over its ${limit} s limit: $*"
  [ "$rc" = 0 ] || exit "$rc"
  [ "$n" -gt 0 ] || die "no test ran in: $*"
  echo "($n tests passed)"
}
# Every lab this run makes carries its tag, so the check at the end counts
# what this run left behind, not the namespaces of a bench running meanwhile.
export VNET_LAB_TAG="t$$"
step "fmt";    timeout 300 cargo fmt --all -- --check
step "clippy"; timeout 1200 cargo clippy --workspace --all-targets -- -D warnings
step "shape: no function over 100 lines or file over 1000 outside tests, no import cycle between the files or the top-level modules of any crate (its own tests first: a probe cycle found)"; python3 scripts/test_shape.py; python3 scripts/shape.py
step "unit and property tests"
tests 1200 cargo test --workspace
step "eBPF programs: each decision of vnet_from_vm and vnet_from_wire, run by the kernel (BPF_PROG_TEST_RUN, root)"
# vnetd's `kernel::attach::testrun` (#[ignore]: they load the programs);
# `--workspace --lib`, as below, reuses the unit step's build.
tests 300 cargo test --workspace --lib -- --ignored --test-threads=1 kernel::attach::testrun::
step "fuzz: decoders and parser, 20000 cases each (the test build: overflow checks and debug assertions on)"
# `never_panic` matches every never_panics* and *_never_panic property (in
# vnet-wire and vnet-control). The test build (already made above) checks
# overflows as a release build with them on would, without a second release
# build of everything (2-3 minutes). `--workspace` with a name filter, not
# `-p` (`--lib`: they are unit tests): a subset of the packages unifies other features and builds most of
# the tree again (90 s here).
tests 600 env PROPTEST_CASES=20000 cargo test --workspace --lib -- never_panic
tests 300 env PROPTEST_CASES=2000 cargo test --workspace --lib -- any_line_gets_one_closing_reply
# The Debian package (a release build, its checks: file list, unit, man
# pages, completions) and the systemd test's Debian machine
# (lab/build-rootfs.sh) are made in the background at idle priority while
# the user pass and the kernel pass run (whose tests wait on pings, etcd
# and timers more than they compute); the steps after them, the tests that
# run alone (among them those that install the package), wait for both.
# (Behind the user pass alone, the build was not done at its end at three
# tests a time: the run waited 190 s for it.)
step "Debian packages (this tree's, the previous release's) and the systemd test's machine: started in the background"
work=$(mktemp -d "${TMPDIR:-/tmp}/vnet-test.XXXXXX")
# After it, the previous release's package (scripts/previous-package.sh:
# the revision scripts/previous-revision pins, built once per clone) for
# the cluster-mode upgrade test.
timeout 2400 nice -n 19 bash -c 'bash scripts/package.sh && bash scripts/previous-package.sh' \
    >"$work/package.log" 2>&1 &
package=$!
timeout 1200 nice -n 19 lab/build-rootfs.sh >"$work/rootfs.log" 2>&1 &
rootfs=$!
# On any exit: the background builds stopped (timeout passes the signal
# on), the plan and logs removed.
# (set -e holds in a trap: a kill of a build that ended must not fail the run.)
trap 'kill "$package" "$rootfs" 2>/dev/null || true; wait || true; rm -rf "$work"' EXIT
# The namespace tests, in four steps: each pass (a data path: every vnetd
# interface on it, which the lab checks for every lab it makes) with three
# tests at a time (they wait on pings, timers and etcd more than they
# compute: the user pass's 85 tests hold labs for 970 s and take 340 s at
# three, 510 s at two), then each pass's tests that run alone (QEMU
# guests, floods, timing bounds a neighbour could break). scripts/lab-plan.py says which
# test runs where, by exact name, and fails when one of its patterns
# matches no test.
# `--tests`: the binaries with the features the test build unified (the
# dependencies already built); `--bins` alone builds most of them again.
cargo build --workspace --bins --tests
plan="$work/plan"
# A lab test without #[ignore] is not in the ignored list (so in no step)
# and would run in the unit step, as root: refused.
all=$(cargo test -p vnet-lab --test lab -- --list 2>/dev/null | grep ': test$' | sort)
ignored=$(cargo test -p vnet-lab --test lab -- --ignored --list 2>/dev/null | grep ': test$' | sort)
stray=$(comm -23 <(echo "$all") <(echo "$ignored"))
[ -z "$stray" ] || die "lab tests without #[ignore] (they would run in the unit step, as root): $stray"
echo "$ignored" | python3 scripts/lab-plan.py "$plan"
lab() {  # lab PATH STEP THREADS LIMIT
  mapfile -t names <"$plan/$2"
  # An empty list would run every ignored test of the lab.
  [ "${#names[@]}" -gt 0 ] || die "the lab plan's step $2 names no test"
  tests "$4" env VNET_LAB_DATAPATH="$1" cargo test -p vnet-lab --test lab -- --ignored --exact \
    --show-output --test-threads="$3" "${names[@]}"
}
step "namespace integration tests (root), user path"
lab user user 3 1500
step "namespace integration tests (root), kernel (eBPF) path"
lab kernel kernel 3 1200
step "Debian package and the systemd test's machine: waiting for them"
wait "$package" || { cat "$work/package.log"; die "the package's build or checks failed"; }
tail -2 "$work/package.log"
wait "$rootfs" || { cat "$work/rootfs.log"; die "lab/build-rootfs.sh failed"; }
step "user path: QEMU guests (TCG) on TAP and vhost-user, the floods and the timing bounds, one at a time"
# (+150 s: the quickstart on five machines with systemd, here since issue 68: 145 s alone.)
lab user user-alone 1 1050
step "kernel path: the floods, the timing bounds and a QEMU guest's migration, one at a time"
lab kernel kernel-alone 1 600
left=$(ip netns list | grep -c "^vl$VNET_LAB_TAG-" || true)
[ "$left" = 0 ] || die "$left lab namespaces were left behind"
echo; echo "all tests passed"
