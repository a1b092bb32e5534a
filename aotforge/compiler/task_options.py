"""Build options that only one task reads: given to the other task, they are refused by name, never ignored."""

from __future__ import annotations

import dataclasses
from typing import Any

from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import TEXT_GENERATION
from aotforge.core.errors import OptionsError

#: Options of a graph's build (an encoder, a vision model ...) and the flag that sets each.
GRAPH_ONLY = {
    "sample_inputs": "--sample-inputs",
    "dynamic": "--dynamic",
    "input_ranges": "--input-range",
    "calibration": "--calibration",
    "accuracy_budget": "--accuracy-budget",
    "validation_samples": "validation_samples",
    "bench_options": "--bench-seconds",
    # A text-generation artifact is validated in the build's process, against the source model it holds.
    "run_deadline_s": "--run-deadline",
}
#: Options of a text-generation build and the flag that sets each (``--speculative-k``: ``compiler.api``).
TEXT_GENERATION_ONLY = {
    "max_seq_len": "--max-seq-len",
    "max_batch": "--max-batch",
    "min_token_agreement": "--min-token-agreement",
    "max_perplexity_increase": "--max-perplexity-increase",
    "eval_text": "--eval-text",
    "tensor_parallel": "--tensor-parallel",
    "pipeline_parallel": "--pipeline-parallel",
}


def _default(name: str) -> Any:
    """A field's default, without making a whole ``BuildOptions`` (its pass list imports the passes: a direct
    cache hit must not)."""
    field = next(f for f in dataclasses.fields(BuildOptions) if f.name == name)
    return field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc,operator]


def refuse_inapplicable(opts: BuildOptions) -> None:
    """One error naming the options ``opts`` sets away from their defaults that its task does not read."""
    generative = opts.task == TEXT_GENERATION
    foreign = GRAPH_ONLY if generative else TEXT_GENERATION_ONLY
    given = [flag for field, flag in foreign.items() if getattr(opts, field) != _default(field)]
    if not given:
        return
    if generative:
        raise OptionsError(
            f"{', '.join(given)} do(es) not apply to text-generation builds (their shapes are --max-seq-len and "
            "--max-batch; they validate greedy tokens on prompts of their own, in this process): drop them"
        )
    raise OptionsError(
        f"{', '.join(given)} appl(y/ies) to text-generation builds only: add --task text-generation for a causal "
        "LM, or drop them"
    )
