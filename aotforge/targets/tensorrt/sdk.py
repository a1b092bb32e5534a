"""Every call into the ``tensorrt`` Python API, kept in one thin module (TensorRT 10 and 11).

Nothing here runs without TensorRT and a GPU; :mod:`targets.tensorrt.target` decides what to
build and checks compatibility before anything in this module is called. Device buffers are
torch CUDA tensors: the thinnest way to own GPU memory from Python that a serving host with a
CUDA torch already has.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aotforge.core.errors import CompileError, TargetUnavailableError
from aotforge.targets.base import ProbeResult
from aotforge.targets.tensorrt.plan import TrtBuildPlan

_HW_LEVELS = {
    "none": "NONE",
    "ampere_plus": "AMPERE_PLUS",
    "same_compute_capability": "SAME_COMPUTE_CAPABILITY",
}


@dataclasses.dataclass(frozen=True)
class EngineBuild:
    engine: bytes
    timing_cache: bytes
    layers_json: str
    version: str
    #: INFO lines TensorRT logged while building that the layer report reads ("(Sparsity) ...").
    build_log: tuple[str, ...] = ()


def version() -> str:
    import tensorrt as trt

    return str(trt.__version__)


def query_gpu() -> dict[str, str] | None:
    """Name and compute capability of GPU 0 from nvidia-smi, or None without a working driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[0] if out.strip() else ""
    name, _, cc = first.rpartition(",")
    return {"name": name.strip(), "compute_capability": cc.strip()} if name else None


def probe_host() -> ProbeResult:
    """Each missing piece by name; never raises, so ``aotforge targets`` can always list it."""
    missing, details = [], {}
    try:
        import tensorrt

        details["version"] = str(tensorrt.__version__)
    except Exception as e:  # noqa: BLE001 - bindings raise ImportError/OSError without libnvinfer; probe never raises
        missing.append(f"python package 'tensorrt' ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    # A working import has loaded libnvinfer already (pip wheels keep it off the linker path,
    # so find_library would miss it); only look for it to say why the import failed.
    if missing and not any(ctypes.util.find_library(n) for n in ("nvinfer", "nvinfer_11", "nvinfer_10")):
        missing.append("libnvinfer (TensorRT's library, from NVIDIA's apt/pip index or a TensorRT container)")
    gpu = query_gpu()
    if gpu:
        details.update(gpu_name=gpu["name"], compute_capability=gpu["compute_capability"])
    elif Path("/proc/driver/nvidia/version").exists():
        missing.append("a working GPU: the NVIDIA driver is loaded but nvidia-smi reports no device")
    else:
        missing.append("an NVIDIA GPU and driver (no nvidia-smi, no /proc/driver/nvidia)")
    cuda_torch = _cuda_torch()
    if cuda_torch:
        missing.append(cuda_torch)
    if missing:
        reason = "tensorrt needs, and this host lacks: " + "; ".join(missing)
        return ProbeResult(False, reason, can_compile=False, details=details)
    return ProbeResult(True, details=details)


def _cuda_torch() -> str:
    """Why torch cannot hand the runner CUDA memory, or "" when it can (the runner's buffers are torch tensors)."""
    import torch

    if torch.version.cuda is None:
        return f"a CUDA build of torch (this one, {torch.__version__}, is CPU-only: install torch from a CUDA index)"
    if not torch.cuda.is_available():
        return f"a GPU torch {torch.__version__} (CUDA {torch.version.cuda}) can see: torch.cuda.is_available() False"
    return ""


def _logger(capture: list[str] | None = None) -> Any:
    """WARNING and worse to stderr, as ``trt.Logger(WARNING)`` prints them; with ``capture``, the
    INFO ``(Sparsity)`` lines too, which that logger hides and the layer report needs."""
    import tensorrt as trt

    class _Logger(trt.ILogger):  # type: ignore[misc]  # the subclassing TensorRT's docs show (pyCoreDoc.h)
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            # TensorRT calls this from C++ and it must not raise (Polygraphy's CustomTrtLogger).
            if severity <= trt.ILogger.WARNING:
                print(f"[TensorRT] {severity.name}: {msg}", file=sys.stderr)
            elif capture is not None and severity == trt.ILogger.INFO and "(Sparsity)" in msg:
                capture.append(msg)

    return _Logger()


def build_engine(
    onnx_path: Path, plan: TrtBuildPlan, timing_cache: bytes, all_reduces: Sequence[str] = (), ranks: int = 1
) -> EngineBuild:
    """Parse the ONNX file, configure the builder from ``plan`` and serialize the engine. ``all_reduces``: the
    identity nodes of a tensor-parallel rank graph that stand for its all-reduces over ``ranks`` ranks
    (``rank_graphs.marked_graph``)."""
    import tensorrt as trt

    captured: list[str] = []
    logger = _logger(captured)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags())
    parser = trt.OnnxParser(network, logger)
    # parse_from_file resolves external-data weights relative to the model file.
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i).desc()) for i in range(parser.num_errors))
        raise CompileError(f"tensorrt's ONNX parser rejected the IR: {errors}; simplify or replace those ops")
    if all_reduces:
        _dist_collectives(network, all_reduces, ranks)
    config = _builder_config(builder, plan)
    preview = getattr(trt.PreviewFeature, "MULTIDEVICE_RUNTIME_10_16", None)
    if all_reduces and preview is not None:  # a preview in TensorRT 10.16, on by default from 11
        config.set_preview_feature(preview, True)
    # A cache from another device is refused (returns False): start a fresh one instead.
    if not config.set_timing_cache(config.create_timing_cache(timing_cache), ignore_mismatch=False):
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise CompileError("tensorrt failed to build the engine (see its log above): check the workspace_mb limit")
    engine_bytes = bytes(serialized)
    return EngineBuild(
        engine=engine_bytes,
        timing_cache=bytes(config.get_timing_cache().serialize()),
        layers_json=_inspect(engine_bytes, logger),
        version=str(trt.__version__),
        build_log=tuple(captured),
    )


