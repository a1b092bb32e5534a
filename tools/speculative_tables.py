"""``tools/bench_speculative.py``'s results rendered: the console table it prints, and the benchmark page's tables
(``bench_record``) it writes into its JSON: per target, each run's figures and speed-ups with their spread over the
rounds, and the draft's own training (a distilled draft's, or a feature draft's report)."""

from __future__ import annotations

import json
from typing import Any

import bench_record  # tools/, beside this script


def table(results: dict[str, Any]) -> str:
    rows = [
        "| target | run | tokens/s b1 (decode) | speed-up | CPU ms/token | CPU speed-up | end to end speed-up "
        "| acceptance |",
        "|---|---|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for target, r in results.items():
        if not isinstance(r, dict) or "runs" not in r:
            continue
        for label, run_ in r["runs"].items():
            mark = " (best)" if label == r["best"] else ""
            acc = run_.get("acceptance_rate")
            rows.append(
                f"| {target} | {label}{mark} | {run_.get('tokens_per_s', nan):.1f} | {run_.get('speed_up', nan):.2f}x "
                f"| {run_.get('cpu_ms_per_token', nan):.3f} | {run_.get('cpu_speed_up', nan):.2f}x "
                f"| {run_.get('end_to_end_speed_up', nan):.2f}x | {'-' if acc is None else f'{acc:.0%}'} |"
            )
        rows.append(f"{target}: speculative output identical to target-only greedy: {r['identical_tokens']}")
    load = " / ".join(f"{x:.1f}" for x in results["load_before"]), " / ".join(f"{x:.1f}" for x in results["load_after"])
    rows.append(f"load average {load[0]} before, {load[1]} after")
    return "\n".join(rows)


def page_tables(results: dict[str, Any]) -> list[dict[str, Any]]:
    """docs/benchmarks.md's tables: per target, each run's figures and speed-ups with their spread over the rounds."""
    tables = []
    trained = results.get("draft_training")
    if trained:
        held = trained["held_out"] or {}
        options = trained["options"] or {}
        tables.append(
            bench_record.table(
                "The draft",
                (
                    "student",
                    "vocabulary",
                    "steps",
                    "train s (wall)",
                    "train CPU s (teacher's pool)",
                    "greedy agreement (held out)",
                    "on the teacher's continuations",
                ),
                [
                    [
                        str(trained["student"]),
                        str(trained.get("draft_vocab") or "the target's"),
                        str(trained["steps"]),
                        str(trained["train_seconds"]),
                        f"{trained.get('train_cpu_seconds')} ({trained.get('pool_cpu_seconds') or 0})",
                        f"{held.get('greedy_agreement', float('nan')):.1%}",
                        f"{held.get('continuation_agreement', float('nan')):.1%}",
                    ]
                ],
                f"aotforge distill options: {json.dumps(options, sort_keys=True)}",
            )
        )
    feature = (results.get("feature_draft") or {}).get("training")
    if feature:  # what the feature draft timed here cost to train, and what its report predicted
        after = feature.get("after") or {}
        data = (feature.get("pool_cpu_seconds") or 0) + (feature.get("features_cpu_seconds") or 0)
        tables.append(
            bench_record.table(
                "The feature draft",
                (
                    "steps",
                    "train CPU s (the teacher's data)",
                    "held-out acceptance a1 / a2 / a3",
                    "tokens a round, k=1..3",
                ),
                [
                    [
                        str(feature.get("steps")),
                        f"{feature.get('train_cpu_seconds')} ({round(data, 1)})",
                        " / ".join(f"{a:.1%}" for a in after.get("acceptance", [])),
                        " / ".join(str(t) for t in after.get("expected_tokens", [])),
                    ]
                ],
                f"aotforge distill-draft options: {json.dumps(feature.get('options') or {}, sort_keys=True)}",
            )
        )
    for target, r in results.items():
        if target in ("draft_training", "feature_draft"):
            continue
        if not isinstance(r, dict) or "runs" not in r:
            if isinstance(r, dict) and "error" in r:
                tables.append(bench_record.table(target, ("run",), [[f"not built: {str(r['error'])[:200]}"]]))
            continue
        rows: list[list[bench_record.Cell]] = []
        for label, row in r["runs"].items():
            ok = [x for x in r["rounds"][label] if "error" not in x]
            rows.append(
                [
                    label + (" (best)" if label == r["best"] else ""),
                    bench_record.figure([x["tokens_per_s"] for x in ok]),
                    bench_record.figure(row.get("speed_up_rounds", [])),
                    bench_record.figure([x["cpu_ms_per_token"] for x in ok]),
                    bench_record.figure(row.get("cpu_speed_up_rounds", [])),
                    bench_record.figure(row.get("end_to_end_speed_up_rounds", [])),
                    bench_record.figure([x["acceptance_rate"] for x in ok if x.get("acceptance_rate") is not None]),
                ]
            )
        columns = ("run", "tokens/s (decode)", "speed-up", "CPU ms per token", "CPU speed-up", "end to end speed-up")
        note = f"Output identical to target-only greedy decoding in every run: {r['identical_tokens']}."
        tables.append(bench_record.table(f"{target}, batch 1", (*columns, "acceptance rate"), rows, note))
    return tables
