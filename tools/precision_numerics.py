"""fp16 / bf16 numerics vs fp32 for MiniLM and the ResNet-18-style CNN, on each target that builds them.

Every build is ``aotforge compile MODEL --target T --passes O1,fp16|bf16`` (a subprocess with a
time limit; the tolerance is opened so the build's own validation records rather than refuses).
What does not build is reported with the first line of its error. Numerics: the artifact
(loaded with ``artifacts.loader.load``) against the fp32 ``--passes O1`` onnxruntime artifact:
MiniLM embedding cosine on --sentences held-out sentences (seq 128), CNN logits cosine and top-1
agreement on --images seeded 224x224 inputs.

    .venv/bin/python tools/precision_numerics.py [--targets onnxruntime,tvm] [--timeout 600]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODELS = {"minilm": "examples/minilm.py", "cnn": "examples/resnet18_style.py"}


def inputs(model: str, count: int) -> list[dict[str, np.ndarray]]:
    if model == "minilm":
        from examples.minilm_sentences import evaluation_feeds

        return evaluation_feeds(128)[:count]
    rng = np.random.default_rng(2)
    return [{"image": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(count)]


def compile_one(model: str, target: str, passes: str, out: Path, timeout: int) -> tuple[Path | None, str]:
    name = f"{model}-{target}-{passes.replace(',', '-')}"
    cmd = [sys.executable, "-m", "aotforge", "compile", MODELS[model], "--target", target, "--passes", passes]
    cmd += ["--tolerance", "10", "--no-bench", "-o", str(out), "--name", name]
    if model == "minilm":  # sentences padded to 128; tvm binds a dim to its opt size (1 if undeclared)
        cmd += ["--dynamic", "seq=16:128:128"]  # opt 128: what tvm compiles for
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"did not build in {timeout} s"
    if done.returncode != 0:
        lines = [x for x in done.stderr.splitlines() if x.startswith("error") or "Error" in x]
        return None, (lines[-1] if lines else done.stderr.strip().splitlines()[-1])[:220]
    return Path(done.stdout.strip().splitlines()[-1]), "built"


def outputs(path: Path, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    from aotforge.artifacts.loader import load

    runner = load(path)
    return np.concatenate([np.asarray(next(iter(runner.run(f).values())), np.float64) for f in feeds])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="onnxruntime,tvm")
    ap.add_argument("--precisions", default="fp16,bf16")
    ap.add_argument("--models", default="minilm,cnn")
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "precision")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    rows = []
    for model in args.models.split(","):
        feeds = inputs(model, args.sentences if model == "minilm" else args.images)
        base, status = compile_one(model, "onnxruntime", "O1", args.work, args.timeout)
        assert base is not None, status
        ref = outputs(base, feeds)
        for target in args.targets.split(","):
            for precision in args.precisions.split(","):
                path, status = compile_one(model, target, f"O1,{precision}", args.work, args.timeout)
                if path is None:
                    rows.append((model, target, precision, "-", "-", "-", "-", status))
                    print(rows[-1], file=sys.stderr, flush=True)
                    continue
                try:
                    got = outputs(path, feeds)
                except Exception as e:  # a build that loads but cannot run here is a result too
                    rows.append((model, target, precision, "-", "-", "-", "-", f"built, run failed: {e}"[:220]))
                    continue
                cos = np.sum(got * ref, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
                rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
                top1 = f"{np.mean(got.argmax(1) == ref.argmax(1)):.1%}" if model == "cnn" else "-"
                row = (f"{1 - cos.mean():.1e}", f"{cos.min():.6f}", f"{rel.max():.1e}", top1, status)
                rows.append((model, target, precision, *row))
                print(rows[-1], file=sys.stderr, flush=True)
    print(
        f"vs the fp32 onnxruntime O1 artifact; minilm: {args.sentences} held-out sentences, cnn: {args.images} images"
    )
    print("| model | target | precision | 1 - mean cos | min cos | max rel L2 | top-1 agree | status |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
