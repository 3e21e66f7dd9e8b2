# clade: `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
DATA_DIR ?= /var/lib/clade
IMAGES_DIR ?= /var/cache/clade/images
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# runsc built from the module proxy has no version of its own: give it the module's.
RUNSC_VERSION := $(shell awk '$$1 == "gvisor.dev/gvisor" {print $$2}' tools/runsc/go.mod)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: deps-weed help deps deps-test deps-qemu build demo demo-cluster test test-bin test-slow test-qemu soak bench gobench lint fmt generate clean

help: ## show this help
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

deps: ## install what clade needs: Debian packages and runsc (pinned, built from the Go module proxy)
	@command -v debootstrap >/dev/null && command -v ip >/dev/null && command -v mkfs.ext4 >/dev/null && \
		command -v gocryptfs >/dev/null && command -v fusermount3 >/dev/null && command -v mkfs.xfs >/dev/null && \
		command -v tmux >/dev/null && test -f /usr/share/bash-completion/bash_completion || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap iproute2 e2fsprogs xfsprogs gocryptfs fuse3 ca-certificates tmux bash-completion)
	@mkdir -p $(BIN)
	@if [ ! -x $(BIN)/runsc ]; then echo "building runsc (about a minute)"; \
		CGO_ENABLED=0 $(GO) build -C tools/runsc -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(RUNSC_VERSION)" \
		-o ../../$(BIN)/runsc gvisor.dev/gvisor/runsc; fi
	@$(BIN)/runsc --version | head -1

QEMU_DIR ?= /var/cache/clade/qemu

deps-qemu: ## what the qemu engine needs: Debian's qemu-system-x86, and the cloud kernel extracted into $(QEMU_DIR) (not installed)
	@command -v qemu-system-x86_64 >/dev/null && command -v lz4 >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 lz4)
	@./scripts/qemu-guest.sh $(QEMU_DIR)

build: ## build bin/clade and bin/clade-agent (static)
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/clade ./cmd/clade
	CGO_ENABLED=0 $(GO) build -ldflags "-s -w" -o $(BIN)/clade-agent ./cmd/clade-agent

demo: deps build ## start a daemon, run Python in a sandbox, copy files in and out, clean up
	@BIN=$(BIN) DATA_DIR=$(DATA_DIR) IMAGES_DIR=$(IMAGES_DIR) ./scripts/demo.sh

demo-cluster: deps deps-weed build ## three nodes in network namespaces, a 3-member etcd among them and an S3 store: a sandbox forked 6 across the nodes, slept, its node killed, woken through another node's ingress (root)
	@BIN=$(BIN) IMAGES_DIR=$(IMAGES_DIR) ./scripts/demo-cluster.sh

E2B_JS := internal/front/e2b/testdata/js

deps-weed: ## SeaweedFS's weed (its S3 gateway is the object store of the snapstore tests), pinned in tools/weed, built from the Go module proxy into $(BIN)/weed
	@mkdir -p $(BIN)
	@if [ ! -x $(BIN)/weed ] || [ tools/weed/go.mod -nt $(BIN)/weed ]; then echo "building weed (several minutes on 2 cores)"; \
		CGO_ENABLED=0 $(GO) build -C tools/weed -o ../../$(BIN)/weed github.com/seaweedfs/seaweedfs/weed; fi

deps-test: deps deps-weed ## what the tests need beyond `deps`: weed, procps (pgrep), the pinned E2B JS clients (npm ci, again only when the lockfile changed)
	@command -v pgrep >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq procps)
	@command -v npm >/dev/null || (echo "npm not found: the E2B tests drive the real JS clients; install Node.js 20 and npm (apt-get install nodejs npm)"; exit 1)
	@if [ ! -f $(E2B_JS)/node_modules/.package-lock.json ] || [ $(E2B_JS)/package-lock.json -nt $(E2B_JS)/node_modules/.package-lock.json ]; then \
		npm ci --prefix $(E2B_JS) --no-audit --no-fund; fi

# The test processes share one build of clade and clade-agent ($CLADE_TEST_BIN,
# see testenv.Binaries) instead of each package's linking its own.
TEST_BIN := $(BIN)/test

test-bin:
	CGO_ENABLED=0 $(GO) build -o $(TEST_BIN)/clade ./cmd/clade
	CGO_ENABLED=0 $(GO) build -o $(TEST_BIN)/clade-agent ./cmd/clade-agent

test: deps-test ## run the whole test suite (needs root: real runsc) but the long tests of test-slow and the three-node clusters of test-cluster; installs what it needs first
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1)
	@$(MAKE) --no-print-directory test-bin
	CLADE_TEST_BIN=$(abspath $(TEST_BIN)) $(GO) test -count=1 -timeout 45m -skip '$(CLUSTER_TESTS)' ./...

# The cluster tests that run several daemons in network namespaces with a
# 3-member etcd among them and real SeaweedFS (TestNetCluster*): 15-30 min
# on 2 cores, so they have a target of their own, which CI runs too. The
# cluster's other tests (one node, logic) stay in `make test`.
CLUSTER_TESTS := ^TestNetCluster

test-cluster: deps-test ## the multi-node cluster tests (daemons in network namespaces, a 3-member etcd, SeaweedFS's S3) that `make test` leaves out (CI runs both)
	@$(MAKE) --no-print-directory test-bin
	CLADE_TEST_BIN=$(abspath $(TEST_BIN)) $(GO) test -count=1 -timeout 60m -run '$(CLUSTER_TESTS)' ./internal/cluster/

# Tests too long for `make test` (they call testenv.Slow): a soak, a kill
# loop, a sweep. CI runs them too; testenv's TestSlowTestsListed keeps these
# lists true.
SLOW_TESTS := TestSoak|TestVolumeSnapshotKilledAnywhere|TestViewFullDisk
SLOW_PKGS := ./internal/soak/ ./internal/volume/ ./internal/engine/gvisor/

test-slow: deps-test ## the long tests `make test` leaves out (CI runs both)
	@$(MAKE) --no-print-directory test-bin
	CLADE_TEST_BIN=$(abspath $(TEST_BIN)) CLADE_TEST_SLOW=1 $(GO) test -count=1 -timeout 45m -run '^($(SLOW_TESTS))$$' $(SLOW_PKGS)

test-qemu: deps deps-qemu ## the qemu engine's tests (real microVMs; slow under TCG, so not in `make test`)
	$(GO) vet -tags qemu ./internal/engine/qemu/
	$(GO) test -tags qemu -count=1 -p 1 -timeout 30m -v ./internal/engine/qemu/

soak: deps ## chaos soak: CLADE_SOAK_OPS (500) random operations under daemon kills and a full disk; CLADE_SOAK_SEED repeats a run
	CLADE_TEST_SLOW=1 CLADE_SOAK_OPS=$${CLADE_SOAK_OPS:-500} $(GO) test -count=1 -v -run '^TestSoak$$' -timeout 4h ./internal/soak/

bench: deps build ## quick `clade bench --baseline` run on a scratch daemon (JSON in bench.json)
	@BIN=$(BIN) IMAGES_DIR=$(IMAGES_DIR) ./scripts/bench.sh

gobench: deps ## go test benchmarks (internal/bench, agent link)
	$(GO) test -run XXX -bench . -benchtime 30x -timeout 20m ./internal/bench/ ./internal/engine/gvisor/

lint: ## go vet and gofmt
	$(GO) vet ./...
	@gofmt -l $$(git ls-files '*.go')

clean: ## remove built binaries
	rm -rf $(BIN)
