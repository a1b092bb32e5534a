"""The ``neuron`` target: the torch program through torch-neuronx / neuronx-cc for Inf2 / Trn.

neuronx-cc has no ONNX frontend, so this target compiles the ``torch.export`` program the
frontend keeps for torch sources and carries the passes over explicitly: sparsity masks onto
the same weights by parameter name, precision as ``--auto-cast``; INT8 QDQ is refused. Neuron
graphs are static, so each dynamic dim becomes a declared set of sizes and every combination
(a *bucket*) is one compiled graph; the runner routes each call to the smallest bucket that fits
(``buckets.py``).
All SDK calls live in :mod:`targets.neuron.sdk`.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx_ir as ir

from aotforge.core.dim_defaults import BATCH, SEQUENCE, dim_kind
from aotforge.core.errors import (
    ArtifactError,
    InputSpecError,
    OptionsError,
    TargetUnavailableError,
    UnsupportedModelError,
)
from aotforge.core.spec import IOSpec, parse_dim_sizes
from aotforge.targets.base import (
    Arrays,
    BuildContext,
    BuiltArtifact,
    CompileResult,
    ProbeResult,
    Target,
    TargetRecord,
    refuse_contrib_ops,
)
from aotforge.targets.neuron import sdk
from aotforge.targets.neuron.buckets import Bucket, actual_sizes, bucket_of, pad_inputs, route, unpad_outputs

#: Precision passes and the ``--auto-cast-type`` each maps to.
_PRECISION = {"fp16": "fp16", "bf16": "bf16"}


class InstanceFamily(enum.StrEnum):
    INF2 = "inf2"
    TRN1 = "trn1"
    TRN2 = "trn2"


@dataclasses.dataclass(frozen=True)
class NeuronOptions:
    """neuronx-cc settings and the static shapes to compile."""

    target: InstanceFamily = InstanceFamily.INF2
    #: neuronx-cc ``--optlevel``: 1 compiles fastest, 3 optimizes most.
    optlevel: int = 2
    #: sizes per dynamic dim, e.g. ``seq=32/64/128``; an unlisted dim gets its opt and max.
    buckets: tuple[str, ...] = ()
    #: dims the model tolerates zero padding on (batch; seq when an attention mask masks it).
    pad_dims: tuple[str, ...] = ()
    max_buckets: int = 16
    #: the Neuron SDK environment's interpreter (its own torch pin); default: the Deep Learning AMI's venv.
    python: str = ""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "target", InstanceFamily(self.target))
        except ValueError:
            valid = ", ".join(f.value for f in InstanceFamily)
            raise OptionsError(f"neuron target {self.target!r} is unknown; use one of {valid}") from None
        if self.optlevel not in (1, 2, 3):
            raise OptionsError(f"neuron optlevel must be 1, 2 or 3, got {self.optlevel}")


def refuse_passes(passes: tuple[str, ...]) -> None:
    """INT8 QDQ has no Neuron path; running it and shipping fp32 would be a silent lie."""
    for name in passes:
        if name.startswith("int8") or "qdq" in name or name.startswith("quant"):
            raise UnsupportedModelError(
                f"neuron cannot honour pass {name!r}: neuronx-cc has no INT8 QDQ path; drop it, or use "
                "--passes fp16 / bf16 (auto-cast) for a reduced-precision Neuron build"
            )
    precision = [p for p in passes if p in _PRECISION]
    if len(precision) > 1:
        raise UnsupportedModelError(f"neuron: passes {', '.join(precision)} conflict; keep one precision pass")


def compiler_args(options: NeuronOptions, passes: tuple[str, ...]) -> list[str]:
    """neuronx-cc flags. ``--auto-cast none`` without a precision pass: the compiler's default
    casts matmuls to bf16, which would change numerics no pass recorded."""
    args = ["--target", options.target.value, "--optlevel", str(options.optlevel)]
    cast = next((_PRECISION[p] for p in passes if p in _PRECISION), None)
    args += ["--auto-cast", "all", "--auto-cast-type", cast] if cast else ["--auto-cast", "none"]
    return args


def plan_buckets(io: IOSpec, options: NeuronOptions) -> tuple[Bucket, ...]:
    """Every combination of per-dim sizes; each dim's largest size must cover its declared max."""
    declared = parse_dim_sizes(options.buckets, io, "neuron")
    per_dim = []
    lows, opts, highs = (io.bound_sizes(w) for w in ("min", "opt", "max"))  # refuses undeclared dims
    for name in io.symbolic_dims():
        lo, hi = lows[name], highs[name]
        sizes = declared.get(name) or sorted({opts[name], hi})
        if sizes[0] < lo or sizes[-1] != hi:
            raise InputSpecError(
                f"neuron buckets for dim {name!r} are {sizes} but its range is {lo}..{hi}: sizes must lie in the "
                f"range and the largest must be {hi}, or inputs up to the max could not run"
            )
        per_dim.append([(name, s) for s in sizes])
    buckets = tuple(Bucket(tuple(combo)) for combo in itertools.product(*per_dim))
    if len(buckets) > options.max_buckets:
        raise OptionsError(
            f"neuron would compile {len(buckets)} buckets (more than max_buckets={options.max_buckets}): "
            "declare fewer sizes with --target-opt buckets=dim=a/b, or raise max_buckets"
        )
    return buckets


