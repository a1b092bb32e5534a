"""A tvm text-generation build's matmul weights, packed at compile time from ``weights.data``.

fp32 weights become the panels of ``targets/tvm/rewrites/panel_weights``: one packed copy that the
prefill, decode and verify functions all read. The ``weight-only`` pass: ONNX Runtime's rewrites the
graphs into ``MatMulNBits``, which tvm cannot import; on tvm the same parameters (``bits``,
``block_size``) instead pick the packed format of ``targets/tvm/rewrites/weight_only``, applied to the
imported module first (the panels take what it leaves). The functions take the packed tensors as
weight arguments like any other; ``weight_file`` stores them with the originals still read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE
from aotforge.core.errors import OptionsError
from aotforge.targets.tvm.decoder.graphs import WeightRef
from aotforge.targets.tvm.rewrites.weight_only import WeightOnlyFormat


def weight_only_format(params: Any) -> WeightOnlyFormat:
    """The tvm format ``weight-only``'s parameters ask for, or a refusal naming the parameter."""
    if not params.symmetric:
        raise OptionsError("tvm weight-only packs symmetric weights only: leave weight-only.symmetric at true")
    if params.nodes_to_exclude:
        raise OptionsError("tvm weight-only takes no nodes_to_exclude (its matmuls are not ONNX nodes by then)")
    if params.method == "hqq":
        raise OptionsError(
            "tvm weight-only packs symmetric blocks; method hqq fits a zero point per block: "
            "use method rtn, awq, gptq or awq+gptq"
        )
    if params.accuracy_level not in (0, 4):
        raise OptionsError(
            "tvm weight-only computes with int8 activations (accuracy_level 4); "
            f"accuracy_level {params.accuracy_level} asks for float compute: leave it out or set 4"
        )
    if params.prompt_int8:
        raise OptionsError(
            "weight-only.prompt_int8 is onnxruntime's (its prompt graphs on integer GEMM); tvm's kernel computes "
            "every matmul with int8 activations already: leave it out"
        )
    return WeightOnlyFormat(params.bits, params.block_size, params.head_bits, 0, params.layers_8bit, params.layers)


@dataclasses.dataclass
class WeightPacking:
    """What the pipeline's packing step (``steps.pack_weights``) reads, and the arrays it packed (``packed``,
    by argument name), which the build stores after the compile."""

    workdir: Path
    weights_file: str
    refs: dict[str, WeightRef]
    fmt: WeightOnlyFormat | None
    fast_math: bool
    packed: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def run(self, mod: Any, target: Any) -> tuple[Any, dict[str, Any]]:
        mod, self.packed, report = pack_weights(
            mod, self.workdir, self.weights_file, self.refs, self.fmt, target, self.fast_math
        )
        return mod, report


def pack_weights(
    mod: Any,
    workdir: Path,
    weights_file: str,
    refs: dict[str, WeightRef],
    fmt: WeightOnlyFormat | None,
    target: Any,
    fast_math: bool = True,
) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    """``mod`` on the packed kernels (weight-only ones where ``fmt`` asks, fp32 panels for the rest), the
    packed arrays by argument name, the reports by rewrite (``fast_math``: the build's, which the kernels
    that compute a graph's activation follow)."""
    from tvm.target import codegen

    from aotforge.targets.tvm.kernels.panel_matmul import few_rows
    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls
    from aotforge.targets.tvm.rewrites.weight_only import weight_only_matmuls

    def read(name: str) -> np.ndarray:
        ref = refs[name]
        with (workdir / weights_file).open("rb") as f:
            f.seek(ref.offset)
            raw = f.read(ref.length)
        return np.frombuffer(raw, dtype=ref.dtype).reshape(ref.shape).astype(np.float32)

    reports: dict[str, Any] = {}
    packed: dict[str, np.ndarray] = {}
    if fmt is not None:
        vnni = bool(codegen.target_has_features("avx512vnni", target))
        mod, packed, report = weight_only_matmuls(mod, read, fmt, vnni, str(target.attrs["mcpu"]))
        labels = _labels(workdir)
        report["weights_taken"] = {f"{labels.get(w, '?')} ({w})": what for w, what in report["weights_taken"].items()}
        reports["weight_only"] = report
    mod, panels, reports["panel_weights"] = panel_matmuls(mod, read, few_rows(str(target.attrs["mcpu"])), fast_math)
    return mod, {**packed, **panels}, reports


def _labels(workdir: Path) -> dict[str, str]:
    """The exporter's name of each weight argument ``w<offset>`` (what the manifest calls a taken weight)."""
    import onnx

    out: dict[str, str] = {}
    for file in (PREFILL_FILE, DECODE_FILE):
        for tensor in onnx.load(str(workdir / file), load_external_data=False).graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                entries = {e.key: e.value for e in tensor.external_data}
                out.setdefault(f"w{int(entries.get('offset', 0))}", tensor.name)
    return out
