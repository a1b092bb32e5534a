"""Calibration data for the int8 pass: a directory of .npy / .npz files or ``module.py:function``.

A ``.npy`` file feeds a one-input model; a ``.npz`` names its arrays after the inputs. Either may
stack samples along an extra leading axis. ``file.py:fn`` (or ``package.module:fn``) names a
callable returning an iterable of ``{input name: array}`` dicts, e.g. tokenized sentences.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.errors import OptionsError

Feeds = dict[str, np.ndarray]


def is_callable_spec(source: str) -> bool:
    module, sep, fn = source.rpartition(":")
    return bool(sep and module and fn.isidentifier() and not Path(source).is_dir())


def load_calibration(source: str, inputs: Mapping[str, tuple[int, np.dtype | None]], limit: int) -> list[Feeds]:
    """At most ``limit`` feeds from ``source``; ``inputs`` maps each input name to (rank, dtype)."""
    if is_callable_spec(source):
        return _from_callable(source, inputs, limit)
    directory = Path(source)
    if not directory.is_dir():
        raise OptionsError(
            f"calibration {source!r} is neither a directory nor module.py:function; "
            "give a directory of .npy/.npz files or a callable returning input dicts"
        )
    files = sorted(f for f in directory.iterdir() if f.suffix in (".npz", ".npy"))
    if not files:
        raise OptionsError(f"no .npz or .npy files in calibration directory {directory}; add samples")
    samples: list[Feeds] = []
    for path in files:
        arrays = dict(np.load(path)) if path.suffix == ".npz" else {"": np.load(path)}
        if "" in arrays and len(inputs) == 1:
            arrays = {next(iter(inputs)): arrays[""]}
        _check_names(arrays, inputs, str(path))
        samples.extend(_split(arrays, inputs))
        if len(samples) >= limit:
            break
    return samples[:limit]


def _from_callable(source: str, inputs: Mapping[str, tuple[int, np.dtype | None]], limit: int) -> list[Feeds]:
    with _import_path(source.rpartition(":")[0]):
        return _call(source, inputs, limit)


def _call(source: str, inputs: Mapping[str, tuple[int, np.dtype | None]], limit: int) -> list[Feeds]:
    fn = _resolve(source)
    try:
        produced: Iterable[Mapping[str, Any]] = fn()
        samples: list[Feeds] = []
        for item in produced:
            feeds = {k: np.asarray(v) for k, v in item.items()}
            _check_names(feeds, inputs, f"{source} item {len(samples)}")
            samples.extend(_split(feeds, inputs))
            if len(samples) >= limit:
                break
    except OptionsError:
        raise
    except Exception as e:  # user code: report which callable failed and how
        raise OptionsError(f"calibration callable {source} failed: {type(e).__name__}: {e}") from e
    if not samples:
        raise OptionsError(f"calibration callable {source} produced no samples; return an iterable of input dicts")
    return samples[:limit]


@contextlib.contextmanager
def _import_path(module_name: str) -> Iterator[None]:
    """The current directory (and a .py module's own) on sys.path while the callable is imported and run.

    A calibration module imports its project's packages (``from examples.x import ...``), even
    inside the function, the way it would when run from the current directory.
    """
    extra = [str(Path.cwd())] + ([str(Path(module_name).resolve().parent)] if module_name.endswith(".py") else [])
    added = [p for p in dict.fromkeys(extra) if p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for p in added:
            sys.path.remove(p)


def _resolve(source: str) -> Any:
    module_name, _, fn_name = source.rpartition(":")
    return _import(module_name, fn_name)


def _import(module_name: str, fn_name: str) -> Any:
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise OptionsError(f"calibration module {module_name} does not exist")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None  # a .py file always has a loader
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except OptionsError:
        raise
    except Exception as e:
        raise OptionsError(f"calibration module {module_name} cannot be imported: {type(e).__name__}: {e}") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise OptionsError(f"calibration module {module_name} has no callable {fn_name!r}")
    return fn


def _check_names(arrays: Mapping[str, np.ndarray], inputs: Mapping[str, Any], where: str) -> None:
    if set(arrays) != set(inputs):
        raise OptionsError(
            f"calibration {where} holds {sorted(arrays)} but the model's inputs are {sorted(inputs)}; "
            "name the arrays (npz keys / dict keys) after the inputs"
        )


def _split(arrays: Mapping[str, np.ndarray], inputs: Mapping[str, tuple[int, np.dtype | None]]) -> list[Feeds]:
    """One feed, or several when every array carries an extra leading samples axis."""
    feeds = {n: a.astype(inputs[n][1]) if inputs[n][1] is not None else a for n, a in arrays.items()}
    if all(a.ndim == inputs[n][0] + 1 for n, a in feeds.items()):
        count = min(len(a) for a in feeds.values())
        return [{n: a[i] for n, a in feeds.items()} for i in range(count)]
    return [feeds]
