"""Side-by-side latency of every example model on every CPU target, each build in its own process.

Each build runs ``aotforge compile`` (which validates, then benchmarks: warm-up, >= 30 runs, median)
in a fresh process, because TVM's and ORT's thread pools spin after a call and slow whatever runs
next in the same process. Prints a Markdown table of p50 / p99 and build seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = {
    "mini_resnet": ["examples/mini_resnet.py"],
    "tiny_transformer": ["examples/tiny_transformer.py", "--dynamic", "seq=1:16:64"],
    "minilm (seq 128)": ["examples/minilm.py", "--dynamic", "seq=1:128:128"],
}
_LIGHT = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light"
MODELS.update(
    {f"{m} (onnx light)": [str(_LIGHT / f"light_{m}.onnx")] for m in ("squeezenet", "shufflenet", "resnet50")}
)


def build(model_args: list[str], target: str, out: Path, seconds: float) -> dict:
    cmd = [sys.executable, "-m", "compiler.cli", "compile", *model_args, "--target", target, "--out", str(out)]
    cmd += ["--bench-seconds", str(seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    manifest = json.loads((Path(proc.stdout.strip().splitlines()[-1]) / "manifest.json").read_text())
    return {"bench": manifest["benchmark"], "seconds": manifest["build"]["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", default="onnxruntime,tvm")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seconds", type=float, default=10.0, help="benchmark budget per build")
    args = parser.parse_args()
    print("| model | target | p50 ms | p99 ms | runs | build s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for target in args.targets.split(","):
                r = build(MODELS[model], target, Path(tmp), args.seconds)
                if "error" in r:
                    print(f"| {model} | {target} | error: {r['error']} | | | |", flush=True)
                    continue
                b = r["bench"]
                print(
                    f"| {model} | {target} | {b['p50_ms']:.2f} | {b['p99_ms']:.2f} | {b['runs']} | {r['seconds']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
