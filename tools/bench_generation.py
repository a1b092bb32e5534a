"""Decoder benchmark: aotforge text-generation artifacts vs transformers eager vs ONNX Runtime GenAI, fp32.

On a SmolLM-135M-shaped Llama (random weights, built offline from its config), prompt 128, greedy,
2 threads; each runtime in its own process, one after another in one run (ratios are what counts
on a shared machine). ONNX Runtime GenAI is installed only into this bench's own venv (--genai-venv,
created on first use; it borrows the dev venv's packages through a .pth line), never as a
dependency of aotforge. Its model builder converts the same directory offline; it wants a tokenizer
beside the weights, so a word-level stand-in is saved there.

    python tools/bench_generation.py --work /tmp/gen-bench [--layers 30] [--targets onnxruntime]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np

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


def prepare(work: Path, layers: int) -> Path:
    """The model directory (config + safetensors + a word-level tokenizer stand-in)."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    model_dir = work / f"smollm-shaped-{layers}"
    if (model_dir / "config.json").is_file():
        return model_dir
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM, num_hidden_layers=layers, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(model_dir)
    vocab = {f"w{i}": i for i in range(SMOLLM["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w0").save_pretrained(model_dir)
    return model_dir


def prompt_ids(n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(0).integers(1, SMOLLM["vocab_size"], size=n)]


def run_transformers(model_dir: Path, prompt: int, new: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    ids = torch.tensor([prompt_ids(prompt)])
    marks = []
    with torch.inference_mode():
        model(input_ids=ids[:, :8])  # warm-up
        start = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        marks.append(time.perf_counter() - start)
        cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new - 1):
            out = model(input_ids=token, cache=cache, use_cache=True)
            cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            marks.append(time.perf_counter() - start)
    return _summary(marks)


def run_aotforge(model_dir: Path, work: Path, target: str, prompt: int, new: int, max_batch: int) -> dict[str, Any]:
    import aotforge
    from aotforge.compiler.generative.benchmark import GenerationBenchOptions, benchmark_generation

    out = work / "artifacts"
    result = aotforge.build(
        model_dir,
        target=target,
        task="text-generation",
        max_seq_len=prompt + new,
        max_batch=max_batch,
        out=out,
        bench=False,
        target_options={"intra_op_threads": THREADS} if target == "onnxruntime" else {},
    )
    artifact = aotforge.load(result.path)
    runner = artifact._generative()
    opts = GenerationBenchOptions(prompt_lengths=(prompt,), decode_tokens=new, repeats=3)
    record = benchmark_generation(
        runner, runner.spec, result.manifest.target.info["weights"]["weights_file_bytes"], opts
    )
    marks = []
    start = time.perf_counter()
    for _ in artifact.stream(np.array([prompt_ids(prompt)]), new):
        marks.append(time.perf_counter() - start)
    return {
        **_summary(marks),
        "generation_record": {k: v for k, v in record.items() if k != "itl_by_position_ms"},
        "validation": result.manifest.validation["token_agreement"],
    }


def run_genai(model_dir: Path, work: Path, prompt: int, new: int) -> dict[str, Any]:
    """Inside the genai venv: convert with its model builder (fp32, cpu), then time greedy decoding."""
    import onnxruntime_genai as og

    built = work / "genai-fp32"
    if not (built / "genai_config.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(built)]
            + ["-p", "fp32", "-e", "cpu", "-c", str(work / "genai-cache")],
            check=True,
        )
        config = json.loads((built / "genai_config.json").read_text())
        options = config["model"]["decoder"].setdefault("session_options", {})
        options["intra_op_num_threads"] = THREADS
        (built / "genai_config.json").write_text(json.dumps(config, indent=2))
    model = og.Model(str(built))

    def once(n: int) -> list[float]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=prompt + n, do_sample=False)
        generator = og.Generator(model, params)
        marks, start = [], time.perf_counter()
        generator.append_tokens(prompt_ids(prompt))
        for _ in range(n):
            generator.generate_next_token()
            marks.append(time.perf_counter() - start)
        return marks

    once(4)  # warm-up
    return {**_summary(once(new)), "genai": og.__version__ if hasattr(og, "__version__") else "?"}


def read_bandwidth_gbs() -> float:
    """A single numpy read of 512 MiB (sum), best of 3: the floor's denominator."""
    data = np.ones(128 * 1024 * 1024, dtype=np.float32)
    best = min(_timed(data.sum) for _ in range(3))
    return data.nbytes / best / 1e9


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _summary(marks: list[float]) -> dict[str, Any]:
    itl = np.diff(marks) * 1000.0
    return {
        "ttft_ms": round(marks[0] * 1000.0, 2),
        "itl_p50_ms": round(float(np.percentile(itl, 50)), 3),
        "itl_p90_ms": round(float(np.percentile(itl, 90)), 3),
        "tokens_per_s": round(len(itl) / (marks[-1] - marks[0]), 2),
    }


def genai_python(venv: Path) -> Path:
    """The bench venv's python, created (and onnxruntime-genai installed into it) on first use."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        # After the venv's own site-packages: its onnxruntime (genai's pin) wins over the dev venv's.
        (Path(site.decode().strip()) / "dev-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "onnxruntime-genai==0.18.0"], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aotforge-gen-bench"))
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--targets", default="onnxruntime")
    parser.add_argument("--genai-venv", type=Path, default=None)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: run one runtime, print JSON
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = prepare(args.work, args.layers)
    if args.one:
        kind, _, target = args.one.partition(":")
        if kind == "transformers":
            result = run_transformers(model_dir, args.prompt, args.new)
        elif kind == "genai":
            result = run_genai(model_dir, args.work, args.prompt, args.new)
        else:
            result = run_aotforge(model_dir, args.work, target, args.prompt, args.new, args.max_batch)
        print("RESULT " + json.dumps(result))
        return
    venv = args.genai_venv or args.work / "genai-venv"
    plan = [("transformers", Path(sys.executable))] + [
        (f"aotforge:{t}", Path(sys.executable)) for t in args.targets.split(",")
    ]
    plan.append(("genai", genai_python(venv)))
    results: dict[str, Any] = {"read_bandwidth_gbs": round(read_bandwidth_gbs(), 2), "load": os.getloadavg()}
    for kind, python in plan:
        cmd = [str(python), __file__, "--work", str(args.work), "--layers", str(args.layers), "--one", kind]
        cmd += ["--prompt", str(args.prompt), "--new", str(args.new), "--max-batch", str(args.max_batch)]
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        results[kind] = json.loads(lines[-1][7:]) if lines else {"error": done.stderr.strip().splitlines()[-3:]}
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    results["floor_itl_ms"] = round(weights / (results["read_bandwidth_gbs"] * 1e9) * 1000.0, 2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
