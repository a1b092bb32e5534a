"""A tvm artifact built with a symbolic batch dim compiles, validates and runs at several batch sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from aotforge.artifacts.loader import load
from aotforge.compiler.api import build
from tests.in_process import ISOLATE_BACKEND

MODEL = """
import torch

DYNAMIC_DIMS = {"image": {0: "batch"}}


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, image):
        y = torch.relu(self.conv(image)).mean(dim=(2, 3))
        return torch.softmax(self.fc(y), dim=-1)


def get_model():
    torch.manual_seed(0)
    return Small().eval()


def get_example_inputs():
    return {"image": torch.randn(2, 3, 8, 8)}
"""


def test_symbolic_batch_runs_for_several_sizes(tmp_path: Path) -> None:
    source = tmp_path / "small_cnn.py"
    source.write_text(MODEL)
    namespace: dict[str, Any] = {}
    exec(compile(MODEL, str(source), "exec"), namespace)  # the same model, for the reference outputs
    model = namespace["get_model"]()
    result = build(
        str(source),
        target="tvm",
        target_options={"dynamic": True},
        dynamic=["batch=1:2:4"],
        out=tmp_path / "out",
        bench=False,
        isolate_backend=ISOLATE_BACKEND,
    )
    runner = load(result.path)
    for batch in (1, 3, 4):
        x = torch.randn(batch, 3, 8, 8)
        with torch.no_grad():
            expected = model(x).numpy()
        got = next(iter(runner.run({"image": x.numpy()}).values()))
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # Symbolic shapes: kernels no static rule can take stay listed, never silently dropped.
    schedules = result.manifest.target.info["pipeline"]["schedules"]
    assert schedules["unscheduled"] == len(schedules["unscheduled_funcs"])
