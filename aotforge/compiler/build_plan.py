"""A build after planning and passes: what the build tail or a build bundle takes from the build line."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from aotforge.compiler.source import Arrays, SourceModel
from aotforge.passes.manager import PassRecord
from aotforge.targets.base import BuildContext, ProbeResult, Target


@dataclasses.dataclass(frozen=True)
class PlannedBuild:
    """A build after planning and passes: everything the tail (or a bundle) needs."""

    source: SourceModel
    target: Target
    probe: ProbeResult
    target_options: Any
    ctx: BuildContext
    samples: list[Arrays]
    sizes: Mapping[str, int]
    records: list[PassRecord]
    #: Where the validation inputs came from (``compiler.sample_inputs``): the manifest's record.
    inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def pass_entries(self) -> list[dict[str, Any]]:
        return [pass_entry(r) for r in self.records]


def pass_entry(record: PassRecord) -> dict[str, Any]:
    # Durations differ between identical builds, so they live in the manifest's build section.
    entry = dataclasses.asdict(record)
    entry.pop("seconds")
    return entry
