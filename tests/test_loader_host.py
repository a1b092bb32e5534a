"""The loader refuses an artifact built for another host or toolchain, before loading it, and says why."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aotforge
from aotforge.artifacts.manifest import MANIFEST
from aotforge.core.errors import HostMismatchError
from tests.conftest import CPU_TARGETS, EXAMPLES, quick_build


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("host")
    return {t: quick_build(str(EXAMPLES / "mini_resnet.py"), out, target=t).path for t in CPU_TARGETS}


def _edited(src: Path, dest: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    shutil.copytree(src, dest)
    data = json.loads((dest / MANIFEST).read_text())
    edit(data)
    (dest / MANIFEST).write_text(json.dumps(data, sort_keys=True, indent=2) + "\n")
    return dest


def test_tvm_other_os_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    path = _edited(built["tvm"], tmp_path / "a", lambda m: m["target"]["info"]["platform"].update(system="Darwin"))
    with pytest.raises(HostMismatchError, match=r"built with tvm for Darwin/x86_64, this host is Linux/.*: rebuild"):
        aotforge.load(path)


def test_tvm_other_version_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    path = _edited(built["tvm"], tmp_path / "a", lambda m: m["toolchain"].update(tvm="0.19.0"))
    with pytest.raises(HostMismatchError, match=r"built with tvm 0.19.0 .* this host has tvm 0\.27.*apache-tvm 0\.19"):
        aotforge.load(path)


def test_tvm_cpu_features_this_host_lacks_are_refused(built: dict[str, Path], tmp_path: Path) -> None:
    from aotforge.targets.tvm.host import _cpuinfo_flags, _norm, host_cpu, isa_features

    src = built["tvm"]
    triple = json.loads((src / MANIFEST).read_text())["target"]["info"]["target"]["mtriple"]
    have = {_norm(f) for f in isa_features({"mcpu": host_cpu(), "mtriple": triple})} | _cpuinfo_flags()
    for cpu in ("diamondrapids", "graniterapids", "znver5", "znver4", "sapphirerapids", "icelake-server"):
        features = isa_features({"mcpu": cpu, "mtriple": triple})
        if [f for f in features if _norm(f) not in have]:
            break
    else:
        pytest.skip("this host has every feature of the CPUs tried")

    def edit(m: dict[str, Any]) -> None:
        m["target"]["info"]["target"]["mcpu"] = cpu
        m["target"]["info"]["cpu_features"] = features

    with pytest.raises(HostMismatchError, match=rf"for mcpu {cpu}, this host has a .* lacking .*: rebuild it here"):
        aotforge.load(_edited(src, tmp_path / "a", edit))


def test_tvm_amx_on_a_host_without_it_is_refused_naming_it(built: dict[str, Path], tmp_path: Path) -> None:
    """A lib.so with AMX kernels never opens where the CPU lacks the tiles or the OS refuses the tile state."""
    from aotforge.targets.tvm.host import amx_usable

    if amx_usable():
        pytest.skip("this host runs AMX tiles")

    def edit(m: dict[str, Any]) -> None:
        m["target"]["info"]["cpu_features"] = sorted({*m["target"]["info"]["cpu_features"], "amx-tile", "amx-int8"})

    with pytest.raises(HostMismatchError, match=r"lacking .*amx-int8.*: rebuild it here"):
        aotforge.load(_edited(built["tvm"], tmp_path / "a", edit))


def test_ort_newer_onnxruntime_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    path = _edited(built["onnxruntime"], tmp_path / "a", lambda m: m["toolchain"].update(onnxruntime="99.1.0"))
    with pytest.raises(HostMismatchError, match=r"built with onnxruntime 99.1.0 for opset \d+, this host has"):
        aotforge.load(path)


def test_ort_missing_provider_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    def edit(m: dict[str, Any]) -> None:
        m["target"]["options"]["providers"] = ["FancyExecutionProvider"]

    with pytest.raises(HostMismatchError, match="FancyExecutionProvider, this host's onnxruntime has only"):
        aotforge.load(_edited(built["onnxruntime"], tmp_path / "a", edit))
