#!/usr/bin/env bash
# The demo that `make demo` runs once the Kind cluster is up, Strata is installed and MinIO runs:
# put a few objects into MinIO, declare them as a Dataset, and read them in a pod through the
# Dataset's PVC, comparing every checksum with what was written.
#
# Environment (set by the Makefile): KUBECTL, KUBE_CONTEXT, TESTKIT_IMAGE.
set -euo pipefail
: "${KUBECTL:?}" "${KUBE_CONTEXT:?}" "${TESTKIT_IMAGE:?}"
ns=strata-demo
endpoint=http://minio.minio.svc:9000
keys=images/cat.jpg,images/dog.jpg,labels/all.csv
kubectl() { "$KUBECTL" --context "$KUBE_CONTEXT" "$@"; }
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }

# run_testkit NAME ARGS... runs testkit in a pod of the demo namespace and prints its output.
run_testkit() {
  local name=$1; shift
  kubectl -n "$ns" delete pod "$name" --ignore-not-found --wait >/dev/null
  kubectl -n "$ns" run "$name" --restart=Never --image="$TESTKIT_IMAGE" --image-pull-policy=Never \
    --overrides='{"spec":{"containers":[{"name":"'"$name"'","image":"'"$TESTKIT_IMAGE"'","imagePullPolicy":"Never",
      "env":[{"name":"AWS_ACCESS_KEY_ID","valueFrom":{"secretKeyRef":{"name":"minio-credentials","key":"accessKeyID"}}},
             {"name":"AWS_SECRET_ACCESS_KEY","valueFrom":{"secretKeyRef":{"name":"minio-credentials","key":"secretAccessKey"}}}],
      "args":'"$(printf '%s\n' "$@" | jq -R . | jq -sc .)"'}]}}' >/dev/null
  kubectl -n "$ns" wait pod "$name" --for=jsonpath='{.status.phase}'=Succeeded --timeout=120s >/dev/null
  kubectl -n "$ns" logs "$name"
}

say "1. A namespace, and the S3 credentials in a Secret of that namespace"
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
user=$(kubectl -n minio get secret minio-root -o jsonpath='{.data.MINIO_ROOT_USER}' | base64 -d)
password=$(kubectl -n minio get secret minio-root -o jsonpath='{.data.MINIO_ROOT_PASSWORD}' | base64 -d)
kubectl -n "$ns" create secret generic minio-credentials \
  --from-literal=accessKeyID="$user" --from-literal=secretAccessKey="$password" \
  --dry-run=client -o yaml | kubectl apply -f - >/dev/null

say "2. Three objects written into s3://demo/ (sizes and checksums as written)"
written=$(run_testkit demo-put s3 put --endpoint "$endpoint" --bucket demo --key "$keys" --size 3145728 --seed 1)
echo "$written"

say "3. The Dataset, as a user declares it"
kubectl apply -f - <<YAML
apiVersion: data.strata.dev/v1alpha1
kind: TierPool
metadata:
  name: default
spec:
  nodeSelector: {strata.dev/cache: "true"}
  tiers:
    - {name: mem, medium: MEM, paths: [/mnt/strata/mem], quota: 512Mi}
    - {name: nvme, medium: NVME, paths: [/mnt/strata/nvme], quota: 2Gi}
---
apiVersion: data.strata.dev/v1alpha1
kind: Dataset
metadata:
  name: pictures
  namespace: $ns
spec:
  source:
    uri: s3://demo/
    endpoint: $endpoint
    secretRef: {name: minio-credentials}
  preload: true
YAML
kubectl get tierpools
kubectl -n "$ns" get datasets -o wide

say "4. Waiting for the Dataset to be Ready"
# The first time, the workers start on both nodes: give them a few minutes.
if ! kubectl -n "$ns" wait dataset pictures --for=condition=Ready --timeout=180s >/dev/null 2>&1; then
  kubectl -n "$ns" get dataset pictures -o wide
  reason=$(kubectl -n "$ns" get dataset pictures -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}')
  message=$(kubectl -n "$ns" get dataset pictures -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}')
  echo >&2
  echo "The Dataset is not Ready: $reason: $message" >&2
  exit 1
fi
pvc=$(kubectl -n "$ns" get dataset pictures -o jsonpath='{.status.persistentVolumeClaimName}')

say "5. A pod reads the Dataset through $pvc"
kubectl -n "$ns" delete pod demo-read --ignore-not-found --wait >/dev/null
kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: demo-read}
spec:
  restartPolicy: Never
  containers:
    - name: read
      image: $TESTKIT_IMAGE
      imagePullPolicy: Never
      args: [sum, /data]
      volumeMounts: [{name: pictures, mountPath: /data, readOnly: true}]
  volumes:
    - name: pictures
      persistentVolumeClaim: {claimName: $pvc, readOnly: true}
YAML
kubectl -n "$ns" wait pod demo-read --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s >/dev/null
read=$(kubectl -n "$ns" logs demo-read)
echo "$read"

strip() { jq -c '{key, bytes, sha256}' | sort; }
if [ "$(echo "$written" | strip)" = "$(echo "$read" | strip)" ]; then
  say "Every byte the pod read matches what was written to S3."
  say "6. The Dataset, as kubectl shows it (preloaded, so cached before the pod read it)"
  kubectl -n "$ns" get dataset pictures
else
  echo "MISMATCH between the objects written and the files the pod read" >&2
  exit 1
fi
