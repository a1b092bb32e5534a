"""The backend stage of a build as one isolated request: compile, then the validation runs of the artifact.

:func:`compile_and_run` runs in a spawned worker (``compiler.isolation``): the IR is read back from
the stage directory, the target compiles into it, and the compiled artifact runs every validation
sample, each run a phase with its own deadline. Its outputs come back as an npz file (read without
pickle) that the parent compares with the reference: native code never runs in the build's own
process before it has run every validation input once.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.store import MODEL_FILE
from aotforge.compiler.compile_cache import compile_cached, graph_cache_key
from aotforge.compiler.source import Arrays
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import BuildContext, CompileResult, Target

CALL = "aotforge.compiler.backend_stage:compile_and_run"
OUTPUTS = "outputs.npz"


@dataclasses.dataclass(frozen=True)
class BackendRequest:
    """Everything the worker needs; ``target`` is the class as ``module:Class`` (the same one the parent uses)."""

    target: str
    options: Any
    ctx: BuildContext
    stage: Path
    cache_dir: Path | None
    toolchain: Mapping[str, str]
    passes: Sequence[Mapping[str, Any]]
    samples: Sequence[Arrays]
    #: Where the outputs npz goes (a private directory of the parent's, not the stage).
    outputs_dir: Path
    run_deadline_s: float | None


def request_for(target: Target, **fields: Any) -> BackendRequest:
    cls = type(target)
    return BackendRequest(target=f"{cls.__module__}:{cls.__qualname__}", **fields)


def compile_and_run(request: BackendRequest, channel: Any) -> dict[str, Any]:
    """In the worker: the compile (through the build cache), then one run per validation sample."""
    import onnx_ir as ir

    module_name, _, cls_name = request.target.partition(":")
    target: Target = getattr(importlib.import_module(module_name), cls_name)()
    channel.phase(f"the {target.name} compile")
    model = ir.load(request.stage / MODEL_FILE)
    compiled, cache = compile_cached(
        target,
        request.options,
        request.stage,
        request.cache_dir,
        graph_cache_key(request.ctx, request.toolchain, request.passes),
        lambda options: target.compile(model, options, request.ctx, request.stage),
        channel.say,
    )
    record = TargetRecord(target.name, dataclasses.asdict(request.options), dict(compiled.target_info))
    channel.phase(f"loading the {target.name} artifact")
    runner = target.load(request.stage, record, request.ctx.io)
    outputs = []
    for i, sample in enumerate(request.samples):
        what = f"the validation run {i + 1} of {len(request.samples)} of the {target.name} artifact"
        channel.phase(what, request.run_deadline_s)
        outputs.append(runner.run(sample))
    channel.phase("handing the outputs back")
    index = save_outputs(request.outputs_dir / OUTPUTS, outputs)
    return {"compiled": dataclasses.asdict(compiled), "cache": cache, "outputs": index}


def compiled_of(result: Mapping[str, Any]) -> CompileResult:
    data = result["compiled"]
    return CompileResult(tuple(data["files"]), data["target_info"], data["toolchain"])


def save_outputs(path: Path, outputs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Outputs into an npz (no pickled objects); the JSON index says which key holds what."""
    arrays: dict[str, np.ndarray] = {}
    index = [
        {name: _put(arrays, f"s{i}_{j}", v) for j, (name, v) in enumerate(out.items())} for i, out in enumerate(outputs)
    ]
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy types allow_pickle among the kwargs
    return index


def load_outputs(path: Path, index: Sequence[Mapping[str, Any]]) -> list[Arrays]:
    with np.load(path, allow_pickle=False) as data:
        return [{name: _get(data, entry) for name, entry in sample.items()} for sample in index]


def _put(arrays: dict[str, np.ndarray], key: str, value: Any) -> Any:
    if value is None:  # an empty optional
        return None
    if isinstance(value, (list, tuple)):  # a sequence output
        return [_put(arrays, f"{key}_{k}", v) for k, v in enumerate(value)]
    array = np.asarray(value)
    if array.dtype == object:  # strings: np.save would pickle them
        arrays[key] = array.astype(str)
        return {"key": key, "dtype": "object"}
    if array.dtype.type.__module__.split(".")[0] == "ml_dtypes":  # bfloat16, float8 ...: as raw bits
        arrays[key] = array.view(f"u{array.dtype.itemsize}")
        return {"key": key, "dtype": array.dtype.name}
    arrays[key] = array
    return {"key": key}


def _get(data: Any, entry: Any) -> Any:
    if entry is None:
        return None
    if isinstance(entry, list):
        return [_get(data, e) for e in entry]
    array = data[entry["key"]]
    dtype = entry.get("dtype")
    if dtype == "object":
        return array.astype(object)
    if dtype is not None:
        import ml_dtypes

        return array.view(getattr(ml_dtypes, dtype))
    return array
