"""``aotforge distill-draft``: a feature draft (``/work/notes/feature_draft_spec.md``) trained on its teacher's own
features is written as the spec's directory, its torch forward is the spec's (a numpy reference here) and the
runtime's reader of the directory steps the same chain, training
raises its held-out chain acceptance on a teacher that learnt real text, and a teacher or options it cannot fit
are refused by name."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from aotforge.compiler.cli import main
from tests.llm_models import ARCHITECTURES, save_tiny_causal_lm
from tests.lm_bytes import byte_tokenizer, encode

#: A run of a few seconds on a tiny teacher: short sequences, a small pool and sub-vocabulary.
FAST = ["--seq-len", "48", "--continuation", "24", "--pool", "24", "--text-windows", "8", "--sub-vocab", "200"]
FAST += ["--batch", "256", "--held-out-tokens", "384", "--max-minutes", "5", "--max-cpu-minutes", "0"]
SPEC_SHAPES = ("embed", "fc", "fc_bias", "norm", "gate", "up", "down", "head", "vocab_ids")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOTFORGE_DISTILL_CACHE", str(tmp_path_factory.getbasetemp() / "distill-cache"))


def teacher_dir(arch: str, directory: Path) -> Path:
    save_tiny_causal_lm(arch, directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def text_teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama trained briefly on the bytes of stdlib sources: greedy continuations with structure to learn
    (a random-weight teacher's are noise)."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = teacher_dir("llama", tmp_path_factory.mktemp("text-teacher"))
    model = AutoModelForCausalLM.from_pretrained(directory).train()
    data = torch.tensor(encode(inspect.getsource(json) + inspect.getsource(inspect)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        starts = torch.randint(0, len(data) - 65, (16,), generator=generator)
        batch = torch.stack([data[s : s + 65] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(directory)
    return directory


def distill_draft(teacher: Path, out: Path, *flags: str) -> dict[str, Any]:
    ran = CliRunner().invoke(main, ["distill-draft", str(teacher), "--out", str(out), *FAST, *flags, "--json"])
    assert ran.exit_code == 0, ran.output
    return json.loads(ran.output[ran.output.index("{\n") :])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_cli_writes_the_specs_directory(arch: str, tmp_path: Path) -> None:
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    teacher = teacher_dir(arch, tmp_path / "teacher")
    report = distill_draft(teacher, tmp_path / "draft", "--max-steps", "3", "--no-train-head")
    config = json.loads((tmp_path / "draft" / "feature_draft.json").read_text())
    weights = load_file(tmp_path / "draft" / "weights.safetensors")
    model = AutoModelForCausalLM.from_pretrained(teacher)
    d, v = model.config.hidden_size, model.config.vocab_size
    assert config["format"] == "aotforge-feature-draft" and config["version"] == 1
    assert (config["hidden_size"], config["vocab_size"], config["sub_vocab"]) == (d, v, 200)
    assert config["intermediate_size"] == 2 * d and config["training"] == report and report["steps"] == 3
    assert config["target"] == {"model_type": arch, "hidden_size": d, "vocab_size": v, "name_or_path": str(teacher)}
    f, n = 2 * d, 200
    shapes = [(v, d), (d, 2 * d), (d,), (d,), (f, d), (f, d), (d, f), (n, d), (n,)]
    assert {k: w.shape for k, w in weights.items()} == dict(zip(SPEC_SHAPES, shapes, strict=True))
    assert weights["vocab_ids"].dtype == np.int64 and all(weights[k].dtype == np.float32 for k in SPEC_SHAPES[:-1])
    embed, head = (m.weight.detach().numpy() for m in (model.get_input_embeddings(), model.get_output_embeddings()))
    assert np.array_equal(weights["embed"], embed) and np.array_equal(weights["head"], head[weights["vocab_ids"]])
    assert len(report["after"]["acceptance"]) == 3 and report["after"]["positions"] > 0
    assert report["sequences"] == {"continued": 24, "text_windows": 8}


def spec_forward(w: dict[str, np.ndarray], eps: float, h: np.ndarray, tok: np.ndarray, k: int) -> list[Any]:
    """The spec's chain of ``k`` draft steps, in numpy: each step's ``y`` and proposal."""

    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    chain = []
    for _ in range(k):
        z = np.concatenate([w["embed"][tok], h], -1) @ w["fc"].T + w["fc_bias"]
        r = z / np.sqrt(np.mean(z**2, -1, keepdims=True) + eps) * w["norm"]
        y = z + (silu(r @ w["gate"].T) * (r @ w["up"].T)) @ w["down"].T
        tok = w["vocab_ids"][np.argmax(y @ w["head"].T, -1)]
        chain.append((y, tok))
        h = y
    return chain


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_torch_forward_is_the_specs(arch: str, tmp_path: Path) -> None:
    import torch
    from safetensors.numpy import load_file

    from aotforge.compiler.training.feature_draft import feature_draft, write_feature_draft
    from aotforge.targets.generative.feature_draft import load_feature_draft
    from tests.llm_models import tiny_causal_lm

    teacher = tiny_causal_lm(arch)
    draft = feature_draft(teacher, np.arange(3, 303, dtype=np.int64), 96, seed=1)
    with torch.no_grad():  # every weight away from its start, so each term of the forward counts
        for name, p in draft.named_parameters():
            if name != "embed":
                p.add_(torch.randn_like(p) * 0.05)
    write_feature_draft(tmp_path / "draft", draft, teacher.config, arch, {})
    weights = load_file(tmp_path / "draft" / "weights.safetensors")
    eps = json.loads((tmp_path / "draft" / "feature_draft.json").read_text())["rms_eps"]
    rng = np.random.default_rng(0)
    h, tok = rng.standard_normal((5, 64)).astype(np.float32), rng.integers(0, 500, 5)
    want = spec_forward(weights, eps, h, tok, 3)
    got_h, got_tok = torch.from_numpy(h), torch.from_numpy(tok)
    with torch.no_grad():
        for y_ref, tok_ref in want:
            got_h = draft.step(got_h, got_tok)
            got_tok = draft.propose(got_h)
            np.testing.assert_allclose(got_h.numpy(), y_ref, rtol=1e-4, atol=1e-5)
            assert np.array_equal(got_tok.numpy(), tok_ref)
    # The runtime's float32 reference (what its int8 step, tests/test_feature_draft.py, is checked against) steps
    # the same chain.
    runtime = load_feature_draft(tmp_path / "draft")
    run_h, run_tok = h, tok
    for y_ref, tok_ref in want:
        run_h, logits = runtime.reference_step(run_h, run_tok)
        run_tok = runtime.weights["vocab_ids"][np.argmax(logits, -1)]
        np.testing.assert_allclose(run_h, y_ref, rtol=1e-4, atol=1e-5)
        assert np.array_equal(run_tok, tok_ref)


def test_training_raises_the_held_out_chain_acceptance(text_teacher: Path, tmp_path: Path) -> None:
    report = distill_draft(text_teacher, tmp_path / "draft", "--max-steps", "150", "--lr", "3e-3")
    before, after = report["before"], report["after"]
    assert after["chain_loss"] < 0.7 * before["chain_loss"]
    assert after["acceptance"][0] > before["acceptance"][0] + 0.1
    assert after["expected_tokens"][2] > before["expected_tokens"][2]


def test_refusals_name_the_fix(tmp_path: Path) -> None:
    import torch

    from aotforge.compiler.training.feature_draft import feature_draft
    from aotforge.compiler.training.feature_job import check_features
    from aotforge.core.errors import InputSpecError
    from tests.llm_models import tiny_causal_lm

    teacher = teacher_dir("llama", tmp_path / "teacher")
    for flags, message in [
        (["--sub-vocab", "600"], "fewer than 500"),
        (["--chain", "30"], "--chain 30 / --continuation 24: give a chain of 1 to --continuation - 1"),
        (["--schedule", "linear"], "--schedule is one of constant, cosine"),
        (["--pool-share", "0.5", "--data-share", "0.4"], "give 0 < pool share <= data share < 1"),
        (
            ["--max-minutes", "0.0001"],
            "no training step is left; make less of it (a smaller --pool-share or --data-share",
        ),
    ]:
        args = ["distill-draft", str(teacher), "--out", str(tmp_path / "d"), *FAST, *flags]
        ran = CliRunner().invoke(main, args)
        assert ran.exit_code != 0 and message in ran.output, ran.output
        assert not (tmp_path / "d").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    ran = CliRunner().invoke(main, ["distill-draft", str(teacher), "--out", str(tmp_path / "full"), *FAST])
    assert ran.exit_code != 0 and "is not empty: give a new directory" in ran.output
    model = tiny_causal_lm("llama")
    with pytest.raises(InputSpecError, match="does not fit the teacher's vocabulary of 500"):
        feature_draft(model, np.arange(490, 510), 0)
    check_features(model)
    model.config.model_type = "gemma"
    with pytest.raises(InputSpecError, match="known for llama, qwen2, gpt2, not 'gemma'"):
        check_features(model)
    biased = tiny_causal_lm("gpt2")
    biased.lm_head = torch.nn.Linear(64, 500, bias=True)
    with pytest.raises(InputSpecError, match="LM head has a bias"):
        feature_draft(biased, np.arange(10), 0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_pools_features_are_a_prefills_of_its_continuations(arch: str) -> None:
    """The features kept from the pass that continues the pool equal the teacher's prefill over the continued
    sequences (what the training read before, at one more teacher pass)."""
    from aotforge.compiler.training.teacher import Teacher
    from aotforge.compiler.training.teacher_data import teacher_sequences
    from aotforge.compiler.training.teacher_features import continued_features, teacher_features
    from tests.llm_models import tiny_causal_lm

    model = tiny_causal_lm(arch)
    teacher = Teacher(model, np.arange(3, 303, dtype=np.int64), None)
    prompts = np.random.default_rng(0).integers(0, model.config.vocab_size, (5, 7))
    kept = continued_features(teacher, prompts, 6, 4)
    plain = teacher_sequences(teacher, prompts, 6, 4)
    prefill = teacher_features(teacher, plain.ids, 4)
    assert np.array_equal(kept.ids, plain.ids) and kept.hidden.shape == prefill.hidden.shape
    np.testing.assert_allclose(kept.hidden.astype(np.float32), prefill.hidden.astype(np.float32), atol=2e-3)
    assert np.array_equal(kept.greedy, prefill.greedy) and np.array_equal(kept.top_ids, prefill.top_ids)
    assert np.array_equal(kept.greedy[:, 6:-1], kept.ids[:, 7:])  # the continuation is the teacher's greedy path
    assert continued_features(teacher, prompts, 6, 4).cached


def test_the_teachers_data_stops_at_its_share_and_a_later_run_reads_back_what_it_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Data made a chunk at a time stops at the first chunk ``enough`` is told of; a run without the bound reads
    that chunk back, makes the rest, and counts both costs; a third run reads every chunk and makes nothing."""
    from aotforge.compiler.training import teacher_features as made_in_chunks
    from aotforge.compiler.training.teacher import Teacher
    from tests.llm_models import tiny_causal_lm

    monkeypatch.setattr(made_in_chunks, "CHUNK", 2)
    model = tiny_causal_lm("qwen2")
    teacher = Teacher(model, np.arange(3, 303, dtype=np.int64), None)
    prompts = np.random.default_rng(1).integers(0, model.config.vocab_size, (5, 7))
    told: list[tuple[float, float]] = []
    first = made_in_chunks.continued_features(teacher, prompts, 6, 4, lambda *cost: told.append(cost) or True)
    assert len(first.ids) == 2 and not first.cached and told == [(first.seconds, first.cpu_seconds)]
    whole = made_in_chunks.continued_features(teacher, prompts, 6, 4)
    assert len(whole.ids) == 5 and not whole.cached and whole.cpu_seconds > first.cpu_seconds
    assert np.array_equal(whole.ids[:2], first.ids) and np.array_equal(whole.hidden[:2], first.hidden)
    again = made_in_chunks.continued_features(teacher, prompts, 6, 4)
    assert again.cached and again.cpu_seconds == whole.cpu_seconds and np.array_equal(again.ids, whole.ids)
    text = made_in_chunks.teacher_features(teacher, whole.ids, 4, lambda seconds, cpu: cpu >= 0)
    assert np.array_equal(text.ids, whole.ids[:2]) and np.array_equal(text.greedy[:, 6:-1], whole.ids[:2, 7:])


