"""Render docs/benchmarks.md from the benches' result files, docs/bench/<bench>.json (``make bench-page``).

Nothing on the page is typed by hand: every number comes from a file a bench wrote (``tools/bench_record.py``),
with the run it came from. A bench that has not written its file yet gets a section that says so and how to run it.

    python tools/bench_page.py [--bench-dir docs/bench] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import jinja2

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
TEMPLATE = "bench_page.md.j2"


@dataclasses.dataclass(frozen=True)
class Bench:
    """A section of the page: the bench's result file (``<name>.json``), its title, how to run it, what it times."""

    name: str
    title: str
    make: str
    about: str


#: The page's sections, in order.
BENCHES = (
    Bench(
        "models",
        "Encoder and vision models",
        "make bench-models",
        "tools/bench.py builds each model for every runtime (ONNX Runtime fp32 / int8, tvm with and without "
        "aotforge's schedule rules, int8, bf16; torch eager and torch.compile as references), then times each "
        "runtime in a process of its own, the runtimes alternating round by round, all on the inputs the ONNX "
        "Runtime fp32 artifact validated with. A ratio is taken within each round, then its median over the rounds.",
    ),
    Bench(
        "generation",
        "Text generation",
        "make bench-generation",
        "tools/bench_generation.py builds a SmolLM-135M-shaped Llama (random weights) as aotforge onnxruntime and "
        "tvm artifacts and times them beside transformers eager and ONNX Runtime GenAI, each in its own process, "
        "alternating round by round: time to first token, inter-token latency, tokens/s at batch 1 and at the "
        "largest batch, CPU time per token, and the bandwidth floor a decode step cannot beat.",
    ),
    Bench(
        "speculative",
        "Speculative decoding",
        "make bench-speculative",
        "tools/bench_speculative.py times target-only greedy decoding against speculative decoding with each "
        "number of draft tokens k, on the trained byte-level target / draft pair of tests/lm_pair.py, batch 1, "
        "each run in its own process, alternating: decode-phase tokens/s and CPU time per token, the speed-ups "
        "(medians of each round's own ratio), end to end, and the acceptance rate.",
    ),
    Bench(
        "draft",
        "A distilled draft for a real model",
        "make bench-draft",
        "tools/bench_draft.py distills SmolLM2-135M-Instruct into a draft (aotforge distill: a few of its layers, "
        "its vocabulary cut to the tokens most frequent in the training text, trained on the fp32 model's logits "
        "over stdlib docstrings for a CPU-time budget) and times it as tools/bench_speculative.py does: the fp32 "
        "target alone against speculative decoding with each k, greedy, batch 1, prompts of held-out English.",
    ),
    Bench(
        "feature-draft",
        "A feature draft for a real model",
        "make bench-draft ARGS='--kind feature --targets tvm,onnxruntime --ks 2,3 --rounds 5'",
        "tools/bench_draft.py --kind feature makes a feature draft of SmolLM2-135M-Instruct (aotforge distill-draft: "
        "an attention-free head over the target's own last hidden state, no cache, a few small matmuls a proposal "
        "run in int8 on one ONNX Runtime thread, "
        "trained on the fp32 model's features over its greedy continuations and stdlib text, by default for the same "
        "CPU-time budget; --draft DIR times a given one; what the timed draft's training cost, and its own report, "
        "are in the table below) and times it as tools/bench_speculative.py does: the fp32 target (its verify graph "
        "returning the hidden state) alone against speculative decoding with each k, greedy, batch 1, prompts of "
        "held-out English. The onnxruntime target runs on one intra-op thread, alone and under speculation alike "
        "(the draft's step takes the other core: its CPU time is in the CPU columns); tvm on its default threads.",
    ),
    Bench(
        "serve",
        "Serving",
        "make bench-serve",
        "tools/bench_serve.py serves SmolLM2-135M-Instruct (the real model, tools/real_model.py) with aotforge serve "
        "(onnxruntime and tvm artifacts, fp32 and int4) and with llama.cpp's llama-server (F32 and Q4_0 of the same "
        "weights), each server alone on the machine, alternating round by round, and loads each with the same "
        "aotforge bench serve client (streaming /v1/completions, real English prompts, ignore_eos) at each "
        "concurrency; then, on aotforge's servers, a prompt sharing a 256-token prefix with an earlier one and a "
        "2,000-token prompt arriving among 7 running streams.",
    ),
    Bench(
        "engine",
        "Engine overhead on a lone stream",
        "python tools/bench_engine.py",
        "tools/bench_engine.py times one stream (TTFT, ITL) on the SmolLM2-135M artifacts of make bench-serve three "
        "ways, each in a process of its own, alternating round by round: the artifact's own per-call step engine, "
        "generate() on the runtime's engine, and the AsyncEngine that aotforge serve runs.",
    ),
    Bench(
        "quality",
        "Low-bit quality",
        "make bench-quality",
        "tools/bench_quality.py builds SmolLM2-135M-Instruct at int4 with each weight-only method (round to nearest, "
        "HQQ, AWQ-style scaling and clipping, GPTQ, both, and both with the layers most sensitive to 4 bits at 8) "
        "and reads the build's quality gate: perplexity and mean KL against the fp32 model on held-out text, "
        "through the artifact's own decode steps. llama.cpp's Q4_0 weights are scored on the same windows; then "
        "the decode ITL of one configuration against llama-bench on the Q4_0 GGUF, alternating processes.",
    ),
    Bench(
        "quality_tvm",
        "Low-bit quality on tvm",
        "make bench-quality ARGS='--target tvm --configs awq --json docs/bench/quality_tvm.json'",
        "The same on the tvm target, whose int4 decode kernel is the build's fastest: the default int4 method's "
        "quality gate against llama.cpp's Q4_0 on the same windows, then its decode ITL against llama-bench on the "
        "Q4_0 GGUF, alternating processes.",
    ),
    Bench(
        "qat",
        "Quantization-aware training",
        "make bench-qat",
        "tools/bench_qat.py trains SmolLM2-135M-Instruct with aotforge qat (ONNX Runtime's exact int4 rounding in the "
        "forward pass, distilled from the fp32 model's logits over stdlib docstrings, for a CPU-time budget), builds "
        "the result at int4 and compares its quality gate with the default int4 build's: held-out perplexity and "
        "mean KL against the fp32 model, and the share of the int4 perplexity gap the training recovered.",
    ),
    Bench(
        "tensor_parallel",
        "Tensor parallelism",
        "make bench-tensor-parallel",
        "tools/bench_tensor_parallel.py builds a random-weight model shaped like SmolLM2-135M but with 4 key/value "
        "heads (12 query heads of 48: SmolLM2's 3 allow only 1 or 3 ranks) as an fp32 artifact with "
        "--tensor-parallel 2 and unsharded, and times them, one thread a rank against the unsharded artifact on the "
        "host's cores, each in a process of its own, alternating round by round: inter-token latency at batch 1 "
        "(the median of a 64-token generation's intervals). Beside it: what one all-reduce costs by each way a CPU "
        "rank could run it (tools/tp_collectives.py) and the bytes each rank stores (docs/parallel.md).",
    ),
    Bench(
        "sequence_parallel",
        "Sequence parallelism",
        "make bench-tensor-parallel ARGS='--sequence-parallel --prompt 1024'",
        "tools/bench_tensor_parallel.py --sequence-parallel builds the same SmolLM2-shaped model (--layers of it) with "
        "--tensor-parallel 2 and with --tensor-parallel 2 --sequence-parallel, and times the first token of a long "
        "prompt at batch 1 with each, one thread a rank, each in a process of its own, alternating round by round; "
        "beside it the bytes a rank holds of each split-region tensor and moves through its collectives, computed "
        "from the geometry (docs/parallel.md).",
    ),
    Bench(
        "pipeline_parallel",
        "Pipeline parallelism",
        "make bench-pipeline-parallel",
        "tools/bench_pipeline_parallel.py builds SmolLM2-135M-Instruct (fp32) with --pipeline-parallel 2 at the "
        "unsharded serving artifact's geometry and serves the same requests through the serving engine with each, "
        "8 in flight, one thread a stage against the unsharded artifact on the host's cores, each in a process of "
        "its own, alternating round by round: requests/s, and the stages' bubble with a batch in flight a stage "
        "(vLLM's virtual engines) against the schedule's and the stages' imbalance (docs/parallel.md).",
    ),
    Bench(
        "pipeline_parallel_int4",
        "Pipeline parallelism at int4",
        "make bench-pipeline-parallel ARGS='--precision int4'",
        "tools/bench_pipeline_parallel.py --precision int4 builds the same stages with the weight-only int4 "
        "parameters of the unsharded int4 serving artifact and serves the same requests against that artifact: "
        "a stage streams an eighth of the fp32 bytes each time it runs a batch, so re-reading its weights once per "
        "batch in flight costs less (docs/parallel.md).",
    ),
    Bench(
        "collectives",
        "Collectives on one host and across two",
        "make bench-collectives",
        "tools/bench_collectives.py times one all-reduce of the vectors tensor parallelism sends ([batch, 576] floats, "
        "SmolLM2's hidden size) between two one-thread processes over the shared-memory segment, gloo over loopback, "
        "and gloo between two network namespaces joined by a veth pair (two stand-in hosts, plain and with the link's "
        "rate capped), each pair in processes of its own, alternating round by round; then a tensor-parallel 2 decode "
        "over each link, and the sizing model's predictions from those terms beside what was measured "
        "(docs/parallel.md, tools/parallel_model.py).",
    ),
)


