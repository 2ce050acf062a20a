# ckptd: in-sandbox filesystem checkpoint and rollback service.
# `make run` and `make check` are the two set-up commands of the README.

PREFIX    ?= /usr/local
DESTDIR   ?=
BINDIR    ?= $(PREFIX)/bin
UNITDIR   ?= $(PREFIX)/lib/systemd/system
DATADIR   ?= $(PREFIX)/share
MANDIR    ?= $(DATADIR)/man
SYSCONFDIR ?= /etc
PORT      ?= 7070
WORKSPACE ?= $(CURDIR)/workspace
# One state dir per workspace: ckptd refuses a state dir made for other roots.
STATE     ?= $(CURDIR)/.ckptd$(if $(filter $(CURDIR)/workspace,$(abspath $(WORKSPACE))),,-$(notdir $(abspath $(WORKSPACE))))
CC        ?= cc
PYTHON    ?= /usr/bin/python3
BUILD     ?= build
SANITIZE  ?=
FAILPOINTS ?=
PYTEST_ARGS ?=

PKGS      := libmicrohttpd jansson libarchive libsystemd nettle libcurl libzstd zlib
CLI_PKGS  := libcurl jansson
# The one version string: ckptd and ckpt get it as CKPTD_VERSION.
VERSION   := 0.1.0

CFLAGS_BASE := -std=gnu11 -Wall -Wextra -Werror -O2 -g -D_GNU_SOURCE -pthread \
	-fstack-protector-strong -D_FORTIFY_SOURCE=2 -Isrc -DCKPTD_VERSION='"$(VERSION)"'
# The test build's crash points (docs/failpoints.md): make FAILPOINTS=1 BUILD=build-fp.
ifneq ($(FAILPOINTS),)
CFLAGS_BASE += -DCKPTD_FAILPOINTS
endif
ifneq ($(SANITIZE),)
CFLAGS_BASE += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -O1
LDFLAGS_SAN := -fsanitize=$(SANITIZE)
endif

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CLI_CFLAGS = $(shell pkg-config --cflags $(CLI_PKGS) 2>/dev/null)
CLI_LIBS   = $(shell pkg-config --libs $(CLI_PKGS) 2>/dev/null)

