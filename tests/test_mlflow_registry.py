"""The MLflow Model Registry client against a real `mlflow server` (SQLite backend, local artifact root)."""

from __future__ import annotations

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
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
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
    assert read_manifest(dest).name == name


def test_cli_against_server_and_down_server(mlflow_url: str, built: Path, tmp_path: Path) -> None:
    from aotforge.compiler.cli import main

    runner = CliRunner()
    r = runner.invoke(main, ["push", str(built), "--registry", mlflow_url])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["list", "--registry", mlflow_url])
    assert r.exit_code == 0 and "mini_resnet:" in r.output
    down = f"http://127.0.0.1:{_free_port()}"
    start = time.monotonic()
    r = runner.invoke(main, ["push", str(built), "--registry", down])
    assert r.exit_code != 0
    assert down in r.output and "unreachable" in r.output and "mlflow server" in r.output
    assert time.monotonic() - start < 10
