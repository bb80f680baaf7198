# WorkManager. The two commands: `make run` (whole stack on loopback) and
# `make test` (everything). Both install what is missing: Debian packages via
# apt-get (through sudo when not root) and pinned Go tools into .tools/.

SHELL := /bin/bash
# -trimpath keeps the checkout's path out of every build, so Go's build
# cache serves a fresh clone elsewhere (CI) what an earlier build of the
# same sources compiled; without it each clone compiles every package of
# the module again, four ways (vet, race, tests, binaries).
# -ldflags=-w: no DWARF tables; a link costs ~20% less CPU (make test links
# about sixty test binaries), and stack traces and race reports keep their
# file:line (they come from the symbol table, not DWARF).
# -gcflags=all=-dwarf=false: nor does the compiler generate the DWARF the
# linker would drop: a cold build of the temporal CLI took 213 CPU-seconds
# against 241 (12 % less; 112 s against 126 s alone on 2 cores). For a
# debugger (Delve): GOFLAGS=-trimpath make build.
GOFLAGS ?= -trimpath -ldflags=-w -gcflags=all=-dwarf=false
export GOFLAGS
TOOLS := $(CURDIR)/.tools/bin
TEMPORAL_CLI_VERSION := v1.5.1
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
GRPCURL_VERSION := v1.9.3
WORKFLOWCHECK_VERSION := v0.6.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The builds of the tools and bin/ run the compiler with GOGC=400: it
# collects its garbage a quarter as often (daprd on a cold cache, measured
# once each: 232 CPU-seconds against 257; a compile's memory, about 1 GB at
# most here, is no bound on these machines). Only there: GOGC is not part
# of Go's cache keys, and the tests' own processes keep the default.
BUILD_ENV := GOGC=400
TEST_TIMEOUT ?= 35m
# Integration tests run this many at a time, longest first (the package's
# own scheduler, test/integration/schedule_test.go; go test's -parallel is
# set above the number of tests so that it does not choose), each on a
# stack of its own (TestSharedStack runs the rest one after another on one
# shared stack): most of their time is spent waiting on timeouts,
# redeliveries and leases. Three, not four, since 2026-12-02: on a
# machine whose page faults cost 12 us (a paravirtualized MMU,
# docs/performance.md) four stacks beside the checks and the soak starved
# nodes past their heartbeats (a create's workflow task picked up 20 s
# late, a group's messages redelivered); the checks, about 16 minutes
# there, stay the longer part, so the run does not get longer. Two since
# the fifty-fourth session (2026-12-02): with three, two clean-clone runs
# and a make test of four failed on a starved test each
# (TestGroupMutualExclusionAcrossNodes redelivered a group's messages,
# TestStaleApplyDoesNotResurrectADeletedWorker's paused node held the
# create's first workflow task, a -race unit test's sleep outrun).
INTEGRATION_PARALLEL ?= 2
INTEGRATION_FLAGS = -parallel 64
UNIT_PACKAGES = $$(go list ./... | grep -v /test/integration)
REQUIRE_SANDBOX = $$([ "$$(id -u)" = 0 ] && echo 1)

.PHONY: run grpcurl test test-tools test-checks test-go test-race chaos-short unit integration bench fuzz fuzz-short pytest deps deps-test tools proto build clean vet k8s-validate daprd-test

# The Debian packages install while the Go builds compile (no build needs
# them: nothing here uses cgo); grpcurl is not built (bin/wmctl is the CLI;
# `make grpcurl` or `make test` builds it). On a fresh machine that is
# about 5 minutes, mostly the cold compile (docs/development.md).
run:
	@$(MAKE) --no-print-directory -s -j4 deps tools build
	bin/devstack $(RUN_FLAGS)

grpcurl: $(TOOLS)/grpcurl-$(GRPCURL_VERSION).stamp

