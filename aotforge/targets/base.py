"""The contract every target implements: probe, plan, compile, load, and the optional hooks.

A target is one folder (``targets/<name>/``, or one module for a small one) with one class that
subclasses :class:`Target`. It never imports its vendor SDK at module import time, so
``import aotforge.targets`` works on any host. ``tests/test_target_contract.py`` holds every
target to this contract.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from aotforge.core.decoder import WEIGHTS_FILE, DecoderSpec
from aotforge.core.errors import UnsupportedModelError
from aotforge.core.spec import IOSpec
from aotforge.core.target_record import TargetRecord

if TYPE_CHECKING:  # onnx_ir costs ~0.8 s to import; a direct cache hit reaches this contract without it
    import onnx_ir as ir

__all__ = [
    "Arrays",
    "BuiltArtifact",
    "BuildContext",
    "CompileResult",
    "DecoderInputs",
    "GenerativeBackend",
    "ProbeResult",
    "Runner",
    "ShardRuntime",
    "Target",
    "TargetRecord",
    "WeightGrid",
    "refuse_contrib_ops",
]

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """Whether this host can compile and run for a target; if not, exactly what is missing."""

    available: bool
    reason: str = ""
    can_compile: bool | None = None
    details: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def compiles(self) -> bool:
        return self.available if self.can_compile is None else self.can_compile


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """What ``compile`` wrote into the work dir, and what the manifest records about it."""

    files: tuple[str, ...]
    target_info: Mapping[str, Any]
    toolchain: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a target may know about the build beyond the IR: passed explicitly, never global."""

    io: IOSpec
    passes: tuple[str, ...] = ()
    source_format: str = "onnx"
    #: The passes of ``passes`` whose output holds com.microsoft contrib ops (the compiler knows which).
    contrib_passes: tuple[str, ...] = ()
    torch_program: Any = None
    workdir: Path | None = None


@dataclasses.dataclass(frozen=True)
class DecoderInputs:
    """What a text-generation compile takes besides the staged graphs and the target's options."""

    #: Tokens of the verify graph (speculative decoding, ``GenerativeBackend.speculative``); 0: none staged.
    verify_width: int = 0
    #: Parameters of the passes the backend applies itself while compiling (``GenerativeBackend.compile_passes``).
    passes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: A bundle's prefill / decode torch modules (``graphs_from="torch"``), which the device host traces.
    modules: Mapping[str, Any] | None = None


#: ``(graphs by file name, spec) -> counts by rewrite``: a backend's own rewrites of the exported ONNX graphs
GraphRewrite = Callable[[dict[str, Any], DecoderSpec], dict[str, dict[str, int]]]


@dataclasses.dataclass(frozen=True)
class WeightGrid:
    """How a target's kernels round a weight-only quantized ``[N, K]`` weight at one bit width: what
    quantization-aware training trains through (``compiler.training.fake_quant``)."""

    #: The value of largest magnitude maps to ``-levels`` (symmetric blocks) or to ``levels`` (per channel).
    levels: int
    #: A scale per block along K (the build's ``block_size``); False: one scale per output channel.
    blocked: bool = True
    #: The scale as stored, in float16; values halfway between levels round to even (tvm).
    float16_scales: bool = False
    #: ``roundf(w * (1 / scale) + zero_point)``, halfway rounding away from the zero point (ONNX Runtime's MLAS).
    mlas: bool = False


@dataclasses.dataclass(frozen=True)
class ShardRuntime:
    """How a target runs a sharded text-generation artifact: one rank (tensor parallel) or one stage (pipeline
    parallel) a process, each over its own graphs in ``ranks/<r>/`` or ``stages/<s>/``."""

    #: ``(shard dir, target options, the shard's cache geometry, the shards' count) -> CompileResult`` of the
    #: shard's staged graphs, its files relative to the shard's folder: the build's compile of each shard (through
    #: the build cache, in the isolated worker)
    compile: Callable[[Path, Any, DecoderSpec, int], CompileResult]
    #: the module of the target's folder a shard's process loads it with (ranks: ``register_all_reduce`` and
    #: ``load_rank``; stages: ``StageLink``, ``register_stage_ops`` and ``load_stage``)
    module: str
    #: what the shards' processes import ahead, once, in the process they are forked from
    preload: tuple[str, ...] = ()
    #: ranks: runs the reduce-scatter and all-gather of a sequence-parallel prefill (``--sequence-parallel``)
    sequence_parallel: bool = False
    #: target options of sharded builds, under the user's (onnxruntime: one intra-op thread a shard, the shards
    #: being the parallelism)
    target_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: GPUs a shard's Ray actor reserves (tensorrt: one a rank; Ray hides the GPUs from an actor that asks for none)
    gpus_per_shard: int = 0


