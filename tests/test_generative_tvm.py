"""Text-generation artifacts on tvm: prefill buckets + static decode in one lib.so, the cache updated in place
(what both CPU targets do alike: tests/test_generative_targets.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import OptionsError
from aotforge.targets.tvm.decoder.buckets import batch_buckets, prompt_buckets
from aotforge.targets.tvm.decoder.model_runner import prefill_head
from tests.llm_models import (
    NEW,
    PROMPTS,
    left_padded,
    tiny_causal_lm,
    transformers_greedy,
)
from tests.llm_models import build_text_generation as _build

# ``llama_tvm`` (tests/conftest.py): the tiny Llama directory built for tvm with BUCKETS, benchmark included.


def test_one_library_over_the_shared_weight_file(llama_tvm: Any) -> None:
    m = llama_tvm.manifest
    assert {"lib.so", "tvm_generative.json", "tvm_weights.data"} <= set(m.files)
    info = m.target.info["generative"]
    assert info["prompt_buckets"] == [16, 64] and info["batch_buckets"] == [1, 2]
    # K+V x layers x batch buckets x (decode + verify: the shared build has --speculative-k)
    assert info["kv_cache"] == {"in_place": 2 * 2 * 2 * 2, "skipped": {}}
    # 7 projections x layers x 10 functions (2 prefill buckets, 2 decode, 2 verify, and the paged copies of the
    # decode and verify functions) read packed panels, in
    # 4 calls a layer (Q/K/V and gate/up merged), over one copy of each weight: 2 x 4 packed tensors; the head
    # too: [vocab, hidden] read transposed in prefill and decode (packed from its transpose), and a
    # [hidden, vocab] copy of its own in the verify graphs (vocab 500 padded to 512 either way)
    panels = info["panel_weights"]
    assert (panels["matmuls_taken"], len(panels["weights_packed"])) == ((7 * 2 + 1) * 10, 2 * 4 + 2), panels
    assert info["paged_kv"] == {
        "functions": ["decode_1", "decode_2", "verify_1", "verify_2"],
        "writes": 16,
        "attentions": 8,
    }
    assert sorted(panels["weights_packed"].values())[-2:] == [[512 // 32, 64, 32]] * 2
    assert panels["lookups_from_panels"] == 0  # the head is not tied: the embedding's lookup reads its own table
    assert info["decode_attention"]["rewritten"] == 2 * 2  # layers x decode functions: over the filled cache only
    assert info["verify_attention"] == {"rewritten": 2 * 2}  # layers x verify functions, the same way
    assert m.target.info["pipeline"]["schedules"]["unscheduled"] == 0
    # The library holds code only: the weights are in tvm_weights.data, read once at load.
    lib = (llama_tvm.path / "lib.so").stat().st_size
    assert lib < info["weights_file"]["bytes"] * 3  # tiny model: code dominates either way
    engine = aotforge.load(llama_tvm.path)._generative().engine
    shared = {id(t) for name in ("prefill_16", "decode_1", "verify_1") for t in engine._weights[name]}
    assert shared == {id(t) for t in engine.weights.values()}, "prefill, decode and verify share one set of tensors"


def test_the_weights_are_stored_and_held_once(llama_tvm: Any) -> None:
    """On disk and at run time, ~1x the model's parameter bytes: the packed panels replace the export's
    weights.data, and the head packed twice (from [vocab, hidden] for prefill / decode, from the exporter's
    [hidden, vocab] for verify) is one copy. The slack: vocab 500 padded to 16 lanes, page alignment."""
    model = tiny_causal_lm("llama")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    sizes = llama_tvm.manifest.file_sizes
    on_disk = sum(size for name, size in sizes.items() if name.endswith(".data"))
    assert "weights.data" not in sizes and 0.95 * params <= on_disk <= 1.02 * params, (on_disk, params)
    assert llama_tvm.manifest.benchmark["generation"]["weight_bytes"] == on_disk  # the model card's figure
    engine = aotforge.load(llama_tvm.path)._generative().engine
    held = {id(t): t.numpy().nbytes for t in engine.weights.values()}
    assert 0.95 * params <= sum(held.values()) <= 1.02 * params, (sum(held.values()), params)


def test_the_manifest_names_the_weight_file_the_artifact_holds(llama_tvm: Any) -> None:
    """The manifest and tvm_generative.json name the file the weights are read from, which the artifact holds
    (the export's weights.data is replaced: its size is kept as exported_bytes, not as the stored file's)."""
    path, m = llama_tvm.path, llama_tvm.manifest
    weights = m.target.info["weights"]
    refs = json.loads((path / "tvm_generative.json").read_text())["weights"].values()
    named = {weights["file"], m.target.info["generative"]["weights_file"]["file"]} | {w["file"] for w in refs}
    assert named == {"tvm_weights.data"}
    assert (path / "tvm_weights.data").is_file() and not (path / "weights.data").exists()
    assert weights["weights_file_bytes"] == m.file_sizes["tvm_weights.data"] != weights["exported_bytes"]


def test_kv_cache_is_not_reallocated_per_token(llama_tvm: Any) -> None:
    """Every decode step returns the very cache tensors the model runner allocated once (``stream`` runs on the
    runtime's engine over it)."""
    artifact = aotforge.load(llama_tvm.path)
    engine = artifact._generative().engine
    decode, written = engine._functions["paged_decode_2"], []

    def recorded(*arguments: Any) -> Any:  # the real function; what it returns is noted
        out = decode(*arguments)
        written.append([t.data_ptr() for t in list(out)[1:]])
        return out

    engine._functions["paged_decode_2"] = recorded
    ids, mask = left_padded()
    steps = artifact.stream(ids, NEW, attention_mask=mask, ignore_eos=True)
    runner = artifact._generative().model_runner(len(ids))  # the one this call runs on
    seen = [([id(t) for t in runner.pool], [t.data_ptr() for t in runner.pool]) for _ in steps]
    engine._functions["paged_decode_2"] = decode
    assert len(runner.pool) == 2 * 2 and runner.pool[0].shape[1::2] == (2, 16)  # [blocks, kv heads, block, dim]
    first_ids, first_buffers = seen[1]
    for ids_now, buffers in seen[1:]:
        assert ids_now == first_ids and buffers == first_buffers, "the cache buffers moved"
    assert len(written) == NEW - 1
    for pointers in written:
        assert pointers == first_buffers, "decode wrote present_* somewhere else than the cache it was given"


def test_batch_one_runs_the_smallest_decode_bucket(llama_tvm: Any) -> None:
    artifact = aotforge.load(llama_tvm.path)
    one = artifact.generate(np.array([PROMPTS[1]]), NEW, ignore_eos=True)
    assert artifact._generative().model_runner(1).decode_rows(1) == 1
    ids, mask = left_padded()
    np.testing.assert_array_equal(
        one[0, 3:], artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True)[1, ids.shape[1] :]
    )


