# slipstream: what a user types. `make demo` runs the main job, `make check` runs every test.
# Each target installs the Debian packages it needs first (as root, or through sudo).

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
PG_ASAN_BUILD ?= build-pg-asan
BENCH_NUM  ?= 2000000
DEMO_NUM   ?= 300000

DEBIAN_PACKAGES = cmake g++ make pkg-config googletest libgtest-dev libgmock-dev \
  liburing-dev liblz4-dev libssl-dev libibverbs-dev librdmacm-dev rdma-core \
  postgresql-15 postgresql-server-dev-15 libpq-dev librocksdb-dev clang-format \
  patroni etcd-server etcd-client curl jq procps python3 clang-14 libfuzzer-14-dev

SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build extension install demo demo-replication demo-engine bench test test-sanitize test-pg check \
  sanitize-build pg-sanitize-build test-pg-sanitize fuzz-build fuzz fuzz-smoke fuzz-seeds soak sqlsmith check-format format clean bench-rdma bench-regions bench-shuffle bench-pg bench-replication

all: build

# Installs whatever of DEBIAN_PACKAGES is missing (apt-get update only when something is).
deps:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

# The PostgreSQL module: CMake builds the engine and the C++ bridge, PGXS the C glue.
extension: build
	$(MAKE) -C extension -j$(JOBS) BUILD_DIR=$(abspath $(BUILD))

# Installs the module into the system's PostgreSQL 15 (its lib and extension directories).
install: extension
	$(SUDO) $(MAKE) -C extension BUILD_DIR=$(abspath $(BUILD)) install

# The main job: slipstream inside a local PostgreSQL cluster (scripts/demo.sh): load a
# usertable, run YCSB workload A, print throughput and the engine's statistics; then a
# repartitioned join across three local nodes with slipstream.shuffle (scripts/demo_shuffle.sh).
demo: install
	scripts/demo.sh
	scripts/demo_shuffle.sh

# Replication on this machine: a primary and two backups, pgbench in remote_memory, the status
# views, a hot-standby read, the primary killed and a backup taking over with nothing lost.
demo-replication: install
	scripts/demo_replication.sh

# The engine alone against RocksDB (the old demo).
demo-engine: build
	$(BUILD)/bench/engine_bench --num=$(DEMO_NUM)

# The full engine benchmark of docs/benchmarks.md.
bench: build
	$(BUILD)/bench/engine_bench --num=$(BENCH_NUM)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The libraries, their tests, the module's bridge and the libFuzzer targets (tests/fuzz), in one
# clang-14 Debug build (assertions on, -O1) with AddressSanitizer, UBSan and libFuzzer's
# coverage: one build serves test-sanitize and the fuzz targets (gcc's sanitizer build plus a
# separate fuzz build took 4 more of CI's minutes).
sanitize-build: deps
	@# A build directory configured with another compiler (gcc's sanitizer build before 2026-12-02)
	@# cannot be switched in place: CMake would drop the options.
	@grep -qs 'CMAKE_CXX_COMPILER:.*clang++-14' $(ASAN_BUILD)/CMakeCache.txt || rm -rf $(ASAN_BUILD)
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSLIPSTREAM_SANITIZE=ON \
	  -DSLIPSTREAM_FUZZ=ON -DSLIPSTREAM_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# The same suites under AddressSanitizer and UndefinedBehaviorSanitizer.
test-sanitize: sanitize-build
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS)

# Every PostgreSQL test (pg_regress and isolation, crash, replication, takeover, Patroni,
# logical decoding, tablespace, shuffle and YCSB smoke tests; scripts/pg_tests.sh lists them),
# two at a time on private clusters run by the postgres OS user. The tests' ports (55400-55999)
# are first taken out of the kernel's ephemeral range, so that no outgoing connection holds one
# when a server starts.
test-pg: install
	scripts/reserve_test_ports.sh
	scripts/pg_tests.sh

# The pg_regress, isolation, contention, crash and pinned-stall suites with slipstream.so
# built with ASan and UBSan and loaded by PostgreSQL (scripts/pg_sanitize.sh says how).
# About 15 minutes; not in `make check` (its 30 minutes are spent), run before a release.
test-pg-sanitize: pg-sanitize-build
	@dpkg -s patchelf >/dev/null 2>&1 || { $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf; }
	scripts/pg_sanitize.sh $(PG_ASAN_BUILD)

