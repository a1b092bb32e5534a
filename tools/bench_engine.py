"""What the runtime's engine costs a lone stream: TTFT and ITL at concurrency 1, engine paths vs the step engine.

On the SmolLM2-135M artifacts of ``make bench-serve`` (``~/.cache/aotforge/bench-serve/artifacts-paged``:
onnxruntime and tvm, fp32), prompts of real English (``--prompt-len`` tokens, a new window each run), ``--new``
tokens greedy, timed three ways, each in a child process of this same script, the ways alternating round by round:

- ``step engine``: the artifact's own decoding loop over its per-call step engine (what ``generate()`` ran
  before it moved onto the runtime; speculative decoding still runs there);
- ``generate()``: ``aotforge.load(path).stream()``, now a client of the runtime's ``LLMEngine``;
- ``served engine``: the ``AsyncEngine`` ``aotforge serve`` runs (the step loop on its thread, the tokens handed
  to an asyncio consumer), at the server's default ``--max-num-seqs`` (the artifact's max_batch).

TTFT: from the call to the first token; ITL: the median gap between tokens. Each child warms up with one run and
reports the medians of ``--runs`` runs; each figure is the median over rounds, and the ratios to the step engine
are taken within each round. Writes ``docs/bench/engine.json`` (``tools/bench_record.py``).

    python tools/bench_engine.py [--targets onnxruntime,tvm] [--rounds 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import bench_record, bench_serve  # noqa: E402
from tools.bench_children import PREFIX, run_child  # noqa: E402

ARTIFACTS = bench_serve.WORK / bench_serve.ARTIFACTS  # the very artifacts make bench-serve serves
WAYS = ("step engine", "generate()", "served engine")


def artifact(target: str, precision: str = "fp32") -> Path:
    found = sorted((ARTIFACTS / f"{target}-{precision}").glob("*/*/*/manifest.json"))
    if not found:
        raise SystemExit(f"no {target}-{precision} artifact under {ARTIFACTS}: make bench-serve builds it")
    return found[-1].parent


def prompts(path: Path, n: int, count: int) -> list[list[int]]:
    """``count`` prompts of ``n`` tokens, consecutive windows of the corpus: no run repeats another's prompt (the
    served engine would reuse its cached prefix)."""
    from transformers import AutoTokenizer

    from aotforge.server.bench import corpus

    text = corpus()[: 40 * n * count]  # enough characters for the tokens of English needed
    ids = AutoTokenizer.from_pretrained(str(path))(text, add_special_tokens=False)["input_ids"]
    return [list(ids[i * n : (i + 1) * n]) for i in range(count)]


# -- a child: one way, one artifact ----------------------------------------------------------------------------


def marks_step_engine(loaded: Any, ids: list[int], new: int) -> list[float]:
    import numpy as np

    start = time.perf_counter()
    return [time.perf_counter() - start for _ in loaded._generative().stream(np.array([ids]), new)]


def marks_generate(loaded: Any, ids: list[int], new: int) -> list[float]:
    import numpy as np

    start = time.perf_counter()
    return [time.perf_counter() - start for _ in loaded.stream(np.array([ids]), new, ignore_eos=True)]


def served_engine(path: Path) -> Any:
    from aotforge.artifacts.engine_loader import load_async_engine

    engine = load_async_engine(path)
    engine.start()
    return engine


def marks_served(engine: Any, ids: list[int], new: int) -> list[float]:
    from aotforge.runtime.params import SamplingParams

    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)

    async def run() -> list[float]:
        start = time.perf_counter()
        return [time.perf_counter() - start async for out in engine.generate(None, ids, params) for _ in out.token_ids]

    return asyncio.run(run())


def child(way: str, path: Path, prompt_len: int, new: int, runs: int) -> dict[str, Any]:
    from aotforge.artifacts.loader import load

    windows = prompts(path, prompt_len, runs + 1)
    if way == "served engine":
        engine = served_engine(path)
        timed = lambda ids: marks_served(engine, ids, new)  # noqa: E731
    else:
        loaded = load(path)
        fn = marks_step_engine if way == "step engine" else marks_generate
        timed = lambda ids: fn(loaded, ids, new)  # noqa: E731
    timed(windows[0])  # warm-up: first runs plan shapes and page in the weights
    results = [timed(ids) for ids in windows[1:]]
    assert all(len(m) == new for m in results), [len(m) for m in results]
    return {
        "ttft_ms": statistics.median(m[0] * 1e3 for m in results),
        "itl_ms": statistics.median(statistics.median(_gaps(m)) * 1e3 for m in results),
    }


def _gaps(marks: list[float]) -> Iterator[float]:
    return (b - a for a, b in zip(marks, marks[1:], strict=False))


# -- a child: the Python each path adds per token, on a runner that computes nothing ---------------------------


def glue(path: Path, new: int, runs: int) -> dict[str, Any]:
    """CPU microseconds per token of each path's own code (sampling included) around a runner whose steps return
    fixed logits at once: what the engine adds, measured in CPU time, which the machine's load moves little."""
    import numpy as np

    from aotforge.artifacts.engine_loader import load_tokenizer
    from aotforge.core.decoder import DecoderSpec
    from aotforge.runtime import offline
    from aotforge.runtime.async_engine import AsyncEngine
    from aotforge.runtime.engine import LLMEngine
    from aotforge.runtime.params import EngineConfig, SamplingParams
    from aotforge.targets.generative.decoding import stream_tokens
    from aotforge.targets.generative.runner import GenerativeRunner

    spec = DecoderSpec.from_dict(json.loads((path / "manifest.json").read_text())["target"]["info"]["decoder"])
    logits = np.random.default_rng(0).standard_normal((spec.max_batch, spec.vocab)).astype(np.float32)

    class Runner:  # runtime.runner.ModelRunner
        def __init__(self, max_rows: int) -> None:
            self.spec, self.max_rows, self.can_extend = spec, max_rows, False

        def allocate(self, num_blocks: int, block_size: int) -> None:
            pass

        def kv_cache_bytes(self) -> int:
            return 0

        def decode_rows(self, rows: int) -> int:
            return rows

        def prefill(self, token_ids: Any, block_table: Any) -> Any:
            return logits[0]

        def decode(self, token_ids: Any, positions: Any, block_tables: Any) -> Any:
            return logits[: len(token_ids)]

    class StepEngine:  # targets.generative.decoding.StepEngine, with the model runner of the CPU targets
        def __init__(self) -> None:
            self.spec = spec

        def start(self, batch: int, prompt_len: int) -> None:
            pass

        def prefill(self, input_ids: Any, attention_mask: Any, position_ids: Any) -> Any:
            return logits[: len(input_ids)]

        def decode(self, input_ids: Any, write_pos: Any) -> Any:
            return logits[: len(input_ids)]

        def model_runner(self, max_rows: int) -> Runner:
            return Runner(max_rows)

    model = GenerativeRunner(StepEngine())
    ids = np.array(prompts(path, 128, 1))
    served = AsyncEngine(LLMEngine(Runner(spec.max_batch), EngineConfig(), load_tokenizer(path)), "glue")
    served.start()
    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)

    async def serve_one() -> None:
        async for _ in served.generate(None, ids[0].tolist(), params):
            pass

    ways = {
        "step engine": lambda: list(stream_tokens(model.engine, ids, new)),
        "generate()": lambda: list(offline.stream(model, ids, new)),
        "served engine": lambda: asyncio.run(serve_one()),  # both threads' CPU: the step loop and the consumer
    }
    out = {}
    for way, fn in ways.items():
        fn()
        started = time.process_time()
        for _ in range(runs):
            fn()
        out[way] = (time.process_time() - started) / runs / new * 1e6
    asyncio.run(served.shutdown(1.0))
    return out


