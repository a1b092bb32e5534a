"""neuron's bundle inputs: the causal LM as safetensors, whose prefill / decode modules the device host traces."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec

#: Where a bundle for a target that compiles torch (neuron) keeps the causal LM (config + safetensors).
MODEL_DIR = "model"


class TorchModules:
    """The source weights: the CPU check and the device host build the same torch modules from them."""

    writing = "saving the causal LM's weights (safetensors) for the device host to trace"

    def write(self, stage: Path, model: Any, spec: DecoderSpec, name: str, attention: str) -> tuple[dict, int]:
        model.save_pretrained(stage / MODEL_DIR, safe_serialization=True)
        size = sum(f.stat().st_size for f in (stage / MODEL_DIR).glob("*.safetensors"))
        return {"weights_file_bytes": size, "unshared_bytes": size}, 0

    def cpu_engine(self, stage: Path, spec: DecoderSpec, model: Any, plan: Mapping[str, Any]) -> tuple[Any, str]:
        engine = torch_bucket_engine(model, spec, plan)
        return engine, "the prefill / decode torch modules on CPU, padded to the planned buckets"

    def modules(self, stage: Path) -> Mapping[str, Any] | None:
        from aotforge.compiler.generative.graphs import Decode, Prefill
        from aotforge.compiler.generative.source import load_causal_lm

        model = load_causal_lm(stage / MODEL_DIR).model
        return {"prefill": Prefill(model).eval(), "decode": Decode(model).eval()}

    def after_compile(self, stage: Path) -> None:
        shutil.rmtree(stage / MODEL_DIR)  # the compiled graphs hold the weights; the source stays in the bundle

    def compiled_files(self, bundle: Path) -> list[str]:
        return sorted(str(p.relative_to(bundle)) for p in (bundle / MODEL_DIR).iterdir() if p.is_file())


def torch_bucket_engine(model: Any, spec: DecoderSpec, plan: Mapping[str, Any]) -> Any:
    """Neuron's bucket routing and padding over the torch modules the device host traces, run on CPU."""
    import torch

    from aotforge.compiler.generative.graphs import Decode, Prefill
    from aotforge.targets.neuron.generative import CONTEXT_ENCODING, BucketStepEngine

    modules = {"prefill": Prefill(model).eval(), "decode": Decode(model).eval()}

    def run(key: tuple[str, int, int], arrays: list[np.ndarray]) -> list[np.ndarray]:
        module = modules["prefill" if key[0] == CONTEXT_ENCODING else "decode"]
        with torch.inference_mode():
            out = module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
        return [t.numpy() for t in out]

    keys = {(g["kind"], int(g["batch"]), int(g["length"])): None for g in plan["graphs"]}
    return BucketStepEngine(spec, keys, run)
