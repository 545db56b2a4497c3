# Strata. `make help` lists the targets.

# Versions of everything the project builds or installs; bump them here only.
KUBERNETES_VERSION ?= v1.32.4
ETCD_VERSION ?= v3.5.16
CONTROLLER_TOOLS_VERSION ?= v0.17.3
GOLANGCI_LINT_VERSION ?= v2.15.0
KIND_VERSION ?= v0.27.0
HELM_VERSION ?= v3.17.3
COREDNS_VERSION ?= v1.11.3
# MinIO publishes no semantic versions as Go modules; this pseudo-version is its 2026-02-12 commit.
MINIO_VERSION ?= v0.0.0-20260212201848-7aac2a2c5b7c
PROTOC_GEN_GO_VERSION ?= v1.36.7
PROTOC_GEN_GO_GRPC_VERSION ?= v1.5.1

# RELEASE_VERSION is the project's release (the chart's appVersion). VERSION tags the images
# built here: the release, then the commit and a hash of any uncommitted changes
# (hack/devversion/dev-version.sh), so that each tree's images have a tag of their own and
# `make deploy` after an edit restarts what changed (Helm and the operator change nothing for a
# tag already running). Computed once, and passed to the makes this one runs.
RELEASE_VERSION ?= 0.1.0
ifndef VERSION
VERSION := $(shell hack/devversion/dev-version.sh $(RELEASE_VERSION))
endif
export VERSION
IMAGE_PREFIX ?= strata-cache

# Where tools and built dependencies go (git-ignored); nothing is installed outside it.
LOCALBIN ?= $(CURDIR)/bin
K8S_BIN ?= $(LOCALBIN)/k8s/$(KUBERNETES_VERSION)
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
KIND ?= $(LOCALBIN)/kind-$(KIND_VERSION)
HELM ?= $(LOCALBIN)/helm-$(HELM_VERSION)
COREDNS ?= $(LOCALBIN)/coredns-$(COREDNS_VERSION)
MINIO ?= $(LOCALBIN)/minio-$(MINIO_VERSION)
KUBECTL ?= $(K8S_BIN)/kubectl

# The e2e Kind cluster. Every image it runs is built here (no registry is reachable).
KIND_CLUSTER ?= strata
# The disk the cluster needs in Docker's root folder: a run of the csi and lineage suites took
# 6 GiB (nodes, images loaded into each, pods' data), and 2 more leave room to spare. kind-up and
# kind-load refuse to start with less, saying what to free.
E2E_DISK_GIB ?= 8
NODE_IMAGE ?= $(IMAGE_PREFIX)/kind-node:$(KUBERNETES_VERSION)
ROOTFS_TAR ?= $(LOCALBIN)/kind/rootfs-bookworm.tar
ROOTFS_IMAGE ?= $(IMAGE_PREFIX)/kind-rootfs:bookworm
KUBE_BINARIES := kubeadm kubelet kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy
# The images kubeadm $(KUBERNETES_VERSION) runs (`kubeadm config images list`), under their usual names.
KUBEADM_IMAGES := registry.k8s.io/kube-apiserver:$(KUBERNETES_VERSION) \
	registry.k8s.io/kube-controller-manager:$(KUBERNETES_VERSION) \
	registry.k8s.io/kube-scheduler:$(KUBERNETES_VERSION) \
	registry.k8s.io/kube-proxy:$(KUBERNETES_VERSION) \
	registry.k8s.io/coredns/coredns:$(COREDNS_VERSION) \
	registry.k8s.io/pause:3.10 \
	registry.k8s.io/etcd:$(patsubst v%,%,$(ETCD_VERSION))-0

GO_TEST_FLAGS ?= -race
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

.PHONY: demo
demo: kind-up deploy minio-deploy plugin ## Run the demo: a Kind cluster, Strata installed by Helm, a Dataset from a local S3 server read by a pod.
	KUBECTL=$(KUBECTL) KUBECTL_STRATA=$(LOCALBIN)/kubectl-strata KUBE_CONTEXT=$(KUBE_CONTEXT) TESTKIT_IMAGE=$(IMAGE_PREFIX)/testkit:e2e hack/demo.sh

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs from the API types.
	$(CONTROLLER_GEN) crd:allowDangerousTypes=true paths="./api/..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: proto
