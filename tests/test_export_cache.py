"""The export stage's cache (``generative.export_cache``): a rebuild with other passes reads the exported graphs back
instead of exporting, builds the bytes a fresh export builds, and keys on what decides the graphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aotforge.compiler.generative.export import decoder_spec
from aotforge.compiler.generative.export_cache import key_components
from aotforge.compiler.generative.quality import default_corpus
from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE
from tests.llm_models import MAX_BATCH, MAX_SEQ, SPECULATIVE_K, build_text_generation, tiny_llama

EXPORTING = "exporting the prefill graph"


def _build(llama_dir: Path, out: Path, said: list[str], **kw: Any) -> Any:
    return build_text_generation(str(llama_dir), out, progress=said.append, plots=False, **kw)


def test_rebuild_with_other_passes_reads_the_graphs_back_and_builds_the_fresh_bytes(
    llama_dir: Path, tmp_path: Path
) -> None:
    cache, text = tmp_path / "export", tmp_path / "eval.txt"
    text.write_text(default_corpus()[-6000:], encoding="utf-8")
    # On an empty cache: each graph exported, stored as an entry of its own.
    fresh_said: list[str] = []
    fresh = _build(llama_dir, tmp_path / "fresh", fresh_said, export_cache_dir=cache)
    # Other passes and a verify graph: the decode entry serves it; its prefill also returns ``hidden``, another
    # entry, and the verify graph is new.
    int8_said: list[str] = []
    kw = {"precision": "int8", "eval_text": text, "speculative_k": SPECULATIVE_K}
    _build(llama_dir, tmp_path / "int8", int8_said, export_cache_dir=cache, **kw)
    # The fresh build again: every graph read back.
    hit_said: list[str] = []
    hit = _build(llama_dir, tmp_path / "hit", hit_said, export_cache_dir=cache)
    assert EXPORTING in fresh_said and not any(line.startswith("export cache hit ") for line in fresh_said)
    assert EXPORTING in int8_said and sum(line.startswith("export cache hit ") for line in int8_said) == 1, int8_said
    assert not [line for line in hit_said if line.startswith("exporting ")], hit_said
    assert sum(line.startswith("export cache hit ") for line in hit_said) == 2, hit_said
    files = {f for f in hit.manifest.files if not f.startswith("MODEL_CARD")}
    assert {PREFILL_FILE, DECODE_FILE} <= files
    # Every file but the model card (which names the build's time) is the fresh export's, byte for byte.
    assert {f: hit.manifest.files[f] for f in files} == {f: fresh.manifest.files[f] for f in files}


def test_key_is_the_model_and_the_export_settings() -> None:
    model = tiny_llama()
    spec = decoder_spec(model, MAX_SEQ, MAX_BATCH)
    base = key_components(model, spec, "masked", PREFILL_FILE)
    assert key_components(tiny_llama(), spec, "masked", PREFILL_FILE) == base  # the same weights and config
    assert key_components(tiny_llama(seed=1), spec, "masked", PREFILL_FILE)["model"] != base["model"]
    # The same weights (RoPE has none), another config: another model.
    assert key_components(tiny_llama(rope_theta=500.0), spec, "masked", PREFILL_FILE)["model"] != base["model"]
    wider = decoder_spec(model, 2 * MAX_SEQ, MAX_BATCH)
    for other in (
        key_components(model, spec, "gqa", PREFILL_FILE),
        key_components(model, spec, "masked", DECODE_FILE),
        key_components(model, wider, "masked", PREFILL_FILE),
        key_components(model, spec, "masked", PREFILL_FILE, outputs=("hidden",)),
    ):
        assert other["export"] != base["export"] and other["model"] == base["model"]


def test_a_shards_key_is_the_whole_model_and_its_tag() -> None:
    """A tensor- or pipeline-parallel build keys each shard's export on the source model and the shard's tag: the
    same shard of the same split is one entry, every other shard, kind, degree or split another."""
    model = tiny_llama()
    spec = decoder_spec(model, MAX_SEQ, MAX_BATCH)
    rank = {"kind": "tensor_parallel", "degree": 2, "index": 0, "split": {"sequence_parallel": False}}
    base = key_components(model, spec, "masked", DECODE_FILE, rank)
    assert key_components(tiny_llama(), spec, "masked", DECODE_FILE, dict(rank)) == base
    assert base["export"] != key_components(model, spec, "masked", DECODE_FILE)["export"]  # not the unsharded one
    others = [
        {**rank, "index": 1},
        {**rank, "degree": 4},
        {**rank, "kind": "pipeline_parallel"},
        {**rank, "split": {"sequence_parallel": True}},
    ]
    keys = {key_components(model, spec, "masked", DECODE_FILE, other)["export"] for other in others}
    assert len(keys) == len(others) and base["export"] not in keys


def test_two_builds_wanting_one_graph_at_once_export_it_once(tmp_path: Path) -> None:
    """Two builds of one model into one cache at the same time (two targets, two workers): the second waits on the
    entry's lock and reads back what the first stored, instead of exporting the graph again beside it."""
    import threading

    import onnx
    import onnx_ir as ir

    from aotforge.compiler.generative.export_cache import cached_export

    model = tiny_llama()
    spec = decoder_spec(model, MAX_SEQ, MAX_BATCH)
    exported, entered = [], threading.Barrier(2)
    node = onnx.helper.make_node("Identity", ["x"], ["y"])
    value = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1]) for n in ("x", "y")]
    proto = onnx.helper.make_model(onnx.helper.make_graph([node], "g", value[:1], value[1:]))

    def export() -> Any:
        exported.append(threading.get_ident())
        threading.Event().wait(0.5)  # long enough for the other build to ask for the same entry meanwhile
        return ir.from_proto(proto)

    said: dict[int, list[str]] = {0: [], 1: []}
    graphs: dict[int, Any] = {}

    def build(i: int) -> None:
        entered.wait()
        graphs[i] = cached_export(tmp_path, model, spec, "masked", {PREFILL_FILE: export}, said[i].append)

    threads = [threading.Thread(target=build, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(exported) == 1, exported
    assert sorted(any(line.startswith("export cache hit ") for line in said[i]) for i in (0, 1)) == [False, True]
    assert [graphs[i][PREFILL_FILE].graph.node(0).op_type for i in (0, 1)] == ["Identity", "Identity"]
