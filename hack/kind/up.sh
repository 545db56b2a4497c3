#!/usr/bin/env bash
# Creates the e2e Kind cluster if it does not exist, then makes it usable: the pod network,
# the tier folders on the cache nodes, every node Ready. Idempotent.
#
# Environment (set by the Makefile): KIND, KUBECTL, KIND_CLUSTER, NODE_IMAGE, PODNET_IMAGE.
set -euo pipefail
: "${KIND:?}" "${KUBECTL:?}" "${KIND_CLUSTER:?}" "${NODE_IMAGE:?}" "${PODNET_IMAGE:?}"
here=$(cd "$(dirname "$0")" && pwd)
kubectl() { "$KUBECTL" --context "kind-$KIND_CLUSTER" "$@"; }

if ! "$KIND" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
  "$KIND" create cluster --name "$KIND_CLUSTER" --image "$NODE_IMAGE" --config "$here/cluster.yaml" --wait 0s
fi

"$KIND" load docker-image --name "$KIND_CLUSTER" "$PODNET_IMAGE" >/dev/null
kubectl apply -f "$here/../podnet/podnet.yaml" >/dev/null

# Tier folders on every cache node: a tmpfs stands in for memory, plain folders for NVMe and
# PMEM devices. A stopped node loses its tmpfs, as a rebooted machine loses its memory.
for node in $(kubectl get nodes -l strata.dev/cache=true -o jsonpath='{.items[*].metadata.name}'); do
  docker exec "$node" sh -c 'mkdir -p /mnt/strata/mem /mnt/strata/nvme /mnt/strata/pmem &&
    (mountpoint -q /mnt/strata/mem || mount -t tmpfs -o size=1g,mode=0750 strata-mem /mnt/strata/mem)'
done

kubectl wait --for=condition=Ready nodes --all --timeout=300s
kubectl -n kube-system rollout status deployment/coredns --timeout=300s
kubectl -n kube-system rollout status daemonset/kube-proxy --timeout=300s
echo "cluster $KIND_CLUSTER is up: kubectl --context kind-$KIND_CLUSTER get nodes" >&2
