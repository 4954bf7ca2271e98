# H2's two-command set-up: `make demo` and `make test` (README.md).
# Both install the Debian packages that are missing, configure and build;
# `make bench` runs the benchmarks into build/bench-results.json; `make fuzz`
# runs every fuzz target under libFuzzer (docs/fuzzing.md); `make
# test-asan` runs the suite under ASan + UBSan and `make test-tsan` the
# transport and runtime tests under TSan (.ci/run runs all three suites).

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
# CI machines have 2 cores and libtorch translation units take ~1.5 GB each.
JOBS       ?= 2
CTEST_ARGS ?=
# Extra cache entries for a new build directory's configure.
CMAKE_ARGS ?=
# Ninja schedules the build's jobs itself (no recursive make); a build
# directory keeps the generator it was configured with.
GENERATOR  ?= Ninja
# (expanded when the recipe runs, so a new directory gets -G and an old
# one keeps what its cache says).
generator_of = $(if $(wildcard $(1)/CMakeCache.txt),,-G "$(GENERATOR)")

# Everything the build, the tests and the demo need, from Debian 12
# (python3-torch, python3-numpy and python3-sentencepiece: tests/python,
# docs/export.md; sentencepiece's spm_encode: bench_tokenize; fortunes: the
# text corpus of examples/text.toml; chromium and chromium-driver: the live
# page's browser test, tests/apps/test_live_page.py).
DEB_PACKAGES := \
  cmake g++ make ninja-build pkg-config \
  libcaf-dev libtorch-dev libopenblas0-openmp \
  libasio-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libssl-dev \
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev \
  python3-torch python3-numpy \
  libsentencepiece-dev sentencepiece python3-sentencepiece fortunes \
  libibverbs-dev librdmacm-dev libamdhip64-dev \
  prometheus iproute2 procps openssl chromium chromium-driver \
  clang-14 libclang-rt-14-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# `make fuzz`: its own build (clang, libFuzzer, ASan + UBSan) and how many
# inputs each target runs, starting from a copy of its seed corpus.
FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_RUNS      ?= 500000

# The sanitizer builds: their own directories, no benchmarks.
ASAN_BUILD_DIR ?= build-asan
TSAN_BUILD_DIR ?= build-tsan
# Tests a sanitizer stage leaves out, with their reasons, are listed in
# tests/sanitizer-exclusions.txt (they all run in `make test`).

.PHONY: all deps configure build demo text test test-asan test-tsan bench fuzz clean

all: build

deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "h2: installing missing Debian packages:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

# A configure that fails leaves no cache behind, so the next make runs it
# again instead of building a tree that was never generated.
$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  $(CMAKE_ARGS) || { rm -f $(BUILD_DIR)/CMakeCache.txt; exit 1; }

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target h2-launch
	$(BUILD_DIR)/apps/h2-launch examples/demo.toml

# The README's "Train on text": Debian's fortunes tokenized once into
# $(BUILD_DIR)/text/fortunes (h2-data, docs/data.md), a small Llama trained
# on them (examples/text.toml), then a sample from its last checkpoint.
TEXT_PROMPT ?= The meaning of life is
text: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target h2-launch h2-data h2-generate
	@test -f $(BUILD_DIR)/text/fortunes/manifest.json || \
	  $(BUILD_DIR)/apps/h2-data tokenize --vocab-size 2048 \
	    --out $(BUILD_DIR)/text/fortunes \
	    --input $$(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort)
	$(BUILD_DIR)/apps/h2-launch examples/text.toml
	$(BUILD_DIR)/apps/h2-generate \
	  $$(ls -d $(BUILD_DIR)/text/checkpoints/step-* | tail -n 1) \
	  --prompt "$(TEXT_PROMPT)" --tokens 80 --seed 1

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# Every test, built with ASan + UBSan (BUILD_TYPE=Sanitize). Leaks are
# reported (LeakSanitizer) except those tests/lsan.supp names, each with
# its reason.
test-asan:
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1 \
	$(MAKE) test BUILD_DIR=$(ASAN_BUILD_DIR) BUILD_TYPE=Sanitize \
	  CMAKE_ARGS=-DH2_BUILD_BENCH=OFF

# The transport, runtime and metrics tests (their threads share the most
# state: channels, the admin inbox, the HTTP server's worker), built with
# TSan. libtorch and OpenMP are not instrumented: one OpenMP
# thread, and tests/tsan.supp for their internals only.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD_DIR) $(call generator_of,$(TSAN_BUILD_DIR)) \
	  -DCMAKE_BUILD_TYPE=ThreadSanitize -DH2_BUILD_BENCH=OFF
	cmake --build $(TSAN_BUILD_DIR) -j $(JOBS) --target tsan_tests
	OMP_NUM_THREADS=1 \
	TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1" \
	ctest --test-dir $(TSAN_BUILD_DIR) --output-on-failure -j $(JOBS) \
	  -L '^(transport|runtime|metrics)$$' $(CTEST_ARGS)

bench: build
	bench/run.sh $(BUILD_DIR)

# Each target runs over a scratch copy of fuzz/corpus/<name> (what libFuzzer
# adds stays in $(FUZZ_BUILD_DIR)); a finding stops the run, leaving the
# input in $(FUZZ_BUILD_DIR)/fuzz-findings/ and the log in fuzz-logs/.
fuzz: deps
	cmake -S . -B $(FUZZ_BUILD_DIR) $(call generator_of,$(FUZZ_BUILD_DIR)) \
	  -DCMAKE_BUILD_TYPE=Sanitize -DH2_FUZZ=ON \
	  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
	  -DH2_BUILD_TESTS=OFF -DH2_BUILD_BENCH=OFF
	cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS) --target fuzz_targets
	@set -e; out=$(FUZZ_BUILD_DIR); \
	mkdir -p $$out/fuzz-logs $$out/fuzz-findings; \
	for seeds in fuzz/corpus/*/; do \
	  name=$$(basename $$seeds); corpus=$$out/fuzz-corpus/$$name; \
	  rm -rf $$corpus; mkdir -p $$corpus; cp $$seeds* $$corpus/; \
	  echo "h2: fuzzing $$name, $(FUZZ_RUNS) runs"; \
	  if ! $$out/fuzz/fuzz_$$name -runs=$(FUZZ_RUNS) -timeout=10 \
	      -artifact_prefix=$$out/fuzz-findings/$$name- $$corpus \
	      > $$out/fuzz-logs/$$name.log 2>&1; then \
	    tail -n 40 $$out/fuzz-logs/$$name.log; \
	    echo "h2: fuzz_$$name found a bug; the input is in $$out/fuzz-findings"; \
	    exit 1; \
	  fi; \
	  grep -E "^#[0-9]+[[:space:]]+DONE|^Done " $$out/fuzz-logs/$$name.log; \
	done

clean:
	rm -rf $(BUILD_DIR)