@dataclasses.dataclass(frozen=True)
class GenerativeBackend:
    """A target's compile and load of the prefill / decode (/ verify) graphs, and what its build path takes.

    Each target with a text-generation path names the module of its folder that ends with
    ``BACKEND = GenerativeBackend(...)`` (``Target.generative_module``), so mypy checks its hooks against the
    signatures the build line calls. A hook a backend does not have is ``None``; a capability it lacks keeps the
    field's default."""

    #: ``(workdir, spec, target options, say, inputs) -> CompileResult`` over the staged graphs
    compile: Callable[[Path, DecoderSpec, Any, Callable[[str], None], DecoderInputs], CompileResult]
    #: ``(artifact dir, target record) -> runner`` with ``generate`` / ``stream``
    load: Callable[[Path, TargetRecord], Any]
    #: the decode graph's attention the export writes (``compiler.generative.export.DECODE_ATTENTION``)
    decode_attention: str = "masked"
    #: ``(causal LM, spec) -> why`` its ``decode_attention`` cannot run this model ('' when it can): the build
    #: then exports ``"masked"`` attention (standard ops) and records the reason
    decode_attention_refusal: Callable[[Any, DecoderSpec], str] | None = None
    #: compiles a verify graph (``--speculative-k``, ``DecoderInputs.verify_width``)
    speculative: bool = False
    #: refuses, before the export, target options this path cannot honour
    plan: Callable[[DecoderSpec, Any], object] | None = None
    #: rewrites of the exported graphs before the passes, and after them
    prepare_graphs: GraphRewrite | None = None
    rewrite_graphs: GraphRewrite | None = None
    #: passes the backend applies itself while compiling (not to the ONNX graphs, ``DecoderInputs.passes``),
    #: and its refusal, before the export, of their parameters it cannot honour
    compile_passes: frozenset[str] = frozenset()
    check_compile_passes: Callable[[dict[str, Any]], None] | None = None
    #: pass parameters of text-generation builds, under the user's (a decode step is not an encoder's batch)
    pass_defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    #: target options of text-generation builds, under the user's (onnxruntime: the thread pool's short spin)
    target_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: the artifact file its runner reads the weights from, which the manifest's ``target.info.weights`` names:
    #: the export's ``weights.data``, or what ``compile`` stores in its place (tvm: ``tvm_weights.data``)
    weights_file: str = WEIGHTS_FILE
    #: device targets, built through a bundle: the plan the bundle carries, and what it holds for the device
    #: host ("onnx": the graphs over their weights; "torch": the causal LM's weights)
    bundle_plan: Callable[[DecoderSpec, Any], dict[str, Any]] | None = None
    graphs_from: str = ""
    #: finishes another target's bundle of ONNX graphs (``graphs_from="onnx"``), running them as they are
    finishes_onnx_bundles: bool = False
    #: runs ``--tensor-parallel`` rank graphs and ``--pipeline-parallel`` stage graphs (None: refused by name)
    tensor_parallel: ShardRuntime | None = None
    pipeline_parallel: ShardRuntime | None = None


class Runner(Protocol):
    """A loaded artifact: named numpy inputs in, named numpy outputs out."""

    def run(self, inputs: Arrays) -> Arrays: ...


