"""The layer report: what TensorRT's engine inspector and build log say the engine runs in.

Plain Python over the inspector's JSON text and the INFO log lines, so it runs (and is tested
on NVIDIA's published outputs, ``tests/data/tensorrt/``) without TensorRT. Both schemas are read:

- 10.x (and 8.x): ``Bindings`` is a list of names; a layer tensor's ``Format/Datatype`` is one
  string, "Row major linear FP16 format", "Thirty-two wide channel vectorized row major Int8
  format", or for Myelin layers the bare type name, "Float" / "Half".
- 11.x: ``I/O Tensors`` is a list of objects with ``DataType`` (docs.nvidia.com/deeplearning/
  tensorrt/11.3.0/api/migration/tensorrt-10x-to-11x-IEngineInspector.html) and a layer tensor
  carries ``Format`` and ``Datatype`` apart (the 11.1 repository's
  ``.agents/skills/trt-perf-analysis/schemas/analyze-data.schema.json``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

#: Words TensorRT writes for a data type -> one canonical name. From TREx's format table and its
#: ``parse_tensor_info`` (NVIDIA/TensorRT ``tools/experimental/trt-engine-explorer/trex/activations.py``),
#: DataType's printed names (``parsers/common/parserUtils.h``: Float, Half, Int8, Int32, Bool) and
#: the trt-perf-analysis report's dtype table (``report_template/app.js``: bf16, fp8, ...).
_DTYPE_WORDS = {
    "FLOAT": "FP32",
    "FP32": "FP32",
    "FLOAT32": "FP32",
    "HALF": "FP16",
    "FP16": "FP16",
    "FLOAT16": "FP16",
    "BFLOAT16": "BF16",
    "BF16": "BF16",
    "FP8": "FP8",
    "FLOAT8": "FP8",
    "FP4": "FP4",
    "FP4E2M1": "FP4",
    "DOUBLE": "FP64",
    "INT4": "INT4",
    "INT8": "INT8",
    "UINT8": "UINT8",
    "INT16": "INT16",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
}
_PICKED = "(Sparsity) TRT inference plan picked sparse implementation for layers:"
_ELIGIBLE = "(Sparsity) Layers eligible for sparse math:"


def precision(text: str) -> str:
    """The canonical type named in one inspector type or format string ("" when none is)."""
    for word in re.findall(r"[A-Za-z0-9]+", text):
        found = _DTYPE_WORDS.get(word.upper())
        if found:
            return found
    return ""


def tensor_precision(tensor: Any) -> str:
    """A layer tensor's type: the 11.x ``Datatype`` key first, else the 10.x ``Format/Datatype``."""
    if not isinstance(tensor, dict):
        return ""
    for key in ("Datatype", "DataType", "Format/Datatype", "Format"):
        if key in tensor:
            found = precision(str(tensor[key]))
            if found:
                return found
    return ""


def io_tensors(info: dict[str, Any]) -> list[dict[str, str]]:
    """The engine's I/O tensors by name, with their type where the schema has it (11.x only)."""
    if "I/O Tensors" in info:
        return [
            {
                "name": str(t.get("Name", "")),
                "mode": str(t.get("IOMode", "")),
                "dtype": precision(str(t.get("DataType", ""))),
            }
            for t in info["I/O Tensors"]
            if isinstance(t, dict) and "Name" in t
        ]
    return [{"name": str(n)} for n in info.get("Bindings", []) if isinstance(n, str)]


def sparse_log(lines: Iterable[str]) -> dict[str, list[str]]:
    """The ``(Sparsity)`` INFO lines of a build: layers eligible for sparse math, and those picked."""
    found: dict[str, list[str]] = {}
    for line in lines:
        for key, marker in (("eligible", _ELIGIBLE), ("picked", _PICKED)):
            at = line.find(marker)
            if at >= 0:
                rest = line[at + len(marker) :].strip()
                found[key] = [n.strip() for n in rest.split(", ") if n.strip()] if rest else []
    return found


def summarize_layers(layers_json: str, *, sparse_requested: bool, log_lines: Iterable[str] = ()) -> dict[str, Any]:
    """Per-layer output types, counts per type, and which layers run sparse kernels.

    Sparse layers come from TensorRT's own "(Sparsity) ... picked sparse implementation" INFO
    line when the build log has one; tactic names are only a fallback for a log without it.
    """
    info = json.loads(layers_json) if layers_json else {}
    per_layer, precisions, by_tactic = [], Counter[str](), []
    for layer in info.get("Layers", []):
        if not isinstance(layer, dict):  # bare names: the engine was built without DETAILED verbosity
            continue
        types = sorted({p for out in layer.get("Outputs", []) if (p := tensor_precision(out))})
        precisions.update(types)
        if "sparse" in str(layer.get("TacticName", "")).lower():
            by_tactic.append(str(layer.get("Name", "")))
        per_layer.append({"name": layer.get("Name", ""), "type": layer.get("LayerType", ""), "outputs": types})
    logged = sparse_log(log_lines)
    report: dict[str, Any] = {
        "layer_count": len(per_layer),
        "precisions": dict(sorted(precisions.items())),
        "io_tensors": io_tensors(info),
        "sparse_layers": logged.get("picked", by_tactic),
        "sparse_source": "build log" if "picked" in logged else "tactic names",
        "per_layer": per_layer,
    }
    if "eligible" in logged:
        report["sparse_eligible"] = logged["eligible"]
    if sparse_requested and not report["sparse_layers"]:
        report["note"] = "2:4 sparsity was requested but TensorRT picked no sparse tactic: the build gained nothing"
    return report
