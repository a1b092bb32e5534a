"""The ``tvm`` target: ONNX -> Relax -> a shared library for a CPU through LLVM.

The host CPU is detected; ``mcpu`` / ``mtriple`` cross-compile for another CPU and are
recorded. The CPU schedules need static shapes, so the declared ranges are covered by shape
buckets (``targets.tvm.buckets``: one Relax function per bucket in one ``lib.so``, routed at run
time by splitting batches and padding masked sequences); ``dynamic=true`` keeps named dims
symbolic. ``tune_trials`` / ``tune_minutes`` turn on a MetaSchedule search
(``targets.tvm.tuning.tune``) whose results are kept in the build cache (``<--cache-dir>/tvm-tuning``)
or in ``tuning_db``, and re-used by every later build there.
"""

from __future__ import annotations

import dataclasses
import platform
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.core.errors import (
    AotforgeError,
    ArtifactError,
    CompileError,
    InputSpecError,
    UnsupportedModelError,
    describe,
)
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
    refuse_contrib_ops,
)
from aotforge.targets.tvm.bucket_runner import run_bucketed
from aotforge.targets.tvm.buckets import BucketPlan, plan_buckets
from aotforge.targets.tvm.host import check_tvm_host, grant_amx, host_cpu, isa_features
from aotforge.targets.tvm.options import TUNING_DIR, TvmOptions, check_tunable, target_dict, tune_settings
from aotforge.targets.tvm.threads import fix_thread_count

LIBRARY = "lib.so"


class TvmTarget(Target):
    name = "tvm"
    options_type = TvmOptions
    generative_module = "aotforge.targets.tvm.decoder.engine"
    #: Its weight-only kernels: int4 in blocks with float16 scales, int8 one scale per output channel.
    weight_grids = {4: WeightGrid(8, float16_scales=True), 8: WeightGrid(127, blocked=False)}
    worker_preload = ("tvm", "tvm.relax.frontend.onnx", "aotforge.targets.tvm.pipeline")
    runtime_packages = ("apache-tvm",)

    def probe(self) -> ProbeResult:
        try:
            import tvm
        except ImportError as e:
            return ProbeResult(
                False, f"python package 'apache-tvm' cannot be imported ({e}): pip install apache-tvm==0.27.0.post1"
            )
        return ProbeResult(True, details={"version": tvm.__version__, "host_cpu": host_cpu()})

    def plan(self, model: ir.Model, options: TvmOptions, ctx: BuildContext) -> None:
        # QDQ and bf16 both import through the Relax ONNX frontend (checked), so only contrib ops are refused.
        refuse_contrib_ops("tvm", model, ctx)
        arch = options.mtriple.split("-")[0]
        if arch and arch != platform.machine() and not options.cc:
            raise CompileError(
                f"tvm: mtriple {options.mtriple!r} targets {arch} but this host is {platform.machine()}: "
                "give a cross compiler with --target-opt cc=<arch>-linux-gnu-gcc"
            )
        if options.tuning:
            check_tunable(options)
        if not options.dynamic:  # refuse a range no bucket plan covers before anything compiles
            plan_buckets(ctx.io, options.buckets, options.max_buckets)
        check_coverage(model, ctx.io, options)

    def coverage(self, model: ir.Model, io: IOSpec, options: TvmOptions) -> dict[str, Any]:
        return dict(coverage_of(model, io, options).to_info())

    def with_cache_dir(self, options: TvmOptions, cache_dir: Path) -> TvmOptions:
        """Keep the tuning store in the build cache unless one was given (entries are keyed by target)."""
        if not options.tuning or options.tuning_db:
            return options
        return dataclasses.replace(options, tuning_db=str(cache_dir / TUNING_DIR))

    def compile(self, model: ir.Model, options: TvmOptions, ctx: BuildContext, workdir: Path) -> CompileResult:
        import tvm

        from aotforge.targets.tvm.pipeline import compile_relax

        plan = None if options.dynamic else plan_buckets(ctx.io, options.buckets, options.max_buckets)
        prepared: dict[str, Any] = {}  # ops imported as they are, rewritten by the import steps, refused
        mod = _import_dynamic(model, ctx.io) if plan is None else _import_buckets(model, ctx.io, plan, prepared)
        target = tvm.target.Target(target_dict(options))
        try:
            with tempfile.TemporaryDirectory(prefix="aotforge-tune-") as tune_dir:
                tuning = tune_settings(options, Path(tune_dir))
                executable, report = compile_relax(mod, target, fast_math=options.fast_math, tuning=tuning)
            kwargs = {"cc": options.cc} if options.cc else {}
            executable.export_library(str(workdir / LIBRARY), **kwargs)
        except AotforgeError:
            raise
        except Exception as e:
            raise CompileError(f"tvm failed to compile for {target_dict(options)}: {describe(e, last=True)}") from e
        info = {
            "device": "cpu",
            "arch": target_dict(options)["mcpu"],
            "target": target_dict(options),
            "bound_shapes": {} if plan is None else dict(plan.buckets[0].sizes),
            # Which shapes run and how: per dim split / pad / exact, and every compiled bucket.
            "shape_buckets": None if plan is None else plan.to_info(),
            "pipeline": report,
            "coverage": prepared,
            # lib.so is native code for this OS and the triple's arch: the loader checks both.
            "platform": {"system": platform.system(), "machine": target_dict(options)["mtriple"].split("-")[0]},
            "cpu_features": isa_features(target_dict(options)),
        }
        return CompileResult(files=(LIBRARY,), target_info=info, toolchain={"tvm": tvm.__version__})

    def load(self, artifact_dir: Path, record: TargetRecord, io: IOSpec) -> TvmRunner:
        built = record.info["target"]
        arch = built["mtriple"].split("-")[0]
        if arch != platform.machine():
            raise ArtifactError(
                f"tvm artifact was built for {built['mtriple']}, this host is {platform.machine()}: "
                "run it on a matching host or rebuild without mtriple"
            )
        grant_amx(record.info.get("cpu_features", ()))  # before any of its AMX kernels runs
        buckets = record.info.get("shape_buckets")
        return TvmRunner(artifact_dir / LIBRARY, io, BucketPlan.from_info(buckets) if buckets else None)

    def check_host(self, artifact: BuiltArtifact) -> None:
        """Refuse a lib.so from another tvm major.minor, or compiled for CPU features this host lacks."""
        check_tvm_host(artifact)


