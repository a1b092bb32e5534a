"""``make bench``: every runtime on every benchmark model, side by side in one run.

For each model the ORT fp32 artifact is built first; its validation inputs are what every other
runtime is timed on. aotforge variants are built with ``aotforge compile --no-bench`` and every
runtime is then timed by tools/bench_worker.py in a process of its own (thread pools of
different runtimes spin and steal each other's cores), in ``--rounds`` alternating rounds (on a shared
machine the load drifts between one runtime's run and the next: a ratio taken within each round and then
the median over rounds holds where one run each does not). p50 (median over the rounds of each run's
median of >= 30 calls after warm-up), p90, and the ratio to ORT fp32 go to ``results.md`` /
``results.json`` with a chart, ``latency.png``, and the run with every figure's spread over the rounds to
``docs/bench/models.json`` (``--json``), which ``tools/bench_page.py`` renders into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import bench_record  # tools/, beside this script

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "ort fp32"


@dataclasses.dataclass(frozen=True)
class Model:
    file: str
    args: tuple[str, ...] = ()
    int8: str = "O1,int8-dynamic"
    #: a model of tools/user_models.py, exported to ONNX the user's way (torch.onnx.export(dynamo=True),
    #: dynamic axes) before the builds; ``file`` is then that ONNX file.
    user_model: str = ""

    @property
    def torch_source(self) -> str:
        """What tools/bench_worker.py builds the torch module from: a model file, or file:name."""
        return f"{USER_MODELS}:{self.user_model}" if self.user_model else self.file


USER_MODELS = "tools/user_models.py"
_BATCH_1 = ("--dynamic", "batch=1:1:1")
MODELS = {
    "cnn": Model("examples/resnet18_style.py", int8="O1,int8"),
    "minilm": Model("examples/minilm.py", ("--dynamic", "seq=1:128:128")),
    "bert-base": Model("examples/bert_base.py", ("--dynamic", "seq=1:128:128")),
    # Models users bring (not in examples/): their own ONNX exports, with dynamic axes.
    "minilm-user": Model(
        "minilm_user.onnx",
        (*_BATCH_1, "--dynamic", "seq=1:128:128", "--input-range", "input_ids=0:30522"),
        user_model="minilm_user",
    ),
    "mobilenet": Model("mobilenet.onnx", _BATCH_1, int8="O1,int8", user_model="mobilenet"),
    "vit": Model("vit.onnx", _BATCH_1, user_model="vit"),
    # Small enough to check the bench itself in a minute; not in the default list.
    "mini_resnet": Model("examples/mini_resnet.py", int8="O1,int8"),
}
DEFAULT_MODELS = "cnn,minilm,bert-base,minilm-user,mobilenet,vit"
# name -> (how it is timed, aotforge compile arguments or None for a worker-only runtime)
VARIANTS: dict[str, tuple[str, list[str] | None]] = {
    "torch eager": ("torch-eager", None),
    "torch.compile": ("torch-compile", None),
    BASELINE: ("artifact", ["--target", "onnxruntime"]),
    "ort int8": ("artifact", ["--target", "onnxruntime", "--passes", "{int8}", "--tolerance", "0.3"]),
    "tvm untuned": ("tvm-untuned", None),
    "tvm": ("artifact", ["--target", "tvm"]),
    # The tuning store sits beside the artifacts, so a second bench run re-uses the search.
    "tvm tuned": (
        "artifact",
        ["--target", "tvm", "--target-opt", "tune_trials={trials}", "--target-opt", "tuning_db={tuning_db}"],
    ),
    "tvm int8": ("artifact", ["--target", "tvm", "--passes", "{int8}", "--tolerance", "0.3"]),
    "tvm bf16": ("artifact", ["--target", "tvm", "--passes", "O1,bf16", "--tolerance", "0.05"]),
}


def _env() -> dict[str, str]:
    return {**os.environ, "TVM_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "failed without output"


def compile_variant(model: Model, args: list[str], out: Path, trials: int) -> tuple[Path | None, float, str]:
    filled = [a.format(int8=model.int8, trials=trials, tuning_db=out.parent.parent / "tvm-tuning") for a in args]
    cmd = [sys.executable, "-m", "aotforge", "compile", model.file, *model.args, *filled, "--no-bench"]
    started = time.perf_counter()
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, env=_env(), cwd=ROOT)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        return None, seconds, _last_line(proc.stderr)
    return Path(_last_line(proc.stdout)), seconds, ""


def export_user_model(model: Model, models_dir: Path) -> Model:
    """``model`` with its user-style ONNX export in ``models_dir`` (exported once, in a process of its own)."""
    if not model.user_model:
        return model
    path = models_dir / model.file
    if not path.exists():
        cmd = [sys.executable, str(ROOT / USER_MODELS), model.user_model, str(path)]
        subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, check=True)
    return dataclasses.replace(model, file=str(path))


def time_variant(kind: str, artifact: Path, inputs_from: Path, model: Model, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "tools" / "bench_worker.py"), kind, "--artifact", str(artifact)]
    cmd += ["--inputs-from", str(inputs_from), "--model", model.torch_source, "--seconds", str(seconds)]
    if kind == "tvm-untuned":  # seconds per run: a long warm-up would dominate the whole bench
        cmd += ["--warmup", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT)
    if proc.returncode != 0:
        return {"error": _last_line(proc.stderr)}
    return dict(json.loads(_last_line(proc.stdout)))


def build_variants(model: Model, variants: list[str], out: Path, trials: int) -> tuple[Path | None, list[dict]]:
    """The ORT fp32 artifact (whose validation inputs every runtime is timed on) and a row per variant:
    its artifact to time, or why there is none."""
    baseline, build_s, error = compile_variant(model, VARIANTS[BASELINE][1] or [], out / "ort", trials)
    if baseline is None:
        return None, [{"variant": BASELINE, "error": error}]
    rows: list[dict] = []
    for variant in variants:
        args = VARIANTS[variant][1]
        if variant == "tvm tuned" and trials <= 0:
            rows.append({"variant": variant, "error": "skipped: pass --tune-trials N"})
        elif args is None or variant == BASELINE:
            rows.append({"variant": variant, "artifact": baseline, "build_s": round(build_s, 1) if args else None})
        else:
            built, seconds, error = compile_variant(model, args, out / variant.replace(" ", "-"), trials)
            row = {"variant": variant, "build_s": round(seconds, 1)}
            rows.append({**row, "artifact": built} if built else {**row, "error": error})
    return baseline, rows


def run_model(name: str, model: Model, variants: list[str], out: Path, bench: argparse.Namespace) -> list[dict]:
    """Every variant of one model timed in ``bench.rounds`` alternating rounds, each run in a process of its own
    (each round starts one variant later); a row's p50 is the median of its rounds' p50s and its ratio to ORT fp32
    the median of the per-round ratios, so a load spike in one round moves neither much."""
    try:
        model = export_user_model(model, out.parent / "models")
    except subprocess.CalledProcessError as e:
        return [{"model": name, "variant": BASELINE, "error": f"export failed: {_last_line(e.stderr)}"}]
    baseline, built = build_variants(model, variants, out / name, bench.tune_trials)
    if baseline is None:
        return [{"model": name, **built[0]}]
    dims = timed_dims(baseline)
    built = [{**r, "dims": dims} for r in built]
    timed = [r for r in built if "artifact" in r]
    if not any(r["variant"] == BASELINE for r in timed):
        timed.append({"variant": BASELINE, "artifact": baseline, "hidden": True})  # the ratios need it
    runs: dict[str, list[dict[str, Any]]] = {r["variant"]: [] for r in timed}
    for round_ in range(bench.rounds):
        shift = round_ % len(timed)
        for r in timed[shift:] + timed[:shift]:
            runs[r["variant"]].append(
                time_variant(VARIANTS[r["variant"]][0], r["artifact"], baseline, model, bench.seconds)
            )
    base_runs = runs[BASELINE]
    rows: list[dict] = []
    for r in built:
        row: dict[str, Any] = {"model": name, **{k: v for k, v in r.items() if k not in ("artifact", "hidden")}}
        if r.get("hidden") or "error" in r:
            rows += [] if r.get("hidden") else [row]
            continue
        ok = [x for x in runs[r["variant"]] if "error" not in x]
        if not ok:
            rows.append({**row, "error": runs[r["variant"]][-1]["error"]})
            continue
        row.update(ok[-1])
        if row.get("build_s") is None:
            row["build_s"] = row.get("setup_seconds")
        for key in ("p50_ms", "p90_ms", "peak_rss_mb"):
            row[key] = round(float(median([x[key] for x in ok])), 4)
            row[f"{key}_rounds"] = [x[key] for x in ok]
        row["runs"], row["rounds"] = sum(x["runs"] for x in ok), len(ok)
        ratios = [
            x["p50_ms"] / b["p50_ms"]
            for x, b in zip(runs[r["variant"]], base_runs, strict=True)
            if "error" not in x and "error" not in b
        ]
        if ratios:
            row["vs_ort_fp32"] = round(float(median(ratios)), 3)
            row["vs_ort_fp32_rounds"] = [round(x, 3) for x in ratios]
        rows.append(row)
        print(_row_md(row, None), flush=True)
    return rows


def timed_dims(baseline: Path) -> str:
    """The dims every runtime of a model is timed at: those the ORT fp32 artifact validated with."""
    manifest = json.loads((baseline / "manifest.json").read_text())
    dims = sorted(manifest["validation"]["bound_dims"].items())
    return " ".join(f"{k}={v}" for k, v in dims) or "its static shapes"


TABLE_HEAD = "| model | timed at | runtime | p50 ms | p90 ms | vs ORT fp32 | runs | build s | peak RSS MB |"


def _row_md(r: dict, _base: float | None) -> str:
    if "error" in r:
        return f"| {r['model']} | {r.get('dims', '')} | {r['variant']} | {r['error'][:140]} | | | | | |"
    ratio = f"{r['vs_ort_fp32']:.2f}x" if "vs_ort_fp32" in r else ""
    return (
        f"| {r['model']} | {r['dims']} | {r['variant']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {ratio} "
        f"| {r['runs']} "
        f"| {r.get('build_s', '')} | {r['peak_rss_mb']:.0f} |"
    )


def page_tables(rows: list[dict]) -> list[dict]:
    """docs/benchmarks.md's tables: one per model, each runtime's figures with their spread over the rounds."""
    tables = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        cells = []
        for r in mine:
            if "error" in r:
                cells.append([r["variant"], f"not timed: {r['error'][:160]}", None, None, None, None, None])
                continue
            cells.append(
                [
                    r["variant"],
                    bench_record.figure(r["p50_ms_rounds"]),
                    bench_record.figure(r["p90_ms_rounds"]),
                    bench_record.figure(r["vs_ort_fp32_rounds"]) if "vs_ort_fp32_rounds" in r else None,
                    bench_record.figure(r["peak_rss_mb_rounds"], 1),
                    r["runs"],
                    r.get("build_s"),
                ]
            )
        dims = next((r["dims"] for r in mine if "dims" in r), "")
        columns = ("runtime", "p50 ms", "p90 ms", "p50 / ORT fp32", "peak RSS MB", "calls", "build s")
        tables.append(bench_record.table(f"{model}, timed at {dims}", columns, cells))
    return tables


def write_results(rows: list[dict], out: Path, header: str) -> None:
    table = [TABLE_HEAD, "|---" * TABLE_HEAD.count("|", 1) + "|"] + [_row_md(r, None) for r in rows]
    (out / "results.md").write_text(header + "\n\n" + "\n".join(table) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, out / "latency.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        timed = [r for r in rows if r["model"] == model and "p50_ms" in r]
        ax.barh([r["variant"] for r in timed], [r["p50_ms"] for r in timed], color="tab:blue")
        ax.set_xscale("log")
        ax.invert_yaxis()
        dims = next((r["dims"] for r in timed if "dims" in r), "")
        ax.set_title(f"{model} ({dims}): p50 ms (log)", fontsize=9)
        for i, r in enumerate(timed):
            ax.text(r["p50_ms"], i, f" {r['p50_ms']:.2f} ({r.get('vs_ort_fp32', 0):.2f}x)", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list of runtimes")
    parser.add_argument("--seconds", type=float, default=4.0, help="timing budget per runtime and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians over them")
    parser.add_argument("--tune-trials", type=int, default=0, help="MetaSchedule trials for 'tvm tuned'")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "models.json", help="the page's file")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS] + [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        sys.exit(f"unknown model or runtime {unknown}: choose from {list(MODELS)} and {list(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    run = bench_record.start({**vars(args), "threads": 2})
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    header = (
        f"2 threads, at the dims of each row's 'timed at' column; each runtime in a process of its own, "
        f"{args.rounds} alternating rounds of >= 30 runs "
        f"after warm-up ({args.seconds:g} s budget each); p50 and ratio: medians over the rounds; "
        f"{os.cpu_count()} CPUs, load average at the start {load}"
    )
    print(f"{header}\n\n{TABLE_HEAD}\n" + "|---" * TABLE_HEAD.count("|", 1) + "|", flush=True)
    rows: list[dict] = []
    for name in args.models.split(","):
        rows += run_model(name, MODELS[name], variants, args.out / "artifacts", args)
        write_results(rows, args.out, header)
    bench_record.write(args.json, "models", run, page_tables(rows), rows)
    print((args.out / "results.md").read_text())
    print(f"results: {args.out / 'results.md'}, {args.out / 'results.json'}, chart: {args.out / 'latency.png'}")


if __name__ == "__main__":
    main()
