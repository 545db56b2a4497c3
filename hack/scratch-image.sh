#!/usr/bin/env bash
# Builds a FROM scratch image that holds static binaries, without pulling any base image.
# The image is labelled with a hash of its inputs and not rebuilt while that hash is unchanged.
#
# Usage: hack/scratch-image.sh TAG ENTRYPOINT SRC:DEST [SRC:DEST...]
#   ENTRYPOINT is the path run by default, or "-" for none (the pod spec names the command).
set -euo pipefail

tag=${1:?usage: scratch-image.sh TAG ENTRYPOINT SRC:DEST...}
entrypoint=${2:?usage: scratch-image.sh TAG ENTRYPOINT SRC:DEST...}
shift 2
[ $# -gt 0 ] || { echo "scratch-image.sh: name at least one SRC:DEST" >&2; exit 2; }

# The hash covers where each file goes and what it holds, not where it was built, so that a
# fresh clone with the same binaries reuses the image.
inputs=$( { echo "$tag $entrypoint"; for spec in "$@"; do echo "${spec#*:}"; sha256sum "${spec%%:*}" | cut -d' ' -f1; done; } | sha256sum | cut -c1-16)
if [ "$(docker image inspect --format '{{index .Config.Labels "dev.strata.inputs"}}' "$tag" 2>/dev/null)" = "$inputs" ]; then
  exit 0
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
{
  echo "FROM scratch"
  echo "ENV PATH=/usr/local/bin:/usr/bin:/bin"
  i=0
  for spec in "$@"; do
    src=${spec%%:*} dest=${spec#*:}
    cp "$src" "$ctx/f$i"
    echo "COPY f$i $dest"
    i=$((i + 1))
  done
  [ "$entrypoint" = "-" ] || echo "ENTRYPOINT [\"$entrypoint\"]"
  echo "LABEL dev.strata.inputs=$inputs"
} > "$ctx/Dockerfile"
echo "building image $tag" >&2
# The classic builder: it needs no buildx plugin and no base image. Its deprecation notice is
# noise here, so output is shown only when the build fails.
if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$ctx" 2>&1); then
  echo "$out" >&2
  exit 1
fi
