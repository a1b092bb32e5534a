"""Tensor-parallel tensorrt artifacts: each rank's two engines, their all-reduces TensorRT's ``DistCollective`` layers
(NCCL inside the engines), ranks placed as TensorRT-LLM places them; and their ``--prepare-only`` bundles.

Here (no GPU, no TensorRT) a tensor-parallel bundle is prepared for real (its ranks' graphs, each rank's engine
plans, its ranks run on the CPU token for token against the source), finished for onnxruntime as a tensor-parallel
artifact, and the rank graphs' rewrite for TensorRT's parser runs on its graphs; a direct build and a finish for
tensorrt refuse with the probe's reason. The ``gpu`` tests build, finish and generate on a host with two GPUs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.bundle import read_bundle
from aotforge.compiler.cli import main
from aotforge.compiler.generative.finish import finish_bundle
from aotforge.targets import get_target
from aotforge.targets.tensorrt.generative import rank_mapping
from aotforge.targets.tensorrt.rank_graphs import DOMAIN, MARK, OP_TYPE, marked_graph
from tests.conftest import assert_refused, tree_state
from tests.generative_bundles import compile_cli, finish_unchanged
from tests.llm_models import MAX_SEQ, assert_generates_like_transformers, tiny_causal_lm

DEGREE = 2


@pytest.fixture(scope="module")
def tp_bundle(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama (4 query heads over 2 key/value heads) prepared for tensorrt at two ranks through the CLI."""
    out = tmp_path_factory.mktemp("trt-tp")
    result = compile_cli(llama_dir, out, "tensorrt", "--tensor-parallel", str(DEGREE), "--prepare-only")
    assert result.exit_code == 0, result.output
    return Path(result.stdout.strip().splitlines()[-1])


