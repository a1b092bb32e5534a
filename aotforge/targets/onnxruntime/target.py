"""The ``onnxruntime`` target: the IR plus ORT's offline-optimized model and session options.

The artifact keeps the session options it was validated with, so a serving host opens the
model exactly as the build did. CUDA / TensorRT execution providers are selectable where the
installed onnxruntime has them; a provider that silently falls back to CPU is refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import onnx_ir as ir

from aotforge.core.errors import (
    CompileError,
    HostMismatchError,
    InputSpecError,
    OptionsError,
    TargetUnavailableError,
    UnsupportedModelError,
    describe,
)
from aotforge.core.runtime_threads import environment_threads
from aotforge.core.spec import IOSpec
from aotforge.targets.base import (
    Arrays,
    BuildContext,
    BuiltArtifact,
    CompileResult,
    ProbeResult,
    Target,
    TargetRecord,
    WeightGrid,
)
from aotforge.targets.huge_pages import huge_pages
from aotforge.targets.onnxruntime.session_io import run_session

OPTIMIZED_MODEL = "model.ort.onnx"
SESSION_FILE = "session.json"

_LEVELS = ("disable", "basic", "extended", "all")


@dataclasses.dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime session settings baked into the artifact."""

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    #: ``extended`` keeps the optimized model portable across CPUs; ``all`` adds layout
    #: transforms specific to this host's ISA.
    optimization_level: str = "extended"
    #: 0: ``OMP_NUM_THREADS`` where it is set (``core.runtime_threads``), else ONNX Runtime's own, a thread a core.
    intra_op_threads: int = 0
    #: How long (microseconds) an idle intra-op thread spins for new work before it sleeps
    #: (``session.intra_op.spin_duration_us``); -1 leaves ONNX Runtime's own spinning, 0 never spins.
    intra_op_spin_us: int = -1
    #: Back the sessions' weights with 2 MiB transparent huge pages once they open (``targets/huge_pages.py``):
    #: a batch-1 decode step streams every weight, and on 4 KiB pages nearly every page is a TLB miss.
    huge_pages: bool = False

    def __post_init__(self) -> None:
        if self.intra_op_spin_us < -1:
            raise OptionsError(
                f"onnxruntime intra_op_spin_us must be microseconds >= 0, or -1 for ONNX Runtime's own spinning; "
                f"got {self.intra_op_spin_us}"
            )


class OrtTarget(Target):
    name = "onnxruntime"
    options_type = OrtOptions
    generative_module = "aotforge.targets.onnxruntime.decoder"
    worker_preload = ("onnxruntime",)
    runs_contrib_ops = True
    #: MatMulNBits: symmetric blocks along K at both widths, rounded as MLAS does.
    weight_grids = {4: WeightGrid(8, mlas=True), 8: WeightGrid(128, mlas=True)}
    runtime_packages = ("onnxruntime",)

    def probe(self) -> ProbeResult:
        try:
            import onnxruntime as ort
        except ImportError:
            return ProbeResult(False, "python package 'onnxruntime' is not installed: pip install onnxruntime")
        return ProbeResult(
            True, details={"version": ort.__version__, "providers": ",".join(ort.get_available_providers())}
        )

    def plan(self, model: ir.Model, options: OrtOptions, ctx: BuildContext) -> None:
        import onnxruntime as ort

        if options.optimization_level not in _LEVELS:
            raise CompileError(
                f"onnxruntime optimization_level {options.optimization_level!r} is unknown; "
                f"use one of {', '.join(_LEVELS)}"
            )
        if "bf16" in ctx.passes and set(options.providers) <= {"CPUExecutionProvider"}:
            # ORT's CPU provider has no bf16 kernels for most ops (e.g. Relu): sessions fail to load.
            raise UnsupportedModelError(
                "onnxruntime's CPUExecutionProvider cannot run pass 'bf16' (no bf16 kernels): "
                "use --passes fp16 or int8 here, or the CUDAExecutionProvider / --target tvm for bf16"
            )
        missing = [p for p in options.providers if p not in ort.get_available_providers()]
        if missing:
            raise TargetUnavailableError(
                f"onnxruntime here has no {', '.join(missing)} "
                f"(available: {', '.join(ort.get_available_providers())}): "
                "install onnxruntime-gpu on a CUDA host, or pick CPUExecutionProvider"
            )

    def compile(self, model: ir.Model, options: OrtOptions, ctx: BuildContext, workdir: Path) -> CompileResult:
        import onnxruntime as ort

        source = workdir / "model.onnx"
        if not source.exists():
            ir.save(model, source)
        sess_options = session_options(options, optimized_path=workdir / OPTIMIZED_MODEL)
        try:
            session = ort.InferenceSession(str(source), sess_options, providers=list(options.providers))
        except Exception as e:  # ORT raises its own untyped errors for unsupported ops
            raise CompileError(
                f"onnxruntime cannot load the IR: {describe(e, last=True)}; check the model's opset and ops"
            ) from e
        _check_providers(session, options.providers)
        settings = dataclasses.asdict(options)
        (workdir / SESSION_FILE).write_text(json.dumps(settings, sort_keys=True, indent=2) + "\n")
        return CompileResult(
            files=(OPTIMIZED_MODEL, SESSION_FILE),
            target_info={
                "device": "cpu" if options.providers == ("CPUExecutionProvider",) else "gpu",
                "options": settings,
                "shapes": "dims stay symbolic in the session: every size in the declared ranges runs as is",
            },
            toolchain={"onnxruntime": ort.__version__},
        )

    def load(self, artifact_dir: Path, record: TargetRecord, io: IOSpec) -> OrtRunner:
        return OrtRunner(artifact_dir / OPTIMIZED_MODEL, stored_options(artifact_dir, record))

    def check_host(self, manifest: BuiltArtifact) -> None:
        """Refuse an artifact from a newer onnxruntime or for execution providers this one lacks.

        The optimized model may hold ops or an opset only the newer onnxruntime has."""
        import onnxruntime as ort

        name, built = f"{manifest.name} v{manifest.version}", str(manifest.toolchain.get("onnxruntime", ""))
        if built and _version(ort.__version__) < _version(built):
            raise HostMismatchError(
                f"{name} was built with onnxruntime {built} for opset {manifest.ir.get('opset')}, this host has "
                f"onnxruntime {ort.__version__}: pip install 'onnxruntime>={built}', or rebuild it here"
            )
        wanted = list(manifest.target.options.get("providers", ()))
        missing = [p for p in wanted if p not in ort.get_available_providers()]
        if missing:
            raise HostMismatchError(
                f"{name} was built with onnxruntime for {', '.join(wanted)}, this host's onnxruntime has only "
                f"{', '.join(ort.get_available_providers())}: install onnxruntime-gpu with CUDA here, or rebuild "
                "with --target-opt providers=CPUExecutionProvider"
            )


