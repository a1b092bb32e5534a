"""Build options that only one task reads: given to the other task, they are refused by name, never ignored."""

from __future__ import annotations

import dataclasses

from aotforge.compiler.option_flags import flag_name
from aotforge.compiler.options import BuildOptions, GenerationOptions, field_default
from aotforge.core.decoder import TEXT_GENERATION
from aotforge.core.errors import OptionsError

#: Fields (paths, or a group's prefix) of a graph's build: an encoder, a vision model ...
GRAPH_ONLY = (
    "validation.sample_inputs",
    "validation.validation_samples",
    "frontend.dynamic",
    "frontend.input_ranges",
    "passes.calibration",
    "passes.accuracy_budget",
    "benchmark.runs.",
    # A text-generation artifact is validated in the build's process, against the source model it holds.
    "isolation.run_deadline_s",
)
#: Fields of a text-generation build (``--speculative-k``: ``compiler.api``, with a message of its own).
TEXT_GENERATION_ONLY = tuple(
    f"generation.{f.name}" for f in dataclasses.fields(GenerationOptions) if f.name != "speculative_k"
)


def refuse_inapplicable(opts: BuildOptions) -> None:
    """One error naming the options ``opts`` sets away from their defaults that its task does not read."""
    generative = opts.frontend.task == TEXT_GENERATION
    foreign = GRAPH_ONLY if generative else TEXT_GENERATION_ONLY
    given = sorted(
        {
            flag_name(path)
            for path, value in opts.fields().items()
            if path.startswith(foreign) and value != field_default(path)
        }
    )
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
