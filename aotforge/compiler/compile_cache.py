"""The IR-level build cache around ``target.compile`` (``artifacts.build_cache``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from aotforge.artifacts import build_cache
from aotforge.compiler.build_direct import MODEL_FILE
from aotforge.compiler.options import BuildOptions
from aotforge.targets.base import BuildContext


def compile_cached(
    target: Any,
    model: ir.Model,
    target_opts: Any,
    ctx: BuildContext,
    stage: Path,
    opts: BuildOptions,
    toolchain: Mapping[str, str],
    pass_entries: Sequence[Mapping[str, Any]],
    say: Callable[[str], None],
) -> tuple[Any, dict[str, Any] | None]:
    """``target.compile``, or its files from ``opts.cache_dir`` when an entry for this exact input exists.

    ``stage`` already holds the IR as ``model.onnx``; ``toolchain`` is what the key records of the
    compilers (versions and probe details).
    """
    if opts.cache_dir is None:
        say(f"compiling for {opts.target}")
        return target.compile(model, target_opts, ctx, stage), None
    components = build_cache.key_components(
        stage / MODEL_FILE,
        list(pass_entries),
        opts.target,
        dataclasses.asdict(target_opts),
        {"io": ctx.io.to_dict(), "source_format": ctx.source_format},
        toolchain,
    )
    key = build_cache.cache_key(components)
    hit = build_cache.lookup(opts.cache_dir, key, stage, staged=(MODEL_FILE,))
    if hit is not None:
        say(f"cache hit {key[:12]}: skipping the {opts.target} compile")
        return hit, {"hit": True, "key": key}
    explanation = build_cache.explain(opts.cache_dir, components)
    say(f"cache miss ({explanation}); compiling for {opts.target}")
    # Targets with a timing/tuning cache (tensorrt) keep it in the build cache; after the key, so
    # the cache's location is not part of it.
    in_cache = getattr(target, "with_cache_dir", None)
    compiled = target.compile(model, in_cache(target_opts, opts.cache_dir) if in_cache else target_opts, ctx, stage)
    # The IR goes into the entry too: a direct hit serves a whole artifact from it.
    files = tuple(compiled.files) + (() if MODEL_FILE in compiled.files else (MODEL_FILE,))
    build_cache.store(opts.cache_dir, key, components, stage, files, compiled.target_info, compiled.toolchain)
    return compiled, {"hit": False, "key": key, "explain": explanation}
