"""The tvm target's default CPU schedule rules fire, keep numerics, and report what they missed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu

from aotforge.targets.tvm.pipeline import compile_relax
from aotforge.targets.tvm.schedules import apply_default_schedules
from aotforge.targets.tvm.schedules.injective import Injective


class _Mlp(torch.nn.Module):
    """matmul + bias + GELU (N a multiple of 32), a residual, softmax, a tail N=10, a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).flatten(1)
        h = torch.nn.functional.gelu(self.fc1(y))
        h = torch.softmax(h + self.fc2(h), dim=-1)
        return self.head(h)


def _target() -> Any:
    return tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3" if _is_x86() else "generic", "num-cores": 2})


def _is_x86() -> bool:
    import platform

    return platform.machine() in ("x86_64", "AMD64")


def _relax_module(model: torch.nn.Module, x: torch.Tensor) -> Any:
    from tvm.relax.frontend.torch import from_exported_program

    ep = torch.export.export(model, (x,))
    return from_exported_program(ep, keep_params_as_input=False)


@pytest.fixture(scope="module")
def mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _Mlp().eval(), torch.randn(8, 3, 4, 4)


@pytest.mark.parametrize("fast_math", [True, False])
def test_rules_schedule_and_keep_numerics(mlp: tuple[torch.nn.Module, torch.Tensor], fast_math: bool) -> None:
    model, x = mlp
    with torch.no_grad():
        expected = model(x).numpy()
    executable, report = compile_relax(_relax_module(model, x), _target(), fast_math=fast_math)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    result = vm["main"](tvm.runtime.tensor(x.numpy()))
    got = (result if hasattr(result, "numpy") else result[0]).numpy()
    rel_l2 = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert rel_l2 < 1e-4, rel_l2

    schedules = report["schedules"]
    counts = schedules["scheduled_by_rule"]
    assert counts["TiledMatmul"] >= 3  # the conv and at least two dense layers
    assert sum(counts.values()) >= 4
    assert schedules["unscheduled"] == len(schedules["unscheduled_funcs"])
    assert report["fast_math"] is fast_math


def test_unmatched_kernels_are_reported(mlp: tuple[torch.nn.Module, torch.Tensor]) -> None:
    model, x = mlp
    target = _target()
    with target:
        mod = tvm.transform.Sequential(cpu.library_dispatch_passes(target) + cpu.legalize_passes(target))(
            _relax_module(model, x)
        )
        n_funcs = sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items())
        _, report = apply_default_schedules(mod, rules=[("Injective", Injective())])
    # Only the injective rule: every matmul / conv / softmax kernel must show up as unscheduled.
    assert report["unscheduled"] >= 3
    assert any("matmul" in name or "conv" in name for name in report["unscheduled_funcs"])
    assert report["scheduled_by_rule"]["Injective"] + report["unscheduled"] == n_funcs


class _Cnn(torch.nn.Module):
    """ResNet-style pieces: a strided stem, max pooling, a stride-2 block with a 1x1 projection."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 7, 2, 3)
        self.conv1 = torch.nn.Conv2d(16, 32, 3, 2, 1)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, 1, 1)
        self.skip = torch.nn.Conv2d(16, 32, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, 1)
        return torch.relu(self.conv2(torch.relu(self.conv1(y))) + self.skip(y))


def test_cnn_convs_and_pooling_are_scheduled_in_nhwc() -> None:
    torch.manual_seed(0)
    model, x = _Cnn().eval(), torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(x).numpy()
    executable, report = compile_relax(_relax_module(model, x), _target(), fast_math=True)
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    got = (result if hasattr(result, "numpy") else result[0]).numpy()
    assert got.shape == expected.shape  # the layout change is undone at the graph's output
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-4
    counts = report["schedules"]["scheduled_by_rule"]
    assert counts["TiledMatmul"] >= 4  # stem, conv1, conv2 (+ residual add), skip
    assert counts["WindowReduction"] == 1  # the max pooling
    assert report["conv_layout"] == "NHWC"
    assert report["schedules"]["unscheduled_funcs"] == []


def test_a_graph_nhwc_cannot_carry_builds_in_its_source_layout_and_says_why() -> None:
    """ShuffleNet's channel shuffle (a 5-D reshape) is beyond Relax's ConvertLayout to NHWC."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    from tests.conftest import ONNX_LIGHT

    mod = from_onnx(onnx.load(str(ONNX_LIGHT / "light_shufflenet.onnx")))
    executable, report = compile_relax(mod, _target(), fast_math=True)
    assert executable is not None
    assert report["conv_layout"] == "source"
    assert "layout" in report["conv_layout_fallback"].lower()


