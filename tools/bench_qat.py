"""Quantization-aware training of a real model (issue 31), made and measured (``make bench-qat``).

SmolLM2-135M-Instruct's int4 build (the default int4 method, ``DECODER_INT4_METHOD``) against the int4 build of what
``aotforge qat`` made of it in a CPU-time budget, each built in a process of its own and scored by the build's
quality gate on the same held-out text (the gate's corpus: ``aotforge qat`` trains on other stdlib modules'
docstrings): perplexity and mean KL against the fp32 model. The share of the int4 perplexity gap recovered is
``(baseline - trained) / (baseline - fp32)``, on the gate's figures. The trained model's build skips calibration
(``weight_calibration.py``), so it is packed with exactly the rounding training computed through.

The trained model is made once into --work (a later run builds and scores the same one); --baseline reads the
gate's figures of an int4 artifact built before (``make bench-serve``'s onnxruntime int4 is one) instead of
building it. Results: ``docs/bench/qat.json`` -> ``docs/benchmarks.md``.

    python tools/bench_qat.py [--work /tmp/aotforge-qat-bench] [--cpu-minutes 20] [--baseline ARTIFACT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotforge.passes.quantize_weight_only import DECODER_INT4_METHOD  # noqa: E402
from tools import bench_record  # noqa: E402
from tools.bench_children import PREFIX, run_child  # noqa: E402
from tools.bench_quality import THREADS, artifact_figures, build  # noqa: E402
from tools.real_model import smollm2_dir  # noqa: E402

#: ``aotforge qat``'s options beside its defaults: a learning rate large enough that a few dozen steps move weights
#: across rounding boundaries (the default fine-tuning rate moves them a small fraction of a 4-bit step), decayed
#: to 0 over the budget so the run ends on a settled model wherever the budget stops it.
RECIPE = ["--lr", "1e-4", "--schedule", "cosine"]


def make_qat(model: Path, out: Path, cpu_minutes: float, wall_minutes: float) -> dict[str, Any]:
    """``aotforge qat`` of ``model`` into ``out`` (kept: a later run scores the same model); the whole command's
    CPU time (loading, calibrating the starting weights, training, scoring), which the budget does not cover."""
    cmd = [sys.executable, "-m", "aotforge", "qat", str(model), "--out", str(out), "--target", "onnxruntime"]
    cmd += ["--max-cpu-minutes", str(cpu_minutes), "--max-minutes", str(wall_minutes), *RECIPE]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"command": cmd[1:], "command_cpu_seconds": round(spent, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-qat-bench"))
    parser.add_argument("--qat", type=Path, help="an existing aotforge qat output (default: made into --work)")
    parser.add_argument("--baseline", type=Path, help="an int4 artifact of the fp32 model built before")
    parser.add_argument("--cpu-minutes", type=float, default=20.0, help="qat's training budget, CPU-minutes")
    parser.add_argument("--wall-minutes", type=float, default=60.0, help="... and its wall-clock cap")
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "qat.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: build one model, print JSON
    args = parser.parse_args()
    if args.one:  # a child: ``model_dir:label``, built at int4 by make bench-quality's rule into --work/label
        model_dir, _, label = args.one.rpartition(":")
        print(PREFIX + json.dumps(build(Path(model_dir), args.work / label, "onnxruntime", DECODER_INT4_METHOD)))
        return
    model = smollm2_dir()
    trained = args.qat or args.work / "qat"
    run = bench_record.start(vars(args) | {"threads": THREADS, "model": str(model), "recipe": RECIPE})
    made = None
    if not (trained / "config.json").is_file():
        made = make_qat(model, trained, args.cpu_minutes, args.wall_minutes)

    def child(model_dir: Path, label: str) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--work", str(args.work), "--one", f"{model_dir}:{label}"]
        return run_child(cmd, env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})

    baseline = artifact_figures(args.baseline) if args.baseline else child(model, "baseline")
    after = child(trained, "trained")
    report = json.loads((trained / "qat_report.json").read_text())
    results = {
        "baseline": baseline,
        "trained": after,
        "qat": {**{k: v for k, v in report.items() if k != "start"}, "made_here": made},
        "gap_recovered": recovered(baseline, after),
    }
    print(json.dumps(results, indent=2))
    bench_record.write(args.json, "qat", run, tables(results), results)


def recovered(baseline: dict[str, Any], after: dict[str, Any]) -> float | None:
    """The share of the baseline's perplexity gap to fp32 that the trained model's build closes (gate figures)."""
    if "quality" not in baseline or "quality" not in after:
        return None
    base, got = baseline["quality"], after["quality"]
    gap = base["perplexity"] - base["reference_perplexity"]
    return round((base["perplexity"] - got["perplexity"]) / gap, 4) if gap > 0 else None


def tables(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[list[bench_record.Cell]] = []
    base, after = results["baseline"], results["trained"]
    reference = base.get("quality", {}).get("reference_perplexity")
    if reference is not None:
        rows.append(["fp32 (transformers)", reference, "-", "-", "-"])
    labelled = ((f"int4 {DECODER_INT4_METHOD} (the default int4 build)", base), ("int4 of aotforge qat's model", after))
    for label, got in labelled:
        q = got.get("quality")
        if q is None or reference is None:
            rows.append([label, f"not built: {got}", None, None, None])
            continue
        share = results["gap_recovered"] if got is after else "-"
        rows.append([label, q["perplexity"], f"{q['perplexity'] / reference - 1:+.1%}", q["mean_kl"], share])
    quality = bench_record.table(
        "int4 perplexity of SmolLM2-135M-Instruct on held-out text, before and after aotforge qat (onnxruntime)",
        ["build", "perplexity", "vs fp32", "mean KL from its float source", "share of the int4 gap recovered"],
        rows,
        note="Each row is an artifact's own quality gate (the stdlib docstrings of the gate's corpus, 2,044 tokens, "
        "4 windows of 513; never in qat's training text), vs fp32 against the original fp32 model. The gate's KL "
        "is from the float model the build was made from: the trained float weights for qat's row. The head at 8 "
        "bits, blocks of 32.",
    )
    qat = results["qat"]
    before_t, after_t = qat.get("before", {}), qat.get("after", {})
    made = qat.get("made_here") or {}
    training = bench_record.table(
        "The training run (aotforge qat)",
        [
            "steps",
            "tokens",
            "train CPU s",
            "train s (wall)",
            "whole command CPU s",
            "torch int4 perplexity before -> after",
            "its gap recovered",
        ],
        [
            [
                qat.get("steps"),
                qat.get("tokens_seen"),
                qat.get("train_cpu_seconds"),
                qat.get("train_seconds"),
                made.get("command_cpu_seconds"),
                f"{before_t.get('student_perplexity', 0):.3f} -> {after_t.get('student_perplexity', 0):.3f} "
                f"(fp32 {after_t.get('teacher_perplexity', 0):.3f})",
                qat.get("gap_recovered"),
            ]
        ],
        note=f"aotforge qat options: {json.dumps(qat.get('options'), sort_keys=True)}; starting weights: "
        f"{qat.get('start_method')}; autocast {qat.get('autocast')}. Its own before / after score the fake-quantized "
        "model in torch on the same text in windows of --seq-len; the whole command's CPU includes loading, the "
        "starting weights' calibration and that scoring, which the budget does not cover.",
    )
    return [quality, training]


if __name__ == "__main__":
    main()
