"""The one table of build-option spellings: each ``aotforge compile`` flag (and Python keyword) and the field it sets.

``BuildOptions.from_dict`` reads keys through it; ``compiler.cli.build_flags`` makes the click options from it, their
defaults read from the fields (written once, in ``compiler.options``); ``tests/test_option_flags.py`` fails when a
field has no flag or a flag no field. No click here: a direct cache hit goes through ``from_dict``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.compiler.frontend_transformers import Task
from aotforge.core.errors import OptionsError

Read = Callable[[Any], Any]
Merge = Callable[[Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Flag:
    """One spelling of a build option: the field it sets (by path) and how a loose value becomes the field's."""

    path: str
    help: str = ""
    #: The keyword (``--max-seq-len`` is ``max_seq_len``); default: the field's own name.
    name: str = ""
    short: str = ""
    #: A flag given several times (``--target-opt a=1 --target-opt b=2``).
    multiple: bool = False
    choices: tuple[str, ...] = ()
    #: The click type where the field's own type does not say it (a spelling of a key of a mapping field).
    type: type | None = None
    #: Loose value -> the field's value.
    read: Read | None = None
    #: ``(value, the field's value so far) -> the field's value``: applied after every plain key, in table order.
    merge: Merge | None = None
    #: False: a Python keyword only (an earlier spelling kept for callers), no flag.
    cli: bool = True

    @property
    def keyword(self) -> str:
        return self.name or self.path.rpartition(".")[2]


def _path(value: Any) -> Path | None:
    return None if value is None else Path(value)


