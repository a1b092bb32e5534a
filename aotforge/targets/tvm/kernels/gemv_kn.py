"""``out[m, n] = sum_k x[m, k] * w[k, n]`` for a few rows ``m``: a decode step's matmul against a ``[K, N]`` weight.

A generative build passes the weights as arguments, ``[K, N]`` row-major (what a decoder's
projections are). The register-tiled matmul schedule walks a ``K x 48`` panel of ``w`` per tile:
192 bytes of every row, then a jump of a row (6 KiB on a 1536-wide projection) to the next,
a new page every row that the hardware prefetchers do not follow; and with a few rows it
has little else to do. Measured on the SmolLM-135M shape's 576 x 1536 projection, 30 weights in
turn, 2 threads: ~20 GB/s at 1 and at 4 rows, where this kernel reads 45 GB/s at 1 row and
40 at 4 (one pass over ``w`` serves all rows).

Here ``w`` is read as stored, a row at a time: the K axis is split into ``chunks`` (one per core)
that run in parallel, each streaming its contiguous block of rows; per 16-column vector of
``w`` the ``KU`` rows of a step are loaded once and used by every row of ``x`` (``m x 16`` lanes
of partial sums, the chunk's ``[m, N]`` slice of ``part`` staying in L1 / L2), and the chunks'
partial sums are added at the end.
"""

from __future__ import annotations

from typing import Any

LANES = 16
#: Rows of ``x`` the kernel serves (a decode step's batch; a prefill's prompt takes the tiled matmul).
MAX_M = 8
#: Weight rows per inner step (unrolled), the largest of these dividing a chunk's rows.
ROW_STEPS = (16, 8, 4, 2, 1)


def supports(m: int, k: int, n: int) -> str:
    """Why the kernel cannot take this shape ('' when it can)."""
    if m > MAX_M:
        return f"more than {MAX_M} rows"
    if n % LANES:
        return f"N not a multiple of {LANES}"
    return ""


def plan(k: int, cores: int) -> tuple[int, int]:
    """The K chunks (``cores`` when they divide K, else 1) and the rows per step."""
    chunks = cores if cores > 1 and k % cores == 0 else 1
    ku = next(u for u in ROW_STEPS if (k // chunks) % u == 0)
    return chunks, ku


def gemv_kn(m: int, k: int, n: int, cores: int, dtype: str = "float32") -> Any:
    """The scheduled PrimFunc ``(x [m, k], w [k, n]) -> out [m, n]``."""
    from tvm import s_tir, te

    chunks, ku = plan(k, cores)
    rows = k // chunks
    x = te.placeholder((m, k), dtype, name="x")
    w = te.placeholder((k, n), dtype, name="w")
    kr = te.reduce_axis((0, rows), name="kr")
    part = te.compute(
        (chunks, m, n),
        lambda p, i, j: te.sum(x[i, p * rows + kr] * w[p * rows + kr, j], axis=kr),
        name="part",
    )
    pr = te.reduce_axis((0, chunks), name="pr")
    out = te.compute((m, n), lambda i, j: te.sum(part[pr, i, j], axis=pr), name="out")
    sch = s_tir.Schedule(te.create_prim_func([x, w, out]))
    block = sch.get_sblock("part")
    p, i, j, r = sch.get_loops(block)
    ro, ri = sch.split(r, [None, ku])
    jo, jl = sch.split(j, [None, LANES])
    # Per 16 columns: KU weight vectors, each loaded once and used by the m rows.
    sch.reorder(p, ro, jo, ri, i, jl)
    if chunks > 1:
        sch.parallel(p)
    sch.vectorize(jl)
    sch.unroll(ri)
    sch.unroll(i)
    init = sch.decompose_reduction(block, ro)
    sch.vectorize(sch.split(sch.get_loops(init)[-1], [None, LANES])[1])
    final = sch.get_sblock("out")
    fi, fj, fp = sch.get_loops(final)
    fjo, fjl = sch.split(fj, [None, LANES])
    sch.reorder(fi, fjo, fp, fjl)
    sch.vectorize(fjl)
    func = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("tirx.noalias", True)
    return func.with_attr("op_pattern", 8)