def _dist_collectives(network: Any, names: Sequence[str], ranks: int) -> None:
    """Feed each identity layer named in ``names`` from an all-reduce (the sum over ``ranks`` ranks, NCCL inside the
    engine): ``add_dist_collective(input, ALL_REDUCE, SUM, root -1, groups [] = every rank)`` and ``num_ranks``, as
    TensorRT's multi-device guide sets up a ``DistCollective`` layer."""
    import tensorrt as trt

    add = getattr(network, "add_dist_collective", None)
    if add is None:
        raise CompileError(
            f"tensorrt {trt.__version__} has no DistCollective layer (INetworkDefinition.add_dist_collective), which "
            "tensor-parallel engines reduce with: install TensorRT 10.16 or later (11 for it out of preview)"
        )
    wanted, found = set(names), set()
    for i in range(network.num_layers):  # the layers added below come after these: never visited
        layer = network.get_layer(i)
        if layer.name not in wanted or layer.type != trt.LayerType.IDENTITY:
            continue
        collective = add(layer.get_input(0), trt.CollectiveOperation.ALL_REDUCE, trt.ReduceOperation.SUM, -1, [])
        collective.num_ranks = ranks
        collective.name = f"{layer.name}.dist_collective"
        layer.set_input(0, collective.get_output(0))
        found.add(layer.name)
    if wanted - found:
        missing = ", ".join(sorted(wanted - found))
        raise CompileError(
            f"tensorrt's ONNX parser made no identity layer of the rank graph's all-reduce nodes {missing}: this "
            "TensorRT's parser is not supported for tensor-parallel engines"
        )


