"""Runs an ordered list of passes, checks the model after each, and records what each did."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from aotforge.core.errors import PassFailedError, describe
from aotforge.passes.base import GraphPass, count_nodes

#: Protos above this size cannot be checked in memory (protobuf's 2 GB limit).
_CHECKABLE_BYTES = 1_800_000_000


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """One pass as the manifest records it."""

    name: str
    params: dict[str, Any]
    stats: dict[str, Any]
    nodes_before: int
    nodes_after: int
    seconds: float
    changes_numerics: bool = False


def run_passes(model: ir.Model, passes: Sequence[GraphPass], dump_dir: Path | None = None) -> list[PassRecord]:
    """Run ``passes`` in order on ``model`` (in place); a failure names the pass and those before it."""
    records: list[PassRecord] = []
    for index, graph_pass in enumerate(passes):
        before = count_nodes(model)
        start = time.perf_counter()
        try:
            result = graph_pass(model)
            check_model(result.model)
        except PassFailedError:
            raise  # the pass's own message (e.g. an accuracy budget's ranking): whole, not cut to one line
        except Exception as e:
            ran = ", ".join(r.name for r in records) or "none"
            raise PassFailedError(
                f"pass {graph_pass.name!r} failed ({type(e).__name__}: {describe(e)}); passes before it: {ran}. "
                f"Drop it from --passes to build without it"
            ) from e
        model = result.model
        records.append(
            PassRecord(
                name=graph_pass.name,
                params=dataclasses.asdict(graph_pass.params),
                stats=dict(graph_pass.stats),
                nodes_before=before,
                nodes_after=count_nodes(model),
                seconds=round(time.perf_counter() - start, 4),
                changes_numerics=graph_pass.changes_numerics,
            )
        )
        if dump_dir is not None:
            dump_dir.mkdir(parents=True, exist_ok=True)
            ir.save(model, dump_dir / f"{index + 1:02d}_{graph_pass.name}.onnx")
    return records


def check_model(model: ir.Model) -> None:
    """onnx.checker over the model; very large models are checked structurally by serialization only."""
    proto = ir.serde.serialize_model(model)
    if proto.ByteSize() < _CHECKABLE_BYTES:
        onnx.checker.check_model(proto)