# As root (the dev machines) every sandbox layer exists: the sandbox tests
# must run, not skip.
# The integration tests (the real Temporal, daprd, Redis, Python and Mono;
# mostly waiting on timeouts, redeliveries and leases) and, beside them,
# the soak's 2-minute version (TestChaosShort) start first, in the
# background, in a process group of their own (deploy/setup/stack-tests),
# on the binaries of bin/ (WM_BIN_DIR: built once); meanwhile the checks run:
# vet, the DevKit's and the manifests' suites, our daprd component's test,
# every other package under the race detector (what `make unit` runs,
# without -short) and the fuzz targets, at a lower CPU priority (nice 5).
# The integration tests run in a session of their own (setsid): where the
# kernel groups the scheduler by session (autogroup, on here), that gives
# them half the machine however busy the checks keep the other half, and
# the nice orders the checks only against what else runs in make's own
# session. Then the integration log and the soak's report are shown. A
# failed check stops the integration tests and the soak.
# Each test's own time (its wait for a turn left out) goes to
# $(INTEGRATION_TIMES), the slowest first; its head is shown at the end.
# A failed test's full stack logs are kept in $(FAILED_LOGS).
INTEGRATION_LOG := .run/test/integration.log
INTEGRATION_TIMES := .run/test/integration-times.txt
FAILED_LOGS := .run/test/failed
CHAOS_LOG := .run/test/chaos.log
CHAOS_REPORT := .run/test/chaos-report.txt
TEST_T0 := .run/test/t0
# Seconds since make test began (for the "==> ... after N s" lines).
SINCE_T0 = $$(( $$(date +%s) - $$(cat $(CURDIR)/$(TEST_T0)) ))
test: test-tools
	@mkdir -p $(dir $(INTEGRATION_LOG)); rm -rf $(INTEGRATION_TIMES) $(FAILED_LOGS); date +%s > $(TEST_T0); \
	WM_REQUIRE_SANDBOX=$(REQUIRE_SANDBOX) WM_INTEGRATION_PARALLEL=$(INTEGRATION_PARALLEL) WM_INTEGRATION_TIMES=$(CURDIR)/$(INTEGRATION_TIMES) WM_FAILED_LOGS=$(CURDIR)/$(FAILED_LOGS) \
	WM_BIN_DIR=$(CURDIR)/bin setsid deploy/setup/stack-tests $(CURDIR)/$(dir $(INTEGRATION_LOG)) -- -count=1 -timeout $(TEST_TIMEOUT) $(INTEGRATION_FLAGS) \
		& integ=$$!; \
	trap 'kill -TERM -- -$$integ 2>/dev/null' EXIT; \
	echo "==> integration tests and the 2-minute soak started in the background (logs: $(INTEGRATION_LOG), $(CHAOS_LOG)); the checks run meanwhile"; \
	rc=0; nice -n 5 $(MAKE) --no-print-directory test-checks || rc=$$?; \
	if [ $$rc != 0 ]; then echo "==> a check failed after $(SINCE_T0) s: stopping the integration tests and the soak"; exit $$rc; fi; \
	echo "==> checks passed after $(SINCE_T0) s; waiting for the integration tests and the soak"; \
	wait $$integ; irc=$$?; trap - EXIT; \
	cat $(INTEGRATION_LOG); \
	if [ -f $(INTEGRATION_TIMES) ]; then head -25 $(INTEGRATION_TIMES); echo "    (all: $(INTEGRATION_TIMES))"; fi; \
	if [ "$$(cat $(CHAOS_LOG:.log=.rc) 2>/dev/null)" = 0 ]; then echo "==> TestChaosShort passed:"; cat $(CHAOS_REPORT); \
	else echo "==> TestChaosShort failed ($(CHAOS_LOG)):"; tail -n 300 $(CHAOS_LOG); fi; \
	echo "==> make test took $(SINCE_T0) s"; \
	exit $$irc

# The fault-injection soak's 2-minute fixed version (issue 25, test/chaos:
# each of its seven fault kinds once, 2 nodes, seed 7) on a stack of its
# own, its report at the end; about 3 minutes alone. make test runs it
# too, beside the integration tests (deploy/setup/stack-tests).
chaos-short: deps tools
	@mkdir -p $(dir $(CHAOS_LOG)); rm -f $(CHAOS_REPORT); \
	if WM_CHAOS_SHORT=1 CHAOS_REPORT=$(CURDIR)/$(CHAOS_REPORT) WM_FAILED_LOGS=$(CURDIR)/$(FAILED_LOGS) \
		go test -count=1 -timeout 12m -run 'TestChaosShort$$' -v ./test/chaos/ > $(CHAOS_LOG) 2>&1; \
	then echo "==> TestChaosShort passed:"; cat $(CHAOS_REPORT); \
	else echo "==> TestChaosShort failed ($(CHAOS_LOG)):"; cat $(CHAOS_LOG); exit 1; fi

# The DevKit's pytest (a minute alone: venvs, pip, mypy) runs next to the
# Go checks (their lines interleaved, each line whole).
test-checks:
	@$(MAKE) --no-print-directory -j2 --output-sync=line pytest test-go

