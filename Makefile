# Strata. `make help` lists the targets.

# Versions of everything the project builds or installs; bump them here only.
KUBERNETES_VERSION ?= v1.32.4
ETCD_VERSION ?= v3.5.16
CONTROLLER_TOOLS_VERSION ?= v0.17.3
GOLANGCI_LINT_VERSION ?= v2.15.0

# Where tools and built dependencies go (git-ignored); nothing is installed outside it.
LOCALBIN ?= $(CURDIR)/bin
K8S_BIN ?= $(LOCALBIN)/k8s/$(KUBERNETES_VERSION)
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)

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
demo: ## Run the demo: a Kind cluster, Strata installed by Helm, a Dataset from a local S3 server read by a pod.
	@echo "make demo needs the Kind harness (issue: a real multi-node Kind cluster, built offline), which has not landed yet." >&2
	@echo "Until then, 'make test' runs everything that exists: the API validated by a real kube-apiserver." >&2
	@exit 1

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs from the API types.
	$(CONTROLLER_GEN) crd:allowDangerousTypes=true paths="./api/..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: verify-gen
verify-gen: manifests generate ## Fail if generated files differ from what is committed.
	@git diff --exit-code -- config/crd api || { echo "generated files are stale: run 'make manifests generate' and commit" >&2; exit 1; }

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: test
test: manifests generate fmt vet envtest-assets ## Run unit and envtest suites (not e2e).
	KUBEBUILDER_ASSETS="$(K8S_BIN)" go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v /e2e) -coverprofile cover.out

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

.PHONY: lint-fix
lint-fix: $(GOLANGCI_LINT) ## Run golangci-lint and fix what it can.
	$(GOLANGCI_LINT) run --fix ./...

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build the binaries into bin/.
	CGO_ENABLED=0 go build -o $(LOCALBIN)/ ./cmd/...

##@ Dependencies

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

.PHONY: envtest-assets
envtest-assets: $(K8S_BIN)/kube-apiserver $(K8S_BIN)/etcd ## Build kube-apiserver and etcd for envtest.

$(K8S_BIN)/kube-apiserver:
	hack/build-kube.sh $(KUBERNETES_VERSION) $(K8S_BIN) kube-apiserver

$(K8S_BIN)/etcd:
	hack/build-etcd.sh $(ETCD_VERSION) $@

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
GOBIN=$$tmp GOFLAGS=-mod=mod go install $(2)@$(3) ; \
mv $$tmp/$$(basename $(2)) $(1) ; \
rm -rf $$tmp ; \
}
endef
