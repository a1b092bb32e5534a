"""The IR-level build cache around ``target.compile`` (``artifacts.build_cache``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.artifacts import build_cache
from aotforge.artifacts.store import MODEL_FILE
from aotforge.targets.base import CompileResult

if TYPE_CHECKING:
    import onnx_ir as ir

    from aotforge.targets.base import BuildContext, Target


def compile_cached(
    target: Target,
    model: ir.Model,
    target_opts: Any,
    ctx: BuildContext,
    stage: Path,
    cache_dir: Path | None,
    toolchain: Mapping[str, str],
    pass_entries: Sequence[Mapping[str, Any]],
    say: Callable[[str], None],
) -> tuple[CompileResult, dict[str, Any] | None]:
    """``target.compile``, or its files from ``cache_dir`` when an entry for this exact input exists.

    ``stage`` already holds the IR as ``model.onnx``; ``toolchain`` is what the key records of the
    compilers (versions and probe details). The second value is the manifest's cache record.
    """
    if cache_dir is None:
        say(f"compiling for {target.name}")
        return target.compile(model, target_opts, ctx, stage), None
    components = build_cache.key_components(
        stage / MODEL_FILE,
        list(pass_entries),
        target.name,
        dataclasses.asdict(target_opts),
        {"io": ctx.io.to_dict(), "source_format": ctx.source_format},
        toolchain,
    )
    key = build_cache.cache_key(components)
    hit = build_cache.lookup(cache_dir, key, stage, staged=(MODEL_FILE,))
    if hit is not None:
        say(f"cache hit {key[:12]}: skipping the {target.name} compile")
        return CompileResult(hit.files, hit.target_info, hit.toolchain), {"hit": True, "key": key}
    explanation = build_cache.explain(cache_dir, components)
    say(f"cache miss ({explanation}); compiling for {target.name}")
    # Targets with a timing/tuning cache (tensorrt, tvm) keep it in the build cache; after the key,
    # so the cache's location is not part of it.
    compiled = target.compile(model, target.with_cache_dir(target_opts, cache_dir), ctx, stage)
    # The IR goes into the entry too: a direct hit serves a whole artifact from it.
    files = tuple(compiled.files) + (() if MODEL_FILE in compiled.files else (MODEL_FILE,))
    build_cache.store(cache_dir, key, components, stage, files, compiled.target_info, compiled.toolchain)
    return compiled, {"hit": False, "key": key, "explain": explanation}