proto: ## Regenerate the master's gRPC API and Raft commands from master/masterpb/master.proto.
	LOCALBIN=$(LOCALBIN) PROTOC_GEN_GO_VERSION=$(PROTOC_GEN_GO_VERSION) \
		PROTOC_GEN_GO_GRPC_VERSION=$(PROTOC_GEN_GO_GRPC_VERSION) hack/gen-proto.sh

.PHONY: verify-gen
verify-gen: manifests generate chart-crds proto ## Fail if generated files differ from what is committed.
	@git diff --exit-code -- config/crd api charts/strata/crds master/masterpb cacheworker/workerpb || \
		{ echo "generated files are stale: run 'make manifests generate chart-crds proto' and commit" >&2; exit 1; }

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: test
test: manifests generate fmt vet envtest-assets $(MINIO) $(HELM) ## Run unit, envtest, MinIO-backed and chart suites (not e2e), and count them.
	@# hack/testsummary prints go test's package lines and failures, then how many tests ran and
	@# which were skipped, and fails when a package did (a pipe would otherwise lose the verdict).
	KUBEBUILDER_ASSETS="$(K8S_BIN)" STRATA_MINIO="$(MINIO)" HELM="$(HELM)" CONTROLLER_GEN="$(CONTROLLER_GEN)" \
		go test -json $(GO_TEST_FLAGS) $$(go list ./... | grep -v /e2e) -coverprofile cover.out 2>&1 | go run ./hack/testsummary

# BENCH_FILES is the namespace size of the failover benchmark; 1000000 for the seeds' figure.
BENCH_FILES ?= 1000
# BENCH_OBJECTS is the size of the Dataset the tree benchmarks mount and list (docs/benchmarks.md:
# 1000000; putting that many objects into MinIO takes about 17 minutes).
BENCH_OBJECTS ?= 100000

.PHONY: bench
bench: $(MINIO) ## Run the Go benchmarks, each beside the baseline it is compared with (see docs/benchmarks.md); make bench-e2e runs the whole-system ones.
	STRATA_MINIO="$(MINIO)" go test ./cacheworker/cache/ -run '^$$' -bench BenchmarkDataPath -benchmem -count=3
	STRATA_MINIO="$(MINIO)" go test ./cacheworker/dataplane/ -run '^$$' -bench BenchmarkPeerRead -benchmem -count=3
	go test ./cacheworker/tierstore/ -run '^$$' -bench AScanAgainstAHotDataset -benchtime 20x -count 3
	go test ./cacheworker/tierstore/ -run '^$$' -bench APipelineThatRereadsItsInput -benchtime 10x -count 3
	go test ./lineage/kariz/ -run '^$$' -bench KarizPolicies -benchtime 2x -timeout 60m
	STRATA_MINIO="$(MINIO)" go test ./cacheworker/checkpoint/ -run '^$$' -bench Checkpoint -benchtime 5x -count 3
	go test ./cacheworker/outputfs/ -run '^$$' -bench WritingAnOutput -benchtime 5x -count 2
	go test ./master/bench -run '^$$' -bench 'Create|Exists|Rename|Delete|List|Heartbeat' -benchtime 3000x -timeout 30m
	go test ./master/bench -run '^$$' -bench 'Failover|MemoryPerFile' -benchtime 3x -files $(BENCH_FILES) -timeout 2h
	go test ./master/bench -run '^$$' -bench Fleet -benchtime 1x -fleet-workers 1000 -v
	STRATA_BENCH_OBJECTS=$(BENCH_OBJECTS) go test ./cacheworker/fusefs/ -run '^$$' -bench MountAMillionObjects -benchtime 1x
	STRATA_BENCH_OBJECTS=$(BENCH_OBJECTS) STRATA_MINIO="$(MINIO)" go test ./cacheworker/listings/ -run '^$$' -bench ListAMillionObjects -benchtime 1x -timeout 2h
	STRATA_BENCH_OBJECTS=$(BENCH_OBJECTS) STRATA_MINIO="$(MINIO)" go test ./cacheworker/dataplane/ -run '^$$' -bench ANewMountTakesAPeersListing -benchtime 3x -timeout 2h

