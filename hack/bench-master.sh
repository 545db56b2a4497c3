#!/usr/bin/env bash
# Strata's master beside a three-member etcd on this host, in one run: creates (etcd: puts of new
# keys) and exists (etcd: linearizable gets) from CLIENTS concurrent clients against three
# replicas of each, over loopback, with their data on the same disk (/tmp), without TLS on
# either side. Prints each figure and one summary line per operation.
#
# Usage: hack/bench-master.sh ETCD_VERSION ETCD_BINARY BIN_DIR [CLIENTS] [REQUESTS]
set -euo pipefail

version=${1:?usage: bench-master.sh ETCD_VERSION ETCD_BINARY BIN_DIR [CLIENTS] [REQUESTS]}
etcd=${2:?etcd binary}
bin=${3:?bin directory}
clients=${4:-64}
requests=${5:-20000}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "$bin" && pwd)

# The load tool is built against etcd's own client, in a wrapper module (see hack/etcdbench).
tool=$bin/etcdbench-$version
if [ ! -x "$tool" ]; then
  build=$(mktemp -d)
  cat > "$build/go.mod" <<MOD
module etcdbench

go 1.23

require go.etcd.io/etcd/client/v3 ${version}
MOD
  # Without the build tag that keeps it out of Strata's module (go mod tidy skips such files).
  sed '/^\/\/go:build ignore$/d' "$root/hack/etcdbench/main.go" > "$build/main.go"
  echo "building the etcd load tool against go.etcd.io/etcd/client/v3 ${version}" >&2
  (cd "$build" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod tidy >/dev/null &&
    CGO_ENABLED=0 go build -trimpath -o "$tool" .)
  rm -rf "$build"
fi

work=$(mktemp -d /tmp/bench-master.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cluster=""
for i in 0 1 2; do cluster+="${cluster:+,}e$i=http://127.0.0.1:$((23800 + i))"; done
endpoints=""
for i in 0 1 2; do
  endpoints+="${endpoints:+,}127.0.0.1:$((23790 + i))"
  "$etcd" --name "e$i" --data-dir "$work/e$i" --log-level error \
    --listen-client-urls "http://127.0.0.1:$((23790 + i))" --advertise-client-urls "http://127.0.0.1:$((23790 + i))" \
    --listen-peer-urls "http://127.0.0.1:$((23800 + i))" --initial-advertise-peer-urls "http://127.0.0.1:$((23800 + i))" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token strata-bench \
    >"$work/e$i.log" 2>&1 &
  pids+=($!)
done
# Until the members elected a leader and answer a write.
for try in $(seq 1 60); do
  if "$tool" -endpoints "$endpoints" -op put -n 1 -clients 1 >/dev/null 2>&1; then break; fi
  [ "$try" = 60 ] && { echo "etcd did not come up; its logs:" >&2; cat "$work"/e*.log >&2; exit 1; }
  sleep 0.5
done

rate() { sed -n 's/.*"opsPerSecond":\([0-9.]*\).*/\1/p'; }
echo "etcd ${version}, 3 members, ${clients} clients, ${requests} requests each:"
etcd_put=$("$tool" -endpoints "$endpoints" -op put -n "$requests" -clients "$clients" | tee /dev/stderr | rate)
etcd_get=$("$tool" -endpoints "$endpoints" -op get -n "$requests" -clients "$clients" | tee /dev/stderr | rate)
cleanup
pids=()
trap - EXIT

echo "Strata's master, 3 replicas, ${clients} clients, ${requests} requests each:"
out=$(cd "$root" && go test ./master/bench -run '^$' -bench '^Benchmark(Create|Exists)$' -benchtime "${requests}x" -clients "$clients" | tee /dev/stderr)
strata() { awk -v b="$1" '$1 ~ "^Benchmark"b"(-[0-9]+)?$" { for (i = 1; i < NF; i++) if ($(i+1) == "ops/s") print $i }' <<<"$out"; }
strata_create=$(strata Create)
strata_exists=$(strata Exists)
awk -v s="$strata_create" -v e="$etcd_put" 'BEGIN { printf "op=create strata=%.0f etcd=%.0f ratio=%.2f\n", s, e, s / e }'
awk -v s="$strata_exists" -v e="$etcd_get" 'BEGIN { printf "op=exists strata=%.0f etcd=%.0f ratio=%.2f\n", s, e, s / e }'