# The Go checks: vet, the manifests' check and the daprd component's test,
# then every package but the integration tests under the race detector
# next to the fuzz targets (the engines' race tests mostly wait on their
# child processes: alone, at the end of a run, they left a core idle).
# (Run side by side with the rest, the race tests' own timeouts failed on
# a starved machine: CI-like run 31.) The two get two job slots of their
# own, not test-checks' (MAKEFLAGS= : without it make warns "-j2 forced in
# submake" each run).
test-go:
	@$(MAKE) --no-print-directory vet k8s-validate daprd-test
	@MAKEFLAGS= $(MAKE) --no-print-directory -j2 --output-sync=line test-race fuzz-short

test-race:
	WM_REQUIRE_SANDBOX=$(REQUIRE_SANDBOX) go test -race -count=1 -timeout 20m $(UNIT_PACKAGES)

# The Kubernetes manifests (deploy/k8s), decoded strictly into their API
# types and checked against the settings the node and the API read; a
# module of its own (k8s.io/api), offline from the module cache. The
# broker ACL example of docs/scaling.md is also applied to a throwaway
# redis-server (WM_TEST_REAL_REDIS=1).
k8s-validate:
	cd deploy/k8s/validate && WM_TEST_REAL_REDIS=1 go test -count=1 ./...

# Our copies of daprd's Redis streams pub/sub and Redis state store
# (deploy/dapr/daprd/redisstreams and redisstate, a module of its own)
# against a real redis-server; and daprd compiled with
# -tags kafka, as the sidecar image builds it (deploy/k8s/Dockerfile) and
# nothing else here does (the Kafka overlay's pubsub.kafka,
# components_kafka.go; checked by deploy/k8s/validate).
daprd-test:
	cd deploy/dapr/daprd && go test -count=1 -timeout 5m ./redisstreams/ ./redisstate/
	cd deploy/dapr/daprd && env $(BUILD_ENV) go build -tags kafka -o /dev/null .

# The Python DevKit's own suite (sdk/python), with Debian's pytest and mypy.
pytest: deps-test
	cd sdk/python && PYTHONPATH=src PYTHONDONTWRITEBYTECODE=1 timeout 900 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests

unit: vet tools
	go test -race -timeout 10m -short $(UNIT_PACKAGES)

integration: deps-test tools $(TOOLS)/grpcurl-$(GRPCURL_VERSION).stamp
	WM_INTEGRATION_PARALLEL=$(INTEGRATION_PARALLEL) go test -timeout $(TEST_TIMEOUT) $(INTEGRATION_FLAGS) -v ./test/integration/

bench: deps-test tools
	go test -run '^$$' -bench . -benchmem -timeout 15m ./internal/dispatch/ ./internal/node/ ./internal/catalog/ ./internal/delivery/ ./engines/python/ ./engines/native/ ./engines/wasm/
	# .NET: a C# compile started against one on a spare compiler, a create
	# of new source on ready spares (Check, Load, first call; an echo and a
	# worker using LINQ, lambdas and async), what one spare costs, and a
	# worker reloaded again and again on a spare compiler each time against
	# the compiler kept for it.
	# A Get and a Set of values from 400 bytes to 1 MiB through the real
	# daprd and Redis, our state.redis against upstream's in the same run.
	go test -run '^$$' -bench BenchmarkDaprStateGetBySize -benchtime 1x -timeout 5m ./internal/state/
	go test -run '^$$' -bench 'BenchmarkDotnetCompile|BenchmarkDotnetCreateOnSpares|BenchmarkDotnetSpareStart|BenchmarkDotnetReloads' -benchtime 20x -timeout 10m ./engines/dotnet/
	# End to end through the real daprd and Redis: bare subscriber vs. workers
	# with and without a group, in alternating rounds, each mode's round
	# between two bare rounds (-benchtime 1x: one full comparison;
	# WM_BENCH_MESSAGES / WM_BENCH_ROUNDS size it, WM_BENCH_PAIRED=0 unpairs).
	go test -run '^$$' -bench BenchmarkEndToEnd -benchtime 1x -timeout 40m -v ./test/integration/
	# The control plane (issue 48): p50/p99 of each lifecycle call per engine,
	# back to back and spaced, idle and saturated, 100 concurrent creates,
	# next to a bare Temporal update and a sandboxed runner start, and each
	# engine against Python call by call, paired by round (median
	# difference, 90 % interval, slower/level/faster)
	# (WM_CP_ROUNDS / WM_CP_CYCLES / WM_CP_ENGINES / WM_CP_LOADS size it).
	go test -run '^$$' -bench BenchmarkControlPlane -benchtime 1x -timeout 15m -v ./test/integration/

