"""``mlflow models serve`` serves an aotforge artifact saved with its pyfunc flavor (no registry needed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import aotforge
from aotforge.artifacts.manifest import read_manifest
from aotforge.artifacts.mlflow_model import save_pyfunc
from tests.conftest import ROOT, quick_build
from tests.test_bench import tiny_model


@pytest.mark.slow  # starts uvicorn through mlflow: ~30-60 s on a loaded 2-core host
def test_mlflow_models_serve_runs_the_artifact(tmp_path: Path) -> None:
    artifact = quick_build(str(tiny_model(tmp_path / "tiny.onnx")), tmp_path / "out", target="onnxruntime").path
    model = save_pyfunc(artifact, tmp_path / "model", read_manifest(artifact))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    cmd = [f"{bin_dir}/mlflow", "models", "serve", "-m", str(model), "--env-manager", "local", "-p", str(port)]
    proc = subprocess.Popen([*cmd, "-h", "127.0.0.1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    x = np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(3, 16)
    body = json.dumps({"inputs": {"x": x.tolist()}}).encode()
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", body)
                request.add_header("Content-Type", "application/json")
                with urllib.request.urlopen(request, timeout=10) as response:
                    got = json.loads(response.read())["predictions"]["y"]
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "mlflow models serve did not start"
                time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    np.testing.assert_allclose(got, aotforge.load(artifact).run({"x": x})["y"], rtol=1e-6)
