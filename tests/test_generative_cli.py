"""The CLI over text-generation artifacts: ``aotforge generate``, ``aotforge perplexity`` and ``aotforge compile
--task text-generation`` (``llama_ort``, tests/conftest.py: the tiny Llama built for onnxruntime)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.cli import main
from tests.llm_models import VOCAB, save_tiny_causal_lm, tiny_causal_lm


def test_cli_generate(llama_ort: Any) -> None:
    runner, path = CliRunner(), str(llama_ort.path)
    args = ["generate", path, "--prompt-ids", "1,2,3", "--max-new-tokens", "12"]
    ran = runner.invoke(main, [*args, "--ignore-eos"])
    assert ran.exit_code == 0, ran.output
    tokens = [int(t) for t in ran.output.split()]
    want = aotforge.load(path).generate(np.array([[1, 2, 3]]), 12, ignore_eos=True)[0, 3:].tolist()
    assert tokens == want and all(0 <= t < VOCAB for t in tokens)
    # By default it stops at the model's own end-of-sequence id (the tiny Llama's generation config: 2).
    eos = json.loads((llama_ort.path / "generation_config.json").read_text())["eos_token_id"]
    default = [int(t) for t in runner.invoke(main, args).output.split()]
    assert default == (want[: want.index(eos) + 1] if eos in want else want)
    stopped = runner.invoke(main, [*args, "--eos-token-id", str(want[3])])
    assert [int(t) for t in stopped.output.split()] == want[: want.index(want[3]) + 1]
    too_long = runner.invoke(main, ["generate", path, "--prompt-ids", "1,2,3", "--max-new-tokens", "63"])
    assert too_long.exit_code != 0 and "max_seq_len=64" in too_long.output
    no_text = runner.invoke(main, ["generate", path, "--prompt", "hello"])
    assert no_text.exit_code != 0 and "no tokenizer" in no_text.output


def test_cli_generate_prompt_is_a_chat_turn_where_the_model_has_a_template(chat_artifact: Path) -> None:
    """``--prompt`` on an artifact carrying a chat template: the ids generate() gets are the template's user turn
    (an instruct model answers it); ``--raw-prompt`` feeds the text as it is."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_artifact)
    assert tokenizer.chat_template
    turn = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=True
    )
    raw = tokenizer("hi")["input_ids"]
    assert list(turn["input_ids"]) != list(raw)
    model = aotforge.load(chat_artifact)
    for flags, ids in (([], list(turn["input_ids"])), (["--raw-prompt"], list(raw))):
        ran = CliRunner().invoke(
            main, ["generate", str(chat_artifact), "--prompt", "hi", "--max-new-tokens", "6", "--ignore-eos", *flags]
        )
        assert ran.exit_code == 0, ran.output
        want = model.generate(np.array([ids]), 6, ignore_eos=True)[0, len(ids) :].tolist()
        assert [int(t) for t in ran.output.splitlines()[0].split()] == want, flags


def test_cli_perplexity_equals_torch_on_the_same_windows(llama_ort: Any, tmp_path: Path) -> None:
    """``aotforge perplexity`` (prefill + decode steps, windows batched) == torch's full-sequence forward."""
    from aotforge.core.errors import EXIT_VALIDATION
    from tests.lm_pair import torch_perplexity

    ids = np.random.default_rng(1).integers(0, VOCAB, size=150).tolist()
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    runner, path = CliRunner(), str(llama_ort.path)
    ran = runner.invoke(main, ["perplexity", path, "--ids-file", str(tmp_path / "ids.txt"), "--window", "40", "--json"])
    assert ran.exit_code == 0, ran.output
    got = json.loads(ran.output)
    assert (got["windows"], got["scored_tokens"]) == (4, 3 * 39 + 29)
    want = torch_perplexity(tiny_causal_lm("llama"), ids, window=40)
    assert got["perplexity"] == pytest.approx(want, rel=1e-4)
    gate = ["perplexity", path, "--ids-file", str(tmp_path / "ids.txt"), "--max-perplexity", "1.5"]
    gated = runner.invoke(main, gate)
    assert gated.exit_code == EXIT_VALIDATION and "above --max-perplexity 1.5" in gated.output, gated.output
    too_wide = runner.invoke(main, ["perplexity", path, "--ids-file", str(tmp_path / "ids.txt"), "--window", "66"])
    assert too_wide.exit_code != 0 and "use a window of 2 to 65" in too_wide.output
    no_text = runner.invoke(main, ["perplexity", path, "--text-file", str(tmp_path / "ids.txt")])
    assert no_text.exit_code != 0 and "no tokenizer" in no_text.output


@pytest.mark.slow
def test_cli_compile(tmp_path: Path) -> None:
    model_dir = save_tiny_causal_lm("llama-tied", tmp_path / "tied")
    args = ["compile", str(model_dir), "--task", "text-generation", "--target", "onnxruntime"]
    args += ["--max-seq-len", "48", "--max-batch", "1", "--no-bench", "--out", str(tmp_path / "out")]
    built = CliRunner().invoke(main, args)
    assert built.exit_code == 0, built.output
    path = Path(built.output.strip().splitlines()[-1])
    assert json.loads((path / "manifest.json").read_text())["target"]["info"]["decoder"]["max_seq_len"] == 48
    assert "greedy tokens vs transformers: 100.0% agree" in built.output
