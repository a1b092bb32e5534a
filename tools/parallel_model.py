"""The sizing model of docs/parallel.md, checked against this host's measurements (the bench JSON files).

    python tools/parallel_model.py [--tp docs/bench/tensor_parallel.json] [--pp docs/bench/pipeline_parallel.json]
        [--pp-int4 docs/bench/pipeline_parallel_int4.json]

Prints, for each measured layout, what the model predicts from the *other* measured terms beside what was measured:

* tensor parallelism, decode at batch 1: ``ITL(N) = t1 * C1 / min(N, C) + A * t_ar`` — the unsharded ITL ``t1`` on
  ``C1`` cores spread over the ranks' cores, plus ``A`` all-reduces of ``t_ar`` each (the bench's median of the
  all-reduce the ranks ran: native-in-ort, or shm-in-ort where they fell back to the Python op); ranks beyond
  the host's cores ``C`` add a scheduler hand-off to every all-reduce.
* pipeline parallelism, a serving decode step of ``m`` micro-batches over ``M`` stages:
  ``wall = (m + M - 1) / m * max_s busy_s`` (GPipe's schedule over the stages' measured busy time) and the bubble
  ``(M-1)/(m+M-1)``; with a batch in flight a stage (the engine's default), ``m`` batches of one micro-batch each
  and ``wall = max_s busy_s``; and the throughput against the unsharded artifact from first principles, between two
  bounds of a memory-bound step: one core drawing the host's whole bandwidth (``m/(m+M-1) * W / (m * W_max)``) or only
  its share (that times ``cores_per_stage / C1``); at int4 (``--pp-int4``), where the weights stream an eighth of the
  bytes and the rows' compute dominates, also the compute-bound limit ``min(M, C1) / C1 / fill`` (M one-thread stages
  against one process on the host's ``C1`` cores).
* and what the same formulas give for a host with more cores and for two hosts (``--cores``, ``--link-us``,
  ``--link-gbps``): the terms a user puts in to size a deployment.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
BENCH = TOOLS.parent / "docs" / "bench"
#: SmolLM2-135M: all-reduces a decode step (2 a layer and the vocabulary-parallel embedding), hidden size.
ALL_REDUCES, HIDDEN = 61, 576


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def split(rounds: dict[str, Any]) -> tuple[str, str]:
    """``(the unsharded runtime's name, the sharded one's)`` in a bench's rounds (stored with sorted keys)."""
    whole = next(name for name in rounds if name.startswith("unsharded"))
    return whole, next(name for name in rounds if name != whole)


def tensor_parallel(data: dict[str, Any], host_cores: int) -> list[str]:
    results = data["results"]
    rounds = {name: [r["itl_ms"] for r in runs if "itl_ms" in r] for name, runs in results["rounds"].items()}
    whole_name, tp_name = split(rounds)
    degree = int(results["bytes"]["degree"])
    t1, measured = median(rounds[whole_name]), median(rounds[tp_name])
    ran = {r.get("all_reduce", "") for r in results["rounds"][tp_name]}
    method = "native-in-ort" if ran == {"native"} and "native-in-ort" in results["collectives_us"] else "shm-in-ort"
    t_ar = median(results["collectives_us"][method]) / 1e3
    compute = t1 * host_cores / min(degree, host_cores)
    predicted = compute + ALL_REDUCES * t_ar
    return [
        f"tensor parallel {degree}, ITL at batch 1: predicted {predicted:.1f} ms "
        f"(weights {compute:.1f} + {ALL_REDUCES} all-reduces x {t_ar:.3f} ms), measured {measured:.1f} ms "
        f"(unsharded {t1:.1f} ms)"
        + (
            f"; {degree} ranks on {host_cores} cores: every all-reduce also waits for a descheduled rank"
            if degree > host_cores
            else ""
        )
    ]


