"""aotforge's compiler: frontends, build options and the ``build()`` entry point.

``build`` is resolved on first use so that ``import targets`` / ``import artifacts`` (which
need ``compiler.errors``) never pull in the whole build path.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AotforgeError", "BuildOptions", "BuildResult", "build"]


def __getattr__(name: str) -> Any:
    if name in ("build", "BuildResult"):
        from compiler import builder as build_module

        return getattr(build_module, name)
    if name == "BuildOptions":
        from compiler.options import BuildOptions

        return BuildOptions
    if name == "AotforgeError":
        from compiler.errors import AotforgeError

        return AotforgeError
    raise AttributeError(name)