class BuiltArtifact(Protocol):
    """What ``check_host`` may read of an artifact's manifest (``artifacts.manifest.Manifest`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def target(self) -> TargetRecord: ...
    @property
    def toolchain(self) -> dict[str, str]: ...
    @property
    def ir(self) -> dict[str, Any]: ...


class Target:
    """One deployment backend. Subclasses set ``name`` / ``options_type`` and implement the four
    required methods; every optional hook has a default that does nothing special."""

    name: ClassVar[str]
    #: The frozen dataclass of this target's options (``--target-opt key=value``).
    options_type: ClassVar[type]
    #: Pass parameter defaults this target needs (TensorRT: signed symmetric Q/DQ); the user's win.
    pass_defaults: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: Compiles ``ctx.torch_program`` (not the IR): the program does not cross to an isolated worker,
    #: so the compile runs in the build's process (Neuron's SDK runs in a worker of its own).
    compiles_torch_program: ClassVar[bool] = False
    #: Modules the isolated compile worker imports ahead, while the build still loads and transforms
    #: the model (the vendor SDK, imported lazily by the target itself).
    worker_preload: ClassVar[tuple[str, ...]] = ()
    #: Packages a host needs beside aotforge to run this target's artifacts (an MLflow model's pip requirements).
    runtime_packages: ClassVar[tuple[str, ...]] = ()
    #: Runs ONNX Runtime's com.microsoft contrib ops (what ``contrib_op_passes`` emit, e.g. MatMulNBits).
    runs_contrib_ops: ClassVar[bool] = False
    #: What a build for this target asks a Ray cluster for beyond one CPU (``compiler/farm``).
    build_resources: ClassVar[Mapping[str, float]] = {}
    #: The module of this target's folder whose ``BACKEND`` builds text-generation artifacts ('' : none yet),
    #: imported only when a text-generation build or load asks for it (``generative``).
    generative_module: ClassVar[str] = ""
    #: The weight-only rounding of its kernels by bit width, which ``aotforge qat`` trains through (empty: none).
    weight_grids: ClassVar[Mapping[int, WeightGrid]] = {}

    def probe(self) -> ProbeResult:
        """Whether this host can compile / run for the target, and if not exactly why."""
        raise NotImplementedError

    def plan(self, model: ir.Model, options: Any, ctx: BuildContext) -> None:
        """Refuse, before any compile work, what this target cannot honour."""
        raise NotImplementedError

    def compile(self, model: ir.Model, options: Any, ctx: BuildContext, workdir: Path) -> CompileResult:
        """Write the target's files into ``workdir`` (which holds the IR as ``model.onnx``)."""
        raise NotImplementedError

    def load(self, artifact_dir: Path, record: TargetRecord, io: IOSpec) -> Runner:
        """A runner over the artifact's files; ``record`` is what ``compile`` reported, in the manifest."""
        raise NotImplementedError

    def with_cache_dir(self, options: Any, cache_dir: Path) -> Any:
        """``options`` with the target's own caches (timing, tuning) placed under the build cache."""
        return options

    def bundle_plan(self, model: ir.Model, options: Any, ctx: BuildContext) -> dict[str, Any] | None:
        """What a build bundle records of this target's plan, re-checked when the bundle is finished."""
        return None

    def generative(self) -> GenerativeBackend | None:
        """This target's text-generation backend (``generative_module``'s ``BACKEND``), None without one."""
        if not self.generative_module:
            return None
        backend: GenerativeBackend = importlib.import_module(self.generative_module).BACKEND
        return backend

    def check_host(self, artifact: BuiltArtifact) -> None:
        """Refuse, before loading anything, an artifact this host's toolchain or CPU cannot run."""

    def coverage(self, model: ir.Model, io: IOSpec, options: Any) -> dict[str, Any] | None:
        """``aotforge check``: what this target's importer takes of ``model`` op by op (``{"direct": {op: count},
        "rewritten": {...}, "refused": [...]}``), in seconds, before any compile; None: no op-level check."""
        return None


def refuse_contrib_ops(target: str, model: ir.Model, ctx: BuildContext) -> None:
    """For targets without ORT's contrib ops: refuse a model holding them, or a pass that emits them."""
    domains = sorted({n.domain for n in model.graph.all_nodes() if n.domain not in ("", "ai.onnx", "ai.onnx.ml")})
    if domains:
        raise UnsupportedModelError(
            f"{target} cannot run ops of domain(s) {', '.join(domains)} (ONNX Runtime contrib ops): "
            "export the model with standard ONNX ops, or use --target onnxruntime"
        )
    emitting = list(ctx.contrib_passes)
    if emitting:
        raise UnsupportedModelError(
            f"{target} cannot honour pass {emitting[0]!r}: it emits com.microsoft contrib ops only "
            "onnxruntime runs; use pass 'fuse' (standard ONNX fusions) instead"
        )
