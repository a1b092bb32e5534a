"""Knowledge distillation of a causal LM into a student, on CPU, for a bounded time.

Response-based: the temperature-scaled KL divergence from the teacher's next-token distribution to the student's
(Hinton et al.; ``T**2`` keeps its gradient's scale as ``T`` changes). Feature-based, when ``feature_weight`` > 0:
each student layer's hidden state, through a learned linear projection, regressed on the hidden state of the
teacher layer it maps to (:func:`~aotforge.compiler.training.students.layer_map`), scaled by the teacher's
variance there (FitNets). The teacher runs once per batch without gradients (``teacher.py``); with ``continuation``
(sequence-level distillation) it instead continues a pool of text prompts once, up front (``teacher_data.py``), and
the steps learn its sparse top-k distribution at every position of those sequences. Both run in bfloat16 where the
CPU has bfloat16 matmuls (AVX512-BF16 / AMX), else in fp32.

The report scores teacher and student on held-out tokens no step trained on: perplexity, and how often the
student's greedy next token is the teacher's (what a draft's acceptance follows).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from aotforge.compiler.training.options import DistillOptions, FeatureDraftOptions
from aotforge.compiler.training.students import decoder_layers, layer_map
from aotforge.compiler.training.teacher import Teacher
from aotforge.compiler.training.teacher_data import TeacherSequences, teacher_sequences
from aotforge.compiler.training.teacher_features import TeacherFeatures
from aotforge.compiler.training.text import TokenStreams
from aotforge.core.errors import OptionsError
from aotforge.targets.generative.draft_vocab import DraftVocab

Progress = Callable[[str], None]


def distill(
    teacher: Any,
    student: Any,
    streams: TokenStreams,
    options: DistillOptions,
    progress: Progress | None = None,
    vocab: DraftVocab | None = None,
) -> dict[str, Any]:
    """Train ``student`` (in place) on ``teacher``'s outputs over ``streams.train``; the run's report.

    ``vocab``: the student speaks that subset of the teacher's vocabulary (a draft's reduced head): it reads the
    text through the subset's map and learns the teacher's distribution restricted to the subset."""
    import torch

    say = progress or (lambda _m: None)
    torch.manual_seed(options.seed)
    rng = np.random.default_rng(options.seed)
    teacher.eval()
    student.train()
    autocast = _autocast_dtype()
    data = torch.from_numpy(streams.train)
    if len(data) <= options.seq_len + 1:
        from aotforge.core.errors import InputSpecError

        raise InputSpecError(
            f"the training text has {len(data)} tokens, not more than --seq-len {options.seq_len}: give more text"
        )
    projections = _projections(teacher, student) if options.feature_weight > 0 else None
    params = list(student.parameters()) + (list(projections.parameters()) if projections is not None else [])
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0, fused=True)
    view = VocabView(vocab, int(teacher.config.vocab_size))
    fast = None if projections is not None else Teacher(teacher, vocab.ids if vocab is not None else None, autocast)
    pool = held_out_pool = None
    if options.continuation:
        assert fast is not None  # DistillOptions refuses --continuation with --feature-weight
        prompt = options.seq_len - options.continuation
        pool = teacher_sequences(
            fast, _prompts(streams.train, prompt, options.pool, rng), options.continuation, options.top_k
        )
        held_out_pool = teacher_sequences(fast, _windows(streams.held_out, prompt), options.continuation, 1)
        made = "read from the cache, made" if pool.cached else "made"
        say(f"teacher's pool of {len(pool.ids)} continued sequences {made} in {pool.cpu_seconds:.0f} CPU s")
    before = score(teacher, student, streams.held_out, options, vocab, held_out_pool)
    say(f"before: student perplexity {before['student_perplexity']:.2f}, teacher {before['teacher_perplexity']:.2f}")
    budget = Budget(options, pool)
    budget.refuse_if_spent(
        f"--pool {options.pool} continuations of {options.continuation} tokens" if pool else "the student's set-up",
        "a smaller --pool or --continuation",
    )
    step, losses = 0, []
    while (spent := budget.spent(step)) < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(options, step, spent)
        if pool is not None:
            rows = rng.integers(0, len(pool.ids), size=options.batch)
            ids = torch.from_numpy(pool.ids[rows])
        else:
            starts = rng.integers(0, len(data) - options.seq_len, size=options.batch)
            ids = torch.stack([data[s : s + options.seq_len] for s in starts])
        if fast is None:  # the feature loss needs the hidden states too: the whole teacher, under autocast
            with torch.no_grad(), torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                taught = teacher(input_ids=ids, output_hidden_states=True)
            targets = view.teacher_logits(taught.logits.float())
        elif pool is None:
            targets = fast.logits(ids)
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            learnt = student(input_ids=view.student_ids(ids), output_hidden_states=projections is not None)
        if pool is not None:
            top_ids, top_logits = (torch.from_numpy(a[rows]) for a in (pool.top_ids, pool.top_logits))
            loss = sparse_response_loss(learnt.logits.float(), top_ids.long(), top_logits.float(), options.temperature)
        else:
            loss = response_loss(learnt.logits.float(), targets, options.temperature)
        if projections is not None:
            loss = loss + options.feature_weight * _feature_loss(
                learnt.hidden_states, taught.hidden_states, projections
            )
        losses.append(descend(optimizer, loss, params))
        step += 1
        if step % 10 == 0:
            say(f"step {step}: loss {np.mean(losses[-10:]):.4f} ({budget.clock()})")
    seconds, cpu_seconds = budget.seconds(), budget.cpu_seconds()
    student.eval()
    after = score(teacher, student, streams.held_out, options, vocab, held_out_pool)
    pool_cost = {} if pool is None else {"pool_cpu_seconds": round(pool.cpu_seconds, 3), "pool_cached": pool.cached}
    return pool_cost | {
        "options": dataclasses.asdict(options),
        "text": streams.about,
        "steps": step,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "tokens_seen": step * options.batch * options.seq_len,
        "distinct_tokens": len(pool.ids) * options.seq_len if pool is not None else None,
        "autocast": str(autocast).replace("torch.", "") if autocast is not None else "float32",
        "loss_first": losses[0] if losses else None,
        "loss_last": float(np.mean(losses[-20:])) if losses else None,
        "before": before,
        "after": after,
        "teacher_parameters": sum(p.numel() for p in teacher.parameters()),
        "student_parameters": sum(p.numel() for p in student.parameters()),
    }


class Budget:
    """What a run has spent of its step, wall-clock and process CPU-time budgets, as the largest fraction; the
    teacher's data ``made`` up front (a pool, features) counts as spent from the start (its cost when it was made,
    had it come from the cache)."""

    def __init__(self, options: DistillOptions | FeatureDraftOptions, *made: TeacherSequences | TeacherFeatures | None):
        self.options = options
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        for data in made:
            if data is not None:
                self.wall, self.cpu = self.wall - data.seconds, self.cpu - data.cpu_seconds

    def seconds(self) -> float:
        return time.perf_counter() - self.wall

    def cpu_seconds(self) -> float:
        return time.process_time() - self.cpu

    def clock(self) -> str:
        """Wall and CPU time spent, for a progress line."""
        return f"{self.seconds():.0f} s, {self.cpu_seconds():.0f} CPU s"

    def spent(self, step: int) -> float:
        return max(step / self.options.max_steps, share(self.options, self.seconds(), self.cpu_seconds()))

    def refuse_if_spent(self, data: str, smaller: str) -> None:
        """Refuse a run whose teacher's ``data`` (what it was) left no training step in the budget: it would write an
        untrained student. ``smaller`` names the options that make less of it."""
        if self.spent(0) >= 1.0:
            o = self.options
            cpu = f", {o.max_cpu_minutes:g} CPU-minutes" if o.max_cpu_minutes > 0 else ""
            raise OptionsError(
                f"the teacher's data ({data}) took {self.seconds():.0f} s and {self.cpu_seconds():.0f} CPU s, all of "
                f"the run's budget ({o.max_minutes:g} minutes{cpu}): no training step is left; make less of it "
                f"({smaller}) or give the run more (--max-minutes, --max-cpu-minutes)"
            )


def share(options: DistillOptions | FeatureDraftOptions, seconds: float, cpu_seconds: float) -> float:
    """The largest fraction of the wall-clock and (when set) CPU-time budgets that ``seconds`` and ``cpu_seconds``
    are."""
    fractions = [seconds / (options.max_minutes * 60)]
    if options.max_cpu_minutes > 0:
        fractions.append(cpu_seconds / (options.max_cpu_minutes * 60))
    return max(fractions)


def descend(optimizer: Any, loss: Any, params: Any) -> float:
    """One optimizer step down ``loss``, the gradient's norm clipped at 1; the loss's value."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return float(loss.detach())


