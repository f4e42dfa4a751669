#!/usr/bin/env bash
# Builds vnet's container image, the one packaging/kubernetes/vnet.yaml
# runs (localhost/vnet:TAG), from the release build, as an OCI archive
# (no registry, no image builder: crates/vnet-lab/src/k8s/image.rs):
#   vnetd, vnetctl          /usr/bin (debugging information left out)
#   vnet-cni, vnet-portmap  /usr/lib/cni (portmap: the reference plugin,
#                           static, scripts/k8s-build.sh --portmap)
#   busybox                 Debian's static one (the init containers' sh, cp)
# and every shared library the programs load. Prints the archive and its
# size. Load it into a node's containerd without a registry:
#   ctr -n k8s.io images import target/k8s/vnet-0.1.0.tar
# or push it to one: skopeo copy oci-archive:target/k8s/vnet-0.1.0.tar docker://REGISTRY/vnet:0.1.0
# Usage: scripts/k8s-image.sh [TAG]   (default 0.1.0; the archive is target/k8s/vnet-TAG.tar)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
source scripts/lib.sh
tag=${1:-0.1.0}
case $tag in
    *[!A-Za-z0-9._-]* | "" | [.-]*) die "a tag is letters, digits, '.', '_' and '-', not starting with '.' or '-'" ;;
esac
prepare busybox-static binutils
cargo build --release --bins
scripts/k8s-build.sh --portmap
mkdir -p target/k8s
target/release/vnet-lab k8s image --tag "$tag" --strip \
    --portmap "$(scripts/k8s-build.sh --print-dir)/portmap" --out "target/k8s/vnet-$tag.tar"
