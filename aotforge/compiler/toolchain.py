"""The versions of the toolchain a build ran with, recorded in every manifest and in the cache keys."""

from __future__ import annotations

import functools
import importlib.metadata
import platform


def toolchain_versions() -> dict[str, str]:
    """onnx, onnx-ir, Python and the distributions a build goes through (a target adds its own compiler)."""
    import onnx  # imported here: a direct cache hit never needs onnx (compiler.build_direct)
    import onnx_ir as ir

    versions = {"onnx": onnx.__version__, "onnx-ir": ir.__version__, "python": platform.python_version()}
    for dist in ("aotforge", "onnxscript", "torch"):
        versions[dist] = _distribution_version(dist)
    return versions


@functools.cache
def _distribution_version(dist: str) -> str:
    """Read once per process: the modules a build runs are those imported, which a later reinstall
    does not change; importlib.metadata parses METADATA as an email on every call."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