def learning_rate(options: DistillOptions | FeatureDraftOptions, step: int, spent: float) -> float:
    """Linear warm-up over ``warmup_steps``, then constant or cosine-decayed over the budget's spent fraction."""
    warm = min(1.0, (step + 1) / max(1, options.warmup_steps))
    if options.schedule == "cosine":
        warm *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, spent)))
    return options.lr * warm


def response_loss(student_logits: Any, teacher_logits: Any, temperature: float) -> Any:
    """``T**2 * KL(softmax(teacher / T) || softmax(student / T))``, the mean over every token."""
    import torch

    t = torch.log_softmax(teacher_logits / temperature, -1).flatten(0, -2)
    s = torch.log_softmax(student_logits / temperature, -1).flatten(0, -2)
    kl = torch.nn.functional.kl_div(s, t, log_target=True, reduction="batchmean")
    return kl * temperature**2


def sparse_response_loss(student_logits: Any, top_ids: Any, top_logits: Any, temperature: float) -> Any:
    """``T**2 * KL(p || q)`` per token, ``p`` the teacher's softmax over its ``k`` largest logits (``top_logits`` at
    the student's ids ``top_ids``), ``q`` the student's distribution at those ids (the rest of its mass is what the
    KL's ``log q`` pushes down)."""
    import torch

    t = torch.log_softmax(top_logits / temperature, -1)
    s = torch.log_softmax(student_logits / temperature, -1).gather(-1, top_ids)
    return (t.exp() * (t - s)).sum(-1).mean() * temperature**2


