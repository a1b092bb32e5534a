"""The Relax pipeline the ``tvm`` target compiles with, in one place.

To see what runs for a CPU build, read this function. ``compile_relax`` returns the
executable and a report of what the pipeline did (recorded in the manifest).
"""

from __future__ import annotations

from typing import Any


def compile_relax(mod: Any, target: Any, *, fast_math: bool) -> tuple[Any, dict[str, Any]]:
    """Lower and build a Relax module for ``target``.

    ``relax.get_default_pipeline`` is used rather than plain ``relax.build`` because only the
    former fuses operators on CPU.
    """
    import tvm
    from tvm import relax

    report: dict[str, Any] = {"pipeline": "default", "fast_math": fast_math}
    if fast_math:
        mod = relax.transform.FastMathTransform()(mod)
    executable = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    return executable, report
