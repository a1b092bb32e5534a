"""Build options: small frozen groups by concern, each default written once in its dataclass.

``BuildOptions.from_dict`` fills them from Python keywords, a recipe or the CLI: a group by its name (``generation=
{"max_seq_len": 64}``), a field by its path (``"generation.max_seq_len"``) or by its own name where that is unique
(``max_seq_len=64``), and the ``aotforge compile`` flag names (``compiler.option_flags``: ``bench_seconds=2``,
``precision="int8"``, ``target_opt={"mcpu": "znver4"}``); an unknown key is refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts.names import check_name
from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.frontend_transformers import Task
from aotforge.compiler.isolation import Isolation
from aotforge.compiler.option_flags import resolve_keys
from aotforge.core.errors import OptionsError
from aotforge.core.spec import DimRange
from aotforge.passes import DEFAULT_PRESET

#: Where artifacts go when no ``--out`` is given.
DEFAULT_OUT = Path("out")


@dataclasses.dataclass(frozen=True)
class FrontendOptions:
    """What the model is compiled as: its task, and the shapes and values of its inputs."""

    #: What a transformers model directory is compiled for (``compiler.frontend_transformers``);
    #: None reads it from the config's ``architectures``.
    task: Task | None = None
    dynamic: tuple[DimRange, ...] = ()
    input_ranges: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PassOptions:
    """The graph passes, their parameters and what the quantizing ones calibrate on."""

    names: tuple[str, ...] = (DEFAULT_PRESET,)
    params: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    #: int8 calibration data: a directory of .npy/.npz files or ``module.py:function`` (``compiler.calibration``).
    calibration: str | None = None
    #: The least mean output cosine vs fp32 the int8 / int8-dynamic pass must keep (``min_cosine``).
    accuracy_budget: float | None = None
    #: Write the IR after each pass into this directory.
    dump_ir: Path | None = None

    def __post_init__(self) -> None:
        if self.accuracy_budget is not None and not 0 < self.accuracy_budget <= 1:
            raise OptionsError(f"accuracy_budget is a cosine in (0, 1], got {self.accuracy_budget}")


@dataclasses.dataclass(frozen=True)
class ValidationOptions:
    """How the artifact is checked against its source model."""

    #: Largest relative L2 error allowed per output against the source model.
    tolerance: float = 1e-4
    #: How many inputs are generated for validation when no ``sample_inputs`` are given.
    validation_samples: int = 3
    #: The user's validation (and benchmark) inputs: FILE.npz, a directory (``compiler.sample_files``),
    #: or dicts of arrays; None generates ``validation_samples`` inputs.
    sample_inputs: str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.tolerance > 0:
            raise OptionsError(f"tolerance must be > 0, got {self.tolerance}")
        if self.validation_samples < 1:
            raise OptionsError(f"validation_samples must be >= 1, got {self.validation_samples}")


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """The build's benchmark of the artifact and the model card's plots."""

    bench: bool = True
    runs: BenchOptions = BenchOptions()
    #: Draw the model card's plots (latency, accuracy, quantized layers, generation) with matplotlib.
    plots: bool = True


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """text-generation builds only (``compiler.task_options`` refuses them elsewhere)."""

    #: KV-cache positions per sequence (prompt + new tokens) and sequences per call.
    max_seq_len: int = 256
    max_batch: int = 4
    #: The least share of greedy tokens that must match the source model (builds whose passes keep numerics; one
    #: that changes them is gated on quality below, its token agreement reported).
    min_token_agreement: float = 1.0
    #: Passes that change numerics: the most the held-out perplexity may exceed the fp32 model's (0.05: +5%).
    max_perplexity_increase: float = 0.05
    #: The held-out UTF-8 text of that gate; None: stdlib docstrings (``generative.quality``).
    eval_text: Path | None = None
    #: Compile a verify graph taking up to this many draft tokens (+1) for speculative decoding; 0 compiles none.
    speculative_k: int = 0
    #: Rank graphs over 1/N of the weights each, run as N processes (``generative.tp_build``).
    tensor_parallel: int = 1
    #: The tensor-parallel ranks' prefill splits the residual stream and the norms along the prompt
    #: (reduce-scatter / all-gather in place of the all-reduce; ``generative.tensor_parallel.SequenceSplit``).
    sequence_parallel: bool = False
    #: The layers in M stage graphs, run as M processes (``generative.pp_build``).
    pipeline_parallel: int = 1

    def __post_init__(self) -> None:
        if self.max_seq_len < 2 or self.max_batch < 1:
            raise OptionsError(
                f"max_seq_len must be >= 2 and max_batch >= 1, got {self.max_seq_len} and {self.max_batch}"
            )
        if not 0 <= self.speculative_k < self.max_seq_len - 1:
            raise OptionsError(
                f"speculative_k must be in 0..{self.max_seq_len - 2} (below max_seq_len - 1), got {self.speculative_k}"
            )
        if self.eval_text is not None and not Path(self.eval_text).is_file():  # refused before minutes of compile
            raise OptionsError(f"eval_text {self.eval_text} is not a file: give a UTF-8 text file, or leave it out")
        if self.tensor_parallel < 1:
            raise OptionsError(f"tensor_parallel is a number of ranks >= 1, got {self.tensor_parallel}")
        if self.pipeline_parallel < 1:
            raise OptionsError(f"pipeline_parallel is a number of stages >= 1, got {self.pipeline_parallel}")
        if self.sequence_parallel and self.tensor_parallel < 2:
            raise OptionsError(
                "--sequence-parallel splits the prefill of tensor-parallel ranks along the prompt: add "
                "--tensor-parallel N (N >= 2), or drop --sequence-parallel"
            )
        if not self.max_perplexity_increase >= 0:
            raise OptionsError(
                f"max_perplexity_increase is a relative increase >= 0 (0.05: +5%), got {self.max_perplexity_increase}"
            )
        if not 0 <= self.min_token_agreement <= 1:
            raise OptionsError(f"min_token_agreement is a share in [0, 1], got {self.min_token_agreement}")


@dataclasses.dataclass(frozen=True)
class IsolationOptions:
    """Where the backend compile and the compiled artifact's validation runs happen, and their limits (the
    defaults are the stage's own, ``compiler.isolation.Isolation``).

    A spawned worker (``compiler.isolation``), never a fork: forking a process that runs torch / ONNX Runtime
    threads deadlocked. ``isolate_backend=False`` runs them in this process (a backend under a debugger)."""

    isolate_backend: bool = Isolation.enabled
    #: Seconds the backend compile and the artifact's validation runs may take together, in the worker.
    backend_deadline_s: float = Isolation.deadline_s
    #: Seconds each run of the source model (the reference) or of the artifact may take while validating.
    run_deadline_s: float = Isolation.run_deadline_s
    #: The worker's memory limit (MB); None: the host's.
    backend_memory_mb: int | None = Isolation.memory_mb

    def __post_init__(self) -> None:
        if not self.backend_deadline_s > 0 or not self.run_deadline_s > 0:
            raise OptionsError(
                f"deadlines must be > 0 s, got backend {self.backend_deadline_s} and run {self.run_deadline_s}"
            )
        if self.backend_memory_mb is not None and self.backend_memory_mb < 64:
            raise OptionsError(f"backend_memory_mb must be at least 64, got {self.backend_memory_mb}")

    def limits(self) -> Isolation:
        """The isolated stage's limits these options ask for."""
        return Isolation(
            self.backend_deadline_s, self.backend_memory_mb, self.run_deadline_s, enabled=self.isolate_backend
        )


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """What to build, where to, and the groups by concern."""

    target: str = "tvm"
    out: Path = DEFAULT_OUT
    #: The artifact's name (default: the model's) and version (default: the next free one).
    name: str | None = None
    version: int | None = None
    #: Directory of the build cache (``artifacts.build_cache``); None builds without one.
    cache_dir: Path | None = None
    #: Directory of the export cache (text generation: the exported graphs, ``generative.export_cache``); None:
    #: ``<cache_dir>/export`` with a build cache, else none.
    export_cache_dir: Path | None = None
    #: Stop after the passes and write a build bundle for ``aotforge finish`` on the device host.
    prepare_only: bool = False
    #: The target's own options (its ``options_type``, checked by it: ``core.options.options_from_dict``).
    target_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    frontend: FrontendOptions = FrontendOptions()
    passes: PassOptions = PassOptions()
    validation: ValidationOptions = ValidationOptions()
    benchmark: BenchmarkOptions = BenchmarkOptions()
    generation: GenerationOptions = GenerationOptions()
    isolation: IsolationOptions = IsolationOptions()

    def __post_init__(self) -> None:
        if self.version is not None and (
            isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1
        ):
            raise OptionsError(f"version must be a positive integer, got {self.version!r}")
        if self.name is not None:
            # It becomes a directory under --out and a registry key: one safe path component.
            check_name(self.name, "--name")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildOptions:
        """Options from loose values (groups, field paths, field names, flag names); unknown keys are refused."""
        return cls.from_fields(resolve_keys(data, field_paths(), field_default))

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> BuildOptions:
        """Options from ``{"generation.max_seq_len": 64, ...}`` (field paths, values already typed)."""
        return _assemble(cls(), values)

    def with_fields(self, values: Mapping[str, Any]) -> BuildOptions:
        """These options with the fields at ``values``' paths replaced (``{"passes.names": ("O2",)}``)."""
        return _assemble(self, values)

    def fields(self) -> dict[str, Any]:
        """Every field by its path (``"generation.max_seq_len"``): what ``from_fields`` takes back."""
        return _leaves(self)


