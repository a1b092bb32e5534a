"""The neuron target: planning, routing, refusals and the sparsity carry-over, tested for real.

Neither torch-neuronx nor a Neuron device exists here. One test stands in for
``torch_neuronx.trace`` with ``torch.jit.trace``: it checks call shape and bucket routing only,
never that Neuron works. The ``neuron``-marked test at the bottom is the real one.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from aotforge.core.errors import InputSpecError, OptionsError, TargetUnavailableError, UnsupportedModelError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import DimRange, IOSpec, TensorSpec
from aotforge.core.target_record import TargetRecord
from aotforge.targets import get_target
from aotforge.targets.base import BuildContext
from aotforge.targets.neuron import sdk as neuron_sdk
from aotforge.targets.neuron.buckets import Bucket, actual_sizes, pad_inputs, route, unpad_outputs
from aotforge.targets.neuron.target import (
    InstanceFamily,
    NeuronOptions,
    check_covered,
    compiler_args,
    pad_dims_for,
    plan_buckets,
    refuse_passes,
)

TOKENS = IOSpec(
    inputs=(TensorSpec("ids", "int64", ("batch", "seq")), TensorSpec("mask", "int64", ("batch", "seq"))),
    outputs=(TensorSpec("out", "float32", ("batch", "seq", 8)),),
    dims=(DimRange("batch", 1, 1, 4), DimRange("seq", 16, 64, 128)),
)
ROWS = IOSpec(
    inputs=(TensorSpec("x", "float32", ("batch", 8)),),
    outputs=(TensorSpec("y", "float32", ("batch", 4)),),
    dims=(DimRange("batch", 1, 2, 8),),
)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _program() -> Any:
    torch.manual_seed(0)
    # Dynamic batch, as the frontend exports it: a static export's guards would refuse other buckets.
    batch = torch.export.Dim("batch", min=1, max=8)
    return torch.export.export(Tiny().eval(), (torch.randn(2, 8),), dynamic_shapes={"x": {0: batch}})


def _sparse_ir(name: str = "fc.weight") -> ir.Model:
    """The IR after a 2:4 pass: the Linear weight with two of every four values zeroed."""
    weight = np.arange(1, 33, dtype=np.float32).reshape(4, 8)
    weight[:, 0::4] = weight[:, 1::4] = 0
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", name], ["y"], transB=1)],
        "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(weight, name)],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))


def test_onnx_only_source_is_refused_with_the_reason() -> None:
    ctx = BuildContext(io=ROWS, source_format="onnx")
    with pytest.raises(UnsupportedModelError, match="no ONNX frontend.*source is onnx"):
        get_target("neuron").plan(_sparse_ir(), NeuronOptions(), ctx)


@pytest.mark.parametrize("name", ["int8", "int8_static", "quantize_qdq"])
def test_int8_qdq_is_refused_by_name(name: str) -> None:
    with pytest.raises(UnsupportedModelError, match=f"pass '{name}'.*no INT8 QDQ path"):
        refuse_passes(("fold_constants", name))


def test_precision_passes_map_to_auto_cast() -> None:
    opts = NeuronOptions(target=InstanceFamily.TRN2, optlevel=3)
    # No precision pass: auto-cast must be off, else neuronx-cc casts matmuls to bf16 unrecorded.
    assert compiler_args(opts, ("fold_constants",)) == ["--target", "trn2", "--optlevel", "3", "--auto-cast", "none"]
    assert compiler_args(opts, ("fp16",))[-4:] == ["--auto-cast", "all", "--auto-cast-type", "fp16"]
    assert compiler_args(NeuronOptions(), ("bf16",))[:2] == ["--target", "inf2"]
    with pytest.raises(UnsupportedModelError, match="conflict"):
        refuse_passes(("fp16", "bf16"))


def test_options_from_cli_strings() -> None:
    opts = options_from_dict(
        NeuronOptions, {"target": "trn1", "buckets": "seq=32/128,batch=1/4", "pad_dims": "seq"}, what="neuron"
    )
    assert opts.target is InstanceFamily.TRN1 and opts.buckets == ("seq=32/128", "batch=1/4")
    with pytest.raises(OptionsError, match="inf2, trn1, trn2"):
        NeuronOptions(target="inf1")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="optlevel"):
        NeuronOptions(optlevel=0)


def test_default_buckets_are_opt_and_max_per_dim() -> None:
    keys = [b.key for b in plan_buckets(TOKENS, NeuronOptions())]
    assert keys == ["batch1-seq64", "batch1-seq128", "batch4-seq64", "batch4-seq128"]
    static = IOSpec(inputs=(TensorSpec("x", "float32", (1, 8)),), outputs=())
    assert [b.key for b in plan_buckets(static, NeuronOptions())] == ["static"]


def test_every_size_of_a_range_runs_or_the_plan_is_refused() -> None:
    # Batch, and a sequence a mask covers, pad by default; declared pad_dims replace the default.
    assert pad_dims_for(TOKENS, NeuronOptions()) == ("batch", "seq")
    check_covered(TOKENS, NeuronOptions(), plan_buckets(TOKENS, NeuronOptions()))
    only_batch = NeuronOptions(pad_dims=("batch",))
    with pytest.raises(InputSpecError, match=r"dim 'seq' ranges 16..128 but only buckets \[64, 128\] would run"):
        check_covered(TOKENS, only_batch, plan_buckets(TOKENS, only_batch))
    unmasked = IOSpec(TOKENS.inputs[:1], TOKENS.outputs, TOKENS.dims)
    assert pad_dims_for(unmasked, NeuronOptions()) == ("batch",)


def test_declared_buckets_and_their_refusals() -> None:
    opts = NeuronOptions(buckets=("seq=128/32/64", "batch=4"))
    assert [b.key for b in plan_buckets(TOKENS, opts)] == ["batch4-seq32", "batch4-seq64", "batch4-seq128"]
    with pytest.raises(InputSpecError, match="largest must be 128"):
        plan_buckets(TOKENS, NeuronOptions(buckets=("seq=32/64",)))
    with pytest.raises(InputSpecError, match="range is 16..128"):
        plan_buckets(TOKENS, NeuronOptions(buckets=("seq=8/128",)))
    with pytest.raises(OptionsError, match="dim=size/size"):
        plan_buckets(TOKENS, NeuronOptions(buckets=("length=32",)))
    with pytest.raises(OptionsError, match="max_buckets=3"):
        plan_buckets(TOKENS, NeuronOptions(max_buckets=3))


def test_route_picks_the_smallest_fitting_bucket_and_pads_only_where_allowed() -> None:
    buckets = plan_buckets(TOKENS, NeuronOptions(buckets=("seq=32/64/128", "batch=1/4")))
    assert route(buckets, {"batch": 1, "seq": 64}, ()).key == "batch1-seq64"
    assert route(buckets, {"batch": 2, "seq": 40}, ("batch", "seq")).key == "batch4-seq64"
    with pytest.raises(InputSpecError, match="no compiled bucket fits.*paddable dims: none"):
        route(buckets, {"batch": 1, "seq": 40}, ())
    with pytest.raises(InputSpecError, match="paddable dims: seq"):
        route(buckets, {"batch": 2, "seq": 40}, ("seq",))


def test_padding_and_unpadding_round_trip() -> None:
    ids, mask = np.ones((2, 40), np.int64), np.ones((2, 40), np.int64)
    sizes = actual_sizes(TOKENS, {"ids": ids, "mask": mask})
    assert sizes == {"batch": 2, "seq": 40}
    padded = pad_inputs(TOKENS, {"ids": ids, "mask": mask}, Bucket((("batch", 4), ("seq", 64))))
    assert padded[0].shape == (4, 64) and padded[1][:2, :40].all() and not padded[1][2:].any()
    out = unpad_outputs(TOKENS, [np.zeros((4, 64, 8), np.float32)], sizes)
    assert out["out"].shape == (2, 40, 8)


def test_inputs_that_disagree_on_a_dim_are_refused() -> None:
    with pytest.raises(InputSpecError, match="'mask' has shape"):
        actual_sizes(TOKENS, {"ids": np.ones((2, 40)), "mask": np.ones((2, 41))})
    with pytest.raises(InputSpecError, match="needs input 'mask'"):
        actual_sizes(TOKENS, {"ids": np.ones((2, 40))})


def test_sparsity_masks_carry_onto_the_torch_weights_by_name() -> None:
    program = _program()
    module = neuron_sdk.module_of(program)
    masked = neuron_sdk.carry_sparsity_masks(module, _sparse_ir())
    assert masked == ["fc.weight"]
    weight = module.fc.weight if hasattr(module, "fc") else dict(module.named_parameters())["fc.weight"]
    assert not weight[:, 0::4].any() and not weight[:, 1::4].any() and weight[:, 2::4].all()
    # The reference program (validation compares against it) keeps its dense weights.
    assert program.state_dict["fc.weight"][:, 0::4].abs().sum() > 0
    with pytest.raises(UnsupportedModelError, match="masks cannot be carried over"):
        neuron_sdk.carry_sparsity_masks(neuron_sdk.module_of(program), _sparse_ir("other.weight"))


def test_probe_names_packages_and_device_and_compile_refuses(tmp_path: Path) -> None:
    target = get_target("neuron")
    probe = target.probe()
    if probe.available:
        pytest.skip("this host is a Neuron instance")
    assert "neuron" in probe.reason and ("torch-neuronx" in probe.reason or "/dev/neuron" in probe.reason)
    ctx = BuildContext(io=ROWS, source_format="torch", torch_program=_program())
    if not probe.compiles:
        with pytest.raises(TargetUnavailableError, match="torch-neuronx"):
            target.compile(_sparse_ir(), NeuronOptions(), ctx, tmp_path)


def test_compile_and_load_call_shape_with_a_stand_in_for_torch_neuronx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in: torch.jit.trace replaces torch_neuronx.trace. Checks call shape and routing ONLY."""
    calls: list[dict[str, Any]] = []

    def trace(
        module: Any,
        example: tuple[torch.Tensor, ...],
        compiler_args: list[str],
        compiler_workdir: str,
        cpu_backend: bool,
    ) -> Any:
        shapes = [tuple(t.shape) for t in example]
        calls.append({"shapes": shapes, "args": compiler_args, "workdir": compiler_workdir, "cpu": cpu_backend})
        return torch.jit.trace(module, example)

    monkeypatch.setitem(sys.modules, "torch_neuronx", types.SimpleNamespace(trace=trace))
    monkeypatch.setattr(neuron_sdk, "versions", lambda: {"neuronx-cc": "stand-in", "torch-neuronx": "stand-in"})
    monkeypatch.setattr(neuron_sdk, "probe", lambda python="": neuron_sdk.ProbeResult(True))
    target, program = get_target("neuron"), _program()
    ctx = BuildContext(io=ROWS, passes=("sparsity24", "fp16"), source_format="torch", torch_program=program)
    result = target.compile(_sparse_ir(), NeuronOptions(pad_dims=("batch",)), ctx, tmp_path)
    assert [c["shapes"] for c in calls] == [[(2, 8)], [(8, 8)]]
    assert calls[0]["args"][-2:] == ["--auto-cast-type", "fp16"]
    # neuronx-cc's scratch is outside the artifact (nothing of it ships) and gone after success;
    # no /dev/neuron* here, so the trace is asked to run on the CPU with --target set.
    assert all(tmp_path not in Path(c["workdir"]).parents and not Path(c["workdir"]).exists() for c in calls)
    assert all(c["cpu"] for c in calls) and calls[0]["args"][:2] == ["--target", "inf2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.batch2.neuron.pt", "model.batch8.neuron.pt"]
    assert result.files == ("model.batch2.neuron.pt", "model.batch8.neuron.pt")
    info = json.loads(json.dumps(result.target_info, sort_keys=True))  # as the manifest stores it
    assert info["sparsity_masked_params"] == ["fc.weight"] and info["instance_family"] == "inf2"
    monkeypatch.setattr(neuron_sdk, "host_instance_type", lambda: "inf2.xlarge")
    runner = target.load(tmp_path, TargetRecord("neuron", info=info), ROWS)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    masked = neuron_sdk.module_of(program)
    neuron_sdk.carry_sparsity_masks(masked, _sparse_ir())
    np.testing.assert_allclose(runner.run({"x": x})["y"], masked(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)


@pytest.mark.neuron
def test_end_to_end_on_a_neuron_device(tmp_path: Path) -> None:
    target = get_target("neuron")
    probe = target.probe()
    if not probe.available:
        pytest.skip(probe.reason)
    program = _program()
    ctx = BuildContext(io=ROWS, source_format="torch", torch_program=program)
    result = target.compile(_sparse_ir(), NeuronOptions(pad_dims=("batch",)), ctx, tmp_path)
    assert result.target_info["neuronx_cc_version"] and result.target_info["torch_neuronx_version"]
    runner = target.load(tmp_path, TargetRecord("neuron", info=dict(result.target_info)), ROWS)
    for batch in (1, 2, 5, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        expected = program.module()(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(runner.run({"x": x})["y"], expected, rtol=1e-3, atol=1e-3)


# neuron-ls's own output as aws-neuron-sdk documents it (tools/neuron-sys-tools/neuron-ls.rst).
NEURON_LS_TRN2N = """instance-type: trn2n.48xlarge
instance-id: i-aabbccdd123456789
logical-neuroncore-config: 2
+--------+--------+----------+--------+---------------+--------------+---------------+------+
"""


def test_instance_type_is_read_from_neuron_ls() -> None:
    assert neuron_sdk.parse_instance_type(NEURON_LS_TRN2N) == "trn2n.48xlarge"
    assert neuron_sdk.parse_instance_type("no such line") == ""


@pytest.mark.parametrize(
    ("built", "host", "ok"),
    [
        ("trn2", "trn2n.48xlarge", True),  # the n variant shares trn2's cores
        ("trn1", "trn1n.32xlarge", True),
        ("inf2", "inf2.xlarge", True),
        ("inf2", "trn1.2xlarge", False),
        ("trn1", "trn2.48xlarge", False),
        ("inf2", "", True),  # no neuron-ls: the probe's device check is what stands
    ],
)
def test_stored_instance_family_is_compared_with_the_host(built: str, host: str, ok: bool) -> None:
    from aotforge.core.errors import ArtifactError
    from aotforge.targets.neuron.target import check_instance_family

    if ok:
        check_instance_family(built, host)
    else:
        with pytest.raises(ArtifactError, match=f"compiled for {built}.*--target-opt target="):
            check_instance_family(built, host)
