"""Tensor parallelism against the unsharded artifact (``make bench-tensor-parallel``).

By default a random-weight model shaped like SmolLM2-135M (hidden 576, 30 layers, vocabulary 49152) but with
12 query / 4 key-value heads of 48 (SmolLM2's 9 / 3 of 64 allow degrees 1 and 3 only; this keeps its GQA ratio
and its KV bytes), at ``--degree 2``; ``--model DIR --degree 3`` runs the real SmolLM2. Builds, once into
``--work``, the ``--tensor-parallel D`` onnxruntime artifact (one intra-op thread a rank) and the unsharded one
(``--whole``, else built: ONNX Runtime's default threads, the host's cores), then, round by round and
alternating, times each in a process of its own: ``--new`` greedy tokens after a ``--prompt``-token prompt at
batch 1; the figure is the median inter-token latency. Also: what one all-reduce of a ``[1, 576]`` vector costs
by each way a rank could run it (``tools/tp_collectives.py``), and the bytes each rank stores. Writes
docs/bench/tensor_parallel.json.

    python tools/bench_tensor_parallel.py [--model DIR --degree 3] [--whole ARTIFACT] [--rounds 3]
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

PREFIX = "RESULT "
WHOLE_ROW = "unsharded (ORT default threads)"
LAYERS = 30
#: SmolLM2-135M's shape with key/value heads that 2 divides (bench_generation.SMOLLM is SmolLM's).
SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 48,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}


def model_dir(work: Path, layers: int = LAYERS) -> Path:
    """The random-weight model (made once into ``work``)."""
    from bench_generation import prepare

    return prepare(work, layers, SHAPE, "smollm2-kv4")


def build(model: Path, work: Path, max_seq_len: int, degree: int, sequence_parallel: bool = False) -> Path:
    """The artifact at tensor parallelism ``degree`` (1: unsharded), built once into ``work``."""
    import aotforge

    name = f"{model.name.lower()}-tp{degree}{'-sp' if sequence_parallel else ''}-{max_seq_len}"
    found = sorted(work.glob(f"out/{name}/*/onnxruntime/manifest.json"))
    if found:
        return found[-1].parent
    result = aotforge.build(
        model, target="onnxruntime", task="text-generation", out=work / "out", name=name,
        tensor_parallel=degree, sequence_parallel=sequence_parallel, max_seq_len=max_seq_len, max_batch=1,
        bench=False,
    )  # fmt: skip
    return Path(result.path)


def child(artifact: Path, prompt: int, new: int) -> dict[str, Any]:
    """One runtime's run: load, one warm-up generation, then the timed one's inter-token intervals."""
    import numpy as np

    import aotforge

    loaded = aotforge.load(artifact)
    group = getattr(loaded._generative().engine, "group", None)
    ids = np.arange(100, 100 + prompt, dtype=np.int64)[None, :]
    loaded.generate(ids, 4, ignore_eos=True)
    stamps = []
    started = time.perf_counter()
    for _ in loaded.stream(ids, new, ignore_eos=True):
        stamps.append(time.perf_counter())
    gaps = np.diff(stamps) * 1e3
    return {
        "ttft_ms": (stamps[0] - started) * 1e3,
        "itl_ms": float(np.median(gaps)),
        "p90_itl_ms": float(np.percentile(gaps, 90)),
        "all_reduce": getattr(group, "collective", ""),
    }


def child_ttft(artifact: Path, prompt: int, repeats: int) -> dict[str, Any]:
    """One runtime's prefill: load, one warm-up, then ``repeats`` timed prompts to their first token; and the greedy
    tokens after the prompt (the same for every runtime of one model)."""
    import numpy as np

    import aotforge

    loaded = aotforge.load(artifact)
    ids = np.random.default_rng(0).integers(1, SHAPE["vocab_size"], size=(1, prompt))
    loaded.generate(ids, 1, ignore_eos=True)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        loaded.generate(ids, 1, ignore_eos=True)
        times.append((time.perf_counter() - started) * 1e3)
    tokens = loaded.generate(ids, 8, ignore_eos=True)[0, prompt:]
    return {"ttft_ms": float(np.median(times)), "tokens": [int(t) for t in tokens]}


def _run(artifact: Path, prompt: int, new: int, repeats: int = 0) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", str(artifact), "--prompt", str(prompt), "--new", str(new)]
    command += ["--sequence-parallel", "--repeats", str(repeats)] if repeats else []
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
    parser.add_argument(
        "--model", type=Path, help="a causal LM directory (default: the SmolLM2-shaped one, 4 KV heads)"
    )
    parser.add_argument("--whole", type=Path, help="the unsharded fp32 artifact of the same model (default: built)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-tp-bench"))
    parser.add_argument("--degree", type=int, default=2, help="ranks (a divisor of the model's KV heads)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--json", type=Path, help="default: docs/bench/tensor_parallel.json (sequence_parallel.json)")
    parser.add_argument("--sequence-parallel", action="store_true", help="prefill TTFT: TP against TP + SP")
    parser.add_argument("--layers", type=int, default=LAYERS, help="layers of the default model")
    parser.add_argument("--repeats", type=int, default=3, help="--sequence-parallel: timed prefills a process")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure = child_ttft(args.child, args.prompt, args.repeats) if args.sequence_parallel else None
        print(PREFIX + json.dumps(measure or child(args.child, args.prompt, args.new)))
        return
    if args.sequence_parallel:
        sequence_parallel(args)
        return
    args.json = args.json or bench_record.BENCH_DIR / "tensor_parallel.json"
    run = bench_record.start({k: v for k, v in vars(args).items() if k != "child"})
    model = args.model or model_dir(args.work, args.layers)
    artifact = build(model, args.work, args.max_seq_len, args.degree)
    whole = args.whole or build(model, args.work, args.max_seq_len, 1)
    runtimes = {
        WHOLE_ROW: whole,
        f"tensor-parallel {args.degree} (1 thread a rank)": artifact,
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in runtimes}
    collectives: dict[str, list[float]] = {m: [] for m in tp_collectives.METHODS}
    for _ in range(args.rounds):  # alternating: each round runs every runtime once, each in its own process
        for name, path in runtimes.items():
            rounds[name].append(_run(path, args.prompt, args.new))
        for method in tp_collectives.METHODS:
            collectives[method].append(tp_collectives.measure(method, 576, 1000))
    sizes = rank_bytes(artifact, whole)
    results = {"rounds": rounds, "collectives_us": collectives, "bytes": sizes}
    print(json.dumps(results, indent=1))
    bench_record.write(args.json, "tensor_parallel", run, tables(rounds, collectives, sizes), results)


def tables(rounds: dict[str, list[dict[str, Any]]], collectives: dict[str, list[float]], sizes: dict[str, Any]) -> list:
    fig = bench_record.figure
    ok = {name: [r for r in runs if "itl_ms" in r] for name, runs in rounds.items()}
    tp = next(name for name in ok if name != WHOLE_ROW)
    ratios = [t["itl_ms"] / w["itl_ms"] for w, t in zip(ok[WHOLE_ROW], ok[tp], strict=False)]
    kinds = sorted({r.get("all_reduce", "") for r in ok[tp]})
    latency = bench_record.table(
        "Decode latency at batch 1, fp32",
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
        "Each runtime in a process of its own, alternating round by round; the ratio is taken within each round. "
        f"The ranks' all-reduce: {', '.join(kinds)}.",
    )
    allreduce = bench_record.table(
        "One all-reduce of a [1, 576] float vector between two one-thread processes",
        ("method", "us per all-reduce", "x 61 a decode step, ms"),
        [[m, fig(v, 1), round(statistics.median(v) * 61 / 1e3, 2)] for m, v in collectives.items()],
        "shm: the shared-memory all-reduce called from Python; shm-in-ort: the same called from inside an ONNX "
        "Runtime session (an onnxruntime-extensions Python op, the fallback); native-in-ort: the native custom-op "
        "library the rank graphs run (targets/onnxruntime/native_all_reduce.py); gloo: "
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


def sequence_parallel(args: argparse.Namespace) -> None:
    """TTFT of a ``--prompt``-token prompt: ``--tensor-parallel D`` against it with ``--sequence-parallel``."""
    run = bench_record.start({k: v for k, v in vars(args).items() if k != "child"})
    model = args.model or model_dir(args.work, args.layers)
    max_seq_len = max(args.max_seq_len, args.prompt + 16)
    runtimes = {
        f"tensor-parallel {args.degree}": build(model, args.work, max_seq_len, args.degree),
        f"tensor-parallel {args.degree} + sequence-parallel": build(model, args.work, max_seq_len, args.degree, True),
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in runtimes}
    for _ in range(args.rounds):  # alternating: each round runs every runtime once, each in its own process
        for name, path in runtimes.items():
            rounds[name].append(_run(path, args.prompt, 0, args.repeats))
    manifest = json.loads((next(iter(runtimes.values())) / "manifest.json").read_text())
    geometry = {**manifest["target"]["info"]["decoder"], "hidden": _hidden(model), "prompt": args.prompt}
    results = {"rounds": rounds, "geometry": geometry, "degree": args.degree}
    print(json.dumps(results, indent=1))
    path = args.json or bench_record.BENCH_DIR / "sequence_parallel.json"
    bench_record.write(path, "sequence_parallel", run, sp_tables(rounds, geometry, args.degree), results)


def _hidden(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["hidden_size"])


def activation_bytes(prompt: int, hidden: int, degree: int) -> dict[str, int]:
    """Per rank, a prefill at batch 1: one tensor of the split regions (the residual stream, a norm's input or
    output) without and with the split, and what each collective writes to and reads from shared memory."""
    row = hidden * 4
    mine = -(-prompt // degree) * row
    return {
        "split_tensor_tp": prompt * row,
        "split_tensor_sp": mine,
        "all_reduce_moved": prompt * row + degree * prompt * row,  # writes its whole input, reads every rank's
        "reduce_scatter_moved": prompt * row + degree * mine,  # writes its whole input, reads its rows of each
        "all_gather_moved": mine + degree * mine,  # writes its rows, reads every rank's
    }


def sp_tables(rounds: dict[str, list[dict[str, Any]]], geometry: dict[str, Any], degree: int) -> list:
    fig = bench_record.figure
    ok = {name: [r for r in runs if "ttft_ms" in r] for name, runs in rounds.items()}
    tp, sp = list(ok)
    ratios = [s["ttft_ms"] / t["ttft_ms"] for t, s in zip(ok[tp], ok[sp], strict=False)]
    same = all(t["tokens"] == s["tokens"] for t, s in zip(ok[tp], ok[sp], strict=False))
    prompt, layers = geometry["prompt"], geometry["layers"]
    ttft = bench_record.table(
        f"Time to first token of a {prompt}-token prompt at batch 1, fp32 ({layers} layers)",
        ("runtime", "TTFT ms", "TTFT / tensor-parallel alone (per round)", "same greedy tokens"),
        [
            [tp, fig([r["ttft_ms"] for r in ok[tp]], 1), "1", ""],
            [sp, fig([r["ttft_ms"] for r in ok[sp]], 1), fig(ratios, 3), "yes" if same else "NO"],
        ],
        "Each runtime in a process of its own, alternating round by round, one intra-op thread a rank; each figure "
        "a process's median of its timed prefills; the ratio taken within each round.",
    )
    b = activation_bytes(prompt, geometry["hidden"], degree)
    mb = 1e6
    per_layer = 2  # collectives a layer; the embedding adds one reduce (scatter) and the final norm one gather
    memory = bench_record.table(
        f"Bytes a rank holds and moves in prefill ({prompt} tokens, hidden {geometry['hidden']}; computed)",
        ("", "tensor-parallel MB", "+ sequence-parallel MB", "ratio"),
        [
            [
                "one tensor of the split regions (residual, norm in/out)",
                round(b["split_tensor_tp"] / mb, 2),
                round(b["split_tensor_sp"] / mb, 2),
                round(b["split_tensor_sp"] / b["split_tensor_tp"], 3),
            ],
            [
                "shared memory moved a layer (collectives)",
                round(per_layer * b["all_reduce_moved"] / mb, 2),
                round(per_layer * (b["reduce_scatter_moved"] + b["all_gather_moved"]) / mb, 2),
                round((b["reduce_scatter_moved"] + b["all_gather_moved"]) / b["all_reduce_moved"], 3),
            ],
        ],  # fmt: skip
        "From the geometry: a split-region tensor is [prompt, hidden] fp32 per rank without the split and "
        "[ceil(prompt / N), hidden] with it; the attention and MLP between the all-gather and the reduce-scatter "
        "see the whole prompt either way. Moved: what the ranks' collectives write to and read from shared memory "
        "(an all-reduce against a reduce-scatter plus an all-gather), two a layer.",
    )
    return [ttft, memory]


if __name__ == "__main__":
    main()
