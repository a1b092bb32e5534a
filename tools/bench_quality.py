"""int4 quality on a real model (issue 31): SmolLM2-135M-Instruct at fp32, aotforge int4 by method, llama.cpp Q4_0.

Every row scores the same text, the quality gate's (``compiler/generative/quality.py``: the first 2,048 tokens of
the stdlib docstrings, 4 windows of 513), against the same fp32 model in torch:

- aotforge: each configuration (``CONFIGS``: ``weight-only`` parameters over ``--precision int4``) is built in a
  process of its own with the gate recording, not judging (``--max-perplexity-increase 10``); its perplexity and
  mean KL are the manifest's ``validation.quality``, scored through the artifact's own prefill and decode steps
  (built once under ``--work``: a later run reads the artifact's manifest and goes on to the ITL rounds);
- llama.cpp Q4_0: the weights of ``SmolLM2-135M-Instruct.Q4_0.gguf`` as llama.cpp quantized them, dequantized
  by transformers' GGUF loader and scored in torch on the same windows (llama.cpp's own dot products round the
  activations to 8 bits as well; ``llama-perplexity`` is not among the binaries ``tools/llama_cpp.py`` builds).

Then the decode ITL of one configuration's artifact (``--itl-config``; batch 1, a 128-token prompt, 64 new tokens,
:data:`THREADS` threads) against ``llama-bench`` on the Q4_0 GGUF (``-d 128 -p 0 -n 64``), each in a process of
its own, alternating over ``--rounds``. Results: ``docs/bench/quality.json`` -> ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotforge.passes.quantize_weight_only import DECODER_INT4_METHOD  # noqa: E402
from tools import bench_record, llama_cpp  # noqa: E402
from tools.bench_children import PREFIX, built_artifact, run_child  # noqa: E402
from tools.real_model import smollm2_dir  # noqa: E402

THREADS = 2
#: The configurations: a name and its ``--pass-opt`` values over ``--precision int4`` (head at 8 bits, block 32);
#: ``mixed-4``: the 4 layers most sensitive to 4 bits kept at 8. Every one names its method: the build's default
#: is one of them (``DECODER_INT4_METHOD``).
CONFIGS: dict[str, list[str]] = {
    "rtn": ["weight-only.method=rtn"],
    "hqq": ["weight-only.method=hqq"],
    "awq": ["weight-only.method=awq"],
    "gptq": ["weight-only.method=gptq"],
    "awq+gptq": ["weight-only.method=awq+gptq"],
    "awq+gptq mixed-4": ["weight-only.method=awq+gptq", "weight-only.sensitive_layers_8bit=4"],
    "awq mixed-4": ["weight-only.method=awq", "weight-only.sensitive_layers_8bit=4"],
}
PROMPT, NEW = 128, 64


def build(model_dir: Path, work: Path, target: str, config: str) -> dict[str, Any]:
    """Build ``config`` (the quality gate records its figures) and return them with the artifact's path; an artifact
    of the same name built before under ``work`` is read instead (a bench builds each once)."""
    name = "smollm2-" + "".join(c if c.isalnum() else "-" for c in config)
    path = built_artifact(work / target, name, target)
    if path is not None:
        return artifact_figures(Path(path))
    import aotforge

    started = time.perf_counter()
    result = aotforge.build(
        model_dir,
        target=target,
        task="text-generation",
        out=work / target,
        name=name,
        precision="int4",
        pass_opt=CONFIGS[config],
        max_seq_len=512,
        max_batch=4,
        bench=False,
        plots=False,
        max_perplexity_increase=10.0,
        target_options={"intra_op_threads": THREADS} if target == "onnxruntime" else {},
    )
    return artifact_figures(Path(result.path)) | {"build_s": round(time.perf_counter() - started, 1)}


def artifact_figures(artifact: Path) -> dict[str, Any]:
    """An int4 artifact's quality-gate figures, its decode graph's weight size and its calibration (the method, or
    why it was skipped)."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    passes = manifest["passes"]
    decode = [e for e in passes if e.get("graph") == "decode" and e["name"] == "weight-only"]
    calibration = [e["stats"] for e in passes if e["name"] == "calibrate-int4"]
    return {
        "path": str(artifact),
        "quality": manifest["validation"]["quality"],
        "weight_mb": decode[0]["stats"].get("weight_mb_after") if decode else None,
        "method": calibration[0].get("method") if calibration else None,
        "calibration_skipped": calibration[0].get("skipped") if calibration else None,
    }


def gguf_quality(model_dir: Path, gguf: Path) -> dict[str, Any]:
    """Perplexity and mean KL of the GGUF's (dequantized) weights against the fp32 model, on the gate's windows."""
    import torch
    from transformers import AutoModelForCausalLM

    from aotforge.compiler.generative.quality import MAX_WINDOW, eval_tokens

    tokens, _ = eval_tokens(None, model_dir, 49152)
    fp32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    quant = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    nll_ref = nll_q = kl = 0.0
    scored = 0
    with torch.inference_mode():
        for start in range(0, len(tokens) - 1, MAX_WINDOW):
            ids = torch.from_numpy(tokens[start : start + MAX_WINDOW])[None]
            p = torch.log_softmax(fp32(input_ids=ids).logits.double(), -1)[0, :-1]
            q = torch.log_softmax(quant(input_ids=ids).logits.double(), -1)[0, :-1]
            target = ids[0, 1:, None]
            nll_ref -= float(p.gather(1, target).sum())
            nll_q -= float(q.gather(1, target).sum())
            kl += float((p.exp() * (p - q)).sum())
            scored += ids.shape[1] - 1
    ref, got = math.exp(nll_ref / scored), math.exp(nll_q / scored)
    return {
        "reference_perplexity": round(ref, 6),
        "perplexity": round(got, 6),
        "perplexity_increase": round(got / ref - 1, 6),
        "mean_kl": round(kl / scored, 6),
        "scored_tokens": scored,
    }


