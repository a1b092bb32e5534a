"""An RMSNorm's ``mean(power(x, 2))`` as one PrimFunc (``rewrites/mean_of_square``): one kernel for the norm."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


def _rms_norm(square: str, axis: int) -> Any:
    """``x / sqrt(mean(square(x), axis) + eps)`` over ``x [2, 8, 64]``, as the ONNX import writes it."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            sq = relax.op.power(x, relax.const(2.0, "float32")) if square == "power" else relax.op.multiply(x, x)
            mean = bb.emit(relax.op.mean(bb.emit(sq), axis=[axis], keepdims=True))
            root = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(mean, relax.const(1e-6, "float32")))))
            out = bb.emit_output(relax.op.multiply(x, bb.emit(relax.op.divide(relax.const(1.0, "float32"), root))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(("square", "axis"), [("power", -1), ("multiply", 2)])
def test_norm_is_one_kernel_with_the_same_values(square: str, axis: int) -> None:
    import tvm
    from tvm import relax

    from aotforge.targets.tvm import steps
    from aotforge.targets.tvm.options import TvmOptions, target_dict
    from aotforge.targets.tvm.pipeline import compile_relax
    from aotforge.targets.tvm.rewrites.mean_of_square import norm_squares_fused

    target = tvm.target.Target(target_dict(TvmOptions()))
    x = np.random.default_rng(11).standard_normal((2, 8, 64), dtype=np.float32)
    got = {}
    for rewrite in (False, True):
        mod = _rms_norm(square, axis)
        if rewrite:
            mod, count = norm_squares_fused(mod)
            assert count == 1
        with target:
            legalized, _ = steps.run_steps(mod, target, [steps.LEGALIZE])
        kernels = [gv.name_hint for gv in legalized.get_global_vars() if gv.name_hint != "main"]
        assert len(kernels) == (1 if rewrite else 2), kernels
        executable, _ = compile_relax(mod, target, fast_math=False)
        got[rewrite] = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got[True], got[False], rtol=1e-6, atol=1e-7)  # the sum's lanes may differ
    want = x / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got[True], want, rtol=1e-5, atol=1e-6)


def test_a_mean_of_anything_else_is_left_alone() -> None:
    from tvm import relax

    from aotforge.targets.tvm.rewrites.mean_of_square import norm_squares_fused

    assert norm_squares_fused(_rms_norm("power", 1))[1] == 0  # not over the last axis: not a norm's

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(bb.emit(relax.op.exp(x)), axis=[1]))
        bb.emit_func_output(out)
    assert norm_squares_fused(bb.get())[1] == 0
