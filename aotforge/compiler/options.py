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
    #: Draw the model card's plots (latency, accuracy, quantized layers, generation) with matplotlib.
    plots: bool = True
    dump_ir: Path | None = None
    #: Directory of the build cache (``artifacts.build_cache``); None builds without one.
    cache_dir: Path | None = None
    #: Stop after the passes and write a build bundle for ``aotforge finish`` on the device host.
    prepare_only: bool = False
    #: int8 calibration data: a directory of .npy/.npz files or ``module.py:function`` (``compiler.calibration``).
    calibration: str | None = None
    #: Run the backend compile and the validation runs of the compiled artifact in a spawned worker
    #: (``compiler.isolation``) with the deadline (s), per-run deadline (s) and memory limit (MB, None:
    #: the host's) below; False runs them in this process (a backend under a debugger). A spawned
    #: worker, never a fork: forking a process that runs torch / ONNX Runtime threads deadlocked.
    isolate_backend: bool = True
    backend_deadline_s: float = 3600.0
    #: Each run of the source model (the reference) and of the compiled artifact while validating.
    run_deadline_s: float = 600.0
    backend_memory_mb: int | None = None
    #: Accuracy budget: the least mean output cosine vs fp32 the int8 / int8-dynamic pass must keep (``min_cosine``).
    accuracy_budget: float | None = None
    #: What a transformers model directory is compiled for (``compiler.frontend_transformers``);
    #: None reads it from the config's ``architectures``.
    task: Task | None = None
    #: text-generation: KV-cache positions per sequence (prompt + new tokens) and sequences per call.
    max_seq_len: int = 256
    max_batch: int = 4
    #: text-generation: the least share of greedy tokens that must match the source model (builds whose passes
    #: keep numerics; one that changes them is gated on quality below, its token agreement reported).
    min_token_agreement: float = 1.0
    #: text-generation, passes that change numerics: the quality budget, the most the artifact's held-out
    #: perplexity may exceed the fp32 model's (relative: 0.05 is +5%).
    max_perplexity_increase: float = 0.05
    #: text-generation: the held-out UTF-8 text of that gate; None: stdlib docstrings (``generative.quality``).
    eval_text: Path | None = None
    #: text-generation: compile a verify graph taking up to this many draft tokens (+1) for speculative
    #: decoding (``generate(draft=...)``); 0 compiles none.
    speculative_k: int = 0
    #: text-generation: rank graphs over 1/N of the weights each, run as N processes (``generative.tp_build``).
    tensor_parallel: int = 1
    #: text-generation: the layers in M stage graphs, run as M processes (``generative.pp_build``).
    pipeline_parallel: int = 1

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildOptions:
        """Options from loose values; unknown keys are rejected by name.

        The ``aotforge compile`` flag names are accepted too (:data:`CLI_SPELLINGS`):
        ``build(m, bench_seconds=2, precision="int8", target_opt={"mcpu": "znver4"})``.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields - set(CLI_SPELLINGS))
        if unknown:
            valid = ", ".join(sorted(fields | set(CLI_SPELLINGS)))
            raise OptionsError(f"unknown build option(s) {', '.join(unknown)}; valid: {valid}")
        values = _from_cli_spellings(dict(data))
        if "passes" in values:
            values["passes"] = tuple(values["passes"])
        if "dynamic" in values:
            values["dynamic"] = tuple(_dim_range(d) for d in values["dynamic"])
        if values.get("task") is not None:
            values["task"] = parse_task(values["task"])
        for key in ("out", "dump_ir", "cache_dir", "eval_text"):
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
        if not 0 <= options.speculative_k < options.max_seq_len - 1:
            raise OptionsError(
                f"speculative_k must be in 0..{options.max_seq_len - 2} (below max_seq_len - 1), "
                f"got {options.speculative_k}"
            )
        if options.tensor_parallel < 1:
            raise OptionsError(f"tensor_parallel is a number of ranks >= 1, got {options.tensor_parallel}")
        if options.pipeline_parallel < 1:
            raise OptionsError(f"pipeline_parallel is a number of stages >= 1, got {options.pipeline_parallel}")
        if not options.max_perplexity_increase >= 0:
            raise OptionsError(
                "max_perplexity_increase is a relative increase >= 0 (0.05: +5%), "
                f"got {options.max_perplexity_increase}"
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


#: ``--precision`` -> the pass it appends to the pass list (Olive's ``--precision``); fp32 appends none.
PRECISIONS: dict[str, str | None] = {
    "fp32": None,
    "fp16": "fp16",
    "bf16": "bf16",
    "int8": "int8",
    "int8-dynamic": "int8-dynamic",
    "int4": "weight-only",
}

#: ``aotforge compile`` flag names (as Python keywords) that are not field names, and what they set.
CLI_SPELLINGS: dict[str, str] = {
    "bench_seconds": "bench_options.max_seconds",
    "no_bench": "bench (negated)",
    "precision": "passes (appends the precision's pass)",
    "target_opt": "target_options",
    "pass_opt": "pass_params (PASS.KEY=VALUE)",
    "input_range": "input_ranges (NAME=LOW:HIGH)",
    "tune_trials": "target_options['tune_trials']",
    "tune_minutes": "target_options['tune_minutes']",
    "backend_deadline": "backend_deadline_s",
}


def _from_cli_spellings(values: dict[str, Any]) -> dict[str, Any]:
    """Fold the CLI's flag names into the fields they set (merged over those fields' values when both are given)."""
    if "bench_seconds" in values:
        bench = values.get("bench_options", BenchOptions())
        bench = BenchOptions(**bench) if isinstance(bench, Mapping) else bench
        values["bench_options"] = dataclasses.replace(bench, max_seconds=float(values.pop("bench_seconds")))
    if "no_bench" in values:
        values["bench"] = not values.pop("no_bench")
    if "backend_deadline" in values:
        values["backend_deadline_s"] = values.pop("backend_deadline")
    if "target_opt" in values:
        values["target_options"] = {
            **values.get("target_options", {}),
            **dict(_pairs(values.pop("target_opt"), "target_opt")),
        }
    for key in ("tune_trials", "tune_minutes"):
        if key in values:
            value = values.pop(key)
            if value:
                values["target_options"] = {**values.get("target_options", {}), key: str(value)}
    if "pass_opt" in values:
        params = {k: dict(v) for k, v in values.get("pass_params", {}).items()}
        for key, value in _pairs(values.pop("pass_opt"), "pass_opt"):
            name, dot, field = key.partition(".")
            if not dot or not field:
                raise OptionsError(f"pass_opt {key!r} is not PASS.KEY, e.g. int8.method")
            params.setdefault(name, {})[field] = value
        values["pass_params"] = params
    if "input_range" in values:
        from aotforge.core.spec import parse_value_range

        ranges = values.pop("input_range")
        given = [ranges] if isinstance(ranges, str) else ranges
        values["input_ranges"] = {**values.get("input_ranges", {}), **dict(parse_value_range(r) for r in given)}
    if "precision" in values:
        values["passes"] = with_precision(values.get("passes", (_default_preset(),)), values.pop("precision"))
    return values


def with_precision(passes: Sequence[str], precision: str | None) -> tuple[str, ...]:
    """``passes`` with the precision's pass appended; a pass list that already sets a precision is refused."""
    if precision is None:
        return tuple(passes)
    if precision not in PRECISIONS:
        raise OptionsError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    chosen = PRECISIONS[precision]
    clash = [p for p in passes if p in {v for v in PRECISIONS.values() if v}]
    if clash:
        raise OptionsError(
            f"precision {precision} and the pass(es) {', '.join(clash)} in the pass list both set the precision: "
            "give one of them"
        )
    return (*passes, chosen) if chosen else tuple(passes)


def _pairs(value: Any, what: str) -> list[tuple[str, Any]]:
    """A mapping, or ``KEY=VALUE`` strings (one or several), as (key, value) pairs."""
    if isinstance(value, Mapping):
        return list(value.items())
    items = [value] if isinstance(value, str) else list(value)
    pairs = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2:
            pairs.append((str(item[0]), item[1]))
            continue
        key, sep, val = str(item).partition("=")
        if not sep or not key.strip():
            raise OptionsError(f"{what} {item!r} is not KEY=VALUE")
        pairs.append((key.strip(), val.strip()))
    return pairs
