"""Input specs: dynamic dim parsing, binding and the checks on them."""

from __future__ import annotations

import pytest

from aotforge.compiler.options import BuildOptions
from aotforge.core.errors import InputSpecError, OptionsError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import DimRange, IOSpec, TensorSpec, check_dims_used, parse_value_range
from aotforge.targets.tvm.options import TvmOptions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("batch=1:32", DimRange("batch", 1, 1, 32)),
        ("seq=8:64:128", DimRange("seq", 8, 64, 128)),
        ("b=4", DimRange("b", 4, 4, 4)),
    ],
)
def test_dim_range_parses(text: str, expected: DimRange) -> None:
    assert DimRange.parse(text) == expected


@pytest.mark.parametrize("text", ["batch", "batch=", "batch=a:b", "1x=1:2", "batch=4:2", "batch=0:4"])
def test_dim_range_rejects(text: str) -> None:
    with pytest.raises(InputSpecError):
        DimRange.parse(text)


def test_binding_uses_opt_and_never_a_silent_one() -> None:
    io = IOSpec((TensorSpec("x", "float32", ("batch", 3, "h")),), (), (DimRange("batch", 1, 4, 8),))
    with pytest.raises(InputSpecError, match="dims h have no declared range"):
        io.bound_sizes()
    with pytest.raises(InputSpecError, match="dims h with no size"):
        io.inputs[0].bind({"batch": 4})
    io = IOSpec(io.inputs, (), (*io.dims, DimRange("h", 8, 16, 32)))
    assert io.inputs[0].bind(io.bound_sizes()) == (4, 3, 16)
    assert io.inputs[0].bind(io.bound_sizes("max")) == (8, 3, 32)
    with pytest.raises(InputSpecError, match="no model input has"):
        check_dims_used([DimRange("seq", 1, 1, 2)], io)


def test_value_range_and_options_from_dict() -> None:
    assert parse_value_range("ids=0:100") == ("ids", (0.0, 100.0))
    with pytest.raises(InputSpecError):
        parse_value_range("ids")
    assert options_from_dict(TvmOptions, {"fast_math": "false", "num_cores": "4"}, what="tvm") == TvmOptions(
        fast_math=False, num_cores=4
    )
    with pytest.raises(OptionsError, match="unknown tvm option"):
        options_from_dict(TvmOptions, {"nope": 1}, what="tvm")
    with pytest.raises(OptionsError, match="unknown build option"):
        BuildOptions.from_dict({"targt": "tvm"})


def test_generated_masks_always_attend_to_the_first_token() -> None:
    import numpy as np

    from aotforge.compiler.sample_inputs import make_inputs

    io = IOSpec((TensorSpec("attention_mask", "int64", (64, 1)), TensorSpec("ids", "int64", (64, 3))), ())
    (x,) = make_inputs(io, {}, seed=0, count=1)
    assert (x["attention_mask"] == 1).all()  # seq 1: the only token is attended
    assert set(np.unique(x["ids"])) > {1}  # other integer inputs are untouched
