"""Signatures other tools verify: OpenSSF model-signing bundles, both ways; ed25519 stays verifiable."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import model_signing  # noqa: F401  (a dev dependency: fail here if it is missing, never skip)
import pytest

import aotforge
from aotforge.artifacts.openssf_signing import BUNDLE, keygen_ec
from aotforge.artifacts.signing import keygen, sign, verified_manifest
from aotforge.core.errors import EXIT_INTEGRITY, SignatureError
from tests.conftest import quick_build
from tests.test_bench import tiny_model
from tests.test_errors import invoke_cli

MODEL_SIGNING = Path(sys.executable).with_name("model_signing")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("openssf")
    return quick_build(str(tiny_model(tmp / "tiny.onnx")), tmp / "out", target="onnxruntime").path


def _copy(artifact: Path, to: Path) -> Path:
    shutil.copytree(artifact, to)
    return to


def test_model_signing_verifies_an_aotforge_signature(artifact: Path, tmp_path: Path) -> None:
    private, public = keygen_ec(tmp_path / "keys")
    art = _copy(artifact, tmp_path / "art")
    assert invoke_cli("sign", str(art), "--key", str(private)).returncode == 0
    assert (art / BUNDLE).is_file()
    ms = subprocess.run(
        [str(MODEL_SIGNING), "verify", "key", str(art), "--signature", str(art / BUNDLE), "--public_key", str(public)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ms.returncode == 0, ms.stdout + ms.stderr
    assert aotforge.load(art, public_key=public).manifest.name == "tiny"
    (art / "model.onnx").write_bytes((art / "model.onnx").read_bytes() + b"\0")
    proc = invoke_cli("verify", str(art), "--public-key", str(public))
    assert proc.returncode == EXIT_INTEGRITY and "model.sig" in proc.stderr and "Traceback" not in proc.stderr


def test_aotforge_verifies_a_model_signing_bundle(artifact: Path, tmp_path: Path) -> None:
    private, public = keygen_ec(tmp_path / "keys")
    art = _copy(artifact, tmp_path / "art")
    ms = subprocess.run(
        [str(MODEL_SIGNING), "sign", "key", str(art), "--signature", str(art / BUNDLE), "--private_key", str(private)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ms.returncode == 0, ms.stdout + ms.stderr
    proc = invoke_cli("verify", str(art), "--public-key", str(public))
    assert proc.returncode == 0 and proc.stdout.startswith("ok: signature ok"), proc.stderr
    other, _ = keygen_ec(tmp_path / "other")
    _, other_public = other, other.with_name("aotforge-ec.pub.pem")
    with pytest.raises(SignatureError, match="does not verify"):
        verified_manifest(art, other_public)


def test_ed25519_signatures_stay_verifiable(artifact: Path, tmp_path: Path) -> None:
    private, public = keygen(tmp_path / "keys")
    art = _copy(artifact, tmp_path / "art")
    sign(art, private)
    assert verified_manifest(art, public).name == "tiny"
    assert invoke_cli("keygen", "--out", str(tmp_path / "ec"), "--scheme", "openssf").returncode == 0
    assert (tmp_path / "ec" / "aotforge-ec.key.pem").stat().st_mode & 0o077 == 0
