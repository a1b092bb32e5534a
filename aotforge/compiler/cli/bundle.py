"""``aotforge finish BUNDLE``: complete a ``compile --prepare-only`` bundle on the host with the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.build_flags import given_options, option_flags
from aotforge.compiler.cli.common import user_errors


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", "-o", type=click.Path(path_type=Path), default=Path("out"), show_default=True)
@click.option("--target", "-t", help="Finish for another target than the bundle's (its options are dropped).")
@click.option("--no-bench", is_flag=True, help="Skip the benchmark even if the bundle asks for one.")
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Keep the target's timing cache here.")
@option_flags("isolate_backend", "backend_deadline", "run_deadline", "backend_memory_mb")
@user_errors
def finish(bundle: Path, out: Path, target: str | None, no_bench: bool, cache_dir: Path | None, **limits: Any) -> None:
    """Check BUNDLE's hashes, compile it for its target, validate, benchmark and store the artifact."""
    from aotforge.compiler.generative.finish import finish_bundle
    from aotforge.compiler.options import BuildOptions

    isolation = BuildOptions.from_dict(given_options(click.get_current_context(), limits)).isolation.limits()
    result = finish_bundle(
        bundle, out, target_name=target, bench=False if no_bench else None, cache_dir=cache_dir, isolation=isolation
    )
    v = result.manifest.validation
    if "token_agreement" in v:  # a text-generation bundle
        click.echo(
            f"validation passed (greedy token agreement {v['token_agreement']:.1%}, worst per-step logits rel L2 "
            f"{v['max_logits_rel_l2']:.3g}, tolerance {v['tolerance']})",
            err=True,
        )
        click.echo(str(result.path))
        return
    worst = max((m["rel_l2"] for m in v["metrics"].values()), default=0.0)
    click.echo(f"validation passed (worst rel L2 {worst:.3g}, tolerance {v['tolerance']})", err=True)
    click.echo(str(result.path))