def artifact_itl(path: Path) -> dict[str, Any]:
    """Batch-1 decode of the artifact, as ``tools/bench_generation.py`` times every runtime."""
    from tools.bench_generation import run_aotforge

    return run_aotforge(path, PROMPT, NEW, 1)


def llama_bench_itl(gguf: Path) -> dict[str, Any]:
    """``llama-bench``'s token generation after a 128-token context: its mean tokens/s as ms per token."""
    tools = llama_cpp.build()
    cmd = [str(tools.bench), "-m", str(gguf), "-t", str(THREADS), "-d", str(PROMPT), "-p", "0", "-n", str(NEW)]
    done = subprocess.run([*cmd, "-o", "json"], capture_output=True, text=True, check=True)
    (row,) = json.loads(done.stdout)
    return {"itl_ms": round(1000.0 / float(row["avg_ts"]), 3), "tokens_per_s": round(float(row["avg_ts"]), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-quality-bench"))
    parser.add_argument("--target", default="onnxruntime")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="names of CONFIGS, comma-separated")
    parser.add_argument(
        "--itl-config",
        default=DECODER_INT4_METHOD,
        help="the configuration whose decode ITL is timed (built if not in --configs)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=bench_record.BENCH_DIR / "quality.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: build / score / time one thing, print JSON
    args = parser.parse_args()
    configs = config_names(args.configs, args.itl_config)
    model_dir = smollm2_dir()
    gguf = llama_cpp.gguf("Q4_0")
    if args.one:
        kind, _, rest = args.one.partition(":")
        out = {
            "build": lambda: build(model_dir, args.work, args.target, rest),
            "gguf": lambda: gguf_quality(model_dir, gguf),
            "aotforge": lambda: artifact_itl(Path(rest)),
            "llama": lambda: llama_bench_itl(gguf),
        }[kind]()
        print(PREFIX + json.dumps(out))
        return
    run = bench_record.start(vars(args) | {"threads": THREADS, "model": str(model_dir), "gguf": str(gguf)})
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}

    def child(what: str) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--work", str(args.work), "--target", args.target, "--one", what]
        return run_child(cmd, env=env)

    built = {c: child(f"build:{c}") for c in configs}
    q4_0 = child("gguf:")
    itl: dict[str, list[float]] = {"aotforge": [], "llama.cpp Q4_0": []}
    timed = built[args.itl_config]
    for _ in range(args.rounds if "path" in timed else 0):  # alternating: each round runs both once
        itl["aotforge"].append(child(f"aotforge:{timed['path']}").get("itl_p50_ms"))
        itl["llama.cpp Q4_0"].append(child("llama:").get("itl_ms"))
    results = {"configs": built, "llama.cpp Q4_0": q4_0, "itl_ms": itl, "target": args.target}
    if "path" not in timed:
        results["itl_not_timed"] = f"{args.itl_config} did not build: {timed}"
    print(json.dumps(results, indent=2))
    bench_record.write(args.json, "quality", run, tables(results, args), results)


def config_names(value: str, itl_config: str) -> list[str]:
    """The configurations ``--configs`` names (stripped), then ``--itl-config`` if it is not among them; an unknown
    name stops the run before anything is built."""
    names = [c.strip() for c in value.split(",") if c.strip()]
    unknown = [c for c in [*names, itl_config] if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration {', '.join(map(repr, unknown))}: choose from {', '.join(CONFIGS)}")
    return names + ([itl_config] if itl_config not in names else [])


def tables(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[list[bench_record.Cell]] = []
    q4 = results["llama.cpp Q4_0"]
    if "perplexity" in q4:
        rows.append(["fp32 (transformers)", q4["reference_perplexity"], "-", "-", "-"])
    for name, got in results["configs"].items():
        q = got.get("quality")
        if q is None:
            rows.append([f"aotforge {args.target} int4 {name}", f"not built: {got}", None, None, None])
            continue
        rows.append(
            [
                f"aotforge {args.target} int4 {name}",
                q["perplexity"],
                f"{q['perplexity_increase']:+.1%}",
                q["mean_kl"],
                got.get("weight_mb"),
            ]
        )
    if "perplexity" in q4:
        increase = f"{q4['perplexity_increase']:+.1%}"
        rows.append(["llama.cpp Q4_0 (its weights, scored in torch)", q4["perplexity"], increase, q4["mean_kl"], None])
    quality = bench_record.table(
        "int4 quality on SmolLM2-135M-Instruct (held-out stdlib docstrings, 2,044 tokens, 4 windows of 513)",
        ["build", "perplexity", "vs fp32", "mean KL (nats/token)", "weights MB (decode graph)"],
        rows,
        note="Each aotforge row through its artifact's own prefill and decode steps (the build's quality gate); "
        "the calibrated methods calibrate on the text past the scored tokens. The head at 8 bits, blocks of 32.",
    )
    itl = results["itl_ms"]
    speed = bench_record.table(
        f"Decode ITL, batch 1, {PROMPT}-token context, {THREADS} threads",
        ["runtime", "ITL ms (median over rounds)"],
        [
            [f"aotforge {args.target} int4 {args.itl_config}", bench_record.figure(itl["aotforge"], 3)],
            ["llama.cpp Q4_0 (llama-bench -d 128 -n 64)", bench_record.figure(itl["llama.cpp Q4_0"], 3)],
        ],
        note="Each in a process of its own, alternating round by round.",
    )
    return [quality, speed]


if __name__ == "__main__":
    main()
