# aotforge: `make compile` builds an artifact, `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TARGET ?= tvm
MODEL ?= examples/mini_resnet.py
OUT ?= out
PASSES ?= O1
RECIPE ?=
ARGS ?=
# With a RECIPE, TARGET / PASSES are passed only when set on the command line, so the recipe's hold.
_flag = $(if $(and $(RECIPE),$(filter file,$(origin $(1)))),,--$(2) $($(1)))

.PHONY: compile test test-slow lint bench targets clean device-check

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: it takes the local CPU wheel instead of a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

compile: $(BIN)/.installed
	$(BIN)/aotforge compile $(MODEL) $(call _flag,TARGET,target) $(call _flag,PASSES,passes) --out $(OUT) \
		$(if $(RECIPE),--recipe $(RECIPE)) $(if $(filter 1,$(PUSH)),--push $(or $(REGISTRY),~/.aotforge/registry)) $(ARGS)

targets: $(BIN)/.installed
	$(BIN)/aotforge targets

test: $(BIN)/.installed
	$(BIN)/pytest -q

test-slow: $(BIN)/.installed
	$(BIN)/pytest -q -m slow

# On an NVIDIA host with TensorRT: what this host offers, then every GPU end-to-end test in one go.
device-check: $(BIN)/.installed
	$(BIN)/aotforge targets
	$(BIN)/pytest -q -rs -m gpu tests/test_device_e2e.py tests/test_tensorrt_target.py

lint: $(BIN)/.installed
	$(BIN)/ruff check aotforge tests examples tools
	$(BIN)/ruff format --check aotforge tests examples tools
	$(BIN)/mypy

clean:
	rm -rf $(OUT) .pytest_cache .mypy_cache .ruff_cache

bench: $(BIN)/.installed
	$(BIN)/python tools/bench.py
