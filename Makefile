# Thin wrapper over meson. `make test` and `make demo` work on a fresh Debian 12
# machine: each first installs what is missing (deploy/install-deps.sh).

PYTHON  ?= /usr/bin/python3
BUILD   := build
ASAN    := build-asan
PREFIX  ?= /usr/local

.PHONY: all deps build asan test test-unit test-python test-asan test-long demo bench install clean

all: build

deps:
	@deploy/install-deps.sh

$(BUILD)/build.ninja:
	meson setup $(BUILD) --prefix=$(PREFIX)

build: deps $(BUILD)/build.ninja
	@ninja -C $(BUILD)

$(ASAN)/build.ninja:
	meson setup $(ASAN) -Db_sanitize=address,undefined -Dbuildtype=debug

asan: deps $(ASAN)/build.ninja
	@ninja -C $(ASAN)

# Every suite, then one closing line "N passed, N failed" over all of them.
test: build asan
	@tests/run-tests.sh

test-long: build
	meson test -C $(BUILD) --suite long --print-errorlogs --no-rebuild -v

demo: build
	@$(PYTHON) worker/examples/codec_demo.py

bench: build
	$(BUILD)/tests/bench/bench_codec
	$(BUILD)/tests/bench/bench_blas
	$(PYTHON) tests/bench/bench_codec.py

install: build
	meson install -C $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN) build-fuzz
