"""all-MiniLM-L6-v2 fp32 vs int8 on ONNX Runtime, side by side in one run, every variant built by aotforge.

Each variant is an artifact of ``aotforge.build(examples/minilm.py, target="onnxruntime")``:
the baseline is the plain fp32 one (``--passes O1``, no ORT contrib fusions in the graph), the
winner is ``--recipe examples/minilm_int8.toml``; the others are the earlier attempts, as pass
options, for comparison. Quality: embedding cosine vs the fp32 artifact on the 64 evaluation
sentences of examples/minilm_sentences.py (never calibrated on), batch 1, padded to seq 128.
Latency: each artifact's model.ort.onnx loaded as its runner does (ORT CPU, graph optimizations
already applied offline), 2 intra-op threads, each variant timed in its own process (ORT thread
pools spin after a call), median of --runs after 10 warm-up runs, --rounds round-robin rounds.

    .venv/bin/python tools/minilm_int8.py [--runs 40] [--rounds 3] [--work build/minilm_int8]

``--user-export`` measures a user's own export instead (tests/user_minilm.py: the real weights as
``BertModel`` + mean pooling, ``torch.onnx.export(dynamo=True)`` with dynamic batch / seq; not
examples/minilm.py), built as a user would: ``--passes O1,int8``, ``O1,int8-dynamic`` or (onnxruntime)
``optimize,fuse-ort,int8-dynamic`` (QAttention, SkipLayerNormalization split) with
``--calibration`` (128 stdlib docstring sentences) and ``--accuracy-budget 0.995`` (and a least
per-sentence cosine of 0.99), for onnxruntime and tvm; quality on 64 other sentences vs the source
ONNX on ORT fp32; every artifact timed through ``aotforge.load`` in its own process
(tools/artifact_timing.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SEQ = 128
RECIPE = ROOT / "examples" / "minilm_int8.toml"
#: The builds' own validation runs on random token ids, where int8's error is well above its error on text (more so on
#: a CPU without VNNI): it only catches a broken artifact here, and the tables measure quality on held-out text.
VALIDATION_TOLERANCE = 0.3
_INT8 = ("optimize", "fuse-ort", "int8-dynamic")
_PLAIN = {"per_channel": True, "op_types": ["MatMul", "Attention"], "qattention": False}
#: QAttention needs the padding mask verified on a few real inputs (else Attention stays float).
_MASK = {"qattention": True, "calibration_dir": "examples/minilm_sentences.py:calibration_feeds", "samples": 4}

#: name -> build overrides (None: the recipe).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "fp32 (O1)": {"passes": ["O1"]},
    "dyn-pc": {"passes": list(_INT8), "pass_params": {"int8-dynamic": _PLAIN}},
    "dyn-pc keep FFN-out fp32": {
        "passes": list(_INT8),
        "pass_params": {"int8-dynamic": {**_PLAIN, "exclude_weight_shapes": ["1536x384"]}},
    },
    "dyn-pc +QAttention": {"passes": list(_INT8), "pass_params": {"int8-dynamic": {**_PLAIN, **_MASK}}},
    "dyn-pc +QAttention +smooth 0.8 (all 24)": {
        "passes": list(_INT8),
        "pass_params": {"int8-dynamic": {**_PLAIN, **_MASK, "smooth_alpha": 0.8, "samples": 64}},
    },
    "recipe: +QAttention +split SkipLN +smooth 0.8 (14)": None,
    # The SkipLN split is no int8 gain: this is the fp32 figure the recipe's would be without int8.
    "fp32 +split SkipLN (reference)": {
        "passes": ["optimize", "fuse-ort", "int8-dynamic"],
        "pass_params": {"int8-dynamic": {"split_skip_layer_norm": True, "nodes_to_exclude": ["*"]}},
    },
}


def build_all(work: Path) -> dict[str, Path]:
    """Each variant's model.ort.onnx; the int8 pass's manifest stats are printed as they come."""
    from aotforge.compiler.api import build

    out = work / "artifacts"
    shutil.rmtree(out, ignore_errors=True)
    models = {}
    for i, (name, overrides) in enumerate(VARIANTS.items()):
        kw: dict[str, Any] = {
            "target": "onnxruntime",
            "out": out,
            "name": f"v{i}",
            "bench": False,
            "tolerance": VALIDATION_TOLERANCE,
        }
        started = time.perf_counter()
        result = build(
            str(ROOT / "examples" / "minilm.py"),
            recipe=RECIPE if overrides is None else None,
            **kw,
            **(overrides or {}),
        )
        stats = next((p["stats"] for p in result.manifest.passes if p["name"] == "int8-dynamic"), {})
        keep = {k: stats[k] for k in ("ops", "excluded", "attention", "eval", "accuracy_budget") if k in stats}
        print(f"built {name} in {time.perf_counter() - started:.0f} s: {json.dumps(keep)}", file=sys.stderr)
        models[name] = result.path / "model.ort.onnx"
    return models


def session(path: Path, threads: int = 2):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized at build time
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def embeddings(path: Path, feeds: list[dict]) -> np.ndarray:
    sess = session(path)
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def time_one(path: Path, feed_file: Path, runs: int) -> float:
    feed = dict(np.load(feed_file))  # saved by main: the worker imports neither torch nor transformers
    from aotforge.compiler.benchmark import BenchOptions, benchmark

    sess = session(path)
    options = BenchOptions(warmup=10, min_runs=runs, max_runs=runs, max_seconds=float("inf"))
    return benchmark(lambda x: sess.run(None, x), feed, options).p50_ms


def user_export(args: argparse.Namespace) -> None:
    """The ``--user-export`` table: fp32 vs the int8 passes' search, onnxruntime and tvm, side by side."""
    from aotforge import build
    from aotforge.targets.onnxruntime import reference_session
    from tests.user_minilm import calibration_and_held_out, export_minilm, save_feeds
    from tools.artifact_timing import ratio, round_robin

    source = export_minilm(args.work / "user_export" / "model.onnx")
    calibration, held_out = calibration_and_held_out(128, 64, seq=SEQ)  # padded as a server batches them
    calib_dir = save_feeds(args.work / "user_calibration", calibration)
    budget = {"calibration": str(calib_dir), "accuracy_budget": 0.995}
    artifacts, stats = {}, {}
    for target in args.targets:
        for passes in (["O1"], ["O1", "int8"], ["O1", "int8-dynamic"], ["optimize", "fuse-ort", "int8-dynamic"]):
            if target == "tvm" and passes[-1] == "int8-dynamic":
                continue  # the same dynamic graph as int8's choice here; tvm runs either, and refuses fuse-ort
            name = f"{target} {'+'.join(passes)}"
            extra = {**budget, "pass_params": {passes[-1]: {"min_sample_cosine": 0.99}}} if len(passes) > 1 else {}
            slug = name.replace(" ", "_").replace("+", "-")  # artifact names: letters, digits, . _ -
            dims = ("batch=1:1:1", f"seq=1:{SEQ}:{SEQ}")
            out = args.work / "user_artifacts"
            result = build(
                str(source), target=target, out=out, name=slug, passes=passes, dynamic=dims, bench=False,
                tolerance=VALIDATION_TOLERANCE,
                **extra,
            )  # fmt: skip
            artifacts[name] = result.path
            record = next((p["stats"] for p in result.manifest.passes if p["name"] == passes[-1]), {})
            stats[name] = record.get("method", "")
            print(f"built {name}: {json.dumps(record.get('accuracy_budget', {}).get('tried', []))}", file=sys.stderr)
    import aotforge

    reference = reference_session(str(source))
    ref = np.concatenate([reference.run(None, f)[0] for f in held_out])
    quality = {}
    for name, path in artifacts.items():
        runner = aotforge.load(path)
        emb = np.concatenate([runner.run(f)["sentence_embedding"] for f in held_out])
        cos = np.sum(emb * ref, 1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1))
        quality[name] = (float(cos.mean()), float(cos.min()))
    feed_file = args.work / "user_feed.npz"
    np.savez(feed_file, **held_out[0])
    times = round_robin(artifacts, feed_file, args.rounds, args.runs)
    print(
        f"user export of all-MiniLM-L6-v2 (dynamo, dynamic batch/seq), seq {SEQ} batch 1, aotforge artifacts via "
        f"aotforge.load, each in its own process; {args.rounds} round-robin rounds of {args.runs} runs; cosine vs "
        f"the source ONNX (ORT fp32) on {len(held_out)} held-out sentences"
    )
    print("| artifact | method chosen | mean cos | min cos | p50 ms | vs same target fp32 | vs ORT fp32 |")
    print("|---|---|---|---|---|---|---|")
    for name in artifacts:
        fp32 = f"{name.split()[0]} O1"
        mean, low = quality[name]
        ms = statistics.median(times[name])
        row = f"| {name} | {stats[name] or '-'} | {mean:.4f} | {low:.4f} | {ms:.2f} | {ratio(times, name, fp32):.2f}x |"
        print(f"{row} {ratio(times, name, 'onnxruntime O1'):.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--user-export", action="store_true", help="a user's own dynamo export, not examples/minilm.py")
    ap.add_argument("--targets", nargs="+", default=["onnxruntime", "tvm"], help="with --user-export")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="round-robin timing rounds (the host is shared)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "minilm_int8")
    ap.add_argument("--reuse", action="store_true", help="time the artifacts of the last run without rebuilding")
    ap.add_argument("--time", type=Path, help=argparse.SUPPRESS)  # worker mode: time one model
    args = ap.parse_args()
    if args.time:
        print(json.dumps({"ms": time_one(args.time, args.work / "feed.npz", args.runs)}))
        return
    if args.user_export:
        args.work.mkdir(parents=True, exist_ok=True)
        user_export(args)
        return
    os.chdir(ROOT)  # the recipe names its calibration callables relative to the repository root
    from examples.minilm_sentences import calibration_feeds, evaluation_feeds

    args.work.mkdir(parents=True, exist_ok=True)
    index = args.work / "variants.json"
    if args.reuse and index.exists():
        models = {k: Path(v) for k, v in json.loads(index.read_text()).items()}
    else:
        models = build_all(args.work)
        index.write_text(json.dumps({k: str(v) for k, v in models.items()}, indent=1))
    feeds = evaluation_feeds(SEQ)
    np.savez(args.work / "feed.npz", **calibration_feeds(SEQ)[1])  # the timed input: a real sentence, seq 128
    base = next(iter(models))
    ref = embeddings(models[base], feeds)
    quality = {}
    for name, path in models.items():
        emb = embeddings(path, feeds)
        cos = np.sum(emb * ref, 1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1))
        quality[name] = (float(cos.mean()), float(cos.min()))
    # Round-robin, one process per measurement, so load on the shared host hits every variant alike.
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, path in models.items():
            cmd = [sys.executable, __file__, "--time", str(path), "--runs", str(args.runs), "--work", str(args.work)]
            times[name].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["ms"])
    base_ms = statistics.median(times[base])
    print(
        f"all-MiniLM-L6-v2, seq {SEQ}, batch 1, ORT CPU 2 threads, aotforge onnxruntime artifacts; latency: median "
        f"over {args.rounds} rounds of per-process medians of {args.runs} runs; cosine vs the fp32 (O1) artifact "
        f"on {len(feeds)} held-out sentences"
    )
    # Load on the shared host drifts between rounds: the ratio within each round is the steadier figure.
    print("| variant | mean cos | min cos | p50 ms | vs fp32 | per-round ratio (median) | per-round ms |")
    print("|---|---|---|---|---|---|---|")
    for name in models:
        ms = statistics.median(times[name])
        ratio = statistics.median(t / b for t, b in zip(times[name], times[base], strict=True))
        rounds = " / ".join(f"{t:.1f}" for t in times[name])
        mean, low = quality[name]
        print(f"| {name} | {mean:.4f} | {low:.4f} | {ms:.2f} | {ms / base_ms:.2f}x | {ratio:.2f}x | {rounds} |")


if __name__ == "__main__":
    main()