# The peers bench-peers runs beside Strata: Debian's packages, pinned (hack/install-peers.sh).
RCLONE_DEB_VERSION ?= 1.60.1+dfsg-2+b5
S3FS_DEB_VERSION ?= 1.90-1
# BENCH_PEERS_ARGS are more flags of hack/benchpeers, such as -rounds 5 or -small-files 1000.
BENCH_PEERS_ARGS ?=

.PHONY: bench-peers
bench-peers: $(MINIO) ## Measure Strata's data path on this host beside rclone, s3fs, tmpfs and MinIO direct, on the same objects with the same reader (needs root and FUSE; see docs/benchmarks.md).
	hack/install-peers.sh "$(RCLONE_DEB_VERSION)" "$(S3FS_DEB_VERSION)"
	CGO_ENABLED=0 go build -o $(LOCALBIN)/bench-peers/ ./cmd/master ./cmd/worker ./hack/benchpeers
	$(LOCALBIN)/bench-peers/benchpeers -master $(LOCALBIN)/bench-peers/master -worker $(LOCALBIN)/bench-peers/worker \
		-minio "$(MINIO)" -rclone /usr/bin/rclone -s3fs /usr/bin/s3fs -out $(LOCALBIN)/bench-peers.json $(BENCH_PEERS_ARGS)

# Clients and requests of each operation in make bench-master (#22 asks for 64 clients).
BENCH_MASTER_CLIENTS ?= 64
BENCH_MASTER_REQUESTS ?= 20000

.PHONY: bench-master
bench-master: $(K8S_BIN)/etcd ## Measure the master's creates and exists beside a three-member etcd's puts and gets, in one run (see docs/benchmarks.md).
	hack/bench-master.sh $(ETCD_VERSION) $(K8S_BIN)/etcd $(LOCALBIN) $(BENCH_MASTER_CLIENTS) $(BENCH_MASTER_REQUESTS)

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

.PHONY: lint-fix
lint-fix: $(GOLANGCI_LINT) ## Run golangci-lint and fix what it can.
	$(GOLANGCI_LINT) run --fix ./...

##@ Build

.PHONY: plugin
plugin: ## Build kubectl-strata, the kubectl plugin, into bin/ (put bin/ on your PATH, or copy it there).
	CGO_ENABLED=0 go build -o $(LOCALBIN)/kubectl-strata ./cmd/kubectl-strata

.PHONY: build
build: manifests generate fmt vet ## Build the binaries into bin/.
	CGO_ENABLED=0 go build -o $(LOCALBIN)/ ./cmd/...

##@ Kind cluster (offline)

.PHONY: docker-up
docker-up: ## Install and start a Docker engine if none answers.
	hack/docker-up.sh

.PHONY: kube-binaries
kube-binaries: ## Build the Kubernetes binaries of $(KUBERNETES_VERSION) from source.
	hack/build-kube.sh $(KUBERNETES_VERSION) $(K8S_BIN) $(KUBE_BINARIES)

.PHONY: kubeadm-images
kubeadm-images: docker-up kube-binaries $(K8S_BIN)/etcd $(COREDNS) rootfs-image ## Build every image kubeadm needs, FROM scratch.
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/pause ./hack/kind/pause
	hack/scratch-image.sh registry.k8s.io/pause:3.10 /pause $(LOCALBIN)/pause:/pause
	hack/scratch-image.sh registry.k8s.io/etcd:$(patsubst v%,%,$(ETCD_VERSION))-0 - $(K8S_BIN)/etcd:/usr/local/bin/etcd
	hack/scratch-image.sh registry.k8s.io/coredns/coredns:$(COREDNS_VERSION) /coredns $(COREDNS):/coredns
	for b in kube-apiserver kube-controller-manager kube-scheduler; do \
		hack/scratch-image.sh registry.k8s.io/$$b:$(KUBERNETES_VERSION) - $(K8S_BIN)/$$b:/usr/local/bin/$$b; done
	hack/kind/kube-proxy-image.sh registry.k8s.io/kube-proxy:$(KUBERNETES_VERSION) $(ROOTFS_IMAGE) $(K8S_BIN)/kube-proxy