def stored_options(artifact_dir: Path, record: TargetRecord) -> OrtOptions:
    """The session settings the artifact was validated with (``session.json``), with the record's thread count:
    a caller that asks for N threads (``aotforge bench --threads N``) sets ``record.options['intra_op_threads']``."""
    settings = json.loads((artifact_dir / SESSION_FILE).read_text())
    settings["providers"] = tuple(settings["providers"])
    if "intra_op_threads" in record.options:
        settings["intra_op_threads"] = int(record.options["intra_op_threads"])
    return OrtOptions(**settings)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


class OrtRunner:
    """An ORT session over the artifact's already-optimized model."""

    def __init__(self, model_path: Path, options: OrtOptions) -> None:
        import onnxruntime as ort

        sess_options = session_options(dataclasses.replace(options, optimization_level="disable"))
        with huge_pages(options.huge_pages) as self.huge_pages:
            self.session = ort.InferenceSession(str(model_path), sess_options, providers=list(options.providers))
        _check_providers(self.session, options.providers)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, inputs: Arrays) -> Arrays:
        try:
            return run_session(self.session, self.output_names, inputs)
        except Exception as e:  # ORT's InvalidArgument / Fail carry the shape mismatch in their text
            raise InputSpecError(f"onnxruntime artifact rejected the inputs: {describe(e, last=True)}") from e


def reference_session(path_or_bytes: str | bytes) -> Any:
    """A plain CPU session over an unmodified ONNX model: the reference for ONNX sources."""
    import onnxruntime as ort

    sess_options = ort.SessionOptions()
    sess_options.intra_op_num_threads = environment_threads()
    sess_options.log_severity_level = 3
    return ort.InferenceSession(path_or_bytes, sess_options, providers=["CPUExecutionProvider"])


def session_options(options: OrtOptions, optimized_path: Path | None = None) -> Any:
    import onnxruntime as ort

    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    sess_options = ort.SessionOptions()
    sess_options.graph_optimization_level = levels[options.optimization_level]
    sess_options.intra_op_num_threads = options.intra_op_threads or environment_threads()
    sess_options.log_severity_level = 3
    if options.intra_op_spin_us == 0:
        sess_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif options.intra_op_spin_us > 0:
        sess_options.add_session_config_entry("session.intra_op.spin_duration_us", str(options.intra_op_spin_us))
    if optimized_path is not None:
        sess_options.optimized_model_filepath = str(optimized_path)
    return sess_options


def _check_providers(session: Any, wanted: tuple[str, ...]) -> None:
    # onnxruntime-gpu silently falls back to CPU when CUDA is missing: only the session knows.
    got = session.get_providers()
    lost = [p for p in wanted if p not in got]
    if lost:
        raise TargetUnavailableError(
            f"onnxruntime fell back from {', '.join(lost)} to {', '.join(got)}: this host lacks the CUDA/TensorRT "
            "libraries those providers need; install them or pick CPUExecutionProvider"
        )
