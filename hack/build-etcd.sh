#!/usr/bin/env bash
# Builds a static etcd server from the Go module proxy. The etcd server module carries replace
# directives, so `go install` refuses it; a three-line wrapper module that calls etcdmain builds.
#
# Usage: hack/build-etcd.sh VERSION OUTFILE   e.g. hack/build-etcd.sh v3.5.16 bin/k8s/v1.32.4/etcd
set -euo pipefail

version=${1:?usage: build-etcd.sh VERSION OUTFILE}
out=${2:?usage: build-etcd.sh VERSION OUTFILE}
[ -x "$out" ] && exit 0

mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat > "$work/go.mod" <<MOD
module etcdwrapper

go 1.23

require go.etcd.io/etcd/server/v3 ${version}
MOD
cat > "$work/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
echo "building etcd ${version}" >&2
cd "$work"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
go mod tidy >/dev/null
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out" .
