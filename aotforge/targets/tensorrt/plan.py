"""What the TensorRT builder is told: one optimization profile per input and the builder settings.

Plain data, shared by :mod:`targets.tensorrt.target` (which decides it) and
:mod:`targets.tensorrt.sdk` (which hands it to TensorRT), so neither imports the other for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Profile:
    """One input's shape range in the engine's single optimization profile."""

    input: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TrtBuildPlan:
    """Everything the builder is told, decided before any GPU work (and what a bundle carries)."""

    profiles: tuple[Profile, ...]
    flags: tuple[str, ...]
    workspace_bytes: int
    optimization_level: int
    hardware_compatibility: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
