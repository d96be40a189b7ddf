# llmesh: two commands.
#   make run   install dependencies, build, serve the bundled model over the OpenAI API (llmesh serve)
#   make test  install dependencies, configure, build, run every test (ctest)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test run clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every test has a time limit (180 s for GoogleTest cases, cmake/llmesh_library.cmake): a hang
# fails that test by name. A test that fails or times out runs once more before it counts as
# failed (the output of the first try is still printed), so that a rare stall on a loaded
# 2-core machine does not sink a run (tests/README.md, "Known flakiness"); a test that fails
# twice fails the run.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 300 --repeat until-pass:2

# The bundled model: models/kjv-tiny, a tiny Llama trained on the King James Bible
# (tools/train/README.md), served on http://127.0.0.1:8080 until Ctrl-C (HTTP=HOST:PORT to move it).
HTTP ?= 127.0.0.1:8080
RPC ?= 127.0.0.1:8081
run: build
	$(BUILD)/cli/llmesh serve --model models/kjv-tiny --http $(HTTP) --rpc $(RPC)

clean:
	rm -rf $(BUILD)