def nccl_unique_id() -> bytes:
    """A new NCCL unique id (nccl4py's ``nccl.core``): one rank makes it, every rank joins the communicator with it."""
    core = _nccl()
    return bytes(core.get_unique_id().as_bytes)


def nccl_communicator(unique_id: bytes, rank: int, ranks: int) -> Any:
    """This process's NCCL communicator of ``ranks`` ranks on the current CUDA device (every rank calls it at once)."""
    core = _nccl()
    return core.Communicator.init(nranks=ranks, rank=rank, unique_id=core.UniqueId.from_bytes(unique_id))


def _nccl() -> Any:
    try:
        import nccl.core as core  # nccl4py
    except ImportError as e:
        raise TargetUnavailableError(
            f"tensor-parallel tensorrt engines join their ranks through NCCL, and nccl4py is missing ({e}): "
            "pip install nccl4py"
        ) from e
    return core


def communicator_capsule(comm: Any) -> Any:
    """``comm`` (nccl4py) as the ``ncclComm_t`` capsule ``IExecutionContext.set_communicator`` takes."""
    import ctypes

    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.c_void_p(comm.ptr), b"ncclComm_t", None)


def combine_timing_caches(built: bytes, on_disk: bytes) -> bytes:
    """TensorRT's own merge of two serialized timing caches (Polygraphy's loader does the same)."""
    import tensorrt as trt

    config = trt.Builder(_logger()).create_builder_config()
    cache = config.create_timing_cache(built)
    # ignore_mismatch: a cache from another device or version is skipped, not an error.
    if not cache.combine(config.create_timing_cache(on_disk), ignore_mismatch=True):
        print("[aotforge] tensorrt could not combine the timing cache on disk; keeping this build's", file=sys.stderr)
    return bytes(cache.serialize())


def _network_flags() -> int:
    import tensorrt as trt

    # TensorRT 10 needs STRONGLY_TYPED to honour the IR's fp16 / Q/DQ types; 11 is always
    # strongly typed and may not have the flag any more.
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def _builder_config(builder: Any, plan: TrtBuildPlan) -> Any:
    import tensorrt as trt

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes)
    config.builder_optimization_level = plan.optimization_level
    config.hardware_compatibility_level = getattr(
        trt.HardwareCompatibilityLevel, _HW_LEVELS[plan.hardware_compatibility]
    )
    # DETAILED keeps per-layer tactic and type names for the engine inspector report.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    for name in plan.flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    # TF32 is on by default and would loosen fp32 layers against the fp32 validation; only on when asked.
    if "TF32" not in plan.flags and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    profile = builder.create_optimization_profile()
    for p in plan.profiles:
        profile.set_shape(p.input, p.min, p.opt, p.max)
    config.add_optimization_profile(profile)
    return config


def _inspect(engine_bytes: bytes, logger: Any) -> str:
    import tensorrt as trt

    runtime = trt.Runtime(logger)
    runtime.engine_host_code_allowed = True  # our own engine, just built
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    inspector = engine.create_engine_inspector()
    return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


def runner(engine_bytes: bytes, *, allow_host_code: bool, cuda_graphs: bool) -> Any:
    from aotforge.targets.tensorrt.runner import TrtRunner

    return TrtRunner(engine_bytes, logger=_logger(), allow_host_code=allow_host_code, cuda_graphs=cuda_graphs)


def step_engine(
    prefill_bytes: bytes, decode_bytes: bytes, spec: Any, *, allow_host_code: bool, communicator: Any = None
) -> Any:
    """The generative step engine over the prefill and decode engines (``targets.tensorrt.generative``);
    ``communicator``: a tensor-parallel rank's NCCL communicator (:func:`communicator_capsule`), set on each context."""
    from aotforge.targets.tensorrt.step_engine import TrtStepEngine

    return TrtStepEngine(
        prefill_bytes, decode_bytes, spec, logger=_logger(), allow_host_code=allow_host_code, communicator=communicator
    )
