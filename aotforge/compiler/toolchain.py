"""The versions of the toolchain a build ran with, recorded in every manifest and in the cache keys."""

from __future__ import annotations

import importlib.metadata
import platform


def toolchain_versions() -> dict[str, str]:
    """onnx, onnx-ir, Python and the distributions a build goes through (a target adds its own compiler)."""
    import onnx  # imported here: a direct cache hit never needs onnx (compiler.build_direct)
    import onnx_ir as ir

    versions = {"onnx": onnx.__version__, "onnx-ir": ir.__version__, "python": platform.python_version()}
    for dist in ("aotforge", "onnxscript", "torch"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions
