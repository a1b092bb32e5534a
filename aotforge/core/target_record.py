"""What an artifact's manifest records of its target: the contract between targets and artifacts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class TargetRecord:
    """The target an artifact was compiled for: its name, its options, and what its compile reported.

    ``info`` is the target's own (tvm: the LLVM target and the schedule report; tensorrt: the
    engine's profiles and layers); a target's ``load`` reads it back.
    """

    name: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TargetRecord:
        return cls(str(data["name"]), dict(data.get("options", {})), dict(data.get("info", {})))