# The libraries and the bridge with gcc's AddressSanitizer and UBSan, whose runtime
# scripts/pg_sanitize.sh preloads into the server.
pg-sanitize-build: deps
	cmake -S . -B $(PG_ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSLIPSTREAM_SANITIZE=ON -DSLIPSTREAM_BENCH=OFF >/dev/null
	cmake --build $(PG_ASAN_BUILD) -j$(JOBS) --target slipstream_bridge

# libFuzzer targets, one per parser of outside input (tests/fuzz), with ASan and UBSan: they
# are part of the sanitizer build.
fuzz-build: sanitize-build

# Every fuzz target for FUZZ_SECONDS (60) each; fails on a finding (scripts/fuzz.sh).
FUZZ_SECONDS ?= 60
fuzz: fuzz-build
	scripts/fuzz.sh $(FUZZ_SECONDS) $(abspath $(ASAN_BUILD))

# Every fuzz target for 3 s, after its regression inputs: they keep building and running (CI).
fuzz-smoke: fuzz-build
	scripts/fuzz.sh 3 $(abspath $(ASAN_BUILD))

# Rewrites the checked-in seed corpus (tests/fuzz/corpus) from the real encoders.
fuzz-seeds: fuzz-build
	$(ASAN_BUILD)/tests/fuzz/fuzz_seeds tests/fuzz/corpus

# SOAK_MINUTES of TPC-B, YCSB and acknowledged inserts with random SIGKILLs (scripts/soak.sh).
SOAK_MINUTES ?= 60
soak: install
	scripts/soak.sh $(SOAK_MINUTES)

# sqlsmith's random queries against slipstream tables, errors compared with heap's.
SQLSMITH_QUERIES ?= 20000
sqlsmith: install
	@dpkg -s sqlsmith >/dev/null 2>&1 || { $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sqlsmith; }
	scripts/sqlsmith.sh $(SQLSMITH_QUERIES)

# Every test: formatting, the plain build and its tests, the PostgreSQL suites, then the
# sanitizer build's tests and the fuzz targets briefly. The PostgreSQL suites leave about half
# a core idle (they wait for fsyncs, promotions and the sleeps before kills), so the sanitizer
# build compiles beside them at idle priority (scripts/idle_priority.sh) into a log of its own,
# printed only if it fails. An interrupted check stops the build too (it leads its own session,
# so its process group is its pid).
check: check-format test install
	@echo "== the sanitizer build compiles at idle priority beside the PostgreSQL tests (log: $(ASAN_BUILD).log)"
	@start=$$(date +%s); \
	scripts/idle_priority.sh $(MAKE) --no-print-directory sanitize-build >$(ASAN_BUILD).log 2>&1 & build=$$!; \
	trap "kill -- -$$build 2>/dev/null" INT TERM; \
	$(MAKE) --no-print-directory test-pg; tests=$$?; \
	wait $$build; built=$$?; \
	if [ $$built = 0 ]; then echo "== sanitizer build: done $$(($$(date +%s) - start)) s after it started"; \
	else tail -n 60 $(ASAN_BUILD).log; echo "the sanitizer build failed (log: $(ASAN_BUILD).log)" >&2; fi; \
	[ $$tests = 0 ] && [ $$built = 0 ]
	$(MAKE) --no-print-directory test-sanitize fuzz-smoke

# C++ sources follow .clang-format; the extension's C files (and its C headers) keep
# PostgreSQL's style (pgindent) and are left alone.
CXX_SOURCES = git ls-files '*.cc' '*.h' ':(exclude)extension/*.h' ':(exclude)extension/**/*.h'

# Fails (and names the files) when a C++ file is not formatted.
check-format: deps
	@clang-format --dry-run --Werror $$($(CXX_SOURCES)) && echo "C++ formatting: ok"

format:
	clang-format -i $$($(CXX_SOURCES))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(PG_ASAN_BUILD)

# The rdma benchmarks of docs/benchmarks.md: transport WRITE bandwidth/latency (rdma_bench,
# beside memcpy, raw loopback TCP and UCX), the multi-buffer channel (channel_bench), then the
# plots docs/rdma_*.png. CSV files go to RDMA_RESULTS. About 4 minutes on 2 cores.
RDMA_RESULTS ?= results/rdma
bench-rdma: deps
	@missing=$$(for p in ucx-utils gnuplot-nox; do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j$(JOBS) --target rdma_bench channel_bench
	$(BUILD)/bench/rdma_bench --csv-dir=$(RDMA_RESULTS)
	$(BUILD)/bench/channel_bench --csv-dir=$(RDMA_RESULTS)
	gnuplot -e "csv='$(RDMA_RESULTS)'; out='docs'" scripts/plot_rdma.gp

# The query shuffle across three local nodes against postgres_fdw (bench/shuffle_pg.sh;
# SHUFFLE_ARGS, e.g. --rows=10000000 --rounds=2): docs/benchmarks.md, "The SQL shuffle".
SHUFFLE_ARGS ?=
bench-shuffle: install
	@missing=$$(for p in bc gnuplot-nox; do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	bench/shuffle_pg.sh $(SHUFFLE_ARGS)

# Declarative regions (D-RDMA) against per-fragment WRITEs and copy-out on shm and tcp
# (bench/region_bench: calibration, the shuffle and projection scenarios), then the plot
# docs/rdma_regions.png. About 3 minutes on 2 cores.
REGION_RESULTS ?= results/regions
bench-regions: deps
	@command -v gnuplot >/dev/null || { \
	  echo "installing: gnuplot-nox"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox; }
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j$(JOBS) --target region_bench
	mkdir -p $(REGION_RESULTS)
	$(BUILD)/bench/region_bench --costs=library --csv=$(REGION_RESULTS)/region.csv
	gnuplot -e "csv='$(REGION_RESULTS)/region.csv'; out='docs/rdma_regions.png'" scripts/plot_regions.gp

# The PostgreSQL benchmarks of docs/benchmarks.md, heap against slipstream on one server in one
# run: YCSB Load and A-F (bench/ycsb_pg.sh; YCSB_ARGS, e.g. --mixes=all) and pgbench TPC-B
# (bench/tpcb_pg.sh; TPCB_ARGS).
YCSB_ARGS ?=
TPCB_ARGS ?=
COPY_ARGS ?=
bench-pg: install
	bench/ycsb_pg.sh $(YCSB_ARGS)
	bench/tpcb_pg.sh $(TPCB_ARGS)
	bench/copy_pg.sh $(COPY_ARGS)

# The replication benchmark of docs/benchmarks.md (bench/replication_pg.sh), in one run:
# pgbench TPC-B and YCSB A on slipstream tables without replication, with 1 and 2 Tailwind
# backups (shm and tcp, remote_memory and remote_flush) and with PostgreSQL's synchronous
# streaming replication (1 and 2 standbys, remote_write and on), and on heap tables without and
# with streaming replication: tps and its ratio to no replication, p50/p99 latency, CPU per
# 1,000 commits on the standbys (receiving apart from replay). REPLICATION_ARGS, e.g.
# --seconds=30, --configs='tw-*' or --quick (a 2-minute smoke run); CSV into
# results/replication, the plot into docs/replication_bench.png. About 12 minutes on 2 cores.
REPLICATION_ARGS ?=
bench-replication: install
	@command -v gnuplot >/dev/null || { \
	  echo "installing: gnuplot-nox"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox; \
	}
	bench/replication_pg.sh $(REPLICATION_ARGS)

# The index-shipping benchmark of docs/benchmarks.md (bench/shipping_pg.sh), in one run: YCSB
# Load and A (SD, MD, LD mixes) and pgbench TPC-B on a primary with one Tailwind backup,
# Build-Index against Send-Index (plain and LZ4), on shm and tcp: the primary's tps, the
# backup's CPU per operation, its device bytes read and written, the network bytes (WAL + index
# stream), the takeover time after SIGKILL of the primary; then the takeover of a Build-Index
# and a Send-Index backup holding 1 GB. SHIPPING_ARGS, e.g. --quick (a 3.5-minute smoke run),
# --mixes=SD,tpcb, --transports=tcp, --promote-gb=0; CSV into results/shipping, the plot into
# docs/shipping_bench.png. About 14 minutes on 2 cores.
SHIPPING_ARGS ?=
.PHONY: bench-shipping
bench-shipping: install
	@command -v gnuplot >/dev/null || { \
	  echo "installing: gnuplot-nox"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox; \
	}
	bench/shipping_pg.sh $(SHIPPING_ARGS)
