"""``aotforge distill``: a smaller student of a causal LM (a draft for speculative decoding), trained on the
teacher's outputs on CPU for a bounded time, written as a transformers directory that ``aotforge compile`` takes;
``aotforge qat``: the model itself trained through a target's int4 rounding, on the same training loop."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.common import user_errors
from aotforge.compiler.training.options import QAT_OPTIONS, DistillOptions, FeatureDraftOptions, Placement
from aotforge.compiler.training.students import LAYER_PICKS

_HELP = {
    "max_minutes": "Wall-clock budget of the training loop.",
    "max_cpu_minutes": "Process CPU-time budget (all threads), CPU-minutes; 0: none. The honest one on a shared host.",
    "max_steps": "At most this many optimizer steps.",
    "seq_len": "Tokens per training sequence.",
    "batch": "Sequences per step.",
    "lr": "AdamW's peak learning rate.",
    "warmup_steps": "Linear warm-up steps.",
    "schedule": "The learning rate after the warm-up: constant, or cosine (decayed to 0 over the budget).",
    "temperature": "Softmax temperature of the response-based (logit) loss.",
    "feature_weight": "Weight of the feature-based loss (hidden states through a learned projection); 0: off.",
    "continuation": "Sequence-level distillation: each sequence's last N tokens are the teacher's greedy continuation.",
    "pool": "With --continuation: sequences the teacher continues once, up front (cached; its cost in the budget).",
    "top_k": "With --continuation: the teacher's largest logits kept per position (the KL is over them).",
    "seed": "Seed of the batches and the projections.",
    "held_out_tokens": "Tokens the report scores teacher and student on (never trained on).",
}


_DRAFT_HELP = {
    **_HELP,
    "max_cpu_minutes": "Process CPU-time budget (all threads), the teacher's pool and features included; 0: none.",
    "max_minutes": "Wall-clock budget, the teacher's pool and features included.",
    "intermediate_size": "The draft MLP's width; 0: twice the teacher's hidden size.",
    "sub_vocab": "Rows of the draft's head: the training text's most frequent tokens.",
    "chain": "Chain steps trained per position (step 2 on reads the draft's own output).",
    "chain_decay": "Chain step i's loss weighs chain_decay ** (i - 1).",
    "batch": "Positions per step.",
    "logit_batch": "Of those, the positions the logit losses read (the feature loss reads all); 0: all.",
    "response_weight": "Weight of the KL from the teacher's top-k logits.",
    "greedy_weight": "Weight of the cross-entropy on the teacher's greedy token.",
    "feature_weight": "Weight of the smooth-L1 loss to the teacher's next feature.",
    "train_head": "Train the head (else it stays the teacher's LM-head rows).",
    "continuation": "Each pooled sequence's last N tokens are the teacher's greedy continuation.",
    "pool": "At most this many sequences the teacher continues once, up front (cached; its cost in the budget).",
    "top_k": "The teacher's largest logits kept per position (the KL is over them).",
    "text_windows": "At most this many windows of plain training text beside the pool; 0: none.",
    "pool_share": "The pool stops at this share of the budget (the chunk that crosses it is finished).",
    "data_share": "The pool and the text windows stop at this share of the budget; the rest trains.",
    "held_out_tokens": "Held-out text whose windows prompt the held-out continuations the report scores.",
}


def _option_flags(defaults: Any, helps: dict[str, str] = _HELP) -> Any:
    """A click option per field of ``defaults``' options dataclass, its default ``defaults``' (written once, there)."""

    def decorate(command: Any) -> Any:
        for field in reversed(dataclasses.fields(defaults)):
            default = getattr(defaults, field.name)
            name = field.name.replace("_", "-")
            command = click.option(
                f"--{name}/--no-{name}" if isinstance(default, bool) else f"--{name}",
                type=None if isinstance(default, bool) else type(default),
                default=default,
                show_default=True,
                help=helps[field.name],
            )(command)
        return command

    return decorate


_TEXT = click.option(
    "--text",
    "text",
    type=click.Path(path_type=Path),
    multiple=True,
    help="Training text (repeat for more files; the last tokens are held out); default: stdlib docstrings.",
)


@click.command()
@click.argument("teacher", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A new directory for the student.")
@click.option(
    "--student",
    type=click.Path(path_type=Path),
    help="The student: a saved causal-LM directory, or a config.json (random weights); the teacher's vocabulary.",
)
@click.option(
    "--student-layers", type=click.IntRange(min=1), help="The student: the teacher cut to N evenly spaced layers."
)
@click.option(
    "--layer-pick",
    type=click.Choice(LAYER_PICKS),
    default=LAYER_PICKS[0],
    show_default=True,
    help="Which teacher layers --student-layers N takes: evenly spaced (first and last kept), or the first N.",
)
@click.option(
    "--draft-vocab",
    type=click.IntRange(min=2),
    help="A draft's reduced vocabulary: keep the N tokens most frequent in the training text (embedding and head).",
)
@_TEXT
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_option_flags(DistillOptions())
@user_errors
def distill(
    teacher: Path,
    out: Path,
    student: Path | None,
    student_layers: int | None,
    layer_pick: str,
    draft_vocab: int | None,
    text: tuple[Path, ...],
    as_json: bool,
    **kw: Any,
) -> None:
    """Distill TEACHER (a causal-LM directory, GGUF or .py file) into a smaller student written to --out.

    Response-based (KL on temperature-scaled logits) and, with --feature-weight, feature-based (hidden states).
    Compile the student as usual; as a draft: `aotforge generate ART --draft STUDENT_ART`."""
    from aotforge.compiler.training.job import distill_model

    options = DistillOptions(**kw)
    report = distill_model(
        teacher,
        out,
        student=student,
        student_layers=student_layers,
        layer_pick=layer_pick,
        text=text,
        options=options,
        draft_vocab=draft_vocab,
        progress=click.echo,
    )
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    before, after = report["before"], report["after"]
    click.echo(
        f"{report['steps']} steps in {report['train_seconds']:.0f} s ({report['tokens_seen']} tokens); held-out "
        f"perplexity teacher {after['teacher_perplexity']:.2f}, student {before['student_perplexity']:.2f} -> "
        f"{after['student_perplexity']:.2f}; greedy agreement {before['greedy_agreement']:.1%} -> "
        f"{after['greedy_agreement']:.1%}"
    )
    click.echo(str(out))


@click.command("distill-draft")
@click.argument("teacher", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A new directory for the draft.")
@_TEXT
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_option_flags(FeatureDraftOptions(), _DRAFT_HELP)
@user_errors
def distill_draft(teacher: Path, out: Path, text: tuple[Path, ...], as_json: bool, **kw: Any) -> None:
    """Distill a feature draft of TEACHER (a causal-LM directory, GGUF or .py file) for speculative decoding into --out.

    The draft (EAGLE/Hydra-style, attention-free) reads the target's own last hidden state and the next token and
    predicts the next hidden state and token; trained on the teacher's features over its greedy continuations of
    the text, for a CPU-time budget. The report gives each chain position's held-out acceptance."""
    from aotforge.compiler.training.feature_job import feature_draft_model

    options = FeatureDraftOptions(**kw)
    report = feature_draft_model(teacher, out, text=text, options=options, progress=click.echo)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    after = report["after"]
    rates = ", ".join(f"a{i + 1} {a:.1%}" for i, a in enumerate(after["acceptance"]))
    click.echo(
        f"{report['steps']} steps in {report['train_cpu_seconds']:.0f} CPU s ({report['train_seconds']:.0f} s); "
        f"held-out chain acceptance {rates}; tokens per round {after['expected_tokens']}"
    )
    click.echo(str(out))


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A new directory for the trained model.")
@click.option(
    "--target",
    default="onnxruntime",
    show_default=True,
    help="Whose int4 / int8 rounding to train through (a target without one is refused, naming those with one).",
)
@click.option("--block-size", type=int, default=Placement.block_size, show_default=True, help="weight-only.block_size")
@click.option(
    "--head-bits",
    type=click.Choice(["4", "8"]),
    default=str(Placement.head_bits),
    show_default=True,
    help="The LM head's bits (weight-only.head_bits).",
)
@click.option(
    "--method",
    help="How the starting int4 weights are calibrated: rtn, awq, gptq, awq+gptq (default: the int4 build's).",
)
@_TEXT
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_option_flags(QAT_OPTIONS)
@user_errors
def qat(
    model: Path,
    out: Path,
    target: str,
    block_size: int,
    head_bits: str,
    method: str | None,
    text: tuple[Path, ...],
    as_json: bool,
    **kw: Any,
) -> None:
    """Train MODEL (a causal-LM directory, GGUF or .py file) through --target's int4 rounding into --out.

    Quantization-aware distillation: the fake-quantized model learns the fp32 model's next-token distribution
    (straight-through estimator). Compile --out as usual with --precision int4; the report gives the held-out
    perplexity at int4 before and after."""
    from aotforge.compiler.training.qat import qat_model

    where = Placement(target, block_size=block_size, head_bits=int(head_bits))
    options = DistillOptions(**kw)
    report = qat_model(model, out, where=where, method=method, text=text, options=options, progress=click.echo)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    before, after = report["before"], report["after"]
    recovered = report["gap_recovered"]
    click.echo(
        f"{report['steps']} steps in {report['train_seconds']:.0f} s ({report['tokens_seen']} tokens); held-out "
        f"perplexity fp32 {after['teacher_perplexity']:.3f}, int4 {before['student_perplexity']:.3f} -> "
        f"{after['student_perplexity']:.3f}"
        + (f" ({recovered:.0%} of the int4 gap recovered)" if recovered is not None else "")
    )
    click.echo(str(out))
