"""Tensor-parallel tensorrt artifacts: each rank's two engines, their all-reduces TensorRT's ``DistCollective`` layers
(NCCL inside the engines), ranks placed as TensorRT-LLM places them.

Here (no GPU, no TensorRT) the rank graphs' rewrite for TensorRT's parser runs for real on the rank graphs a
tensor-parallel build exports, and the build refuses with the probe's reason; the ``gpu`` test builds and generates
on a host with two GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import aotforge
from aotforge.targets import get_target
from aotforge.targets.tensorrt.generative import rank_mapping
from aotforge.targets.tensorrt.rank_graphs import DOMAIN, MARK, OP_TYPE, marked_graph
from tests.conftest import assert_refused
from tests.generative_bundles import compile_cli
from tests.llm_models import MAX_SEQ, assert_generates_like_transformers, tiny_causal_lm

DEGREE = 2


@pytest.mark.parametrize("graph", ["prefill.onnx", "decode.onnx"])
def test_each_all_reduce_becomes_an_identity_the_parser_takes_on_the_same_edges(
    graph: str, llama_tp: Any, tmp_path: Path
) -> None:
    """A rank graph a tensor-parallel build exported: every ``AllReduce`` node becomes an ``Identity`` named for the
    builder, on the node's own input and output, and nothing of the custom-op domain is left (ONNX Runtime opens
    the marked graph without onnxruntime-extensions, and it runs)."""
    rank = tmp_path / "rank"
    rank.mkdir()
    source = Path(llama_tp.path) / "ranks" / "0"
    for name in (graph, "weights.data"):
        (rank / name).write_bytes((source / name).read_bytes())
    original = onnx.load(str(rank / graph), load_external_data=False)
    reduces = [(n.input[:], n.output[:]) for n in original.graph.node if (n.domain, n.op_type) == (DOMAIN, OP_TYPE)]
    assert reduces, "the rank graph has its all-reduces"

    marked, names = marked_graph(rank / graph)
    assert marked.parent == rank and names == [f"{MARK}{i}" for i in range(len(reduces))]
    model = onnx.load(str(marked), load_external_data=False)
    identities = {n.name: (n.input[:], n.output[:]) for n in model.graph.node if n.op_type == "Identity"}
    assert [identities[name] for name in names] == reduces
    assert not [n for n in model.graph.node if n.domain == DOMAIN]
    assert DOMAIN not in {op.domain for op in model.opset_import}
    assert len(model.graph.node) == len(original.graph.node)

    session = ort.InferenceSession(str(marked), providers=["CPUExecutionProvider"])  # no custom-op library
    feeds = {}
    for value in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in value.shape]
        feeds[value.name] = np.zeros(shape, dtype=np.float32 if "float" in value.type else np.int64)
    if "attention_mask" in feeds:
        feeds["attention_mask"][:] = 1
    outputs = session.run(None, feeds)
    assert all(np.isfinite(o).all() for o in outputs if o.dtype == np.float32)


def test_ranks_are_placed_as_tensorrt_llm_maps_them() -> None:
    """``rank = pp_rank * tp_size + tp_rank`` with one pipeline stage: rank r is tensor-parallel rank r."""
    assert [rank_mapping(r, 4) for r in (0, 3)] == [
        {"world_size": 4, "tp_size": 4, "pp_size": 1, "rank": 0, "tp_rank": 0, "pp_rank": 0},
        {"world_size": 4, "tp_size": 4, "pp_size": 1, "rank": 3, "tp_rank": 3, "pp_rank": 0},
    ]


@pytest.mark.parametrize(
    ("flags", "exit_code", "refusal"),
    [
        (["--tensor-parallel", "2"], 5, "target tensorrt is not available on this host: tensorrt needs"),
        (["--tensor-parallel", "2", "--sequence-parallel"], 2, "tensorrt ranks have no reduce-scatter"),
        (["--pipeline-parallel", "2"], 2, "tensorrt has no stage runtime yet \\(only onnxruntime\\)"),
    ],
)
def test_a_sharded_tensorrt_build_here_is_refused_by_name(
    flags: list[str], exit_code: int, refusal: str, llama_dir: Path, tmp_path: Path
) -> None:
    """Without the SDK a tensor-parallel build refuses with the probe's reason (what the host lacks), before any
    export; what the tensorrt ranks cannot run is refused by name first."""
    if get_target("tensorrt").probe().available:
        pytest.skip("tensorrt is available here")
    assert_refused(compile_cli(llama_dir, tmp_path / "out", "tensorrt", *flags), exit_code, refusal)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("manifest.json"))


@pytest.mark.gpu
def test_tensorrt_ranks_generate_token_exact_on_two_gpus(llama_dir: Path, tmp_path: Path) -> None:
    """Two ranks, a GPU each: built, validated token for token against transformers, loaded as one model."""
    probe = get_target("tensorrt").probe()
    if not probe.available:
        pytest.skip(probe.reason)
    import torch

    if torch.cuda.device_count() < DEGREE:
        pytest.skip(f"tensor parallelism {DEGREE} needs {DEGREE} GPUs; this host has {torch.cuda.device_count()}")
    result = aotforge.build(
        str(llama_dir), target="tensorrt", task="text-generation", out=tmp_path, max_seq_len=MAX_SEQ, max_batch=2,
        tensor_parallel=DEGREE, bench=False,
    )  # fmt: skip
    assert result.manifest.validation["token_agreement"] == 1.0
    assert {f"ranks/{r}/{f}" for r in range(DEGREE) for f in ("prefill.engine", "decode.engine", "rank.json")} <= set(
        result.manifest.files
    )
    loaded = aotforge.load(result.path)
    try:
        assert_generates_like_transformers(loaded, tiny_causal_lm("llama"))
    finally:
        loaded._generative().engine.close()
