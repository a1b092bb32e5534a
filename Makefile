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

.PHONY: compile test test-durations test-slow lint bench bench-models bench-generation bench-speculative bench-draft bench-qat bench-serve bench-quality bench-tensor-parallel bench-pipeline-parallel bench-collectives bench-page targets clean device-check neuron-env tvm-ops-table

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

# One pytest worker per core, a test file to one worker (its module fixtures build once): most of a test
# is one Python thread waiting on a build, so a second core halves little else.
test: $(BIN)/.installed
	$(BIN)/pytest -q -n auto --dist loadfile

# The default run with a junit report, whose per-file seconds set the order files go to the workers in.
test-durations: $(BIN)/.installed
	$(BIN)/pytest -q -n auto --dist loadfile --junitxml=$(OUT)/junit.xml
	$(BIN)/python tools/test_durations.py $(OUT)/junit.xml

test-slow: $(BIN)/.installed
	$(BIN)/pytest -q -m slow

# On an NVIDIA host: the GPU extra, what this host offers, then every GPU test in one go, where a skip
# (no TensorRT, no GPU, a CPU-only torch) fails the run instead of passing it (AOTFORGE_REQUIRE, tests/conftest.py).
_version = $$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("$(1)"))')
device-check: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[dev,gpu]'
	# onnxruntime and onnxruntime-gpu install the same `onnxruntime` module and cannot live side by side
	# (microsoft/onnxruntime#26996): drop the CPU one the base dependencies bring, then rewrite the GPU one's files.
	$(BIN)/pip uninstall --quiet -y onnxruntime
	$(BIN)/pip install --quiet --force-reinstall --no-deps "onnxruntime-gpu==$(call _version,onnxruntime-gpu)"
	$(BIN)/python -c 'import onnxruntime as o; p = o.get_available_providers(); assert "CUDAExecutionProvider" in p, p'
	$(BIN)/aotforge targets
	AOTFORGE_REQUIRE=tensorrt $(BIN)/pytest -q -rs -m gpu tests/test_device_e2e.py tests/test_target_contract.py tests/test_tensorrt_target.py tests/test_tensorrt_generative.py
	# Tensor-parallel ranks take a GPU each: their tests run (and must pass) where the host has two.
	if [ "$$(nvidia-smi -L | wc -l)" -ge 2 ]; then AOTFORGE_REQUIRE=tensorrt $(BIN)/pytest -q -rs -m gpu tests/test_tensorrt_ranks.py; fi

lint: $(BIN)/.installed
	$(BIN)/ruff check aotforge tests examples tools
	$(BIN)/ruff format --check aotforge tests examples tools
	$(BIN)/mypy

clean:
	rm -rf $(OUT) .pytest_cache .mypy_cache .ruff_cache

# The ONNX node suite (shape-like inputs bound) through the tvm target, per op: docs/tvm_onnx_ops.md (~1 h on 2 cores).
tvm-ops-table: $(BIN)/.installed
	mkdir -p docs
	$(BIN)/python tools/node_suite.py --target tvm --variant constants --table docs/tvm_onnx_ops.md

# The benches write docs/bench/<bench>.json (the run, the machine, the load, every figure with its spread over the
# rounds); tools/bench_page.py renders them into docs/benchmarks.md. bench: every bench, then the page.
# bench-models: the encoder and vision models, every runtime side by side (a subset: ARGS="--models mini_resnet").
# bench-generation: aotforge onnxruntime and tvm vs ONNX Runtime GenAI vs transformers eager on the SmolLM-135M
# shape, with the bandwidth floor. bench-speculative: target-only vs speculative decoding (k over --ks) on the
# trained pair of tests/lm_pair.py. bench-page: only the page.
bench: $(BIN)/.installed
	$(BIN)/python tools/bench.py
	$(BIN)/python tools/bench_generation.py
	$(BIN)/python tools/bench_speculative.py --work /tmp/aotforge-spec-bench
	$(BIN)/python tools/bench_page.py

