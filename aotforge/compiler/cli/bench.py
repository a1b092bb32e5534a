"""``aotforge bench``: time an artifact in a process of its own, like ``trtexec --loadEngine``; ``aotforge bench
serve ...`` measures a server instead (``compiler/cli/serve.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.cli.common import user_errors
from aotforge.compiler.cli.serve import bench_serve


class BenchCommand(click.Command):
    """``aotforge bench ARTIFACT [OPTIONS]``, and ``aotforge bench serve [OPTIONS]`` routed to :func:`bench_serve`
    by its first word. A group would move the artifact command's options under a subcommand name and break every
    ``aotforge bench ART --threads ...`` already written; an artifact directory named ``serve`` is ``./serve``."""

    #: first word -> the command it routes to
    subcommands: dict[str, click.Command] = {"serve": bench_serve}

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        if args and args[0] in self.subcommands:
            command = self.subcommands[args[0]]
            return command.make_context(f"{info_name} {args[0]}", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


#: The benchmark's defaults (``BenchOptions``), which the flags show and pass on.
_RUNS = BenchOptions()


@click.command(cls=BenchCommand)
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "--inputs",
    "inputs_file",
    type=click.Path(path_type=Path),
    help="FILE.npz (arrays named after the inputs; its first sample is timed); default: seeded inputs at the "
    "dims' opt sizes.",
)
@click.option("--batch", type=click.IntRange(min=1), help="Batch size of the generated inputs (the batch dim's).")
@click.option("--threads", default="0", show_default=True, help="Runtime threads, one run each: 1,2,4 (0: default).")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=_RUNS.max_seconds, show_default=True)
@click.option(
    "--warmup", type=click.IntRange(min=0), default=_RUNS.warmup, show_default=True, help="Untimed calls first."
)
@click.option("--max-runs", type=click.IntRange(min=1), default=_RUNS.max_runs, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@user_errors
def bench(
    artifact: Path,
    inputs_file: Path | None,
    batch: int | None,
    threads: str,
    seconds: float,
    warmup: int,
    max_runs: int,
    as_json: bool,
) -> None:
    """Benchmark ARTIFACT: warm-up, then timed calls in a fresh process per thread count (this process's
    libraries are not in its figures); p50/p90/p99/mean/std, throughput and the runner's peak memory.

    `aotforge bench serve --base-url URL ...` loads a running OpenAI-compatible server instead (its --help)."""
    from aotforge.artifacts.signing import verified_manifest
    from aotforge.compiler.bench import bench_artifact, bench_inputs
    from aotforge.core.spec import IOSpec

    counts = (0,) if threads.strip() == "0" else _threads(threads)
    manifest = verified_manifest(artifact)
    inputs, size = bench_inputs(IOSpec.from_dict(manifest.io), inputs_file=inputs_file, batch=batch)
    options = BenchOptions(
        warmup=warmup, min_runs=min(_RUNS.min_runs, max_runs), max_runs=max_runs, max_seconds=seconds
    )
    runs = bench_artifact(artifact, inputs, batch=size, options=options, threads=counts)
    report: dict[str, Any] = {
        "path": str(artifact),
        "name": manifest.name,
        "version": manifest.version,
        "target": manifest.target.name,
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in inputs.items()},
        "results": [r.result for r in runs],
    }
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    click.echo(
        f"{manifest.name} v{manifest.version} for {manifest.target.name}, batch {size}, inputs "
        + ", ".join(f"{k}{list(v.shape)}" for k, v in inputs.items())
    )
    click.echo(
        f"{'threads':>8} {'p50 ms':>10} {'p90 ms':>10} {'p99 ms':>10} {'mean ms':>10} {'std ms':>9} "
        f"{'per s':>10} {'runs':>6} {'peak MB':>8} {'model MB':>9}"
    )
    for r in report["results"]:
        click.echo(
            f"{r['threads'] or 'default':>8} {r['p50_ms']:>10.3f} {r['p90_ms']:>10.3f} {r['p99_ms']:>10.3f} "
            f"{r['mean_ms']:>10.3f} {r['std_ms']:>9.3f} {r['throughput_per_s']:>10.1f} {r['runs']:>6} "
            f"{r['peak_rss_mb']:>8.1f} {r['runner_rss_mb']:>9.1f}"
        )


def _threads(text: str) -> tuple[int, ...]:
    from aotforge.compiler.bench import parse_threads

    return parse_threads(text)
