"""A tensorrt engine's compatibility with the host that loads it (``targets/tensorrt/compat``): TensorRT
version, compute capability, version-compatible and hardware-compatible engines. Runs without TensorRT."""

from __future__ import annotations

import pytest

from aotforge.core.errors import ArtifactError
from aotforge.targets.tensorrt.compat import check_engine_compat


def _built(version: str = "10.3.0", cc: str = "8.9", mode: str = "none", vc: bool = False) -> dict[str, object]:
    return {
        "tensorrt_version": version,
        "compute_capability": cc,
        "hardware_compatibility": mode,
        "version_compatible": vc,
    }


def test_engine_compat_exact_match_passes() -> None:
    check_engine_compat(_built(), "10.3.0", "8.9")


def test_engine_compat_version_mismatch_says_what_and_how() -> None:
    with pytest.raises(ArtifactError) as err:
        check_engine_compat(_built(), "10.4.0", "8.9")
    text = str(err.value)
    assert "built with TensorRT 10.3.0 for compute capability 8.9" in text
    assert "this host has TensorRT 10.4.0 on compute capability 8.9" in text
    assert text.endswith("rebuild, or build with --target-opt version_compatible=true")


@pytest.mark.parametrize(
    ("built", "host", "ok"),
    [("10.3.0", "10.8.1", True), ("10.8.1", "10.3.0", False), ("10.8.0", "11.1.0", True), ("8.6.1", "11.0.0", False)],
)
def test_version_compatible_engines_run_on_newer_supported_runtimes(built: str, host: str, ok: bool) -> None:
    if ok:
        check_engine_compat(_built(version=built, vc=True), host, "8.9")
    else:
        with pytest.raises(ArtifactError, match="version_compatible=True"):
            check_engine_compat(_built(version=built, vc=True), host, "8.9")


def test_hardware_compat_levels() -> None:
    with pytest.raises(ArtifactError, match="hardware_compatibility=ampere_plus"):
        check_engine_compat(_built(cc="8.9"), "10.3.0", "9.0")
    check_engine_compat(_built(cc="8.0", mode="ampere_plus"), "10.3.0", "9.0")
    with pytest.raises(ArtifactError, match="compute capability 7.5"):
        check_engine_compat(_built(cc="8.0", mode="ampere_plus"), "10.3.0", "7.5")
    with pytest.raises(ArtifactError, match="compute capability unknown"):
        check_engine_compat(_built(cc="8.9", mode="same_compute_capability"), "10.3.0", "")
