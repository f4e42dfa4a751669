#!/usr/bin/env bash
# Builds the Debian package target/debian/vnet_*.deb: vnetd, vnetctl, the
# vnetd@.service template, the CNI plugin vnet-cni and its example
# conflists, libvirt's qemu hook, man pages (vnetd(8), vnetctl(8) generated from
# the code; vnet.conf(5)), shell completions and an example config. Then
# checks it: the file list, the unit (systemd-analyze verify), the man
# pages (man -l) and the bash completions. Needs no root.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_cargo
ensure_apt $VNET_APT_PACKAGES dpkg-dev man-db bash-completion
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked -q

cargo build --release -q -p vnetd -p vnetctl -p vnet-cni -p vnet-libvirt
pkg=target/pkg
rm -rf "$pkg" && mkdir -p "$pkg"
VNET_GEN_DOCS="$pkg" target/release/vnetd
VNET_GEN_DOCS="$pkg" target/release/vnetctl
cp packaging/vnet.conf.5 "$pkg/"
gzip -9n "$pkg"/*.8 "$pkg"/*.5
deb=$(cargo deb -p vnetd --no-build -q)
echo "built $deb"

# The checks CI makes.
contents=$(dpkg-deb -c "$deb")
for f in usr/sbin/vnetd usr/bin/vnetctl lib/systemd/system/vnetd@.service usr/share/man/man8/vnetd.8.gz \
    usr/share/man/man8/vnetctl.8.gz usr/share/man/man5/vnet.conf.5.gz \
    usr/share/bash-completion/completions/vnetctl usr/share/doc/vnet/examples/example.conf \
    usr/lib/cni/vnet-cni usr/share/doc/vnet/examples/cni/podman-vnet.conflist \
    usr/share/doc/vnet/examples/cni/10-vnet.conflist usr/lib/vnet/vnet-libvirt-hook \
    usr/lib/vnet/vnetd-stop etc/libvirt/hooks/qemu.d/vnet; do
    grep -q " \./$f\$" <<<"$contents" || die "$deb lacks $f"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp"
# The upgrade's hand-over (postinst) is in the package and is valid sh.
dpkg-deb -e "$deb" "$tmp/DEBIAN"
[ -x "$tmp/DEBIAN/postinst" ] || die "$deb has no executable postinst"
sh -n "$tmp/DEBIAN/postinst" || die "$deb's postinst is not valid sh"
# A first install makes /etc/vnet (0750) and /var/lib/vnet (0700): run in a
# root of its own (DPKG_ROOT), never on this machine's.
mkdir -p "$tmp/root/etc" "$tmp/root/var/lib"
DPKG_ROOT="$tmp/root" sh "$tmp/DEBIAN/postinst" configure ||
    die "$deb's postinst failed on a first install"
[ "$(stat -c %a "$tmp/root/etc/vnet")" = 750 ] || die "the postinst did not make /etc/vnet 0750"
[ "$(stat -c %a "$tmp/root/var/lib/vnet")" = 700 ] || die "the postinst did not make /var/lib/vnet 0700"
# systemd-analyze checks the unit against the package's own files.
if command -v systemd-analyze >/dev/null; then
    sed -e "s|/usr/sbin/vnetd|$tmp/usr/sbin/vnetd|" -e "s|/usr/lib/vnet/|$tmp/usr/lib/vnet/|" \
        packaging/vnetd@.service >"$tmp/vnetd@test.service"
    systemd-analyze verify --man=no "$tmp/vnetd@test.service" >"$tmp/verify.log" 2>&1 || true
    if grep -q . "$tmp/verify.log"; then
        cat "$tmp/verify.log" >&2
        die "systemd-analyze verify found problems in vnetd@.service"
    fi
fi
for page in man8/vnetd.8.gz man8/vnetctl.8.gz man5/vnet.conf.5.gz; do
    warnings=$(man -l "$tmp/usr/share/man/$page" 2>&1 >/dev/null || true)
    [ -z "$warnings" ] || die "man -l $page: $warnings"
    [ "$(man -l "$tmp/usr/share/man/$page" 2>/dev/null | wc -l)" -gt 10 ] || die "man -l $page is empty"
done
bash -c "source '$tmp/usr/share/bash-completion/completions/vnetctl' && complete -p vnetctl" >/dev/null ||
    die "the bash completion of vnetctl does not load"
echo "package checks passed: $deb"
