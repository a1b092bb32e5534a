"""The CNN int8 figure: ResNet-18-style fp32 vs static int8 (QDQ) on ONNX Runtime, built by aotforge.

Issue 3 asks top-1 agreement >= 99 % with fp32 on 256 inputs at >= 1.8x the speed. Both
artifacts are ``aotforge.build(examples/resnet18_style.py, target="onnxruntime")``: fp32 with
``--passes O1``, int8 with ``O1,int8`` (static QDQ, per-channel weights, calibrated on
--calibration seeded images), once with the pass's default uint8 activations and once with
``activations=int8`` (what it used before: ORT left the 11 Convs reading a block input float,
1.3-1.5x); then fp32 and uint8 int8 again with ``--target-opt optimization_level=all`` (ORT's
layout passes: NCHWc fp32 Convs, NHWC int8 ones), each against the fp32 of its level.
Agreement: argmax of the logits on 256 other seeded images (batch 1, 3x224x224). Latency:
model.ort.onnx as the runner loads it, 2 threads, each variant in its own process, median of
--runs after warm-up, --rounds round-robin rounds.

    .venv/bin/python tools/cnn_int8.py [--model examples/resnet18_style.py] [--inputs 256]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def images(count: int, seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 1, 3, size, size)).astype(np.float32)


def session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = 2, 1, 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized at build time
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def time_one(path: Path, size: int, runs: int) -> float:
    from aotforge.compiler.benchmark import BenchOptions, benchmark

    sess = session(path)
    feed = {sess.get_inputs()[0].name: images(1, 7, size)[0]}
    options = BenchOptions(warmup=5, min_runs=runs, max_runs=runs, max_seconds=float("inf"))
    return benchmark(lambda x: sess.run(None, x), feed, options).p50_ms


def heavy_ops(path: Path) -> str:
    """Conv / Add / Gemm counts in the optimized graph: which run float and which as int8 kernels."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        if any(k in node.op_type for k in ("Conv", "Add", "Gemm")):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return " ".join(f"{op} {n}" for op, n in sorted(counts.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="examples/resnet18_style.py")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--inputs", type=int, default=256)
    ap.add_argument("--calibration", type=int, default=32)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "cnn_int8")
    ap.add_argument("--time", type=Path, help=argparse.SUPPRESS)  # worker mode: time one model
    args = ap.parse_args()
    if args.time:
        print(json.dumps({"ms": time_one(args.time, args.size, args.runs)}))
        return
    from aotforge.compiler.api import build

    calib = args.work / "calibration"
    shutil.rmtree(args.work, ignore_errors=True)
    calib.mkdir(parents=True)
    np.save(calib / "images.npy", images(args.calibration, 1, args.size))  # a stack: one file, many samples
    models, refs = {}, {}
    s8 = {"int8": {"activations": "int8"}}
    level_all = {"target_options": {"optimization_level": "all"}}  # ORT's NCHWc / NHWC layout passes too
    int8_all = {"calibration": str(calib), **level_all}
    for name, ref, passes, extra in (
        ("fp32 (O1)", "fp32 (O1)", ["O1"], {}),
        ("int8 QDQ u8 activations", "fp32 (O1)", ["O1", "int8"], {"calibration": str(calib)}),
        ("int8 QDQ s8 activations", "fp32 (O1)", ["O1", "int8"], {"calibration": str(calib), "pass_params": s8}),
        ("fp32 (O1), ORT level all", "fp32 (O1), ORT level all", ["O1"], level_all),
        ("int8 u8, ORT level all", "fp32 (O1), ORT level all", ["O1", "int8"], int8_all),
    ):
        refs[name] = ref
        result = build(
            str(ROOT / args.model),
            target="onnxruntime",
            out=args.work / "artifacts",
            name=name.replace(" ", "_").replace(",", ""),
            passes=passes,
            bench=False,
            tolerance=0.5,
            **extra,
        )
        models[name] = result.path / "model.ort.onnx"
    test = images(args.inputs, 2, args.size)
    logits = {}
    for name, path in models.items():
        sess = session(path)
        feed_name = sess.get_inputs()[0].name
        logits[name] = np.concatenate([sess.run(None, {feed_name: x})[0] for x in test])
    ref = logits["fp32 (O1)"]
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, path in models.items():
            cmd = [sys.executable, __file__, "--time", str(path), "--size", str(args.size), "--runs", str(args.runs)]
            times[name].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["ms"])
    print(
        f"{args.model}, batch 1, 3x{args.size}x{args.size}, ORT CPU 2 threads, aotforge artifacts; top-1 agreement "
        f"with fp32 on {args.inputs} seeded inputs; latency: median of {args.rounds} per-process medians of {args.runs}"
    )
    print("Speed-ups are against the fp32 artifact built with the same ORT optimization level.")
    print("| variant | top-1 agreement | p50 ms | speedup vs fp32 | per-round speedup (median) | per-round ms | ops |")
    print("|---|---|---|---|---|---|---|")
    for name in models:
        agree = float(np.mean(logits[name].argmax(1) == ref.argmax(1)))
        ms = statistics.median(times[name])
        base = statistics.median(times[refs[name]])
        speedup = statistics.median(b / t for t, b in zip(times[name], times[refs[name]], strict=True))
        rounds = " / ".join(f"{t:.1f}" for t in times[name])
        ops = heavy_ops(models[name])
        print(f"| {name} | {agree:.1%} | {ms:.2f} | {base / ms:.2f}x | {speedup:.2f}x | {rounds} | {ops} |")


if __name__ == "__main__":
    main()
