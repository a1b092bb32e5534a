"""``aotforge serve``: an OpenAI-compatible HTTP server over a text-generation artifact, and ``aotforge bench
serve``: load against any such server (``aotforge bench`` routes its ``serve`` word here)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from aotforge.compiler.cli.common import user_errors
from aotforge.compiler.cli.placement_flags import placement_from, placement_options
from aotforge.core.errors import InputSpecError
from aotforge.core.placement import Workers
from aotforge.runtime.params import DRAIN_TIMEOUT_S, EngineConfig
from aotforge.server.bench import LoadSpec

#: ``bench serve``'s defaults are LoadSpec's, written once there.
_LOAD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LoadSpec)}

#: Each EngineConfig field's help; its flag, type and default come from the field itself.
ENGINE_HELP = {
    "max_num_seqs": "Most sequences in the running batch (0: the artifact's max_batch).",
    "max_num_batched_tokens": "Most tokens one engine step takes (decode tokens + prefill chunks).",
    "block_size": "Tokens per KV-cache block.",
    "num_blocks": "KV-cache blocks (0: from --kv-cache-bytes).",
    "kv_cache_bytes": "KV-cache size in bytes (0: --max-num-seqs full-length sequences).",
    "enable_prefix_caching": "Reuse the KV blocks of a prompt prefix already computed.",
    "max_waiting": "Most requests waiting; past it a request is refused with 429.",
    "max_batches_in_flight": "Most batches in flight at once on a pipeline-parallel artifact (0: one a stage).",
}


def engine_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """One click option per :class:`EngineConfig` field (``enable_x`` -> ``--x/--no-x``), its default the field's."""
    for field in reversed(dataclasses.fields(EngineConfig)):
        if isinstance(field.default, bool):
            flag = field.name.removeprefix("enable_").replace("_", "-")
            decls = [f"--{flag}/--no-{flag}", field.name]
            option = click.option(*decls, default=field.default, show_default=True, help=ENGINE_HELP[field.name])
        else:
            kind = click.IntRange(min=0)
            decls = ["--" + field.name.replace("_", "-"), field.name]
            option = click.option(
                *decls, type=kind, default=field.default, show_default=True, help=ENGINE_HELP[field.name]
            )
        func = option(func)
    return func


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@engine_options
@click.option(
    "--api-key", envvar="AOTFORGE_API_KEY", help="Ask /v1/* for `Authorization: Bearer KEY` (or $AOTFORGE_API_KEY)."
)
@click.option("--served-model-name", help="The model name clients send (default: the artifact's name).")
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=DRAIN_TIMEOUT_S,
    show_default=True,
    help="On SIGTERM / Ctrl-C: seconds in-flight requests may take to finish before they are aborted.",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Servers behind the one endpoint: Ray Serve replicas, routed by queue length (needs ray[serve]).",
)
@placement_options
@user_errors
def serve(
    artifact: Path,
    host: str,
    port: int,
    api_key: str | None,
    served_model_name: str | None,
    drain_timeout: float,
    replicas: int,
    workers: str,
    ray_address: str | None,
    spread: str,
    **engine: Any,
) -> None:
    """Serve ARTIFACT (text generation) as an OpenAI-compatible API: /v1/models, /v1/completions,
    /v1/chat/completions, /health and Prometheus /metrics, over the runtime's engine (requests join and leave
    the running batch at every step)."""
    import uvicorn

    from aotforge.artifacts.engine_loader import load_async_engine
    from aotforge.server.app import build_app

    placement = placement_from(workers, spread, ray_address)
    # server/replicas.py: the same app in each Ray Serve replica (a --ray-address alone asks for one replica there)
    if replicas > 1 or (ray_address and placement.workers is Workers.PROCESSES):
        from aotforge.server.replicas import ReplicaOptions, serve_replicas

        logging.disable(logging.NOTSET)
        options = ReplicaOptions(replicas, api_key, served_model_name, drain_timeout)
        return serve_replicas(artifact, EngineConfig(**engine), options, host, port, ray_address, placement)
    engine_ = load_async_engine(artifact, EngineConfig(**engine), placement)
    llm = engine_.engine
    click.echo(
        f"KV cache: {llm.blocks.num_blocks} blocks of {llm.blocks.block_size} positions, "
        f"{llm.runner.kv_cache_bytes() / 2**20:.0f} MiB in the runner's buffers"
    )
    app = build_app(engine_, api_key=api_key, served_model_name=served_model_name, drain_timeout_s=drain_timeout)
    # The CLI silences library logging for its one-line messages; a server's log (start-up, each request, the
    # drain) is its output, so uvicorn's loggers speak again once the artifact is loaded.
    logging.disable(logging.NOTSET)
    # uvicorn handles SIGTERM / SIGINT: it stops accepting, waits up to the drain deadline for open requests
    # (then cancels them, which aborts theirs in the engine), and the app's lifespan shuts the engine down.
    config = uvicorn.Config(
        app, host=host, port=port, timeout_graceful_shutdown=math.ceil(drain_timeout), log_level="info"
    )
    uvicorn.Server(config).run()