def test_a_tensor_parallel_bundle_carries_each_ranks_graphs_plans_and_cpu_check(tp_bundle: Path) -> None:
    """Each rank's prefill and decode graphs over its own weights; each rank's engine plans over its half of the
    key/value heads; the ranks run on this CPU as two processes token for token against the source."""
    data = read_bundle(tp_bundle)
    for r in range(DEGREE):
        assert {"prefill.onnx", "decode.onnx", "weights.data"} <= {
            p.name for p in (tp_bundle / "ranks" / str(r)).iterdir()
        }
    kv_heads = data["decoder"]["kv_heads"]
    assert data["shards"]["info"]["tensor_parallel"]["degree"] == DEGREE
    assert [s["kv_heads"] for s in data["shards"]["specs"]] == [kv_heads // DEGREE] * DEGREE
    for shard in data["plan"]["shards"]:
        past = next(p for p in shard["graphs"]["decode"]["plan"]["profiles"] if p["input"] == "past_key_0")
        assert past["max"] == [2, kv_heads // DEGREE, MAX_SEQ, data["decoder"]["head_dim"]]
    check = data["cpu_check"]
    assert check["passed"] and check["token_agreement"] == 1.0 and "2 rank processes" in check["runtime"]
    assert not list(tp_bundle.rglob("session.json"))  # the check's session settings are not part of the bundle


def test_a_tensor_parallel_bundle_finishes_on_onnxruntime_token_exact(tp_bundle: Path, tmp_path: Path) -> None:
    """The sharded finish tail on this CPU: each rank compiled by onnxruntime's rank runtime, the ranks validated
    against the references in the bundle, stored as a tensor-parallel artifact that generates as transformers."""
    result = finish_bundle(tp_bundle, tmp_path, target_name="onnxruntime", bench=False)
    m = result.manifest
    assert m.target.name == "onnxruntime" and m.target.info["tensor_parallel"]["degree"] == DEGREE
    assert m.validation["token_agreement"] == 1.0 and "stored in the bundle" in m.validation["reference"]
    assert {f"ranks/{r}/session.json" for r in range(DEGREE)} <= set(m.files)
    loaded = aotforge.load(result.path)
    try:
        assert_generates_like_transformers(loaded, tiny_causal_lm("llama"))
    finally:
        loaded._generative().engine.close()


def test_preparing_over_an_existing_bundle_is_refused_before_the_export(tp_bundle: Path, llama_dir: Path) -> None:
    """The same --name and --out again: refused before any export, and the bundle there is left as it was."""
    before = tree_state(tp_bundle)
    name = tp_bundle.name.split(".")[0]
    flags = ("--tensor-parallel", str(DEGREE), "--prepare-only", "--name", name)
    result = compile_cli(llama_dir, tp_bundle.parents[1], "tensorrt", *flags)
    assert_refused(result, 2, "already exists: remove it or give another --name")
    assert "exporting" not in result.output and tree_state(tp_bundle) == before


def test_finishing_a_tensor_parallel_bundle_for_tensorrt_here_refuses_with_the_probe_reason(
    tp_bundle: Path, tmp_path: Path
) -> None:
    if get_target("tensorrt").probe().available:
        pytest.skip("tensorrt is available here")
    result = finish_unchanged(tp_bundle, tmp_path)
    assert_refused(result, 5, "cannot finish .* for tensorrt on this host: tensorrt needs")


@pytest.mark.parametrize("graph", ["prefill.onnx", "decode.onnx"])
def test_each_all_reduce_becomes_an_identity_the_parser_takes_on_the_same_edges(
    graph: str, tp_bundle: Path, tmp_path: Path
) -> None:
    """A rank graph of the bundle, as the device host hands it to TensorRT's parser: every ``AllReduce`` node
    becomes an ``Identity`` named for the builder, on the node's own input and output, and nothing of the
    custom-op domain is left (ONNX Runtime opens the marked graph without onnxruntime-extensions, and it runs)."""
    rank = tmp_path / "rank"
    rank.mkdir()
    source = tp_bundle / "ranks" / "0"
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
        (["--tensor-parallel", "2", "--speculative-k", "3"], 2, "tensorrt text-generation artifacts have no verify"),
        (["--pipeline-parallel", "2"], 2, "tensorrt has no stage runtime yet \\(only onnxruntime\\)"),
    ],
)
def test_a_sharded_tensorrt_build_here_is_refused_by_name(
    flags: list[str], exit_code: int, refusal: str, llama_dir: Path, tmp_path: Path
) -> None:
    """Without the SDK a direct tensor-parallel build refuses with the probe's reason (what the host lacks), before
    any export; what the tensorrt ranks cannot run is refused by name first, bundled or not."""
    if get_target("tensorrt").probe().available:
        pytest.skip("tensorrt is available here")
    assert_refused(compile_cli(llama_dir, tmp_path / "out", "tensorrt", *flags), exit_code, refusal)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("manifest.json"))


@pytest.mark.gpu
def test_tensorrt_ranks_generate_token_exact_on_two_gpus(llama_dir: Path, tmp_path: Path) -> None:
    """Two ranks, a GPU each: built, validated token for token against transformers, loaded as one model."""
    _skip_without_a_gpu_a_rank()
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


@pytest.mark.gpu
def test_a_tensor_parallel_bundle_finishes_on_two_gpus(tp_bundle: Path, tmp_path: Path) -> None:
    _skip_without_a_gpu_a_rank()
    result = CliRunner().invoke(main, ["finish", str(tp_bundle), "--out", str(tmp_path), "--no-bench"])
    assert result.exit_code == 0, result.output
    manifest = next(tmp_path.rglob("manifest.json"))
    assert '"token_agreement": 1.0' in manifest.read_text()


def _skip_without_a_gpu_a_rank() -> None:
    probe = get_target("tensorrt").probe()
    if not probe.available:
        pytest.skip(probe.reason)
    import torch

    if torch.cuda.device_count() < DEGREE:
        pytest.skip(f"tensor parallelism {DEGREE} needs {DEGREE} GPUs; this host has {torch.cuda.device_count()}")