# The fault-injection soak (issue 25, test/chaos, docs/reliability.md): the
# real stack with CHAOS_NODES nodes under a workload, lifecycle churn and a
# nemesis drawn from CHAOS_SEED for CHAOS_DURATION, then an independent
# checker; the test timeout is the duration plus 10 minutes and a sixth of
# it (the drain, and lifecycle pauses that outlast their slot).
CHAOS_DURATION ?= 10m
.PHONY: chaos
chaos: deps tools build
	d=$(CHAOS_DURATION); case $$d in *h) m=$$(( $${d%h} * 60 ));; *m) m=$${d%m};; *s) m=$$(( $${d%s} / 60 + 1 ));; *) m=60;; esac; \
	WM_CHAOS=1 CHAOS_DURATION=$$d CHAOS_NODES=$(CHAOS_NODES) CHAOS_SEED=$(CHAOS_SEED) \
		go test -count=1 -timeout $$(( m + 10 + m / 6 ))m -v ./test/chaos/

# Go fuzzing, each target for FUZZTIME: the SSRF defences (the URL
# validator, the address classifier, the inet_aton-style parser) and what
# reads worker-controlled bytes (the native engine's response decoder, the
# isolated host's frames, the child-process wire protocol). Corpora are in
# each package's testdata/fuzz/, which plain `go test` replays; `make test`
# also fuzzes each target for FUZZTIME_SHORT executions: a count, not a
# duration, because Go 1.26's fuzz coordinator can fail a target with a bare
# "context deadline exceeded" when a duration ends while a worker is busy
# (golang/go#75804, fixed in Go 1.27; it failed CI once on a loaded machine).
FUZZTIME ?= 30s
FUZZTIME_SHORT ?= 5000x
FUZZ_TARGETS := \
	./internal/codesource/:FuzzValidateURL ./internal/codesource/:FuzzClassify \
	./internal/codesource/:FuzzParseLooseIPv4 \
	./engines/native/:FuzzDecodeResponse ./engines/python/:FuzzReadFrame ./engines/dotnet/:FuzzReadFrame \
	./engines/native/internal/hostproto/:FuzzReadFrame ./engines/native/internal/hostproto/:FuzzParseResult \
	./engines/native/internal/hostproto/:FuzzParseGatewayCall \
	./engines/internal/wire/:FuzzDecodeOutputs ./engines/internal/wire/:FuzzDecodeError \
	./engines/internal/wire/:FuzzServeGateway ./engines/internal/wire/:FuzzReadPayload \
	./internal/delivery/:FuzzAppendJSON
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		go test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) "$${t%%:*}" || exit 1; \
	done
# make test's short run: one instrumented binary per package and a fuzz
# cache of its own, emptied each run (deploy/setup/fuzz-short says why).
fuzz-short:
	@deploy/setup/fuzz-short $(FUZZTIME_SHORT) $(CURDIR)/.run/test/fuzz $(FUZZ_TARGETS)

