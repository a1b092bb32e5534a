"""Registry selection by URL: one function, ``open_registry``, for every door (CLI, Makefile, Python)."""

from __future__ import annotations

from pathlib import Path

from aotforge.artifacts.local_registry import LocalRegistry, Registry, RegistryEntry, parse_ref
from aotforge.core.errors import RegistryError

__all__ = ["DEFAULT_REGISTRY", "Registry", "RegistryEntry", "open_registry", "parse_ref"]

DEFAULT_REGISTRY = Path("~/.aotforge/registry")


def open_registry(url: str | Path | Registry | None = None, *, create: bool = True) -> Registry:
    """A local directory path (the default ``~/.aotforge/registry``), or an ``http(s)://`` MLflow tracking URI.

    ``create=False`` (every command but ``push``) refuses a local path that holds no registry yet; the
    default registry is made on first use either way.
    """
    if url is None:
        return LocalRegistry(DEFAULT_REGISTRY.expanduser())
    if not isinstance(url, (str, Path)):
        return url  # already a registry object
    text = str(url)
    if text.startswith(("http://", "https://")):
        from aotforge.artifacts.mlflow_registry import MlflowRegistry

        return MlflowRegistry(text)
    if "://" in text:
        raise RegistryError(f"{text!r}: unsupported registry URL; give a local directory or an http(s):// MLflow URI")
    return LocalRegistry(Path(text).expanduser(), create=create)
