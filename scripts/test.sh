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
  local limit=$1 out rc=0
  shift
  out=$(mktemp "${TMPDIR:-/tmp}/vnet-tests.XXXXXX")
  timeout --kill-after=60 "$limit" "$@" 2>&1 | timed | tee "$out" || rc=$?
  checked "$out" "$rc" "$limit" "$@"
}
# `timed` appends to each test's result line (`test NAME ... ok`) the
# seconds since the previous one and since the command started: with one
# test at a time, the first is how long that test took (the slowest tests
# of a step, read from the log). A line cut off by the time limit is kept.
timed() {
  local line t t0=${EPOCHREALTIME/./} last=${EPOCHREALTIME/./}
  while IFS= read -r line || [ -n "$line" ]; do
    if [[ $line =~ (^test\ .*\ \.\.\.\ |^)(ok|FAILED)$ ]]; then
      t=${EPOCHREALTIME/./}
      line+=" (+$(((t - last) / 1000000)).$(((t - last) / 100000 % 10)) s, at $(((t - t0) / 1000000)) s)"
      last=$t
    fi
    printf '%s\n' "$line"
  done
}
# `checked OUTPUT RC LIMIT COMMAND...`: the checks of `tests` on a finished
# command's output (then removed) and exit status.
checked() {
  local out=$1 rc=$2 limit=$3 n
  shift 3
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
# What runs in the background runs at the idle scheduling class
# (`chrt --idle 0`, SCHED_IDLE): it takes a core only when nothing else
# wants it, a waking test process preempts it at once, and the scheduler
# places a wakeup on a core it holds as on an idle one; so the steps in
# front, and the tests that run alone, hardly see it. Each job is one
# `timeout` (its own process group: stopping it stops all it started).
# `background NAME LIMIT COMMAND...` starts one (its output in
# $work/NAME.log); `waited NAME` waits for it, prints its log's last lines
# and fails with the whole log when it failed; `waited_tests NAME` waits
# for a test command, prints its log and applies the checks of `tests`.
work=$(mktemp -d "${TMPDIR:-/tmp}/vnet-test.XXXXXX")
declare -A bg_pid=() bg_cmd=()
background() {
  local name=$1 limit=$2
  shift 2
  timeout --kill-after=60 "$limit" chrt --idle 0 "$@" >"$work/$name.log" 2>&1 &
  bg_pid[$name]=$!
  bg_cmd[$name]="$limit $*"
}
waited() {
  wait "${bg_pid[$1]}" || { cat "$work/$1.log"; die "$1 (in the background: ${bg_cmd[$1]}) failed"; }
  tail -2 "$work/$1.log"
}
waited_tests() {
  local rc=0
  wait "${bg_pid[$1]}" || rc=$?
  cat "$work/$1.log"
  # shellcheck disable=SC2086 # the limit and the command, as given
  checked "$work/$1.log" "$rc" ${bg_cmd[$1]}
}
# On any exit: the background jobs stopped (timeout passes the signal on
# to its process group), the plan and logs removed.
# (set -e holds in a trap: a kill of a job that ended must not fail the run.)
trap 'kill "${bg_pid[@]}" 2>/dev/null || true; wait || true; rm -rf "$work"' EXIT
step "started in the background: the Debian packages (this tree's, the previous release's), the systemd test's machine, clippy"
# The Debian package (a release build, its checks: file list, unit, man
# pages, completions), then the previous release's package
# (scripts/previous-package.sh: the revision scripts/previous-revision
# pins, built once per clone) for the cluster-mode upgrade test; the
# systemd test's Debian machine (lab/build-rootfs.sh). Started first: the
# compile steps below leave a core idle in their serial parts, the lab
# passes wait on pings, etcd and timers more than they compute, and most
# tests that run alone use a core or less. (Started after the fuzz step at
# nice 19, a clean-clone run waited 174 s for them after the kernel pass.)
background package 2400 bash -c 'bash scripts/package.sh && bash scripts/previous-package.sh'
background rootfs 1200 lab/build-rootfs.sh
# clippy (112 s in front on a clean clone) in a target directory of its
# own: a check build shares no artifact with the test build, and clippy
# holding target/debug's lock would stop the next step's cargo behind it.
background clippy 2400 cargo clippy --workspace --all-targets --target-dir target/clippy -- -D warnings
step "fmt";    timeout 300 cargo fmt --all -- --check
step "shape: no function over 100 lines or file over 1000 outside tests, no import cycle between the files or the top-level modules of any crate (its own tests first: a probe cycle found)"; python3 scripts/test_shape.py; python3 scripts/shape.py
step "unit and property tests"
tests 1200 cargo test --workspace
step "eBPF programs: each decision of vnet_from_vm and vnet_from_wire, run by the kernel (BPF_PROG_TEST_RUN, root)"
# vnetd's `kernel::attach::testrun` (#[ignore]: they load the programs);
# `--workspace --lib`, as below, reuses the unit step's build.
tests 300 cargo test --workspace --lib -- --ignored --test-threads=1 kernel::attach::testrun::
step "fuzz: decoders and parser, 20000 cases each (the test build: overflow checks and debug assertions on): started in the background"
# `never_panic` matches every never_panics* and *_never_panic property (in
# vnet-wire and vnet-control). The test build (already made above) checks
# overflows as a release build with them on would, without a second release
# build of everything (2-3 minutes). `--workspace` with a name filter, not
# `-p` (`--lib`: they are unit tests): a subset of the packages unifies other features and builds most of
# the tree again (90 s here). In the background (it took 51 s in front,
# mostly on one core), waited for with the checks of `tests`; their limits
# allow for the idle class.
background fuzz 1800 env PROPTEST_CASES=20000 cargo test --workspace --lib -- never_panic
background fuzz-lines 1200 env PROPTEST_CASES=2000 cargo test --workspace --lib -- any_line_gets_one_closing_reply
# The namespace tests, in six steps: each pass (a data path: every vnetd
# interface on it, which the lab checks for every lab it makes) with three
# tests at a time (they wait on pings, timers and etcd more than they
# compute: the user pass's 85 tests hold labs for 970 s and take 340 s at
# three, 510 s at two), then each pass's tests that run alone (QEMU
# guests, floods, timing bounds a neighbour could break), and last each
# pass's alone tests that install the packages or boot the systemd test's
# machine (built in the background until then). scripts/lab-plan.py says
# which test runs where, by exact name, and fails when one of its names
# matches no test.
# `--tests`: the binaries with the features the test build unified (the
# dependencies already built); `--bins` alone builds most of them again.
cargo build --workspace --bins --tests
plan="$work/plan"
# The lab's test binary as the unit step built it (its path from the
# same cargo call: nothing is built again), run as cargo runs it (from its
# package's directory; the lab reads no cargo variable at run time).
# Through cargo, features unify otherwise: `cargo test -p vnet-lab --test
# lab` built eight workspace crates and the lab again, `--workspace --test
# lab` four (about a minute of a clean-clone run, hidden behind the list's
# 2>/dev/null).
labbin=$(cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "lab" and m.get("executable"):
        print(m["executable"])')
[ -x "$labbin" ] || die "cargo test --workspace --no-run named no lab test binary: '$labbin'"
labtest=(env -C crates/vnet-lab "$labbin")
# A lab test without #[ignore] is not in the ignored list (so in no step)
# and would run in the unit step, as root: refused.
all=$("${labtest[@]}" --list 2>/dev/null | grep ': test$' | sort)
ignored=$("${labtest[@]}" --ignored --list 2>/dev/null | grep ': test$' | sort)
stray=$(comm -23 <(echo "$all") <(echo "$ignored"))
[ -z "$stray" ] || die "lab tests without #[ignore] (they would run in the unit step, as root): $stray"
echo "$ignored" | python3 scripts/lab-plan.py "$plan"
lab() {  # lab PATH STEP THREADS LIMIT
  mapfile -t names <"$plan/$2"
  # An empty list would run every ignored test of the lab.
  [ "${#names[@]}" -gt 0 ] || die "the lab plan's step $2 names no test"
  tests "$4" env VNET_LAB_DATAPATH="$1" "${labtest[@]}" --ignored --exact \
    --show-output --test-threads="$3" "${names[@]}"
}
step "namespace integration tests (root), user path"
lab user user 3 1500
step "namespace integration tests (root), kernel (eBPF) path"
lab kernel kernel 3 1200
step "user path: QEMU guests (TCG) on TAP and vhost-user, the floods and the timing bounds, one at a time"
lab user user-alone 1 900
step "kernel path: the floods, the timing bounds and a QEMU guest's migration, one at a time"
lab kernel kernel-alone 1 600
step "the background: the fuzz step, clippy, the packages and the systemd test's machine"
waited_tests fuzz
waited_tests fuzz-lines
waited clippy
waited package
waited rootfs
step "user path: the package under systemd, its capabilities, the upgrade from the previous release's, the quickstart on five machines, one at a time"
lab user user-package 1 450
step "kernel path: the package under systemd and the upgrade from the previous release's, one at a time"
lab kernel kernel-package 1 300
left=$(ip netns list | grep -c "^vl$VNET_LAB_TAG-" || true)
[ "$left" = 0 ] || die "$left lab namespaces were left behind"
echo; echo "all tests passed"