# Folders, lowest first: a file may include only from its own folder or one
# listed before it (tools/layers.sh checks this in `make check`).
LAYERS    := lib config services backend engine http host
LIB_SRCS  := $(wildcard src/lib/*.c) src/config.c $(wildcard src/services/*.c) \
	$(wildcard src/backend/*.c) $(wildcard src/backend/*/*.c) $(wildcard src/engine/*.c) $(wildcard src/http/*.c) \
	$(wildcard src/host/*.c)
LIB_OBJS  := $(LIB_SRCS:src/%.c=$(BUILD)/obj/%.o)
CLI_SRCS  := $(wildcard src/cli/*.c)
CLI_OBJS  := $(CLI_SRCS:src/%.c=$(BUILD)/obj/%.o)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all run check check-host check-crash check-failpoints check-failpoints-sanitize check-sanitize fuzz fuzz-build unit valgrind integration bench bench-registry bench-sha256 deps deps-build install \
	clean fmt layers lint prose docs

MAN_SRCS  := $(wildcard docs/man/*.scd)
MAN_PAGES := $(MAN_SRCS:docs/man/%.scd=$(BUILD)/man/%)

all: $(BUILD)/ckptd $(BUILD)/ckpt $(MAN_PAGES)

$(BUILD)/man/%: docs/man/%.scd
	@mkdir -p $(dir $@)
	scdoc < $< > $@

# -MMD writes each object's header dependencies beside it.
$(BUILD)/obj/cli/%.o: src/cli/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -MMD -MP $(CLI_CFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -MMD -MP $(PKG_CFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/libckptd.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ckptd: $(BUILD)/obj/main.o $(BUILD)/libckptd.a
	$(CC) $(CFLAGS_BASE) $(LDFLAGS_SAN) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) -lm

$(BUILD)/ckpt: $(CLI_OBJS)
	$(CC) $(CFLAGS_BASE) $(LDFLAGS_SAN) $(LDFLAGS) -o $@ $^ $(CLI_LIBS) -lm

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libckptd.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -MMD -MP $(PKG_CFLAGS) $(CFLAGS) $(LDFLAGS_SAN) -o $@ $< $(BUILD)/libckptd.a \
		$(PKG_LIBS) -lcmocka -lm

-include $(LIB_OBJS:.o=.d) $(CLI_OBJS:.o=.d) $(BUILD)/obj/main.d $(UNIT_BINS:=.d)

# Includes from the sources; calls between files from the objects (no upward
# call, no cycle within a folder). CYCLES_ALLOW names folders whose cycles only warn.
# Then the files' shape (tools/sizes.sh): none over 800 lines, each opening
# with its name and purpose; who picks error kinds (tools/kinds.sh) and who
# reads the environment (tools/getenv.sh).
CYCLES_ALLOW ?=
layers: $(LIB_OBJS) $(CLI_OBJS)
	@CYCLES_ALLOW="$(CYCLES_ALLOW)" sh tools/layers.sh --objects $(BUILD)/obj $(LAYERS)
	@sh tools/sizes.sh 800
	@sh tools/kinds.sh
	@sh tools/getenv.sh

# Short sentences in README.md and docs/*.md (tools/prose.py says what counts).
prose:
	@$(PYTHON) tools/prose.py

# The API reference as HTML, by the redocly pinned in tools/package-lock.json
# (`make deps` installs it); tools/apidocs.py inlines Redoc's script.
docs: $(BUILD)/docs/api.html

$(BUILD)/docs/api.html: api/openapi.yaml api/redocly.yaml tools/apidocs.py tools/package-lock.json
	@$(PYTHON) tools/apidocs.py $@

# Format every C file to .clang-format.
fmt:
	@sh tools/format.sh --fix

# The habits `make check` keeps: the tree as clang-format writes it, cppcheck
# with no finding (suppressions with reasons in tools/cppcheck.supp), commit
# subjects of 72 characters or fewer with a body saying why.
lint:
	@sh tools/format.sh
	@sh tools/analyze.sh
	@sh tools/commits.sh

# Packages needed to build and run; `deps` adds what the tests need (rootfs, runsc).
deps-build:
	@sh tools/deps.sh build

deps:
	@sh tools/deps.sh all

# Serves $(WORKSPACE) on 127.0.0.1:$(PORT); the URL is printed once ckptd listens.
run: deps-build all
	@sh tools/run.sh $(BUILD)/ckptd $(PORT) $(abspath $(WORKSPACE)) $(STATE)

unit: $(UNIT_BINS)
	@fail=0; for t in $(UNIT_BINS); do echo "== $$t"; $$t || fail=1; done; exit $$fail

# The unit tests under valgrind: any leak or memory error fails.
VALGRIND := valgrind -q --leak-check=full --error-exitcode=1 --child-silent-after-fork=yes \
	--suppressions=tests/unit/valgrind.supp
valgrind: $(UNIT_BINS)
	@fail=0; for t in $(UNIT_BINS); do echo "== $$t"; $(VALGRIND) $$t || fail=1; done; exit $$fail

# test_failpoints.py and test_host_failpoints.py need the failpoint build:
# check-failpoints runs them.
# Each lane ends with its 25 slowest tests: where make check's time goes.
integration: all
	$(PYTHON) -m pytest -q -rs --durations=25 tests/integration --ignore=tests/integration/test_failpoints.py \
		--ignore=tests/integration/test_host_failpoints.py $(PYTEST_ARGS)

check: deps all
	@$(MAKE) --no-print-directory prose
	@$(MAKE) --no-print-directory layers
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory unit
	@# built before the two lanes: both run tests that bring it up to date
	@$(MAKE) --no-print-directory BUILD=$(FP_BUILD) FAILPOINTS=1 all
	@$(MAKE) --no-print-directory -j2 --output-sync=target integration check-failpoints-sanitize

# The second stream of make check, beside the plain suite: the failpoint
# crashes, then the sanitized pass (docs/development.md says why side by side).
check-failpoints-sanitize:
	@$(MAKE) --no-print-directory check-failpoints
	@$(MAKE) --no-print-directory check-sanitize

# Kill ckptd at each failpoint on both backends, restart, check every promise
# (docs/failpoints.md); the points live in the failpoint build, $(FP_BUILD).
# FP_EVERY_STEP=1 also crashes each later operation at the points it shares.
FP_BUILD ?= build-fp
FP_EVERY_STEP ?=
check-failpoints: deps
	@$(MAKE) --no-print-directory BUILD=$(FP_BUILD) FAILPOINTS=1 all
	CKPTD_FP_BUILD=$(FP_BUILD) CKPTD_FP_EVERY_STEP=$(FP_EVERY_STEP) \
		$(PYTHON) -m pytest -q -rs -s --durations=10 tests/integration/test_failpoints.py

# Host mode's points (test_host_failpoints.py, 7 to 9 minutes with real runsc
# sandboxes). Not in make check, for its run time (docs/failpoints.md).
check-failpoints-host: deps
	@$(MAKE) --no-print-directory BUILD=$(FP_BUILD) FAILPOINTS=1 all
	CKPTD_FP_BUILD=$(FP_BUILD) $(PYTHON) -m pytest -q -rs -s tests/integration/test_host_failpoints.py

# Host mode's soak: racing rounds of stalls (frozen volume, frozen etcd link)
# and kill -9 between two instances, for volume and etcd locks (make check runs 3).
SOAK_ROUNDS ?= 50
check-host: deps all
	CKPTD_SOAK_ROUNDS=$(SOAK_ROUNDS) $(PYTHON) -m pytest -q -rs -s tests/integration/test_host_locks.py -k soak

# SIGKILL ckptd during create, restore, delete, import, fork and background work
# on both backends (tests/crash). make check runs 100 kills per backend
# (tests/integration/test_crash.py); both print the seed, and CRASH_SEED=N replays it.
CRASH_KILLS ?= 300
check-crash: deps all
	$(PYTHON) tests/crash/crash.py --kills $(CRASH_KILLS) $(if $(CRASH_SEED),--seed $(CRASH_SEED))

# libFuzzer targets (tests/fuzz/fuzz_*.c) over the library built with clang and
# ASan+UBSan in $(FUZZ_BUILD); `make fuzz` runs each FUZZ_SECS seconds from its
# seed corpus (tests/fuzz/corpus/<target>), new inputs and crashes go under $(FUZZ_BUILD).
FUZZ_BUILD  ?= build-fuzz
FUZZ_SECS   ?= 60
FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_SRCS   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS   := $(FUZZ_SRCS:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
fuzz-build:
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang SANITIZE= \
		CFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link -O1" $(FUZZ_BUILD)/libckptd.a
	@$(MAKE) --no-print-directory $(FUZZ_BINS)

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_BUILD)/libckptd.a
	clang $(CFLAGS_BASE) $(FUZZ_SAN) -fsanitize=fuzzer -O1 $(PKG_CFLAGS) -o $@ $< $(FUZZ_BUILD)/libckptd.a \
		$(PKG_LIBS) -lm

fuzz: deps fuzz-build
	@sh tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECS)

# The unit tests and the integration tests that do not boot the rig, built with
# ASan and UBSan in build-san; any report fails (see docs/development.md).
SAN_BUILD ?= build-san
check-sanitize: deps
	@$(MAKE) --no-print-directory BUILD=$(SAN_BUILD) SANITIZE=address,undefined all
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		CRASH_KILLS=$(SAN_CRASH_KILLS) POWERCUT_ROUNDS=$(SAN_POWERCUT_ROUNDS) $(MAKE) --no-print-directory BUILD=$(SAN_BUILD) SANITIZE=address,undefined unit integration \
		PYTEST_ARGS="$(SAN_PYTEST_ARGS)"
# Left out sanitized: fuzz targets (sanitized already), load figures, the 2,000-
# connection flood and the export RSS bound (they would measure ASan, not ckptd),
# host mode's stall soak (timing-bound; the unsanitized pass runs it), the
# client and example tests (Python, TypeScript and shell clients: they test the
# clients, and the daemon paths they drive are test_api's; about 1.5 minutes),
# and the reruns of suites inside runsc, unshare and capsh (test_environments.py
# and the "under gVisor" tests: the same daemon paths as the suites they rerun,
# which run sanitized on the host; about 6 minutes under ASan).
# The crash harness's kills per backend and the power cuts per operation in
# the sanitized pass (100 and 8 unsanitized).
SAN_CRASH_KILLS ?= 30
SAN_POWERCUT_ROUNDS ?= 3
SAN_PYTEST_ARGS ?= --ignore=tests/integration/test_fuzz.py --ignore=tests/integration/test_load.py \
	--ignore=tests/integration/test_clients.py --ignore=tests/integration/test_examples.py \
	--deselect tests/integration/test_hostile.py::test_flood_of_2000_connections_does_not_lock_out \
	--deselect tests/integration/test_host_locks.py::test_soak_stalls_and_kill9 \
	--deselect "tests/integration/test_export.py::test_export_memory_stays_flat[overlay]" \
	--deselect "tests/integration/test_export.py::test_export_memory_stays_flat[tar]" \
	--ignore=tests/integration/test_environments.py \
	--deselect tests/integration/test_tracking_inotify.py::test_the_same_under_gvisor \
	--deselect tests/integration/test_tar_gvisor.py::test_the_same_under_gvisor \
	--deselect tests/integration/test_whole_root_private.py::test_whole_root_pip_rollback_under_gvisor

bench: deps all
	$(PYTHON) bench/run.py

# Push and pull through a loopback registry against skopeo (bench/registry.py).
SIZES ?= 100M,1G
bench-registry: all
	$(PYTHON) bench/registry.py --sizes $(SIZES)

# SHA-256's speed here, nettle (the daemon's) against OpenSSL (bench/sha256.c).
bench-sha256:
	@mkdir -p $(BUILD)/bench
	$(CC) $(CFLAGS_BASE) $(shell pkg-config --cflags nettle libcrypto) -o $(BUILD)/bench/sha256 bench/sha256.c \
		$(shell pkg-config --libs nettle libcrypto)
	$(BUILD)/bench/sha256

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DATADIR)/ckptd \
		$(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 \
		$(DESTDIR)$(SYSCONFDIR)/ckptd
	install -m 0755 $(BUILD)/ckptd $(BUILD)/ckpt $(DESTDIR)$(BINDIR)/
	for f in services/*.in; do sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DATADIR@|$(DATADIR)|g' \
		-e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' "$$f" > $(DESTDIR)$(UNITDIR)/$$(basename $$f .in); done
	install -m 0644 api/openapi.yaml $(DESTDIR)$(DATADIR)/ckptd/
	install -m 0644 services/ckptd.json $(DESTDIR)$(DATADIR)/ckptd/ckptd.json.example
	for p in $(MAN_PAGES); do install -m 0644 $$p $(DESTDIR)$(MANDIR)/man$${p##*.}/; done
	# The unit reads /etc/ckptd/ckptd.json: install the example once, never over a user's file.
	[ -e $(DESTDIR)$(SYSCONFDIR)/ckptd/ckptd.json ] || \
		install -m 0644 services/ckptd.json $(DESTDIR)$(SYSCONFDIR)/ckptd/ckptd.json

clean:
	rm -rf $(BUILD)
