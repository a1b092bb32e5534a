"""The build-option flags of ``aotforge compile``, made from ``compiler.option_flags.FLAGS``: each flag's type and
default read from the field it sets (``compiler.options``), so neither is written a second time here."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.option_flags import BY_KEYWORD, FLAGS, Flag


def option_flags(*keywords: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click option for each flag of the table named (every one where none is named), in table order."""
    chosen = [f for f in FLAGS if f.cli and (not keywords or f.keyword in keywords)]
    if keywords and len(chosen) != len(keywords):
        raise ValueError(f"no build-option flag named {sorted(set(keywords) - {f.keyword for f in chosen})}")

    def add(command: Callable[..., Any]) -> Callable[..., Any]:
        for flag in reversed(chosen):
            command = _option(flag)(command)
        return command

    return add


def given_options(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The build-option flags given on the command line (not left at their defaults), as ``from_dict`` keys:
    a recipe's values stay under what the user did not give."""
    from click.core import ParameterSource

    return {
        key: value
        for key, value in values.items()
        if key in BY_KEYWORD and ctx.get_parameter_source(key) not in (ParameterSource.DEFAULT, None)
    }


def cli_default(flag: Flag) -> Any:
    """The flag's default as its field's default, written as the flag would be (a pass list comma-joined)."""
    from aotforge.compiler.options import field_default

    if flag.merge is not None:
        return () if flag.multiple else None
    default = field_default(flag.path)
    return ",".join(default) if isinstance(default, tuple) and flag.read is not None and not flag.multiple else default


def field_type(path: str) -> Any:
    """The annotated type of the field at ``path`` (``Optional`` unwrapped)."""
    from aotforge.compiler import options

    owner: Any = options.BuildOptions
    *groups, leaf = path.split(".")
    for group in groups:
        owner = typing.get_type_hints(owner, vars(options))[group]
    hint = typing.get_type_hints(owner, vars(options))[leaf]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1
    return args[0] if optional else hint


def _option(flag: Flag) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    names = [f"--{flag.keyword.replace('_', '-')}", *([flag.short] if flag.short else [])]
    default = cli_default(flag)
    kind = flag.type or (str if flag.multiple or flag.merge is not None else field_type(flag.path))
    extra: dict[str, Any] = {"help": flag.help, "default": default, "show_default": bool(default) or default == 0}
    if flag.choices:
        extra["type"] = click.Choice(flag.choices)
    elif kind is bool:
        if default:
            names = [f"{names[0]}/--no-{flag.keyword.replace('_', '-')}"]
        else:
            extra.update(is_flag=True, show_default=False)
    elif kind is Path:
        extra["type"] = click.Path(path_type=Path)
    elif kind in (int, float):
        extra["type"] = kind
    return click.option(*names, flag.keyword, multiple=flag.multiple, **extra)
