"""What a kill -9 leaves is swept by the next run; a failed pull leaves nothing; files are readable per the umask.

Before: ``.staging-*`` in --out after a killed compile, blob temp files in the registry after a killed
push, ``.unpack-*`` beside --dest after a killed pull stayed forever; a pull failing its digest check
left a complete artifact at --dest; artifacts were 0700 and blobs 0600; ``list --registry /typo`` made
an empty registry.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.artifacts import debris
from aotforge.artifacts.local_registry import INDEX, LocalRegistry
from aotforge.artifacts.packing import PACK_PREFIX, UNPACK_PREFIX
from aotforge.artifacts.store import next_version
from aotforge.compiler.cli import main
from aotforge.core.errors import ArtifactError
from tests.tiny_models import relu_add

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import quick_build

    tmp = tmp_path_factory.mktemp("debris")
    return quick_build(str(relu_add(tmp / "m.onnx")), tmp / "out", target="onnxruntime").path


def _killed_owner(directory: Path, prefix: str, kind: str) -> Path:
    """A real process makes a temporary the way aotforge does, then dies by SIGKILL; returns what it left."""
    code = (
        "import os, signal, sys; from pathlib import Path; from aotforge.artifacts import debris; "
        f"p = debris.make_temp_{kind}(Path(sys.argv[1]), sys.argv[2]); "
        "print(p, flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code, str(directory), prefix], capture_output=True, text=True, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = Path(proc.stdout.strip())
    assert left.exists()
    past = time.time() - debris.GRACE_S - 5  # as if the grace period had passed since the kill
    os.utime(left, (past, past))
    return left


def test_a_killed_compile_s_staging_dir_is_swept_and_never_counts(tmp_path: Path) -> None:
    from tests.conftest import quick_build

    out = tmp_path / "out"
    out.mkdir()
    left = _killed_owner(out, ".staging-", "dir")
    (out / "m" / "7").mkdir(parents=True)  # a version directory that never got its artifact
    assert next_version(out, "m") == 1
    result = quick_build(str(relu_add(tmp_path / "m.onnx")), out, target="onnxruntime")
    assert result.manifest.version == 1
    assert not left.exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_live_owner_s_staging_dir_is_kept(tmp_path: Path) -> None:
    mine = debris.make_temp_dir(tmp_path, ".staging-")
    past = time.time() - 10 * debris.GRACE_S
    os.utime(mine, (past, past))
    assert debris.sweep(tmp_path, ".staging-") == []
    assert mine.is_dir()
    foreign = tmp_path / ".staging-otherhost.1.abc"
    foreign.mkdir()
    os.utime(foreign, (past, past))
    assert debris.sweep(tmp_path, ".staging-") == []  # another host's: only when a day old
    legacy = tmp_path / ".staging-abc"  # not named by aotforge.artifacts.debris: never touched
    legacy.mkdir()
    assert debris.sweep(tmp_path, ".staging-", grace_s=0) == [] and legacy.is_dir()


def test_a_killed_push_s_blob_temp_is_swept(artifact: Path, tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "reg")
    left = _killed_owner(tmp_path / "reg" / "blobs", PACK_PREFIX, "file")
    reg.push(artifact)
    assert not left.exists()
    assert [p.name.endswith(".tar.gz") for p in (tmp_path / "reg" / "blobs").iterdir()] == [True]


def test_a_killed_pull_s_unpack_dir_is_swept(artifact: Path, tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "reg")
    name, version = reg.push(artifact)
    (tmp_path / "pulls").mkdir()
    left = _killed_owner(tmp_path / "pulls", UNPACK_PREFIX, "dir")
    reg.pull(f"{name}:{version}", tmp_path / "pulls" / "a")
    assert not left.exists()
    assert [p.name for p in (tmp_path / "pulls").iterdir()] == ["a"]


def test_a_pull_failing_its_digest_check_leaves_nothing(artifact: Path, tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "reg")
    name, version = reg.push(artifact)
    with sqlite3.connect(tmp_path / "reg" / INDEX) as db:  # the index names another manifest
        (digest,) = db.execute("SELECT digest FROM artifacts").fetchone()
        db.execute("UPDATE artifacts SET digest = ?", ("0" * 64,))
    blobs = tmp_path / "reg" / "blobs"
    (blobs / f"{digest}.tar.gz").rename(blobs / f"{'0' * 64}.tar.gz")
    (tmp_path / "pulls").mkdir()
    with pytest.raises(ArtifactError, match="sha256 is not the expected"):
        reg.pull(f"{name}:{version}", tmp_path / "pulls" / "a")
    assert list((tmp_path / "pulls").iterdir()) == []


def test_artifacts_and_blobs_are_readable_per_the_umask(artifact: Path, tmp_path: Path) -> None:
    from tests.conftest import quick_build

    old = os.umask(0o022)
    try:
        built = quick_build(str(relu_add(tmp_path / "m.onnx")), tmp_path / "out", target="onnxruntime").path
        reg = LocalRegistry(tmp_path / "reg")
        name, version = reg.push(built)
        pulled = reg.pull(f"{name}:{version}", tmp_path / "pulled")
    finally:
        os.umask(old)
    for directory in (built, pulled):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755, directory
        for f in directory.rglob("*"):
            assert stat.S_IMODE(f.stat().st_mode) & 0o044 == 0o044, f
    for blob in (tmp_path / "reg" / "blobs").iterdir():
        assert stat.S_IMODE(blob.stat().st_mode) == 0o644


def test_list_of_a_mistyped_registry_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "typo" / "path"
    for args in (["list"], ["pull", "m:1", "--dest", str(tmp_path / "d")], ["alias", "m", "prod", "1"]):
        result = CliRunner().invoke(main, [*args, "--registry", str(typo)])
        assert result.exit_code != 0
        assert result.output.strip().startswith("error: there is no registry at"), result.output
    assert not (tmp_path / "typo").exists()
