"""Training a feature draft (``feature_draft.py``) on its teacher's own features, on CPU, for a bounded time.

The data (``teacher_features.py``): the teacher's LM-head input ``h`` at every position of its pooled greedy
continuations of training text (``teacher_data.py``; what greedy speculative decoding runs on) and of plain text
windows. A step takes a batch of positions ``p`` and unrolls the chain: step 1 reads ``(h_p, x_{p+1})``, step ``j``
the draft's own previous output and ``x_{p+j}`` (EAGLE-3's training-time test: the draft learns to read its own
predictions, as it does at run time); each step's output is pulled towards ``h_{p+j}`` (smooth-L1, EAGLE's
feature loss) and its logits towards the teacher's there (the KL over its ``top_k`` largest, and optionally the
cross-entropy on its greedy token).

The report scores the chain on held-out greedy continuations of the fp32 teacher: ``acceptance[i]``, the chance
that the draft's ``i``-th proposal is the teacher's greedy token given that every earlier one was, what greedy
speculative decoding accepts; ``expected_tokens[k - 1]``: tokens per round of ``k`` proposals, ``1 + a1 + a1 a2 +
...``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from aotforge.compiler.training.distill import (
    Budget,
    Progress,
    _autocast_dtype,
    _prompts,
    _windows,
    descend,
    learning_rate,
    share,
    sparse_response_loss,
)
from aotforge.compiler.training.feature_draft import FeatureDraft
from aotforge.compiler.training.options import FeatureDraftOptions
from aotforge.compiler.training.teacher import Teacher
from aotforge.compiler.training.teacher_data import teacher_sequences
from aotforge.compiler.training.teacher_features import (
    TeacherFeatures,
    continued_features,
    joined,
    teacher_features,
)
from aotforge.compiler.training.text import TokenStreams
from aotforge.targets.generative.draft_vocab import DraftVocab

#: Steps between the progress lines that give the held-out chain acceptance (a learning curve; cheap beside a step).
SCORE_EVERY = 100
#: Proposals the report's held-out chain simulates (whatever length the training unrolls): what k=3 rounds accept.
SCORED_CHAIN = 3


@dataclasses.dataclass(frozen=True)
class Positions:
    """Training or held-out data as tensors, and which positions ``p`` a chain may start from."""

    ids: torch.Tensor
    hidden: torch.Tensor
    greedy: torch.Tensor
    top_ids: torch.Tensor
    top_logits: torch.Tensor

    @classmethod
    def of(cls, made: TeacherFeatures) -> Positions:
        arrays = (made.ids, made.hidden, made.greedy, made.top_ids, made.top_logits)
        return cls(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))


def train_feature_draft(
    teacher: Any,
    draft: FeatureDraft,
    streams: TokenStreams,
    vocab: DraftVocab,
    options: FeatureDraftOptions,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train ``draft`` (in place) on ``teacher``'s features over ``streams.train``; the run's report."""
    say = progress or (lambda _m: None)
    torch.manual_seed(options.seed)
    rng = np.random.default_rng(options.seed)
    teacher.eval()
    autocast = _autocast_dtype()
    fast = Teacher(teacher, vocab.ids, autocast)
    # The same prompts, drawn first from the same seed, as ``aotforge distill --continuation``'s pool; the features
    # of its sequences are kept from the pass that decodes them, the text windows' come from one prefill.
    prompt = options.seq_len - options.continuation
    prompts = _prompts(streams.train, prompt, options.pool, rng)
    text = _prompts(streams.train, options.seq_len, options.text_windows, rng)

    def reached(part: float, before: float = 0.0, cpu_before: float = 0.0) -> Callable[[float, float], bool]:
        """Whether data that cost ``seconds, cpu_seconds`` (after ``before``'s) reached ``part`` of the budget."""
        return lambda seconds, cpu_seconds: share(options, before + seconds, cpu_before + cpu_seconds) >= part

    pool = continued_features(fast, prompts, options.continuation, options.top_k, reached(options.pool_share))
    windows = None
    if len(text) and not reached(options.data_share)(pool.seconds, pool.cpu_seconds):
        enough = reached(options.data_share, pool.seconds, pool.cpu_seconds)
        windows = teacher_features(fast, text, options.top_k, enough)
    made = pool if windows is None else joined(pool, windows)
    ids = made.ids
    say(
        f"teacher's features of {len(ids)} sequences ({len(pool.ids)} of --pool {options.pool} continued, "
        f"{len(ids) - len(pool.ids)} of --text-windows {options.text_windows}) in {made.cpu_seconds:.0f} CPU s, "
        f"{share(options, made.seconds, made.cpu_seconds):.0%} of the budget"
    )
    held = held_out(teacher, streams, vocab, options, prompt)
    before = score(draft, held, options, vocab, prompt)
    say(f"before: held-out chain acceptance {_rates(before)}")
    data, table = Positions.of(made), torch.from_numpy(vocab.to_draft(int(teacher.config.vocab_size)))
    params = [p for p in draft.parameters() if p.requires_grad]
    if not options.train_head:
        draft.head.requires_grad_(False)
        params = [p for p in params if p is not draft.head]
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0)
    budget = Budget(options, made)
    budget.refuse_if_spent(
        f"{len(pool.ids)} continuations and {len(ids) - len(pool.ids)} text windows",
        "a smaller --pool-share or --data-share, whose chunks stop at those shares of the budget",
    )
    step, losses = 0, []
    draft.train()
    while (spent := budget.spent(step)) < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(options, step, spent)
        rows = torch.from_numpy(rng.integers(0, len(ids), size=options.batch))
        starts = torch.from_numpy(rng.integers(0, ids.shape[1] - options.chain, size=options.batch))
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = chain_loss(draft, data, rows, starts, table, vocab, options, options.logit_batch)
        losses.append(descend(optimizer, loss, params))
        step += 1
        if step % 20 == 0:
            say(f"step {step}: loss {np.mean(losses[-20:]):.4f} ({budget.clock()})")
        if step % SCORE_EVERY == 0:
            say(f"step {step}: held-out chain acceptance {_rates(score(draft, held, options, vocab, prompt))}")
    seconds, cpu_seconds = budget.seconds(), budget.cpu_seconds()
    draft.eval()
    after = score(draft, held, options, vocab, prompt)
    say(f"after: held-out chain acceptance {_rates(after)}")
    return {
        "options": dataclasses.asdict(options),
        "text": streams.about,
        "steps": step,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "pool_cpu_seconds": round(pool.cpu_seconds, 3),
        "features_cpu_seconds": round(windows.cpu_seconds if windows is not None else 0.0, 3),
        "cached": {"pool": pool.cached, "features": windows.cached if windows is not None else True},
        "positions_seen": step * options.batch,
        "training_positions": int(ids.shape[0] * (ids.shape[1] - options.chain)),
        "sequences": {"continued": len(pool.ids), "text_windows": len(ids) - len(pool.ids)},
        "autocast": str(autocast).replace("torch.", "") if autocast is not None else "float32",
        "loss_first": losses[0] if losses else None,
        "loss_last": float(np.mean(losses[-20:])) if losses else None,
        "before": before,
        "after": after,
        "draft_parameters": sum(p.numel() for n, p in draft.named_parameters() if n != "embed"),
    }