def number(x: Any) -> str:
    """A figure as the page prints it: about three significant digits, no trailing noise."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    if isinstance(x, int):
        return str(x)
    size = abs(x)
    if size >= 100:
        return f"{x:.0f}"
    if size >= 10:
        return f"{x:.1f}"
    if size >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def cell(value: Any) -> str:
    """A table cell: a figure as ``median (min–max, N rounds)``, a number, text, or empty."""
    if value is None:
        return ""
    if isinstance(value, dict):
        if value.get("median") is None:
            return "-"
        n = len(value.get("rounds", []))
        if n <= 1 or value["min"] == value["max"]:
            return number(value["median"]) + (f" ({n} rounds)" if n > 1 else "")
        return f"{number(value['median'])} ({number(value['min'])}–{number(value['max'])}, {n} rounds)"
    return number(value).replace("|", "\\|").replace("\n", " ")


def sections(bench_dir: Path) -> list[dict[str, Any]]:
    """Each bench with its result file's contents, or None where it has not run."""
    found = []
    for bench in BENCHES:
        path = bench_dir / f"{bench.name}.json"
        record = json.loads(path.read_text()) if path.is_file() else None
        found.append({"bench": bench, "record": record})
    return found


def render(bench_dir: Path = ROOT / "docs" / "bench") -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TOOLS),
        keep_trailing_newline=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["cell"] = cell
    env.filters["load"] = lambda x: f"{x:.1f}"
    return env.get_template(TEMPLATE).render(sections=sections(bench_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-dir", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    args.out.write_text(render(args.bench_dir))
    print(args.out)


if __name__ == "__main__":
    main()
