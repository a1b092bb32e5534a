"""What the tensorrt and neuron text-generation bundle tests share: the CLI compile, --out checks, device builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.cli import main
from aotforge.targets import get_target
from tests.conftest import tree_state
from tests.llm_models import (
    MAX_SEQ,
    NEW,
    PROMPTS,
    tiny_causal_lm,
    transformers_greedy,
)
from tests.llm_models import assert_generates_like_transformers as _token_exact


def compile_cli(model_dir: Path, out: Path, target: str, *extra: str) -> Any:
    """`aotforge compile MODEL_DIR --task text-generation -t TARGET` at MAX_SEQ x 2, through click's runner."""
    args = ["compile", str(model_dir), "--task", "text-generation", "-t", target, "--max-seq-len", str(MAX_SEQ)]
    return CliRunner().invoke(main, [*args, "--max-batch", "2", "--out", str(out), *extra])


def kept_out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("an earlier build's")
    return out


def finish_unchanged(bundle: Path, out: Path, *extra: str) -> Any:
    """``aotforge finish``; the bundle and --out must be as they were afterwards (listing and bytes)."""
    before = (tree_state(bundle), tree_state(out))
    result = CliRunner().invoke(main, ["finish", str(bundle), "--out", str(out), "--no-bench", *extra])
    assert (tree_state(bundle), tree_state(out)) == before, result.output
    return result


def device_build(target: str, llama_dir: Path, out: Path) -> None:
    probe = get_target(target).probe()
    if not probe.available:
        pytest.skip(probe.reason)
    result = aotforge.build(
        str(llama_dir), target=target, task="text-generation", out=out, max_seq_len=MAX_SEQ, max_batch=2, bench=True
    )
    m = result.manifest
    assert m.validation["passed"] and m.validation["token_agreement"] == 1.0
    generation = m.benchmark["generation"]
    assert generation["itl_ms"]["p50"] > 0 and generation["tokens_per_s"]["2"] > 0
    loaded = aotforge.load(result.path)
    _token_exact(loaded, tiny_causal_lm("llama"))
    streamed = np.stack(list(loaded.stream(np.array([PROMPTS[0]]), NEW, ignore_eos=True)), axis=1)
    assert streamed[0].tolist() == transformers_greedy(tiny_causal_lm("llama"), PROMPTS[0], NEW)
