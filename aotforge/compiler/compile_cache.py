"""The IR-level build cache around a target's compile (``artifacts.build_cache``), for every task."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.artifacts import build_cache
from aotforge.artifacts.store import MODEL_FILE
from aotforge.targets.base import CompileResult

if TYPE_CHECKING:
    from aotforge.targets.base import BuildContext, Target


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """What keys a compile beside the target and its options, and which staged files an entry keeps."""

    #: Staged files the compile reads, by path in the stage (the IR; a decoder's graphs and their weights).
    ir_files: tuple[str, ...]
    #: The shapes the target compiles for (an encoder's IO spec; a decoder's cache geometry).
    io: Mapping[str, Any]
    #: The compilers' versions and probe details (``build_tail.key_toolchain``).
    toolchain: Mapping[str, str]
    passes: Sequence[Mapping[str, Any]]
    #: Other staged files the entry keeps (a tokenizer the frontend handed on): with ``ir_files`` they make
    #: the entry a whole artifact, which the direct mode serves (``compiler.build_direct``).
    kept: tuple[str, ...] = ()


def graph_cache_key(ctx: BuildContext, toolchain: Mapping[str, str], passes: Sequence[Mapping[str, Any]]) -> CacheKey:
    """The cache key of one graph's compile: the staged ``model.onnx``, the IO spec and the source format."""
    return CacheKey((MODEL_FILE,), {"io": ctx.io.to_dict(), "source_format": ctx.source_format}, toolchain, passes)


def compile_cached(
    target: Target,
    options: Any,
    stage: Path,
    cache_dir: Path | None,
    key: CacheKey,
    compile: Callable[[Any], CompileResult],
    say: Callable[[str], None],
) -> tuple[CompileResult, dict[str, Any] | None]:
    """``compile(options)``, or its files from ``cache_dir`` when an entry for this exact input exists.

    ``stage`` already holds ``key.ir_files``. The second value is the manifest's cache record.
    """
    if cache_dir is None:
        say(f"compiling for {target.name}")
        return compile(options), None
    components = build_cache.key_components(
        [stage / f for f in key.ir_files],
        list(key.passes),
        target.name,
        dataclasses.asdict(options),
        dict(key.io),
        key.toolchain,
    )
    digest = build_cache.cache_key(components)
    staged = key.ir_files + key.kept
    hit = build_cache.lookup(cache_dir, digest, stage, staged=staged)
    if hit is not None:
        for rel in hit.removed:  # what the compile took out of the stage (tvm: the weights it repacked)
            (stage / rel).unlink(missing_ok=True)
        say(f"cache hit {digest[:12]}: skipping the {target.name} compile")
        return CompileResult(hit.files, hit.target_info, hit.toolchain), {"hit": True, "key": digest}
    explanation = build_cache.explain(cache_dir, components)
    say(f"cache miss ({explanation}); compiling for {target.name}")
    # Targets with a timing/tuning cache (tensorrt, tvm) keep it in the build cache; after the key,
    # so the cache's location is not part of it.
    compiled = compile(target.with_cache_dir(options, cache_dir))
    # The IR goes into the entry too: a direct hit serves a whole artifact from it.
    files = tuple(dict.fromkeys([*compiled.files, *(f for f in staged if (stage / f).is_file())]))
    removed = tuple(f for f in staged if not (stage / f).exists())
    build_cache.store(
        cache_dir, digest, components, stage, files, compiled.target_info, compiled.toolchain, removed=removed
    )
    return compiled, {"hit": False, "key": digest, "explain": explanation}
