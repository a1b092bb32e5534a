"""fp32 matmuls on a generative build's weight arguments -> one packed panel copy (``rewrites/panel_weights``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


def _module(rows: int, k: int, widths: tuple[int, ...]) -> Any:
    """``main(x [rows, k], w0 [k, n0], ...) -> (x @ w0, ...)``: siblings (one input)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    ws = [relax.Var(f"w{i}", relax.TensorType((k, n), "float32")) for i, n in enumerate(widths)]
    with bb.function("main", [x, *ws], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit_output(relax.Tuple([bb.emit(relax.op.matmul(x, w)) for w in ws]))
        bb.emit_func_output(y)
    return bb.get()


def _run(mod: Any, inputs: list[np.ndarray], function: str = "main") -> list[np.ndarray]:
    import tvm
    from tvm import relax

    from aotforge.targets.tvm.options import TvmOptions, target_dict
    from aotforge.targets.tvm.pipeline import compile_relax

    target = tvm.target.Target(target_dict(TvmOptions()))
    executable, _ = compile_relax(mod, target, fast_math=False)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm[function](*map(tvm.runtime.tensor, inputs))
    return [o.numpy() for o in out] if isinstance(out, tvm.ir.Array | list | tuple) else [out.numpy()]


@pytest.mark.parametrize(("rows", "widths"), [(1, (48, 16, 16)), (13, (40, 20)), (4, (96,))])
def test_siblings_packed_into_one_call_and_sliced_back(rows: int, widths: tuple[int, ...]) -> None:
    """Q/K/V-like siblings become one packed weight and one kernel call; an N off 16 lanes is padded with
    zero columns, 13 rows (no tile from 4 to 8) with zero rows; the outputs equal x @ w."""
    from aotforge.targets.tvm.kernels.panel_matmul import panel_width
    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    k = 24
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    weights = {f"w{i}": rng.standard_normal((k, n), dtype=np.float32) for i, n in enumerate(widths)}
    mod, packed, report = panel_matmuls(_module(rows, k, widths), weights.__getitem__)
    name = "_".join(weights) + f".p{panel_width(-(-sum(widths) // 16) * 16)}"
    assert list(packed) == [name] and report["matmuls_taken"] == len(widths)
    assert report["merged_calls"] == (1 if len(widths) > 1 else 0)
    params = [p.name for p in mod["main"].params]
    assert params == ["x", name], "the function takes the packed weight instead of the originals"
    got = _run(mod, [x, packed[name]])
    for out, w in zip(got, weights.values(), strict=True):
        np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-5)


def test_tied_head_packed_from_its_transpose_and_the_lookup_reads_it() -> None:
    """``x @ permute_dims(E)`` packs ``E``'s transpose; ``take(E, ids)`` then reads rows of those panels, so ``E``
    itself is no longer an argument (one copy of a tied embedding); the values equal the unpacked graph's."""
    from tvm import relax

    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    vocab, k = 40, 16
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 3), "int64"))
    table = relax.Var("E", relax.TensorType((vocab, k), "float32"))
    with bb.function("main", [ids, table], attrs={"num_input": 1}):
        with bb.dataflow():
            h = bb.emit(relax.op.take(table, ids, axis=0))
            y = bb.emit_output(relax.op.matmul(h, relax.op.permute_dims(table)))
        bb.emit_func_output(y)
    e = np.random.default_rng(4).standard_normal((vocab, k), dtype=np.float32)
    mod, packed, report = panel_matmuls(bb.get(), {"E": e}.__getitem__)
    assert list(packed) == ["E.t.p48"] and packed["E.t.p48"].shape == (1, k, 48)  # 40 columns padded to 48
    assert (report["matmuls_taken"], report["lookups_from_panels"]) == (1, 1)
    assert [p.name for p in mod["main"].params] == ["ids", "E.t.p48"]
    tokens = np.array([[0, 39, 7]])
    (got,) = _run(mod, [tokens, packed["E.t.p48"]])
    np.testing.assert_allclose(got, e[tokens] @ e.T, rtol=1e-5, atol=1e-5)


def test_idempotent() -> None:
    """A second run finds no weight matmul left: nothing packed, the module unchanged."""
    import tvm

    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    weights = {"w0": np.ones((16, 32), np.float32)}
    once, _, _ = panel_matmuls(_module(2, 16, (32,)), weights.__getitem__)
    twice, packed, report = panel_matmuls(once, weights.__getitem__)
    assert packed == {} and report["matmuls_taken"] == 0
    tvm.ir.assert_structural_equal(once, twice)


