"""Recipe files: a build's passes, their options, the target and the quality budget in one TOML.

```toml
passes = ["O2", "int8"]
target = "onnxruntime"
tolerance = 0.2
calibration = "calib/"          # or "make_calib.py:samples"
sample_inputs = "samples.npz"   # validation / benchmark inputs (or a directory of them)
accuracy_budget = 0.995         # int8 / int8-dynamic min_cosine
[pass_options.int8]
method = "percentile"
[target_options]
optimization_level = "all"
```

Every key is checked against the dataclass it fills (BuildOptions, each pass's Params, the
target's options); an unknown key is rejected by name with the valid ones listed.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotforge.core.errors import OptionsError

#: Recipe key -> BuildOptions field, with the type a value must have.
_KEYS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "passes": ("passes", (list, str)),
    "pass_options": ("pass_params", dict),
    "target": ("target", str),
    "target_options": ("target_options", dict),
    "tolerance": ("tolerance", (int, float)),
    "calibration": ("calibration", str),
    "accuracy_budget": ("accuracy_budget", (int, float)),
    "validation_samples": ("validation_samples", int),
    "sample_inputs": ("sample_inputs", str),
    "seed": ("seed", int),
    "name": ("name", str),
    "dynamic": ("dynamic", list),
    "input_ranges": ("input_ranges", dict),
    "task": ("task", str),
}


def load_recipe(path: Path | str) -> dict[str, Any]:
    """BuildOptions values from recipe ``path``; every key and nested key validated."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise OptionsError(f"recipe {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise OptionsError(f"recipe {path} is not valid TOML: {e}") from e
    return recipe_options(data, where=str(path))


def recipe_options(data: Mapping[str, Any], *, where: str = "recipe") -> dict[str, Any]:
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise OptionsError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(_KEYS))}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        field, kind = _KEYS[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise OptionsError(f"{where}: key {key} must be {names}, got {type(value).__name__} {value!r}")
        out[field] = value
    if isinstance(out.get("passes"), str):
        out["passes"] = [p.strip() for p in out["passes"].split(",") if p.strip()]
    if "input_ranges" in out:
        out["input_ranges"] = {k: tuple(v) for k, v in out["input_ranges"].items()}
    _check_nested(out, where)
    return out


def _check_nested(out: Mapping[str, Any], where: str) -> None:
    """Pass options against each pass's Params, target options against the target's dataclass."""
    from aotforge.core.options import options_from_dict
    from aotforge.passes import expand, make_pass
    from aotforge.targets import get_target

    names = expand(list(out.get("passes", ()))) if "passes" in out else None
    for name, params in out.get("pass_params", {}).items():
        if not isinstance(params, dict):
            raise OptionsError(f"{where}: pass_options.{name} must be a table of options, got {params!r}")
        if names is not None and name not in names:
            raise OptionsError(f"{where}: pass_options.{name} given but pass {name!r} is not in passes {names}")
        try:
            make_pass(name, params)
        except (TypeError, ValueError) as e:
            raise OptionsError(f"{where}: pass_options.{name}: {e}") from e
    if "target_options" in out:
        target = get_target(out.get("target", "tvm"))
        options_from_dict(target.options_type, out["target_options"], what=f"{where}: target {target.name}")


def int8_shortcuts(opts: Any, pass_names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The pass parameters (``PassOptions.params``) with ``calibration`` / ``accuracy_budget`` folded into the
    int8 passes' options.

    They fill ``calibration_dir`` / ``min_cosine`` of every INT8 pass in ``pass_names`` (``int8``,
    ``int8-dynamic``); an explicit, different ``<pass>.calibration_dir`` / ``<pass>.min_cosine`` conflicts.
    """
    params = {name: dict(values) for name, values in opts.params.items()}
    shortcuts = {"calibration_dir": opts.calibration, "min_cosine": opts.accuracy_budget}
    given = {k: v for k, v in shortcuts.items() if v is not None}
    if not given:
        return params
    targets = [name for name in _INT8_PASSES if name in pass_names]
    if not targets:
        flags = ", ".join("calibration" if k == "calibration_dir" else "accuracy_budget" for k in given)
        raise OptionsError(
            f"{flags} given but no int8 pass (int8, int8-dynamic) is in passes {','.join(pass_names)}; add one"
        )
    for name in targets:
        options = params.setdefault(name, {})
        for key, value in given.items():
            if key in options and str(options[key]) != str(value):
                raise OptionsError(f"{name}.{key}={options[key]} conflicts with the shortcut value {value}; give one")
            options[key] = value
    return params


#: The passes ``calibration`` / ``accuracy_budget`` reach.
_INT8_PASSES = ("int8", "int8-dynamic")