def test_a_prompt_just_past_a_bucket_extends_the_rest_token_exact(llama_tvm: Any) -> None:
    """20 tokens: the 16-token bucket, then 4 through the verify function (not the 64-token bucket); greedy output
    still equal to transformers'."""
    artifact = aotforge.load(llama_tvm.path)
    engine = artifact._generative().engine
    assert (engine.prompt_buckets, engine.verify_width) == ((16, 64), 5)
    assert prefill_head(engine, 20, can_extend=True) == 16
    assert prefill_head(engine, 20, can_extend=False) == 20  # no verify function: the whole bucket
    assert prefill_head(engine, 60, can_extend=True) == 60  # 16 + 9 verify calls would cost more than 64
    prompt = np.random.default_rng(3).integers(0, 500, size=20).tolist()
    got = artifact.generate(np.array([prompt]), NEW, ignore_eos=True)[0, 20:].tolist()
    assert got == transformers_greedy(tiny_causal_lm("llama"), prompt, NEW)


def test_perplexity_equals_torch_on_the_same_windows(llama_tvm: Any) -> None:
    """Scoring through tvm's prefill (a 1-token prompt in the smallest bucket) and decode buckets == torch."""
    from tests.lm_pair import torch_perplexity

    ids = np.random.default_rng(1).integers(0, 500, size=150)
    got = aotforge.load(llama_tvm.path).perplexity(ids, window=40)
    assert (got.windows, got.scored_tokens) == (4, 3 * 39 + 29)
    assert got.perplexity == pytest.approx(torch_perplexity(tiny_causal_lm("llama"), ids.tolist(), 40), rel=1e-4)


def test_buckets() -> None:
    spec = DecoderSpec(layers=2, kv_heads=2, head_dim=16, vocab=500, max_seq_len=200, max_batch=4)
    assert prompt_buckets(spec, {}) == (16, 32, 64, 128, 200)
    assert prompt_buckets(spec, {"prompt": (50, 300)}) == (50, 200)
    assert batch_buckets(spec, {}) == (1, 2, 4)
    assert batch_buckets(DecoderSpec(2, 2, 16, 500, 64, 3), {"batch": (1,)}) == (1, 3)


