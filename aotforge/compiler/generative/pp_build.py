"""The pipeline-parallel text-generation build: ``sharded_build`` over stages, each over a run of the layers.

The split (``pipeline_parallel.plan``) balances parameters; stage ``s``'s model is the source model's layers
``bounds[s] .. bounds[s+1] - 1``, the hidden states crossing to the next stage inside its graph
(``targets.generative.stages``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aotforge.compiler.generative.pipeline_parallel import StagePlan, plan, stage_model
from aotforge.compiler.generative.sharded_build import Sharding, Split
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import OptionsError
from aotforge.targets.generative.stages import StagedEngine


def _split(model: Any, spec: DecoderSpec, opts: BuildOptions, name: str) -> Split:
    stages = plan(model, opts.generation.pipeline_parallel, name)

    def shard(s: int) -> tuple[Any, DecoderSpec, str]:
        what = f"stage {s} of {stages.degree} (layers {stages.bounds[s]} .. {stages.bounds[s + 1] - 1})"
        return stage_model(model, stages, s), _stage_spec(spec, stages, s), what

    def record(dirs: list[str], specs: list[DecoderSpec], weights: dict[str, int]) -> dict[str, Any]:
        """``target.info.pipeline_parallel``: the split, where each stage's files are, and each stage's cache."""
        return {
            "degree": stages.degree,
            "layout": stages.to_dict(),
            "stages": dirs,
            "decoders": [s.to_dict() for s in specs],
            # As many micro-batches as stages: each stage busy once the pipe is full, each step's weights read M times.
            "micro_batches": stages.degree,
            "stage_weights_bytes": weights,
            "stage_kv_cache_bytes_per_slot": [s.kv_cache_bytes(1) for s in specs],
        }

    return Split(stages.degree, shard, record, tag={"layout": stages.to_dict()})


def _stage_spec(spec: DecoderSpec, stages: StagePlan, stage: int) -> DecoderSpec:
    """The stage's cache geometry: its layers only; logits one column wide except on the last stage."""
    vocab = spec.vocab if stage == stages.degree - 1 else 1
    return dataclasses.replace(spec, layers=len(stages.layers(stage)), vocab=vocab)


def _refuse(opts: BuildOptions) -> None:
    if opts.generation.tensor_parallel > 1:
        raise OptionsError(
            "--pipeline-parallel with --tensor-parallel is not built yet: choose one of them (the other at 1)"
        )


PIPELINE_PARALLEL = Sharding(
    kind="pipeline_parallel",
    folder="stages",
    noun="stage",
    split=_split,
    engine=StagedEngine,
    refuse=_refuse,
    weight_only=True,
)
