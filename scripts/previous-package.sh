#!/usr/bin/env bash
# The previous release's package, for the upgrade tests (issue 68): built
# from the revision scripts/previous-revision pins (or REVISION), its tree
# exported (git archive) to a directory of its own and built there by that
# revision's scripts/package.sh, its version
# set to 0.1.0~prev.REV-1 (below this tree's 0.1.0-1, so installing this
# tree's package after it is an upgrade; nothing is released yet, so both
# trees say 0.1.0), kept as target/upgrade/vnet-REV.deb and built once per
# clone. That release build starts from hard links of this
# tree's target/release (the dependencies are the same crates: only the
# workspace's are built again), when there is one.
#   scripts/previous-package.sh [REVISION]
# The pinned revision is one whose cluster mode speaks this tree's key
# layout (claims under each host's key, its certificate's groups) and
# takes the lab's flags; b945e03 is the last before the paged listing and
# the relist by epoch (vnet-cluster, vnetd) and the neighbour guard (eBPF).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
rev=$(git rev-parse --short=7 "${1:-$(cat scripts/previous-revision)}")
out="$PWD/target/upgrade/vnet-$rev.deb"
if [ -f "$out" ]; then
    echo "previous package (kept): $out"
    exit 0
fi
old=$(mktemp -d "${TMPDIR:-/tmp}/vnet-previous-XXXXXX")
trap 'rm -rf "$old"' EXIT
git archive "$rev" | tar -x -C "$old"
if [ -d target/release ]; then
    mkdir -p "$old/target"
    cp -al target/release "$old/target/release"
    # The workspace's own crates are built again: their fingerprints and
    # build scripts' outputs go. Cargo's fingerprints do not name the
    # workspace's path, and git archive gives the old tree's files their
    # commit's (older) times, so a kept fingerprint made this tree's
    # vnetd build script look fresh there (it then checked the old
    # vnet.h for this tree's structs and failed).
    rm -rf "$old/target/release/.cargo-lock" "$old"/target/release/.fingerprint/vnet* \
        "$old"/target/release/build/vnet* "$old"/target/release/deps/*vnet*
fi
echo "building the package of $rev (in $old)"
(cd "$old" && env -u CARGO_TARGET_DIR bash scripts/package.sh | tail -1)
deb=$(ls "$old"/target/debian/vnet_*.deb | head -1)
tree="$old/target/prev-deb"
dpkg-deb -R "$deb" "$tree"
sed -i "s/^Version: .*/Version: 0.1.0~prev.$rev-1/" "$tree/DEBIAN/control"
mkdir -p target/upgrade
# (gzip -1: a test's package, made once; xz took minutes on the debug info)
dpkg-deb --root-owner-group -Zgzip -z1 -b "$tree" "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
echo "previous package: $out ($(dpkg-deb -f "$out" Version))"
