"""Every symbolic dim gets a range (``--dynamic``, a documented default, or a refusal), and the tvm
bucket plan for the resolved ranges: how each dim is served, which buckets compile, what is refused."""

from __future__ import annotations

import pytest

from aotforge.core.dim_defaults import DEFAULT_RANGES, dim_kind, resolve_dims
from aotforge.core.errors import InputSpecError, OptionsError
from aotforge.core.spec import DimRange, IOSpec, TensorSpec
from aotforge.targets.tvm.buckets import BucketPlan, plan_buckets

TOKENS = (TensorSpec("input_ids", "int64", ("batch", "seq")), TensorSpec("attention_mask", "int64", ("batch", "seq")))
HIDDEN = (
    TensorSpec("last_hidden_state", "float32", ("batch", "seq", 64)),
    TensorSpec("pooled", "float32", ("batch", 64)),
)


def _io(inputs: tuple[TensorSpec, ...] = TOKENS, outputs: tuple[TensorSpec, ...] = HIDDEN) -> IOSpec:
    return IOSpec(inputs, outputs)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("batch", "batch"), ("batch_size", "batch"), ("N", "batch"), ("seq", "sequence"), ("sequence_length", "sequence")],
)
def test_names_exporters_use_have_a_kind(name: str, kind: str) -> None:
    assert dim_kind(name) == kind


def test_onnx_defaults_by_name() -> None:
    io = resolve_dims(_io(), ())
    assert io.dims == (
        DimRange("batch", *DEFAULT_RANGES["batch"], kind="batch"),
        DimRange("seq", *DEFAULT_RANGES["sequence"], kind="sequence"),
    )


def test_declared_range_wins_and_keeps_the_kind() -> None:
    io = resolve_dims(_io(), (DimRange.parse("seq=1:32:128"),))
    assert io.dim("seq") == DimRange("seq", 1, 32, 128, kind="sequence")
    assert io.dim("batch") == DimRange("batch", 1, 1, 8, kind="batch")


def test_dynamo_auto_names_take_their_kind_from_the_axis() -> None:
    inputs = (TensorSpec("input_ids", "int64", ("s0", "s1")), TensorSpec("attention_mask", "int64", ("s0", "s1")))
    io = resolve_dims(IOSpec(inputs, ()), ())
    assert [(d.name, d.kind, d.opt) for d in io.dims] == [("s0", "batch", 1), ("s1", "sequence", 128)]


def test_torch_example_sizes_are_the_opt() -> None:
    io = resolve_dims(_io(), (), {"input_ids": (2, 32), "attention_mask": (2, 32)})
    assert io.dim("batch") == DimRange("batch", 1, 2, 8, kind="batch")
    assert io.dim("seq") == DimRange("seq", 1, 32, 512, kind="sequence")
    image = IOSpec((TensorSpec("image", "float32", ("batch", 3, "h", "w")),), ())
    io = resolve_dims(image, (), {"image": (1, 3, 96, 96)})
    assert io.dim("h") == DimRange("h", 96, 96, 96)  # no kind: the example's size only


def test_a_dim_with_no_default_is_refused_by_name() -> None:
    image = IOSpec((TensorSpec("pixel_values", "float32", ("batch", 3, "height", "width")),), ())
    with pytest.raises(
        InputSpecError, match=r"dims height, width are symbolic and have no default range.*--dynamic height="
    ):
        resolve_dims(image, ())


def test_bucket_plan_splits_batch_and_pads_masked_sequence() -> None:
    plan = plan_buckets(resolve_dims(_io(), (DimRange.parse("seq=1:32:128"),)))
    assert [(d.name, d.how, d.sizes) for d in plan.dims] == [("batch", "split", (1,)), ("seq", "pad", (32, 128))]
    assert [dict(b.sizes) for b in plan.buckets] == [{"batch": 1, "seq": 32}, {"batch": 1, "seq": 128}]
    assert plan.buckets[0].function == "main"  # the opt bucket: the function a static build had
    assert BucketPlan.from_info(plan.to_info()) == plan


def test_declared_buckets_and_their_limits() -> None:
    io = resolve_dims(_io(), (DimRange.parse("seq=1:32:128"),))
    plan = plan_buckets(io, ("seq=16/32/64/128", "batch=1/4"))
    assert len(plan.buckets) == 8 and plan.buckets[0].sizes == (("batch", 1), ("seq", 32))
    with pytest.raises(OptionsError, match="more than max_buckets=4"):
        plan_buckets(io, ("seq=16/32/64/128", "batch=1/4"), max_buckets=4)
    with pytest.raises(OptionsError, match="the largest must be the max"):
        plan_buckets(io, ("seq=16/32",))


def test_sequence_without_a_mask_cannot_be_padded() -> None:
    inputs = (TensorSpec("input_ids", "int64", ("batch", "seq")),)
    outputs = (TensorSpec("features", "float32", ("batch", 64)),)
    with pytest.raises(InputSpecError, match="dim 'seq' .* can be neither split .* nor padded"):
        plan_buckets(resolve_dims(IOSpec(inputs, outputs), (DimRange.parse("seq=1:16:64"),)))
    plan = plan_buckets(resolve_dims(IOSpec(inputs, outputs), (DimRange.parse("seq=16:16:18"),)))
    assert plan.dims[1].how == "exact" and plan.dims[1].sizes == (16, 17, 18)