def test_refuses_options_it_cannot_honour(tmp_path: Path) -> None:
    model = tiny_causal_lm("llama")
    with pytest.raises(OptionsError, match="prompt=a/b/c"):
        _build(model, tmp_path, target="tvm", target_options={"buckets": ("seq=16",)})
    with pytest.raises(OptionsError, match="dynamic"):
        _build(model, tmp_path, target="tvm", target_options={"dynamic": True})


@pytest.mark.parametrize(
    ("m", "k", "n", "few"),
    [(1, 64, 96, "SPLIT"), (4, 96, 32, "SPLIT"), (3, 20, 16, "SPLIT"), (24, 32, 48, "SPLIT"), (12, 8, 80, "SPLIT")]
    + [(4, 96, 96, "WHOLE"), (3, 20, 48, "WHOLE"), (1, 64, 96, "WHOLE")],
)
def test_panel_matmul_kernel_is_exact(m: int, k: int, n: int, few: str) -> None:
    import tvm

    from aotforge.targets.tvm.kernels.panel_matmul import (
        FewRows,
        few_rows,
        pack,
        padded_rows,
        panel_matmul,
        panel_width,
        supports,
        tiles,
    )
    from aotforge.targets.tvm.options import TvmOptions, target_dict

    assert supports(k, n) == "" and supports(k, 20)
    assert (panel_width(96), panel_width(32), panel_width(80)) == (48, 32, 16)
    assert (padded_rows(7), padded_rows(24), padded_rows(13), padded_rows(36)) == (7, 24, 16, 36)
    assert (few_rows("znver4"), few_rows("sapphirerapids")) == (FewRows.WHOLE, FewRows.SPLIT)
    assert (tiles(4, 576, 48, FewRows.SPLIT), tiles(4, 576, 48, FewRows.WHOLE)) == ((2, 4), (4, 1))
    assert tiles(1, 576, 48, FewRows.WHOLE) == (1, 4)
    func = panel_matmul(m, k, n, few=FewRows[few]).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target(target_dict(TvmOptions()))).jit()
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    out = tvm.runtime.tensor(np.zeros((m, n), dtype=np.float32))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(pack(w, panel_width(n))), out)
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("b", "h", "kv", "s", "d", "w", "pos"),
    [
        (2, 4, 2, 32, 16, 1, [3, 20]),  # decode: one query a slot
        (2, 4, 2, 32, 16, 5, [3, 27]),  # verify, grouped heads, slot 1's last query at the cache's last position
        (1, 2, 2, 48, 64, 2, [46]),  # the draft's 2-token verify shape: one KV head a query head
        (2, 8, 1, 20, 32, 3, [0, 17]),  # one KV head for all, a cache length off the 16 lanes
    ],
)
def test_decode_attention_kernel_reads_only_the_filled_cache(
    b: int, h: int, kv: int, s: int, d: int, w: int, pos: list[int]
) -> None:
    """Query i of a slot sees positions <= pos + i, each query head its KV head; what lies past a slot's
    last query is never read."""
    import tvm

    from aotforge.targets.tvm.kernels.decode_attention import decode_attention
    from aotforge.targets.tvm.options import TvmOptions, target_dict

    scale = 0.25
    func = decode_attention(b, h, kv, s, d, scale, w).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target(target_dict(TvmOptions()))).jit()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, h, w, d), dtype=np.float32)
    k, v = (rng.standard_normal((b, kv, s, d), dtype=np.float32) for _ in range(2))
    k[0, :, pos[0] + w :], v[0, :, pos[0] + w :] = np.nan, np.nan  # past slot 0's last query
    out = tvm.runtime.tensor(np.zeros((b, h, w, d), dtype=np.float32))
    lib["main"](*map(tvm.runtime.tensor, (q, k, v, np.array(pos))), out)
    for slot in range(b):
        for head in range(h):
            for i in range(w):
                group, n = head // (h // kv), pos[slot] + i + 1
                scores = k[slot, group, :n] @ q[slot, head, i] * scale
                p = np.exp(scores - scores.max())
                want = (p / p.sum()) @ v[slot, group, :n]
                np.testing.assert_allclose(out.numpy()[slot, head, i], want, rtol=1e-5, atol=1e-5)