def test_distill_draft_stops_its_data_at_its_shares_of_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool stops at the first chunk past ``--pool-share``, the text windows at ``--data-share`` (none when the
    pool already reached it), whatever ``--pool`` and ``--text-windows`` allow."""
    from aotforge.compiler.training import teacher_features as made_in_chunks

    monkeypatch.setattr(made_in_chunks, "CHUNK", 8)
    teacher = teacher_dir("gpt2", tmp_path / "teacher")
    for shares, want in [
        (("1e-6", "2e-6"), {"continued": 8, "text_windows": 0}),
        (("1e-6", "0.5"), {"continued": 8, "text_windows": 8}),
        (("0.5", "0.6"), {"continued": 24, "text_windows": 8}),
    ]:
        flags = ["--pool-share", shares[0], "--data-share", shares[1], "--max-steps", "1"]
        report = distill_draft(teacher, tmp_path / f"draft-{shares[1]}", *flags)
        assert report["sequences"] == want and report["steps"] == 1


def test_the_logit_losses_read_the_first_logit_batch_positions() -> None:
    """``--logit-batch N``: the response loss of a step is that of its first N positions alone (0: of all)."""
    import dataclasses

    import torch

    from aotforge.compiler.training.feature_distill import Positions, chain_loss
    from aotforge.compiler.training.feature_draft import feature_draft
    from aotforge.compiler.training.options import FeatureDraftOptions
    from aotforge.compiler.training.teacher_features import TeacherFeatures
    from aotforge.targets.generative.draft_vocab import DraftVocab
    from tests.llm_models import tiny_causal_lm

    model = tiny_causal_lm("llama")
    ids = np.arange(3, 303, dtype=np.int64)
    draft = feature_draft(model, ids, 96, seed=1)
    rng = np.random.default_rng(0)
    n, length, d = 6, 12, int(model.config.hidden_size)
    made = TeacherFeatures(
        rng.integers(0, 300, (n, length)),
        rng.standard_normal((n, length, d)).astype(np.float16),
        rng.integers(0, 300, (n, length)),
        rng.integers(0, 300, (n, length, 4)).astype(np.int32),
        rng.standard_normal((n, length, 4)).astype(np.float16),
        0.0,
        0.0,
        False,
    )
    data, vocab = Positions.of(made), DraftVocab(ids, 0)
    table = torch.from_numpy(vocab.to_draft(int(model.config.vocab_size)))
    rows, starts = torch.tensor([0, 3, 5, 1, 2]), torch.tensor([0, 4, 2, 7, 1])
    options = dataclasses.replace(FeatureDraftOptions(), feature_weight=0.0, chain=3)
    with torch.no_grad():
        every = chain_loss(draft, data, rows, starts, table, vocab, options)
        assert torch.allclose(every, chain_loss(draft, data, rows, starts, table, vocab, options, len(rows)))
        first = chain_loss(draft, data, rows, starts, table, vocab, options, 2)
        assert torch.allclose(first, chain_loss(draft, data, rows[:2], starts[:2], table, vocab, options))
        assert not torch.allclose(first, every)