def pipeline_parallel(data: dict[str, Any], host_cores: int) -> list[str]:
    results = data["results"]
    whole_name, pp_name = split(results["rounds"])
    whole = [r for r in results["rounds"][whole_name] if "requests_per_s" in r]
    staged = [r for r in results["rounds"][pp_name] if "requests_per_s" in r]
    bounds, m = results["bounds"], int(results["micro_batches"])
    stages = len(bounds) - 1
    # A batch in flight a stage keeps every stage busy: each batch is one micro-batch and there is no fill.
    in_flight = int(results.get("batches_in_flight", 1))
    m, fill = (in_flight, 1.0) if in_flight >= stages else (m, (m + stages - 1) / m)
    lines = []
    wall = [fill * max(r["stage_busy_s"]) for r in staged]
    lines.append(
        f"pipeline parallel {stages}, "
        f"{f'{in_flight} batches in flight' if in_flight >= stages else f'{m} micro-batches'}: "
        "wall predicted from the stages' busy time "
        f"{median(wall):.2f} s, measured {median([r['wall_s'] for r in staged]):.2f} s; bubble theory "
        f"{results['bubble_theory']:.3f}, measured {median([r['bubble'] for r in staged]):.3f}"
    )
    layers = bounds[-1]
    # The largest stage's share of the weights, the head (~8 layers of SmolLM2) counted with the last stage.
    head = 8
    shares = [(bounds[s + 1] - bounds[s] + (head if s == stages - 1 else 0)) / (layers + head) for s in range(stages)]
    best = 1 / fill / (m * max(shares))
    worst = best * 1 / host_cores
    ratio = median([p["requests_per_s"] / w["requests_per_s"] for w, p in zip(whole, staged, strict=False)])
    precision = results.get("precision", "fp32")
    lines.append(
        f"pipeline parallel {stages} {precision}, throughput / unsharded: predicted {worst:.2f} .. {best:.2f} "
        f"(a stage's one core drawing its share .. all of the host's bandwidth), measured {ratio:.2f}"
    )
    if precision != "fp32":  # the weight term shrinks: the step tends to the rows' compute, shared by the stages
        limit = min(stages, host_cores) / host_cores / fill
        lines.append(
            f"pipeline parallel {stages} {precision}, compute-bound limit {limit:.2f} ({stages} one-thread stages "
            f"against one process on {host_cores} cores), measured {ratio:.2f}"
        )
    return lines


VETH, LOOPBACK = "gloo, veth (two namespaces)", "gloo, loopback (one host)"
#: The decode rows of docs/bench/collectives.json that run over gloo, and the link each one's all-reduces take.
GLOO_DECODES = {"tensor-parallel 2, gloo over loopback": LOOPBACK, "tensor-parallel 2, gloo across the veth": VETH}


def wire_us(floats: int, mbit: float) -> float:
    """Microseconds ``floats`` fp32 values take on a link of ``mbit`` Mbit/s: what each rank of two sends in an
    all-reduce (half its vector in the reduce-scatter and half in the all-gather of a ring, or all of it at once)."""
    return floats * 4 * 8 / mbit


def _median_of(runs: list[dict[str, Any]], *keys: str) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values.append(float(value))
    return median(values) if values else float("nan")


def decode_terms(results: dict[str, Any], link: str) -> tuple[float, float, float]:
    """``(weights ms, all-reduces ms, gather ms)`` the model gives a tensor-parallel decode step over ``link``: the
    unsharded ITL over the ranks' cores, ``ALL_REDUCES`` of the all-reduce as the rank graphs call it, one gather."""
    cores, degree = int(results["cpus"]), int(results["degree"])
    t1 = _median_of(results["decode"]["unsharded (ORT default threads)"], "itl_ms")
    runs = results["collectives"][link]
    per_call = _median_of(runs, "in_ort_us") / 1e3
    return t1 * cores / min(degree, cores), ALL_REDUCES * per_call, _median_of(runs, "gather_us") / 1e3


def collective_checks(results: dict[str, Any]) -> list[list[Any]]:
    """``[term, predicted, measured]`` rows from a collectives bench: the capped link's all-reduce and gather from the
    plain veth's and the rate, and each gloo decode's ITL from its terms."""
    from bench_record import figure

    fig = lambda values: figure(values, 2)  # noqa: E731
    coll, rows = results["collectives"], []
    rate, hidden = float(results.get("rate_mbit") or 0), int(results["hidden"])
    capped = f"gloo, veth capped at {rate:g} Mbit/s"
    if VETH in coll and capped in coll:
        for b in results["batches"]:
            plain = _median_of(coll[VETH], "allreduce_us", str(b))
            measured = [r["allreduce_us"][str(b)] for r in coll[capped] if "allreduce_us" in r]
            rows.append(
                [f"all-reduce of [{b}, {hidden}] at {rate:g} Mbit/s, us", round(plain + wire_us(b * hidden, rate), 1),
                 fig(measured) if measured else "-"]
            )  # fmt: skip
        measured = [r["gather_us"] for r in coll[capped] if "gather_us" in r]
        slice_ = int(results["vocab"]) // int(results["degree"])
        predicted = _median_of(coll[VETH], "gather_us") + wire_us(slice_, rate)
        rows.append(
            [
                f"gather of [1, {slice_}] logits at {rate:g} Mbit/s, us",
                round(predicted),
                fig(measured) if measured else "-",
            ]
        )
    for name, link in GLOO_DECODES.items():
        runs = [r["itl_ms"] for r in results["decode"].get(name, []) if "itl_ms" in r]
        if runs and link in coll:
            weights, reduces, gather = decode_terms(results, link)
            rows.append([f"{name}: ITL ms", round(weights + reduces + gather, 2), fig(runs)])
    return rows


