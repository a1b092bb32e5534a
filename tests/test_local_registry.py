"""The local registry: push/pull round trips, idempotence, aliases, clear errors, concurrent pushers."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.artifacts.local_registry import LocalRegistry, artifact_digest
from aotforge.core.errors import ArtifactError


@pytest.fixture(scope="module")
def two_artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real build, and a copy differing only in the manifest's ``build`` record: two distinct digests."""
    from tests.conftest import EXAMPLES, quick_build

    out = tmp_path_factory.mktemp("build")
    a = quick_build(str(EXAMPLES / "mini_resnet.py"), out, target="onnxruntime").path
    b = out / "copy"
    shutil.copytree(a, b)
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["build"]["copied"] = True
    (b / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    assert artifact_digest(a) != artifact_digest(b)
    return a, b


def _inputs(loaded: aotforge.LoadedArtifact) -> dict[str, np.ndarray]:
    return {
        s.name: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], dtype=s.dtype) for s in loaded.io.inputs
    }


def test_push_pull_round_trip_runs(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two_artifacts
    reg = LocalRegistry(tmp_path / "reg")
    name, version = reg.push(a)
    assert (name, version) == ("mini_resnet", 1)
    dest = reg.pull(f"{name}:{version}", tmp_path / "pulled")
    loaded = aotforge.load(dest)
    original = aotforge.load(a)
    got, want = loaded.run(_inputs(loaded)), original.run(_inputs(original))
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_load_by_alias_from_a_registry(
    two_artifacts: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = two_artifacts
    monkeypatch.setenv("AOTFORGE_PULL_CACHE", str(tmp_path / "pulled"))
    reg = LocalRegistry(tmp_path / "reg")
    reg.push(a)
    _, v2 = reg.push(b)
    reg.set_alias("mini_resnet", "prod", v2)
    loaded = aotforge.load("mini_resnet@prod", registry=tmp_path / "reg")
    assert loaded.manifest.build.get("copied") is True  # the aliased version, not the latest push by chance
    again = aotforge.load("mini_resnet@prod", registry=str(tmp_path / "reg"))  # served from the pull cache
    assert again.path == loaded.path
    np.testing.assert_array_equal(
        next(iter(loaded.run(_inputs(loaded)).values())), next(iter(aotforge.load(a).run(_inputs(loaded)).values()))
    )
    with pytest.raises(ArtifactError, match="nope"):
        aotforge.load("mini_resnet@nope", registry=tmp_path / "reg")


def test_push_is_idempotent(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_artifacts
    reg = LocalRegistry(tmp_path / "reg")
    assert reg.push(a) == ("mini_resnet", 1)
    assert reg.push(a) == ("mini_resnet", 1)
    assert reg.push(b) == ("mini_resnet", 2)
    assert reg.push(a) == ("mini_resnet", 1)
    assert [e.ref for e in reg.list()] == ["mini_resnet:1", "mini_resnet:2"]


def test_alias_resolves(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_artifacts
    reg = LocalRegistry(tmp_path / "reg")
    reg.push(a)
    reg.push(b)
    reg.set_alias("mini_resnet", "prod", 1)
    assert reg.resolve("mini_resnet@prod").version == 1
    reg.set_alias("mini_resnet", "prod", 2)
    entry = reg.resolve("mini_resnet@prod")
    assert entry.version == 2 and entry.digest == artifact_digest(b)
    dest = reg.pull("mini_resnet@prod", tmp_path / "pulled")
    assert artifact_digest(dest) == artifact_digest(b)


def test_unknown_refs_say_what_exists(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two_artifacts
    reg = LocalRegistry(tmp_path / "reg")
    reg.push(a)
    reg.set_alias("mini_resnet", "prod", 1)
    with pytest.raises(ArtifactError, match=r"no artifact named 'nope'; it has: mini_resnet"):
        reg.resolve("nope:1")
    with pytest.raises(ArtifactError, match=r"no version 7; its versions are: 1"):
        reg.resolve("mini_resnet:7")
    with pytest.raises(ArtifactError, match=r"no alias 'staging'; its aliases are: prod"):
        reg.resolve("mini_resnet@staging")
    with pytest.raises(ArtifactError, match="not a registry reference"):
        reg.resolve("mini_resnet")
    with pytest.raises(ArtifactError, match="no version 3"):
        reg.set_alias("mini_resnet", "prod", 3)


def test_pull_detects_tampered_blob(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two_artifacts
    reg = LocalRegistry(tmp_path / "reg")
    reg.push(a)
    blob = next((tmp_path / "reg" / "blobs").glob("*.tar.gz"))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="was modified"):
        reg.pull("mini_resnet:1", tmp_path / "pulled")
    assert not (tmp_path / "pulled").exists()


def _push_worker(root: str, artifact: str) -> tuple[str, int]:
    return LocalRegistry(root).push(artifact)


def test_concurrent_pushes_give_one_version_per_digest(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_artifacts
    root = str(tmp_path / "reg")
    jobs = [(root, str(p)) for p in (a, b, a, b)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_push_worker, jobs)
    reg = LocalRegistry(root)
    entries = reg.list()
    assert sorted(e.version for e in entries) == [1, 2]
    by_digest = {e.digest: e.version for e in entries}
    assert results[0] == results[2] == ("mini_resnet", by_digest[artifact_digest(a)])
    assert results[1] == results[3] == ("mini_resnet", by_digest[artifact_digest(b)])
    assert sorted(p.name for p in (tmp_path / "reg" / "blobs").iterdir()) == sorted(
        f"{artifact_digest(p)}.tar.gz" for p in (a, b)
    )


def test_cli_push_list_alias_pull_pack(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    from aotforge.compiler.cli import main

    a, _ = two_artifacts
    reg = str(tmp_path / "reg")
    runner = CliRunner()
    r = runner.invoke(main, ["push", str(a), "--registry", reg])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "mini_resnet:1"
    r = runner.invoke(main, ["alias", "mini_resnet", "prod", "1", "--registry", reg])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["list", "--registry", reg])
    assert r.exit_code == 0 and "mini_resnet:1" in r.output and "@prod" in r.output
    r = runner.invoke(main, ["pull", "mini_resnet@prod", "--dest", str(tmp_path / "p"), "--registry", reg])
    assert r.exit_code == 0, r.output
    assert artifact_digest(tmp_path / "p") == artifact_digest(a)
    r = runner.invoke(main, ["pull", "mini_resnet@nope", "--dest", str(tmp_path / "q"), "--registry", reg])
    assert r.exit_code == 2 and "no alias 'nope'" in r.output
    r = runner.invoke(main, ["pack", str(a), str(tmp_path / "a.tar.gz")])
    assert r.exit_code == 0, r.output
    r2 = runner.invoke(main, ["pack", str(a), str(tmp_path / "b.tar.gz")])
    assert r.output.split()[0] == r2.output.split()[0]


def _with_manifest(src: Path, dest: Path, **changes: object) -> Path:
    """A copy of ``src`` whose manifest has top-level ``changes`` (the manifest hash changes with them)."""
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest.update(changes)
    (dest / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    return dest


def test_promotion_moves_alias_when_gates_hold(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    from aotforge.artifacts.promotion import Gates, promote

    a = _with_manifest(two_artifacts[0], tmp_path / "benched", benchmark={"p50_ms": 0.8, "p99_ms": 1.1})
    reg = LocalRegistry(tmp_path / "reg")
    reg.push(a)
    assert promote(reg, "mini_resnet:1", "prod", Gates(min_cosine=0.99, max_p50_ms=1.0, max_p99_ms=1.2)) == (
        "mini_resnet",
        1,
    )
    assert reg.resolve("mini_resnet@prod").version == 1


def test_promotion_refusal_names_each_failed_gate(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    from aotforge.artifacts.promotion import Gates, promote
    from aotforge.core.errors import PromotionRefusedError

    a, _ = two_artifacts
    manifest = json.loads((a / "manifest.json").read_text())
    failed = _with_manifest(a, tmp_path / "failed", validation={**manifest["validation"], "passed": False})
    reg = LocalRegistry(tmp_path / "reg")
    reg.push(a)
    reg.push(failed)
    with pytest.raises(PromotionRefusedError, match=r"validation: passed=False, required True"):
        promote(reg, "mini_resnet:2", "prod", Gates())
    with pytest.raises(PromotionRefusedError, match=r"min-cosine: measured [0-9.]+, required >= 1.5"):
        promote(reg, "mini_resnet:1", "prod", Gates(min_cosine=1.5))
    with pytest.raises(PromotionRefusedError, match=r"max-p99-ms: measured nothing .*, required <= 1.0"):
        promote(reg, "mini_resnet:1", "prod", Gates(max_p99_ms=1.0))  # no benchmark recorded: refused
    benched = _with_manifest(a, tmp_path / "benched", benchmark={"p50_ms": 0.8, "p99_ms": 1.1})
    reg.push(benched)
    with pytest.raises(PromotionRefusedError, match=r"max-p99-ms: measured 1.1, required <= 1.0"):
        promote(reg, "mini_resnet:3", "prod", Gates(max_p50_ms=1.0, max_p99_ms=1.0))
    with pytest.raises(ArtifactError, match="no alias 'prod'"):
        reg.resolve("mini_resnet@prod")  # nothing moved


def test_cli_promote_refuses_with_nonzero_exit(two_artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    from aotforge.compiler.cli import main

    a, _ = two_artifacts
    reg = str(tmp_path / "reg")
    runner = CliRunner()
    assert runner.invoke(main, ["push", str(a), "--registry", reg]).exit_code == 0
    r = runner.invoke(main, ["promote", "mini_resnet:1", "prod", "--registry", reg, "--max-p50-ms", "0.000001"])
    assert r.exit_code != 0
    assert "max-p50-ms: measured nothing" in r.output and "required <= 1e-06" in r.output
    r = runner.invoke(main, ["promote", "mini_resnet:1", "prod", "--registry", reg, "--min-cosine", "0.9"])
    assert r.exit_code == 0, r.output
    assert "mini_resnet@prod -> mini_resnet:1" in r.output
