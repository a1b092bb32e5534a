"""Tensor parallelism against the unsharded artifact on SmolLM2-135M-Instruct (``make bench-tensor-parallel``).

SmolLM2 has 3 key/value heads, so its degrees are 1 and 3 (2 is refused, as vLLM refuses it): the default is 3.
Builds the real model as a ``--tensor-parallel D`` onnxruntime artifact (one intra-op thread a rank) unless it is
already in ``--work``, then, round by round and alternating, times in a process of its own each: the unsharded
fp32 artifact (``--whole``, ONNX Runtime's default threads: the host's cores) and the two ranks; each
decodes ``--new`` greedy tokens after a ``--prompt``-token prompt at batch 1, and the figure is the median
inter-token latency. Also: what one all-reduce of a ``[1, 576]`` vector costs by each way a rank could run it
(``tools/tp_collectives.py``), and the bytes each rank stores. Writes docs/bench/tensor_parallel.json.

    python tools/bench_tensor_parallel.py [--model DIR] [--whole ARTIFACT] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))
import bench_record  # noqa: E402
import tp_collectives  # noqa: E402

CACHE = Path.home() / ".cache" / "aotforge"
MODEL = CACHE / "models" / "SmolLM2-135M-Instruct-fp32-b179c9523d0e6a0f"
WHOLE = CACHE / "bench-serve" / "artifacts" / "onnxruntime-fp32" / "smollm2-fp32" / "1" / "onnxruntime"
PREFIX = "RESULT "


def build(model: Path, work: Path, max_seq_len: int, degree: int) -> Path:
    """The tensor-parallel artifact (built once into ``work``)."""
    import aotforge

    found = sorted(work.glob(f"out/smollm2-tp{degree}/*/onnxruntime/manifest.json"))
    if found:
        return found[-1].parent
    result = aotforge.build(
        model, target="onnxruntime", task="text-generation", out=work / "out", name=f"smollm2-tp{degree}",
        tensor_parallel=degree, max_seq_len=max_seq_len, max_batch=1, bench=False,
    )  # fmt: skip
    return Path(result.path)


def child(artifact: Path, prompt: int, new: int) -> dict[str, Any]:
    """One runtime's run: load, one warm-up generation, then the timed one's inter-token intervals."""
    import numpy as np

    import aotforge

    loaded = aotforge.load(artifact)
    ids = np.arange(100, 100 + prompt, dtype=np.int64)[None, :]
    loaded.generate(ids, 4)
    stamps = []
    started = time.perf_counter()
    for _ in loaded.stream(ids, new):
        stamps.append(time.perf_counter())
    gaps = np.diff(stamps) * 1e3
    return {
        "ttft_ms": (stamps[0] - started) * 1e3,
        "itl_ms": float(np.median(gaps)),
        "p90_itl_ms": float(np.percentile(gaps, 90)),
    }


def _run(artifact: Path, prompt: int, new: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", str(artifact), "--prompt", str(prompt), "--new", str(new)]
    env = {**os.environ, "PYTHONPATH": str(TOOLS.parent)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith(PREFIX):
            return dict(json.loads(line[len(PREFIX) :]))
    return {"error": done.stderr[-2000:]}


def rank_bytes(artifact: Path, whole: Path) -> dict[str, Any]:
    """Bytes of each rank's weights and KV cache against the unsharded artifact's."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    tp = manifest["target"]["info"]["tensor_parallel"]
    spec = manifest["target"]["info"]["decoder"]
    kv_whole = 2 * spec["layers"] * spec["kv_heads"] * spec["max_seq_len"] * spec["head_dim"] * 4
    return {
        "whole_weights": (whole / "weights.data").stat().st_size,
        "rank_weights": [(artifact / r / "weights.data").stat().st_size for r in tp["ranks"]],
        "degree": tp["degree"],
        "whole_kv_per_slot": kv_whole,
        "rank_kv_per_slot": tp["rank_kv_cache_bytes_per_slot"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--whole", type=Path, default=WHOLE, help="the unsharded fp32 artifact (same model)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-tp-bench"))
    parser.add_argument("--degree", type=int, default=3, help="ranks (SmolLM2: 1 or 3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "tensor_parallel.json")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(PREFIX + json.dumps(child(args.child, args.prompt, args.new)))
        return
    run = bench_record.start({k: v for k, v in vars(args).items() if k != "child"})
    artifact = build(args.model, args.work, args.max_seq_len, args.degree)
    runtimes = {
        "unsharded (ORT default threads)": args.whole,
        f"tensor-parallel {args.degree} (1 thread a rank)": artifact,
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in runtimes}
    collectives: dict[str, list[float]] = {m: [] for m in tp_collectives.METHODS}
    for _ in range(args.rounds):  # alternating: each round runs every runtime once, each in its own process
        for name, path in runtimes.items():
            rounds[name].append(_run(path, args.prompt, args.new))
        for method in tp_collectives.METHODS:
            collectives[method].append(tp_collectives.measure(method, 576, 1000))
    sizes = rank_bytes(artifact, args.whole)
    results = {"rounds": rounds, "collectives_us": collectives, "bytes": sizes}
    print(json.dumps(results, indent=1))
    bench_record.write(args.json, "tensor_parallel", run, tables(rounds, collectives, sizes), results)


def tables(rounds: dict[str, list[dict[str, Any]]], collectives: dict[str, list[float]], sizes: dict[str, Any]) -> list:
    fig = bench_record.figure
    ok = {name: [r for r in runs if "itl_ms" in r] for name, runs in rounds.items()}
    whole, tp = list(ok)
    ratios = [t["itl_ms"] / w["itl_ms"] for w, t in zip(ok[whole], ok[tp], strict=False)]
    latency = bench_record.table(
        "Decode latency at batch 1, SmolLM2-135M-Instruct fp32",
        ("runtime", "ITL ms", "p90 ITL ms", "TTFT ms", "ITL / unsharded (per round)"),
        [
            [
                name,
                fig([r["itl_ms"] for r in runs], 2),
                fig([r["p90_itl_ms"] for r in runs], 2),
                fig([r["ttft_ms"] for r in runs], 1),
                fig(ratios, 3) if name == tp else "1",
            ]
            for name, runs in ok.items()
        ],  # fmt: skip
        "Each runtime in a process of its own, alternating round by round; the ratio is taken within each round.",
    )
    allreduce = bench_record.table(
        "One all-reduce of a [1, 576] float vector between two one-thread processes",
        ("method", "us per all-reduce", "x 61 a decode step, ms"),
        [[m, fig(v, 1), round(statistics.median(v) * 61 / 1e3, 2)] for m, v in collectives.items()],
        "shm: the shared-memory all-reduce called from Python; shm-in-ort: the same called from inside an ONNX "
        "Runtime session as the rank graphs call it (an onnxruntime-extensions Python op); gloo: "
        "torch.distributed over loopback TCP. A SmolLM2 rank graph all-reduces 61 times a decode step (2 a layer, "
        "and the vocabulary-parallel embedding).",
    )
    mb = 1e6
    ranks = range(len(sizes["rank_weights"]))
    memory = bench_record.table(
        "Bytes each rank holds",
        ("", "unsharded MB", *(f"rank {r} MB" for r in ranks), "largest rank / unsharded"),
        [
            [
                "weights",
                round(sizes["whole_weights"] / mb, 1),
                *(round(b / mb, 1) for b in sizes["rank_weights"]),
                round(max(sizes["rank_weights"]) / sizes["whole_weights"], 3),
            ],
            [
                "KV cache per slot",
                round(sizes["whole_kv_per_slot"] / mb, 1),
                *(round(sizes["rank_kv_per_slot"] / mb, 1) for _ in ranks),
                round(sizes["rank_kv_per_slot"] / sizes["whole_kv_per_slot"], 3),
            ],
        ],  # fmt: skip
        "From the artifacts' files: weights.data of each; the KV cache a slot of max_seq_len positions takes.",
    )
    return [latency, allreduce, memory]


if __name__ == "__main__":
    main()