class TvmRunner:
    """A Relax VM over the artifact's shared library, routing each call to its shape bucket."""

    def __init__(self, library: Path, io: IOSpec, plan: BucketPlan | None) -> None:
        import tvm
        from tvm import relax

        fix_thread_count()  # before any kernel runs: each parallel launch would read sysfs otherwise
        self._tvm = tvm
        self._vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
        self.io, self.plan = io, plan
        self.output_names = [o.name for o in io.outputs]

    def run(self, inputs: Arrays) -> Arrays:
        if self.plan is not None:  # checks shapes against the declared ranges first
            return run_bucketed(self.plan, self.io, inputs, self._call)
        # A symbolic build: the same one error for a shape outside the declared ranges.
        self.io.sizes_of({k: np.shape(v) for k, v in inputs.items()}, who="tvm artifact")
        values = self._call("main", [inputs[s.name] for s in self.io.inputs])
        return dict(zip(self.output_names, values, strict=True))

    def _call(self, function: str, arrays: Any) -> list[np.ndarray]:
        # np.require, not np.ascontiguousarray: that one turns a 0-d input (a Clip bound, Trilu's k) into 1-d.
        # float8 / 4-bit / 2-bit arrays (ml_dtypes, one value a byte) cross as their bytes: importable/narrow.py.
        arrays = [_as_bytes(np.asarray(v)) for v in arrays]
        tensors = [self._tvm.runtime.tensor(np.require(v, requirements="C")) for v in arrays]
        try:
            result = self._vm[function](*tensors)
        except Exception as e:
            raise InputSpecError(f"tvm artifact rejected the inputs: {describe(e, last=True)}") from e
        values = [result] if hasattr(result, "numpy") else list(result)
        return [_from_bytes(v.numpy(), spec.dtype) for v, spec in zip(values, self.io.outputs, strict=False)]