def chain_loss(
    draft: FeatureDraft,
    data: Positions,
    rows: torch.Tensor,
    starts: torch.Tensor,
    table: torch.Tensor,
    vocab: DraftVocab,
    options: FeatureDraftOptions,
    logit_rows: int = 0,
) -> torch.Tensor:
    """The weighted loss of ``options.chain`` unrolled steps from positions ``(rows, starts)``; the logit losses
    read the first ``logit_rows`` of them (0: all)."""
    h = data.hidden[rows, starts].float()
    total, weights = torch.zeros(()), 0.0
    some = slice(0, logit_rows or len(rows))
    for j in range(1, options.chain + 1):
        at = starts + j
        y = draft.step(h, data.ids[rows, at])
        want = data.hidden[rows, at].float()
        loss = options.feature_weight * F.smooth_l1_loss(y.float(), want)
        logits, few, few_at = draft.logits(y[some]).float(), rows[some], at[some]
        if options.response_weight:
            top_ids, top_logits = data.top_ids[few, few_at].long(), data.top_logits[few, few_at].float()
            response = sparse_response_loss(logits, top_ids, top_logits, options.temperature)
            loss = loss + options.response_weight * response
        if options.greedy_weight:
            greedy = data.greedy[few, few_at]
            sub = table[greedy]
            inside = torch.from_numpy(vocab.ids)[sub] == greedy
            loss = loss + options.greedy_weight * F.cross_entropy(logits[inside], sub[inside])
        weight = options.chain_decay ** (j - 1)
        total, weights = total + weight * loss, weights + weight
        h = y
    return total / weights


def held_out(
    teacher: Any, streams: TokenStreams, vocab: DraftVocab, options: FeatureDraftOptions, prompt: int
) -> Positions:
    """Held-out prompts continued greedily, with the fp32 teacher's features (the target runs in fp32)."""
    windows = _windows(streams.held_out, prompt)
    continued = teacher_sequences(Teacher(teacher, vocab.ids, _autocast_dtype()), windows, options.continuation, 1)
    return Positions.of(teacher_features(Teacher(teacher, vocab.ids, None), continued.ids, options.top_k))


@torch.no_grad()
def score(
    draft: FeatureDraft, held: Positions, options: FeatureDraftOptions, vocab: DraftVocab, prompt: int
) -> dict[str, Any]:
    """The chain of ``SCORED_CHAIN`` proposals (or ``options.chain``, if longer) simulated from every held-out
    continuation position whose next tokens are the fp32 teacher's greedy path: each proposal's acceptance given
    the earlier ones; the mean chain loss there."""
    length, chain = held.ids.shape[1], max(SCORED_CHAIN, options.chain)
    starts = torch.arange(prompt - 1, length - chain)
    rows, starts = (t.reshape(-1) for t in torch.meshgrid(torch.arange(len(held.ids)), starts, indexing="ij"))
    greedy_path = torch.ones(len(rows), dtype=torch.bool)
    for j in range(1, chain + 1):
        greedy_path &= held.ids[rows, starts + j] == held.greedy[rows, starts + j - 1]
    rows, starts = rows[greedy_path], starts[greedy_path]
    h, token = held.hidden[rows, starts].float(), held.ids[rows, starts + 1]
    alive, acceptance = torch.ones(len(rows), dtype=torch.bool), []
    for j in range(1, chain + 1):
        h = draft.step(h, token)
        token = draft.propose(h)
        hit = alive & (token == held.greedy[rows, starts + j])
        acceptance.append(float(hit.sum()) / max(1, int(alive.sum())))
        alive = hit
    table = torch.from_numpy(vocab.to_draft(len(draft.embed)))
    loss = float(chain_loss(draft, held, rows, starts, table, vocab, options))
    expected = list(np.cumsum(np.cumprod(acceptance)) + 1.0)
    return {
        "acceptance": acceptance,
        "expected_tokens": [round(float(e), 3) for e in expected],
        "chain_loss": loss,
        "positions": len(rows),
    }


def _rates(report: dict[str, Any]) -> str:
    return ", ".join(f"a{i + 1} {a:.1%}" for i, a in enumerate(report["acceptance"])) + f" ({report['positions']})"
