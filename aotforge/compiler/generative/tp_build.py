"""The tensor-parallel text-generation build: ``sharded_build`` over ranks, each over 1/N of the weights.

Each rank's model is the source model's slice (``tensor_parallel.rank_model``): its heads, its part of each MLP,
its slice of the vocabulary; the rank graphs' all-reduces meet in the rank processes (``targets.generative.ranks``).
With ``--sequence-parallel`` each rank's prefill graph splits the residual stream along the prompt
(``tensor_parallel.SequenceSplit``): reduce-scatters and all-gathers in place of its all-reduces; its decode and
verify graphs are the plain rank's, exported and cached as those.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aotforge.compiler.generative.sharded_build import Sharding, Split
from aotforge.compiler.generative.tensor_parallel import layout, rank_model, sequence_parallel_prefill
from aotforge.compiler.options import BuildOptions
from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import OptionsError
from aotforge.targets import shard_runtime, sharded_targets
from aotforge.targets.generative.ranks import RankedEngine


def _split(model: Any, spec: DecoderSpec, opts: BuildOptions, name: str) -> Split:
    """The layout of ``degree`` ranks: every rank the same cache geometry over its 1/N of the KV heads."""
    plan = layout(model, opts.generation.tensor_parallel, name)
    sequence = opts.generation.sequence_parallel
    rank_spec = dataclasses.replace(spec, kv_heads=plan.kv_heads // plan.degree, vocab=plan.vocab_shard)

    def record(ranks: list[str], specs: list[DecoderSpec], weights: dict[str, int]) -> dict[str, Any]:
        """``target.info.tensor_parallel``: the layout, where each rank's files are, and each rank's cache."""
        return {
            "degree": plan.degree,
            "sequence_parallel": sequence,
            "layout": plan.to_dict(),
            "ranks": ranks,
            "decoder": rank_spec.to_dict(),
            "rank_weights_bytes": weights,
            "rank_kv_cache_bytes_per_slot": rank_spec.kv_cache_bytes(1),
        }

    def shard(r: int) -> tuple[Any, DecoderSpec, str]:
        return rank_model(model, plan, r, sequence), rank_spec, f"rank {r} of {plan.degree}"

    tag = {"sequence_parallel": sequence, "layout": plan.to_dict()}
    if not sequence:
        return Split(plan.degree, shard, record, None, tag)
    plain_tag = {**tag, "sequence_parallel": False}

    def plain(r: int) -> tuple[Any, dict[str, Any]]:
        """The plain rank: its decode and verify graphs are what a sequence-parallel rank's trace to."""
        return rank_model(model, plan, r), plain_tag

    return Split(plan.degree, shard, record, sequence_parallel_prefill, tag, plain)


def _refuse(opts: BuildOptions) -> None:
    """``--sequence-parallel`` on a target whose ranks cannot run the split prefill's collectives (a target
    without ranks at all is refused for ``--tensor-parallel`` before this)."""
    if opts.generation.sequence_parallel and shard_runtime(opts.target, "tensor_parallel") is not None:
        if not _splits_sequence(opts.target):
            have = [t for t in sharded_targets("tensor_parallel") if _splits_sequence(t)]
            raise OptionsError(
                f"--sequence-parallel: the {opts.target} ranks have no reduce-scatter / all-gather (only "
                f"{', '.join(have) or 'none'}): drop --sequence-parallel"
            )


def _splits_sequence(target: str) -> bool:
    runtime = shard_runtime(target, "tensor_parallel")
    return runtime is not None and runtime.sequence_parallel


TENSOR_PARALLEL = Sharding(
    kind="tensor_parallel", folder="ranks", noun="rank", split=_split, engine=RankedEngine, refuse=_refuse
)
