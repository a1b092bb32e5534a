"""The ``tensorrt`` target: the IR through TensorRT's ONNX parser into a serialized engine.

Everything here is plain Python and runs on any host: options, optimization profiles from the
input spec, builder flags from the passes that ran and the probe (the engine/host compatibility
check is ``compat.py``). Every ``tensorrt`` call lives in :mod:`targets.tensorrt.sdk`, imported
only when building or loading. Networks are built strongly typed (the only mode TensorRT 11 has), so precision comes
from the IR the passes wrote (fp16 casts, explicit Q/DQ), never from builder flags.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.core.errors import (
    InputSpecError,
    OptionsError,
    TargetUnavailableError,
    UnsupportedModelError,
)
from aotforge.core.spec import IOSpec
from aotforge.targets.base import (
    BuildContext,
    CompileResult,
    ProbeResult,
    Runner,
    Target,
    TargetRecord,
    refuse_contrib_ops,
)
from aotforge.targets.tensorrt.compat import HardwareCompat, check_engine_compat
from aotforge.targets.tensorrt.plan import Profile, TrtBuildPlan
from aotforge.targets.tensorrt.report import summarize_layers
from aotforge.targets.tensorrt.sdk import probe_host, query_gpu
from aotforge.targets.tensorrt.timing_cache import merge_into

ENGINE_FILE = "model.engine"
LAYER_REPORT = "layers.json"
SPARSE_PASS = "sparsity24"


@dataclasses.dataclass(frozen=True)
class TensorRTOptions:
    """TensorRT builder settings; the engine records them and the loader checks them."""

    workspace_mb: int = 4096
    #: 0-5; 3 is TensorRT's default, 5 searches longest for the fastest tactics.
    builder_optimization_level: int = 3
    hardware_compatibility: HardwareCompat = HardwareCompat.NONE
    #: lets a later TensorRT runtime load the engine (it embeds the lean runtime, slightly slower).
    version_compatible: bool = False
    #: a timing cache file reused across builds; created if missing, updated after each build.
    timing_cache: str = ""
    #: capture one CUDA graph per input shape and replay it (trtexec's default); false runs plain enqueues.
    cuda_graphs: bool = True
    #: allow TF32 tactics for fp32 layers (TensorRT's default; off here so fp32 validates as fp32).
    tf32: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "hardware_compatibility", HardwareCompat(self.hardware_compatibility))
        except ValueError:
            valid = ", ".join(h.value for h in HardwareCompat)
            raise OptionsError(
                f"tensorrt hardware_compatibility {self.hardware_compatibility!r} is unknown; use one of {valid}"
            ) from None
        if not 0 <= self.builder_optimization_level <= 5:
            raise OptionsError(
                f"tensorrt builder_optimization_level must be 0-5, got {self.builder_optimization_level}"
            )
        if self.workspace_mb <= 0:
            raise OptionsError(f"tensorrt workspace_mb must be positive, got {self.workspace_mb}")


def plan_profiles(io: IOSpec) -> tuple[Profile, ...]:
    """min/opt/max shapes per input from the named dims' declared ranges.

    The ranges are the build's resolved ones (``--dynamic`` or ``core.dim_defaults``), the same
    that validation and every other target use; an undeclared dim is refused, never pinned to 1.
    """
    ranges = {which: io.bound_sizes(which) for which in ("min", "opt", "max")}
    profiles = []
    for spec in io.inputs:
        bad = [d for d in spec.shape if isinstance(d, int) and d < 1]
        if bad:
            raise InputSpecError(
                f"tensorrt: input {spec.name!r} has fixed dim {bad[0]} in shape {list(spec.shape)}; "
                "name it as a dynamic dim (e.g. --dynamic batch=1:32) or give its size"
            )
        lo, mid, hi = (spec.bind(ranges[w]) for w in ("min", "opt", "max"))
        _check_profile(spec.name, lo, mid, hi)
        profiles.append(Profile(spec.name, lo, mid, hi))
    return tuple(profiles)


def _check_profile(name: str, lo: tuple[int, ...], mid: tuple[int, ...], hi: tuple[int, ...]) -> None:
    # DimRange already orders its values; this guards hand-built specs, since TensorRT's own
    # error for a bad profile names neither the input nor the dim.
    for axis, (a, b, c) in enumerate(zip(lo, mid, hi, strict=True)):
        if not 1 <= a <= b <= c:
            raise InputSpecError(
                f"tensorrt profile for input {name!r} dim {axis} needs 1 <= min <= opt <= max, got "
                f"{a}, {b}, {c}: fix the --dynamic range"
            )


def check_graph_inputs(model: ir.Model, io: IOSpec) -> None:
    """Refuse a spec the IR cannot satisfy: TensorRT would reject the profile with less detail."""
    specs = {s.name: s for s in io.inputs}
    for value in model.graph.inputs:
        spec = specs.get(str(value.name))
        if spec is None:
            raise InputSpecError(f"tensorrt: the IR has input {value.name!r} that the input spec does not describe")
        if value.shape is None:
            continue
        dims = list(value.shape)
        if len(dims) != len(spec.shape):
            raise InputSpecError(
                f"tensorrt: input {spec.name!r} has rank {len(dims)} in the IR but {len(spec.shape)} in the spec"
            )
        for axis, (graph_dim, spec_dim) in enumerate(zip(dims, spec.shape, strict=True)):
            if isinstance(graph_dim, int) and graph_dim != spec_dim:
                raise InputSpecError(
                    f"tensorrt: input {spec.name!r} dim {axis} is fixed to {graph_dim} in the IR but the spec says "
                    f"{spec_dim!r}: export the model with that dim dynamic, or drop it from --dynamic"
                )


def builder_flags(options: TensorRTOptions, passes: tuple[str, ...]) -> tuple[str, ...]:
    """``trt.BuilderFlag`` names to set. No precision flags: the network is strongly typed."""
    flags = []
    if SPARSE_PASS in passes:
        # Without this flag TensorRT ignores 2:4 weights and the pass would gain nothing.
        flags.append("SPARSE_WEIGHTS")
    if options.version_compatible:
        flags.append("VERSION_COMPATIBLE")
    if options.tf32:
        flags.append("TF32")
    return tuple(flags)


def build_plan(options: TensorRTOptions, ctx: BuildContext) -> TrtBuildPlan:
    return TrtBuildPlan(
        profiles=plan_profiles(ctx.io),
        flags=builder_flags(options, ctx.passes),
        workspace_bytes=options.workspace_mb << 20,
        optimization_level=options.builder_optimization_level,
        hardware_compatibility=options.hardware_compatibility.value,
    )


#: The int8 pass's defaults for this target: TensorRT's Q/DQ are signed int8 with zero point 0
#: and bias stays float (the pass's uint8 activations and int32 bias suit ONNX Runtime on x86).
PASS_DEFAULTS = {"int8": {"activations": "int8", "symmetric": True, "quantize_bias": False}}


def check_qdq(model: ir.Model) -> None:
    """Refuse Q/DQ TensorRT cannot build: a zero point that is not int8 / fp8 or not all zeros."""
    for node in model.graph.all_nodes():
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.inputs) < 3:
            continue
        zero = node.inputs[2]
        if zero is None:
            continue
        const = zero.const_value
        dtype = zero.dtype.name if zero.dtype is not None else "unknown"
        nonzero = const is not None and bool(np.any(const.numpy().astype(np.float64) != 0))
        if dtype not in ("INT8", "FLOAT8E4M3FN") or nonzero or const is None:
            raise UnsupportedModelError(
                f"tensorrt: {node.op_type} {node.name!r} has a {dtype.lower()} zero point"
                f"{' that is not 0' if nonzero else ''}; TensorRT takes symmetric int8 Q/DQ only: "
                "build with --pass-opt int8.activations=int8 --pass-opt int8.symmetric=true "
                "--pass-opt int8.quantize_bias=false (the defaults for --target tensorrt)"
            )


def prepare_onnx(model: ir.Model, workdir: Path) -> Path:
    """Write the IR the parser reads and check it: the parser's own errors are far vaguer."""
    import onnx

    check_qdq(model)
    path = workdir / "model.onnx"
    if not path.exists():
        ir.save(model, path)
    try:
        # The path form handles external data and models over 2 GB.
        onnx.checker.check_model(str(path), full_check=False)
    except onnx.checker.ValidationError as e:
        raise InputSpecError(f"tensorrt: the IR fails onnx.checker ({e}); check the passes that ran") from e
    return path


