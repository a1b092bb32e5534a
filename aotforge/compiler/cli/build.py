"""``aotforge compile``: flags (and a recipe) -> ``BuildOptions`` -> ``build_cached``; prints the artifact's path."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.common import DimRangeParam, KeyValueParam, manifest_summary, user_errors
from aotforge.compiler.cli.progress import build_progress
from aotforge.compiler.cli.recipe_flags import with_recipe
from aotforge.compiler.frontend_transformers import Task
from aotforge.core.spec import parse_value_range


def _field_default(name: str) -> Any:
    """A ``BuildOptions`` field's default, which its flag shows and passes on (written once, in the dataclass)."""
    from aotforge.compiler.options import BuildOptions

    return BuildOptions.__dataclass_fields__[name].default


@click.command()
@click.argument("model")
@click.option(
    "--target",
    "-t",
    default="tvm",
    show_default=True,
    help="tvm, onnxruntime, tensorrt or neuron; several (tvm,onnxruntime) or all build each and compare them.",
)
@click.option("--out", "-o", type=click.Path(path_type=Path), default=Path("out"), show_default=True)
@click.option("--name", help="Artifact name (default: the model file's stem).")
@click.option("--version", type=click.IntRange(min=1), help="Artifact version (default: next free one).")
@click.option("--passes", default="O1", show_default=True, help="Comma list of passes and presets (O0, O1, O2).")
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "bf16", "int8", "int8-dynamic", "int4"]),
    help="Shortcut that appends the precision's pass to --passes: fp16, bf16, int8 (static QDQ, calibrated), "
    "int8-dynamic, int4 (weight-only, MatMulNBits; onnxruntime).",
)
@click.option(
    "--dynamic", multiple=True, type=DimRangeParam(), help="Dynamic dim range, e.g. batch=1:32 or batch=1:8:32."
)
@click.option(
    "--task",
    type=click.Choice([t.value for t in Task]),
    help="A transformers directory's task (default: from its config's architectures); text-generation compiles "
    "a causal LM as prefill + decode graphs with a KV cache.",
)
@click.option("--input-range", multiple=True, help="Value range of an input, e.g. input_ids=0:30522.")
@click.option("--target-opt", multiple=True, type=KeyValueParam(), help="Target option, e.g. mcpu=skylake-avx512.")
@click.option("--tune-trials", type=click.IntRange(min=0), default=0, help="tvm: MetaSchedule trials (0: no tuning).")
@click.option("--tune-minutes", type=click.FloatRange(min=0), default=0.0, help="tvm: stop tuning after this long.")
@click.option("--pass-opt", multiple=True, type=KeyValueParam(), help="Pass parameter, e.g. int8.method=percentile.")
@click.option("--tolerance", type=float, default=1e-4, show_default=True, help="Max relative L2 error per output.")
@click.option(
    "--sample-inputs",
    help="Validation and benchmark inputs: FILE.npz (arrays named after the inputs) or a directory of .npz "
    "files or ONNX test data (input_0.pb ...); default: generated.",
)
@click.option("--no-bench", is_flag=True, help="Skip the benchmark.")
@click.option("--bench-seconds", type=float, default=10.0, show_default=True, help="Benchmark time budget.")
@click.option("--dump-ir", type=click.Path(path_type=Path), help="Write the IR after each pass into this directory.")
@click.option(
    "--cache-dir", type=click.Path(path_type=Path), help="Build cache directory: reuse compiles of identical input."
)
@click.option(
    "--explain-cache",
    is_flag=True,
    help="Skip the cache's direct mode and say why the IR-level cache hit or missed (needs --cache-dir).",
)
@click.option(
    "--max-seq-len", type=click.IntRange(min=2), default=256, show_default=True, help="text-generation: KV positions."
)
@click.option(
    "--max-batch", type=click.IntRange(min=1), default=4, show_default=True, help="text-generation: sequences per call."
)
@click.option(
    "--min-token-agreement",
    type=click.FloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="text-generation: the share of greedy tokens that must match transformers (below it the build fails); "
    "a build whose passes change numerics reports it and is gated by --max-perplexity-increase instead.",
)
@click.option(
    "--max-perplexity-increase",
    type=click.FloatRange(min=0),
    default=_field_default("max_perplexity_increase"),
    show_default=True,
    help="text-generation with passes that change numerics (--precision int4/int8): the quality budget, the most "
    "held-out perplexity may rise over the fp32 model's (relative: 0.05 is +5%); above it the build fails.",
)
@click.option(
    "--eval-text",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="text-generation: UTF-8 text that quality budget is measured on (default: stdlib docstrings).",
)
@click.option(
    "--speculative-k",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="text-generation: compile a verify graph for up to K draft tokens (generate --draft); 0: none.",
)
@click.option(
    "--tensor-parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="text-generation (onnxruntime): N rank graphs over 1/N of the weights each, run as N processes.",
)
@click.option(
    "--pipeline-parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="text-generation (onnxruntime): the layers in M stage graphs, run as M processes, micro-batches in flight.",
)
@click.option("--prepare-only", is_flag=True, help="Write a build bundle for `aotforge finish` on the device host.")
@click.option("--calibration", help="int8 calibration data: a directory of .npy/.npz files, or module.py:function.")
@click.option(
    "--accuracy-budget",
    type=click.FloatRange(0, 1, min_open=True),
    help="Least mean cosine vs fp32 on held-out calibration data (int8, int8-dynamic search their method).",
)
@click.option(
    "--isolate-backend/--no-isolate-backend",
    default=True,
    show_default=True,
    help="Compile and run the validation inputs in a spawned worker with deadlines (off: in this process).",
)
@click.option(
    "--backend-deadline",
    type=click.FloatRange(min=0, min_open=True),
    default=3600.0,
    show_default=True,
    help="Seconds the backend compile and the artifact's validation runs may take together, in the worker.",
)
@click.option(
    "--run-deadline",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds one run of the source model or of the artifact may take while validating.",
)
@click.option("--backend-memory-mb", type=click.IntRange(min=64), help="Memory limit of that child (default: none).")
@click.option("--recipe", type=click.Path(path_type=Path), help="TOML recipe of passes and options; flags override it.")
@click.option("--sign-key", type=click.Path(path_type=Path), help="Sign the artifact with this ed25519 private key.")
@click.option(
    "--push", "push_to", help="Then push it to this registry (a local directory or an http(s):// MLflow tracking URI)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (path, name, version, target, figures).")
