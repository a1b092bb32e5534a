"""The collective's terms of the sizing model (docs/parallel.md), measured: ``make bench-collectives``.

1. All-reduce latency of the vectors tensor parallelism sends (``[batch, 576]`` floats, SmolLM2's hidden size, batch
   1..8) between two one-thread processes, over each link a rank group can use: the shared-memory segment
   (``shm_all_reduce``, one host), gloo over loopback (one host) and gloo between two network namespaces joined by
   a veth pair (``tools/two_hosts.py``: two stand-in hosts, the kernel's network stack between them), plain and
   with the link's rate capped (``--rate-mbit``, a token bucket) so the bandwidth term shows; beside it the same
   all-reduce called from inside an ONNX Runtime session (the rank graphs' Python op, how gloo ranks run it) and
   the gather of a rank's slice of the logits.
2. A tensor-parallel 2 decode at batch 1 of the SmolLM2-shaped random-weight model of
   ``make bench-tensor-parallel`` over each link: the product's one-host ranks (shared memory, the driver's
   pipes), and two rank processes over gloo on loopback and across the veth, each rank gathering the logits over
   gloo (the driver's gather across hosts) and so picking the same greedy tokens; and the unsharded artifact.

Every configuration runs in processes of its own, alternating round by round; figures are medians. Writes
docs/bench/collectives.json; ``tools/parallel_model.py`` reads it.

    python tools/bench_collectives.py [--rounds 3] [--rate-mbit 100] [--new 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))
import bench_record  # noqa: E402
import two_hosts  # noqa: E402

PREFIX = "RESULT "
HIDDEN, VOCAB, DEGREE = 576, 49152, 2
BATCHES = (1, 2, 4, 8)
SHM, LOOPBACK, VETH = "shm (one host)", "gloo, loopback (one host)", "gloo, veth (two namespaces)"
UNSHARDED, TP_SHM = "unsharded (ORT default threads)", "tensor-parallel 2, shm (one host: the product's ranks)"
TP_LOOPBACK, TP_VETH = "tensor-parallel 2, gloo over loopback", "tensor-parallel 2, gloo across the veth"


def rate_link(rate_mbit: float) -> str:
    return f"gloo, veth capped at {rate_mbit:g} Mbit/s"


def _comm(args: argparse.Namespace, capacity: int) -> Any:
    """This rank's end of the pair's collectives; rank 0 prints its rendezvous port first (0 for shm)."""
    if args.method == "shm":
        from aotforge.targets.generative.shm_all_reduce import ShmAllReduce

        print("PORT 0", flush=True)
        return ShmAllReduce(args.segment, args.rank, DEGREE, capacity)
    from aotforge.targets.generative.gloo_all_reduce import GlooAllReduce, master_store

    store = master_store(args.store, DEGREE, 120) if args.rank == 0 else None
    if store is not None:
        print(f"PORT {store.port}", flush=True)
    return GlooAllReduce(store, args.store, args.port, args.rank, DEGREE, args.bind, 120)


def _per_call_us(call: Callable[[], Any], calls: int, per_run: int = 1) -> float:
    """Microseconds a call: the median of five blocks, after a tenth as many calls of warm-up."""
    for _ in range(max(calls // 10, 1)):
        call()
    block, blocks = max(calls // 5, 1), []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(block):
            call()
        blocks.append((time.perf_counter() - started) / (block * per_run) * 1e6)
    return float(np.median(blocks))


def collectives_rank(args: argparse.Namespace) -> dict[str, Any]:
    """One rank of a pair: each batch's all-reduce from Python, batch 1's from inside an ONNX Runtime session, and
    the gather of a ``[1, VOCAB / 2]`` slice of logits."""
    import onnxruntime as ort
    from tp_collectives import _graph

    from aotforge.targets.onnxruntime import python_ops
    from aotforge.targets.onnxruntime.tensor_parallel import register_all_reduce

    comm = _comm(args, 1 << 16)
    calls = args.calls
    total = comm(np.full((2, HIDDEN), args.rank + 1, dtype=np.float32))
    out: dict[str, Any] = {"allreduce_us": {}, "sums_right": bool(np.all(total == sum(range(1, DEGREE + 1))))}
    for batch in BATCHES:
        x = np.full((batch, HIDDEN), args.rank + 1, dtype=np.float32)
        out["allreduce_us"][str(batch)] = _per_call_us(lambda x=x: comm(x), calls)
    logits = np.zeros((1, 1, VOCAB // DEGREE), dtype=np.float32)
    out["gather_us"] = _per_call_us(lambda: comm.all_gather(logits, DEGREE), max(calls // 10, 10))
    register_all_reduce(comm, "")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.register_custom_ops_library(python_ops.library_path())
    session = ort.InferenceSession(_graph(100, HIDDEN), options, ["CPUExecutionProvider"])
    feed = {"x": np.ones((1, HIDDEN), dtype=np.float32)}
    out["in_ort_us"] = _per_call_us(lambda: session.run(None, feed), max(calls // 100, 5), 100)
    return out


def decode_rank(args: argparse.Namespace) -> dict[str, Any]:
    """One rank of a tensor-parallel 2 decode over gloo (``gathered_decode.py``)."""
    from gathered_decode import decode

    return decode(args.artifact, args.rank, _comm(args, 1 << 20), args.prompt, args.new)


def run_pair(child: list[str], wrap: Callable[[int, list[str]], list[str]]) -> dict[str, Any]:
    """Rank 0 and then, given its port, rank 1 of ``child`` (``wrap`` puts a rank's command on its host);
    rank 0's result with both ranks' token lists, or ``{"error": ...}``."""
    env = {**os.environ, "PYTHONPATH": f"{TOOLS.parent}{os.pathsep}{TOOLS}", "OMP_NUM_THREADS": "1"}
    base = [sys.executable, str(Path(__file__)), *child]
    with tempfile.TemporaryFile("w+") as err0, tempfile.TemporaryFile("w+") as err1:
        procs = [
            subprocess.Popen(wrap(0, [*base, "--rank", "0"]), stdout=subprocess.PIPE, stderr=err0, text=True, env=env)
        ]
        assert procs[0].stdout is not None
        line = procs[0].stdout.readline()
        if line.startswith("PORT "):
            command = wrap(1, [*base, "--rank", "1", "--port", line.split()[1]])
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err1, text=True, env=env))
        outs = []
        for proc in procs:
            try:
                outs.append(proc.communicate(timeout=900)[0])
            except subprocess.TimeoutExpired:
                proc.kill()
                outs.append(proc.communicate()[0])
        results = [json.loads(ln[len(PREFIX) :]) for out in outs for ln in out.splitlines() if ln.startswith(PREFIX)]
        if len(results) < DEGREE:
            err0.seek(0), err1.seek(0)
            return {"error": (err0.read()[-1500:] + err1.read()[-1500:]) or line}
    if "tokens" in results[0]:
        results[0]["same_tokens_on_every_rank"] = results[0]["tokens"] == results[1]["tokens"]
    return dict(results[0])


def pair_on(link: str, child: list[str], rate_mbit: float) -> dict[str, Any]:
    """``child``'s rank pair over ``link``: plain processes of this host, or one in each namespace of a veth pair."""
    if link == SHM:
        from aotforge.targets.generative.shm_all_reduce import create_segment

        segment = create_segment(DEGREE, 1 << 20)
        try:
            return run_pair([*child, "--method", "shm", "--segment", segment.name], lambda r, c: c)
        finally:
            segment.close()
            try:
                segment.unlink()
            except FileNotFoundError:  # a rank's resource tracker unlinked it at the rank's exit
                resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    if link == LOOPBACK:
        return run_pair([*child, "--store", "127.0.0.1", "--bind", "127.0.0.1"], lambda r, c: c)
    with two_hosts.hosts(rate_mbit if link != VETH else 0.0) as pair:
        gloo = [*child, "--store", two_hosts.ADDRESSES[0]]
        return run_pair(gloo, lambda r, c: pair.command(r, [*c, "--bind", two_hosts.ADDRESSES[r]]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000, help="all-reduces a batch size and process")
    parser.add_argument(  # low enough that the bytes' term stands out of a loaded host's noise
        "--rate-mbit", type=float, default=100.0, help="the capped veth's rate (0: leave it out)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-tp-bench"))
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--no-decode", action="store_true", help="the collectives alone")
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "collectives.json")
    for name in ("rank", "port"):  # a rank's own (run_pair passes them)
        parser.add_argument(f"--{name}", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=("gloo", "shm"), default="gloo", help=argparse.SUPPRESS)
    for name in ("store", "bind", "segment"):
        parser.add_argument(f"--{name}", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=("collectives", "decode"), help=argparse.SUPPRESS)
    parser.add_argument("--artifact", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.environ["OMP_NUM_THREADS"] = "1"
        result = collectives_rank(args) if args.child == "collectives" else decode_rank(args)
        print(PREFIX + json.dumps(result), flush=True)
        return
    settings = {k: v for k, v in vars(args).items() if k in ("rounds", "calls", "rate_mbit", "prompt", "new")}
    run = bench_record.start({**settings, "decode": not args.no_decode})
    results = measure(args)
    print(json.dumps(results, indent=1))
    bench_record.write(args.json, "collectives", run, tables(results), results)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration once a round, each in processes of its own."""
    skipped = {}
    links = [SHM, LOOPBACK]
    why = two_hosts.unavailable()
    if why:
        skipped["two namespaces"] = why
    else:
        links += [VETH] + ([rate_link(args.rate_mbit)] if args.rate_mbit else [])
        skipped["tc netem delay"] = two_hosts.netem_missing()
    collectives: dict[str, list[dict[str, Any]]] = {link: [] for link in links}
    decodes = decode_runtimes(args, links) if not args.no_decode else {}
    decode_rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in decodes}
    for _ in range(args.rounds):  # alternating: each round runs every configuration once
        for link in links:
            collectives[link].append(
                pair_on(link, ["--child", "collectives", "--calls", str(args.calls)], args.rate_mbit)
            )
        for name, run in decodes.items():
            decode_rounds[name].append(run())
    shape = {
        "cpus": os.cpu_count(),
        "hidden": HIDDEN,
        "vocab": VOCAB,
        "degree": DEGREE,
        "batches": list(BATCHES),
        "rate_mbit": args.rate_mbit,
    }
    return {
        **shape,
        "collectives": collectives,
        "decode": decode_rounds,
        "skipped": {k: v for k, v in skipped.items() if v},
    }


def decode_runtimes(args: argparse.Namespace, links: list[str]) -> dict[str, Callable[[], dict[str, Any]]]:
    """The decode configurations, each a function running one round of it."""
    import bench_tensor_parallel as tp

    model = tp.model_dir(args.work)
    ranked, whole = tp.build(model, args.work, 512, DEGREE), tp.build(model, args.work, 512, 1)
    child = ["--child", "decode", "--artifact", str(ranked), "--prompt", str(args.prompt), "--new", str(args.new)]
    runs = {
        UNSHARDED: lambda: tp._run(whole, args.prompt, args.new),
        TP_SHM: lambda: tp._run(ranked, args.prompt, args.new),
        TP_LOOPBACK: lambda: pair_on(LOOPBACK, child, 0.0),
    }
    if VETH in links:
        runs[TP_VETH] = lambda: pair_on(VETH, child, 0.0)
    return runs


def tables(results: dict[str, Any]) -> list[dict[str, Any]]:
    from parallel_model import collective_checks

    fig = bench_record.figure
    gather = f"gather of [1, {VOCAB // DEGREE}] logits, us"
    rows = []
    for link, runs in results["collectives"].items():
        ok = [r for r in runs if "allreduce_us" in r]
        cells = [fig([r["allreduce_us"][str(b)] for r in ok], 1) for b in results["batches"]]
        rows.append([link, *cells, fig([r["in_ort_us"] for r in ok], 1), fig([r["gather_us"] for r in ok], 1)])
    allreduce = bench_record.table(
        f"One all-reduce of a [batch, {HIDDEN}] float vector between two one-thread processes, us",
        ("link", *(f"batch {b}" for b in results["batches"]), "batch 1 inside ONNX Runtime", gather),
        rows,
        "Each link's pair of processes is started afresh each round; a figure is the median of five blocks of calls "
        "from Python. Inside ONNX Runtime: a chain of AllReduce nodes run as the rank graphs run them over gloo "
        "(the onnxruntime-extensions Python op). The veth joins two network namespaces (tools/two_hosts.py): two "
        "hosts with the kernel's network stack between them but no wire; capped, a token bucket limits both ends' "
        f"egress. Skipped here: {'; '.join(f'{k} ({v})' for k, v in results['skipped'].items()) or 'nothing'}.",
    )
    out = [allreduce]
    decode = {name: [r for r in runs if "itl_ms" in r] for name, runs in results["decode"].items()}
    if decode:
        whole = decode.get(UNSHARDED, [])
        out.append(
            bench_record.table(
                "Tensor-parallel 2 decode at batch 1 over each link, fp32",
                ("runtime", "ITL ms", "p90 ITL ms", "ITL / unsharded (per round)", "same tokens on every rank"),
                [
                    [
                        name,
                        fig([r["itl_ms"] for r in runs], 2),
                        fig([r["p90_itl_ms"] for r in runs], 2),
                        fig([t["itl_ms"] / w["itl_ms"] for w, t in zip(whole, runs, strict=False)], 3),
                        "" if "tokens" not in (runs or [{}])[0] else all(r["same_tokens_on_every_rank"] for r in runs),
                    ]
                    for name, runs in decode.items()
                ],
                "The SmolLM2-shaped random-weight model of make bench-tensor-parallel, a 32-token prompt, the median "
                "interval of 64 greedy tokens. The gloo ranks are two processes that each gather the logits over gloo "
                "(as a driver on the first host would get the second host's slice), one intra-op thread a rank; the "
                "one-host ranks are the product's (native shared-memory all-reduce, the driver's pipes).",
            )
        )
    checks = collective_checks(results)
    if checks:
        out.append(
            bench_record.table(
                "The sizing model (docs/parallel.md) against these measurements",
                ("term", "predicted", "measured"),
                checks,
                "Predicted from the other measured terms (tools/parallel_model.py): the capped link's all-reduce and "
                "gather as the uncapped veth's plus the bytes a rank sends at the rate; a decode's ITL as the "
                "unsharded ITL spread over the ranks' cores, plus 61 all-reduces inside ONNX Runtime over the link and "
                "one gather of the logits.",
            )
        )
    return out


if __name__ == "__main__":
    main()
