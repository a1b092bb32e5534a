"""``out[m, n] = sum_k x[m, k] * w[n, k]`` for a few rows ``m``: a matmul against a weight kept ``[N, K]``.

What a language model's head is (``Gemm(transB=1)`` against the ``[vocab, hidden]`` embedding)
when the weight is an argument: it cannot be transposed at compile time, and the generic
matmul schedule would read it a column at a time (a gather per vector lane). Here each output
row ``n`` is a dot product along ``w``'s contiguous axis: 16 lanes of partial sums per (m, n),
``ROWS`` rows of ``w`` at once so each loaded ``x`` vector is used several times, the lanes added
up at the end; blocks of rows run in parallel. It reads ``w`` once, streaming, at batch <= 8.
"""

from __future__ import annotations

from typing import Any

LANES = 16
ROWS = 4
#: Rows of ``x`` the kernel serves (accumulators: ROWS x MAX_M x 16 lanes in registers).
MAX_M = 8


def supports(m: int, k: int, n: int) -> str:
    """Why the kernel cannot take this shape ('' when it can)."""
    if m > MAX_M:
        return f"more than {MAX_M} rows"
    if k % LANES or n % ROWS:
        return f"K not a multiple of {LANES} or N not a multiple of {ROWS}"
    return ""


def gemv_nt(m: int, k: int, n: int, dtype: str = "float32") -> Any:
    """The scheduled PrimFunc ``(x [m, k], w [n, k]) -> out [m, n]``."""
    from tvm import s_tir, te

    x = te.placeholder((m, k), dtype, name="x")
    w = te.placeholder((n, k), dtype, name="w")
    ko = te.reduce_axis((0, k // LANES), name="ko")
    part = te.compute(
        (m, n, LANES),
        lambda i, j, lane: te.sum(x[i, ko * LANES + lane] * w[j, ko * LANES + lane], axis=ko),
        name="part",
    )
    lane = te.reduce_axis((0, LANES), name="lane")
    out = te.compute((m, n), lambda i, j: te.sum(part[i, j, lane], axis=lane), name="out")
    sch = s_tir.Schedule(te.create_prim_func([x, w, out]))
    block, final = sch.get_sblock("part"), sch.get_sblock("out")
    fi, fj, fl = sch.get_loops(final)
    fjo, fji = sch.split(fj, [None, ROWS])
    sch.reorder(fjo, fl, fji, fi)  # the lanes' sums: ROWS x m independent chains, unrolled
    for loop in (fl, fji, fi):
        sch.unroll(loop)
    sch.parallel(fjo)
    # The partial sums of ROWS rows of w (ROWS x m x 16 lanes) live in registers.
    sch.compute_at(block, fjo, preserve_unit_loops=True)
    sch.set_scope(block, 0, "local")
    i, j, ln, kr = sch.get_loops(block)[1:]
    sch.reorder(kr, j, i, ln)
    sch.vectorize(ln)
    sch.unroll(i)
    sch.unroll(j)
    init = sch.decompose_reduction(block, kr)
    sch.vectorize(sch.get_loops(init)[-1])
    return sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("op_pattern", 8)
