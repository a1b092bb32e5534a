"""The MLflow Model Registry client against a real `mlflow server` (SQLite backend, local artifact root)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.artifacts.hashing import require_intact
from aotforge.artifacts.manifest import read_manifest
from aotforge.artifacts.mlflow_registry import MlflowRegistry
from aotforge.artifacts.promotion import Gates, promote
from aotforge.core.errors import PromotionRefusedError, RegistryError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow server for the session; fails (never skips) if it cannot start."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{root / 'db.sqlite'}"]
    cmd += ["--artifacts-destination", str(root / "artifacts"), "--serve-artifacts"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log = (root / "server.log").open("wb")
    # No job executor: its consumer processes (MLflow's server-side GenAI jobs, none of which the registry runs)
    # start beside the server and poll the whole session, most of the fixture's CPU on a 2-core host.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # a loaded 2-core host took over 60 s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import EXAMPLES, quick_build

    return quick_build(str(EXAMPLES / "mini_resnet.py"), tmp_path_factory.mktemp("build"), target="onnxruntime").path


def test_push_is_idempotent_and_pull_verifies(mlflow_url: str, built: Path, tmp_path: Path) -> None:
    reg = MlflowRegistry(mlflow_url)
    name, version = reg.push(built)
    assert reg.push(built) == (name, version)  # same digest: the existing version
    (entry,) = [e for e in reg.list() if e.name == name]
    assert entry.target == "onnxruntime" and entry.version == version
    dest = reg.pull(f"{name}:{version}", tmp_path / "pulled")
    require_intact(dest, read_manifest(dest))
    assert (dest / "manifest.json").read_bytes() == (built / "manifest.json").read_bytes()


def test_promotion_and_pull_by_alias(mlflow_url: str, built: Path, tmp_path: Path) -> None:
    reg = MlflowRegistry(mlflow_url)
    name, version = reg.push(built)
    with pytest.raises(PromotionRefusedError, match="min-cosine: measured .*, required >= 1.5"):
        promote(reg, f"{name}:{version}", "prod", Gates(min_cosine=1.5))
    with pytest.raises(RegistryError, match="no alias 'prod'"):
        reg.resolve(f"{name}@prod")
    assert promote(reg, f"{name}:{version}", "prod", Gates(min_cosine=0.99)) == (name, version)
    dest = reg.pull(f"{name}@prod", tmp_path / "p")
    assert read_manifest(dest).name == "mini_resnet" and name == "mini_resnet-onnxruntime"


def test_cli_against_server_and_down_server(mlflow_url: str, built: Path, tmp_path: Path) -> None:
    from aotforge.compiler.cli import main

    runner = CliRunner()
    r = runner.invoke(main, ["push", str(built), "--registry", mlflow_url])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["list", "--registry", mlflow_url])
    assert r.exit_code == 0 and "mini_resnet-onnxruntime:" in r.output  # one registered model per target
    down = f"http://127.0.0.1:{_free_port()}"
    r = runner.invoke(main, ["push", str(built), "--registry", down])
    assert r.exit_code != 0
    assert down in r.output and "unreachable" in r.output and "mlflow server" in r.output
    # Bounded by construction, not by a clock: the registry's own attempts, each refused by the /health probe
    # (MLflow's client, whose HTTP retries take minutes, is never reached).
    output = " ".join(r.output.split())
    assert f"after {MlflowRegistry(down).attempts} attempts" in output and "Connection refused" in output, output


def test_push_logs_a_named_run_with_metrics_and_a_pyfunc_model(
    mlflow_url: str, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    import numpy as np

    from aotforge.artifacts import load

    reg = MlflowRegistry(mlflow_url)
    name, version = reg.push(built)
    assert name == "mini_resnet-onnxruntime"
    mv = reg.client.get_model_version(name, str(version))
    run = reg.client.get_run(mv.run_id)
    assert run.info.run_name == "mini_resnet-v1-onnxruntime"
    assert run.data.params["target"] == "onnxruntime" and run.data.params["passes"] == "fold,dce"
    assert "toolchain.onnxruntime" in run.data.params and "target.optimization_level" in run.data.params
    metrics = run.data.metrics
    assert metrics["validation_passed"] == 1.0 and metrics["model_size_mb"] > 0
    assert 0.99 < metrics["validation.logits.cosine"] <= 1.0 and metrics["validation.logits.rel_l2"] < 1e-4
    # The local and MLflow versions, each recorded against the other.
    assert mv.tags["artifact_version"] == "1" and run.data.tags["registered_version"] == f"{name}:{version}"
    model_id = mv.model_id or mv.source.removeprefix("models:/")  # the server may not echo model_id
    logged = reg.client.get_logged_model(model_id)
    assert logged.model_type == "aotforge" and logged.source_run_id == mv.run_id

    reg.set_alias(name, "prod", version)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_url)
    model = mlflow.pyfunc.load_model(f"models:/{name}@prod")
    x = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    got = model.predict({"image": x})
    np.testing.assert_array_equal(got["logits"], load(built).run({"image": x})["logits"])
    np.testing.assert_array_equal(model.predict(x)["logits"], got["logits"])  # one input: a bare array too


def test_promote_reads_the_run_metrics_and_downloads_nothing(
    mlflow_url: str, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = MlflowRegistry(mlflow_url)
    name, version = reg.push(built)

    def no_download(*_args: object) -> None:
        raise AssertionError("promote downloaded the artifact")

    monkeypatch.setattr(MlflowRegistry, "pull", no_download)
    with pytest.raises(PromotionRefusedError, match="max-p50-ms: measured nothing"):
        promote(reg, f"{name}:{version}", "fast", Gates(max_p50_ms=5.0))  # built with --no-bench
    assert promote(reg, f"{name}:{version}", "staging", Gates(min_cosine=0.999)) == (name, version)
    with pytest.raises(RegistryError, match="one per model and target .*mini_resnet-onnxruntime@staging"):
        reg.resolve("mini_resnet@staging")
