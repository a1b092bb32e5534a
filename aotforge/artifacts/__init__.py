"""The artifact format and everything that moves artifacts around."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aotforge.artifacts.manifest import Manifest, read_manifest

if TYPE_CHECKING:
    from aotforge.artifacts.loader import LoadedArtifact, load

__all__ = ["LoadedArtifact", "Manifest", "load", "read_manifest"]


def __getattr__(name: str) -> Any:
    # The loader imports the targets (onnx_ir, ~0.8 s): resolved on first use, so that
    # ``artifacts.build_cache`` serves a direct cache hit without it.
    if name in ("LoadedArtifact", "load"):
        from aotforge.artifacts import loader

        return getattr(loader, name)
    raise AttributeError(name)
