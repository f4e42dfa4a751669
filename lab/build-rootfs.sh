#!/usr/bin/env bash
# Builds the lab's Debian machine for the systemd test: a bookworm root file
# system from Debian's packages (mmdebstrap, minbase) with systemd as its
# init, apt, iproute2 and ping, into OUT (default target/systemd/rootfs),
# which `systemd-nspawn --boot` boots. Idempotent: does nothing when OUT
# holds a root file system made by this version of the script (a hash of
# it is kept in OUT/.vnet-lab-rootfs). Prints OUT.
#   lab/build-rootfs.sh [OUT]
set -euo pipefail
out=${1:-target/systemd/rootfs}
tag=$(md5sum < "$0" | cut -c1-8)
[ "$(cat "$out/.vnet-lab-rootfs" 2>/dev/null)" = "$tag" ] && { echo "$out"; exit 0; }
command -v mmdebstrap >/dev/null && command -v systemd-nspawn >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends mmdebstrap systemd-container >/dev/null
}
rm -rf "$out.tmp" "$out"
mkdir -p "$(dirname "$out")"
# The machine's own mirror: the one this machine's apt uses.
mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Identifier: Packages' 2>/dev/null |
    grep -v security | head -1)
mmdebstrap --quiet --variant=minbase \
    --include=systemd,systemd-sysv,dbus,iproute2,iputils-ping,procps,kmod,ethtool \
    bookworm "$out.tmp" ${mirror:+"$mirror"} >&2
# A machine that boots to its units and nothing else: no getty on the
# console nspawn gives it, a hostname, an empty machine-id made at boot.
ln -sf /dev/null "$out.tmp/etc/systemd/system/console-getty.service"
echo vnet-lab > "$out.tmp/etc/hostname"
: > "$out.tmp/etc/machine-id"
# The journal kept in /run, read live by the tests: a persistent journal's
# flush at boot (systemd-journal-flush) failed once with five machines
# booting at once under load, and the machine said `degraded`.
mkdir -p "$out.tmp/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' > "$out.tmp/etc/systemd/journald.conf.d/volatile.conf"
echo "$tag" > "$out.tmp/.vnet-lab-rootfs"
mv "$out.tmp" "$out"
echo "$out"
