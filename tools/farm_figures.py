"""Build-farm timings (docs/farm.md; issue 17), each build in its own process.

1. MiniLM (examples/minilm.py): ``compile --target tvm,onnxruntime`` against two separate
   ``compile`` runs, wall time of each, in alternating order; the IR sha256 of each artifact.
2. A four-model x two-target plan through ``--executor local`` and ``--executor ray`` (a two-node
   cluster on 127.0.0.1 in a private network namespace, ``tests/ray_cluster.py``): wall times side
   by side, and whether the artifacts are the same (IR sha256 and every file's sha256 but the
   model card, which quotes the build's own benchmark).

    python tools/farm_figures.py minilm|minilm-reversed|plan WORKDIR     # prints one JSON line
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _timed(command: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, env=ENV)
    if run.returncode not in (0, 1):
        raise SystemExit(f"{command} failed: {run.stderr[-2000:]}")
    return round(time.perf_counter() - started, 1), run


def minilm(work: Path, reverse: bool = False) -> dict:
    compile_ = [sys.executable, "-m", "aotforge", "compile", str(ROOT / "examples/minilm.py"), "--bench-seconds", "3"]
    paths: list[str] = []
    single = {}

    def singles() -> None:
        for target in ("onnxruntime", "tvm"):
            single[target], one = _timed([*compile_, "--target", target, "--out", str(work / f"single-{target}")])
            paths.extend(one.stdout.split())

    if reverse:  # alternating rounds: the separate compiles first
        singles()
    multi, run = _timed([*compile_, "--target", "tvm,onnxruntime", "--out", str(work / "multi")])
    paths += run.stdout.split()
    if not reverse:
        singles()
    irs = {p: json.loads(Path(p, "manifest.json").read_text())["ir"]["sha256"] for p in paths}
    return {"multi_s": multi, "single_s": single, "sum_single_s": round(sum(single.values()), 1), "ir_sha256": irs}


PLAN = """bench = true
[[build]]
model = "{root}/examples/mini_resnet.py"
targets = ["tvm", "onnxruntime"]
[[build]]
model = "{root}/examples/tiny_transformer.py"
targets = ["tvm", "onnxruntime"]
dynamic = ["seq=16"]               # tvm compiles static shapes: one sequence length
[[build]]
model = "{light}/light_squeezenet.onnx"
targets = ["tvm", "onnxruntime"]
[[build]]
model = "{light}/light_shufflenet.onnx"
targets = ["tvm", "onnxruntime"]
"""


def plan(work: Path) -> dict:
    for sub in ("local", "ray"):
        (work / sub).mkdir(parents=True, exist_ok=True)
        (work / sub / "plan.toml").write_text(PLAN.format(root=ROOT, light=LIGHT))
    local_s, _ = _timed([sys.executable, "-m", "aotforge", "matrix", str(work / "local/plan.toml"), "--out",
                         str(work / "local/out")])  # fmt: skip
    script = f"ip link set lo up && exec {sys.executable} {ROOT / 'tests/ray_cluster.py'} plan {work / 'ray'}"
    run = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, env=ENV)
    ray = json.loads(run.stdout.strip().splitlines()[-1])
    rows = {}
    for sub in ("local", "ray"):
        for row in json.loads((work / sub / "out/matrix.json").read_text())["rows"]:
            files = {k: v for k, v in row.get("files", {}).items() if k != "MODEL_CARD.md"}
            rows.setdefault((row["model"], row["target"]), {})[sub] = (row["status"], row.get("ir_sha256"), files)
    same = {f"{m}/{t}": v["local"] == v["ray"] and v["local"][0] == "ok" for (m, t), v in rows.items()}
    return {"local_s": local_s, "ray_s": ray["seconds"], "ray_rc": ray["rc"], "same_artifacts": same}


if __name__ == "__main__":
    which, directory = sys.argv[1], Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    if which == "minilm-reversed":
        print(json.dumps(minilm(directory, reverse=True)))
    else:
        print(json.dumps({"minilm": minilm, "plan": plan}[which](directory)))
