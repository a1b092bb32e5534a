"""What ``aotforge bench serve`` shows: a table (one column per request rate) and a plot of latency against load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: (row label, key of a run's summary, format) in the order vLLM's report prints them.
ROWS = (
    ("Successful requests", "completed", "{:d}"),
    ("Failed requests", "failed", "{:d}"),
    ("Duration (s)", "duration", "{:.2f}"),
    ("Total input tokens", "total_input_tokens", "{:d}"),
    ("Total output tokens", "total_output_tokens", "{:d}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Request goodput (req/s)", "request_goodput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.1f}"),
    ("Total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    *(
        (f"{stat.capitalize()} {label} (ms)", f"{stat}_{key}", "{:.2f}")
        for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency"))
        for stat in ("mean", "median", "p99")
    ),
)


def table(report: dict[str, Any]) -> Any:
    """A rich table of the report's runs."""
    from rich.table import Table

    config = report["config"]
    title = (
        f"bench serve {config['base_url']}{config['endpoint']}: {config['num_prompts']} prompts, "
        f"input {config['input_len']}, output {config['output_len']} (range ratio {config['range_ratio']})"
    )
    t = Table(title=title)
    t.add_column("")
    for run in report["runs"]:
        concurrency = f", concurrency {run['max_concurrency']}" if run["max_concurrency"] else ""
        t.add_column(f"rate {run['request_rate']}{concurrency}", justify="right")
    for label, key, fmt in ROWS:
        if any(key in run for run in report["runs"]):
            t.add_row(label, *(_cell(run.get(key), fmt) for run in report["runs"]))
    return t


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def plot(report: dict[str, Any], path: Path) -> Path:
    """TTFT, TPOT and E2E latency (median and p99) against the achieved request throughput, one point per rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(report["runs"], key=lambda r: r["request_throughput"])
    x = [r["request_throughput"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), constrained_layout=True)
    for ax, (key, label) in zip(
        axes, (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency")), strict=True
    ):
        for stat, style in (("median", "o-"), ("p99", "s--")):
            ax.plot(x, [r[f"{stat}_{key}"] for r in runs], style, label=stat)
        ax.set(title=label, xlabel="request throughput (req/s)", ylabel="ms")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{report['config']['base_url']}: latency against load")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