# -- the parent ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", default="onnxruntime,tvm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="timed runs per child, after one warm-up")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "engine.json")
    parser.add_argument("--child", nargs=2, metavar=("WAY", "ARTIFACT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        way, path = args.child
        if way == "glue":
            got = glue(Path(path), args.new, 20 * args.runs)
        else:
            got = child(way, Path(path), args.prompt_len, args.new, args.runs)
        print(PREFIX + json.dumps(got), flush=True)
        return
    run = bench_record.start(vars(args))
    results: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for target in args.targets.split(","):
            path = artifact(target)
            ways = WAYS if round_ % 2 == 0 else WAYS[::-1]
            for way in (*ways, "glue"):
                cmd = [sys.executable, __file__, "--child", way, str(path), "--runs", str(args.runs)]
                cmd += ["--prompt-len", str(args.prompt_len), "--new", str(args.new)]
                got = run_child(cmd)
                print(f"round {round_ + 1} {target} {way}: {got}", flush=True)
                results.append({"round": round_, "target": target, "way": way, **got})
    bench_record.write(args.json, "engine", run, tables(results, args), results)


def tables(results: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    figure = bench_record.figure
    rows = []
    for target in args.targets.split(","):
        base = {r["round"]: r for r in results if r["target"] == target and r["way"] == WAYS[0] and "error" not in r}
        for way in WAYS:
            mine = [r for r in results if r["target"] == target and r["way"] == way and "error" not in r]
            ratio = {
                key: figure([r[key] / base[r["round"]][key] for r in mine if r["round"] in base], 3)
                for key in ("ttft_ms", "itl_ms")
            }
            rows.append(
                [
                    f"{target} fp32",
                    way,
                    figure([r["ttft_ms"] for r in mine], 1),
                    ratio["ttft_ms"] if way != WAYS[0] else None,
                    figure([r["itl_ms"] for r in mine], 2),
                    ratio["itl_ms"] if way != WAYS[0] else None,
                ]
            )
    columns = ["artifact", "path", "TTFT ms", "x step engine", "ITL ms", "x step engine"]
    note = (
        f"SmolLM2-135M-Instruct, one stream: a {args.prompt_len}-token prompt of real English, {args.new} new tokens "
        f"greedy; each path in a process of its own, 2 threads; medians of {args.runs} runs per process and over "
        f"{args.rounds} alternating rounds (ratios taken within each round)."
    )
    glue_rows = []
    for target in args.targets.split(","):
        mine = [r for r in results if r["target"] == target and r["way"] == "glue" and "error" not in r]
        glue_rows.append([f"{target} fp32", *(figure([r[w] for r in mine], 1) for w in WAYS)])
    glue_note = (
        "CPU microseconds per token of each path's own code (scheduling, sampling, bookkeeping; the served engine: "
        "its step thread and its asyncio consumer, detokenization included) around a stand-in runner whose steps "
        "return fixed logits at once; CPU time, which the machine's load moves little."
    )
    return [
        bench_record.table("Engine overhead on a lone stream", columns, rows, note),
        bench_record.table("Python per token around the runner", ["artifact", *WAYS], glue_rows, glue_note),
    ]


if __name__ == "__main__":
    main()
