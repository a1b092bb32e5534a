"""Build one model for ORT fp32 and tvm, then time each artifact in its own process.

    .venv/bin/python tools/tvm_probe.py examples/resnet18_style.py [--out /tmp/probe] [--runs 30]

Both runtimes get 2 threads; each is timed by ``tools/bench_worker.py`` in a fresh process
(their thread pools spin after a call and would slow the other one down). Prints p50 per
runtime, the tvm/ORT ratio, and how many PrimFuncs each tvm schedule rule took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

THREADS = 2
ROOT = Path(__file__).resolve().parent.parent


def build(model: str, target: str, out: Path, target_options: dict[str, object], dynamic: list[str]) -> Path:
    from aotforge.compiler.api import build as aot_build

    options = {"intra_op_threads": THREADS} if target == "onnxruntime" else target_options
    result = aot_build(model, target=target, out=out / target, bench=False, target_options=options, dynamic=dynamic)
    return result.path


def time_artifact(artifact: Path, runs: int) -> dict[str, float]:
    env = {**os.environ, "TVM_NUM_THREADS": str(THREADS), "OMP_NUM_THREADS": str(THREADS)}
    cmd = [sys.executable, str(ROOT / "tools" / "bench_worker.py"), "artifact", "--artifact", str(artifact)]
    cmd += ["--runs", str(runs), "--warmup", "10"]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tvm_probe"))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--target-opt", action="append", default=[], help="tvm option key=value")
    parser.add_argument("--dynamic", action="append", default=[], help="dim=min:opt:max, timed at opt")
    parser.add_argument("--skip-ort", action="store_true", help="reuse the ORT artifact already in --out")
    args = parser.parse_args()
    tvm_opts = dict(kv.split("=", 1) for kv in args.target_opt)
    ort = (
        build(args.model, "onnxruntime", args.out, {}, args.dynamic)
        if not args.skip_ort
        else _latest(args.out / "onnxruntime")
    )
    tvm = build(args.model, "tvm", args.out, tvm_opts, args.dynamic)
    t_ort, t_tvm = time_artifact(ort, args.runs), time_artifact(tvm, args.runs)
    manifest = json.loads((tvm / "manifest.json").read_text())
    schedules = manifest["target"]["info"]["pipeline"]["schedules"]
    print(
        f"{args.model}: ORT {t_ort['p50_ms']:.3f} ms  tvm {t_tvm['p50_ms']:.3f} ms  "
        f"ratio {t_tvm['p50_ms'] / t_ort['p50_ms']:.2f}x"
    )
    print("rules:", json.dumps(schedules["scheduled_by_rule"]), "unscheduled:", schedules["unscheduled_funcs"])


def _latest(folder: Path) -> Path:
    manifests = sorted(folder.rglob("manifest.json"), key=lambda p: p.stat().st_mtime)
    if not manifests:
        raise SystemExit(f"no ORT artifact under {folder}: run once without --skip-ort")
    return manifests[-1].parent


if __name__ == "__main__":
    main()
