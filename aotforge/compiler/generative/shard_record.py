"""The manifest record of a sharded text-generation artifact (``target.info``): the cache geometry, the decode
attention, the split's own record (``tensor_parallel.ranks`` / ``pipeline_parallel.stages``), the weight bytes of
each rank or stage, and the verify width; and the digest of the shards' graphs (the ``ir`` record)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts.hashing import sha256_file
from aotforge.core.decoder import TEXT_GENERATION, DecoderSpec


def shard_info(
    kind: str,
    noun: str,
    options: dict[str, Any],
    spec: DecoderSpec,
    attention: str,
    plain_why: str | None,
    split_record: dict[str, Any],
    weights: dict[str, int],
    speculative_k: int,
) -> dict[str, Any]:
    """``target.info`` of a ``kind`` build (``targets.SHARD_KINDS``) whose shards (``noun``: rank, stage) store
    ``weights`` bytes each; ``split_record`` is the split's own (``sharded_build.Split.record``)."""
    verify_width = speculative_k + 1 if speculative_k else 0
    return {
        "options": options,
        "task": TEXT_GENERATION,
        "decoder": spec.to_dict(),
        "decode_attention": attention,
        **({"decode_attention_plain_because": plain_why} if plain_why else {}),
        kind: split_record,
        "weights": {"weights_file_bytes": sum(weights.values()), f"per_{noun}_bytes": weights},
        **({"speculative": {"max_tokens": speculative_k, "verify_width": verify_width}} if verify_width else {}),
    }


def graphs_sha(stage: Path, ir_files: Sequence[str]) -> str:
    """One digest over every shard's graphs (their weights are in ``files`` like every file)."""
    digest = hashlib.sha256()
    for rel in ir_files:
        if rel.endswith(".onnx"):
            digest.update(sha256_file(stage / rel).encode())
    return digest.hexdigest()
