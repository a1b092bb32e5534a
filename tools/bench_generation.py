"""Decoder benchmark: aotforge text-generation artifacts vs transformers eager vs ONNX Runtime GenAI, fp32.

On a SmolLM-135M-shaped Llama (random weights, built offline from its config), prompt 128, 64 new
tokens greedy, 2 threads. Each runtime runs in its own process, and the runtimes alternate for
--rounds rounds (each figure is the median over rounds: ratios are what counts on a shared
machine; the ratios to GenAI are also given round by round). Per runtime (decode_timing.py): TTFT
(the median of 5 one-token calls), ITL p50/p90/p99 and tokens/s at batch 1, tokens/s at batch
--max-batch, and the process CPU time per decoded token at batch 1 (a figure that load moves
less than wall time). The bandwidth floor (bandwidth_floor.py): weight bytes / the read bandwidth
of THREADS threads summing their halves of a 512 MiB array. The load average is printed before and
after.

aotforge artifacts are built once per target (--targets onnxruntime,tvm) and reused from --work.
ONNX Runtime GenAI (genai_runner.py) is installed only into this bench's own venv (--genai-venv,
created on first use; it borrows the dev venv's packages through a .pth line), never as a
dependency of aotforge. Its model builder converts the same directory offline; it wants a
tokenizer beside the weights, so a word-level stand-in is saved there.

    python tools/bench_generation.py --work /tmp/gen-bench [--layers 30] [--targets onnxruntime,tvm] [--rounds 3]

Speculative decoding has a bench of its own: ``tools/bench_speculative.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import bench_record  # tools/, beside this script
import numpy as np
from bandwidth_floor import floor_ms, read_bandwidth_gbs  # tools/, beside this script
from bench_children import PREFIX, median_of, run_child, text_generation_artifact
from decode_timing import measure
from genai_runner import genai_python, run_genai

THREADS = 2
SMOLLM = {  # HuggingFaceTB/SmolLM-135M's config.json shape
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}


def prepare(work: Path, layers: int, shape: Mapping[str, Any] = SMOLLM, name: str = "smollm-shaped") -> Path:
    """The model directory (config + safetensors + a word-level tokenizer stand-in) of ``shape``."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    model_dir = work / f"{name}-{layers}"
    if (model_dir / "config.json").is_file():
        return model_dir
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**shape, num_hidden_layers=layers, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(model_dir)
    vocab = {f"w{i}": i for i in range(SMOLLM["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w0").save_pretrained(model_dir)
    return model_dir


def prompt_ids(n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(0).integers(1, SMOLLM["vocab_size"], size=n)]


def run_transformers(model_dir: Path, prompt: int, new: int, batch: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()

    def once(rows: int, n: int) -> list[float]:
        ids = torch.tensor([prompt_ids(prompt)] * rows)
        marks, start = [], time.perf_counter()
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True)
            marks.append(time.perf_counter() - start)
            cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(n - 1):
                out = model(input_ids=token, cache=cache, use_cache=True)
                cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
                marks.append(time.perf_counter() - start)
        return marks

    return measure(once, new, batch)


#: ``--precisions``: the weight-only pass's parameters per precision (the same recipe on every target; text-generation
#: builds default to int8 activations, ``accuracy_level`` 4, on both).
WEIGHT_ONLY = {"int4": {"bits": 4, "block_size": 32}, "int8": {"bits": 8, "block_size": 32}}


def build_aotforge(
    model_dir: Path, work: Path, target: str, prompt: int, new: int, max_batch: int, precision: str = "fp32"
) -> str:
    """The artifact for ``target`` at ``precision`` (built once: later runs and rounds load it)."""
    name = f"{model_dir.name}-{prompt + new}-{max_batch}" + ("" if precision == "fp32" else f"-{precision}")
    quant: dict[str, Any] = {}
    if precision != "fp32":  # the build records its quality (validation.quality); it does not gate the bench's build
        quant = {"passes": ["weight-only"], "pass_params": {"weight-only": WEIGHT_ONLY[precision]}}
        quant |= {"max_perplexity_increase": 10.0}
    return text_generation_artifact(
        model_dir,
        work / "artifacts",
        name,
        target,
        max_seq_len=prompt + new,
        max_batch=max_batch,
        target_options={"intra_op_threads": THREADS} if target == "onnxruntime" else {},
        **quant,
    )


def run_aotforge(artifact_path: Path, prompt: int, new: int, batch: int) -> dict[str, Any]:
    import aotforge

    artifact = aotforge.load(artifact_path)

    def once(rows: int, n: int) -> list[float]:
        marks, start = [], time.perf_counter()
        for _ in artifact.stream(np.array([prompt_ids(prompt)] * rows), n, ignore_eos=True):
            marks.append(time.perf_counter() - start)
        return marks

    return {**measure(once, new, batch), "validation": artifact.manifest.validation.get("token_agreement")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-gen-bench"))
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--targets", default="onnxruntime,tvm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--precisions",
        default="fp32",
        help="fp32,int4,int8: aotforge builds each with --passes weight-only (int4 g32 / int8); "
        "ONNX Runtime GenAI runs fp32 and int4 (its builder's -p)",
    )
    parser.add_argument("--no-transformers", action="store_true", help="leave transformers eager out")
    parser.add_argument("--genai-venv", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "generation.json", help="the page's file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: run one runtime, print JSON
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = prepare(args.work, args.layers)
    if args.one:
        print(PREFIX + json.dumps(_child(args, model_dir)))
        return
    run = bench_record.start({k: v for k, v in vars(args).items() if k != "one"} | {"threads": THREADS})
    venv = args.genai_venv or args.work / "genai-venv"
    precisions = [p for p in args.precisions.split(",") if p]
    runtimes: list[tuple[str, Path]] = [] if args.no_transformers else [("transformers", Path(sys.executable))]
    genai = genai_python(venv)
    runtimes += [("genai" if p == "fp32" else f"genai:{p}", genai) for p in precisions if p in ("fp32", "int4")]
    for target in filter(None, args.targets.split(",")):
        for precision in precisions:
            built = _run(args, f"build:{target}:{precision}", Path(sys.executable))
            if "path" in built:
                runtimes.append((f"aotforge:{built['path']}", Path(sys.executable)))
            else:
                print(f"aotforge {target} {precision}: not built: {built}", file=sys.stderr)
    results: dict[str, Any] = {"load_before": os.getloadavg(), "threads": THREADS}
    results["read_bandwidth_gbs"] = round(read_bandwidth_gbs(THREADS), 2)
    rounds: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):  # alternating: each round runs every runtime once
        for kind, python in runtimes:
            rounds.setdefault(_label(kind), []).append(_run(args, kind, python))
    results["load_after"] = os.getloadavg()
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    results["weight_bytes"] = weights
    results["floor_itl_ms"] = floor_ms(weights, results["read_bandwidth_gbs"])
    results["runtimes"] = {label: median_of(runs, 3) for label, runs in rounds.items()}
    results["per_round_ratios"] = _per_round_ratios(rounds)
    print(json.dumps(results, indent=2))
    print(_table(results, args.max_batch))
    bench_record.write(
        args.json, "generation", run, page_tables(results, rounds, args.max_batch), results | {"rounds": rounds}
    )


def page_tables(results: dict[str, Any], rounds: dict[str, list[dict[str, Any]]], batch: int) -> list[dict[str, Any]]:
    """docs/benchmarks.md's tables: each runtime's figures over the rounds, its ratios to GenAI round by round, and
    the bandwidth floor they are read against."""
    floor = results["floor_itl_ms"]
    fields = ("ttft_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "tokens_per_s", f"tokens_per_s_batch{batch}")
    rows: list[list[bench_record.Cell]] = []
    for label, runs in rounds.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            rows.append([label, f"failed: {' '.join(runs[-1]['error'])[:160]}"] + [None] * (len(fields) + 1))
            continue
        cells = [bench_record.figure([r[f] for r in ok]) for f in (*fields, "cpu_ms_per_token")]
        rows.append([label, *cells, bench_record.figure([r["itl_p50_ms"] / floor for r in ok])])
    head = (
        "runtime",
        "TTFT ms",
        "ITL p50 ms",
        "ITL p90 ms",
        "ITL p99 ms",
        "tokens/s batch 1",
        f"tokens/s batch {batch}",
    )
    figures = bench_record.table("Each runtime", (*head, "CPU ms per token", "ITL p50 / floor"), rows)
    ratio_rows = [
        [label if " / " in label else f"{label} / genai", *(bench_record.figure(v) for v in fields_.values())]
        for label, fields_ in results.get("per_round_ratios", {}).items()
    ]
    ratios = bench_record.table(
        "Ratios to ONNX Runtime GenAI, taken within each round",
        ("runtime / GenAI", *(f"{f} ratio" for f in RATIO_FIELDS)),
        ratio_rows,
        "Each ratio divides a runtime's figure by GenAI's in the same round; an int4 row is divided by GenAI int4.",
    )
    floor_row = [[results["weight_bytes"] / 1e6, results["read_bandwidth_gbs"], results["threads"], floor]]
    floor_table = bench_record.table(
        "The bandwidth floor",
        ("weights MB", "read bandwidth GB/s", "threads", "floor ITL ms"),
        floor_row,
        "A fp32 decode step reads every weight once: no step is faster than the weights over the read bandwidth.",
    )
    return [figures, ratios, floor_table]


def _child(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    kind, _, rest = args.one.partition(":")
    if kind == "transformers":
        return run_transformers(model_dir, args.prompt, args.new, args.max_batch)
    if kind == "genai":
        ids = prompt_ids(args.prompt)
        return run_genai(model_dir, args.work, ids, args.new, args.max_batch, precision=rest or "fp32", threads=THREADS)
    if kind == "build":
        target, _, precision = rest.partition(":")
        path = build_aotforge(model_dir, args.work, target, args.prompt, args.new, args.max_batch, precision or "fp32")
        return {"path": path}
    return run_aotforge(Path(rest), args.prompt, args.new, args.max_batch)


def _label(kind: str) -> str:
    if kind.startswith("aotforge:"):  # .../<name>/<version>/<target>: name (precision) and target
        path = Path(kind)
        suffix = path.parent.parent.name.rsplit("-", 1)[-1]
        return f"aotforge {path.name} {suffix if suffix in WEIGHT_ONLY else 'fp32'}"
    return kind.replace(":", " ")


def _run(args: argparse.Namespace, kind: str, python: Path) -> dict[str, Any]:
    cmd = [str(python), __file__, "--work", str(args.work), "--layers", str(args.layers), "--one", kind]
    cmd += ["--prompt", str(args.prompt), "--new", str(args.new), "--max-batch", str(args.max_batch)]
    return run_child(cmd, env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})


#: The fields whose ratio to ONNX Runtime GenAI fp32 is taken round by round (the same round's GenAI run).
RATIO_FIELDS = ("ttft_ms", "itl_p50_ms", "cpu_ms_per_token")


def _per_round_ratios(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[float]]]:
    """Each runtime's ratio to GenAI fp32 per round: on a shared machine the load moves both runs of a round
    alike more than it moves runs minutes apart. An int4 runtime is also compared with GenAI int4 (``label / genai
    int4``), when that ran."""
    ratios: dict[str, dict[str, list[float]]] = {}
    for label, runs in rounds.items():
        for peer in {"genai", _genai_peer(label, rounds)} - {label}:
            pairs = [(r, g) for r, g in zip(runs, rounds.get(peer, []), strict=False) if "error" not in {**r, **g}]
            if pairs and not label.startswith("genai"):
                key = label if peer == "genai" else f"{label} / {peer}"
                ratios[key] = {f: [round(r[f] / g[f], 3) for r, g in pairs] for f in RATIO_FIELDS}
    return ratios


def _genai_peer(label: str, runtimes: Mapping[str, Any]) -> str:
    """The GenAI runtime of ``label``'s precision (int4), or GenAI fp32."""
    return "genai int4" if label.endswith(" int4") and "genai int4" in runtimes else "genai"


def _load(avg: Any) -> str:
    return " / ".join(f"{x:.1f}" for x in avg)


def _table(results: dict[str, Any], batch: int) -> str:
    """Markdown: each runtime's figures and its ratios to ONNX Runtime GenAI and to the floor."""
    floor = results["floor_itl_ms"]
    head = (
        f"| runtime | TTFT ms | ITL p50 | p90 | p99 | tok/s b1 | tok/s b{batch} | b{batch}/b1 | CPU ms/token "
        "| ITL / GenAI | ITL / floor | TTFT / GenAI |  (GenAI: GenAI int4 for an int4 row)"
    )
    rows = [head, "|" + "---|" * 12]
    for label, r in results["runtimes"].items():
        if "error" in r:
            rows.append(f"| {label} | error: {' '.join(r['error'])[:200]} |")
            continue
        wide = r.get(f"tokens_per_s_batch{batch}", float("nan"))
        genai = results["runtimes"].get(_genai_peer(label, results["runtimes"]), {})
        itl_ratio = r["itl_p50_ms"] / genai["itl_p50_ms"] if "itl_p50_ms" in genai else float("nan")
        ttft_ratio = r["ttft_ms"] / genai["ttft_ms"] if "ttft_ms" in genai else float("nan")
        rows.append(
            f"| {label} | {r['ttft_ms']:.1f} | {r['itl_p50_ms']:.1f} | {r['itl_p90_ms']:.1f} | {r['itl_p99_ms']:.1f} "
            f"| {r['tokens_per_s']:.1f} | {wide:.1f} | {wide / r['tokens_per_s']:.2f}x | {r['cpu_ms_per_token']:.1f} "
            f"| {itl_ratio:.2f}x | {r['itl_p50_ms'] / floor:.2f}x | {ttft_ratio:.2f}x |"
        )
    for label, fields in results.get("per_round_ratios", {}).items():
        text = ", ".join(f"{f} {np.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})" for f, v in fields.items())
        rows.append(f"{label if ' / ' in label else label + ' / genai'} per round (median, range): {text}")
    rows.append(
        f"floor: {results['weight_bytes'] / 1e6:.0f} MB of weights / {results['read_bandwidth_gbs']} GB/s "
        f"({results['threads']} threads) = {floor} ms; load average {_load(results['load_before'])} before, "
        f"{_load(results['load_after'])} after"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