.PHONY: rootfs-image
rootfs-image: docker-up ## Debootstrap the Debian rootfs that the node and kube-proxy images start from.
	hack/kind/build-rootfs.sh $(ROOTFS_TAR)
	docker image inspect $(ROOTFS_IMAGE) >/dev/null 2>&1 || docker import $(ROOTFS_TAR) $(ROOTFS_IMAGE) >/dev/null

.PHONY: node-image
node-image: kubeadm-images ## Build the Kind node image with every kubeadm image preloaded.
	NODE_IMAGE=$(NODE_IMAGE) KUBERNETES_VERSION=$(KUBERNETES_VERSION) K8S_BIN=$(K8S_BIN) KIND_VERSION=$(KIND_VERSION) \
		ROOTFS_IMAGE=$(ROOTFS_IMAGE) PRELOAD_IMAGES="$(KUBEADM_IMAGES)" hack/kind/build-node-image.sh

.PHONY: kind-up
kind-up: node-image $(KIND) podnet-image ## Create the Kind cluster (1 control plane, 2 workers) if it does not exist.
	hack/docker-room.sh $(E2E_DISK_GIB) $(VERSION)
	KIND=$(KIND) KUBECTL=$(KUBECTL) KIND_CLUSTER=$(KIND_CLUSTER) NODE_IMAGE=$(NODE_IMAGE) \
		PODNET_IMAGE=$(IMAGE_PREFIX)/podnet:e2e hack/kind/up.sh

.PHONY: kind-down
kind-down: $(KIND) ## Delete the Kind cluster.
	$(KIND) delete cluster --name $(KIND_CLUSTER)

.PHONY: podnet-image
podnet-image: docker-up ## The pod-network daemon of the e2e clusters.
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/podnet ./hack/podnet
	hack/scratch-image.sh $(IMAGE_PREFIX)/podnet:e2e /podnet $(LOCALBIN)/podnet:/podnet

##@ Images and deployment

# The project's images, FROM scratch with static binaries.
IMAGES := $(IMAGE_PREFIX)/operator:$(VERSION) $(IMAGE_PREFIX)/master:$(VERSION) $(IMAGE_PREFIX)/worker:$(VERSION) \
	$(IMAGE_PREFIX)/csi:$(VERSION)
# The images of the e2e test infrastructure.
E2E_IMAGES := $(IMAGE_PREFIX)/testkit:e2e $(IMAGE_PREFIX)/minio:e2e
KUBE_CONTEXT ?= kind-$(KIND_CLUSTER)
STRATA_NAMESPACE ?= strata-system
# The chart's values on the Kind cluster (where its masters and operator run).
KIND_VALUES ?= hack/kind/strata-values.yaml

.PHONY: images
images: docker-up ## Build the project's images, tagged $(VERSION).
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/images/operator ./cmd/operator
	hack/scratch-image.sh $(IMAGE_PREFIX)/operator:$(VERSION) /operator $(LOCALBIN)/images/operator:/operator
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/images/master ./cmd/master
	hack/scratch-image.sh $(IMAGE_PREFIX)/master:$(VERSION) /master $(LOCALBIN)/images/master:/master
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/images/worker ./cmd/worker
	hack/scratch-image.sh $(IMAGE_PREFIX)/worker:$(VERSION) /worker $(LOCALBIN)/images/worker:/worker
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(LOCALBIN)/images/csi ./cmd/csi
	hack/scratch-image.sh $(IMAGE_PREFIX)/csi:$(VERSION) /csi $(LOCALBIN)/images/csi:/csi

.PHONY: e2e-images
e2e-images: docker-up $(MINIO) ## Build the e2e infrastructure images: MinIO and the testkit client (with strata-bench).
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/images/testkit ./e2e/testkit
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(LOCALBIN)/images/strata-bench ./cmd/strata-bench
	hack/scratch-image.sh $(IMAGE_PREFIX)/testkit:e2e /testkit $(LOCALBIN)/images/testkit:/testkit $(LOCALBIN)/images/strata-bench:/strata-bench
	hack/scratch-image.sh $(IMAGE_PREFIX)/minio:e2e /minio $(MINIO):/minio

