# Thin wrapper over meson. `make test` and `make demo` work on a fresh Debian 12
# machine: each first installs what is missing (deploy/install-deps.sh).

PYTHON  ?= /usr/bin/python3
BUILD   := build
ASAN    := build-asan
PREFIX  ?= /usr/local

.PHONY: all deps build asan test test-unit test-python test-asan test-long demo demo-long demo-lm demo-diloco bench install clean

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

# libFuzzer on the message validator and the config parser (docs/FUZZING.md):
# clang build in build-fuzz/, FUZZ_SECONDS per harness (make fuzz FUZZ_SECONDS=600).
FUZZ_SECONDS ?= 20
.PHONY: fuzz
fuzz: deps
	@tests/fuzz/run-fuzz.sh $(FUZZ_SECONDS)

# Fashion-MNIST trained by apsd and 4 workers in fp32, e4m3 and e3m0, without
# scaling and with APS, and e4m3 APS with SGD on apsd (optimize mode): a table and
# build/demo/fashion_mnist.png (~3 min).
demo: build
	@PYTHONPATH=worker/python $(PYTHON) worker/examples/fashion_mnist_demo.py

# The longer, more faithful version (a CNN, ~10 min): build/demo/fashion_mnist_long.png.
demo-long: build
	@PYTHONPATH=worker/python $(PYTHON) worker/examples/fashion_mnist_demo.py --long

# A byte-level transformer trained with AdamW on Debian's fortunes by 4 workers: fp32,
# e4m3 APS, fp4 APS, fp4 block, e3m0 auto, 3 seeds each (~15 min): build/demo/lm.png.
demo-lm: build
	@PYTHONPATH=worker/python $(PYTHON) worker/examples/lm_demo.py

# DiLoCo (issue 19): every step in fp32 and e4m3 APS against DiLoCo at H = 10 and 50 with
# fp32, e4m3 APS and fp4 block pseudo-gradients, 3 seeds each, on the transformer of
# demo-lm and the CNN of demo-long: build/demo/diloco_lm.png, build/demo/diloco_cnn.png.
demo-diloco: build
	@PYTHONPATH=worker/python $(PYTHON) worker/examples/diloco_demo.py --workload lm
	@PYTHONPATH=worker/python $(PYTHON) worker/examples/diloco_demo.py --workload cnn

bench: build
	$(BUILD)/tests/bench/bench_codec
	$(BUILD)/tests/bench/bench_blas
	$(PYTHON) tests/bench/bench_codec.py
	$(MAKE) --no-print-directory bench-engine
	$(MAKE) --no-print-directory bench-allreduce

# The daemon's per-byte work without sockets (check, sum in rank order, encode) on 1
# and 2 threads, each owning every other chunk: GB/s of codes per core (issue 17).
.PHONY: bench-engine
bench-engine: build
	$(BUILD)/tests/bench/bench_engine --threads 1,2,3 --seconds 3

# All-reduce through apsd (ResNet-50 shapes, 4 workers) against torch gloo and raw
# ZeroMQ, a perf profile, 4 KiB latency, chunk pipelining (~4 min; docs/BENCHMARKS.md).
.PHONY: bench-allreduce
bench-allreduce: build
	$(PYTHON) tests/bench/bench_allreduce.py --build $(BUILD)

# All-reduce on emulated clusters (network namespaces shaped with tc, as root): apsd with
# 1, 2, 4 shards in fp32/e5m2/e4m3/e3m0 against gloo at 1 and 10 Gbit/s (~15 min;
# bench-cluster-quick ~2 min; docs/PERFORMANCE.md). Not part of `make test` or `make bench`.
# bench-cluster-10g: issue 17's 10 Gbit/s rows alone (shared medium with 1 and 2 shards,
# switched with co-located shards; fp32 and e4m3; raw ZeroMQ; gloo per tensor and with
# DDP's buckets; ~5 min).
.PHONY: bench-cluster bench-cluster-quick bench-cluster-10g
bench-cluster: build
	$(PYTHON) tests/bench/bench_cluster.py --build $(BUILD)

bench-cluster-10g: build
	$(PYTHON) tests/bench/bench_cluster.py --build $(BUILD) --rates 10gbit \
		--kinds shared,switched --placements colocated --shards 1,2 --formats fp32,e4m3

bench-cluster-quick: build
	$(PYTHON) tests/bench/bench_cluster.py --build $(BUILD) --quick

# The Python package goes where python3 imports the prefix's packages (for
# PREFIX=/usr/local: /usr/local/lib/python3.X/dist-packages) and finds libaps by
# its installed path; ldconfig then lets apsctl and programs linked with -laps
# find libaps.so.0 in the prefix's libdir (as root, unless DESTDIR stages it).
install: build
	meson install -C $(BUILD)
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" -eq 0 ]; then ldconfig; fi

clean:
	rm -rf $(BUILD) $(ASAN) build-fuzz

# Debian packages apsd, libaps0, libaps-dev, python3-aps (debian/, dpkg-buildpackage on a
# copy of the tree, not in build/'s meson tree): build/deb/*.deb (~25 s; docs/OPERATIONS.md).
.PHONY: deb
deb: deps
	@deploy/build-deb.sh $(BUILD)/deb

# Soak test (issue 9, docs/RELIABILITY.md): 2 jobs x 8 workers for SOAK_SECONDS under
# kill -9 of workers, daemon restarts and a rogue peer; every result checked.
SOAK_SECONDS ?= 300
.PHONY: soak
soak: build
	$(PYTHON) tests/soak/soak.py --seconds $(SOAK_SECONDS) --build $(BUILD)
