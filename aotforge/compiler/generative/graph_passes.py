"""Which passes a text-generation build runs, and where: on the exported graphs (weight-only, with the backend's
``pass_defaults`` under the user's parameters) or inside the target's compile (``compile_passes``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.compiler.builder import target_passes
from aotforge.compiler.options import BuildOptions
from aotforge.core.errors import OptionsError
from aotforge.passes import DEFAULT_PRESET, contrib_op_passes
from aotforge.targets.base import GenerativeBackend

#: Passes a text-generation build runs on both graphs (the rest are refused at planning).
GENERATIVE_PASSES = frozenset({"weight-only"})


def compile_passes(opts: BuildOptions, target: Any, backend: GenerativeBackend) -> dict[str, Any]:
    """Parameters of the passes the backend applies itself (tvm packs weight-only weights in its own
    format from the same parameters, so one recipe means the same on both targets); refused early."""
    handled = backend.compile_passes
    if not handled or tuple(opts.passes.names) in ((DEFAULT_PRESET,), ()):
        return {}
    passes = {p.name: p.params for p in backend_target_passes(opts, target, backend)[1] if p.name in handled}
    if backend.check_compile_passes is not None:
        backend.check_compile_passes(passes)
    return passes


def graph_passes_of(opts: BuildOptions, target: Any, backend: GenerativeBackend) -> Callable[[], list[Any]] | None:
    """A factory of fresh pass instances (each graph records its own stats), or None without passes.

    Weight-only quantization is what a memory-bound decoder wants, and it needs no calibration; the build's
    quality validation (``quality``: held-out perplexity, ``--max-perplexity-increase``) gates its numerics."""
    if tuple(opts.passes.names) in ((DEFAULT_PRESET,), ()):
        return None
    names, _ = backend_target_passes(opts, target, backend)
    if names and all(n in backend.compile_passes for n in names):
        return None
    refused = [n for n in names if n not in GENERATIVE_PASSES]
    if refused:
        raise OptionsError(
            f"passes {', '.join(refused)} do not apply to text-generation builds: they take "
            f"{', '.join(sorted(GENERATIVE_PASSES))} (--precision int4 or int8, or --passes weight-only)"
        )
    contrib = contrib_op_passes(names)
    if contrib and not target.runs_contrib_ops:
        raise OptionsError(
            f"pass {', '.join(contrib)} emits ONNX Runtime contrib ops (MatMulNBits) that {opts.target} cannot run"
        )
    return lambda: backend_target_passes(opts, target, backend)[1]


def backend_target_passes(
    opts: BuildOptions, target: Any, backend: GenerativeBackend
) -> tuple[tuple[str, ...], list[Any]]:
    """``target_passes`` with the backend's ``pass_defaults`` under the user's parameters: a decode step is not an
    encoder's batch, so a text-generation backend may want other defaults (onnxruntime's MatMulNBits
    ``accuracy_level``)."""
    return target_passes(opts, target, backend.pass_defaults)
