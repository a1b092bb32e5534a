"""ONNX Runtime GenAI as a runtime of the generation benchmark (``bench_generation.py``).

GenAI is installed only into the bench's own venv (created on first use; it borrows the dev venv's packages
through a .pth line), never as a dependency of aotforge. Its model builder converts the model directory
offline (fp32 or int4, cpu); it wants a tokenizer beside the weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
from decode_timing import measure  # tools/, beside this script

#: The onnxruntime-genai release the bench venv installs.
GENAI = "onnxruntime-genai==0.18.0"


def genai_python(venv: Path) -> Path:
    """The bench venv's python, created (and onnxruntime-genai installed into it) on first use."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        # After the venv's own site-packages: its onnxruntime (genai's pin) wins over the dev venv's.
        (Path(site.decode().strip()) / "dev-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", GENAI], check=True)
    return python


def convert(model_dir: Path, work: Path, precision: str, threads: int) -> Path:
    """The model builder's output for ``precision`` under ``work`` (converted once), set to ``threads`` threads."""
    built = work / f"genai-{precision}"
    if not (built / "genai_config.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(built)]
            + ["-p", precision, "-e", "cpu", "-c", str(work / f"genai-cache-{precision}")],
            check=True,
        )
        config = json.loads((built / "genai_config.json").read_text())
        options = config["model"]["decoder"].setdefault("session_options", {})
        options["intra_op_num_threads"] = threads
        (built / "genai_config.json").write_text(json.dumps(config, indent=2))
    return built


def run_genai(
    model_dir: Path, work: Path, prompt: list[int], new: int, batch: int, *, precision: str, threads: int
) -> dict[str, Any]:
    """Inside the genai venv: greedy decoding of ``new`` tokens after ``prompt``, timed by ``decode_timing``."""
    import onnxruntime_genai as og

    model = og.Model(str(convert(model_dir, work, precision, threads)))

    def once(rows: int, n: int) -> list[float]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, do_sample=False, batch_size=rows)
        generator = og.Generator(model, params)
        marks, start = [], time.perf_counter()
        generator.append_tokens(np.array([prompt] * rows, dtype=np.int32))
        for _ in range(n):
            generator.generate_next_token()
            marks.append(time.perf_counter() - start)
        return marks

    return {**measure(once, new, batch), "genai": getattr(og, "__version__", "?")}
