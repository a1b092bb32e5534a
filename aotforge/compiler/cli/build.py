"""``aotforge compile``: flags (``cli.build_flags``) over a recipe -> ``BuildOptions`` -> ``build``; prints the path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.build_flags import given_options, option_flags
from aotforge.compiler.cli.common import manifest_summary, user_errors
from aotforge.compiler.cli.progress import build_progress


@click.command()
@click.argument("model")
@option_flags()
@click.option(
    "--explain-cache",
    is_flag=True,
    help="Skip the cache's direct mode and say why the IR-level cache hit or missed (needs --cache-dir).",
)
@click.option("--recipe", type=click.Path(path_type=Path), help="TOML recipe of passes and options; flags override it.")
@click.option("--sign-key", type=click.Path(path_type=Path), help="Sign the artifact with this ed25519 private key.")
@click.option(
    "--push", "push_to", help="Then push it to this registry (a local directory or an http(s):// MLflow tracking URI)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (path, name, version, target, figures).")
@user_errors
def compile(model: str, **kw: Any) -> None:
    """Compile MODEL (.onnx file, .py model file or module, transformers model directory) into an artifact;
    prints its path last (with --json: one JSON object, its path in "path")."""
    from rich.console import Console

    # Only light modules here: a direct cache hit must not import torch, onnx or the targets.
    from aotforge.compiler.api import build, resolve_options

    # The flags given over the recipe's values (the flag table's merges: --precision appends to its pass list).
    options = resolve_options(None, kw["recipe"], given_options(click.get_current_context(), kw))
    if "," in options.target or options.target == "all":  # compiler.farm: one artifact per target
        from aotforge.compiler.cli.farm import compile_many

        return compile_many(model, options, kw)
    if kw["explain_cache"] and options.cache_dir is None:
        raise click.BadParameter("--explain-cache needs --cache-dir", param_hint="--explain-cache")
    console = Console(stderr=True)
    with build_progress(console) as progress:
        result = build(model, options, progress=progress, direct_lookup=not kw["explain_cache"])
    if options.prepare_only:
        console.print(
            f"bundle for {options.target} written; finish it with: aotforge finish {result.path}",
            markup=False,
            soft_wrap=True,
        )
        click.echo(json.dumps({"path": str(result.path), "bundle": True}) if kw["as_json"] else str(result.path))
        return
    m = result.manifest
    console.print(manifest_summary(m.to_dict()), markup=False, highlight=False)
    console.print(_digest_line(result.path), markup=False, highlight=False, soft_wrap=True)
    if "cache" in m.build:
        console.print(_cache_line(m.build["cache"]), markup=False, highlight=False, soft_wrap=True)
    if kw["sign_key"]:
        from aotforge.artifacts.signing import sign

        sign(result.path, kw["sign_key"])
        console.print(f"signed: {result.path / 'manifest.sig'}", markup=False, soft_wrap=True)
    pushed = None
    if kw["push_to"]:
        from aotforge.artifacts.registry import open_registry

        ref_name, ref_version = open_registry(kw["push_to"]).push(result.path)
        console.print(f"pushed to {kw['push_to']} as {ref_name}:{ref_version}", markup=False, soft_wrap=True)
        pushed = {"registry": kw["push_to"], "ref": f"{ref_name}:{ref_version}"}
    if kw["as_json"]:
        click.echo(json.dumps(compile_report(result.path, m.to_dict(), pushed), indent=2, sort_keys=True))
        return
    click.echo(str(result.path))


def compile_report(path: Path, m: dict[str, Any], pushed: dict[str, str] | None) -> dict[str, Any]:
    """``compile --json``: where the artifact is, what it is, and its figures (the manifest has the rest)."""
    from aotforge.artifacts.hashing import sha256_file

    v = m["validation"]
    return {
        "path": str(path),
        "name": m["name"],
        "version": m["version"],
        "target": m["target"]["name"],
        "passes": [p["name"] for p in m["passes"]],
        "manifest_sha256": sha256_file(path / "manifest.json"),
        "validation": {k: v[k] for k in ("passed", "tolerance", "metrics", "token_agreement") if k in v},
        "benchmark": m["benchmark"],
        "files": sorted(m["files"]),
        "cache": m["build"].get("cache"),
        "signed": (path / "manifest.sig").is_file(),
        "pushed": pushed,
    }


def _digest_line(path: Path) -> str:
    """The manifest's own sha256: with it, ``verify`` and ``load`` notice an edit to the manifest too."""
    from aotforge.artifacts.hashing import sha256_file

    digest = sha256_file(path / "manifest.json")
    return f"manifest sha256: {digest} (check: aotforge verify {path} --manifest-sha256 {digest})"


def _cache_line(cache: dict[str, Any]) -> str:
    key = str(cache.get("key", ""))[:12]
    if cache.get("direct") is True:
        return f"  cache: hit (direct) {key}; {cache.get('reused', '')}"
    line = f"  cache: {'hit' if cache.get('hit') else 'miss'} {key}"
    if not cache.get("hit"):
        line += f" ({cache.get('explain', '')})"
    return line + (f"; direct mode: {cache['direct']}" if cache.get("direct") else "")