def pad_dims_for(io: IOSpec, options: NeuronOptions) -> tuple[str, ...]:
    """``pad_dims`` as given, else the dims padding leaves correct: batches, and masked sequences."""
    if options.pad_dims:
        return options.pad_dims
    masked = {d for s in io.inputs if "mask" in s.name.lower() for d in s.dynamic_dims}
    kinds = {d.name: d.kind or dim_kind(d.name) for d in io.dims}  # hand-made specs may carry no kind
    return tuple(n for n, k in kinds.items() if k == BATCH or (k == SEQUENCE and n in masked))


def check_covered(io: IOSpec, options: NeuronOptions, buckets: tuple[Bucket, ...]) -> None:
    """Refuse a range whose sizes between buckets could not run: only padded dims may fall between."""
    pad_dims = pad_dims_for(io, options)
    for rng in io.dims:
        sizes = sorted({dict(b.sizes)[rng.name] for b in buckets if rng.name in dict(b.sizes)})
        if rng.name not in pad_dims and len(sizes) != rng.max - rng.min + 1:
            raise InputSpecError(
                f"neuron: dim {rng.name!r} ranges {rng.min}..{rng.max} but only buckets {sizes} would run, as it "
                f"is not in pad_dims: add it (--target-opt pad_dims={rng.name}; right for a batch, or a sequence "
                "an attention mask covers), declare a bucket for every size, or narrow --dynamic"
            )


