"""``aotforge distill``: a student trained on a teacher's outputs comes closer to it on text it never trained on,
is written as a transformers directory with the teacher's tokenizer, and compiles into a draft that speculative
decoding uses token-exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.cli import main
from aotforge.compiler.training.students import layer_map, student_from_layers
from tests.llm_models import SPECULATIVE_K, build_text_generation, tiny_causal_lm
from tests.serving import chat_llama_dir

FAST = ["--max-steps", "40", "--seq-len", "64", "--batch", "4", "--held-out-tokens", "256", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama of ``llama_ort`` (same seed and config) with the byte tokenizer."""
    return chat_llama_dir(tmp_path_factory.mktemp("teacher") / "llama")


#: The students the tests read, each distilled once for the module: name -> the flags after ``FAST``. ``plain`` and
#: ``features`` differ in the feature loss alone; ``sequence`` learns from the teacher's continuations over the
#: 300 most frequent tokens.
STUDENTS = {
    "plain": ["--feature-weight", "0"],
    "features": ["--feature-weight", "1"],
    "sequence": ["--continuation", "16", "--draft-vocab", "300", "--pool", "16"],
}


@pytest.fixture(scope="module")
def students(teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, dict[str, Any]]]:
    """``name -> (student directory, distill report)`` of ``STUDENTS``, through the CLI, each on a pool cache of
    its own (so a pool is made, not read back)."""
    made: dict[str, tuple[Path, dict[str, Any]]] = {}

    def get(name: str) -> tuple[Path, dict[str, Any]]:
        if name not in made:
            root = tmp_path_factory.mktemp(f"student-{name}")
            out = root / "student"
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("AOTFORGE_DISTILL_CACHE", str(root / "cache"))
                args = ["distill", str(teacher), "--student-layers", "1", "--out", str(out), *FAST, *STUDENTS[name]]
                ran = CliRunner().invoke(main, [*args, "--json"])
            assert ran.exit_code == 0, ran.output
            made[name] = out, json.loads(ran.output[ran.output.index("{") :])
        return made[name]

    return get


@pytest.mark.parametrize("student", ["plain", "features"])
def test_distilled_student_comes_closer_to_the_teacher_on_held_out_text(
    teacher: Path, students: Callable[[str], tuple[Path, dict[str, Any]]], student: str
) -> None:
    out, report = students(student)
    assert report["steps"] == 40 and report["text"]["held_out_tokens"] == 256
    assert report["options"]["feature_weight"] == float(STUDENTS[student][1])
    assert report["after"]["kl_teacher_student"] < report["before"]["kl_teacher_student"]
    assert json.loads((out / "distill_report.json").read_text()) == report
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == 500
    assert (
        AutoTokenizer.from_pretrained(out)("ab")["input_ids"]
        == AutoTokenizer.from_pretrained(teacher)("ab")["input_ids"]
    )


def test_a_layer_cut_student_starts_from_the_teachers_weights() -> None:
    teacher = tiny_causal_lm("llama")
    student = student_from_layers(teacher, 1)
    assert layer_map(1, 2) == [1] and layer_map(3, 30) == [0, 14, 29] and layer_map(2, 30, "first") == [0, 1]
    t, s = teacher.state_dict(), student.state_dict()
    assert all(np.array_equal(s[k].numpy(), t[k].numpy()) for k in s if ".layers." not in k)
    assert np.array_equal(s["model.layers.0.mlp.up_proj.weight"], t["model.layers.1.mlp.up_proj.weight"])


