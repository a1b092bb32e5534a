"""Which prefill and decode functions a tvm text-generation build compiles: its prompt and batch buckets.

Prefill runs at batch 1, one function per prompt-length bucket; decode (and verify) one function per batch
bucket, each over a static cache of ``max_seq_len``. ``--target-opt buckets=prompt=a/b/c,batch=a/b`` chooses
them; by default they double from 16 (prompts) and 1 (batch), and ``max_seq_len`` / ``max_batch`` are always
one. A call runs in the smallest bucket that holds it (``step_engine``).
"""

from __future__ import annotations

from typing import Any

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import OptionsError

#: Smallest prompt bucket; the others double up to ``max_seq_len`` (which is always one).
MIN_PROMPT_BUCKET = 16


def prompt_buckets(spec: DecoderSpec, declared: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Prompt lengths with a prefill function: ``prompt=a/b/c`` if given, else 16, 32, ... and max_seq_len."""
    sizes = declared.get("prompt") or _doubling(MIN_PROMPT_BUCKET, spec.max_seq_len)
    return tuple(sorted({s for s in sizes if 0 < s < spec.max_seq_len} | {spec.max_seq_len}))


def batch_buckets(spec: DecoderSpec, declared: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Batch sizes with a decode function: ``batch=a/b`` if given, else 1, 2, 4, ... and max_batch."""
    sizes = declared.get("batch") or _doubling(1, spec.max_batch)
    return tuple(sorted({s for s in sizes if 0 < s < spec.max_batch} | {spec.max_batch}))


def _doubling(start: int, below: int) -> tuple[int, ...]:
    sizes = []
    while start < below:
        sizes.append(start)
        start *= 2
    return tuple(sizes)


def _declared(options: Any) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for text in options.buckets:
        name, _, values = text.partition("=")
        try:
            sizes = tuple(sorted({int(v) for v in values.split("/")}))
        except ValueError:
            sizes = ()
        if name not in ("prompt", "batch") or not sizes:
            raise OptionsError(
                f"tvm bucket {text!r} of a text-generation build must read prompt=a/b/c (prefill lengths) "
                "or batch=a/b (decode batch sizes)"
            )
        out[name] = sizes
    return out


def plan_generative(spec: DecoderSpec, options: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The prompt and batch buckets ``options`` ask for; options this path cannot honour are refused."""
    if options.dynamic or options.tuning:
        raise OptionsError("tvm text-generation builds take neither dynamic=true nor tuning yet: leave them out")
    declared = _declared(options)
    return prompt_buckets(spec, declared), batch_buckets(spec, declared)
