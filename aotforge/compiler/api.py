"""``build()``: the Python API and the CLI's entry into a build.

Light on purpose: a direct cache hit (``compiler.build_direct``) is served from here without
importing torch, onnx or any target; only a miss imports the build line (``compiler.builder``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.compiler import build_direct
from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.frontend_transformers import parse_task
from aotforge.compiler.options import BuildOptions
from aotforge.compiler.recipe import load_recipe
from aotforge.compiler.task_options import refuse_inapplicable
from aotforge.core.decoder import TEXT_GENERATION
from aotforge.core.errors import OptionsError

if TYPE_CHECKING:
    from aotforge.compiler.farm.spec import MatrixResult

Progress = Callable[[str], None]

__all__ = ["BuildResult", "build", "build_matrix", "resolve_options"]


def build(
    model: Any,
    options: BuildOptions | None = None,
    *,
    target: str | None = None,
    example_inputs: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    recipe: Path | str | None = None,
    direct_lookup: bool = True,
    **overrides: Any,
) -> BuildResult:
    """Compile ``model`` (a ``.onnx`` / ``.py`` path, a module name, or an ``nn.Module`` with
    ``example_inputs``) for ``options.target`` and write one artifact directory.

    Keyword ``overrides`` are what ``BuildOptions.from_dict`` takes (a field's name, a group, a flag's name):
    ``build(m, target="onnxruntime", max_seq_len=512)``. A ``recipe`` TOML (``compiler.recipe``) gives defaults
    that ``options`` fields differing from the defaults, and ``overrides``, replace. ``direct_lookup=False`` skips
    the direct cache lookup (the IR-level key is then computed and explained); the build still refreshes its entry.
    Several targets are :func:`build_matrix`'s (one artifact each and their comparison).
    """
    from aotforge.compiler.farm.spec import is_multi

    spec = target if target is not None else (options.target if options else overrides.get("target", "tvm"))
    if is_multi(spec):
        raise OptionsError(
            f"build() makes one artifact; for several targets ({spec}) call aotforge.build_matrix(model, "
            "targets=[...]), which builds each and compares them"
        )
    if target is not None:
        overrides = {**overrides, "target": target}
    opts = resolve_options(options, recipe, overrides)
    say = progress or (lambda _msg: None)
    if opts.frontend.task is None and isinstance(model, (str, Path)) and str(model).endswith(".gguf"):
        opts = opts.with_fields({"frontend.task": parse_task(TEXT_GENERATION)})  # a GGUF file holds a causal LM
    if (
        opts.generation.speculative_k and opts.frontend.task != TEXT_GENERATION
    ):  # a verify graph is a decoder's: refused, not dropped
        raise OptionsError(
            f"--speculative-k {opts.generation.speculative_k} compiles a verify graph for text-generation builds only: "
            "add --task text-generation for a causal LM, or drop --speculative-k"
        )
    refuse_inapplicable(opts)
    if example_inputs is not None:
        direct = build_direct.DirectPlan(None, "an nn.Module, not a file")
    else:
        direct = build_direct.plan(model, opts)
    if direct.key is not None and not direct_lookup:
        direct.reason = "lookup skipped (--explain-cache)"
    elif direct.key is not None:
        served = build_direct.serve(direct, opts, say)
        if served is not None:
            return served
    if opts.frontend.task == TEXT_GENERATION:
        from aotforge.compiler.generative.source import refuse_from_config

        # Every decoder build (unsharded, sharded, a device bundle) compiles the same graphs: one check, from the
        # model's config, before any of them loads its weights.
        refuse_from_config(model, opts.name, opts.target, opts.generation.max_seq_len)
        if opts.generation.pipeline_parallel > 1 or opts.generation.tensor_parallel > 1:  # rank or stage graphs
            from aotforge.compiler.generative import pp_build, tp_build
            from aotforge.compiler.generative.sharded_build import build_sharded
            from aotforge.compiler.generative.sharded_bundle import prepare_sharded

            pipeline = opts.generation.pipeline_parallel > 1
            sharding = pp_build.PIPELINE_PARALLEL if pipeline else tp_build.TENSOR_PARALLEL
            if opts.prepare_only:  # a device target's bundle, prepared on any host (no SDK needed)
                return prepare_sharded(model, opts, say, sharding)
            return build_sharded(model, opts, say, sharding, direct)
        from aotforge.compiler.generative.build import build_generative  # torch, transformers, the target

        return build_generative(model, opts, say, direct=direct)
    from aotforge.compiler.builder import build_resolved  # the full build line: torch, onnx, the target

    return build_resolved(model, opts, example_inputs=example_inputs, progress=say, direct=direct)


def build_matrix(
    model: Any,
    options: BuildOptions | None = None,
    *,
    targets: str | list[str] | tuple[str, ...] = "all",
    example_inputs: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    recipe: Path | str | None = None,
    **overrides: Any,
) -> MatrixResult:
    """Build ``model`` for each of ``targets`` (``["tvm", "onnxruntime"]``, ``"tvm,onnxruntime"`` or ``"all"``;
    ``compiler.farm.multi``): the frontend and passes once, each target in its own worker process, one artifact
    per target and their comparison."""
    from aotforge.compiler.farm.multi import build_many  # the frontend, passes and worker processes

    opts = resolve_options(options, recipe, {**overrides, "target": "tvm"})
    return build_many(model, opts, targets, example_inputs=example_inputs, progress=progress)


def resolve_options(
    options: BuildOptions | None, recipe: Path | str | None, overrides: Mapping[str, Any]
) -> BuildOptions:
    """``options`` over the recipe's values (only fields that differ from the defaults), then ``overrides``."""
    given = options.fields() if options else {}
    if recipe is not None:
        defaults = BuildOptions().fields()
        given = {k: v for k, v in given.items() if v != defaults[k]}
        given = {**load_recipe(recipe), **given}
    return BuildOptions.from_dict({**given, **overrides})
