# Santa — build, test and run targets. See README.md.
#
#   make demo      set up (root, Debian 12) and run the demo
#   make test      set up and run all tests (what .ci/run calls)
#   make install   install santad, santa, libsanta, the Python client, the
#                  systemd unit and the sample config (PREFIX=/usr/local)
#
# Variables (override on the command line, e.g. `make test FUZZTIME=1m`):
#   FUZZ_TARGETS   space-separated ./pkg:FuzzName pairs run by `test` and `fuzz`
#   FUZZTIME       fuzz time per target in `make test` (default 20s)
#   FUZZTIME_LONG  fuzz time per target in `make fuzz` (default 5m)
#   TEST_TIMEOUT   go test -timeout (default 20m)
#   TEST_FLAGS     extra go test flags (e.g. -v, -run X, -p 1)
#   BENCH_ARGS     arguments for bench/cmd/benchudp
#   BENCH_DNS_ARGS arguments for bench/cmd/benchdns (e.g. -quick, -reps 1, -cases nsd,nsd-zipf-10k)
#   BENCH_MC_ARGS  arguments for bench/cmd/benchmc (e.g. -quick, -reps 1, -cases memcached,santa-top-10k)
#   BENCH_HTTP_ARGS arguments for bench/cmd/benchhttp (e.g. -quick, -reps 1, -sizes 100,1k, -cases nginx-ka-100,santa-ka-100)
#   BPF2GO_CC / BPF2GO_STRIP  compiler / strip bpf2go uses (clang-16 / llvm-strip-16)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build
# Steps must run in order (deps before build before tests); Go parallelises itself.
.NOTPARALLEL:

GO ?= go
# Go lives in /usr/local/go on the test machines; sudo's secure_path drops it.
ifneq ($(wildcard /usr/local/go/bin/go),)
export PATH := $(PATH):/usr/local/go/bin
endif
# The clone may be owned by another user than root, or have no .git at all.
export GOFLAGS := $(strip $(GOFLAGS) -buildvcs=false)

# bpf2go (pinned in go.mod's tool block, run by `go generate`) reads these.
export BPF2GO_CC ?= clang-16
export BPF2GO_STRIP ?= llvm-strip-16

