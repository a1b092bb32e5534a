"""int8-dynamic matmuls on AMX tiles: the kernel is exact, the rewrite picks it where the shape and the host allow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from onnx import helper

from aotforge.targets.tvm.host import AMX_MATTR, amx_usable, grant_amx
from aotforge.targets.tvm.kernels import amx_dense, vnni_dense
from aotforge.targets.tvm.options import TvmOptions, target_dict
from tests.conftest import quick_build
from tests.quant_models import relu_mlp

needs_amx = pytest.mark.skipif(not amx_usable(), reason="this host has no AMX int8 tiles (or the OS refuses them)")


@needs_amx
@pytest.mark.parametrize(("m", "k", "n"), [(32, 64, 32), (64, 192, 96), (256, 768, 64)])
def test_amx_dense_is_exact(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    za = np.array(37, np.uint8)
    colsum = w.astype(np.int32).sum(axis=0, dtype=np.int32)
    target = tvm.target.Target(target_dict(TvmOptions()))
    lib = tvm.compile(tvm.IRModule({"main": amx_dense.dense_u8s8(m, k, n)}), target=target)
    feed = (a, vnni_dense.pack_weight(w), za, colsum, amx_dense.tile_config(), np.zeros((m, n), np.int32))
    args = [tvm.runtime.tensor(x) for x in feed]
    lib["main"](*args)
    expected = a.astype(np.int32) @ w.astype(np.int32) - 37 * colsum
    np.testing.assert_array_equal(args[-1].numpy(), expected)


def test_shapes_the_kernel_cannot_take_say_why() -> None:
    assert amx_dense.supports(256, 768, 3072) == ""
    assert "K=96" in amx_dense.supports(64, 96, 32)
    assert "N=48" in amx_dense.supports(64, 64, 48)
    assert "M=16" in amx_dense.supports(16, 64, 32)


def test_tile_config_is_palette_1_with_eight_16_by_64_tiles() -> None:
    cfg = amx_dense.tile_config()
    assert cfg[0] == 1 and list(cfg[16:48].view(np.uint16)) == [64] * 8 + [0] * 8
    assert list(cfg[48:64]) == [16] * 8 + [0] * 8


def test_the_kernel_leaves_the_tile_permission_to_the_process() -> None:
    """No syscall per call: the process asks once (``host.amx_usable``), the grant covers every later call."""
    assert "syscall" not in amx_dense.dense_u8s8(32, 64, 32).script()


def test_the_tile_state_is_asked_for_once_per_process() -> None:
    """``grant_amx`` asks only for a library built with AMX, and only the first time (any host: the answer is
    cached whether it is yes or no)."""
    amx_usable.cache_clear()
    grant_amx(["avx512f", "avx512vnni"])
    assert amx_usable.cache_info().misses == 0
    for _ in range(3):
        grant_amx(["amx-tile", "amx-int8", "avx512f"])
    info = amx_usable.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_a_named_mcpu_gets_no_amx() -> None:
    assert "mattr" not in target_dict(TvmOptions(mcpu="x86-64-v3"))
    assert target_dict(TvmOptions()).get("mattr") == (list(AMX_MATTR) if amx_usable() else None)


def _mlp(path: Path) -> Path:
    """x[1,40,128] -> MatMul 128x64 -> Relu -> MatMul 64x96 -> Relu -> MatMul 96x32 (K=96: VNNI, not AMX)."""
    return relu_mlp(path, 40, [(128, 64), (64, 96), (96, 32)])


@pytest.mark.parametrize(("rows", "kernel"), [(37, "amx_dense_64x64x32"), (16, "vnni_dense_16x64x32")])
def test_the_rule_takes_amx_where_the_shape_allows(rows: int, kernel: str) -> None:
    """Rewriting only (any host): 37 rows padded to 64 for the AMX kernel; 16 rows, under one block, stay on VNNI."""
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops
    from tests.int8_graphs import matmul_integer_graph

    graph = matmul_integer_graph(rows=rows)
    mod = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), keep_params_in_input=False)
    mod, report = rewrite_integer_ops(mod, amx=True)
    assert report is not None and report["amx_kernels"] == kernel.startswith("amx")
    assert kernel in [gv.name_hint for gv in mod.get_global_vars()]


@needs_amx
def test_int8_dynamic_matmuls_run_on_amx_and_match_onnxruntime(tmp_path: Path) -> None:
    from aotforge.artifacts import load

    model = _mlp(tmp_path / "mlp.onnx")
    common: dict[str, Any] = {"passes": ("O1", "int8-dynamic"), "tolerance": 0.3, "validation_samples": 1}
    on_tvm = quick_build(str(model), tmp_path / "tvm", target="tvm", **common)
    on_ort = quick_build(str(model), tmp_path / "ort", target="onnxruntime", **common)
    report = on_tvm.manifest.target.info["pipeline"]["schedules"]["int8_vnni"]
    assert report["rewritten"] == 3 and report["amx_kernels"] == 2 and report["kernels"] == 3
    x = np.random.default_rng(1).standard_normal((1, 40, 128)).astype(np.float32)
    got = load(on_tvm.path).run({"x": x})
    # The same integer arithmetic: ORT's int8 artifact is the reference, not fp32.
    expected = ort.InferenceSession(str(on_ort.path / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-5, atol=1e-5)
