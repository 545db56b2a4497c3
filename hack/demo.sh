#!/usr/bin/env bash
# The demo that `make demo` runs once the Kind cluster is up, Strata is installed and MinIO runs:
# put a few objects into MinIO, declare them as a Dataset, and read them in a pod through the
# Dataset's PVC, comparing every checksum with what was written. Then a two-step pipeline
# writes its outputs once, into the memory of one node; that node stops (docker stop), and a
# pod on the other node reads the last output once, with no retry of its own: its reads wait
# while the output is recomputed from lineage (the node stays down), and it reads it whole. The node starts again at the end.
#
# Along the way, `kubectl strata` (bin/kubectl-strata) shows where each file's blocks are and
# the pipeline as it runs.
#
# Environment (set by the Makefile): KUBECTL, KUBECTL_STRATA, KUBE_CONTEXT, TESTKIT_IMAGE. Needs
# docker (the Kind nodes are its containers).
set -euo pipefail
: "${KUBECTL:?}" "${KUBECTL_STRATA:?}" "${KUBE_CONTEXT:?}" "${TESTKIT_IMAGE:?}"
ns=strata-demo
endpoint=http://minio.minio.svc:9000
keys=images/cat.jpg,images/dog.jpg,labels/all.csv
kubectl() { "$KUBECTL" --context "$KUBE_CONTEXT" "$@"; }
# strata runs `kubectl strata` in the demo namespace, shown as a user would type it.
strata() {
  printf '$ kubectl strata %s\n' "$*"
  "$KUBECTL_STRATA" --context "$KUBE_CONTEXT" -n "$ns" "$@"
}
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

# reader_pod NAME CLAIM NODE ARGS... starts a testkit pod that runs ARGS with CLAIM mounted
# read-only at /data, on NODE (empty: wherever the scheduler puts it).
reader_pod() {
  local name=$1 claim=$2 node=$3; shift 3
  local placement=""
  [ -z "$node" ] || placement="nodeSelector: {kubernetes.io/hostname: $node}"
  kubectl -n "$ns" delete pod "$name" --ignore-not-found --wait >/dev/null
  kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  restartPolicy: Never
  $placement
  containers:
    - name: read
      image: $TESTKIT_IMAGE
      imagePullPolicy: Never
      args: $(printf '%s\n' "$@" | jq -R . | jq -sc .)
      volumeMounts: [{name: data, mountPath: /data, readOnly: true}]
  volumes:
    - name: data
      persistentVolumeClaim: {claimName: $claim, readOnly: true}
YAML
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
reader_pod demo-read "$pvc" "" sum /data
kubectl -n "$ns" wait pod demo-read --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s >/dev/null
read=$(kubectl -n "$ns" logs demo-read)
echo "$read"

strip() { jq -c '{key, bytes, sha256}' | sort; }
if [ "$(echo "$written" | strip)" = "$(echo "$read" | strip)" ]; then
  say "Every byte the pod read matches what was written to S3."
  say "6. The Dataset, as kubectl shows it (preloaded, so cached before the pod read it), and where its blocks are"
  kubectl -n "$ns" get dataset pictures
  strata ls pictures
else
  echo "MISMATCH between the objects written and the files the pod read" >&2
  exit 1
fi

# The cache nodes: the pipeline writes on the first, the waiting reader runs on the second. The
# control plane, where the operator runs, is never stopped.
mapfile -t cache_nodes < <(kubectl get nodes -l strata.dev/cache=true -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
writer=${cache_nodes[0]} other=${cache_nodes[1]}
# A stopped node is started again however the demo ends.
stopped=""
trap '[ -z "$stopped" ] || docker start "$stopped" >/dev/null' EXIT

say "7. A two-step pipeline: thumbnails from the pictures, then an index of the thumbnails, each written once into memory on $writer"
kubectl -n "$ns" delete pod demo-wait --ignore-not-found --wait >/dev/null
kubectl -n "$ns" delete lineage make-thumbnails build-index --ignore-not-found --wait >/dev/null
kubectl -n "$ns" delete dataset thumbnails index --ignore-not-found --wait >/dev/null
step() { # step NAME INPUT OUTPUT: a Lineage whose Job copies INPUT into OUTPUT, on $writer if it can
  cat <<YAML
---
apiVersion: data.strata.dev/v1alpha1
kind: Dataset
metadata: {name: $3, namespace: $ns}
spec:
  lineage: {name: $1}
---
apiVersion: data.strata.dev/v1alpha1
kind: Lineage
metadata: {name: $1, namespace: $ns}
spec:
  inputs: [$2]
  outputs: [$3]
  template:
    spec:
      backoffLimit: 0
      template:
        spec:
          restartPolicy: Never
          # Preferred, not required: once $writer is gone, a recomputation runs elsewhere.
          affinity:
            nodeAffinity:
              preferredDuringSchedulingIgnoredDuringExecution:
                - weight: 100
                  preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$writer]}]}
          containers:
            - name: step
              image: $TESTKIT_IMAGE
              imagePullPolicy: Never
              args: [copy, /data/in, /data/out]
              volumeMounts:
                - {name: input, mountPath: /data/in, readOnly: true}
                - {name: output, mountPath: /data/out}
          volumes:
            - name: input
              persistentVolumeClaim: {claimName: $2, readOnly: true}
            - name: output
              persistentVolumeClaim: {claimName: $3}
