#!/usr/bin/env bash
# Builds the Debian bookworm root file system that the Kind node image and the kube-proxy image
# start from, from Debian's packages alone (no base image can be pulled here). Cached: a tarball
# that exists is reused.
#
# Usage: hack/kind/build-rootfs.sh OUT.tar
set -euo pipefail

out=${1:?usage: build-rootfs.sh OUT.tar}
[ -f "$out" ] && exit 0
mkdir -p "$(dirname "$out")"

mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
mirror=${mirror:-http://deb.debian.org/debian}

command -v debootstrap >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

work=$(mktemp -d)
root="$work/rootfs"
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# What Kind's base image installs, less what cannot or need not be had here (fuse-overlayfs
# is for rootless hosts; nfs-common and open-iscsi are for storage this project does not use).
packages=systemd,systemd-sysv,dbus,iproute2,iptables,nftables,conntrack,ethtool,util-linux,mount,kmod
packages+=,libseccomp2,ca-certificates,procps,jq,bash,fuse3,socat,pigz
echo "debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -30 "$work/debootstrap.log" >&2
  exit 1
}

mount -t proc proc "$root/proc"
chroot "$root" /bin/sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd runc containernetworking-plugins >/dev/null && apt-get clean'
umount "$root/proc"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin

tar -C "$root" --numeric-owner -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "rootfs: $out ($(du -h "$out" | cut -f1))" >&2
