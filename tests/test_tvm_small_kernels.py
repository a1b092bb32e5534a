"""tvm on small transformer layers (ViT's 37 tokens): Q/K/V merged into one matmul, small kernels
kept on the calling thread, short odd softmax rows vectorized; all exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

tvm = pytest.importorskip("tvm")

from tvm import relax  # noqa: E402

from aotforge.targets.tvm.pipeline import compile_relax  # noqa: E402
from aotforge.targets.tvm.rewrites.combine_matmuls import combine_matmuls  # noqa: E402


def _target() -> Any:
    return tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2})


class _Projections(torch.nn.Module):
    """Q, K, V of one input (with bias), two bias-free projections of another, and one lone matmul."""

    def __init__(self, hidden: int, bias: bool = True) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.a, self.b = (torch.nn.Linear(hidden, 2 * hidden, bias=False) for _ in range(2))
        self.lone = torch.nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1) @ self.v(x)
        return torch.cat([scores, self.a(y) * self.b(y), self.lone(y)], dim=-1)


def _import(model: torch.nn.Module, *inputs: torch.Tensor) -> Any:
    from tvm.relax.frontend.torch import from_exported_program

    return from_exported_program(torch.export.export(model, inputs), keep_params_as_input=False)


def _inputs(tokens: int = 37, hidden: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, tokens, hidden, generator=g), torch.randn(1, tokens, hidden, generator=g)


def test_projections_of_one_input_become_one_matmul_and_stay_exact() -> None:
    torch.manual_seed(0)
    model, inputs = _Projections(32).eval(), _inputs()
    executable, report = compile_relax(_import(model, *inputs), _target(), fast_math=False)
    assert report["schedules"]["combine_matmuls"] == {"groups": 2, "branches": [3, 2]}
    out = relax.VirtualMachine(executable, tvm.cpu())["main"](*(tvm.runtime.tensor(t.numpy()) for t in inputs))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    with torch.no_grad():
        expected = model(*inputs).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_combining_skips_lone_and_non_constant_matmuls_and_is_idempotent() -> None:
    class _Lone(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (x @ y.transpose(-1, -2)) @ y  # weights that are inputs, not constants

    assert combine_matmuls(_import(_Lone(), *_inputs()))[1] is None
    once, report = combine_matmuls(_import(_Projections(32).eval(), *_inputs()))
    assert report is not None
    assert combine_matmuls(once)[1] is None


def _scheduled(func: Any, target: Any) -> str:
    from aotforge.targets.tvm.schedules import apply_default_schedules

    with target:
        mod, _ = apply_default_schedules(tvm.IRModule({"main": func}))
    return str(mod["main"].script())


def test_small_matmuls_run_on_the_calling_thread_and_big_ones_in_parallel() -> None:
    from tvm import te

    def matmul(m: int, k: int, n: int) -> Any:
        a, w = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="W")
        r = te.reduce_axis((0, k), name="k")
        return te.create_prim_func([a, w, te.compute((m, n), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r))])

    target = _target()
    assert "T.parallel" not in _scheduled(matmul(37, 192, 192), target)  # 1.4M multiply-adds
    assert "T.parallel" in _scheduled(matmul(128, 384, 1536), target)


def test_short_odd_softmax_rows_are_vectorized_and_exact() -> None:
    from tvm import te, topi

    x = te.placeholder((3, 37, 37), name="x")
    target = _target()
    with target:
        from aotforge.targets.tvm.schedules import apply_default_schedules

        mod, report = apply_default_schedules(tvm.IRModule({"main": te.create_prim_func([x, topi.nn.softmax(x)])}))
    assert report["scheduled_by_rule"]["RowReduction"] == 1
    assert "T.vectorized(37)" in str(mod["main"].script())
    data = np.random.default_rng(0).standard_normal((3, 37, 37)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros_like(data))
    tvm.compile(mod, target=target)(tvm.runtime.tensor(data), out)
    e = np.exp(data - data.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