def collectives(results: dict[str, Any], link_us: float, link_gbps: float) -> list[str]:
    """The checks above as lines, and a decode over two real hosts from the veth's terms and a link's."""
    lines = [
        f"{term}: predicted {predicted}, measured {measured['median'] if isinstance(measured, dict) else measured}"
        for term, predicted, measured in collective_checks(results)
    ]
    if VETH in results["collectives"] and "unsharded (ORT default threads)" in results["decode"]:
        weights, reduces, gather = decode_terms(results, VETH)
        per_reduce = 2 * link_us + wire_us(int(results["hidden"]), link_gbps * 1e3)
        per_gather = 2 * link_us + wire_us(int(results["vocab"]) // 2, link_gbps * 1e3)
        itl = weights + reduces + gather + (ALL_REDUCES * per_reduce + per_gather) / 1e3
        lines.append(
            f"tensor parallel 2 on two hosts {link_us:g} us and {link_gbps:g} Gb/s apart: ITL ~{itl:.1f} ms (weights "
            f"{weights:.1f} + {ALL_REDUCES} all-reduces x {(reduces * 1e3 / ALL_REDUCES + per_reduce) / 1e3:.3f} ms + "
            f"gather {gather + per_gather / 1e3:.2f} ms: the veth's stack cost plus the link's round trip and bytes)"
        )
    return lines


def sizing(cores: int, link_us: float, link_gbps: float) -> list[str]:
    """What the formulas give elsewhere (no measurement to check: the inputs a user sizes a deployment with)."""
    bytes_ar = 4 * HIDDEN
    two_hosts = 2 * link_us + bytes_ar / (link_gbps * 1e9 / 8) * 1e6
    return [
        f"two hosts, one all-reduce of [1, {HIDDEN}]: ~{two_hosts:.0f} us (2 x {link_us:.0f} us latency + "
        f"{bytes_ar} B at {link_gbps:g} Gb/s): {ALL_REDUCES} a step = {ALL_REDUCES * two_hosts / 1e3:.1f} ms of ITL "
        "for tensor parallelism; a pipeline boundary pays it once per micro-batch",
        f"a host of {cores} cores: ranks/stages of {cores // 2} cores each keep the bubble and all-reduce terms "
        "and divide the weight term by the bandwidth each rank draws",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=Path, default=BENCH / "tensor_parallel.json")
    parser.add_argument("--pp", type=Path, default=BENCH / "pipeline_parallel.json")
    parser.add_argument("--pp-int4", type=Path, default=BENCH / "pipeline_parallel_int4.json")
    parser.add_argument("--collectives", type=Path, default=BENCH / "collectives.json")
    parser.add_argument("--host-cores", type=int, default=2, help="cores of the host the benches ran on")
    parser.add_argument("--cores", type=int, default=32)
    parser.add_argument("--link-us", type=float, default=25.0, help="one-way latency between two hosts")
    parser.add_argument("--link-gbps", type=float, default=25.0)
    args = parser.parse_args()
    lines: list[str] = []
    if args.tp.is_file():
        lines += tensor_parallel(json.loads(args.tp.read_text()), args.host_cores)
    for pp in (args.pp, args.pp_int4):
        if pp.is_file():
            lines += pipeline_parallel(json.loads(pp.read_text()), args.host_cores)
    if args.collectives.is_file():
        lines += collectives(json.loads(args.collectives.read_text())["results"], args.link_us, args.link_gbps)
    lines += sizing(args.cores, args.link_us, args.link_gbps)
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
