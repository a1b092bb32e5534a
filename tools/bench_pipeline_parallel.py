"""Pipeline parallelism against the unsharded artifact on SmolLM2-135M-Instruct (``make bench-pipeline-parallel``).

Builds the real model as a ``--pipeline-parallel M`` onnxruntime artifact (one intra-op thread a stage; the same
``--max-seq-len``, ``--max-batch`` and verify graph as the unsharded serving artifact) unless it is already in
``--work``, then, round by round and alternating, runs in a process of its own each: the unsharded fp32 artifact
(``--whole``, ONNX Runtime's default threads: the host's cores) and the stages. Each serves ``--requests`` requests
of a ``--prompt``-token prompt and ``--new`` greedy tokens through the serving engine with ``--concurrency``
sequences in flight; the figures are requests/s and, for the stages, the bubble: the share of the stages' time
spent waiting on a neighbour, ``1 - sum(busy) / (M * wall)``. The engine keeps a batch in flight a stage (vLLM's
virtual engines; ``--batches-in-flight 1``: one batch a step, in ``m`` micro-batches), so the schedule leaves no
bubble in steady state (GPipe's ``(M-1) / (m+M-1)`` with one batch); what remains is the stages' imbalance,
``1 - sum(busy) / (M * max(busy))``, reported beside it, and the driver's time between batches.
``--precision int4`` runs the same against the unsharded int4 artifact (default ``artifacts/onnxruntime-int4``), the
stages built with that artifact's weight-only parameters (its method, block size, head bits...), and writes
docs/bench/pipeline_parallel_int4.json; fp32 (the default) writes docs/bench/pipeline_parallel.json.

    python tools/bench_pipeline_parallel.py [--model DIR] [--precision fp32|int4] [--whole ARTIFACT] [--rounds 3]
        [--batches-in-flight 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))
import bench_record  # noqa: E402

CACHE = Path.home() / ".cache" / "aotforge"
MODEL = CACHE / "models" / "SmolLM2-135M-Instruct-fp32-b179c9523d0e6a0f"
#: the unsharded artifact each precision is measured against
BENCH_SERVE = CACHE / "bench-serve" / "artifacts"
WHOLE = {p: BENCH_SERVE / f"onnxruntime-{p}" / f"smollm2-{p}" / "1" / "onnxruntime" for p in ("fp32", "int4")}
#: the weight-only parameters a stage build copies from the unsharded int4 artifact's manifest
WEIGHT_ONLY_KEYS = ("bits", "block_size", "head_bits", "accuracy_level", "symmetric", "prompt_int8")
PREFIX = "RESULT "
#: what a child run is told, in ``child``'s order
CHILD_ARGS = ("requests", "concurrency", "prompt", "new", "batches_in_flight")


def build(model: Path, work: Path, whole: Path, degree: int, precision: str) -> Path:
    """The pipeline-parallel artifact (built once into ``work``), at the unsharded artifact's geometry and, at int4,
    with its weight-only parameters."""
    import aotforge

    name = f"smollm2-pp{degree}" + ("" if precision == "fp32" else f"-{precision}")
    found = sorted(work.glob(f"out/{name}/*/onnxruntime/manifest.json"))
    if found:
        return found[-1].parent
    manifest = json.loads((whole / "manifest.json").read_text())
    info = manifest["target"]["info"]
    spec, speculative = info["decoder"], info.get("speculative", {})
    low_bit: dict[str, Any] = {}
    if precision != "fp32":  # the unsharded artifact's quantization and the quality budget it was built under
        budget = manifest["validation"].get("quality", {}).get("max_perplexity_increase")
        low_bit = {"precision": precision, "pass_opt": weight_only_opts(manifest)}
        low_bit |= {"max_perplexity_increase": budget} if budget is not None else {}
    result = aotforge.build(
        model, target="onnxruntime", task="text-generation", out=work / "out", name=name,
        pipeline_parallel=degree, max_seq_len=spec["max_seq_len"], max_batch=spec["max_batch"],
        speculative_k=int(speculative.get("max_tokens", 0)), bench=False, **low_bit,
    )  # fmt: skip
    return Path(result.path)


def weight_only_opts(manifest: dict[str, Any]) -> list[str]:
    """``--pass-opt``s that quantize as the unsharded artifact did: its weight-only parameters and its method (an
    artifact that records none was rounded to nearest)."""
    passes = {p["name"]: p["params"] for p in manifest["passes"]}
    params = passes["weight-only"]
    method = params.get("method") or passes.get("calibrate-int4", {}).get("method") or "rtn"
    values = {"method": method, "prompt_int8": False} | {k: params[k] for k in WEIGHT_ONLY_KEYS if k in params}
    return [f"weight-only.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def child(artifact: Path, requests: int, concurrency: int, prompt: int, new: int, in_flight: int) -> dict[str, Any]:
    """One runtime's run: load, one warm-up request, then ``requests`` requests ``concurrency`` at a time."""
    from aotforge.artifacts.engine_loader import load_engine
    from aotforge.runtime.params import EngineConfig, SamplingParams

    engine, _, _ = load_engine(artifact, EngineConfig(max_num_seqs=concurrency, max_batches_in_flight=in_flight))
    engine.eos_token_ids = frozenset()  # every request decodes all of its tokens

    def serve(ids: range) -> float:
        started = time.perf_counter()
        for i in ids:  # distinct prompts: no cached prefix
            tokens = [100 + (i * 37 + j) % 40000 for j in range(prompt)]
            engine.add_request(f"r{i}", tokens, SamplingParams(max_tokens=new, temperature=0))
        while engine.has_unfinished():
            for out in engine.step():
                if out.error:
                    raise RuntimeError(out.error)
        return time.perf_counter() - started

    serve(range(-1, 0))
    group = getattr(getattr(engine.runner, "engine", None), "group", None)
    busy = group.busy_seconds() if group is not None and hasattr(group, "busy_seconds") else None
    wall = serve(range(requests))
    out: dict[str, Any] = {"wall_s": wall, "requests_per_s": requests / wall, "tokens_per_s": requests * new / wall}
    if busy is not None and group is not None:
        spent = [after - before for before, after in zip(busy, group.busy_seconds(), strict=True)]
        out |= {
            "stage_busy_s": spent,
            "bubble": 1 - sum(spent) / (len(spent) * wall),
            "bubble_imbalance": 1 - sum(spent) / (len(spent) * max(spent)),
            "batches_in_flight": engine.batches_in_flight,
        }
    return out


