#!/usr/bin/env bash
# Issue 30's upgrade test, by hand (two release builds: too long for CI):
# builds the package of a previous revision (default b7765b1, the last one
# before the user path's hand-over; any revision since the kernel path's
# hand-over, 05e8642, can be upgraded from without a cut) with
# scripts/previous-package.sh (kept as target/upgrade/vnet-REV.deb for the
# next run), and this tree's package; then runs the lab test
# `an_upgrade_from_the_previous_package_to_this_one_...` on both data paths:
# host 0 runs the old package's vnetd under a 10 ms ping and a TCP stream,
# hands over to the new package's, which hands over once more.
#   sudo ./scripts/upgrade-test.sh [REVISION]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
prepare
cd "$(dirname "$0")/.."
rev=$(git rev-parse --short=7 "${1:-b7765b1}")
# Built as scripts/test.sh builds the previous release's (its version
# lowered to 0.1.0~prev.REV-1), kept as target/upgrade/vnet-REV.deb.
bash scripts/previous-package.sh "$rev"
from="$PWD/target/upgrade/vnet-$rev.deb"
echo "building this tree's package"
bash scripts/package.sh | tail -1
to="$PWD/$(ls -t target/debian/vnet_*.deb | head -1)"
cargo build --workspace --bins -q
export VNET_UPGRADE_FROM="$from" VNET_UPGRADE_TO="$to" VNET_LAB_TAG="u$$"
failed=0
for path in user kernel; do
    echo "== $path path"
    log="/tmp/vnet-upgrade-$path.log"
    VNET_LAB_DATAPATH=$path cargo test -p vnet-lab --test lab -- --ignored --nocapture \
        --exact integration::by_hand::an_upgrade_from_the_previous_package_to_this_one_under_a_10ms_ping_and_a_tcp_stream \
        >"$log" 2>&1 || failed=1
    grep -E "upgrade |hand-over x|^test |test result|panicked" -A1 "$log" | grep -v "^--" || true
    # The filter must have run the test: a renamed test passes as 0 run.
    [ "$(passed "$log")" = 1 ] || { echo "the upgrade test did not run on the $path path"; failed=1; }
done
[ "$failed" = 0 ] || die "the upgrade test failed (logs: /tmp/vnet-upgrade-{user,kernel}.log)"
echo "upgrade test passed"