@user_errors
def compile(model: str, **kw: Any) -> None:
    """Compile MODEL (.onnx file, .py model file or module, transformers model directory) into an artifact;
    prints its path last (with --json: one JSON object, its path in "path")."""
    from rich.console import Console

    from aotforge.compiler.api import build

    # Only light modules here: a direct cache hit must not import torch, onnx or the targets.
    from aotforge.compiler.benchmark import BenchOptions
    from aotforge.compiler.options import BuildOptions, with_precision

    options = BuildOptions.from_dict(
        {
            "target": kw["target"],
            "out": kw["out"],
            "name": kw["name"],
            "version": kw["version"],
            "passes": tuple(p.strip() for p in kw["passes"].split(",") if p.strip()),
            "dynamic": kw["dynamic"],
            "input_ranges": dict(parse_value_range(r) for r in kw["input_range"]),
            "target_options": {**dict(kw["target_opt"]), **_tuning_options(kw)},
            "pass_params": _pass_params(kw["pass_opt"]),
            "tolerance": kw["tolerance"],
            "sample_inputs": kw["sample_inputs"],
            "bench": not kw["no_bench"],
            "bench_options": BenchOptions(max_seconds=kw["bench_seconds"]),
            "dump_ir": kw["dump_ir"],
            "cache_dir": kw["cache_dir"],
            "prepare_only": kw["prepare_only"],
            "isolate_backend": kw["isolate_backend"],
            "backend_deadline_s": kw["backend_deadline"],
            "run_deadline_s": kw["run_deadline"],
            "backend_memory_mb": kw["backend_memory_mb"],
            "calibration": kw["calibration"],
            "accuracy_budget": kw["accuracy_budget"],
            "task": kw["task"],
            "max_seq_len": kw["max_seq_len"],
            "max_batch": kw["max_batch"],
            "min_token_agreement": kw["min_token_agreement"],
            "max_perplexity_increase": kw["max_perplexity_increase"],
            "eval_text": kw["eval_text"],
            "speculative_k": kw["speculative_k"],
            "tensor_parallel": kw["tensor_parallel"],
            "pipeline_parallel": kw["pipeline_parallel"],
        }
    )
    if kw["recipe"]:
        options = with_recipe(kw["recipe"], options, click.get_current_context())
    if kw["precision"]:  # after the recipe: its pass list is what the precision's pass is appended to
        options = dataclasses.replace(options, passes=with_precision(options.passes, kw["precision"]))
    if "," in options.target or options.target == "all":  # compiler.farm: one artifact per target
        from aotforge.compiler.cli.farm import compile_many

        return compile_many(model, options, kw)
    if kw["explain_cache"] and options.cache_dir is None:
        raise click.BadParameter("--explain-cache needs --cache-dir", param_hint="--explain-cache")
    console = Console(stderr=True)
    with build_progress(console) as progress:
        result = build(model, options, progress=progress, direct_lookup=not kw["explain_cache"])
    if options.prepare_only:
        console.print(
            f"bundle for {options.target} written; finish it with: aotforge finish {result.path}",
            markup=False,
            soft_wrap=True,
        )
        click.echo(json.dumps({"path": str(result.path), "bundle": True}) if kw["as_json"] else str(result.path))
        return
    m = result.manifest
    console.print(manifest_summary(m.to_dict()), markup=False, highlight=False)
    console.print(_digest_line(result.path), markup=False, highlight=False, soft_wrap=True)
    if "cache" in m.build:
        console.print(_cache_line(m.build["cache"]), markup=False, highlight=False, soft_wrap=True)
    if kw["sign_key"]:
        from aotforge.artifacts.signing import sign

        sign(result.path, kw["sign_key"])
        console.print(f"signed: {result.path / 'manifest.sig'}", markup=False, soft_wrap=True)
    pushed = None
    if kw["push_to"]:
        from aotforge.artifacts.registry import open_registry

        ref_name, ref_version = open_registry(kw["push_to"]).push(result.path)
        console.print(f"pushed to {kw['push_to']} as {ref_name}:{ref_version}", markup=False, soft_wrap=True)
        pushed = {"registry": kw["push_to"], "ref": f"{ref_name}:{ref_version}"}
    if kw["as_json"]:
        click.echo(json.dumps(compile_report(result.path, m.to_dict(), pushed), indent=2, sort_keys=True))
        return
    click.echo(str(result.path))


