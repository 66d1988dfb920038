# tokenselect: the two commands a newcomer needs are `make run` and `make test` (README.md).
#   make deps     install the Debian packages the build and tests need (idempotent)
#   make build    configure (CMake + Ninja) and build
#   make test     deps + build + unit and integration tests (ctest -L "unit|integration")
#   make run      deps + build + the main job: the all-in-one server (router + prefill + decode
#                 worker in one process) on the generated demo model, on port PORT
#   make format   clang-format every C++/CUDA source in place
# Variables: TS_ENABLE_CUDA=AUTO|ON|OFF (default AUTO), BUILD_DIR (default build, or build-nocuda
# when TS_ENABLE_CUDA=OFF), BUILD_TYPE (default RelWithDebInfo), TS_CUDA_ARCHS (default "80;90"),
# CTEST_ARGS (extra ctest arguments), PORT (the port `make run` serves on, default 50051),
# PROMPT (the prompt the printed example command completes).

TS_ENABLE_CUDA ?= AUTO
ifeq ($(TS_ENABLE_CUDA),OFF)
BUILD_DIR ?= build-nocuda
else
BUILD_DIR ?= build
endif
BUILD_TYPE ?= RelWithDebInfo
TS_CUDA_ARCHS ?= 80;90
CTEST_ARGS ?=
PORT ?= 50051
PROMPT ?= Long-context inference attends to a few thousand chosen tokens because
DEMO_MODEL := $(BUILD_DIR)/demo-model
CLI := $(BUILD_DIR)/bin/tokenselect

.PHONY: all deps configure build test run format clean

all: build

deps:
	@scripts/install-deps.sh

# Configures on every call (cheap, and a no-op for the build when nothing changed) so that
# variables such as TS_ENABLE_CUDA given on the command line always take effect.
configure:
	@mkdir -p $(BUILD_DIR)
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DTS_ENABLE_CUDA=$(TS_ENABLE_CUDA) "-DTS_CUDA_ARCHS=$(TS_CUDA_ARCHS)" > $(BUILD_DIR)/configure.log \
	  || { cat $(BUILD_DIR)/configure.log; exit 1; }
	@grep -E "^-- tokenselect:" $(BUILD_DIR)/configure.log || true

build: deps configure
	@cmake --build $(BUILD_DIR)

test: build
	@cd $(BUILD_DIR) && ctest -L "unit|integration" --output-on-failure -j 2 $(CTEST_ARGS)

run: build
	@test -f $(DEMO_MODEL)/config.json || $(CLI) make-model --preset llama-gqa --out $(DEMO_MODEL)
	@echo "Starting the all-in-one server (router + prefill + decode worker) on port $(PORT)."
	@echo "From another shell:  $(CLI) generate --server localhost:$(PORT) --prompt \"$(PROMPT)\" --max_new_tokens 48"
	@echo "Stop it with Ctrl-C."
	@$(CLI) serve --all-in-one --model $(DEMO_MODEL) --port $(PORT)

format:
	@git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR)
