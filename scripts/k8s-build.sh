#!/usr/bin/env bash
# Builds the Kubernetes lab's programs from the Go module proxy, once, into
# target/k8s/bin (a clean clone builds them again; the Go build cache makes
# a second build on the same machine quick):
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
#   kubectl        Kubernetes, pinned by scripts/k8s/go.mod
#   containerd containerd-shim-runc-v2 ctr
#                  containerd 2 (its CRI plugin calls CNI STATUS, which
#                  Debian's containerd 1.6 does not)
#   crictl         sigs.k8s.io/cri-tools
#   coredns        github.com/coredns/coredns (the lab's DNS)
#   portmap        github.com/containernetworking/plugins' portmap (hostPort:
#                  the manifest chains it after vnet-cni; Debian 12's speaks
#                  CNI up to 1.0.0, the conflist is 1.1.0)
# runc is Debian's. With --e2e, also (a stamp of their own):
#   e2e.test       Kubernetes' e2e suite (go test -c k8s.io/kubernetes/test/e2e)
#   agnhost        its test image's program (k8s.io/kubernetes/test/images/agnhost),
#                  and the image's localhost.crt and localhost.key
# With --portmap, only portmap (what scripts/k8s-image.sh needs).
# Usage: scripts/k8s-build.sh [--print-dir | --e2e | --portmap]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
source scripts/lib.sh

K8S_VERSION=v1.35.4
CONTAINERD_VERSION=v2.2.9
CRICTL_VERSION=v1.37.0
# kubeadm's CoreDNSVersion at v1.35.4 (cmd/kubeadm/app/constants).
COREDNS_VERSION=v1.13.1
# The reference plugins' portmap, CNI 1.1.0 (the manifest's conflist).
CNI_PLUGINS_VERSION=v1.9.0
OUT="$PWD/target/k8s/bin"
[ "${1:-}" = --print-dir ] && { echo "$OUT"; exit 0; }
WITH_E2E=0
[ "${1:-}" = --e2e ] && WITH_E2E=1

command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || die "go not found: install Go 1.25 or newer"
# The machine's own Go, never a toolchain download.
export GOTOOLCHAIN=local
mkdir -p "$OUT"

# CoreDNS (the lab's DNS, deployed as kubeadm deploys it), with a stamp of
# its own: adding it rebuilt nothing else.
coredns() {
    local want="coredns $COREDNS_VERSION"
    if [ "$(cat "$OUT/.coredns" 2>/dev/null)" = "$want" ]; then
        echo "k8s-build: $want already in $OUT"
        return
    fi
    echo "k8s-build: CoreDNS $COREDNS_VERSION"
    CGO_ENABLED=0 GOBIN="$OUT" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
    echo "$want" >"$OUT/.coredns"
}

# The portmap plugin (hostPort), with a stamp of its own: vnet's image
# carries it as /usr/lib/cni/vnet-portmap (crates/vnet-lab/src/k8s/image.rs).
portmap() {
    local want="portmap $CNI_PLUGINS_VERSION"
    if [ "$(cat "$OUT/.portmap" 2>/dev/null)" = "$want" ]; then
        echo "k8s-build: $want already in $OUT"
        return
    fi
    echo "k8s-build: portmap $CNI_PLUGINS_VERSION"
    rm -f "$OUT/portmap"
    CGO_ENABLED=0 GOBIN="$OUT" go install -trimpath -ldflags "-s -w" \
        "github.com/containernetworking/plugins/plugins/meta/portmap@$CNI_PLUGINS_VERSION"
    echo "$want" >"$OUT/.portmap"
}
[ "${1:-}" = --portmap ] && { portmap; exit 0; }

ver=${K8S_VERSION#v}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=${ver%%.*}"
    ldflags+=" -X $pkg.gitMinor=$(echo "$ver" | cut -d. -f2) -X $pkg.gitTreeState=clean"
done

# The e2e suite and agnhost, from the same module at the same version
# (scripts/k8s-e2e.sh), with a stamp of their own. The same flags as the
# programs above, so the Go build cache serves every package they share.
e2e() {
    [ "$WITH_E2E" = 1 ] || return 0
    local want="e2e.test agnhost (with porter's certificate) $K8S_VERSION"
    if [ "$(cat "$OUT/.e2e" 2>/dev/null)" = "$want" ]; then
        echo "k8s-build: $want already in $OUT"
        return
    fi
    local t0
    t0=$(date +%s)
    echo "k8s-build: e2e.test and agnhost $K8S_VERSION"
    (cd scripts/k8s && CGO_ENABLED=0 go test -c -trimpath -ldflags "$ldflags" -o "$OUT/e2e.test" k8s.io/kubernetes/test/e2e)
    (cd scripts/k8s && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/agnhost" k8s.io/kubernetes/test/images/agnhost)
    # The image's TLS certificate and key (its Dockerfile's `ADD
    # porter/localhost.crt`): agnhost's porter serves TLS with them.
    local src
    src=$(cd scripts/k8s && go list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost/porter)
    install -m 0644 "$src/localhost.crt" "$OUT/agnhost-localhost.crt"
    install -m 0644 "$src/localhost.key" "$OUT/agnhost-localhost.key"
    echo "$want" >"$OUT/.e2e"
    echo "k8s-build: e2e.test and agnhost in $(($(date +%s) - t0)) s"
}

# Builds only what is missing or was built at another version.
stamp="$OUT/.versions"
want="kubernetes $K8S_VERSION (with kube-proxy) containerd $CONTAINERD_VERSION crictl $CRICTL_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "k8s-build: $want already in $OUT"
    coredns
    portmap
    e2e
    exit 0
fi
rm -f "$stamp"

started=$(date +%s)
echo "k8s-build: Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl) into $OUT"
(cd scripts/k8s && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$OUT/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
    k8s.io/kubernetes/cmd/kubectl)

echo "k8s-build: containerd $CONTAINERD_VERSION (containerd, containerd-shim-runc-v2, ctr)"
for cmd in containerd containerd-shim-runc-v2 ctr; do
    CGO_ENABLED=0 GOBIN="$OUT" go install -trimpath -tags no_btrfs,no_devmapper,no_zfs \
        -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/$cmd@$CONTAINERD_VERSION"
done

echo "k8s-build: crictl $CRICTL_VERSION"
CGO_ENABLED=0 GOBIN="$OUT" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"

echo "$want" >"$stamp"
coredns
portmap
e2e
echo "k8s-build: done in $(($(date +%s) - started)) s"
