"""``make bench-serve``: aotforge's server and llama.cpp's ``llama-server`` on the same model, side by side.

The model is SmolLM2-135M-Instruct (``tools/real_model.py``); aotforge serves artifacts built from its fp32
weights (onnxruntime and tvm, fp32 and int4 weight-only), llama.cpp the GGUF converted to F32 and Q4_0
(``tools/llama_cpp.py``). Each server runs alone on the machine, in its own process, one after the other in
alternating order per round; the same client (``aotforge.server.bench``: streaming ``/v1/completions``,
prompts of real English, ``ignore_eos``) loads each at every concurrency. Then, on aotforge's servers, the two
scheduler scenarios of the serving issue: a prompt sharing a 256-token prefix with an earlier one (TTFT of the
second over the first), and one 2,000-token prompt arriving among 7 running streams (their ITL p99 over p50).
Writes ``docs/bench/serve.json`` (``tools/bench_record.py``); ``make bench-page`` renders it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import bench_record, llama_cpp, real_model  # noqa: E402

WORK = Path.home() / ".cache" / "aotforge" / "bench-serve"
#: aotforge's precisions -> the build flags of their artifacts, and llama.cpp's GGUF of the same class.
PRECISIONS = {
    "fp32": ([], "F32"),
    "int4": (["--precision", "int4", "--max-perplexity-increase", "1"], "Q4_0"),  # quality recorded, not gated
}
SLOTS, CONTEXT = 8, 2048
#: Where the artifacts are cached; a new name when a build change matters to serving, so the next run rebuilds
#: (``artifacts-paged``: tvm's functions over a paged KV cache, which earlier builds lack).
ARTIFACTS = "artifacts-paged"


def artifact(model_dir: Path, target: str, precision: str, work: Path) -> Path:
    """The text-generation artifact of ``target`` / ``precision``, built once under ``work`` (a verify graph of 16
    tokens: the runner extends prompts through it, for prefix reuse and chunked prefill)."""
    out = work / ARTIFACTS / f"{target}-{precision}"
    found = sorted(out.glob(f"smollm2-{precision}/*/{target}/manifest.json"))
    if found:
        return found[-1].parent
    args = [sys.executable, "-m", "aotforge", "compile", str(model_dir), "--task", "text-generation"]
    args += ["--target", target, "--max-seq-len", str(CONTEXT), "--max-batch", str(SLOTS), "--speculative-k", "15"]
    args += ["--no-bench", "--name", f"smollm2-{precision}", "--out", str(out), *PRECISIONS[precision][0]]
    print(f"building {target} {precision}: {' '.join(args[3:])}", flush=True)
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return artifact(model_dir, target, precision, work)


@contextlib.contextmanager
def aotforge_process(path: Path, log: Path, args: list[str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``aotforge serve PATH ARGS`` on a free port of 127.0.0.1, healthy: its URL and its process."""
    port = llama_cpp.free_port()
    command = [sys.executable, "-m", "aotforge", "serve", str(path), "--port", str(port), *args]
    with open(log, "w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        try:
            llama_cpp.wait_healthy(proc, f"http://127.0.0.1:{port}", 300.0, log)
            yield f"http://127.0.0.1:{port}", proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def aotforge_server(path: Path, log: Path, extra: list[str] | None = None) -> Iterator[str]:
    with aotforge_process(path, log, ["--max-num-seqs", str(SLOTS), *(extra or [])]) as (url, _):
        yield url


def load_runs(url: str, args: argparse.Namespace, tokenizer: Any) -> dict[int, dict[str, Any]]:
    """One ``bench serve`` run per concurrency against ``url``: its summary by concurrency."""
    from aotforge.server.bench import LoadSpec, bench_serve

    runs = {}
    for c in args.concurrency:
        spec = LoadSpec(
            base_url=url,
            num_prompts=max(args.num_prompts, 2 * c) if c > 1 else args.num_prompts_single,
            max_concurrency=c,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=0.15,
            ignore_eos=True,
            seed=c,
        )
        runs[c] = bench_serve(spec, [math.inf], tokenizer=tokenizer)["runs"][0]
        print(f"  concurrency {c}: {runs[c]['output_throughput']:.1f} output tokens/s", flush=True)
    return runs


def scenarios(url: str, tokenizer: Any) -> dict[str, Any]:
    """The prefix-reuse and long-prompt scenarios against one aotforge server."""
    from aotforge.server.bench import LoadSpec, Prompt, corpus, run_load

    ids = tokenizer(corpus(), add_special_tokens=False)["input_ids"]
    text = tokenizer.decode
    spec = LoadSpec(base_url=url, num_prompts=1, max_concurrency=1, output_len=8, ignore_eos=True)

    def one(prompt: str, n: int, out: int) -> Any:
        return asyncio.run(run_load(spec, [Prompt(prompt, n, out)]))[0][0]

    prefix = text(ids[1000:1256])
    first = one(prefix + text(ids[5000:5040]), 296, 8)
    second = one(prefix + text(ids[7000:7040]), 296, 8)
    # 7 streams, then one 2,000-token prompt 1 s later; the streams' ITLs while it is prefilled.
    streams = [Prompt(text(ids[i * 300 : i * 300 + 100]), 100, 160) for i in range(7)]
    long_prompt = Prompt(text(ids[20000:22000]), 2000, 8)

    async def mixed() -> list[Any]:
        many = dataclasses.replace(spec, max_concurrency=8)
        task = asyncio.create_task(run_load(many, streams))
        await asyncio.sleep(1.0)
        await run_load(many, [long_prompt])
        return (await task)[0]

    itls = [x for r in asyncio.run(mixed()) for x in r.itls_s]
    p50, p99 = statistics.median(itls), sorted(itls)[int(0.99 * (len(itls) - 1))]
    return {
        "prefix_ttft_first_s": first.ttft_s,
        "prefix_ttft_second_s": second.ttft_s,
        "prefix_ttft_ratio": second.ttft_s / first.ttft_s,
        "long_prompt_itl_p50_s": p50,
        "long_prompt_itl_p99_s": p99,
        "long_prompt_itl_p99_over_p50": p99 / p50,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--targets", default="onnxruntime,tvm", help="aotforge targets, comma-separated")
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--concurrency", default="1,8", type=lambda s: [int(c) for c in s.split(",")])
    parser.add_argument("--num-prompts", type=int, default=24, help="requests per run at concurrency > 1")
    parser.add_argument("--num-prompts-single", type=int, default=6, help="requests per run at concurrency 1")
    parser.add_argument("--input-len", type=int, default=150)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="aotforge's step budget under load")
    parser.add_argument(
        "--scenario-batched-tokens", type=int, default=16, help="aotforge's step budget in the scenarios (chunk size)"
    )
    parser.add_argument("--no-scenarios", action="store_true")
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "serve.json")
    args = parser.parse_args(argv)
    run = bench_record.start(vars(args))
    from transformers import AutoTokenizer

    model_dir = real_model.smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    args.work.mkdir(parents=True, exist_ok=True)
    tools = llama_cpp.build()
    servers: list[tuple[str, str, Any]] = []
    for precision in args.precisions.split(","):
        for target in args.targets.split(","):
            servers.append((f"aotforge {target}", precision, artifact(model_dir, target, precision, args.work)))
        servers.append(("llama.cpp", precision, llama_cpp.gguf(PRECISIONS[precision][1], tools=tools)))
    engine_flags = ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    results: dict[str, Any] = {"runs": [], "scenarios": {}}
    for round_ in range(args.rounds):
        order = servers if round_ % 2 == 0 else servers[::-1]
        for name, precision, path in order:
            print(f"round {round_ + 1}: {name} {precision}", flush=True)
            log = args.work / f"{name.replace(' ', '-')}-{precision}.log"
            if name == "llama.cpp":
                server = llama_cpp.llama_server(path, parallel=SLOTS, ctx=SLOTS * CONTEXT, log=log)
            else:
                server = aotforge_server(path, log, engine_flags)
            with server as url:
                for c, summary in load_runs(url, args, tokenizer).items():
                    results["runs"].append({"server": name, "precision": precision, "concurrency": c, **summary})
            if name != "llama.cpp" and not args.no_scenarios and round_ == 0:
                chunked = ["--max-num-batched-tokens", str(args.scenario_batched_tokens)]
                with aotforge_server(path, log, chunked) as url:
                    results["scenarios"][f"{name} {precision}"] = scenarios(url, tokenizer)
    bench_record.write(args.json, "serve", run, tables(results, args), results)


