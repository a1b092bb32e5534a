"""Build options: one frozen dataclass, filled from Python, the CLI or a recipe through ``from_dict``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.artifacts.names import check_name
from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.frontend_transformers import Task, parse_task
from aotforge.core.errors import OptionsError
from aotforge.core.spec import DimRange

#: Where artifacts go when no ``--out`` is given.
DEFAULT_OUT = Path("out")


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    target: str = "tvm"
    passes: tuple[str, ...] = dataclasses.field(default_factory=lambda: (_default_preset(),))
    pass_params: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    target_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dynamic: tuple[DimRange, ...] = ()
    input_ranges: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    name: str | None = None
    version: int | None = None
    out: Path = DEFAULT_OUT
    #: Largest relative L2 error allowed per output against the source model.
    tolerance: float = 1e-4
    #: How many inputs are generated for validation when no ``sample_inputs`` are given.
    validation_samples: int = 3
    #: The user's validation (and benchmark) inputs: FILE.npz, a directory (``compiler.sample_files``),
    #: or dicts of arrays; None generates ``validation_samples`` inputs.
    sample_inputs: str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    seed: int = 0
    bench: bool = True
    bench_options: BenchOptions = BenchOptions()
    dump_ir: Path | None = None
    #: Directory of the build cache (``artifacts.build_cache``); None builds without one.
    cache_dir: Path | None = None
    #: Stop after the passes and write a build bundle for ``aotforge finish`` on the device host.
    prepare_only: bool = False
    #: int8 calibration data: a directory of .npy/.npz files or ``module.py:function`` (``compiler.calibration``).
    calibration: str | None = None
    #: Run the backend compile and a native artifact's first run in a forked child (``compiler.isolation``)
    #: with the deadline (s) and memory limit (MB, None: the host's) below. Off by default: forking a
    #: process that already runs torch / ONNX Runtime thread pools deadlocked the child (a futex held
    #: by a thread that does not exist in the child) in one of our full test runs.
    isolate_backend: bool = False
    backend_deadline_s: float = 3600.0
    backend_memory_mb: int | None = None
    #: Accuracy budget: the least mean output cosine vs fp32 the int8 / int8-dynamic pass must keep (``min_cosine``).
    accuracy_budget: float | None = None
    #: What a transformers model directory is compiled for (``compiler.frontend_transformers``);
    #: None reads it from the config's ``architectures``.
    task: Task | None = None
    #: text-generation: KV-cache positions per sequence (prompt + new tokens) and sequences per call.
    max_seq_len: int = 256
    max_batch: int = 4
    #: text-generation: the least share of greedy tokens that must match the source model.
    min_token_agreement: float = 1.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildOptions:
        """Options from loose values; unknown keys are rejected by name."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise OptionsError(f"unknown build option(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}")
        values = dict(data)
        if "passes" in values:
            values["passes"] = tuple(values["passes"])
        if "dynamic" in values:
            values["dynamic"] = tuple(_dim_range(d) for d in values["dynamic"])
        if values.get("task") is not None:
            values["task"] = parse_task(values["task"])
        for key in ("out", "dump_ir", "cache_dir"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        if "bench_options" in values and isinstance(values["bench_options"], Mapping):
            values["bench_options"] = BenchOptions(**values["bench_options"])
        options = cls(**values)
        if options.tolerance <= 0:
            raise OptionsError(f"tolerance must be > 0, got {options.tolerance}")
        if options.accuracy_budget is not None and not 0 < options.accuracy_budget <= 1:
            raise OptionsError(f"accuracy_budget is a cosine in (0, 1], got {options.accuracy_budget}")
        if options.max_seq_len < 2 or options.max_batch < 1:
            raise OptionsError(
                f"max_seq_len must be >= 2 and max_batch >= 1, got {options.max_seq_len} and {options.max_batch}"
            )
        if not 0 <= options.min_token_agreement <= 1:
            raise OptionsError(f"min_token_agreement is a share in [0, 1], got {options.min_token_agreement}")
        if options.version is not None and (
            isinstance(options.version, bool) or not isinstance(options.version, int) or options.version < 1
        ):
            raise OptionsError(f"version must be a positive integer, got {options.version!r}")
        if not options.backend_deadline_s > 0:
            raise OptionsError(f"backend_deadline_s must be > 0, got {options.backend_deadline_s}")
        if options.backend_memory_mb is not None and options.backend_memory_mb < 64:
            raise OptionsError(f"backend_memory_mb must be at least 64, got {options.backend_memory_mb}")
        if options.name is not None:
            # It becomes a directory under --out and a registry key: one safe path component.
            check_name(options.name, "--name")
        return options


def _default_preset() -> str:
    # Imported on use: ``passes`` pulls in onnx_ir (~0.8 s), which a direct cache hit never needs.
    from aotforge.passes import DEFAULT_PRESET

    return DEFAULT_PRESET


def _dim_range(value: Any) -> DimRange:
    if isinstance(value, DimRange):
        return value
    if isinstance(value, Mapping):
        return DimRange(**value)
    return DimRange.parse(str(value))