.PHONY: kind-load
kind-load: images e2e-images $(KIND) ## Load the images into the Kind cluster.
	hack/docker-room.sh $(E2E_DISK_GIB) $(VERSION)
	for img in $(IMAGES) $(E2E_IMAGES); do $(KIND) load docker-image --name $(KIND_CLUSTER) $$img >/dev/null; done

.PHONY: chart-crds
chart-crds: manifests ## Copy the generated CRDs into the chart.
	mkdir -p charts/strata/crds && cp config/crd/bases/*.yaml charts/strata/crds/

.PHONY: deploy
deploy: chart-crds $(HELM) $(KUBECTL) kind-load ## Install or upgrade Strata in the Kind cluster with Helm.
	@# Helm installs a chart's CRDs once and never upgrades them: apply them first, so that an
	@# upgraded operator finds the fields it writes (the API server drops unknown ones).
	$(KUBECTL) --context $(KUBE_CONTEXT) apply --server-side --force-conflicts -f charts/strata/crds/
	$(HELM) upgrade --install strata charts/strata --kube-context $(KUBE_CONTEXT) \
		--namespace $(STRATA_NAMESPACE) --create-namespace --values $(KIND_VALUES) --set image.tag=$(VERSION) --wait --timeout 5m

.PHONY: undeploy
undeploy: $(HELM) ## Uninstall Strata from the Kind cluster (CRDs and Datasets stay, as Helm keeps CRDs).
	$(HELM) uninstall strata --kube-context $(KUBE_CONTEXT) --namespace $(STRATA_NAMESPACE) --wait

.PHONY: minio-deploy
minio-deploy: $(KUBECTL) ## Run MinIO in the Kind cluster as the S3 under-store.
	$(KUBECTL) --context $(KUBE_CONTEXT) apply -f hack/minio/minio.yaml
	$(KUBECTL) --context $(KUBE_CONTEXT) -n minio rollout status deployment/minio --timeout=180s

##@ End-to-end tests

E2E_KEEP_CLUSTER ?=
E2E_TIMEOUT ?= 60m

.PHONY: e2e
e2e: ## Run every e2e suite on the Kind cluster but the upgrade (make e2e-upgrade); it is deleted afterwards unless E2E_KEEP_CLUSTER=1.
	$(MAKE) e2e-run E2E_LABELS='!upgrade'

# The smoke subset takes about 26 minutes here (2 cores); its own deadline makes a hung spec fail
# CI with the suite's report long before CI's own limit would cut it off with none, and leaves
# room for a machine a third slower.
E2E_SMOKE_TIMEOUT ?= 40m

.PHONY: e2e-smoke
e2e-smoke: ## Run the short e2e subset that CI runs.
	$(MAKE) e2e-run E2E_LABELS=smoke E2E_TIMEOUT=$(E2E_SMOKE_TIMEOUT)

.PHONY: bench-e2e
bench-e2e: ## Run the whole-system benchmarks on Kind (see docs/benchmarks.md).
	$(MAKE) e2e-run E2E_LABELS=bench

# The release e2e-upgrade starts from: the last commit before components spoke mutual TLS.
PREVIOUS_REF ?= 5777aab
PREVIOUS_TAG ?= previous
PREVIOUS_DIR ?= $(LOCALBIN)/previous

.PHONY: previous-release
previous-release: docker-up ## Unpack the chart of $(PREVIOUS_REF) and build its images, tagged $(PREVIOUS_TAG).
	rm -rf $(PREVIOUS_DIR) && mkdir -p $(PREVIOUS_DIR)
	git archive $(PREVIOUS_REF) | tar -x -C $(PREVIOUS_DIR)
	$(MAKE) -C $(PREVIOUS_DIR) images VERSION=$(PREVIOUS_TAG) LOCALBIN=$(PREVIOUS_DIR)/bin

.PHONY: e2e-upgrade
e2e-upgrade: kind-up previous-release kind-load $(HELM) $(KUBECTL) ## Install $(PREVIOUS_REF) on Kind, then run the specs that upgrade it to this chart while a pod reads.
	for img in operator master worker csi; do \
		$(KIND) load docker-image --name $(KIND_CLUSTER) $(IMAGE_PREFIX)/$$img:$(PREVIOUS_TAG) >/dev/null; done
	$(KUBECTL) --context $(KUBE_CONTEXT) apply --server-side --force-conflicts -f $(PREVIOUS_DIR)/charts/strata/crds/
	$(HELM) upgrade --install strata $(PREVIOUS_DIR)/charts/strata --kube-context $(KUBE_CONTEXT) \
		--namespace $(STRATA_NAMESPACE) --create-namespace --values $(KIND_VALUES) --wait --timeout 5m \
		--set image.tag=$(PREVIOUS_TAG),master.image.tag=$(PREVIOUS_TAG),worker.image.tag=$(PREVIOUS_TAG),csi.image.tag=$(PREVIOUS_TAG)
	$(MAKE) minio-deploy
	status=0; \
	KUBECTL=$(KUBECTL) HELM=$(HELM) E2E_IMAGE_TAG=$(VERSION) E2E_KUBE_CONTEXT=$(KUBE_CONTEXT) E2E_STRATA_NAMESPACE=$(STRATA_NAMESPACE) \
		E2E_UPGRADE_FROM=$(PREVIOUS_REF) go test -tags e2e ./e2e/ -count=1 -timeout $(E2E_TIMEOUT) -v -ginkgo.v -ginkgo.label-filter=upgrade || status=$$?; \
	if [ -z "$(E2E_KEEP_CLUSTER)" ]; then $(KIND) delete cluster --name $(KIND_CLUSTER); fi; \
	exit $$status

.PHONY: e2e-run
e2e-run: kind-up deploy minio-deploy
	status=0; \
	KUBECTL=$(KUBECTL) HELM=$(HELM) E2E_IMAGE_TAG=$(VERSION) E2E_KUBE_CONTEXT=$(KUBE_CONTEXT) E2E_STRATA_NAMESPACE=$(STRATA_NAMESPACE) \
		go test -tags e2e ./e2e/ -count=1 -timeout $(E2E_TIMEOUT) -v -ginkgo.v -ginkgo.label-filter="$(E2E_LABELS)" || status=$$?; \
	if [ -z "$(E2E_KEEP_CLUSTER)" ]; then $(KIND) delete cluster --name $(KIND_CLUSTER); fi; \
	exit $$status

##@ Dependencies

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

.PHONY: minio
minio: $(MINIO) ## Build the MinIO server that tests, benchmarks and the e2e cluster use as S3.

.PHONY: envtest-assets
envtest-assets: $(K8S_BIN)/kube-apiserver $(K8S_BIN)/etcd ## Build kube-apiserver and etcd for envtest.

$(K8S_BIN)/kube-apiserver:
	hack/build-kube.sh $(KUBERNETES_VERSION) $(K8S_BIN) kube-apiserver

$(K8S_BIN)/etcd:
	hack/build-etcd.sh $(ETCD_VERSION) $@

$(K8S_BIN)/kubectl:
	hack/build-kube.sh $(KUBERNETES_VERSION) $(K8S_BIN) kubectl

$(KIND): | $(LOCALBIN)
	$(call go-install-tool,$(KIND),sigs.k8s.io/kind,$(KIND_VERSION))

$(HELM): | $(LOCALBIN)
	$(call go-install-tool,$(HELM),helm.sh/helm/v3/cmd/helm,$(HELM_VERSION))

$(COREDNS): | $(LOCALBIN)
	$(call go-install-tool,$(COREDNS),github.com/coredns/coredns,$(COREDNS_VERSION))

$(MINIO): | $(LOCALBIN)
	$(call go-install-tool,$(MINIO),github.com/minio/minio,$(MINIO_VERSION))

$(CONTROLLER_GEN): | $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

$(GOLANGCI_LINT): | $(LOCALBIN)
	$(call go-install-tool,$(GOLANGCI_LINT),github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

# go-install-tool installs $(2)@$(3) as the versioned binary $(1), so that a version bump
# in this file always rebuilds the tool.
define go-install-tool
@[ -f "$(1)" ] || { \
set -e; \
echo "installing $(2)@$(3)" ; \
tmp=$$(mktemp -d) ; \
GOBIN=$$tmp GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath $(2)@$(3) ; \
mv $$tmp/$$(basename $(2)) $(1) ; \
rm -rf $$tmp ; \
}
endef
