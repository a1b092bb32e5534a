"""What asks for a farm and what one returns; light (no onnx, torch or target import): the CLI and
``aotforge.build`` look here before deciding how to build."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aotforge.core.errors import OptionsError


def is_multi(spec: str | Sequence[str]) -> bool:
    """Whether ``--target`` / ``target=`` asks for more than one target (a list, ``a,b`` or ``all``)."""
    return not isinstance(spec, str) or "," in spec or spec.strip() == "all"


def parse_targets(spec: str | Sequence[str]) -> list[str]:
    """``"tvm,onnxruntime"`` or a list -> target names, in order, without repeats (``all``: every known one)."""
    from aotforge.targets import TARGETS

    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    if names == ["all"]:
        return list(TARGETS)
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise OptionsError(
            f"unknown target(s) {', '.join(unknown) or '(none given)'}; choose from: {', '.join(TARGETS)} (or all)"
        )
    return list(dict.fromkeys(names))


@dataclasses.dataclass(frozen=True)
class MatrixResult:
    """What a multi-target build (or a plan) made: the rows of its comparison, and where it is written."""

    rows: list[dict[str, Any]]
    agreement: dict[str, dict[str, float]]
    files: dict[str, Path]
    #: ``--target all``: targets left out because their probe fails here, with the probe's reason.
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every requested target (every plan entry) produced an artifact."""
        return all(r["status"] != "failed" for r in self.rows)

    @property
    def artifacts(self) -> dict[str, Path]:
        """``model/target`` -> artifact directory, for every row that has one."""
        return {f"{r['model']}/{r['target']}": Path(r["path"]) for r in self.rows if r["status"] != "failed"}

    def table(self) -> str:
        from aotforge.compiler.farm.report import markdown

        return markdown(self.rows, self.agreement)
