"""Every pass that rewrites a graph is idempotent: a second run changes nothing (not an op, not a weight byte) and
says so (``modified`` false)."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
import pytest

from aotforge.passes.convert_precision import ConvertToBFloat16Pass, ConvertToFloat16Pass
from aotforge.passes.prune_magnitude import PruneMagnitudePass
from aotforge.passes.prune_structured import PruneStructuredPass
from aotforge.passes.quantize_dynamic import QuantizeDynamicPass
from aotforge.passes.quantize_static import QuantizeStaticPass
from tests.pass_models import cnn, mlp

CASES: list[tuple[type, Callable[[], ir.Model]]] = [
    (ConvertToFloat16Pass, mlp),
    (ConvertToBFloat16Pass, mlp),
    (QuantizeStaticPass, cnn),
    (QuantizeDynamicPass, cnn),
    (PruneStructuredPass, mlp),
    (PruneMagnitudePass, mlp),
]


@pytest.mark.parametrize(("cls", "make_model"), CASES, ids=[cls.__name__ for cls, _ in CASES])
def test_a_second_run_changes_nothing(cls: type, make_model: Callable[[], ir.Model]) -> None:
    model = make_model()
    assert cls()(model).modified
    once = ir.serde.serialize_model(model).SerializeToString()
    assert not cls()(model).modified
    assert ir.serde.serialize_model(model).SerializeToString() == once