def _as_bytes(array: np.ndarray) -> np.ndarray:
    if array.dtype.type.__module__.split(".")[0] == "ml_dtypes" and array.dtype.itemsize == 1:
        return array.view(np.uint8)
    return array


def _from_bytes(array: np.ndarray, dtype: str) -> np.ndarray:
    if array.dtype == np.uint8 and dtype != "uint8":
        import ml_dtypes

        kind = getattr(ml_dtypes, dtype, None)
        if kind is not None and np.dtype(kind).itemsize == 1:
            return array.view(kind)
    return array


def coverage_of(model: ir.Model, io: IOSpec, options: TvmOptions) -> Any:
    """What tvm's importer takes of ``model`` as built with ``options`` (the first bucket's shapes)."""
    from aotforge.targets.tvm.importable.coverage import check

    if options.dynamic:
        return check(model, {s.name: list(s.shape) for s in io.inputs})
    bucket = plan_buckets(io, options.buckets, options.max_buckets).buckets[0]
    return check(model, {s.name: list(s.bind(dict(bucket.sizes))) for s in io.inputs})


def check_coverage(model: ir.Model, io: IOSpec, options: TvmOptions) -> None:
    """One error naming every node tvm cannot take, in seconds, before any compile."""
    refused = coverage_of(model, io, options).refused
    if refused:
        lines = "\n".join(f"  {r}" for r in refused)
        raise UnsupportedModelError(
            f"tvm cannot import {len(refused)} node(s) of the model:\n{lines}\ntry --target onnxruntime"
        )


def _import_buckets(model: ir.Model, io: IOSpec, plan: BucketPlan, report: dict[str, Any]) -> Any:
    """One Relax module holding a static-shape function per bucket (named as the plan says)."""
    from aotforge.targets.tvm.bucket_module import merge_buckets

    imports = []
    for bucket in plan.buckets:
        shapes = {s.name: list(s.bind(dict(bucket.sizes))) for s in io.inputs}
        imports.append((bucket.function, _from_onnx(_static_proto(model, shapes, report), shapes, io)))
    return imports[0][1] if len(imports) == 1 else merge_buckets(imports)


def _import_dynamic(model: ir.Model, io: IOSpec) -> Any:
    import tvm

    # The importer wants one TIR variable per named dim, not its name.
    dims = {d: tvm.tirx.Var(d, "int64") for d in io.symbolic_dims()}
    shapes = {s.name: [dims[d] if isinstance(d, str) else d for d in s.shape] for s in io.inputs}
    return _from_onnx(ir.serde.serialize_model(model), shapes, io)


def _from_onnx(proto: Any, shapes: Mapping[str, list[Any]], io: IOSpec) -> Any:
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.targets.tvm.importable.narrow import storage_dtype

    try:
        # float8 / 4-bit inputs cross as their bytes (importable/narrow.py).
        dtypes = {s.name: storage_dtype(s.dtype) for s in io.inputs}
        return from_onnx(proto, shape_dict=dict(shapes), dtype_dict=dtypes)
    except Exception as e:  # the Relax ONNX importer raises bare errors for unsupported ops
        raise UnsupportedModelError(
            f"tvm cannot import the IR: {describe(e, last=True)}; try --target onnxruntime"
        ) from e


def _static_proto(model: ir.Model, shapes: Mapping[str, list[Any]], report: dict[str, Any]) -> Any:
    """The IR with input dims bound, shape arithmetic folded away, and legalized for the importer.

    The Relax ONNX importer mishandles ``Shape -> Gather -> Reshape`` chains on scalars and takes
    many ``axes`` / ``shape`` inputs only as constants; once every shape is static, onnxscript's
    optimizer turns them into constants (``targets.tvm.importable``, which also expands function ops).
    """
    from aotforge.targets.tvm.importable import prepare
    from aotforge.targets.tvm.importable.coverage import of_prepared

    proto, steps = prepare(model, shapes)
    if not report:  # the first bucket's: the manifest's coverage report
        report.update(of_prepared(model, proto, steps).to_info())
    return proto
