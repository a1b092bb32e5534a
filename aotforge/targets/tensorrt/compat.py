"""Whether this host's TensorRT and GPU can run an engine, checked before it is deserialized.

An engine runs only under the TensorRT version and on the compute capability it was built for,
unless it was built version-compatible (a newer runtime, within the cross-major runs NVIDIA
supports) or hardware-compatible (``ampere_plus``: any GPU from compute capability 8.0).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from aotforge.core.errors import ArtifactError


class HardwareCompat(enum.StrEnum):
    """TensorRT's hardware compatibility levels (``trt.HardwareCompatibilityLevel``)."""

    NONE = "none"
    AMPERE_PLUS = "ampere_plus"
    SAME_COMPUTE_CAPABILITY = "same_compute_capability"


def check_engine_compat(built: Mapping[str, Any], host_version: str, host_cc: str) -> None:
    """Refuse, before deserializing, an engine this host's TensorRT or GPU cannot run."""
    version_ok = _version_ok(str(built["tensorrt_version"]), host_version, bool(built.get("version_compatible")))
    mode = HardwareCompat(built.get("hardware_compatibility", "none"))
    hw_ok = _hardware_ok(str(built["compute_capability"]), host_cc, mode)
    if version_ok and hw_ok:
        return
    fix = (
        "build with --target-opt version_compatible=true"
        if not version_ok
        else "build with --target-opt hardware_compatibility=ampere_plus"
    )
    raise ArtifactError(
        f"tensorrt engine built with TensorRT {built['tensorrt_version']} for compute capability "
        f"{built['compute_capability']} (hardware_compatibility={mode.value}, "
        f"version_compatible={bool(built.get('version_compatible'))}), this host has TensorRT {host_version} "
        f"on compute capability {host_cc or 'unknown'}: rebuild, or {fix}"
    )


#: Cross-major runs NVIDIA supports for version-compatible engines (older build, newer runtime).
_CROSS_MAJOR = {(8, 10), (10, 11)}


def _version_ok(built: str, host: str, version_compatible: bool) -> bool:
    if not version_compatible:
        return built == host
    b, h = _numbers(built), _numbers(host)
    return h >= b and (h[0] == b[0] or (b[0], h[0]) in _CROSS_MAJOR)


def _hardware_ok(built_cc: str, host_cc: str, mode: HardwareCompat) -> bool:
    if mode is HardwareCompat.AMPERE_PLUS:
        return bool(host_cc) and _numbers(host_cc) >= (8, 0)
    return bool(host_cc) and _numbers(host_cc) == _numbers(built_cc)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())