BIN := bin
# Every cmd/<name>/ with Go files becomes bin/<name>.
CMDS := $(sort $(patsubst cmd/%/,%,$(dir $(wildcard cmd/*/*.go))))

TEST_TIMEOUT ?= 20m
TEST_FLAGS ?=
FUZZTIME ?= 20s
FUZZTIME_LONG ?= 5m
# Add fuzz targets here as ./path/to/pkg:FuzzName (one fuzz target per pair).
FUZZ_TARGETS ?= ./internal/dataplane:FuzzRuleProcessor ./api:FuzzDecode
BENCH_ARGS ?=
BENCH_DNS_ARGS ?=
BENCH_MC_ARGS ?=
BENCH_HTTP_ARGS ?=

PREFIX ?= /usr/local
DESTDIR ?=
# Debian's interpreter: it has python3-cbor2 (a python3 earlier on PATH may not).
PYTHON ?= /usr/bin/python3
PYVENV := out/pyvenv

.PHONY: all deps generate build check-generated test test-c test-python fuzz fuzz-run sweep-testbeds demo bench bench-udp bench-dns bench-memcached bench-http install clean need-root

all: build

need-root:
	@[[ $$(id -u) -eq 0 ]] || { echo "make $(MAKECMDGOALS): must run as root (XDP, network namespaces, apt)" >&2; exit 1; }

deps: need-root
	@bash scripts/install-deps.sh

generate:
	$(GO) generate ./...

build:
	$(GO) build ./...
	@mkdir -p $(BIN)
	@for c in $(CMDS); do \
		echo "$(GO) build -o $(BIN)/$$c ./cmd/$$c"; \
		$(GO) build -o $(BIN)/$$c ./cmd/$$c; \
	done
	$(MAKE) --no-print-directory -C clients/c

check-generated:
	@GO=$(GO) bash scripts/check-generated.sh

# Order: set up, make sure the committed BPF objects match the sources, build,
# then the Go tests (standard ok/FAIL lines per package) and a short fuzz run.
# One package at a time (-p 1): the benchmark harness smoke tests and the
# load generator's rate tests measure CPU and must not share it.
test: need-root deps check-generated build
	$(GO) test -p 1 -count=1 -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./...
	@$(MAKE) --no-print-directory test-c test-python
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=$(FUZZTIME)

# libsanta's own tests, under valgrind (its tests against santad run in go test).
test-c:
	$(MAKE) --no-print-directory -C clients/c check

# The Python client as users get it: pip-installed from the repository into a venv.
test-python:
	rm -rf $(PYVENV)
	$(PYTHON) -m venv --system-site-packages $(PYVENV)
	$(PYVENV)/bin/pip install -q --no-build-isolation --no-deps ./clients/python
	cd clients/python && ../../$(PYVENV)/bin/python -m pytest -q -p no:cacheprovider tests

fuzz: need-root deps build
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=$(FUZZTIME_LONG)

# Runs every FUZZ_TARGETS entry for FUZZ_FOR; does nothing when the list is empty.
# Go before 1.27 can end a clean run with a bare "context deadline exceeded"
# when -fuzztime runs out while a worker is mid-input (go.dev/issue/75804):
# such a failure that wrote no failing input is reported and not counted;
# any other failure, or a new input under testdata/fuzz, fails the run.
fuzz-run:
	@for t in $(FUZZ_TARGETS); do \
		case $$t in *:Fuzz*) ;; *) echo "FUZZ_TARGETS: '$$t' is not ./pkg:FuzzName" >&2; exit 1;; esac; \
		pkg=$${t%%:*}; fn=$${t#*:}; corpus=$$pkg/testdata/fuzz/$$fn; \
		before=$$(ls $$corpus 2>/dev/null | wc -l); log=$$(mktemp); \
		echo "$(GO) test -run='^$$' -fuzz='^$$fn\$$' -fuzztime=$(FUZZ_FOR) $$pkg"; \
		if ! $(GO) test -run='^$$' -fuzz="^$$fn\$$" -fuzztime=$(FUZZ_FOR) $$pkg 2>&1 | tee $$log; then \
			after=$$(ls $$corpus 2>/dev/null | wc -l); \
			if [ "$$after" = "$$before" ] && grep -q '^    context deadline exceeded$$' $$log && \
				[ "$$(grep -c '^--- FAIL' $$log)" = 1 ]; then \
				echo "fuzz-run: $$fn stopped with the Go fuzzing deadline race (go.dev/issue/75804), no failing input: not a finding"; \
			else rm -f $$log; exit 1; fi; \
		fi; \
		rm -f $$log; \
		$(MAKE) --no-print-directory sweep-testbeds; \
	done

# The fuzz engine kills a worker that is slow to stop, before its testbed's
# cleanup ran: remove the namespaces of testbeds whose process is gone
# (internal/testbed names them santa-PID-N-srv and santa-PID-N-cli).
sweep-testbeds:
	@for ns in $$(ip netns list | grep -oE '^santa-[0-9]+-[0-9]+-(srv|cli)'); do \
		pid=$${ns#santa-}; pid=$${pid%%-*}; \
		if [ ! -d /proc/$$pid ]; then echo "removing $$ns (its process $$pid is gone)"; ip netns del $$ns; fi; \
	done

demo: need-root deps build
	@[[ -x $(BIN)/santa-demo ]] || { echo "demo: $(BIN)/santa-demo was not built (cmd/santa-demo missing?)" >&2; exit 1; }
	$(BIN)/santa-demo

# All benchmarks (about 15 + 35 + 30 + 13 minutes); each rewrites its section of
# docs/benchmarks.md and its files under docs/bench/.
bench: bench-udp bench-dns bench-memcached bench-http

bench-udp: need-root deps build
	$(GO) run ./bench/cmd/benchudp $(BENCH_ARGS)

# The DNS experiments: NSD, Knot and BIND alone and with Santa (santad +
# `santa dns`), every name offloaded for 1 to 1 M names, a Zipf mix with the
# top n offloaded. About 35 minutes; BENCH_DNS_ARGS=-quick for a short run.
bench-dns: need-root deps build
	$(GO) run ./bench/cmd/benchdns $(BENCH_DNS_ARGS)

# The memcached workload of the paper (Zipf over 1 M keys, 99.8 % GETs):
# memcached alone, the bare XDP reflector, and `santa memcached top` for
# n = 0 … every key. About 30 minutes; BENCH_MC_ARGS=-quick for a short run.
bench-memcached: need-root deps build
	$(GO) run ./bench/cmd/benchmc $(BENCH_MC_ARGS)

# The paper's Figure 8: one nginx worker serving files of 100 B to 10 kB to
# wrk, keep-alive and a new connection per request, against nginx with
# sendfile and nginx with santad and `santa http`. About 13 minutes;
# BENCH_HTTP_ARGS=-quick for a short run.
bench-http: need-root deps build
	$(GO) run ./bench/cmd/benchhttp $(BENCH_HTTP_ARGS)

install: build
	install -D -m 0755 $(BIN)/santad $(DESTDIR)$(PREFIX)/sbin/santad
	install -D -m 0755 $(BIN)/santa $(DESTDIR)$(PREFIX)/bin/santa
	@# the unit names santad's and the docs' paths under PREFIX
	install -d $(DESTDIR)/etc/systemd/system
	sed 's|/usr/local/|$(PREFIX)/|g' dist/santad.service > $(DESTDIR)/etc/systemd/system/santad.service
	[[ -e $(DESTDIR)/etc/santa/santad.yaml ]] || install -D -m 0644 dist/santad.yaml $(DESTDIR)/etc/santa/santad.yaml
	install -D -m 0644 -t $(DESTDIR)$(PREFIX)/share/doc/santa docs/*.md
	$(MAKE) --no-print-directory -C clients/c install PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)
	$(PYTHON) -m pip install --no-build-isolation --no-deps --break-system-packages $(if $(DESTDIR),--root $(DESTDIR)) ./clients/python

clean:
	rm -rf $(BIN) out clients/python/build clients/python/santa.egg-info
	$(MAKE) --no-print-directory -C clients/c clean
