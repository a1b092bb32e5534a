"""The tensor-parallel text-generation build: ``sharded_build`` over ranks, each over 1/N of the weights.

Each rank's model is the source model's slice (``tensor_parallel.rank_model``): its heads, its part of each MLP,
its slice of the vocabulary; the rank graphs' all-reduces meet in the rank processes (``targets.generative.ranks``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aotforge.compiler.generative.sharded_build import Sharding, Split
from aotforge.compiler.generative.tensor_parallel import layout, rank_model
from aotforge.core.decoder import DecoderSpec
from aotforge.targets.generative.ranks import RankedEngine


def _split(model: Any, spec: DecoderSpec, degree: int, name: str) -> Split:
    """The layout of ``degree`` ranks: every rank the same cache geometry over its 1/N of the KV heads."""
    plan = layout(model, degree, name)
    rank_spec = dataclasses.replace(spec, kv_heads=plan.kv_heads // plan.degree, vocab=plan.vocab_shard)

    def record(ranks: list[str], specs: list[DecoderSpec], weights: dict[str, int]) -> dict[str, Any]:
        """``target.info.tensor_parallel``: the layout, where each rank's files are, and each rank's cache."""
        return {
            "degree": plan.degree,
            "layout": plan.to_dict(),
            "ranks": ranks,
            "decoder": rank_spec.to_dict(),
            "rank_weights_bytes": weights,
            "rank_kv_cache_bytes_per_slot": rank_spec.kv_cache_bytes(1),
        }

    return Split(plan.degree, lambda r: (rank_model(model, plan, r), rank_spec, f"rank {r} of {plan.degree}"), record)


TENSOR_PARALLEL = Sharding(kind="tensor_parallel", folder="ranks", noun="rank", split=_split, engine=RankedEngine)
