"""tensorrt's bundle inputs: the prefill and decode ONNX graphs over one shared ``weights.data``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aotforge.compiler.generative.export import export_graphs, save_shared
from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, DecoderSpec


class OnnxGraphs:
    """The exported graphs: written once, run on this CPU by onnxruntime, compiled by the device host as they are."""

    writing = "exporting the prefill and decode graphs"

    def write(self, stage: Path, model: Any, spec: DecoderSpec, name: str, attention: str) -> tuple[dict, int]:
        prefill, decode = export_graphs(model, spec, name, decode_attention=attention)
        weights = save_shared({PREFILL_FILE: prefill, DECODE_FILE: decode}, stage)
        return weights, prefill.opset_imports.get("", 0)

    def cpu_engine(self, stage: Path, spec: DecoderSpec, model: Any, plan: Mapping[str, Any]) -> tuple[Any, str]:
        from aotforge.targets.onnxruntime import OrtOptions, session_options
        from aotforge.targets.onnxruntime.decoder import OrtStepEngine

        engine = OrtStepEngine(stage, spec, session_options(OrtOptions()), ["CPUExecutionProvider"])
        return engine, "onnxruntime CPU over the bundle's prefill.onnx / decode.onnx"

    def modules(self, stage: Path) -> Mapping[str, Any] | None:
        return None

    def after_compile(self, stage: Path) -> None:
        return None

    def compiled_files(self, bundle: Path) -> list[str]:
        return [PREFILL_FILE, DECODE_FILE]