class RateList(click.ParamType):
    """``1,2,4`` or ``inf``: request rates in requests per second."""

    name = "RATE[,RATE...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[float]:
        if isinstance(value, list):
            return value
        try:
            rates = [float(part) for part in str(value).split(",") if part.strip()]
        except ValueError:
            self.fail(f"{value!r}: give request rates per second, e.g. 1,2,4 or inf", param, ctx)
        if not rates or any(r <= 0 or math.isnan(r) for r in rates):
            self.fail(f"{value!r}: request rates must be > 0 (inf: all at once)", param, ctx)
        return rates


@click.command("serve")
@click.option("--base-url", required=True, help="The server, e.g. http://127.0.0.1:8000 (any OpenAI-compatible one).")
@click.option("--model", help="Model name to send (default: the first of GET /v1/models).")
@click.option(
    "--endpoint",
    type=click.Choice(["/v1/completions", "/v1/chat/completions"]),
    default=_LOAD_DEFAULTS["endpoint"],
    show_default=True,
)
@click.option("--num-prompts", type=click.IntRange(min=1), default=_LOAD_DEFAULTS["num_prompts"], show_default=True)
@click.option(
    "--request-rate",
    "request_rates",
    type=RateList(),
    multiple=True,
    help="Requests per second, Poisson arrivals (inf: all at once, the default); several (1,2,4) run one "
    "after another and --plot draws latency against them.",
)
@click.option("--max-concurrency", type=click.IntRange(min=1), help="Most requests in flight at once.")
@click.option(
    "--input-len",
    type=click.IntRange(min=1),
    default=_LOAD_DEFAULTS["input_len"],
    show_default=True,
    help="Prompt length (tokens with --tokenizer, else words).",
)
@click.option(
    "--output-len",
    type=click.IntRange(min=1),
    default=_LOAD_DEFAULTS["output_len"],
    show_default=True,
    help="max_tokens of each.",
)
@click.option(
    "--range-ratio",
    type=click.FloatRange(0, 1, max_open=True),
    default=_LOAD_DEFAULTS["range_ratio"],
    show_default=True,
    help="Lengths uniform in [len * (1 - X), len * (1 + X)].",
)
@click.option("--ignore-eos", is_flag=True, help="Ask the server to keep going past end-of-sequence tokens.")
@click.option("--goodput", multiple=True, help="SLOs for goodput, e.g. ttft_ms=500,tpot_ms=50 (also e2el_ms).")
@click.option(
    "--seed", type=int, default=_LOAD_DEFAULTS["seed"], show_default=True, help="Seeds the prompts and arrival times."
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path, file_okay=False),
    help="The server's tokenizer directory (e.g. the artifact): prompts cut in tokens, not words.",
)
@click.option("--api-key", envvar="AOTFORGE_API_KEY", help="Bearer key (or $AOTFORGE_API_KEY).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=_LOAD_DEFAULTS["timeout_s"],
    show_default=True,
    help="Seconds one request may take.",
)
@click.option("--json", "json_file", type=click.Path(path_type=Path, dir_okay=False), help="Write the report as JSON.")
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Draw latency against load (PNG), for several --request-rate values.",
)
@user_errors
def bench_serve(
    request_rates: tuple[list[float], ...],
    goodput: tuple[str, ...],
    tokenizer: Path | None,
    json_file: Path | None,
    plot_file: Path | None,
    timeout: float,
    **load: Any,
) -> None:
    """Load an OpenAI-compatible server with streamed requests of real English text and report TTFT, TPOT, ITL,
    end-to-end latency (mean / median / p99), throughput, goodput and failed requests, like `vllm bench serve`."""
    from rich.console import Console

    from aotforge.server.bench import bench_serve, parse_goodput
    from aotforge.server.bench_report import plot, table

    rates = [r for group in request_rates for r in group] or [math.inf]
    spec = LoadSpec(**load, timeout_s=timeout)
    report = bench_serve(spec, rates, goodput=parse_goodput(list(goodput)), tokenizer=_tokenizer(tokenizer))
    Console().print(table(report))
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        click.echo(f"wrote {json_file}")
    if plot_file is not None:
        click.echo(f"wrote {plot(report, plot_file)}")


def _tokenizer(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise InputSpecError("--tokenizer needs transformers (pip install transformers), or leave it out") from e
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise InputSpecError(f"--tokenizer {path}: no tokenizer there ({e})") from e
