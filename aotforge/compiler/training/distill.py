"""Knowledge distillation of a causal LM into a student, on CPU, for a bounded time.

Response-based: the temperature-scaled KL divergence from the teacher's next-token distribution to the student's
(Hinton et al.; ``T**2`` keeps its gradient's scale as ``T`` changes). Feature-based, when ``feature_weight`` > 0:
each student layer's hidden state, through a learned linear projection, regressed on the hidden state of the
teacher layer it maps to (:func:`~aotforge.compiler.training.students.layer_map`), scaled by the teacher's
variance there (FitNets). The teacher runs once per batch without gradients (``teacher.py``; with ``continuation``, it
also writes the end of each sequence: sequence-level distillation); both run in bfloat16 where the CPU has bfloat16
matmuls (AVX512-BF16 / AMX), else in fp32.

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

from aotforge.compiler.training.options import DistillOptions
from aotforge.compiler.training.students import decoder_layers, layer_map
from aotforge.compiler.training.teacher import Teacher
from aotforge.compiler.training.text import TokenStreams
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
    before = score(teacher, student, streams.held_out, options, vocab)
    say(f"before: student perplexity {before['student_perplexity']:.2f}, teacher {before['teacher_perplexity']:.2f}")
    budget = Budget(options)
    step, losses = 0, []
    while (spent := budget.spent(step)) < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(options, step, spent)
        starts = rng.integers(0, len(data) - options.seq_len, size=options.batch)
        ids = torch.stack([data[s : s + options.seq_len - options.continuation] for s in starts])
        if fast is None:  # the feature loss needs the hidden states too: the whole teacher, under autocast
            with torch.no_grad(), torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                taught = teacher(input_ids=ids, output_hidden_states=True)
            targets = view.teacher_logits(taught.logits.float())
        elif options.continuation:
            ids, targets = fast.continue_greedy(ids, options.continuation)
        else:
            targets = fast.logits(ids)
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            learnt = student(input_ids=view.student_ids(ids), output_hidden_states=projections is not None)
        loss = response_loss(learnt.logits.float(), targets, options.temperature)
        if projections is not None:
            loss = loss + options.feature_weight * _feature_loss(
                learnt.hidden_states, taught.hidden_states, projections
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 10 == 0:
            clock = f"{budget.seconds():.0f} s, {budget.cpu_seconds():.0f} CPU s"
            say(f"step {step}: loss {np.mean(losses[-10:]):.4f} ({clock})")
    seconds, cpu_seconds = budget.seconds(), budget.cpu_seconds()
    student.eval()
    after = score(teacher, student, streams.held_out, options, vocab)
    return {
        "options": dataclasses.asdict(options),
        "text": streams.about,
        "steps": step,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "tokens_seen": step * options.batch * options.seq_len,
        "autocast": str(autocast).replace("torch.", "") if autocast is not None else "float32",
        "loss_first": losses[0] if losses else None,
        "loss_last": float(np.mean(losses[-20:])) if losses else None,
        "before": before,
        "after": after,
        "teacher_parameters": sum(p.numel() for p in teacher.parameters()),
        "student_parameters": sum(p.numel() for p in student.parameters()),
    }


class Budget:
    """What a run has spent of its step, wall-clock and process CPU-time budgets, as the largest fraction."""

    def __init__(self, options: DistillOptions) -> None:
        self.options = options
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def seconds(self) -> float:
        return time.perf_counter() - self.wall

    def cpu_seconds(self) -> float:
        return time.process_time() - self.cpu

    def spent(self, step: int) -> float:
        o = self.options
        fractions = [step / o.max_steps, self.seconds() / (o.max_minutes * 60)]
        if o.max_cpu_minutes > 0:
            fractions.append(self.cpu_seconds() / (o.max_cpu_minutes * 60))
        return max(fractions)


def learning_rate(options: DistillOptions, step: int, spent: float) -> float:
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
    teacher: Any, student: Any, tokens: np.ndarray, options: DistillOptions, vocab: DraftVocab | None = None
) -> dict[str, float]:
    """Perplexity of each model on ``tokens`` (windows of ``seq_len``, each scored after its first token), the mean
    KL(teacher || student) per token, and the fraction of positions where the student's greedy next token is the
    teacher's (what a greedy draft's acceptance follows).

    With ``vocab`` (a student over a subset): the student's perplexity counts the positions whose next token is in
    the subset (``vocab_coverage`` of them), and the KL is from the teacher's distribution restricted to it."""
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
    return report


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
    maps.pairs = list(zip(range(layers), layer_map(layers, decoder_layers(teacher)[1]), strict=True))  # type: ignore[assignment]
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