def tables(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    figure = bench_record.figure
    rows = []
    keys = sorted({(r["precision"], r["concurrency"], r["server"]) for r in results["runs"]})
    for precision, c, server in keys:
        mine = [r for r in results["runs"] if (r["precision"], r["concurrency"], r["server"]) == (precision, c, server)]
        base = [
            r for r in results["runs"] if (r["precision"], r["concurrency"], r["server"]) == (precision, c, "llama.cpp")
        ]
        ratio = [m["output_throughput"] / b["output_throughput"] for m, b in zip(mine, base, strict=False)]
        rows.append(
            [
                server,
                precision,
                c,
                figure([r["output_throughput"] for r in mine], 1),
                figure(ratio, 2) if server != "llama.cpp" else None,
                figure([r["median_ttft_ms"] for r in mine], 1),
                figure([r["p99_ttft_ms"] for r in mine], 1),
                figure([r["median_itl_ms"] for r in mine], 2),
                figure([r["p99_itl_ms"] for r in mine], 2),
                sum(r["failed"] for r in mine),
            ]
        )
    columns = ["server", "precision", "concurrency", "output tokens/s", "x llama.cpp", "TTFT p50 ms", "TTFT p99 ms"]
    columns += ["ITL p50 ms", "ITL p99 ms", "failed"]
    note = (
        f"SmolLM2-135M-Instruct; prompts of ~{args.input_len} tokens of real English (±15%), {args.output_len} "
        "output tokens (ignore_eos), clients sending back to back; each server alone, 2 threads, "
        f"{SLOTS} slots; medians over {args.rounds} alternating rounds."
    )
    out = [bench_record.table("Serving: aotforge vs llama-server", columns, rows, note)]
    scen = [
        [
            name,
            figure([s["prefix_ttft_ratio"]], 3),
            figure([s["long_prompt_itl_p50_s"] * 1000], 2),
            figure([s["long_prompt_itl_p99_s"] * 1000], 2),
            figure([s["long_prompt_itl_p99_over_p50"]], 2),
        ]
        for name, s in sorted(results["scenarios"].items())
    ]
    if scen:
        cols = ["server", "TTFT shared 256-token prefix / first", "ITL p50 ms", "ITL p99 ms", "ITL p99 / p50"]
        note = (
            "ITL: 7 running streams while one 2,000-token prompt is prefilled in chunks "
            f"(--max-num-batched-tokens {args.scenario_batched_tokens})."
        )
        out.append(bench_record.table("Serving scenarios: prefix reuse and chunked prefill", cols, scen, note))
    return out


if __name__ == "__main__":
    main()
