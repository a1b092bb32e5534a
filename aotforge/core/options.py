"""Typed option parsing: loose values (CLI strings, recipe TOML, Python) into frozen dataclasses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from aotforge.core.errors import OptionsError


def options_from_dict(cls: type, data: Mapping[str, Any], *, what: str) -> Any:
    """Build a frozen options dataclass from loose values, rejecting unknown keys by name.

    Values given as strings (from ``--target-opt key=value``) are converted to the field's
    default's type, so the CLI, recipes and Python all go through this one function.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise OptionsError(f"unknown {what} option(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}")
    values = {}
    for key, value in data.items():
        default = fields[key].default
        values[key] = _coerce(value, default, f"{what} option {key}")
    return cls(**values)


def _coerce(value: Any, default: Any, what: str) -> Any:
    if isinstance(value, list) and isinstance(default, tuple):
        return tuple(value)  # options read back from JSON (a bundle, a manifest) compare equal to the originals
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("1", "true", "yes")
        if isinstance(default, tuple):
            return tuple(v for v in value.split(",") if v)
        return type(default)(value)
    except ValueError:
        raise OptionsError(f"{what} expects a {type(default).__name__}, got {value!r}") from None
