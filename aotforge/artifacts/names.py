"""Artifact names, versions and aliases: one path component of a safe alphabet, checked wherever they meet a path.

A name becomes a directory (``<out>/<name>/<version>/<target>``), a registry key and an MLflow filter
string, so ``../../esc``, ``/abs``, ``a/b``, quotes or control characters must never get that far. The
same check runs on what a user types (``--name``, ``--version``, ``NAME:VERSION``, ``NAME@ALIAS``) and
on what a manifest or bundle says (a file someone else wrote).
"""

from __future__ import annotations

import re
from typing import Any

from aotforge.core.errors import UnknownReferenceError

#: Starts with a letter or digit (so never ``.``, ``..`` or a hidden file), then letters, digits, ``._-``.
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_UNSAFE_CHAR = re.compile(r"[^A-Za-z0-9._-]+")
RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


def check_name(value: Any, what: str = "name") -> str:
    """``value`` if it is a safe artifact name; an :class:`ArtifactError` naming ``what`` otherwise."""
    if not isinstance(value, str) or not _SAFE.fullmatch(value):
        raise UnknownReferenceError(f"{what} {value!r} is not a valid artifact name: use {RULE} (no '/', no '..')")
    return value


def check_alias(value: Any) -> str:
    """An alias follows the same rule as a name (it is looked up by the same code paths)."""
    return check_name(value, "alias")


def check_version(value: Any, what: str = "version") -> int:
    """A positive integer (``bool`` and strings of digits are not versions)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnknownReferenceError(f"{what} {value!r} is not a valid artifact version: use a positive integer")
    return value


def safe_name(stem: str) -> str:
    """A valid name derived from a file stem or class name (``my model+v2`` -> ``my_model_v2``)."""
    cleaned = _UNSAFE_CHAR.sub("_", stem).lstrip("._-")[:128]
    return cleaned or "model"
