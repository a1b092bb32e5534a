"""``aotforge bench serve``: its prompts, arrivals and figures, and the command against a running ``aotforge serve``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.compiler.cli import main
from aotforge.core.errors import InputSpecError
from aotforge.server.bench import LoadSpec, RequestResult, corpus, make_prompts, parse_goodput, summarize
from tests.serving import API_KEY, Served

FIGURES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def test_prompts_are_real_english_of_the_asked_lengths() -> None:
    spec = LoadSpec("http://x", num_prompts=50, input_len=40, output_len=10, range_ratio=0.25, seed=3)
    prompts = make_prompts(spec)
    assert prompts == make_prompts(spec) and prompts != make_prompts(LoadSpec("http://x", num_prompts=50, seed=4))
    assert all(30 <= p.prompt_len <= 50 and 7 <= p.output_len <= 13 for p in prompts)
    assert all(len(p.text.split()) == p.prompt_len for p in prompts)
    assert len({p.prompt_len for p in prompts}) > 5
    words = corpus().split()
    assert len(words) > 50_000 and {"the", "of", "and", "return", "function"} <= set(words)


def test_prompts_cut_in_tokens_with_a_tokenizer() -> None:
    from tests.lm_bytes import byte_tokenizer

    tokenizer = byte_tokenizer()
    prompts = make_prompts(LoadSpec("http://x", num_prompts=5, input_len=64), tokenizer)
    assert [p.prompt_len for p in prompts] == [64] * 5 and all(len(p.text.encode()) <= 64 for p in prompts)


def test_summary_figures() -> None:
    ok = RequestResult(prompt_len=10, output_tokens=5, ttft_s=0.1, itls_s=[0.02, 0.02, 0.03, 0.03], e2e_s=0.2)
    slow = RequestResult(prompt_len=20, output_tokens=3, ttft_s=0.5, itls_s=[0.1, 0.1], e2e_s=0.7)
    failed = RequestResult(prompt_len=7, error="HTTP 500: boom")
    report = summarize([ok, slow, failed], duration_s=2.0, goodput={"ttft_ms": 200, "tpot_ms": 50})
    assert (report["completed"], report["failed"], report["errors"]) == (2, 1, ["HTTP 500: boom"])
    assert (report["total_input_tokens"], report["total_output_tokens"]) == (30, 8)
    assert report["request_throughput"] == 1.0 and report["output_throughput"] == 4.0
    assert report["request_goodput"] == 0.5  # only `ok` meets TTFT <= 200 ms and TPOT <= 50 ms
    assert report["mean_ttft_ms"] == pytest.approx(300) and report["median_e2el_ms"] == pytest.approx(450)
    assert report["mean_tpot_ms"] == pytest.approx((25 + 100) / 2) and report["median_itl_ms"] == pytest.approx(30)
    empty = summarize([failed], duration_s=1.0)
    assert empty["mean_ttft_ms"] is None and "request_goodput" not in empty


def test_goodput_and_spec_refusals() -> None:
    assert parse_goodput(["ttft_ms=500,tpot_ms=50", "e2el_ms=2000"]) == {
        "ttft_ms": 500.0,
        "tpot_ms": 50.0,
        "e2el_ms": 2000.0,
    }
    with pytest.raises(InputSpecError, match="ttft_ms, tpot_ms, e2el_ms"):
        parse_goodput(["ttft=5"])
    with pytest.raises(InputSpecError, match="not a number"):
        parse_goodput(["tpot_ms=fast"])
    with pytest.raises(InputSpecError, match="/v1/completions or /v1/chat/completions"):
        LoadSpec("http://x", endpoint="/generate")


def test_bench_routes_serve_and_keeps_the_artifact_command() -> None:
    runner = CliRunner()
    serve_help = runner.invoke(main, ["bench", "serve", "--help"])
    assert serve_help.exit_code == 0 and "--base-url" in serve_help.output and "--goodput" in serve_help.output
    bench_help = runner.invoke(main, ["bench", "--help"])
    assert bench_help.exit_code == 0 and "--threads" in bench_help.output and "bench serve" in bench_help.output
    missing = runner.invoke(main, ["bench", "serve"])
    assert missing.exit_code == 2 and "--base-url" in missing.output
    bad_rate = runner.invoke(main, ["bench", "serve", "--base-url", "http://x", "--request-rate", "0"])
    assert bad_rate.exit_code == 2 and "must be > 0" in bad_rate.output


def _bench(served: Served, tmp_path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "bench.json"
    base = ["bench", "serve", "--base-url", served.url, "--api-key", API_KEY, "--json", str(out)]
    result = CliRunner().invoke(main, [*base, *args])
    assert result.exit_code == 0, result.output
    assert "Successful requests" in result.output and "P99 TTFT (ms)" in result.output
    return dict(json.loads(out.read_text()))


def test_bench_serve_against_the_server(chat_server: Served, chat_artifact: Path, tmp_path: Path) -> None:
    args = ["--num-prompts", "8", "--input-len", "24", "--output-len", "8", "--max-concurrency", "4"]
    report = _bench(chat_server, tmp_path, *args, "--ignore-eos", "--tokenizer", str(chat_artifact),
                    "--goodput", "ttft_ms=1e9,tpot_ms=1e9")  # fmt: skip
    assert report["config"]["model"] is None and report["config"]["request_rates"] == ["inf"]
    (run,) = report["runs"]
    assert (run["completed"], run["failed"], run["total_output_tokens"]) == (8, 0, 64)
    assert 8 * 20 <= run["total_input_tokens"] <= 8 * 28  # the server's count of each 24-token window, re-encoded
    assert run["request_goodput"] == run["request_throughput"] > 0
    assert run["output_throughput"] == pytest.approx(64 / run["duration"])
    for figure in FIGURES:
        assert 0 < run[f"median_{figure}"] <= run[f"p99_{figure}"] and run[f"mean_{figure}"] > 0
    assert run["median_ttft_ms"] < run["median_e2el_ms"]


def test_bench_serve_rates_and_plot(chat_server: Served, chat_artifact: Path, tmp_path: Path) -> None:
    plot = tmp_path / "latency.png"
    args = ["--num-prompts", "4", "--input-len", "12", "--output-len", "4", "--request-rate", "200,inf"]
    args += ["--tokenizer", str(chat_artifact)]  # 12 tokens + the chat template's 18 fit the context of 64
    report = _bench(chat_server, tmp_path, *args, "--endpoint", "/v1/chat/completions", "--plot", str(plot),
                    "--goodput", "ttft_ms=0")  # fmt: skip
    assert [r["request_rate"] for r in report["runs"]] == [200.0, "inf"]
    assert all(r["completed"] == 4 and r["failed"] == 0 and r["request_goodput"] == 0 for r in report["runs"]), report
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_bench_serve_counts_failed_requests(chat_server: Served, tmp_path: Path) -> None:
    out = tmp_path / "failed.json"
    args = ["bench", "serve", "--base-url", chat_server.url, "--model", "llama-chat", "--num-prompts", "3"]
    result = CliRunner().invoke(main, [*args, "--api-key", "wrong", "--json", str(out)])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())["runs"]
    assert (run["completed"], run["failed"]) == (0, 3) and "HTTP 401" in run["errors"][0]
    assert run["mean_ttft_ms"] is None and math.isclose(run["request_throughput"], 0.0)
    no_model = CliRunner().invoke(main, [*args[:4], "--api-key", "wrong"])
    assert no_model.exit_code == 2 and "GET /v1/models answered 401" in no_model.output
