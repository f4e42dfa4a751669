#!/usr/bin/env bash
# Builds the lab's QEMU guest: Debian's kernel and a busybox initramfs with
# the virtio-net modules, into OUT (default target/guest). Idempotent: does
# nothing when OUT already holds both files for this kernel.
#   lab/build-guest.sh [OUT]
# The guest's /init configures eth0 from the kernel command line
# (vnet_ip=ADDR/LEN vnet_mtu=N), prints VNET-GUEST-READY on the console,
# then receives one TCP stream on port 5001 and prints VNET-MD5 <md5> <bytes>.
# With vnet_peer=IP on the command line it also talks to that peer:
#   vnet_ping=1      waits for the peer to answer, then pings it 5 times and
#                    prints VNET-PING <ip> <received>
#   vnet_send_mb=N   sends N MB of random bytes to the peer's port 5001 and
#                    prints VNET-TX-MD5 <md5> <bytes> (before) and VNET-SENT <rc>
# The files carry a hash of this script, so a changed /init is rebuilt.
set -euo pipefail
out=${1:-target/guest}
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
kver=${kpkg#linux-image-}
tag=$(md5sum < "$0" | cut -c1-8)
[ -s "$out/vmlinuz-$kver" ] && [ -s "$out/initrd-$kver-$tag.gz" ] && { echo "$out/vmlinuz-$kver $out/initrd-$kver-$tag.gz"; exit 0; }
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "$kpkg" >/dev/null 2>&1)
dpkg-deb -x "$work"/"$kpkg"_*.deb "$work/k"
root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
cp /bin/busybox "$root/bin/busybox"
for m in failover net_failover virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_net; do
    cp "$(find "$work/k/lib/modules/$kver" -name "$m.ko" | head -1)" "$root/lib/modules/"
done
cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in failover net_failover virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_net; do
    insmod /lib/modules/$m.ko
done
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
ip link set lo up
ip link set eth0 mtu "$(arg vnet_mtu)" up
ip addr add "$(arg vnet_ip)" dev eth0
echo "VNET-GUEST-READY $(cat /sys/class/net/eth0/address)"
(
    # nc must not see its input end (a background job's is /dev/null): it
    # would close its side before the data came.
    nc -l -p 5001 < /dev/console > /tmp/rx
    echo "VNET-MD5 $(md5sum < /tmp/rx | cut -d' ' -f1) $(wc -c < /tmp/rx)"
    rm -f /tmp/rx
) &
peer=$(arg vnet_peer)
if [ -n "$peer" ]; then
    n=0
    until ping -c 1 -W 1 "$peer" > /dev/null 2>&1 || [ $n -ge 90 ]; do n=$((n + 1)); done
    if [ -n "$(arg vnet_ping)" ]; then
        got=$(ping -c 5 -W 2 "$peer" | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
        echo "VNET-PING $peer $got"
    fi
    mb=$(arg vnet_send_mb)
    if [ -n "$mb" ]; then
        dd if=/dev/urandom of=/tmp/tx bs=1M count="$mb" 2> /dev/null
        echo "VNET-TX-MD5 $(md5sum < /tmp/tx | cut -d' ' -f1) $(wc -c < /tmp/tx)"
        n=0
        until nc "$peer" 5001 < /tmp/tx || [ $n -ge 30 ]; do n=$((n + 1)); sleep 1; done
        echo "VNET-SENT $n"
        rm -f /tmp/tx
    fi
fi
while true; do sleep 3600; done
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/initrd-$kver-$tag.gz"
cp "$work/k/boot/vmlinuz-$kver" "$out/vmlinuz-$kver"
echo "$out/vmlinuz-$kver $out/initrd-$kver-$tag.gz"
