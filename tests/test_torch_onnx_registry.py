"""torch's ONNX exporter registry, filled once a process (``aotforge/compiler/torch_onnx_registry.py``): each
export gets a copy of the same filled registry, and what one export registers never reaches the next."""

from __future__ import annotations

import onnxscript
import torch

from aotforge.compiler.torch_onnx_registry import share_torchlib_registry


def test_each_export_gets_its_own_copy_of_one_filled_registry() -> None:
    from torch.onnx._internal.exporter import _registration

    share_torchlib_registry()
    share_torchlib_registry()  # idempotent: one wrapper, not a wrapper of a wrapper
    first = _registration.ONNXRegistry.from_torchlib()
    second = _registration.ONNXRegistry().from_torchlib()  # as torch.onnx.export calls it
    assert first is not second and first.functions is not second.functions
    assert first.opset_version == second.opset_version and first.functions.keys() == second.functions.keys()
    relu = torch.ops.aten.relu.default
    assert first.get_decomps(relu) == second.get_decomps(relu) != []
    assert first.get_decomps(relu)[0] is second.get_decomps(relu)[0]  # filled once: the same entries, not refilled

    op = onnxscript.values.Opset("", 18)

    @onnxscript.script(op)
    def custom_relu(x):  # type: ignore[no-untyped-def]
        return op.Relu(x)

    first.register_op(relu, custom_relu)
    assert len(first.get_decomps(relu)) == len(second.get_decomps(relu)) + 1
    assert first.get_decomps(relu)[0].onnx_function is custom_relu  # a custom op comes first
    assert _registration.ONNXRegistry.from_torchlib().get_decomps(relu) == second.get_decomps(relu)


def test_an_export_through_the_shared_registry_computes_the_module() -> None:
    share_torchlib_registry()
    import numpy as np
    import onnxruntime as ort

    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU()).eval()
    x = torch.randn(2, 4)
    for _ in range(2):  # the second export reads the registry the first filled
        program = torch.onnx.export(module, (x,), dynamo=True, verbose=False)
        assert program is not None
        session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=1e-6)
