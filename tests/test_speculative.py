"""Speculative decoding: a draft artifact proposes, the target's verify graph checks (both CPU targets).

The tiny random Llama of ``llm_models`` (initializer_range 0.2, so greedy tokens vary) is the target,
built with ``--speculative-k 4`` (the session's ``llama_ort`` / ``llama_tvm``); the same artifact loaded a
second time is a perfect draft, and an unrelated random Llama (other seed, 1 layer, narrower) a bad one:
greedy speculative output must be the target's own greedy output token for token with either.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.artifacts.loader import LoadedArtifact
from aotforge.compiler.cli import main
from aotforge.core.errors import DraftMismatchError, InputSpecError
from aotforge.targets.generative.acceptance import accept_sampled
from aotforge.targets.generative.sampling import Sampler, SamplingOptions
from tests.llm_models import PROMPTS, VOCAB, left_padded
from tests.llm_models import SPECULATIVE_K as K

NEW = 24


@pytest.fixture
def bad_draft(llama_draft: Path) -> Path:
    """An unrelated random Llama over the same vocabulary (the session's ``llama_draft``)."""
    return llama_draft


@pytest.fixture(params=["onnxruntime", "tvm"])
def target(request: pytest.FixtureRequest) -> Path:
    """The session's tiny Llama artifact for the target (``llama_ort`` / ``llama_tvm``: built with a verify graph)."""
    result = request.getfixturevalue({"onnxruntime": "llama_ort", "tvm": "llama_tvm"}[request.param])
    assert result.manifest.target.info["speculative"] == {"max_tokens": K, "verify_width": K + 1}
    assert "verify.onnx" in result.manifest.files
    return Path(result.path)


def test_greedy_speculative_is_the_targets_greedy(target: Path, bad_draft: Path) -> None:
    """Batch 2 of different prompt lengths: perfect draft (every k), bad draft, token for token."""
    artifact, twin = aotforge.load(target), aotforge.load(target)
    ids, mask = left_padded()
    plain = artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True)
    assert len(set(plain[0, ids.shape[1] :].tolist())) > 3
    for k in (1, 2, K):
        out = artifact.generate(ids, NEW, attention_mask=mask, draft=twin, num_speculative_tokens=k, ignore_eos=True)
        np.testing.assert_array_equal(out, plain)
        stats = artifact.speculative_stats
        assert stats["acceptance_rate"] == 1.0 and stats["rounds"] < NEW / k + 2, stats
    out = artifact.generate(ids, NEW, attention_mask=mask, draft=bad_draft, num_speculative_tokens=3, ignore_eos=True)
    np.testing.assert_array_equal(out, plain)
    assert artifact.speculative_stats["acceptance_rate"] < 0.3
    # One prompt alone (the batch-1 path, a loaded draft passed as a path string).
    alone = artifact.generate(np.array([PROMPTS[1]]), NEW, draft=str(bad_draft), ignore_eos=True)
    np.testing.assert_array_equal(alone, artifact.generate(np.array([PROMPTS[1]]), NEW, ignore_eos=True))
    # A draft with a verify graph of its own (the twin) catches up inside its first proposal call: no decode
    # call of dk alone after each round that kept all k, so one draft call per proposal.
    artifact.generate(np.array([PROMPTS[1]]), NEW, draft=twin, num_speculative_tokens=2, ignore_eos=True)
    stats = artifact.speculative_stats
    assert stats["draft_calls"] == stats["proposed"] and stats["acceptance_rate"] == 1.0, stats


