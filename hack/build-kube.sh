#!/usr/bin/env bash
# Builds Kubernetes binaries (kube-apiserver, kubelet, kubeadm, ...) from the Go module proxy,
# because no Kubernetes download site is reachable from the machines this project is built on.
#
# The k8s.io/kubernetes module replaces every k8s.io staging module with ./staging/..., which its
# module zip does not contain; we copy the module, drop the replace block and require the matching
# published staging releases instead (see shared notes "offline-kubernetes").
#
# Usage: hack/build-kube.sh VERSION OUTDIR BINARY...   e.g. hack/build-kube.sh v1.32.4 bin/k8s/v1.32.4 kube-apiserver
# Binaries already present in OUTDIR are not rebuilt. All are static (CGO_ENABLED=0).
set -euo pipefail

version=${1:?usage: build-kube.sh VERSION OUTDIR BINARY...}
outdir=${2:?usage: build-kube.sh VERSION OUTDIR BINARY...}
shift 2
[ $# -gt 0 ] || { echo "build-kube.sh: name at least one binary" >&2; exit 2; }

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
missing=()
for b in "$@"; do [ -x "$outdir/$b" ] || missing+=("$b"); done
[ ${#missing[@]} -gt 0 ] || exit 0

# v1.32.4 -> staging modules are v0.32.4
minor_patch=${version#v1.}
staging_version="v0.${minor_patch}"

# The sum database does not know this module's zip as the proxy serves it.
export GONOSUMDB='*' GOFLAGS=-mod=mod GOTOOLCHAIN=local
src=$(cd /tmp && go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "build-kube.sh: could not download k8s.io/kubernetes@${version}" >&2; exit 1; }

work="$outdir/.src"
if [ ! -f "$work/.prepared" ]; then
  rm -rf "$work"
  mkdir -p "$work"
  cp -r "$src"/. "$work"/
  chmod -R u+w "$work"
  rm -rf "$work/vendor" "$work"/go.work*
  sed -i '/^replace (/,/^)/d' "$work/go.mod"
  sed -i -E "s#^(\s+k8s\.io/[A-Za-z0-9._-]+) v0\.0\.0\$#\1 ${staging_version}#" "$work/go.mod"
  (cd "$work" && go mod tidy >/dev/null)
  touch "$work/.prepared"
fi

major=${version#v}; major=${major%%.*}
minor=${version#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
  ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

for b in "${missing[@]}"; do
  echo "building ${b} ${version}" >&2
  (cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$outdir/$b" "./cmd/$b")
done