# gofmt and go vet, plus workflowcheck: workflow code must stay deterministic.
vet: $(TOOLS)/workflowcheck-$(WORKFLOWCHECK_VERSION).stamp
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.tools/*')); \
		if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	go vet ./...
	$(TOOLS)/workflowcheck ./workflows/...

build:
	@$(STEP) "building WorkManager (bin/)" "~5 s warm" $(SETUP_LOGS)/build.log -- \
		env $(BUILD_ENV) go build -o bin/ ./cmd/worker ./cmd/api ./cmd/native-host ./cmd/sandbox-exec ./cmd/devstack ./cmd/wmctl

# Debian packages, installed only when a command is missing: `deps` what
# running needs and what the guides use (pytest, mypy, venv and pip for
# docs/python-workers.md, which starts from make run alone; the DevKit's
# suite uses them too), `deps-test` what only the tests add (Chromium for
# the Temporal UI screenshots). apt-get's output goes to .run/setup/apt.log.
STEP := deploy/setup/step
SETUP_LOGS := $(CURDIR)/.run/setup
APT_INSTALL = $(STEP) "installing Debian packages:$$missing" "30-60 s" $(SETUP_LOGS)/apt.log -- \
	bash -c "$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing"
deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v python3 >/dev/null || missing="$$missing python3"; \
	command -v gcc >/dev/null || missing="$$missing gcc libc6-dev"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	command -v flatc >/dev/null || missing="$$missing flatbuffers-compiler"; \
	[ -f /usr/include/flatbuffers/flatbuffers.h ] || missing="$$missing libflatbuffers-dev"; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v setpriv >/dev/null && command -v prlimit >/dev/null || missing="$$missing util-linux"; \
	command -v mono >/dev/null || missing="$$missing mono-runtime"; \
	command -v mcs >/dev/null || missing="$$missing mono-mcs"; \
	[ -d /usr/lib/mono/4.5-api ] || missing="$$missing mono-devel"; \
	/usr/bin/python3 -c 'import pytest' 2>/dev/null || missing="$$missing python3-pytest"; \
	/usr/bin/python3 -c 'import mypy' 2>/dev/null || missing="$$missing mypy"; \
	/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	/usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing="$$missing python3-pip"; \
	if [ -n "$$missing" ]; then $(APT_INSTALL); fi

deps-test: deps
	@missing=""; \
	command -v chromium-headless-shell >/dev/null || missing="$$missing chromium-headless-shell"; \
	command -v clang >/dev/null || missing="$$missing clang"; \
	command -v wasm-ld >/dev/null || missing="$$missing lld"; \
	[ -f /usr/include/wasm32-wasi/stdlib.h ] || missing="$$missing wasi-libc"; \
	ls /usr/lib/llvm-14/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1 || missing="$$missing libclang-rt-14-dev-wasm32"; \
	if [ -n "$$missing" ]; then $(APT_INSTALL); fi

tools: $(TOOLS)/temporal-$(TEMPORAL_CLI_VERSION).stamp $(TOOLS)/daprd

# What make test installs and builds, side by side (-j5): the Debian
# packages and the tool builds do not depend on each other, and each link
# is mostly one core's work.
test-tools:
	@$(MAKE) --no-print-directory -s -j5 deps-test tools build $(TOOLS)/grpcurl-$(GRPCURL_VERSION).stamp $(TOOLS)/workflowcheck-$(WORKFLOWCHECK_VERSION).stamp

# The temporal CLI (dev server + Web UI), pinned; rebuilt when the pin changes.
$(TOOLS)/temporal-$(TEMPORAL_CLI_VERSION).stamp:
	@mkdir -p $(TOOLS)
	@$(STEP) "building the temporal CLI $(TEMPORAL_CLI_VERSION) (first run only)" "~4 min cold, ~1 min with a warm Go cache" \
		$(SETUP_LOGS)/temporal.log -- env $(BUILD_ENV) GOBIN=$(TOOLS) go install github.com/temporalio/cli/cmd/temporal@$(TEMPORAL_CLI_VERSION)
	@touch $@

# daprd v1.14.0 from the tool module in deploy/dapr/daprd (dapr's go.mod has
# replace directives, so `go install` cannot build it), with only the
# components WorkManager uses (deploy/dapr/daprd/components.go) and its Redis
# streams pub/sub replaced by deploy/dapr/daprd/redisstreams (bounded
# XREADGROUP blocks: upstream leaks a Redis connection per closed
# subscription).
$(TOOLS)/daprd: $(wildcard deploy/dapr/daprd/*.go deploy/dapr/daprd/go.* deploy/dapr/daprd/redisstreams/*.go)
	@mkdir -p $(TOOLS)
	@$(STEP) "building daprd v1.14.0 with WorkManager's components" "~2 min cold, under 1 min warm" \
		$(SETUP_LOGS)/daprd.log -- bash -c "cd deploy/dapr/daprd && env $(BUILD_ENV) go build -o $(TOOLS)/daprd ."

$(TOOLS)/grpcurl-$(GRPCURL_VERSION).stamp:
	@mkdir -p $(TOOLS)
	@$(STEP) "building grpcurl $(GRPCURL_VERSION) (first run only)" "~40 s" \
		$(SETUP_LOGS)/grpcurl.log -- env $(BUILD_ENV) GOBIN=$(TOOLS) go install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
	@touch $@

$(TOOLS)/workflowcheck-$(WORKFLOWCHECK_VERSION).stamp:
	@mkdir -p $(TOOLS)
	@$(STEP) "building workflowcheck $(WORKFLOWCHECK_VERSION) (first run only)" "~20 s" \
		$(SETUP_LOGS)/workflowcheck.log -- env $(BUILD_ENV) GOBIN=$(TOOLS) go install go.temporal.io/sdk/contrib/tools/workflowcheck@$(WORKFLOWCHECK_VERSION)
	@touch $@

$(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# Regenerate the committed protobuf code.
proto: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	@command -v protoc >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq protobuf-compiler; }
	PATH=$(TOOLS):$$PATH protoc -I proto --go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative proto/workmanager/v1/workmanager.proto

clean:
	rm -rf bin .run
