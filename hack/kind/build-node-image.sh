#!/usr/bin/env bash
# Builds a Kind node image for one Kubernetes version without any registry: a Debian rootfs
# (build-rootfs.sh), Kind's own base files (from the sigs.k8s.io/kind Go module), Debian's
# containerd, runc and CNI plugins, kubeadm/kubelet/kubectl built from source, and every image
# kubeadm needs imported into the node's containerd ahead of time. Cached: the image carries a
# hash of its inputs and is not rebuilt while they are unchanged.
#
# Environment (set by the Makefile):
#   NODE_IMAGE           tag to build, e.g. strata-cache/kind-node:v1.32.4
#   KUBERNETES_VERSION   e.g. v1.32.4
#   K8S_BIN              folder with kubeadm, kubelet and kubectl
#   KIND_VERSION         the sigs.k8s.io/kind module version whose images/base/files are used
#   ROOTFS_IMAGE         the imported rootfs image to start from
#   PRELOAD_IMAGES       space-separated image tags to import into the node's containerd
set -euo pipefail

: "${NODE_IMAGE:?}" "${KUBERNETES_VERSION:?}" "${K8S_BIN:?}" "${KIND_VERSION:?}" "${ROOTFS_IMAGE:?}" "${PRELOAD_IMAGES:?}"
here=$(cd "$(dirname "$0")" && pwd)

kind_dir=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@${KIND_VERSION}" | jq -r .Dir)
files="$kind_dir/images/base/files"
[ -d "$files" ] || { echo "build-node-image.sh: no base files in sigs.k8s.io/kind@${KIND_VERSION}" >&2; exit 1; }

inputs=$( {
  echo "$NODE_IMAGE $KUBERNETES_VERSION $KIND_VERSION"
  docker image inspect --format '{{.Id}}' "$ROOTFS_IMAGE"
  for img in $PRELOAD_IMAGES; do docker image inspect --format '{{.Id}}' "$img"; done
  sha256sum "$K8S_BIN"/{kubeadm,kubelet,kubectl} "$here"/{build-node-image.sh,setup-node.sh,runc-wrapper.sh} | cut -d' ' -f1
} | sha256sum | cut -c1-16)
if [ "$(docker image inspect --format '{{index .Config.Labels "dev.strata.inputs"}}' "$NODE_IMAGE" 2>/dev/null)" = "$inputs" ]; then
  echo "node image $NODE_IMAGE is current" >&2
  exit 0
fi

ctx=$(mktemp -d)
container=""
cleanup() {
  [ -z "$container" ] || docker rm -f "$container" >/dev/null 2>&1 || true
  rm -rf "$ctx"
}
trap cleanup EXIT

cp -r "$files" "$ctx/files"
chmod -R u+w "$ctx/files"
cp "$K8S_BIN"/{kubeadm,kubelet,kubectl} "$ctx/"
sed 's|^REAL_RUNC=.*|REAL_RUNC=/usr/sbin/runc.real|' "$here/runc-wrapper.sh" > "$ctx/runc"
cat > "$ctx/default-storage.yaml" <<'YAML'
# Kind installs this instead of its hostPath default StorageClass. It is deliberately not the
# default class and provisions nothing: Strata's tests never rely on a default StorageClass.
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
YAML

cp "$here/setup-node.sh" "$ctx/setup-node.sh"
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM ${ROOTFS_IMAGE}
COPY files/usr/local/bin/ /usr/local/bin/
COPY files/kind/ /kind/
COPY files/etc/crictl.yaml /etc/
COPY files/etc/containerd/ /etc/containerd/
COPY files/etc/default/ /etc/default/
COPY files/etc/sysctl.d/ /etc/sysctl.d/
COPY files/etc/systemd/system/ /etc/systemd/system/
COPY kubeadm kubelet kubectl /usr/bin/
COPY runc /usr/sbin/runc.wrapper
COPY default-storage.yaml /kind/manifests/default-storage.yaml
COPY setup-node.sh /tmp/setup-node.sh
RUN KUBERNETES_VERSION=${KUBERNETES_VERSION} sh -e /tmp/setup-node.sh && rm /tmp/setup-node.sh
# docker commit cannot set a stop signal, and keeps the one of the image it commits from.
STOPSIGNAL SIGRTMIN+3
DOCKERFILE

echo "building node image $NODE_IMAGE (stage 1: file system)" >&2
if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$NODE_IMAGE-stage1" "$ctx" 2>&1); then
  echo "$out" >&2
  exit 1
fi

echo "importing $(echo $PRELOAD_IMAGES | wc -w) images into the node's containerd" >&2
container=$(docker run -d --privileged --entrypoint sleep "$NODE_IMAGE-stage1" infinity)
docker exec "$container" sh -c 'mkdir -p /run/containerd && (containerd >/var/log/containerd-build.log 2>&1 &)'
for _ in $(seq 1 30); do docker exec "$container" ctr version >/dev/null 2>&1 && break; sleep 1; done
for img in $PRELOAD_IMAGES; do
  docker save "$img" | docker exec -i "$container" ctr -n k8s.io images import --no-unpack - >/dev/null
  # Pinned images are never garbage-collected by the kubelet: nothing could pull them back.
  # (docker save names short tags docker.io/...; registry.k8s.io names stay as they are)
  docker exec "$container" ctr -n k8s.io images label "$img" io.cri-containerd.pinned=pinned >/dev/null 2>&1 ||
    docker exec "$container" ctr -n k8s.io images label "docker.io/$img" io.cri-containerd.pinned=pinned >/dev/null
done
docker exec "$container" ctr -n k8s.io images ls -q | grep -v '^sha256:' | sort >&2
# containerd stays a zombie under `sleep` (PID 1 reaps nothing), so wait for it to stop running, not to vanish.
docker exec "$container" sh -c 'pkill -x containerd; while ps -C containerd -o stat= | grep -qv "^Z"; do sleep 0.2; done; rm -rf /run/containerd /var/log/containerd-build.log'
docker commit \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change 'CMD []' \
  --change 'ENV container=docker' \
  --change "LABEL dev.strata.inputs=$inputs" \
  "$container" "$NODE_IMAGE" >/dev/null
docker rm -f "$container" >/dev/null && container=""
docker rmi "$NODE_IMAGE-stage1" >/dev/null
echo "node image $NODE_IMAGE built" >&2