class NeuronTarget(Target):
    name = "neuron"
    options_type = NeuronOptions
    generative_module = "aotforge.targets.neuron.generative"
    compiles_torch_program = True
    build_resources = {"neuron_cores": 1.0}

    def probe(self) -> ProbeResult:
        return sdk.probe()

    def plan(self, model: ir.Model, options: NeuronOptions, ctx: BuildContext) -> None:
        if ctx.torch_program is None:
            raise UnsupportedModelError(
                f"neuron compiles torch programs only (neuronx-cc has no ONNX frontend) and this source is "
                f"{ctx.source_format}: build from the PyTorch module, or pick tensorrt / tvm / onnxruntime"
            )
        # neuronx-cc compiles the torch program: an IR pass emitting ORT contrib ops would be dropped silently.
        refuse_contrib_ops("neuron", model, ctx)
        refuse_passes(ctx.passes)
        check_covered(ctx.io, options, plan_buckets(ctx.io, options))

    def compile(self, model: ir.Model, options: NeuronOptions, ctx: BuildContext, workdir: Path) -> CompileResult:
        self.plan(model, options, ctx)
        found = sdk.probe_to_compile(options.python)
        module = sdk.module_of(ctx.torch_program)
        masked = sdk.carry_sparsity_masks(module, model) if _sparsity_ran(ctx.passes) else []
        args = compiler_args(options, ctx.passes)
        buckets = plan_buckets(ctx.io, options)
        traces = (
            sdk.Trace(module, _example_inputs(ctx.io, bucket), bucket.key, workdir / bucket.file) for bucket in buckets
        )
        versions = sdk.trace_all(found, traces, args)
        info = {
            "instance_family": options.target.value,
            "compiler_args": args,
            "buckets": [{"key": b.key, "sizes": [list(s) for s in b.sizes], "file": b.file} for b in buckets],
            "pad_dims": list(pad_dims_for(ctx.io, options)),
            "shapes": f"{len(buckets)} compiled bucket(s) ({', '.join(b.key for b in buckets)}); a call runs on the "
            f"smallest that holds it, zero-padding only {', '.join(pad_dims_for(ctx.io, options)) or 'no dim'}",
            "sparsity_masked_params": masked,
            **{k.replace("-", "_") + "_version": v for k, v in versions.items()},
        }
        return CompileResult(files=tuple(b.file for b in buckets), target_info=info, toolchain=versions)

    def check_host(self, artifact: BuiltArtifact) -> None:
        check_instance_family(str(artifact.target.info.get("instance_family", "")), sdk.host_instance_type())

    def load(self, artifact_dir: Path, record: TargetRecord, io: IOSpec) -> NeuronRunner:
        probe = sdk.probe()
        if not probe.available:
            raise TargetUnavailableError(probe.reason)
        info = record.info
        check_instance_family(str(info.get("instance_family", "")), sdk.host_instance_type())
        buckets = {bucket_of(b["sizes"]): artifact_dir / b["file"] for b in info["buckets"]}
        return NeuronRunner(io, buckets, tuple(info.get("pad_dims", ())))


def family_of(instance_type: str) -> str:
    """``trn2n.48xlarge`` -> ``trn2``: the networking-optimized ``n`` variants share their family's cores."""
    found = re.match(r"(inf|trn)(\d+)", instance_type)
    return f"{found.group(1)}{found.group(2)}" if found else ""


def check_instance_family(built: str, host_instance_type: str) -> None:
    """Refuse a NEFF compiled for another Neuron family than this host's (``--target`` must match).

    An unknown host type (no ``neuron-ls``) is not refused here: the probe already requires a device.
    """
    host = family_of(host_instance_type)
    if built and host and family_of(built) != host:
        raise ArtifactError(
            f"neuron artifact was compiled for {built} (--target {built}) but this host is {host_instance_type} "
            f"({host}): rebuild with --target-opt target={host}, or run it on an {built} instance"
        )


class NeuronRunner:
    """One loaded graph per bucket; each call goes to the smallest bucket its shapes fit."""

    def __init__(self, io: IOSpec, files: Mapping[Bucket, Path], pad_dims: tuple[str, ...]) -> None:
        self.io, self.pad_dims = io, pad_dims
        # Load every bucket now: a serving host must not pay a load on its first odd-sized request.
        self.graphs = {bucket: sdk.load_traced(path) for bucket, path in files.items()}

    def run(self, inputs: Arrays) -> Arrays:
        sizes = actual_sizes(self.io, inputs)
        bucket = route(tuple(self.graphs), sizes, self.pad_dims)
        outputs = sdk.call(self.graphs[bucket], pad_inputs(self.io, inputs, bucket))
        return unpad_outputs(self.io, outputs, sizes)


def _sparsity_ran(passes: tuple[str, ...]) -> bool:
    return any(p.startswith(("sparsity", "prune")) for p in passes)


def _example_inputs(io: IOSpec, bucket: Bucket) -> list[np.ndarray]:
    shapes = bucket.shapes(io)
    # Integer inputs (token ids) take their range's low end so embedding lookups stay in bounds.
    return [
        np.full(shapes[s.name], s.value_range[0] if s.value_range else 0, dtype=np.dtype(s.dtype)) for s in io.inputs
    ]