def compile_report(path: Path, m: dict[str, Any], pushed: dict[str, str] | None) -> dict[str, Any]:
    """``compile --json``: where the artifact is, what it is, and its figures (the manifest has the rest)."""
    from aotforge.artifacts.hashing import sha256_file

    v = m["validation"]
    return {
        "path": str(path),
        "name": m["name"],
        "version": m["version"],
        "target": m["target"]["name"],
        "passes": [p["name"] for p in m["passes"]],
        "manifest_sha256": sha256_file(path / "manifest.json"),
        "validation": {k: v[k] for k in ("passed", "tolerance", "metrics", "token_agreement") if k in v},
        "benchmark": m["benchmark"],
        "files": sorted(m["files"]),
        "cache": m["build"].get("cache"),
        "signed": (path / "manifest.sig").is_file(),
        "pushed": pushed,
    }


def _digest_line(path: Path) -> str:
    """The manifest's own sha256: with it, ``verify`` and ``load`` notice an edit to the manifest too."""
    from aotforge.artifacts.hashing import sha256_file

    digest = sha256_file(path / "manifest.json")
    return f"manifest sha256: {digest} (check: aotforge verify {path} --manifest-sha256 {digest})"


def _tuning_options(kw: dict[str, Any]) -> dict[str, str]:
    """``--tune-trials`` / ``--tune-minutes`` are spellings of the tvm target options of those names."""
    return {k: str(kw[k]) for k in ("tune_trials", "tune_minutes") if kw[k]}


def _pass_params(pairs: tuple[tuple[str, str], ...]) -> dict[str, dict[str, str]]:
    """``int8.method=percentile`` -> ``{"int8": {"method": "percentile"}}``."""
    params: dict[str, dict[str, str]] = {}
    for key, value in pairs:
        name, dot, field = key.partition(".")
        if not dot or not field:
            raise click.BadParameter(f"{key!r} is not PASS.KEY, e.g. int8.method", param_hint="--pass-opt")
        params.setdefault(name, {})[field] = value
    return params


def _cache_line(cache: dict[str, Any]) -> str:
    key = str(cache.get("key", ""))[:12]
    if cache.get("direct") is True:
        return f"  cache: hit (direct) {key}; {cache.get('reused', '')}"
    line = f"  cache: {'hit' if cache.get('hit') else 'miss'} {key}"
    if not cache.get("hit"):
        line += f" ({cache.get('explain', '')})"
    return line + (f"; direct mode: {cache['direct']}" if cache.get("direct") else "")
