"""What every ``aotforge`` command shares: the user-error exit and manifest summaries."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from aotforge.core.errors import EXIT_INTERNAL, AotforgeError, describe


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """One line on stderr and the error's exit status (``core.errors.EXIT_CODES``); the traceback only
    with --debug. Anything else that escapes is a bug: one ``internal error:`` line and exit 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except AotforgeError as e:
            if click.get_current_context().find_root().params.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except Exception as e:
            if click.get_current_context().find_root().params.get("debug"):
                raise
            click.echo(
                f"internal error: {type(e).__name__}: {describe(e)} (a bug in aotforge or a library it calls: "
                "rerun with `aotforge --debug ...` for the traceback and report it)",
                err=True,
            )
            sys.exit(EXIT_INTERNAL)

    return wrapper


def manifest_summary(m: dict[str, Any]) -> str:
    """A few lines on a manifest (as a dict): what it is, its passes, validation, latency and files."""
    lines = [
        f"{m['name']} v{m['version']} for {m['target']['name']}",
        f"  source: {m['source']['format']} {m['source']['sha256'][:12]}",
    ]
    lines.append("  passes: " + (", ".join(p["name"] for p in m["passes"]) or "none"))
    v = m["validation"]
    if "token_agreement" in v:
        lines.append(
            f"  validation: {'passed' if v.get('passed') else 'failed'} (greedy tokens vs transformers"
            f"{', reported' if v.get('gated') is False else ''}: {v['token_agreement']:.1%} agree, "
            f"worst logits rel L2 {v['max_logits_rel_l2']:.3g})"
        )
    if "quality" in v:
        q = v["quality"]
        lines.append(
            f"  quality: perplexity {q['perplexity']:.4f} vs fp32 {q['reference_perplexity']:.4f} "
            f"({q['perplexity_increase']:+.2%}, budget {q['max_perplexity_increase']:g}), mean KL {q['mean_kl']:.4g}"
        )
    b = m["benchmark"]
    if "token_agreement" in v and b and "generation" in b:
        g = b["generation"]
        ttft = ", ".join(f"{ms} ms @{n}" for n, ms in g["ttft_ms"].items())
        rates = ", ".join(f"{r}/s @batch {n}" for n, r in g["tokens_per_s"].items())
        lines.append(
            f"  generation: TTFT {ttft}; ITL p50 {g['itl_ms']['p50']} ms, p99 {g['itl_ms']['p99']} ms; {rates}"
        )
    if "token_agreement" in v:
        lines.append(f"  files: {', '.join(sorted(m['files']))}")
        return "\n".join(lines)
    worst = max((x["rel_l2"] for x in v.get("metrics", {}).values()), default=0.0)
    lines.append(
        f"  validation: {'passed' if v.get('passed') else 'failed'} "
        f"(worst rel L2 {worst:.3g}, tolerance {v.get('tolerance')})"
    )
    b = m["benchmark"]
    lines.append(
        f"  latency: p50 {b['p50_ms']} ms, p99 {b['p99_ms']} ms over {b['runs']} runs"
        if b
        else "  latency: not benchmarked"
    )
    lines.append(f"  files: {', '.join(sorted(m['files']))}")
    return "\n".join(lines)
