# H2's two-command set-up: `make demo` and `make test` (README.md).
# Both install the Debian packages that are missing, configure and build;
# `make bench` runs the benchmarks into build/bench-results.json.

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
# CI machines have 2 cores and libtorch translation units take ~1.5 GB each.
JOBS       ?= 2
CTEST_ARGS ?=

# Everything the build, the tests and the demo need, from Debian 12
# (python3-torch and python3-numpy: tests/python, docs/export.md).
DEB_PACKAGES := \
  cmake g++ make pkg-config \
  libcaf-dev libtorch-dev libopenblas0-openmp \
  libasio-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libssl-dev \
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev \
  python3-torch python3-numpy \
  libibverbs-dev librdmacm-dev libamdhip64-dev \
  prometheus iproute2 procps openssl

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps configure build demo test bench clean

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

$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target h2-launch
	$(BUILD_DIR)/apps/h2-launch examples/demo.toml

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

bench: build
	bench/run.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
