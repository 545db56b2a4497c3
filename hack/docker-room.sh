#!/usr/bin/env bash
# Makes room in the Docker engine for the e2e cluster and checks that there is enough.
#
# Every rebuild of an image the project tags (node, kubeadm, Strata and test images, all labelled
# dev.strata.inputs) leaves the image it replaced behind without a tag; on a machine that builds
# from fresh clones, those would fill the disk a gigabyte and a half per node image. They are
# removed here, as are their layers, unless a container still runs from them. Images of other
# projects are never touched.
#
# Images of earlier trees, whose tags (hack/devversion) differ from this tree's VERSION, are
# removed too: each edit deployed leaves a set of them behind, tagged.
#
# Usage: hack/docker-room.sh NEEDED_GIB [VERSION]
set -euo pipefail

needed_gib=${1:?usage: docker-room.sh NEEDED_GIB [VERSION]}
version=${2:-}

docker image prune --force --filter label=dev.strata.inputs >/dev/null
if [ -n "$version" ]; then
  # An image a container still runs from stays (docker refuses to remove it).
  docker images --filter label=dev.strata.inputs --format '{{.Repository}}:{{.Tag}}' |
    grep -e '-dev\.' | grep -v -e ":$version\$" | xargs -r docker rmi >/dev/null 2>&1 || true
fi

root=$(docker info --format '{{.DockerRootDir}}')
free_gib=$(( $(df --output=avail -k "$root" | tail -1) / 1024 / 1024 ))
if [ "$free_gib" -lt "$needed_gib" ]; then
  cat >&2 <<MSG
docker-room.sh: only ${free_gib} GiB free under $root, and the e2e cluster needs about ${needed_gib} GiB
(the node image, every image loaded into three nodes, the pods' data). Free some space, for example:
  make kind-down                     # a cluster left from an earlier run
  docker image prune                 # every untagged image, not only this project's
  docker system df -v                # what takes the space
MSG
  exit 1
fi
