"""``weight-only.prompt_int8``: a decoder's prompt graphs (prefill, verify) on 8-bit integer GEMM, its decode graph on
MatMulNBits. A row's result is its own whatever shares the batch, so the served engine (prompts in chunks through
the verify graph, requests side by side) stays token-exact with ``generate()``, and quality stays within the gate.
onnxruntime only: tvm's weight-only kernel computes every matmul with int8 activations already (and refuses it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotforge.artifacts.engine_loader import load_engine
from aotforge.artifacts.loader import load
from aotforge.artifacts.manifest import read_manifest
from aotforge.core.errors import OptionsError
from aotforge.passes import make_pass
from aotforge.passes.manager import run_passes
from aotforge.passes.ort_quantization import op_counts
from aotforge.runtime.params import EngineConfig, SamplingParams
from tests.llm_models import MAX_BATCH, SPECULATIVE_K, build_text_generation, tiny_causal_lm
from tests.pass_models import _finish, run

RNG = np.random.default_rng(11)
PROMPTS = [[int(t) for t in RNG.integers(3, 500, size=n)] for n in (21, 5, 37, 12)]
NEW = 12


def _projection(k: int = 96, n: int = 80) -> tuple[object, np.ndarray]:
    """x [rows, k] -> MatMul(x, W) -> Relu -> y (a projection inside a network, not a head) and its weight."""
    weight = (np.random.default_rng(0).standard_normal((k, n)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"), helper.make_node("Relu", ["h"], ["y"])],
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [numpy_helper.from_array(weight, "w")],
    )
    return _finish(graph), weight


def test_integer_gemm_rows_are_their_own_whatever_shares_the_batch() -> None:
    """Each row's output equals that row run alone, bit for bit (one outlier row beside the others changes nothing,
    where a per-tensor activation scale would), within 8-bit error of the float matmul."""
    model, weight = _projection()
    (record,) = run_passes(model, [make_pass("weight-only", {"prompt_int8": "true"})])
    assert record.stats["integer_gemm"] == ["proj"] and op_counts(model) == {"MatMulInteger": 1}
    x = np.random.default_rng(1).standard_normal((6, 96)).astype(np.float32)
    x[2] *= 40.0
    together = run(model, {"x": x})[0]
    for row in range(len(x)):
        np.testing.assert_array_equal(run(model, {"x": x[row : row + 1]})[0][0], together[row])
    expected = np.maximum(x @ weight, 0)
    assert np.linalg.norm(together - expected) / np.linalg.norm(expected) < 0.02


def test_a_decode_graph_runs_the_pass_on_matmulnbits_and_a_prompt_graph_on_integer_gemm() -> None:
    """``for_graph``: the same pass instance takes the role of each decoder graph; only the decode role drops it."""
    prompt_pass = make_pass("weight-only", {"prompt_int8": "true"})
    decode_model, _ = _projection()
    (decode,) = run_passes(decode_model, [prompt_pass.for_graph("decode")])
    assert "integer_gemm" not in decode.stats and op_counts(decode_model) == {"MatMulNBits": 1}
    assert prompt_pass.for_graph("prompt") is prompt_pass and prompt_pass.params.prompt_int8
    plain = make_pass("weight-only", {})
    assert plain.for_graph("decode") is plain


def test_tvm_refuses_prompt_int8() -> None:
    from aotforge.passes.quantize_weight_only import QuantizeWeightOnlyParams
    from aotforge.targets.tvm.decoder.weight_only import weight_only_format

    with pytest.raises(OptionsError, match="prompt_int8"):
        weight_only_format(QuantizeWeightOnlyParams(accuracy_level=4, prompt_int8=True))


@pytest.fixture(scope="module")
def prompt_int8_ort(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama for onnxruntime at int4 (round to nearest: no calibration): prompt graphs on integer GEMM, the
    onnxruntime text-generation default."""
    params = {"weight-only": {"method": "rtn"}}
    out = tmp_path_factory.mktemp("prompt-int8")
    built = build_text_generation(llama_dir, out, speculative_k=SPECULATIVE_K, precision="int4", pass_params=params)
    return Path(built.path)


def test_prompt_graphs_take_integer_gemm_and_decode_keeps_4_bits(prompt_int8_ort: Path) -> None:
    """The manifest records the option per graph; the build passed its quality gate (held-out perplexity within
    ``max_perplexity_increase`` of fp32); the prefill's logits stay within 8-bit error of the fp32 model's."""
    import torch

    manifest = read_manifest(prompt_int8_ort)
    entries = {e["graph"]: e for e in manifest.passes if e["name"] == "weight-only"}
    for graph in ("prefill", "verify"):
        assert entries[graph]["params"]["prompt_int8"] and len(entries[graph]["stats"]["integer_gemm"]) == 2 * 4
    assert not entries["decode"]["params"]["prompt_int8"] and "integer_gemm" not in entries["decode"]["stats"]
    assert set(entries["decode"]["stats"]["bits_by_node"].values()) == {4, 8}  # the head at 8 bits
    quality = manifest.validation["quality"]
    assert quality["perplexity_increase"] <= quality["max_perplexity_increase"]
    prompt = np.array([PROMPTS[2]])
    engine = load(prompt_int8_ort)._generative().engine
    engine.start(1, prompt.shape[1])
    got = engine.prefill(prompt, np.ones_like(prompt), np.arange(prompt.shape[1])[None])
    with torch.no_grad():
        want = tiny_causal_lm("llama")(torch.tensor(prompt)).logits[:, -1].numpy()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.05


def test_served_chunks_and_batches_equal_generate(prompt_int8_ort: Path) -> None:
    """Prompts in chunks of 8 tokens (the verify graph extends them), requests arriving mid-run, 4-token blocks:
    every request's greedy tokens equal ``generate()``'s for its prompt alone."""
    config = EngineConfig(max_num_seqs=MAX_BATCH, max_num_batched_tokens=8, block_size=4)
    engine, _, _ = load_engine(prompt_int8_ort, config)
    engine.eos_token_ids = frozenset()  # random weights: never stop early, as generate(ignore_eos=True)
    arrivals, tokens, step = {0: [0, 1], 3: [2], 6: [3]}, {i: [] for i in range(len(PROMPTS))}, 0
    while engine.has_unfinished() or step <= max(arrivals):
        for i in arrivals.get(step, []):
            engine.add_request(str(i), PROMPTS[i], SamplingParams(max_tokens=NEW, temperature=0))
        for out in engine.step():
            assert out.error is None
            tokens[int(out.request_id)] += out.token_ids
        step += 1
    loaded = load(prompt_int8_ort)
    expected = [[int(t) for t in loaded.generate(np.array([p]), NEW, ignore_eos=True)[0, len(p) :]] for p in PROMPTS]
    assert [tokens[i] for i in range(len(PROMPTS))] == expected