YAML
}
pipeline=$(step make-thumbnails pictures thumbnails; step build-index thumbnails index)
echo "$pipeline"
echo "$pipeline" | kubectl apply -f - >/dev/null
for l in make-thumbnails build-index; do
  if ! kubectl -n "$ns" wait lineage "$l" --for=jsonpath='{.status.conditions[?(@.type=="Ready")].reason}'=Written --timeout=300s >/dev/null; then
    kubectl -n "$ns" get lineage "$l" -o jsonpath='{range .status.conditions[*]}{.type}: {.reason}: {.message}{"\n"}{end}' >&2
    exit 1
  fi
done
kubectl -n "$ns" get lineages
kubectl -n "$ns" get datasets thumbnails index -o wide
for d in thumbnails index; do
  echo "$d lives on: $(kubectl -n "$ns" get dataset "$d" -o jsonpath='{.status.nodes[*].node}'), in memory, and nowhere else (no checkpoint)"
done
strata lineage
strata ls index

say "8. $writer stops (docker stop): the outputs in its memory are gone (the master notices within a minute)"
docker stop "$writer" >/dev/null
stopped=$writer

say "9. A pod on $other reads the index once, with no retry of its own: its reads wait while Strata recomputes what was lost from lineage, parents first"
reader_pod demo-wait index "$other" sum /data
lineage_columns='LINEAGE:.metadata.name,RECOMPUTING:.status.conditions[?(@.type=="Recomputing")].reason,RECOMPUTATIONS:.status.recomputations,READY:.status.conditions[?(@.type=="Ready")].reason'
deadline=$((SECONDS + 600))
until [ "$(kubectl -n "$ns" get pod demo-wait -o jsonpath='{.status.phase}')" = Succeeded ]; do
  phase=$(kubectl -n "$ns" get pod demo-wait -o jsonpath='{.status.phase}')
  if [ "$phase" = Failed ] || [ $SECONDS -gt $deadline ]; then
    echo "The waiting pod did not read the index (phase $phase):" >&2
    kubectl -n "$ns" logs demo-wait >&2 || true
    kubectl -n "$ns" get lineages,datasets -o wide >&2
    exit 1
  fi
  echo "  $(date +%T)"
  kubectl -n "$ns" get lineages -o custom-columns="$lineage_columns" | sed 's/^/  /'
  sleep 15
done
recomputed=$(kubectl -n "$ns" logs demo-wait | grep '^{')
echo "$recomputed"
if [ "$(echo "$written" | strip)" != "$(echo "$recomputed" | strip)" ]; then
  echo "MISMATCH between the objects written to S3 and the recomputed index" >&2
  exit 1
fi
say "Every byte of the recomputed index matches what was written to S3, read in one pass by a pod that never restarted."
kubectl -n "$ns" get lineages -o custom-columns="$lineage_columns"
strata ls index

say "10. $writer starts again"
docker start "$writer" >/dev/null
stopped=""
kubectl wait node "$writer" --for=condition=Ready --timeout=240s >/dev/null
kubectl -n strata-system wait pod --field-selector spec.nodeName="$writer" --for=condition=Ready --timeout=240s >/dev/null
kubectl get nodes