def _prompts(train: np.ndarray, length: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` windows of ``length`` tokens at random places of ``train``: the pool's prompts."""
    starts = rng.integers(0, len(train) - length, size=count)
    return np.stack([train[s : s + length] for s in starts])


def _windows(tokens: np.ndarray, length: int, most: int = 16) -> np.ndarray:
    """Up to ``most`` consecutive windows of ``length`` tokens of ``tokens``: the held-out prompts."""
    count = max(1, min(most, len(tokens) // length))
    return np.stack([tokens[i * length : (i + 1) * length] for i in range(count)])


class VocabView:
    """The student's side of a batch when it speaks a subset of the teacher's vocabulary (identity otherwise)."""

    def __init__(self, vocab: DraftVocab | None, full_vocab: int) -> None:
        import torch

        self.ids = torch.from_numpy(vocab.ids) if vocab is not None else None
        self.table = torch.from_numpy(vocab.to_draft(full_vocab)) if vocab is not None else None

    def student_ids(self, ids: Any) -> Any:
        return ids if self.table is None else self.table[ids]

    def teacher_logits(self, logits: Any) -> Any:
        """The teacher's logits of the student's tokens (softmax over them: its distribution restricted there)."""
        return logits if self.ids is None else logits[..., self.ids]

    def teacher_tokens(self, student_tokens: Any) -> Any:
        return student_tokens if self.ids is None else self.ids[student_tokens]


def score(
    teacher: Any,
    student: Any,
    tokens: np.ndarray,
    options: DistillOptions,
    vocab: DraftVocab | None = None,
    continued: TeacherSequences | None = None,
) -> dict[str, float]:
    """Perplexity of each model on ``tokens`` (windows of ``seq_len``, each scored after its first token), the mean
    KL(teacher || student) per token, and the fraction of positions where the student's greedy next token is the
    teacher's (what a greedy draft's acceptance follows).

    With ``vocab`` (a student over a subset): the student's perplexity counts the positions whose next token is in
    the subset (``vocab_coverage`` of them), and the KL is from the teacher's distribution restricted to it.

    With ``continued`` (held-out prompts and the teacher's greedy continuations): ``continuation_agreement``, how
    often the student's greedy next token is the teacher's over the continuations, what greedy speculative decoding
    accepts a proposal on."""
    import torch

    view = VocabView(vocab, int(teacher.config.vocab_size))
    window = min(len(tokens), max(options.seq_len, 2))
    nll = {"teacher": 0.0, "student": 0.0}
    agree, count, covered, kl = 0, 0, 0, 0.0
    with torch.no_grad():
        for start in range(0, len(tokens) - 1, window):
            ids = torch.from_numpy(tokens[start : start + window]).unsqueeze(0)
            if ids.shape[1] < 2:
                break
            target = ids[0, 1:]
            taught = teacher(input_ids=ids).logits[0, :-1].float()
            learnt = student(input_ids=view.student_ids(ids)).logits[0, :-1].float()
            nll["teacher"] += float(torch.nn.functional.cross_entropy(taught, target, reduction="sum"))
            inside = view.teacher_tokens(view.student_ids(target)) == target
            student_target = view.student_ids(target)
            nll["student"] += float(
                torch.nn.functional.cross_entropy(learnt[inside], student_target[inside], reduction="sum")
            )
            agree += int((taught.argmax(-1) == view.teacher_tokens(learnt.argmax(-1))).sum())
            kl += float(response_loss(learnt, view.teacher_logits(taught), 1.0)) * int(target.numel())
            count += int(target.numel())
            covered += int(inside.sum())
    report = {
        "teacher_perplexity": math.exp(nll["teacher"] / count),
        "student_perplexity": math.exp(nll["student"] / max(covered, 1)),
        "greedy_agreement": agree / count,
        "kl_teacher_student": kl / count,
        "tokens": count,
    }
    if vocab is not None:
        report["vocab_coverage"] = covered / count
    if continued is not None:
        report["continuation_agreement"] = continuation_agreement(student, continued, options.continuation, view)
    return report


def continuation_agreement(student: Any, continued: TeacherSequences, new_tokens: int, view: VocabView) -> float:
    """The fraction of the teacher's ``new_tokens`` greedy tokens ending each of ``continued``'s sequences that the
    student, reading the sequence so far, predicts greedily."""
    import torch

    ids = torch.from_numpy(continued.ids)
    with torch.no_grad():
        guesses = view.teacher_tokens(student(input_ids=view.student_ids(ids)).logits.argmax(-1))
    return float((guesses[:, -new_tokens - 1 : -1] == ids[:, -new_tokens:]).float().mean())


def _autocast_dtype() -> Any:
    """bfloat16 where the CPU computes it natively (AVX512-BF16 / AMX: several times fp32's matmul rate), else None."""
    import torch

    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None


def _projections(teacher: Any, student: Any) -> Any:
    """One linear map per student layer from its width to the teacher's (the identity where they are equal)."""
    import torch

    width_s, width_t = int(student.config.hidden_size), int(teacher.config.hidden_size)
    layers = decoder_layers(student)[1]
    linears = [torch.nn.Linear(width_s, width_t, bias=False) for _ in range(layers)]
    if width_s == width_t:
        for linear in linears:
            torch.nn.init.eye_(linear.weight)
    maps = torch.nn.ModuleList(linears)
    picks = getattr(student, "teacher_layers", None) or layer_map(layers, decoder_layers(teacher)[1])
    maps.pairs = list(zip(range(layers), picks, strict=True))  # type: ignore[assignment]
    return maps


def _feature_loss(student_hidden: Any, teacher_hidden: Any, projections: Any) -> Any:
    """Mean over the mapped layer pairs of the projected student state's MSE to the teacher's, over its variance.
    ``hidden_states[0]`` is the embedding output, so layer ``i``'s output is ``hidden_states[i + 1]``."""
    total = 0.0
    for (s, t), projection in zip(projections.pairs, projections, strict=True):
        want = teacher_hidden[t + 1].float()
        got = projection(student_hidden[s + 1].float())
        total = total + ((got - want) ** 2).mean() / want.var().clamp(min=1e-6)
    return total / len(projections)
