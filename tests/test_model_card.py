"""The model card a person opens: plots drawn at build time (hashed like every file) and an HTML page
that renders in a browser (headless Chromium takes a screenshot of it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aotforge.artifacts.card_plots import manifest_plots
from aotforge.artifacts.hashing import sha256_file
from tests.conftest import quick_build
from tests.test_bench import tiny_model

CHROMIUM = next((b for b in ("chromium-headless-shell", "chromium", "chromium-browser") if shutil.which(b)), None)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("card")
    model = str(tiny_model(tmp / "tiny.onnx"))
    return quick_build(model, tmp / "out", target="onnxruntime", dynamic=["batch=1:2:8"], bench=True, plots=True).path


def test_plots_are_in_the_artifact_hashed_and_in_the_card(artifact: Path) -> None:
    files = json.loads((artifact / "manifest.json").read_text())["files"]
    for plot in ("plots/latency.png", "plots/accuracy.png"):
        assert files[plot] == sha256_file(artifact / plot)
        assert (artifact / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({plot})" in (artifact / "MODEL_CARD.md").read_text()
    assert files["MODEL_CARD.html"] == sha256_file(artifact / "MODEL_CARD.html")
    html = (artifact / "MODEL_CARD.html").read_text()
    assert '<img src="plots/latency.png"' in html and "<table>" in html


def test_quantized_and_generative_plots_come_from_the_manifest(tmp_path: Path) -> None:
    ranking = [{"node": f"MatMul_{i}", "error": 0.01 / (i + 1)} for i in range(5)]
    passes = [{"name": "int8", "stats": {"accuracy_budget": {"ranking": ranking}}}]
    gen = {"itl_by_position_ms": [5.0, 5.2, 5.1], "itl_prompt_len": 8, "ttft_ms": {"8": 12.0, "32": 30.0}}
    drawn = manifest_plots(
        tmp_path, {"metrics": {"y": {"rel_l2": 1e-3, "cosine": 0.9999}}}, {"generation": gen}, passes
    )
    assert drawn == ["plots/accuracy.png", "plots/quant_layers.png", "plots/generation.png"]
    again = tmp_path / "again"
    again.mkdir()
    manifest_plots(again, {"metrics": {"y": {"rel_l2": 1e-3, "cosine": 0.9999}}}, {"generation": gen}, passes)
    # Same figures, same bytes: a rebuild does not change the artifact's hashes through its plots.
    assert all(sha256_file(tmp_path / d) == sha256_file(again / d) for d in drawn)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here: apt-get install chromium-headless-shell")
def test_html_card_renders_in_headless_chromium(artifact: Path, tmp_path: Path) -> None:
    from matplotlib.image import imread

    shot = tmp_path / "card.png"
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         "--window-size=1000,2400", "--allow-file-access-from-files", (artifact / "MODEL_CARD.html").as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1000)
    assert (pixels.min(axis=2) < 0.5).mean() > 0.002  # text and tables: not a blank page
    # The plots' coloured bars: the images loaded (text and tables are grey or black).
    saturation = pixels.max(axis=2) - pixels.min(axis=2)
    assert (saturation > 0.3).sum() > 500, "no plot pixels in the screenshot"
    assert np.isfinite(pixels).all()
