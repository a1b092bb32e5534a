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

``--model mobilenet`` measures the MobileNet-style CNN of tests/user_cnn.py instead (depthwise
convs, BatchNorm, ReLU6; built in test code, not examples/) at ``--size`` (default 96), as a user
would build it: ``--passes O1,int8 --calibration`` (64 seeded images) ``--accuracy-budget 0.999``
(the search picks the method), for onnxruntime (and its ``optimization_level=all``) and tvm;
agreement with the torch module; every artifact timed through ``aotforge.load`` in its own process
(tools/artifact_timing.py).
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


def mobilenet(args: argparse.Namespace) -> None:
    """The ``--model mobilenet`` table: fp32 vs the int8 pass's search, per target, side by side."""
    import torch

    import aotforge
    from aotforge import build
    from tests import user_cnn
    from tools.artifact_timing import ratio, round_robin

    size = args.size or 96
    model = user_cnn.mobilenet(size=size)
    calib = args.work / "calibration"
    shutil.rmtree(args.work, ignore_errors=True)
    calib.mkdir(parents=True)
    np.save(calib / "images.npy", user_cnn.images(args.calibration, seed=1, size=size))
    example = {"image": torch.from_numpy(user_cnn.images(1, seed=5, size=size)[0])}
    level_all = {"target_options": {"optimization_level": "all"}}
    int8 = {"calibration": str(calib), "accuracy_budget": 0.999}
    variants = {
        "onnxruntime fp32": ("onnxruntime", ["O1"], {}),
        "onnxruntime int8": ("onnxruntime", ["O1", "int8"], int8),
        "onnxruntime fp32, level all": ("onnxruntime", ["O1"], level_all),
        "onnxruntime int8, level all": ("onnxruntime", ["O1", "int8"], {**int8, **level_all}),
        "tvm fp32": ("tvm", ["O1"], {}),
        "tvm int8": ("tvm", ["O1", "int8"], int8),
    }
    artifacts, methods = {}, {}
    for name, (target, passes, extra) in variants.items():
        if target not in args.targets:
            continue
        out = args.work / "artifacts"
        slug = name.replace(" ", "_").replace(",", "")
        result = build(
            model, example_inputs=example, target=target, out=out, name=slug, passes=passes, bench=False,
            tolerance=0.5, **extra,
        )  # fmt: skip
        artifacts[name] = result.path
        stats = next((p["stats"] for p in result.manifest.passes if p["name"] == "int8"), {})
        methods[name] = stats.get("method", "")
    test = user_cnn.images(args.inputs, seed=2, size=size)
    with torch.no_grad():
        ref = model(torch.from_numpy(test[:, 0])).numpy().argmax(1)
    agree = {}
    for name, path in artifacts.items():
        runner = aotforge.load(path)
        got = np.concatenate([next(iter(runner.run({"image": x}).values())) for x in test])
        agree[name] = float(np.mean(got.argmax(1) == ref))
    feed_file = args.work / "feed.npz"
    np.savez(feed_file, image=test[0])
    times = round_robin(artifacts, feed_file, args.rounds, args.runs)
    print(
        f"MobileNet-style CNN (tests/user_cnn.py), batch 1, 3x{size}x{size}, aotforge artifacts via aotforge.load, "
        f"each in its own process; top-1 agreement with the torch module on {args.inputs} seeded images; "
        f"latency: median of {args.rounds} round-robin rounds of {args.runs} runs"
    )
    print("| artifact | method chosen | top-1 agreement | p50 ms | vs its fp32 (per-round median) | vs ORT fp32 |")
    print("|---|---|---|---|---|---|")
    for name in artifacts:
        base = name.replace("int8", "fp32")
        ms = statistics.median(times[name])
        row = f"| {name} | {methods[name] or '-'} | {agree[name]:.1%} | {ms:.3f} | {ratio(times, name, base):.2f}x |"
        vs_ort = f"{ratio(times, name, 'onnxruntime fp32'):.2f}x" if "onnxruntime fp32" in times else "-"
        print(f"{row} {vs_ort} |")  # no ORT column with --targets tvm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", nargs="+", default=["onnxruntime", "tvm"], help="with --model mobilenet")
    ap.add_argument("--model", default="examples/resnet18_style.py")
    ap.add_argument("--size", type=int, default=0, help="image size (default 224; mobilenet 96)")
    ap.add_argument("--inputs", type=int, default=256)
    ap.add_argument("--calibration", type=int, default=32)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "cnn_int8")
    ap.add_argument("--time", type=Path, help=argparse.SUPPRESS)  # worker mode: time one model
    args = ap.parse_args()
    if args.model == "mobilenet":
        mobilenet(args)
        return
    args.size = args.size or 224
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