def field_paths() -> tuple[str, ...]:
    """The path of every field of :class:`BuildOptions`, groups (and ``BenchOptions``) walked into."""
    return tuple(BuildOptions().fields())


def field_default(path: str) -> Any:
    """The default of the field at ``path`` (``"generation.max_seq_len"``), read from the dataclasses."""
    obj: Any = BuildOptions
    *groups, leaf = path.split(".")
    for group in groups:
        field = {f.name: f for f in dataclasses.fields(obj)}[group]
        obj = _default(field)
    return _default({f.name: f for f in dataclasses.fields(obj)}[leaf])


def _default(field: dataclasses.Field[Any]) -> Any:
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc,operator]


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    leaves: dict[str, Any] = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            leaves.update(_leaves(value, f"{prefix}{field.name}."))
        else:
            leaves[prefix + field.name] = value
    return leaves


def _assemble(obj: Any, values: Mapping[str, Any]) -> Any:
    """``obj`` with the fields at ``values``' paths replaced (groups rebuilt, so their checks run again)."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(obj):
        nested = {k.partition(".")[2]: v for k, v in values.items() if k.startswith(field.name + ".")}
        if field.name in values:  # a group given whole, then its fields given one by one over it
            changes[field.name] = _assemble(values[field.name], nested) if nested else values[field.name]
        elif nested:
            changes[field.name] = _assemble(getattr(obj, field.name), nested)
    return dataclasses.replace(obj, **changes) if changes else obj
