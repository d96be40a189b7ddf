# llmesh: two commands.
#   make run   install dependencies, build, run the main job (llmesh generate on the bundled model)
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

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The bundled model: models/kjv-tiny, a tiny Llama trained on the King James Bible
# (tools/train/README.md). Sampled with a fixed seed, so every run prints the same text.
run: build
	$(BUILD)/cli/llmesh generate --model models/kjv-tiny --prompt "In the beginning God created" \
	  --max-tokens 48 --temperature 0.8 --top-k 40 --seed 1

clean:
	rm -rf $(BUILD)
