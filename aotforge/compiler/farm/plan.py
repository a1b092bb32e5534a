"""``aotforge matrix PLAN.toml``: models x targets, with per-entry options.

```toml
out = "farm"                       # optional; --out wins
push = "~/registry"                # optional: push every passing artifact here
[resources]                        # optional: what a target's Ray task asks for (defaults below)
tensorrt = { GPU = 1, CPU = 1 }

[[build]]
model = "examples/mini_resnet.py"  # a .py / .onnx file or a transformers directory (relative to the plan)
targets = ["tvm", "onnxruntime"]
passes = ["O2"]                    # any recipe key (compiler.recipe): passes, tolerance, dynamic, task ...
[build.target_options.tvm]         # options of one target
fast_math = true
```

Every key is checked (unknown ones are refused by name) before anything builds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotforge.compiler.farm.spec import parse_targets
from aotforge.compiler.recipe import recipe_options
from aotforge.core.errors import OptionsError
from aotforge.targets import get_target

_PLAN_KEYS = ("out", "push", "resources", "build", "cache_dir", "bench", "jobs")
#: Keys of a [[build]] table beyond the recipe's.
_ENTRY_KEYS = ("model", "targets", "target_options", "bench", "resources")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One ``[[build]]`` table: a model, its targets and its build options (as ``BuildOptions.from_dict`` takes)."""

    model: str
    targets: tuple[str, ...]
    options: Mapping[str, Any]
    resources: Mapping[str, Mapping[str, float]]

    def resources_for(self, target: str) -> dict[str, float]:
        """One CPU, what the target's build asks for (``Target.build_resources``), then the plan's own."""
        return {"CPU": 1.0, **get_target(target).build_resources, **self.resources.get(target, {})}

    def key(self, target: str, toolchain: Mapping[str, Any]) -> str:
        """What decides this entry's artifact for ``target``: the model's bytes, the options, the toolchain."""
        text = json.dumps(
            [1, _content_digest(Path(self.model)), dict(self.options), target, dict(toolchain)],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Plan:
    path: Path
    entries: tuple[Entry, ...]
    out: Path | None
    push: str | None
    cache_dir: Path | None
    bench: bool
    jobs: int | None


def load_plan(path: Path) -> Plan:
    """The plan at ``path``; every key checked, model paths made relative to the plan's directory."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise OptionsError(f"plan {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise OptionsError(f"plan {path} is not valid TOML: {e}") from e
    _unknown(data, _PLAN_KEYS, f"plan {path}")
    builds = data.get("build")
    if not isinstance(builds, list) or not builds:
        raise OptionsError(f'plan {path}: no [[build]] table; each needs model = "..." and targets = [...]')
    base = path.parent
    resources = _resources(data.get("resources", {}), f"plan {path}: [resources]")
    bench = data.get("bench", True)
    entries = tuple(
        _entry(b, base, resources, bool(bench), f"plan {path}: build #{i + 1}") for i, b in enumerate(builds)
    )
    return Plan(
        path=path,
        entries=entries,
        out=_path(base, data["out"]) if "out" in data else None,
        push=str(data["push"]) if "push" in data else None,
        cache_dir=_path(base, data["cache_dir"]) if "cache_dir" in data else None,
        bench=bool(bench),
        jobs=int(data["jobs"]) if "jobs" in data else None,
    )


def _entry(table: Any, base: Path, resources: Mapping[str, Any], bench: bool, where: str) -> Entry:
    if not isinstance(table, dict):
        raise OptionsError(f"{where} must be a table")
    for key in ("model", "targets"):
        if key not in table:
            raise OptionsError(f'{where} has no {key}: give model = "path" and targets = ["tvm", "onnxruntime"]')
    rest = {k: v for k, v in table.items() if k not in _ENTRY_KEYS}
    if "target" in rest:
        raise OptionsError(f"{where}: give targets = [...] (a list), not target")
    options = recipe_options(rest, where=where)
    targets = parse_targets(table["targets"])
    per = table.get("target_options", {})
    if not isinstance(per, dict) or not all(t in targets and isinstance(v, dict) for t, v in per.items()):
        raise OptionsError(f"{where}: target_options must be tables named after its targets ({', '.join(targets)})")
    options = {
        **options,
        "target_options": {t: dict(v) for t, v in per.items()},
        "bench": bool(table.get("bench", bench)),
    }
    model = table["model"]
    if not isinstance(model, str):
        raise OptionsError(f"{where}: model must be a path string, got {model!r}")
    own = _resources(table.get("resources", {}), f"{where}: resources")
    return Entry(str(_path(base, model)), tuple(targets), options, {**resources, **own})


def _resources(table: Any, where: str) -> dict[str, dict[str, float]]:
    if not isinstance(table, dict):
        raise OptionsError(f"{where} must be a table of target = {{ resource = amount }}")
    out: dict[str, dict[str, float]] = {}
    for target, ask in table.items():
        parse_targets([target])
        if not isinstance(ask, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in ask.values()
        ):
            raise OptionsError(f"{where}.{target} must be a table of resource = amount (>= 0), got {ask!r}")
        out[target] = {str(k): float(v) for k, v in ask.items()}
    return out


def _unknown(data: Mapping[str, Any], valid: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise OptionsError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(valid)}")


def _path(base: Path, value: Any) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else base / path


def _content_digest(path: Path) -> str:
    """sha256 of a model file, or of every file of a model directory by relative path."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(file.relative_to(path).as_posix().encode() + b"\0" if path.is_dir() else b"")
        try:
            digest.update(hashlib.sha256(file.read_bytes()).digest())
        except OSError as e:
            raise OptionsError(f"model {file} cannot be read ({e}): check the plan's model path") from e
    return digest.hexdigest()
