"""tvm on small transformer layers (ViT's 37 tokens): Q/K/V merged into one matmul, small kernels
kept on the calling thread, short odd softmax rows vectorized; all exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from aotforge.targets.tvm.pipeline import compile_relax
from aotforge.targets.tvm.relax_util import any_call, op_name
from aotforge.targets.tvm.rewrites.combine_matmuls import combine_matmuls


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
    # Sliced per projection, not split: each slice fuses into the kernel that reads it.
    assert not any_call(once, lambda e: op_name(e) == "relax.split")
    assert any_call(once, lambda e: op_name(e) == "relax.strided_slice")
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


def _run(func: Any, target: Any, *arrays: np.ndarray, out_shape: tuple[int, ...]) -> tuple[str, np.ndarray]:
    """``func`` scheduled by the default rules and run on ``arrays``: its TIR and its output."""
    from aotforge.targets.tvm.schedules import apply_default_schedules

    with target:
        mod, _ = apply_default_schedules(tvm.IRModule({"main": func}))
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32))
    tvm.compile(mod, target=target)(*(tvm.runtime.tensor(a) for a in arrays), out)
    return str(mod["main"].script()), out.numpy()


@pytest.mark.parametrize("keys", [37, 77])
def test_scores_over_keys_no_wide_vector_divides_are_padded_to_full_vectors_and_exact(keys: int) -> None:
    """Q @ K^T + mask over 37 (ViT) or 77 (CLIP text) keys: the key axis padded to a multiple of
    16 and vectorized 16 wide, where it ran scalar."""
    from tvm import te

    q, kt = te.placeholder((3, keys, 64), name="Q"), te.placeholder((3, 64, keys), name="KT")
    mask = te.placeholder((keys, keys), name="M")
    r = te.reduce_axis((0, 64), name="r")
    s = te.compute((3, keys, keys), lambda h, i, j: te.sum(q[h, i, r] * kt[h, r, j], axis=r), name="S")
    func = te.create_prim_func([q, kt, mask, te.compute(s.shape, lambda h, i, j: s[h, i, j] + mask[i, j])])
    g = np.random.default_rng(0)
    a, b = g.standard_normal((3, keys, 64)).astype(np.float32), g.standard_normal((3, 64, keys)).astype(np.float32)
    m = g.standard_normal((keys, keys)).astype(np.float32)
    script, got = _run(func, _target(), a, b, m, out_shape=(3, keys, keys))
    assert "T.vectorized(16)" in script and "T.vectorized(1)" not in script
    np.testing.assert_allclose(got, a @ b + m, rtol=1e-5, atol=1e-4)


def test_transposes_vectorize_only_the_innermost_axis_and_are_exact() -> None:
    """K^T of a 37-token head split ([37, 192] -> [3, 64, 37]): no 16-lane vector across output
    rows (a per-lane division and modulo); a contiguous elementwise op is still one fused vector loop."""
    from tvm import te

    x = te.placeholder((37, 192), name="x")
    kt = te.compute((3, 64, 37), lambda h, d, t: x[t, h * 64 + d] * 0.125, name="KT")
    data = np.random.default_rng(0).standard_normal((37, 192)).astype(np.float32)
    script, got = _run(te.create_prim_func([x, kt]), _target(), data, out_shape=(3, 64, 37))
    assert "T.vectorized" not in script
    np.testing.assert_array_equal(got, data.reshape(37, 3, 64).transpose(1, 2, 0) * np.float32(0.125))

    y = te.placeholder((64, 37), name="y")
    script, got = _run(
        te.create_prim_func([y, te.compute((64, 37), lambda i, j: y[i, j] * 2.0)]),
        _target(),
        data[:, :64].T.copy(),
        out_shape=(64, 37),
    )
    assert "T.vectorized(16)" in script  # 2368 elements in one run
    np.testing.assert_array_equal(got, data[:, :64].T * 2)


def test_row_pads_of_a_matmul_over_37_keys_copy_whole_rows_and_are_exact() -> None:
    """P @ V over 37 keys ([3, 37, 37] x [3, 37, 64]): the rows padded to 8-row tiles and the output
    cut back are copied a row at a time (one 37-lane vector), not as one fused vector loop whose
    lanes each divide by the row length to find their row (70% of the kernel's time)."""
    from tvm import te

    p, v = te.placeholder((3, 37, 37), name="P"), te.placeholder((3, 37, 64), name="V")
    r = te.reduce_axis((0, 37), name="r")
    out = te.compute((3, 37, 64), lambda h, i, j: te.sum(p[h, i, r] * v[h, r, j], axis=r), name="O")
    g = np.random.default_rng(0)
    a, b = g.standard_normal((3, 37, 37)).astype(np.float32), g.standard_normal((3, 37, 64)).astype(np.float32)
    script, got = _run(te.create_prim_func([p, v, out]), _target(), a, b, out_shape=(3, 37, 64))
    assert "T.vectorized(37)" in script
    assert "% T.int64(1480)" not in script and "// T.int64(2368)" not in script  # no per-lane row index
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