def test_every_function_reads_one_packed_copy_and_skips_say_why() -> None:
    """Two functions (a prefill- and a decode-like row count) over one weight: one packed array, each function
    taking it as its own argument and calling its own kernel; a matmul of two activations is left, counted."""
    from tvm import relax

    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    k, n = 16, 32
    bb = relax.BlockBuilder()
    for name, rows in (("prefill", 8), ("decode", 1)):
        x = relax.Var("x", relax.TensorType((rows, k), "float32"))
        other = relax.Var("other", relax.TensorType((k, n), "float32"))
        w = relax.Var("w0", relax.TensorType((k, n), "float32"))
        with bb.function(name, [x, other, w], attrs={"num_input": 2}):
            with bb.dataflow():
                y = bb.emit(relax.op.matmul(x, w))
                doubled = bb.emit(relax.op.add(other, other))  # a computed right operand: no weight
                z = bb.emit_output(relax.op.add(y, bb.emit(relax.op.matmul(x, doubled))))
            bb.emit_func_output(z)
    weight = np.random.default_rng(6).standard_normal((k, n), dtype=np.float32)
    mod, packed, report = panel_matmuls(bb.get(), {"w0": weight}.__getitem__)
    assert list(packed) == ["w0.p32"] and report["matmuls_taken"] == 2
    assert report["matmuls_skipped"] == {"the right operand is not a weight argument": 2}
    for name in ("prefill", "decode"):
        assert [p.name for p in mod[name].params] == ["x", "other", "w0.p32"]
    assert {gv.name_hint for gv in mod.get_global_vars()} >= {"panel_matmul_8x16x32", "panel_matmul_1x16x32"}
    rng = np.random.default_rng(7)
    x, other = rng.standard_normal((1, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    (got,) = _run(mod, [x, other, packed["w0.p32"]], function="decode")
    np.testing.assert_allclose(got, x @ weight + x @ (2 * other), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [16, 4, 1])
def test_residual_added_inside_the_kernel(rows: int) -> None:
    """``y + x @ w`` (through a reshape, as a decoder layer's residual) is one adding panel call over a prompt's
    rows and a decode step's few (their runs of K summed first); a broadcast add keeps the plain kernel and a
    separate add; values equal."""
    from tvm import relax

    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    k, n = 32, 48
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, k), "float32"))
    y = relax.Var("y", relax.TensorType((1, rows, n), "float32"))
    bias = relax.Var("bias", relax.TensorType((n,), "float32"))
    w0, w1 = relax.Var("w0", relax.TensorType((k, n), "float32")), relax.Var("w1", relax.TensorType((n, n), "float32"))
    with bb.function("main", [x, y, bias, w0, w1], attrs={"num_input": 3}):
        with bb.dataflow():
            residual = bb.emit(relax.op.add(y, bb.emit(relax.op.matmul(x, w0))))
            broadcast = bb.emit(relax.op.add(bb.emit(relax.op.matmul(residual, w1)), bias))
            out = bb.emit_output(broadcast)
        bb.emit_func_output(out)
    rng = np.random.default_rng(8)
    weights = {"w0": rng.standard_normal((k, n), dtype=np.float32), "w1": rng.standard_normal((n, n), dtype=np.float32)}
    mod, packed, report = panel_matmuls(bb.get(), weights.__getitem__)
    assert report["residuals_added_in_kernel"] == 1
    mod = relax.transform.DeadCodeElimination()(mod)
    names = {gv.name_hint for gv in mod.get_global_vars()}
    assert f"panel_matmul_add_{rows}x{k}x{n}" in names and f"panel_matmul_add_{rows}x{n}x{n}" not in names
    xv, yv, bv = (rng.standard_normal(s, dtype=np.float32) for s in ((1, rows, k), (1, rows, n), (n,)))
    (got,) = _run(mod, [xv, yv, bv, packed["w0.p48"], packed["w1.p48"]])
    want = (yv + xv @ weights["w0"]) @ weights["w1"] + bv
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _swiglu(rows: int, k: int, f: int, *, gate_read_again: bool = False) -> Any:
    """``main(x [1, rows, k], wg, wu) -> silu(x @ wg) * (x @ wu)`` as the ONNX import writes SwiGLU (sigmoid, two
    multiplies); with ``gate_read_again``, the gate's product is an output too."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, k), "float32"))
    wg, wu = (relax.Var(name, relax.TensorType((k, f), "float32")) for name in ("wg", "wu"))
    with bb.function("main", [x, wg, wu], attrs={"num_input": 1}):
        with bb.dataflow():
            g, u = bb.emit(relax.op.matmul(x, wg)), bb.emit(relax.op.matmul(x, wu))
            gated = bb.emit(relax.op.multiply(u, bb.emit(relax.op.multiply(g, bb.emit(relax.op.sigmoid(g))))))
            out = bb.emit_output(relax.Tuple([gated, g]) if gate_read_again else gated)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(("rows", "f", "fast_math"), [(16, 96, True), (13, 64, False), (4, 48, True), (1, 96, True)])
def test_swiglu_gated_inside_the_gate_up_call(rows: int, f: int, fast_math: bool) -> None:
    """``silu(x @ G) * (x @ U)`` over the packed gate / up pair is one gated call on a copy packed panel by panel
    (``.g<tj>``, the side-by-side pair dropped); a prompt's padded rows are sliced off; values equal numpy's."""
    from tvm import relax

    from aotforge.targets.tvm.kernels.panel_matmul import pack_gated, panel_width
    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    k = 32
    rng = np.random.default_rng(9)
    weights = {name: rng.standard_normal((k, f), dtype=np.float32) for name in ("wg", "wu")}
    mod, packed, report = panel_matmuls(_swiglu(rows, k, f), weights.__getitem__, fast_math=fast_math)
    tj = panel_width(2 * f)
    assert report["gates_in_kernel"] == 1 and list(packed) == [f"wg_wu.g{tj}"]
    np.testing.assert_array_equal(packed[f"wg_wu.g{tj}"], pack_gated(weights["wg"], weights["wu"], tj))
    mod = relax.transform.DeadCodeElimination()(mod)
    names = {gv.name_hint for gv in mod.get_global_vars()}
    assert any(name.startswith("panel_matmul_gate_") for name in names)
    assert not any(name.startswith("fused") or name == "sigmoid" for name in names)
    x = rng.standard_normal((1, rows, k), dtype=np.float32)
    (got,) = _run(mod, [x, packed[f"wg_wu.g{tj}"]])
    g = x @ weights["wg"]
    np.testing.assert_allclose(got, g / (1 + np.exp(-g)) * (x @ weights["wu"]), rtol=1e-4, atol=1e-4)


def test_swiglu_left_alone_when_the_gate_is_read_again() -> None:
    """A gate product something else reads stays a separate SiLU over the side-by-side pair."""
    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    weights = {name: np.ones((16, 32), np.float32) for name in ("wg", "wu")}
    _, packed, report = panel_matmuls(_swiglu(8, 16, 32, gate_read_again=True), weights.__getitem__)
    assert report["gates_in_kernel"] == 0 and list(packed) == ["wg_wu.p32"]


@pytest.mark.parametrize(("m", "k", "f", "few"), [(1, 64, 48, "WHOLE"), (4, 96, 24, "SPLIT"), (12, 40, 96, "WHOLE")])
def test_gated_and_adding_kernels_are_exact(m: int, k: int, f: int, few: str) -> None:
    """The panel kernel's epilogues against numpy: ``silu(x @ G) * (x @ U)`` on ``pack_gated`` panels (both
    sigmoids; half panels of 24 and 16 columns) and ``x @ w + y`` (a decode step's runs of K summed first)."""
    import tvm

    from aotforge.targets.tvm.kernels.panel_matmul import FewRows, Gate, pack, pack_gated, panel_matmul, panel_width
    from aotforge.targets.tvm.options import TvmOptions, target_dict

    target = tvm.target.Target(target_dict(TvmOptions()))
    rng = np.random.default_rng(10)
    x, wg, wu = (rng.standard_normal(s, dtype=np.float32) for s in ((m, k), (k, f), (k, f)))
    n, y = 2 * f, rng.standard_normal((m, 2 * f), dtype=np.float32)
    g = x @ wg
    for gate in (*Gate, None):
        func = panel_matmul(m, k, n, few=FewRows[few], gate=gate, add=gate is None).with_attr("global_symbol", "main")
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target).jit()
        w = pack_gated(wg, wu, panel_width(n)) if gate else pack(np.concatenate([wg, wu], axis=1), panel_width(n))
        args = [tvm.runtime.tensor(a) for a in (x, w, *([] if gate else [y]))]
        out = tvm.runtime.tensor(np.zeros((m, f if gate else n), dtype=np.float32))
        lib["main"](*args, out)
        want = g / (1 + np.exp(-g)) * (x @ wu) if gate else x @ np.concatenate([wg, wu], axis=1) + y
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
