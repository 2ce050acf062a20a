# ckptd: in-sandbox filesystem checkpoint and rollback service.
# `make run` and `make check` are the two set-up commands of the README.

PREFIX    ?= /usr/local
DESTDIR   ?=
BINDIR    ?= $(PREFIX)/bin
UNITDIR   ?= $(PREFIX)/lib/systemd/system
CC        ?= cc
PYTHON    ?= /usr/bin/python3
BUILD     ?= build
SANITIZE  ?=
PYTEST_ARGS ?=

PKGS      := libmicrohttpd jansson libarchive libsystemd
CLI_PKGS  := libcurl jansson
VERSION   := $(shell sed -n 's/^#define CKPTD_VERSION "\(.*\)"/\1/p' src/config.h)

CFLAGS_BASE := -std=gnu11 -Wall -Wextra -Werror -O2 -g -D_GNU_SOURCE -pthread \
	-fstack-protector-strong -D_FORTIFY_SOURCE=2 -Isrc
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
	$(wildcard src/backend/*/*.c) $(wildcard src/engine/*.c) $(wildcard src/http/*.c) \
	$(wildcard src/host/*.c)
LIB_OBJS  := $(LIB_SRCS:src/%.c=$(BUILD)/obj/%.o)
CLI_SRCS  := $(wildcard src/cli/*.c)
CLI_OBJS  := $(CLI_SRCS:src/%.c=$(BUILD)/obj/%.o)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all run check unit integration bench deps deps-build install clean fmt layers

all: $(BUILD)/ckptd $(BUILD)/ckpt

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
# call, no cycle within a folder). host/ still has a cycle another change removes.
CYCLES_ALLOW ?= host
layers: $(LIB_OBJS)
	@CYCLES_ALLOW="$(CYCLES_ALLOW)" sh tools/layers.sh --objects $(BUILD)/obj $(LAYERS)

# Format every C file to .clang-format.
fmt:
	clang-format -i $$(find src tests/unit -name '*.[ch]')

# Packages needed to build and run; `deps` adds what the tests need (rootfs, runsc).
deps-build:
	@sh tools/deps.sh build

deps:
	@sh tools/deps.sh all

run: deps-build all
	@mkdir -p workspace .ckptd
	@echo "ckptd: serving http://127.0.0.1:7070 for $(CURDIR)/workspace (state in $(CURDIR)/.ckptd)"
	@echo "try:   curl -s -XPOST -H 'Content-Type: application/json' -d '{\"name\":\"first\"}' http://127.0.0.1:7070/v1/checkpoints"
	exec $(BUILD)/ckptd --listen 127.0.0.1:7070 --state-dir $(CURDIR)/.ckptd \
		--root $(CURDIR)/workspace --unmount-on-exit

unit: $(UNIT_BINS)
	@fail=0; for t in $(UNIT_BINS); do echo "== $$t"; $$t || fail=1; done; exit $$fail

integration: all
	$(PYTHON) -m pytest -q -rs tests/integration $(PYTEST_ARGS)

check: deps all
	@$(MAKE) --no-print-directory layers
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory integration

bench: deps-build all
	$(PYTHON) bench/run.py

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/ckptd
	install -m 0755 $(BUILD)/ckptd $(BUILD)/ckpt $(DESTDIR)$(BINDIR)/
	for f in services/*.service services/*.socket; do [ -e "$$f" ] || continue; \
		sed 's|@BINDIR@|$(BINDIR)|g' "$$f" > $(DESTDIR)$(UNITDIR)/$$(basename $$f); done
	install -m 0644 api/openapi.yaml $(DESTDIR)$(PREFIX)/share/ckptd/
	[ ! -e services/ckptd.json ] || install -m 0644 services/ckptd.json $(DESTDIR)$(PREFIX)/share/ckptd/ckptd.json.example

clean:
	rm -rf $(BUILD)
