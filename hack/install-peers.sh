#!/usr/bin/env bash
# Installs the peers `make bench-peers` measures Strata beside: rclone and s3fs, Debian's
# packages at the versions the Makefile pins. Idempotent: a version already installed is kept.
set -euo pipefail

rclone_version=${1:?usage: install-peers.sh RCLONE_DEB_VERSION S3FS_DEB_VERSION}
s3fs_version=${2:?usage: install-peers.sh RCLONE_DEB_VERSION S3FS_DEB_VERSION}

installed() { [ "$(dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true)" = "$2" ]; }

wanted=()
installed rclone "$rclone_version" || wanted+=("rclone=$rclone_version")
installed s3fs "$s3fs_version" || wanted+=("s3fs=$s3fs_version")
[ ${#wanted[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
	echo "install-peers: installing ${wanted[*]} needs root (apt-get)" >&2
	exit 1
fi
echo "install-peers: installing ${wanted[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null
