"""``pip wheel .`` makes a wheel that works on its own: installed into a fresh venv, its ``aotforge`` compiles.

The fresh venv cannot download torch or tvm again, so it borrows this interpreter's site-packages
through a ``.pth`` line. A directory added that way does not have its own ``.pth`` files read, so the
editable install of the checkout (a ``.pth`` plus a finder) stays off: what runs is the wheel's copy,
which the compile test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ONNX_LIGHT, ROOT

MODEL = ONNX_LIGHT / "light_squeezenet.onnx"

#: Run by the fresh venv's python: where aotforge came from, and the artifact's outputs beside ORT's.
_CHECK = """
import json, sys
import numpy as np, onnxruntime as ort
import aotforge
model, artifact, out = sys.argv[1:]
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feed = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in session.get_inputs()}
want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
got = aotforge.load(artifact).run(feed)
np.savez(out, **{"want_" + k: v for k, v in want.items()}, **{"got_" + k: v for k, v in got.items()})
# The editable finder is a class on sys.meta_path (its __module__ names it) and a module once imported.
finders = [str(getattr(f, "__module__", "")) for f in sys.meta_path] + [m for m in sys.modules if "editable" in m]
print(json.dumps({"file": aotforge.__file__, "path": sys.path, "finders": finders}))
"""


@dataclass(frozen=True)
class Installed:
    wheel: Path
    source: Path  # the copy of the checkout the wheel was built from
    venv: Path
    site_packages: Path
    env: dict[str, str]


def _run(command: list[str | Path], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{command} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, and a stale
    # build/lib from an earlier run would put deleted modules into the wheel.
    source = tmp / "src"
    shutil.copytree(ROOT / "aotforge", source / "aotforge", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    dist = tmp / "dist"
    # No build isolation: this venv's setuptools builds it, with no index to reach.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", source, "-w", dist])
    (wheel,) = dist.glob("aotforge-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel])
    site_packages = Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    borrowed = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))  # this interpreter's own
    (site_packages / "borrowed_dev_packages.pth").write_text("".join(f"{p}\n" for p in borrowed))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return Installed(wheel, source, venv, site_packages, env)


def test_the_wheel_holds_aotforge_only_and_all_of_it(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"aotforge"} and len(dist_info) == 1 and dist_info.pop().startswith("aotforge-")
    package = installed.source / "aotforge"
    files = (p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    wanted = {p.relative_to(installed.source).as_posix() for p in files}
    assert wanted - names == set()  # every module of every subpackage, the model card templates, the C sources
    assert any(n.startswith("aotforge/artifacts/templates/") and n.endswith(".j2") for n in names)
    subpackages = {p.parent for p in package.rglob("*.py")}
    assert all((d / "__init__.py").exists() for d in subpackages), "a folder without __init__.py is not packaged"


def _compile(installed: Installed, target: str, cwd: Path) -> Path:
    command = [installed.venv / "bin" / "aotforge", "compile", MODEL, "--target", target, "--out", "out", "--no-bench"]
    proc = _run(command, cwd=cwd, env=installed.env)
    return cwd / proc.stdout.strip().splitlines()[-1]


#: tvm is slow: what the wheel must hold for it is checked above (every file of the package), and its build reads
#: nothing from outside the package, as onnxruntime's does not.
@pytest.mark.parametrize("target", [pytest.param("tvm", marks=pytest.mark.slow), "onnxruntime"])
def test_the_installed_console_script_compiles(installed: Installed, target: str, tmp_path: Path) -> None:
    artifact = _compile(installed, target, tmp_path)  # cwd is not the checkout, so it is not on sys.path
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["target"]["name"] == target and manifest["validation"]["passed"] is True
    python = installed.venv / "bin" / "python"
    proc = _run([python, "-c", _CHECK, MODEL, artifact, tmp_path / "y.npz"], cwd=tmp_path, env=installed.env)
    where = json.loads(proc.stdout.strip().splitlines()[-1])
    # The wheel's copy ran, the borrowed packages were there, and the checkout's editable finder was not.
    assert Path(where["file"]).is_relative_to(installed.site_packages / "aotforge")
    assert all(Path(p) != ROOT for p in where["path"] if p)
    assert sysconfig.get_paths()["purelib"] in where["path"]
    assert not [f for f in where["finders"] if "editable" in f]
    with np.load(tmp_path / "y.npz") as y:
        outputs = [k.removeprefix("want_") for k in y.files if k.startswith("want_")]
        assert outputs
        for name in outputs:
            np.testing.assert_allclose(y[f"got_{name}"], y[f"want_{name}"], rtol=1e-4, atol=1e-5)