def test_stops_at_eos_max_new_tokens_and_the_end_of_the_cache(target: Path, bad_draft: Path) -> None:
    artifact, twin = aotforge.load(target), aotforge.load(target)
    ids, mask = left_padded()
    free = artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True)
    eos = int(free[0, ids.shape[1] + 5])
    for draft in (twin, bad_draft):
        for new in (1, 2, 7):
            got = artifact.generate(ids, new, attention_mask=mask, draft=draft, ignore_eos=True)
            np.testing.assert_array_equal(got, free[:, : ids.shape[1] + new])
        want = artifact.generate(ids, NEW, attention_mask=mask, eos_token_id=eos)
        got = artifact.generate(ids, NEW, attention_mask=mask, eos_token_id=eos, draft=draft)
        np.testing.assert_array_equal(got, want)
        steps = list(artifact.stream(ids, NEW, attention_mask=mask, eos_token_id=eos, draft=draft))
        np.testing.assert_array_equal(np.stack(steps, axis=1), want[:, ids.shape[1] :])
    # Up to the last cache position: 56 + 9 new tokens write all 64 (the last rounds go plain).
    prompt = np.arange(3, 59)[None, :]
    np.testing.assert_array_equal(
        artifact.generate(prompt, 9, draft=twin, ignore_eos=True), artifact.generate(prompt, 9, ignore_eos=True)
    )
    with pytest.raises(InputSpecError, match="max_seq_len=64"):
        artifact.generate(prompt, 10, draft=twin)


def test_seeded_sampled_speculation_repeats(target: Path, bad_draft: Path) -> None:
    artifact, twin = aotforge.load(target), aotforge.load(target)
    ids, mask = left_padded()
    kw = {"attention_mask": mask, "do_sample": True, "top_k": 50, "temperature": 1.3}
    a = artifact.generate(ids, NEW, seed=7, draft=bad_draft, ignore_eos=True, **kw)
    np.testing.assert_array_equal(a, artifact.generate(ids, NEW, seed=7, draft=bad_draft, ignore_eos=True, **kw))
    assert not np.array_equal(a, artifact.generate(ids, NEW, seed=8, draft=bad_draft, ignore_eos=True, **kw))
    # A draft with the target's own distribution is always accepted.
    artifact.generate(ids, NEW, seed=7, draft=twin, ignore_eos=True, **kw)
    assert artifact.speculative_stats["acceptance_rate"] == 1.0
    # top_k=1 sampling is greedy, speculative or not.
    top1 = artifact.generate(
        ids, NEW, attention_mask=mask, do_sample=True, top_k=1, seed=3, draft=bad_draft, ignore_eos=True
    )
    np.testing.assert_array_equal(top1, artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True))


def test_rejection_rule_samples_the_targets_distribution() -> None:
    """One proposal from q, the rule's output token: distributed as p (the standard result), not as q."""
    rng = np.random.default_rng(0)
    p_logits, q_logits = rng.normal(size=(2, 6)), rng.normal(size=6) * 2
    sample = Sampler(SamplingOptions(do_sample=True, seed=1))
    p, q = sample.distribution(p_logits[0]), sample.distribution(q_logits)
    counts = np.zeros(6)
    for _ in range(20000):
        d = sample.draw(q)
        kept, extra = accept_sampled([d], p_logits, [q], sample)
        counts[d if kept else extra] += 1
    np.testing.assert_allclose(counts / counts.sum(), p, atol=0.015)


def test_refusals(target: Path, bad_draft: Path) -> None:
    artifact, draft = aotforge.load(target), aotforge.load(bad_draft)
    ids = np.array([PROMPTS[0]])
    other_vocab = dataclasses.replace(
        draft.manifest,
        target=dataclasses.replace(
            draft.manifest.target, info={**draft.manifest.target.info, "decoder": {"vocab": VOCAB + 8}}
        ),
    )
    with pytest.raises(DraftMismatchError, match=f"vocabulary of {VOCAB + 8} tokens.*has {VOCAB}"):
        artifact.generate(ids, 4, draft=LoadedArtifact(draft.path, other_vocab, draft._runner))
    other_tokenizer = dataclasses.replace(draft.manifest, files={**draft.manifest.files, "tokenizer.json": "0" * 64})
    with pytest.raises(DraftMismatchError, match=r"tokenizer file\(s\) tokenizer.json"):
        artifact.generate(ids, 4, draft=LoadedArtifact(draft.path, other_tokenizer, draft._runner))
    with pytest.raises(InputSpecError, match="no verify graph.*--speculative-k"):
        draft.generate(ids, 4, draft=artifact)
    with pytest.raises(InputSpecError, match=f"num_speculative_tokens must be in 1..{K}"):
        artifact.generate(ids, 4, draft=draft, num_speculative_tokens=K + 1)


