"""all-MiniLM-L6-v2 fp32 vs int8 on ONNX Runtime, side by side in one run.

Quality: embedding cosine vs fp32 on the 64 evaluation sentences of examples/minilm_sentences.py
(batch 1, padded to seq 128). Latency: each variant timed in its own process (ORT thread pools
spin after a call), 2 intra-op threads, median of --runs after warmup.

    .venv/bin/python tools/minilm_int8.py [--runs 40] [--work build/minilm_int8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SEQ = 128


def export(path: Path) -> None:
    import onnx_ir as ir
    import torch

    from examples.minilm import get_model, tokenize
    from passes.fuse_patterns import FuseOrtPass

    feeds = tokenize(["warm up"], seq=SEQ)
    program = torch.onnx.export(get_model(), (), kwargs=dict(feeds), dynamo=True, output_names=["embedding_out"])
    assert program is not None
    model = ir.from_proto(program.model_proto)
    ir.save(model, path.with_name("fp32.onnx"))
    FuseOrtPass()(model)  # com.microsoft Attention / SkipLayerNorm / FastGelu: ORT's fast (int8) kernels
    ir.save(model, path)


def variants(work: Path) -> dict[str, Path]:
    """Each int8 candidate, quantized with onnxruntime.quantization from the fused fp32 graph."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fused = work / "fused.onnx"
    proto = onnx.load(str(fused))
    init_shapes = {i.name: tuple(i.dims) for i in proto.graph.initializer}
    ffn_out = [n.name for n in proto.graph.node if n.op_type == "MatMul" and init_shapes.get(n.input[1]) == (1536, 384)]
    out = {"fp32": work / "fp32.onnx", "fp32-fused": fused}
    plans = {
        "dyn-pc": dict(per_channel=True),
        "dyn-pc-keep-ffn-out": dict(per_channel=True, nodes_to_exclude=ffn_out),
        "dyn-pc-keep-ffn-out-1-3": dict(per_channel=True, nodes_to_exclude=ffn_out[:3]),
    }
    for name, kw in plans.items():
        dst = work / f"{name}.onnx"
        quantize_dynamic(fused, dst, weight_type=QuantType.QInt8, **kw)
        out[name] = dst
    return out


def session(path: Path, threads: int = 2):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def embeddings(path: Path, feeds: list[dict]) -> np.ndarray:
    sess = session(path)
    names = {i.name for i in sess.get_inputs()}
    return np.concatenate([sess.run(None, {k: v for k, v in f.items() if k in names})[0] for f in feeds])


def time_one(path: Path, runs: int) -> float:
    from examples.minilm_sentences import EVALUATION, calibration_feeds

    del EVALUATION
    feed = calibration_feeds(SEQ)[1]
    sess = session(path)
    names = {i.name for i in sess.get_inputs()}
    feed = {k: v for k, v in feed.items() if k in names}
    for _ in range(10):
        sess.run(None, feed)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="round-robin timing rounds (the host is shared)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "minilm_int8")
    ap.add_argument("--time", type=Path, help=argparse.SUPPRESS)  # worker mode: time one model
    args = ap.parse_args()
    if args.time:
        print(json.dumps({"ms": time_one(args.time, args.runs)}))
        return
    from examples.minilm import tokenize
    from examples.minilm_sentences import EVALUATION

    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "fused.onnx").exists():
        export(args.work / "fused.onnx")
    models = variants(args.work)
    batch = tokenize(EVALUATION, seq=SEQ)
    feeds = [{k: v[i : i + 1].numpy() for k, v in batch.items()} for i in range(len(EVALUATION))]
    ref = embeddings(models["fp32"], feeds)
    quality = {}
    for name, path in models.items():
        emb = embeddings(path, feeds)
        cos = np.sum(emb * ref, 1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1))
        quality[name] = (float(cos.mean()), float(cos.min()))
    # Round-robin, one process per measurement, so load on the shared host hits every variant alike.
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, path in models.items():
            cmd = [sys.executable, __file__, "--time", str(path), "--runs", str(args.runs)]
            times[name].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["ms"])
    rows = [(n, *quality[n], statistics.median(times[n])) for n in models]
    base = rows[0][3]
    print(
        f"all-MiniLM-L6-v2, seq {SEQ}, batch 1, ORT CPU 2 threads; latency: median over {args.rounds} rounds of "
        f"per-process medians of {args.runs} runs; cosine vs fp32 on 64 held-out sentences"
    )
    print("| variant | mean cos | min cos | p50 ms | vs fp32 |\n|---|---|---|---|---|")
    for name, mean, low, ms in rows:
        print(f"| {name} | {mean:.4f} | {low:.4f} | {ms:.2f} | {ms / base:.2f}x |")


if __name__ == "__main__":
    main()