class _Norms(torch.nn.Module):
    """A residual add + layer_norm and a softmax over rows of 64 (lane-divisible)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(64)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.ln(x + r) * 3.0, dim=-1)


def test_row_reductions_are_vectorized_and_keep_numerics() -> None:
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    model, x, r = _Norms().eval(), torch.randn(2, 24, 64), torch.randn(2, 24, 64)
    with torch.no_grad():
        expected = model(x, r).numpy()
    mod = from_exported_program(torch.export.export(model, (x, r)), keep_params_as_input=False)
    executable, report = compile_relax(mod, _target(), fast_math=True)
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](*(tvm.runtime.tensor(t.numpy()) for t in (x, r)))
    got = (result if hasattr(result, "numpy") else result[0]).numpy()
    assert np.abs(got - expected).max() < 1e-5
    counts = report["schedules"]["scheduled_by_rule"]
    assert counts["RowReduction"] >= 2  # layer_norm and softmax
    assert counts["cpu.Reduction"] == 0


@pytest.mark.parametrize(
    ("m", "k", "n", "relu", "tile"),
    [
        (64, 512, 256, False, "k_block"),  # BERT-style: K=512 > K_BLOCK gets k blocks outside the i tiles
        (37, 64, 96, True, 8),  # ViT-style token counts (patches + CLS) have no row tile that divides them:
        (13, 64, 96, True, 8),  # 8-row tiles, the last one padded
        (197, 64, 96, True, 8),
    ],
)
def test_tiled_matmul_tiles_and_keeps_numerics(m: int, k: int, n: int, relu: bool, tile: int | str) -> None:
    """TiledMatmul over a dense layer (+ bias, + ReLU): the loop the shape calls for, and the result within fp32's
    summation error bound (k * eps * sum |a||w|) of the float64 product."""
    from tvm import te

    from aotforge.targets.tvm.schedules.matmul import K_BLOCK, TiledMatmul

    a, w, bias = te.placeholder((1, m, k), name="A"), te.placeholder((k, n), name="W"), te.placeholder((n,), name="b")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((1, m, n), lambda b, i, j: te.sum(a[b, i, r] * w[r, j], axis=r), name="C")
    epilogue = (lambda x: te.max(x, 0.0)) if relu else (lambda x: x)
    d = te.compute((1, m, n), lambda b, i, j: epilogue(c[b, i, j] + bias[j]), name="D")
    target = _target()
    with target:
        sch = TiledMatmul().apply(te.create_prim_func([a, w, bias, d]), target, False)
    assert sch is not None
    extents = [int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock("C_update"))]
    assert (K_BLOCK if tile == "k_block" else tile) in extents, extents

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s, dtype=np.float32) for s in ((1, m, k), (k, n), (n,))]
    out = tvm.runtime.tensor(np.zeros((1, m, n), np.float32))
    tvm.compile(sch.mod, target=target)(*(tvm.runtime.tensor(x) for x in args), out)
    expected = args[0][0].astype(np.float64) @ args[1] + args[2]
    expected = np.maximum(expected, 0.0) if relu else expected
    bound = k * np.finfo(np.float32).eps * (np.abs(args[0][0]) @ np.abs(args[1]) + np.abs(args[2]))
    assert np.all(np.abs(out.numpy()[0] - expected) <= bound)


@pytest.mark.parametrize("shape", [(1, 12, 64), (3, 48)])
@pytest.mark.parametrize("op", ["max", "min", "sum"])
def test_whole_tensor_reductions_are_vectorized_and_exact(shape: tuple[int, ...], op: str) -> None:
    """max(x) / min(x) of dynamic quantization: no spatial axis to parallelize over."""
    from tvm import te

    from aotforge.targets.tvm.schedules.reduction import FullReduction

    x = te.placeholder(shape, name="x")
    axes = [te.reduce_axis((0, d)) for d in shape]
    y = te.compute((), lambda: getattr(te, op)(x[tuple(axes)], axis=axes), name="y")
    sch = FullReduction().apply(te.create_prim_func([x, y]), _target(), False)
    assert sch is not None
    assert "vectorized" in str(sch.mod)
    data = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    out = tvm.runtime.tensor(np.zeros((), np.float32))
    tvm.compile(sch.mod, target=_target())(tvm.runtime.tensor(data), out)
    np.testing.assert_allclose(out.numpy(), getattr(np, op)(data), rtol=1e-5)


class _Gates(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x) + torch.nn.functional.silu(2 * x)


def test_fast_math_sigmoid_and_silu_leave_no_libm_call() -> None:
    """sigmoid / SiLU -> 1 / (1 + fast_exp(-x)): vector code, saturating at +-100 without NaN."""
    from aotforge.targets.tvm.relax_util import any_call, op_name
    from aotforge.targets.tvm.rewrites.fast_gelu import fast_gelu_pass

    x = torch.cat([torch.linspace(-100, 100, 48), torch.randn(16)]).reshape(4, 16)
    mod = _relax_module(_Gates(), x)
    assert any_call(mod, lambda e: op_name(e) in ("relax.sigmoid", "relax.nn.silu"))
    assert not any_call(fast_gelu_pass()(mod), lambda e: op_name(e) in ("relax.sigmoid", "relax.nn.silu"))
    executable, _ = compile_relax(mod, _target(), fast_math=True)
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    got = (result if hasattr(result, "numpy") else result[0]).numpy()
    np.testing.assert_allclose(got, _Gates()(x).numpy(), rtol=1e-5, atol=1e-5)


class _Ffn(torch.nn.Module):
    """A ViT feed-forward block over 37 tokens (a prime row count: the rows are padded to 8-row tiles)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 96)
        self.fc2 = torch.nn.Linear(96, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.mark.parametrize("params_as_input", [False, True])
def test_constant_weights_are_packed_at_compile_time_and_keep_numerics(params_as_input: bool) -> None:
    """Constant [K, N] weights wider than one j tile are read as contiguous [N / tj, K, tj] panels, packed
    by FoldConstant at compile time; weights passed as arguments stay as they are (no per-call copy)."""
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    model, x = _Ffn().eval(), torch.randn(1, 37, 64)
    with torch.no_grad():
        expected = model(x).numpy()
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=params_as_input)
    args = [tvm.runtime.tensor(x.numpy())]
    if params_as_input:
        mod, params = relax.frontend.detach_params(mod)
        args += [tvm.runtime.tensor(p.numpy()) for p in params["main"]]
    executable, report = compile_relax(mod, _target(), fast_math=False)
    result = relax.VirtualMachine(executable, tvm.cpu())["main"](*args)
    got = (result if hasattr(result, "numpy") else result[0]).numpy()
    assert np.abs(got - expected).max() < 1e-4

    packed = report["schedules"].get("prepack_weights")
    if params_as_input:
        assert packed is None, packed
    else:
        assert packed == {"packed_weights": 2, "not_folded": []}, packed
