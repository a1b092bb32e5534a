"""Feature drafts (issue 31): the target's ``hidden`` output and speculative decoding from it (both CPU targets).

The target is the session's tiny Llama built with ``--speculative-k 4`` (``llama_ort`` / ``llama_tvm``). Drafts
are written here with ``save_feature_draft`` (no trainer): a random one (it almost never agrees), and a bigram one
made from the target's own greedy output (its proposals ignore ``h`` and often agree, so rounds keep tokens and
the hidden state is carried from verify positions past 0). Greedy output must be plain greedy, token for token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import aotforge
from aotforge.compiler.cli import main
from aotforge.core.errors import DraftMismatchError, InputSpecError
from aotforge.targets.generative.feature_draft import FeatureDraft, load_feature_draft, save_feature_draft
from tests.llm_models import PROMPTS, VOCAB, left_padded
from tests.llm_models import SPECULATIVE_K as K

HIDDEN = 64  # the tiny Llama's hidden size
NEW = 20
TARGET = {"model_type": "llama", "hidden_size": HIDDEN, "vocab_size": VOCAB, "name_or_path": "llama-tiny"}


@pytest.fixture(params=["onnxruntime", "tvm"])
def target(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue({"onnxruntime": "llama_ort", "tvm": "llama_tvm"}[request.param]).path)


def _weights(rng: np.random.Generator, d: int = HIDDEN, vocab: int = VOCAB, n: int = 96) -> dict[str, np.ndarray]:
    f = 2 * d
    shapes = {"embed": (vocab, d), "fc": (d, 2 * d), "fc_bias": (d,), "norm": (d,)}
    shapes |= {"gate": (f, d), "up": (f, d), "down": (d, f), "head": (n, d)}
    weights = {name: rng.normal(scale=0.3, size=shape) for name, shape in shapes.items()}
    weights["vocab_ids"] = np.sort(rng.choice(vocab, size=n, replace=False))
    return weights


def random_draft(path: Path, seed: int = 0, **sizes: int) -> Path:
    return save_feature_draft(path, _weights(np.random.default_rng(seed), **sizes), rms_eps=1e-5, target=TARGET)


def bigram_draft(path: Path, sequences: np.ndarray) -> Path:
    """A draft that proposes, after token ``t``, the token that followed ``t`` last in ``sequences``: ``y`` is
    ``t``'s embedding (fc keeps the embedding half, the MLP adds nothing), each head row the sum of the embeddings
    of the tokens it follows (random unit vectors: nearly orthogonal)."""
    rng = np.random.default_rng(1)
    weights = _weights(rng)
    embed = rng.normal(size=(VOCAB, HIDDEN))
    weights["embed"] = embed / np.linalg.norm(embed, axis=1, keepdims=True)
    weights["fc"] = np.concatenate([np.eye(HIDDEN), np.zeros((HIDDEN, HIDDEN))], axis=1)
    weights["fc_bias"], weights["down"] = np.zeros(HIDDEN), np.zeros((HIDDEN, 2 * HIDDEN))
    follows = {int(a): int(b) for row in sequences for a, b in zip(row[:-1], row[1:], strict=True)}
    ids = sorted(set(follows.values()))
    weights["vocab_ids"] = np.array(ids)
    weights["head"] = np.zeros((len(ids), HIDDEN))
    for a, b in follows.items():
        weights["head"][ids.index(b)] += weights["embed"][a]
    return save_feature_draft(path, weights, rms_eps=1e-5, target=TARGET, training={"made_by": "tests"})


def _engine(path: Path) -> Any:
    return aotforge.load(path)._generative().engine


def test_hidden_is_the_lm_head_input(target: Path, llama_dir: Path) -> None:
    """Prefill's ``hidden`` at the last prompt token and verify's at each of its tokens equal transformers' final
    norm output there (the LM head's input), batch 2."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    ids = np.array([PROMPTS[0], PROMPTS[0][::-1]], dtype=np.int64)
    with torch.no_grad():
        want = model.model(torch.from_numpy(ids)).last_hidden_state.numpy()
    engine = _engine(target)
    assert engine.hidden_size == HIDDEN
    engine.start(2, 4)
    engine.prefill(ids[:, :4], np.ones((2, 4), dtype=np.int64), np.tile(np.arange(4), (2, 1)))
    np.testing.assert_allclose(engine.hidden(), want[:, 3], atol=1e-4, rtol=1e-4)
    engine.verify(ids[:, 4:], np.array([4, 4]))
    np.testing.assert_allclose(engine.hidden(), want[:, 4:], atol=1e-4, rtol=1e-4)


def test_the_int8_step_is_the_float32_reference_within_its_rounding(tmp_path: Path) -> None:
    """The step speculative decoding runs (int8 on ONNX Runtime) against the format's float32 reference: each of its
    five matmuls rounds weights and input to 8 bits (at most 2^-7 of an element's block maximum), so ``y`` and the
    logits stay within a few percent, and a proposal differs only where the reference's two best tokens are closer
    than the logits' error."""
    draft = load_feature_draft(random_draft(tmp_path / "random", d=96, n=256))
    rng = np.random.default_rng(2)
    hidden = rng.normal(size=(256, 96)).astype(np.float32)
    tokens = rng.integers(0, VOCAB, 256)
    want_y, want = draft.reference_step(hidden, tokens)
    got_y, got = draft.step(hidden, tokens)
    assert np.linalg.norm(got_y - want_y) < 0.03 * np.linalg.norm(want_y)
    assert np.linalg.norm(got - want) < 0.03 * np.linalg.norm(want)
    top2 = np.sort(want, axis=-1)[:, -2:]
    margin, error = top2[:, 1] - top2[:, 0], np.abs(got - want).max(axis=-1)
    changed = got.argmax(-1) != want.argmax(-1)
    assert not np.any(changed & (margin > 2 * error)), (margin[changed], error[changed])
    assert changed.mean() < 0.1  # most proposals are the reference's


class _Recording(FeatureDraft):
    """The draft, recording the ``(h, token)`` each round starts its chain from (not the steps fed its own ``y``)."""

    def __init__(self, draft: FeatureDraft) -> None:
        super().__init__(draft.weights, draft.config)
        object.__setattr__(self, "starts", [])  # a frozen dataclass: its fields are set once, as here
        object.__setattr__(self, "outputs", [])

    def step(self, hidden: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not any(hidden is y for y in self.outputs):
            self.starts.append((hidden.copy(), tokens.copy()))
        y, logits = super().step(hidden, tokens)
        self.outputs.append(y)
        return y, logits


def test_greedy_with_a_feature_draft_is_plain_greedy(target: Path, llama_dir: Path, tmp_path: Path) -> None:
    """Batch 2 of different prompt lengths, every k, a random and a bigram draft: token for token; with the
    bigram draft, each round starts from the LM-head input at the position whose logits gave its last token."""
    import transformers as tf

    artifact = aotforge.load(target)
    ids, mask = left_padded()
    plain = artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True)
    news = [plain[r, ids.shape[1] :] for r in range(2)]
    bigram = bigram_draft(tmp_path / "bigram", np.stack(news))
    for draft in (random_draft(tmp_path / "random"), bigram):
        for k in (1, 2, K):
            out = artifact.generate(
                ids, NEW, attention_mask=mask, draft=draft, num_speculative_tokens=k, ignore_eos=True
            )
            np.testing.assert_array_equal(out, plain)
    assert artifact.speculative_stats["acceptance_rate"] > 0.3, artifact.speculative_stats  # kept runs of tokens
    recording = _Recording(load_feature_draft(bigram))
    artifact.generate(ids, NEW, attention_mask=mask, draft=recording, ignore_eos=True)
    model = tf.AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    for row, prompt in enumerate(PROMPTS):
        sequence = [*prompt, *news[row].tolist()]
        with torch.no_grad():
            want = model.model(torch.tensor([sequence])).last_hidden_state[0].numpy()
        starts = [(hidden[row], int(tokens[row])) for hidden, tokens in recording.starts]
        for i, (hidden, token) in enumerate(starts):
            close = np.abs(want - hidden).max(axis=1) < 1e-4
            carried = any(q + 1 < len(sequence) and sequence[q + 1] == token for q in np.flatnonzero(close))
            # A row that made its last token stays where it is while the others go on (its proposals unused).
            done = token == sequence[-1] and all(np.array_equal(h, hidden) and t == token for h, t in starts[i:])
            assert carried or done, f"row {row}, round {i}: its chain started from the wrong hidden state"


def test_eos_max_new_tokens_and_sampling(target: Path, tmp_path: Path) -> None:
    artifact, draft = aotforge.load(target), random_draft(tmp_path / "random")
    ids, mask = left_padded()
    free = artifact.generate(ids, NEW, attention_mask=mask, ignore_eos=True)
    for new in (1, 2, 7):
        got = artifact.generate(ids, new, attention_mask=mask, draft=draft, ignore_eos=True)
        np.testing.assert_array_equal(got, free[:, : ids.shape[1] + new])
    eos = int(free[0, ids.shape[1] + 5])
    want = artifact.generate(ids, NEW, attention_mask=mask, eos_token_id=eos)
    np.testing.assert_array_equal(artifact.generate(ids, NEW, attention_mask=mask, eos_token_id=eos, draft=draft), want)
    steps = list(artifact.stream(ids, NEW, attention_mask=mask, eos_token_id=eos, draft=draft))
    np.testing.assert_array_equal(np.stack(steps, axis=1), want[:, ids.shape[1] :])
    # Sampled: q is the draft's softmax over its sub-vocabulary (0 elsewhere); seeded, a call repeats.
    kw = {"attention_mask": mask, "do_sample": True, "top_k": 50, "seed": 7, "draft": draft, "ignore_eos": True}
    np.testing.assert_array_equal(artifact.generate(ids, NEW, **kw), artifact.generate(ids, NEW, **kw))
    # The directory was loaded (and its int8 step built) once for all these calls; a rewritten one is read again.
    loaded = artifact._feature_draft[1]
    random_draft(draft, seed=1)
    artifact.generate(ids, 2, attention_mask=mask, draft=draft, ignore_eos=True)
    reloaded = artifact._feature_draft[1]
    assert reloaded is not loaded and not np.array_equal(reloaded.weights["fc"], loaded.weights["fc"])


def test_refusals(target: Path, llama_draft: Path, tmp_path: Path) -> None:
    artifact, ids = aotforge.load(target), np.array([PROMPTS[0]])
    with pytest.raises(DraftMismatchError, match="hidden size 32 and 500 tokens.*hidden size 64 and 500.*distill"):
        artifact.generate(ids, 4, draft=random_draft(tmp_path / "narrow", d=32))
    with pytest.raises(DraftMismatchError, match="hidden size 64 and 400 tokens"):
        artifact.generate(ids, 4, draft=random_draft(tmp_path / "other-vocab", vocab=400))
    with pytest.raises(InputSpecError, match="no verify graph.*--speculative-k"):
        aotforge.load(llama_draft).generate(ids, 4, draft=random_draft(tmp_path / "random"))
    (tmp_path / "random" / "weights.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InputSpecError, match="not a readable feature draft"):
        load_feature_draft(tmp_path / "random")


def test_cli_generate_with_a_feature_draft(llama_ort: Any, tmp_path: Path) -> None:
    """The CLI is one path for every target (it calls ``stream``), so it runs once, on onnxruntime."""
    target, draft = str(llama_ort.path), random_draft(tmp_path / "random")
    args = ["generate", target, "--prompt-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "8"]
    plain = CliRunner().invoke(main, args)
    assert plain.exit_code == 0, plain.output
    spec = CliRunner().invoke(main, [*args, "--draft", str(draft), "--num-speculative-tokens", "2", "--stats"])
    assert spec.exit_code == 0, spec.output
    assert spec.output.splitlines()[0] == plain.output.splitlines()[0]
    assert spec.output.splitlines()[-1].startswith("speculative: ")