class TensorRTTarget(Target):
    name = "tensorrt"
    options_type = TensorRTOptions
    generative_module = "aotforge.targets.tensorrt.generative"
    pass_defaults = PASS_DEFAULTS
    build_resources = {"GPU": 1.0}

    def probe(self) -> ProbeResult:
        return probe_host()

    def plan(self, model: ir.Model, options: TensorRTOptions, ctx: BuildContext) -> None:
        # TensorRT's ONNX parser has no com.microsoft ops (fuse-ort, weight-only's MatMulNBits).
        refuse_contrib_ops("tensorrt", model, ctx)
        check_graph_inputs(model, ctx.io)
        build_plan(options, ctx)

    def with_cache_dir(self, options: TensorRTOptions, cache_dir: Path) -> TensorRTOptions:
        """Keep the timing cache in the build cache unless one was given: one file per TensorRT
        version and compute capability, since a cache from another GPU or version does not apply."""
        if options.timing_cache:
            return options
        d = probe_host().details
        name = f"tensorrt-{d.get('version', 'unknown')}-cc{d.get('compute_capability', 'unknown')}.timing"
        return dataclasses.replace(options, timing_cache=str(cache_dir / "timing" / name))

    def bundle_plan(self, model: ir.Model, options: TensorRTOptions, ctx: BuildContext) -> dict[str, Any]:
        """The builder plan (profiles, flags, limits) a --prepare-only bundle carries, as JSON values."""
        self.plan(model, options, ctx)
        check_qdq(model)
        plan: dict[str, Any] = json.loads(json.dumps(build_plan(options, ctx).to_dict()))
        return plan

    def compile(self, model: ir.Model, options: TensorRTOptions, ctx: BuildContext, workdir: Path) -> CompileResult:
        from aotforge.targets.tensorrt import sdk

        self.plan(model, options, ctx)
        _require(probe_host())
        plan = build_plan(options, ctx)
        cache_path = Path(options.timing_cache) if options.timing_cache else None
        cache = cache_path.read_bytes() if cache_path and cache_path.exists() else b""
        built = sdk.build_engine(prepare_onnx(model, workdir), plan, cache)
        (workdir / ENGINE_FILE).write_bytes(built.engine)
        report = summarize_layers(
            built.layers_json, sparse_requested="SPARSE_WEIGHTS" in plan.flags, log_lines=built.build_log
        )
        (workdir / LAYER_REPORT).write_text(json.dumps(report, sort_keys=True, indent=2) + "\n")
        # Merged with what other builds wrote meanwhile, under a lock (timing_cache.py).
        merged = merge_into(cache_path, built.timing_cache, sdk.combine_timing_caches) if cache_path else b""
        gpu = query_gpu() or {}
        info = {
            "tensorrt_version": built.version,
            "gpu_name": gpu.get("name", ""),
            "compute_capability": gpu.get("compute_capability", ""),
            "hardware_compatibility": plan.hardware_compatibility,
            "version_compatible": options.version_compatible,
            "cuda_graphs": options.cuda_graphs,
            "plan": plan.to_dict(),
            "shapes": "one optimization profile whose min / opt / max are the declared ranges: every size in them runs",
            "layers": {k: v for k, v in report.items() if k not in ("per_layer", "io_tensors")},
            "timing_cache_sha256": hashlib.sha256(merged).hexdigest() if cache_path else "",
        }
        return CompileResult(files=(ENGINE_FILE, LAYER_REPORT), target_info=info, toolchain={"tensorrt": built.version})

    def load(self, artifact_dir: Path, record: TargetRecord, io: IOSpec) -> Runner:
        from aotforge.targets.tensorrt import sdk

        _require(probe_host())
        info = record.info
        gpu = query_gpu() or {}
        check_engine_compat(info, sdk.version(), gpu.get("compute_capability", ""))
        engine = (artifact_dir / ENGINE_FILE).read_bytes()
        runner: Runner = sdk.runner(
            engine,
            allow_host_code=bool(info.get("version_compatible")),
            cuda_graphs=bool(info.get("cuda_graphs", True)),
        )
        return runner


def _require(probe: ProbeResult) -> None:
    if not probe.available:
        raise TargetUnavailableError(probe.reason + ": build on an NVIDIA host with TensorRT installed")