bench-models: $(BIN)/.installed
	$(BIN)/python tools/bench.py $(ARGS)
	$(BIN)/python tools/bench_page.py

bench-generation: $(BIN)/.installed
	$(BIN)/python tools/bench_generation.py $(ARGS)
	$(BIN)/python tools/bench_page.py

# bench-serve: aotforge serve (onnxruntime, tvm; fp32, int4) vs llama.cpp's llama-server (F32, Q4_0) on SmolLM2-135M,
# the same bench serve client, each server alone; builds llama.cpp from the llama-cpp-python sdist once (~10 min).
bench-serve: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python tools/bench_serve.py $(ARGS)
	$(BIN)/python tools/bench_page.py

# bench-quality: int4 on SmolLM2-135M by method (rtn, hqq, awq, gptq, awq+gptq, mixed 8/4 bits) vs llama.cpp Q4_0 on
# the quality gate's text (perplexity, KL), and the decode ITL of one configuration vs llama-bench Q4_0.
bench-quality: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python tools/bench_quality.py $(ARGS)
	$(BIN)/python tools/bench_page.py

bench-speculative: $(BIN)/.installed
	$(BIN)/python tools/bench_speculative.py --work /tmp/aotforge-spec-bench $(ARGS)
	$(BIN)/python tools/bench_page.py

# bench-draft: a distilled draft of SmolLM2-135M (3 layers, its 8192 most frequent tokens, sequence-level distillation;
# made once, 30 CPU-minutes) against target-only greedy decoding on tvm, batch 1, held-out English prompts.
# ARGS='--kind feature': a feature draft (aotforge distill-draft) instead, the same budget.
bench-draft: $(BIN)/.installed
	$(BIN)/python tools/bench_draft.py $(ARGS)
	$(BIN)/python tools/bench_page.py

# bench-qat: aotforge qat of SmolLM2-135M (20 CPU-minutes of training, made once) against the default int4 build, both
# scored by the build's quality gate on held-out text: the share of the int4 perplexity gap recovered.
bench-qat: $(BIN)/.installed
	$(BIN)/python tools/bench_qat.py $(ARGS)
	$(BIN)/python tools/bench_page.py

# bench-tensor-parallel: --tensor-parallel 2 vs the unsharded artifact on SmolLM2-135M (the bench-serve fp32 artifact).
bench-tensor-parallel: $(BIN)/.installed
	$(BIN)/python tools/bench_tensor_parallel.py $(ARGS)
	$(BIN)/python tools/bench_page.py

# bench-pipeline-parallel: --pipeline-parallel 2 vs the unsharded artifact on SmolLM2-135M, 8 concurrent requests.
bench-pipeline-parallel: $(BIN)/.installed
	$(BIN)/python tools/bench_pipeline_parallel.py $(ARGS)
	$(BIN)/python tools/bench_page.py

# bench-collectives: the all-reduce over shared memory, gloo on loopback and gloo between two network namespaces (root:
# a veth pair stands in for two hosts), and a tensor-parallel 2 decode over each; the sizing model's terms.
bench-collectives: $(BIN)/.installed
	$(BIN)/python tools/bench_collectives.py $(ARGS)
	$(BIN)/python tools/bench_page.py

bench-page: $(BIN)/.installed
	$(BIN)/python tools/bench_page.py

# The Neuron SDK in an environment of its own: torch-neuronx 2.9 pins torch 2.9, aotforge pins 2.13.
# The neuron target compiles through it (targets/neuron/worker.py): --target-opt python=.venv-neuron/bin/python.
# Versions: aws-neuron-sdk setup/pytorch/manual.rst (Neuron's own repository; PyPI's are placeholders).
NEURON_PIP ?= neuronx-cc==2.27.5334.0 torch-neuronx==2.9.0.2.15.32035
neuron-env:
	$(PYTHON) -m venv .venv-neuron
	.venv-neuron/bin/pip install --quiet --extra-index-url=https://pip.repos.neuron.amazonaws.com $(NEURON_PIP)
