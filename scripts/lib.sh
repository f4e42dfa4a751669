# Shared by the project's scripts: dependency installation and checks.
# Sourced, not run.

# Debian packages the lab, the tests and the demo use.
# protobuf-compiler (with libprotobuf-dev, its well-known .proto files) builds the etcd client; etcd-server is the cluster labs' store.
VNET_APT_PACKAGES="iproute2 iputils-ping iperf3 procps kmod ethtool clang libbpf-dev tcpdump protobuf-compiler libprotobuf-dev etcd-server"

die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# How many tests a libtest output file says passed (summed over its
# `test result:` lines; 0 when none ran).
passed() {
    # (`|| true`: under pipefail, grep finding none would fail the caller's
    # `n=$(passed ...)`, and with it the script, before it says why: a step
    # killed at its time limit printed no "over its limit".)
    { grep -Eo '^test result: [A-Za-z]+\. [0-9]+ passed' "$1" || true; } | awk '{s += $4} END {print s + 0}'
}

need_root() {
    [ "$(id -u)" = 0 ] || die "run as root (network namespaces and TAP devices need it), e.g. sudo $0"
}

# Installs the missing ones of "$@" with apt-get; does nothing if all are there.
ensure_apt() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Puts cargo on PATH (rustup's default place too) or explains what is missing.
ensure_cargo() {
    [ -d "$HOME/.cargo/bin" ] && PATH="$HOME/.cargo/bin:$PATH"
    command -v cargo >/dev/null || die "cargo not found: install Rust 1.85 or newer (https://rustup.rs), then rerun"
    ensure_apt build-essential pkg-config
}

ensure_tun() {
    [ -c /dev/net/tun ] || modprobe tun 2>/dev/null || true
    [ -c /dev/net/tun ] || die "/dev/net/tun is missing: this kernel has no TUN/TAP support"
}

# What every entry script needs first: root, the Debian packages (plus any
# named in "$@"), cargo, and TUN/TAP.
prepare() {
    need_root
    local had_etcd=1
    dpkg-query -W -f='${Status}' etcd-server 2>/dev/null | grep -q "ok installed" || had_etcd=0
    ensure_apt $VNET_APT_PACKAGES "$@"
    # The lab runs etcd itself, in a namespace; the packaged service that
    # installing etcd-server starts (on systemd machines) is not ours to
    # leave running. An etcd-server that was already here is left alone.
    if [ "$had_etcd" = 0 ] && [ -d /run/systemd/system ]; then
        systemctl disable --now etcd >/dev/null 2>&1 &&
            echo "etcd-server installed; its system service stopped and disabled (the lab runs its own)"
    fi
    ensure_cargo
    ensure_tun
}

# libvirt for the lab's libvirt test, without libvirt-daemon-system (whose
# service and default network would start in the root namespace): the
# daemon and QEMU driver only; the lab runs libvirtd itself, in a lab
# namespace, with its own /etc/libvirt (qemu.conf, hooks), /run/libvirt and
# /var/lib/libvirt (a mount namespace of its own): this machine's libvirt
# configuration is neither read nor written. libvirtd will not start
# without the `libvirt-qemu` user the -system package makes.
prepare_libvirt() {
    ensure_apt libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86
    getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
    id libvirt-qemu >/dev/null 2>&1 ||
        useradd --system --no-create-home --shell /usr/sbin/nologin -g libvirt-qemu libvirt-qemu
}

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
