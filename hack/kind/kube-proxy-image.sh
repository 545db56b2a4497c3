#!/usr/bin/env bash
# Builds the kube-proxy image. kube-proxy drives iptables and conntrack, so unlike the other
# control-plane images it cannot be FROM scratch: it starts from the project's Debian rootfs
# image, which has both, and adds the kube-proxy binary.
#
# Usage: hack/kind/kube-proxy-image.sh TAG ROOTFS_IMAGE KUBE_PROXY_BINARY
set -euo pipefail

tag=${1:?usage: kube-proxy-image.sh TAG ROOTFS_IMAGE BINARY}
base=${2:?usage: kube-proxy-image.sh TAG ROOTFS_IMAGE BINARY}
binary=${3:?usage: kube-proxy-image.sh TAG ROOTFS_IMAGE BINARY}

inputs=$( { echo "$tag"; docker image inspect --format '{{.Id}}' "$base"; sha256sum "$binary" | cut -d' ' -f1; } | sha256sum | cut -c1-16)
if [ "$(docker image inspect --format '{{index .Config.Labels "dev.strata.inputs"}}' "$tag" 2>/dev/null)" = "$inputs" ]; then
  exit 0
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$binary" "$ctx/kube-proxy"
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM $base
COPY kube-proxy /usr/local/bin/kube-proxy
LABEL dev.strata.inputs=$inputs
DOCKERFILE
echo "building image $tag" >&2
# The classic builder: it needs no buildx plugin and no base image. Its deprecation notice is
# noise here, so output is shown only when the build fails.
if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" 2>&1); then
  echo "$out" >&2
  exit 1
fi