def _pass_list(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    return tuple(p.strip() for p in items if p.strip())


def _dims(value: Any) -> tuple[Any, ...]:
    from aotforge.core.spec import DimRange

    def one(item: Any) -> DimRange:
        if isinstance(item, DimRange):
            return item
        return DimRange(**item) if isinstance(item, Mapping) else DimRange.parse(str(item))

    return tuple(one(d) for d in ([value] if isinstance(value, str) else value))


def _task(value: Any) -> Any:
    from aotforge.compiler.frontend_transformers import parse_task

    return None if value is None else parse_task(value)


def _bench_runs(value: Any) -> Any:
    from aotforge.compiler.benchmark import BenchOptions

    return BenchOptions(**value) if isinstance(value, Mapping) else value


def pairs(value: Any, what: str) -> list[tuple[str, Any]]:
    """A mapping, or ``KEY=VALUE`` strings (one or several), as (key, value) pairs."""
    if isinstance(value, Mapping):
        return list(value.items())
    pairs = []
    for item in [value] if isinstance(value, str) else list(value):
        if isinstance(item, tuple) and len(item) == 2:
            pairs.append((str(item[0]), item[1]))
            continue
        key, sep, val = str(item).partition("=")
        if not sep or not key.strip():
            raise OptionsError(f"{what} {item!r} is not KEY=VALUE")
        pairs.append((key.strip(), val.strip()))
    return pairs


def _merge_target_opts(value: Any, current: Mapping[str, Any]) -> dict[str, Any]:
    return {**current, **dict(pairs(value, "target_opt"))}


def _merge_tuning(key: str) -> Merge:
    """``--tune-trials`` / ``--tune-minutes``: spellings of the tvm target options of those names (0: not set)."""
    return lambda value, current: {**current, key: str(value)} if value else dict(current)


def _merge_pass_opts(value: Any, current: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    params = {k: dict(v) for k, v in current.items()}
    for key, val in pairs(value, "pass_opt"):
        name, dot, field = key.partition(".")
        if not dot or not field:
            raise OptionsError(f"pass_opt {key!r} is not PASS.KEY, e.g. int8.method")
        params.setdefault(name, {})[field] = val
    return params


def _merge_ranges(value: Any, current: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    from aotforge.core.spec import parse_value_range

    return {**current, **dict(parse_value_range(r) for r in ([value] if isinstance(value, str) else value))}


#: ``--precision`` -> the pass it appends to the pass list (Olive's ``--precision``); fp32 appends none.
PRECISIONS: dict[str, str | None] = {
    "fp32": None,
    "fp16": "fp16",
    "bf16": "bf16",
    "int8": "int8",
    "int8-dynamic": "int8-dynamic",
    "int4": "weight-only",
}


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


def _merge_precision(value: Any, current: tuple[str, ...]) -> tuple[str, ...]:
    return with_precision(current, value)


_TN = "text-generation: "
#: Every spelling, in the order ``from_dict`` applies merges (``--precision`` last: it appends to the pass list).
FLAGS: tuple[Flag, ...] = (
    Flag("target", "tvm, onnxruntime, tensorrt or neuron; several (tvm,onnxruntime) or all build each and compare.",
         short="-t"),
    Flag("out", "Where artifacts go.", short="-o", read=_path),
    Flag("name", "Artifact name (default: the model's)."),
    Flag("version", "Artifact version (default: the next free one)."),
    Flag("cache_dir", "Build cache directory: reuse compiles of identical input.", read=_path),
    Flag("export_cache_dir", _TN + "reuse the exported graphs of the same model and export settings "
         "(default: <cache-dir>/export).", read=_path),
    Flag("prepare_only", "Write a build bundle for `aotforge finish` on the device host."),
    Flag("target_options", "Target option, e.g. mcpu=skylake-avx512.", name="target_opt", multiple=True,
         merge=_merge_target_opts),
    Flag("target_options", "tvm: MetaSchedule trials (0: no tuning).", name="tune_trials", type=int,
         merge=_merge_tuning("tune_trials")),
    Flag("target_options", "tvm: stop tuning after this long.", name="tune_minutes", type=float,
         merge=_merge_tuning("tune_minutes")),
    Flag("frontend.task", "A transformers directory's task (default: from its config's architectures); "
         "text-generation compiles a causal LM as prefill + decode graphs with a KV cache.", read=_task,
         choices=tuple(t.value for t in Task)),
    Flag("frontend.dynamic", "Dynamic dim range, e.g. batch=1:32 or batch=1:8:32.", multiple=True, read=_dims),
    Flag("frontend.input_ranges", "Value range of an input, e.g. input_ids=0:30522.", name="input_range",
         multiple=True, merge=_merge_ranges),
    Flag("passes.names", "Comma list of passes and presets (O0, O1, O2).", name="passes", read=_pass_list),
    Flag("passes.params", "Pass parameter, e.g. int8.method=percentile.", name="pass_opt", multiple=True,
         merge=_merge_pass_opts),
    Flag("passes.params", name="pass_params", cli=False),
    Flag("passes.calibration", "int8 calibration data: a directory of .npy/.npz files, or module.py:function."),
    Flag("passes.accuracy_budget", "Least mean cosine vs fp32 on held-out calibration data (int8, int8-dynamic "
         "search their method)."),
    Flag("passes.dump_ir", "Write the IR after each pass into this directory.", read=_path),
    Flag("validation.tolerance", "Max relative L2 error per output."),
    Flag("validation.validation_samples", "Inputs generated for validation when no --sample-inputs are given."),
    Flag("validation.sample_inputs", "Validation and benchmark inputs: FILE.npz (arrays named after the inputs) or "
         "a directory of .npz files or ONNX test data (input_0.pb ...); default: generated."),
    Flag("validation.seed", "Seed of the generated inputs and prompts."),
    Flag("benchmark.bench", "Benchmark the artifact."),
    Flag("benchmark.bench", name="no_bench", cli=False, read=lambda value: not value),
    Flag("benchmark.runs", name="bench_options", cli=False, read=_bench_runs),
    Flag("benchmark.runs.max_seconds", "Benchmark time budget (s).", name="bench_seconds"),
    Flag("benchmark.runs.warmup", "Untimed benchmark calls first.", name="bench_warmup"),
    Flag("benchmark.runs.min_runs", "Least timed benchmark calls.", name="bench_min_runs"),
    Flag("benchmark.runs.max_runs", "Most timed benchmark calls.", name="bench_max_runs"),
    Flag("benchmark.plots", "Draw the model card's plots."),
    Flag("generation.max_seq_len", _TN + "KV positions."),
    Flag("generation.max_batch", _TN + "sequences per call."),
    Flag("generation.min_token_agreement", _TN + "the share of greedy tokens that must match transformers (below "
         "it the build fails); a build whose passes change numerics reports it, gated by --max-perplexity-increase."),
    Flag("generation.max_perplexity_increase", _TN + "passes that change numerics (--precision int4/int8): the most "
         "held-out perplexity may rise over the fp32 model's (relative: 0.05 is +5%); above it the build fails."),
    Flag("generation.eval_text", _TN + "UTF-8 text the quality budget is measured on (default: stdlib docstrings).",
         read=_path),
    Flag("generation.speculative_k", _TN + "compile a verify graph for up to K draft tokens (generate --draft)."),
    Flag("generation.tensor_parallel", _TN + "(onnxruntime) N rank graphs over 1/N of the weights, N processes."),
    Flag("generation.sequence_parallel", _TN + "(with --tensor-parallel) the ranks' prefill splits the residual "
         "stream and the norms along the prompt: reduce-scatter / all-gather instead of the all-reduce."),
    Flag("generation.pipeline_parallel", _TN + "(onnxruntime) the layers in M stage graphs, run as M processes, "
         "micro-batches in flight."),
    Flag("isolation.isolate_backend", "Compile and run the validation inputs in a spawned worker with deadlines."),
    Flag("isolation.backend_deadline_s", "Seconds the backend compile and the artifact's validation runs may take "
         "together, in the worker.", name="backend_deadline"),
    Flag("isolation.run_deadline_s", "Seconds one run of the source model or of the artifact may take while "
         "validating.", name="run_deadline"),
    Flag("isolation.backend_memory_mb", "Memory limit of that worker (MB; default: none)."),
    Flag("passes.names", "Append the precision's pass to --passes: fp16, bf16, int8 (static QDQ, calibrated), "
         "int8-dynamic, int4 (weight-only, MatMulNBits).", name="precision",
         choices=tuple(PRECISIONS), merge=_merge_precision),
)  # fmt: skip

BY_KEYWORD: dict[str, Flag] = {flag.keyword: flag for flag in FLAGS}
#: A field path -> how a loose value becomes its value (the flag that sets it plainly and reads it).
_READERS: dict[str, Read] = {f.path: f.read for f in FLAGS if f.read is not None and f.merge is None and f.cli}
_READERS["benchmark.runs"] = _bench_runs


def flag_name(path: str) -> str:
    """The flag that sets the field at ``path`` (``--max-seq-len``), as a message names it."""
    flag = next(f for f in FLAGS if f.path == path and f.cli)
    return f"--{flag.keyword.replace('_', '-')}"


def resolve_keys(
    data: Mapping[str, Any], paths: Collection[str], field_default: Callable[[str], Any]
) -> dict[str, Any]:
    """Loose keys -> ``{field path: value}``: groups and field paths, unique field names, then flag spellings
    (their merges in table order, over the values so far, or over ``field_default(path)``)."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        by_name.setdefault(path.rpartition(".")[2], []).append(path)
    groups = {p.rsplit(".", n)[0] for p in paths for n in range(1, p.count(".") + 1)}
    values: dict[str, Any] = {}
    merges: dict[str, Any] = {}
    unknown = []
    for key, value in data.items():
        flag = BY_KEYWORD.get(key)
        if key in groups and (dataclasses.is_dataclass(value) or isinstance(value, Mapping)):
            values.update(_group_values(key, value, paths))
        elif key in paths:
            values[key] = _read(key, value)
        elif flag is not None and flag.merge is not None:
            merges[key] = value
        elif flag is not None:
            values[flag.path] = flag.read(value) if flag.read is not None else _read(flag.path, value)
        elif len(by_name.get(key, ())) == 1:
            values[by_name[key][0]] = _read(by_name[key][0], value)
        else:
            unknown.append(key)
    if unknown:
        valid = sorted({*paths, *groups, *BY_KEYWORD, *(n for n, p in by_name.items() if len(p) == 1)})
        raise OptionsError(f"unknown build option(s) {', '.join(sorted(unknown))}; valid: {', '.join(valid)}")
    for flag in FLAGS:
        if flag.merge is not None and flag.keyword in merges and merges[flag.keyword] is not None:
            current = values.get(flag.path, field_default(flag.path))
            values[flag.path] = flag.merge(merges[flag.keyword], current)
    return values


def _group_values(group: str, value: Any, paths: Collection[str]) -> dict[str, Any]:
    """A group given whole (its dataclass, or a mapping of its fields) as field paths."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if group in _READERS:
            return {group: value}
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if group in _READERS:
        return {group: _READERS[group](value)}
    values: dict[str, Any] = {}
    for key, item in value.items():
        path = f"{group}.{key}"
        if path in paths:
            values[path] = _read(path, item)
        elif isinstance(item, Mapping) or dataclasses.is_dataclass(item):
            values.update(_group_values(path, item, paths))
        else:
            raise OptionsError(f"unknown build option {path}; {group} has: {', '.join(_fields_of(group, paths))}")
    return values


def _fields_of(group: str, paths: Collection[str]) -> list[str]:
    return sorted(p.removeprefix(group + ".") for p in paths if p.startswith(group + "."))


def _read(path: str, value: Any) -> Any:
    reader = _READERS.get(path)
    return reader(value) if reader is not None else value