def _run(artifact: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", str(artifact)]
    for flag in CHILD_ARGS:
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    env = {**os.environ, "PYTHONPATH": str(TOOLS.parent)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    for line in done.stdout.splitlines():
        if line.startswith(PREFIX):
            return dict(json.loads(line[len(PREFIX) :]))
    return {"error": done.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--precision", choices=sorted(WHOLE), default="fp32", help="the weights' precision")
    parser.add_argument(
        "--whole", type=Path, help="the unsharded artifact of that precision (same model; default: the bench-serve one)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-pp-bench"))
    parser.add_argument("--degree", type=int, default=2, help="stages")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument(
        "--batches-in-flight", type=int, default=0, help="batches the engine keeps in flight (0: one a stage)"
    )
    parser.add_argument("--json", type=Path, help="default: docs/bench/pipeline_parallel[_int4].json")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(PREFIX + json.dumps(child(args.child, *(getattr(args, k) for k in CHILD_ARGS))))
        return
    args.whole = args.whole or WHOLE[args.precision]
    suffix = "" if args.precision == "fp32" else f"_{args.precision}"
    args.json = args.json or bench_record.BENCH_DIR / f"pipeline_parallel{suffix}.json"
    run = bench_record.start({k: v for k, v in vars(args).items() if k != "child"})
    artifact = build(args.model, args.work, args.whole, args.degree, args.precision)
    pp = json.loads((artifact / "manifest.json").read_text())["target"]["info"]["pipeline_parallel"]
    runtimes = {
        f"unsharded{'' if args.precision == 'fp32' else ' ' + args.precision} (ORT default threads)": args.whole,
        f"pipeline-parallel {args.degree} (1 thread a stage)": artifact,
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in runtimes}
    for _ in range(args.rounds):  # alternating: each round runs every runtime once, each in its own process
        for name, path in runtimes.items():
            rounds[name].append(_run(path, args))
    staged = [r for r in rounds[list(runtimes)[-1]] if "batches_in_flight" in r]
    in_flight = staged[0]["batches_in_flight"] if staged else 1
    # One batch a step goes as micro-batches, GPipe's fill and drain every step; a batch a stage, each as one.
    micro = 1 if in_flight > 1 else min(int(pp["micro_batches"]), args.concurrency)
    theory = 0.0 if in_flight >= args.degree else (args.degree - 1) / (micro + args.degree - 1)
    results = {
        "rounds": rounds, "bounds": pp["layout"]["bounds"], "micro_batches": micro, "bubble_theory": theory,
        "batches_in_flight": in_flight, "precision": args.precision,
    }  # fmt: skip
    print(json.dumps(results, indent=1))
    bench_record.write(args.json, "pipeline_parallel", run, tables(rounds, theory, args), results)


def tables(rounds: dict[str, list[dict[str, Any]]], theory: float, args: argparse.Namespace) -> list:
    fig = bench_record.figure
    ok = {name: [r for r in runs if "requests_per_s" in r] for name, runs in rounds.items()}
    whole, pp = list(ok)
    ratios = [p["requests_per_s"] / w["requests_per_s"] for w, p in zip(ok[whole], ok[pp], strict=False)]
    throughput = bench_record.table(
        f"Request throughput, {args.concurrency} concurrent requests, SmolLM2-135M-Instruct {args.precision}",
        (
            "runtime",
            "requests/s",
            "tokens/s",
            "throughput / unsharded (per round)",
            "bubble",
            "bubble (theory)",
            "stage imbalance",
        ),  # fmt: skip
        [
            [
                name,
                fig([r["requests_per_s"] for r in runs], 3),
                fig([r["tokens_per_s"] for r in runs], 1),
                fig(ratios, 3) if name == pp else "1",
                fig([r["bubble"] for r in runs], 3) if name == pp else "",
                round(theory, 3) if name == pp else "",
                fig([r.get("bubble_imbalance", 0.0) for r in runs], 3) if name == pp else "",
            ]
            for name, runs in ok.items()
        ],  # fmt: skip
        f"{args.requests} requests of a {args.prompt}-token prompt and {args.new} new tokens through the serving "
        "engine, each runtime in a process of its own, alternating round by round; the ratio is taken within each "
        "round. Bubble: the share of the stages' time spent waiting on a neighbour; theory: 0 with a batch in "
        "flight a stage (the engine's default), else a decode step's (M-1)/(m+M-1) for m micro-batches; stage "
        "imbalance: the part of the bubble that the slower stage leaves the others, 1 - sum(busy) / (M max(busy)).",
    )
    return [throughput]


if __name__ == "__main__":
    main()