def test_cli_generate_with_a_draft(llama_ort: Any) -> None:
    """The CLI is one path for every target (it calls ``generate``), so it runs once, on onnxruntime."""
    target = Path(llama_ort.path)
    ids = ",".join(map(str, PROMPTS[0]))
    plain = CliRunner().invoke(main, ["generate", str(target), "--prompt-ids", ids, "--max-new-tokens", "8"])
    assert plain.exit_code == 0, plain.output
    args = ["--draft", str(target), "--num-speculative-tokens", "2", "--stats"]
    spec = CliRunner().invoke(main, ["generate", str(target), "--prompt-ids", ids, "--max-new-tokens", "8", *args])
    assert spec.exit_code == 0, spec.output
    lines = spec.output.splitlines()
    assert lines[0] == plain.output.splitlines()[0]
    assert lines[-1].startswith("speculative: ") and "(100%)" in lines[-1]


@pytest.mark.slow  # trains (or loads) the pair, builds two artifacts and times decoding: minutes
def test_trained_pair_speeds_up_greedy_decoding(tmp_path: Path) -> None:
    """The trained byte-level pair (``tests/lm_pair.py``) on onnxruntime, batch 1, one intra-op thread: the best
    k of 2..4 decodes held-out text faster than the target alone (target-only and speculative alternate)."""
    import time

    from tests import lm_pair

    pair = lm_pair.trained_pair()
    kw: dict[str, Any] = {
        "target": "onnxruntime",
        "task": "text-generation",
        "bench": False,
        "max_seq_len": 256,
        "max_batch": 1,
        "target_options": {"intra_op_threads": 1},
    }
    target = aotforge.load(aotforge.build(pair.target_dir, out=tmp_path, name="t", speculative_k=4, **kw).path)
    draft = aotforge.load(aotforge.build(pair.draft_dir, out=tmp_path, name="d", **kw).path)
    text = pair.heldout_text
    prompts = [np.array([lm_pair.encode(text[i : i + 64])]) for i in range(0, len(text), len(text) // 4)][:4]

    def tokens_per_s(**spec: Any) -> float:
        start = time.perf_counter()
        for prompt in prompts:
            target.generate(prompt, 96, ignore_eos=True, **spec)
        return 4 * 96 / (time.perf_counter() - start)

    plain = [prompt_out[0].tolist() for prompt_out in (target.generate(p, 96, ignore_eos=True) for p in prompts)]
    best: tuple[float, int, float] = (0.0, 0, 0.0)
    for k in (2, 3, 4):
        for prompt, want in zip(prompts, plain, strict=True):
            assert (
                target.generate(prompt, 96, draft=draft, num_speculative_tokens=k, ignore_eos=True)[0].tolist() == want
            )
        ratios = []
        for _ in range(3):
            base = tokens_per_s()
            ratios.append(tokens_per_s(draft=draft, num_speculative_tokens=k) / base)
        speed_up = float(np.median(ratios))
        if speed_up > best[0]:
            best = (speed_up, k, target.speculative_stats["acceptance_rate"])
    print(f"trained pair, onnxruntime: best k={best[1]}: {best[0]:.2f}x, acceptance {best[2]:.0%}")
    assert best[0] > SPEED_UP_GOAL, best


#: A draft is worth passing only if decoding with it is faster than without: the bound is break-even, on the
#: median of alternating rounds (a shared host's load moves both sides alike). Whether the pair can reach issue
#: 14's 1.5x is a property of its acceptance rate and sizes, checked without a clock in tests/test_lm_pair.py.
SPEED_UP_GOAL = 1.0