def test_refusals_name_the_fix(teacher: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(main, ["distill", str(teacher), "--out", str(tmp_path / "a")])
    assert both.exit_code == 2 and "--student-layers" in both.output
    too_many = runner.invoke(main, ["distill", str(teacher), "--student-layers", "2", "--out", str(tmp_path / "b")])
    assert too_many.exit_code == 2 and "give 1 to 1" in too_many.output
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("x")
    taken = runner.invoke(main, ["distill", str(teacher), "--student-layers", "1", "--out", str(tmp_path / "c")])
    assert taken.exit_code == 2 and "not empty" in taken.output
    # A teacher's pool that takes the whole budget would leave an untrained student: refused, nothing written.
    args = ["distill", str(teacher), "--student-layers", "1", "--out", str(tmp_path / "d"), *FAST]
    starved = runner.invoke(main, [*args, "--continuation", "16", "--pool", "8", "--max-minutes", "0.0001"])
    assert starved.exit_code == 2 and "no training step is left" in starved.output, starved.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "d").exists()


@pytest.fixture(scope="module")
def target(teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The teacher with a verify graph (speculative decoding) for onnxruntime, built once for the module: the
    session's ``llama_ort`` has the same weights but no tokenizer, which a draft must share."""
    root = tmp_path_factory.mktemp("target")
    return Path(build_text_generation(teacher, root, name="target", speculative_k=SPECULATIVE_K).path)


@pytest.mark.parametrize(("student", "draft_vocab"), [("plain", None), ("sequence", 300)])
def test_the_student_compiles_into_a_draft_speculative_decoding_uses(
    students: Callable[[str], tuple[Path, dict[str, Any]]],
    target: Path,
    tmp_path: Path,
    student: str,
    draft_vocab: int | None,
) -> None:
    """Greedy speculative decoding with the distilled draft is token-identical to the target's plain greedy, the
    draft over the teacher's whole vocabulary or over its most frequent tokens (``--draft-vocab``)."""
    out, _ = students(student)
    if draft_vocab:
        vocab = json.loads((out / "draft_vocab.json").read_text())
        assert json.loads((out / "config.json").read_text())["vocab_size"] == len(vocab["ids"]) == draft_vocab
        assert len(set(vocab["ids"])) == draft_vocab and max(vocab["ids"]) < 500
    draft = build_text_generation(out, tmp_path / "art", name="draft")
    loaded = aotforge.load(target)
    ids = np.array([[5, 17, 42, 99, 3]])
    plain = loaded.generate(ids, 16, ignore_eos=True)
    assert np.array_equal(loaded.generate(ids, 16, draft=aotforge.load(draft.path), ignore_eos=True), plain)
    assert loaded.speculative_stats["proposed"] > 0


@pytest.mark.parametrize("arch", ["llama", "llama-tied", "gpt2"])
def test_a_reduced_vocabulary_keeps_the_kept_tokens_logits(arch: str) -> None:
    """``restrict_vocab`` cuts the embedding and head to the frequent tokens: on text of kept tokens the cut model's
    logits are the full model's at those tokens; the subset is the most frequent tokens, special ones first."""
    import torch

    from aotforge.compiler.training.sub_vocab import frequent_vocab, restrict_vocab

    model = tiny_causal_lm(arch)
    full = int(model.config.vocab_size)
    train = np.array([7] * 5 + [3] * 4 + [11] * 3 + [20, 21, 22, 23, 24, 25], dtype=np.int64)
    vocab = frequent_vocab(train, 8, full, keep=[0])
    assert vocab.ids.tolist()[:4] == [0, 7, 3, 11] and vocab.unknown == 7
    assert vocab.to_draft(full)[[0, 7, 3, 11, 499]].tolist() == [0, 1, 2, 3, 7]
    cut = restrict_vocab(model, vocab).eval()
    assert cut.config.vocab_size == 8
    ids = torch.tensor([[7, 3, 11, 20, 0]])
    with torch.no_grad():
        want = model(input_ids=ids).logits[..., torch.from_numpy(vocab.ids)]
        got = cut(input_ids=torch.from_numpy(vocab.to_draft(full))[ids]).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_teachers_continuation_is_its_greedy_output_with_its_logits(arch: str) -> None:
    """Sequence-level distillation's text (``--continuation``): the prompt, then the teacher's own greedy tokens, and
    its logits at every position of that sequence, over the student's tokens only: what one forward pass of the
    whole sequence gives, restricted to them."""
    import torch

    from aotforge.compiler.training.teacher import Teacher
    from tests.llm_models import transformers_greedy

    model = tiny_causal_lm(arch)
    keep = np.arange(0, 500, 3, dtype=np.int64)
    prompts = torch.tensor([[5, 17, 42, 99, 3], [7, 8, 9, 10, 11]])
    ids, logits = Teacher(model, keep, None).continue_greedy(prompts, 6)
    assert ids.shape == (2, 11) and logits.shape == (2, 11, len(keep))
    for row, prompt in enumerate(prompts.tolist()):
        assert ids[row].tolist() == prompt + transformers_greedy(model, prompt, 6)
    with torch.no_grad():
        want = model(input_ids=ids).logits[..., torch.from_numpy(keep)]
    np.testing.assert_allclose(logits.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_the_teachers_pool_is_made_once_and_its_cost_counted_when_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequence-level distillation's pool: each prompt continued by the teacher's greedy tokens, its top-k logits over
    the student's tokens at every position; a second run with the same inputs reads it back with what it cost."""
    import torch

    from aotforge.compiler.training.teacher import Teacher
    from aotforge.compiler.training.teacher_data import teacher_sequences

    monkeypatch.setenv("AOTFORGE_DISTILL_CACHE", str(tmp_path))
    model = tiny_causal_lm("llama")
    keep = np.arange(0, 500, 2, dtype=np.int64)
    prompts = np.array([[5, 17, 42, 99], [7, 8, 9, 10], [1, 2, 3, 4]])
    made = teacher_sequences(Teacher(model, keep, None), prompts, 5, 4)
    read = teacher_sequences(Teacher(model, keep, None), prompts, 5, 4)
    assert not made.cached and read.cached and read.cpu_seconds == made.cpu_seconds > 0
    assert np.array_equal(read.ids, made.ids) and np.array_equal(read.top_ids, made.top_ids)
    ids, logits = Teacher(model, keep, None).continue_greedy(torch.from_numpy(prompts), 5)
    assert np.array_equal(made.ids, ids.numpy()) and made.top_ids.shape == (3, 9, 4)
    want = logits.topk(4, dim=-1)
    assert np.array_equal(made.top_ids, want.indices.numpy())
    np.testing.assert_allclose(made.top_logits.astype(np.float32), want.values.numpy(), rtol=1e-2, atol=1e-2)
    assert not teacher_sequences(Teacher(model, keep[:-1], None), prompts, 5, 4).cached  # another student vocabulary


def test_sequence_level_distillation_brings_the_student_closer(
    teacher: Path, students: Callable[[str], tuple[Path, dict[str, Any]]], tmp_path: Path
) -> None:
    _, report = students("sequence")
    assert report["options"]["continuation"] == 16 and report["steps"] == 40
    assert report["pool_cpu_seconds"] > 0 and not report["pool_cached"] and report["distinct_tokens"] == 16 * 64
    assert report["after"]["kl_teacher_student"] < report["before"]["kl_teacher_student"]
    assert report["after"]["continuation_agreement"] > report["before"]["continuation_agreement"]
    args = ["distill", str(teacher), "--student-layers", "1", *FAST, "--continuation", "64"]
    refused = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert refused.exit_code == 2 and "--continuation 64: give 0 to 63" in refused.output
    assert not (tmp_path / "b").exists()


def test_the_sparse_loss_over_every_token_is_the_full_kl() -> None:
    """The pool keeps the teacher's top-k logits: with k the whole vocabulary, its loss is the response-based KL."""
    import torch

    from aotforge.compiler.training.distill import response_loss, sparse_response_loss

    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 12), torch.randn(2, 5, 12)
    values, indices = teacher.topk(12, dim=-1)
    for temperature in (1.0, 2.0):
        want = response_loss(student, teacher, temperature)
        got = sparse_response_loss(student, indices, values, temperature)
        assert torch.allclose(got, want, atol=1e-5)
