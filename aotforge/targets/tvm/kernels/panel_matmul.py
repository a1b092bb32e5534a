"""``out[m, n] = sum_k x[m, k] * w[k, n]`` with ``w`` packed as ``[N / tj, K, tj]`` panels: any number of rows.

A generative build passes its weights as arguments, so the register-tiled schedule cannot pack them at compile time
(``schedules/weight_packing.pack_weight`` folds constants only) and reads each ``K x tj`` panel as ``tj`` columns
at the row stride of N, which the prefetchers cannot stream. Here the weight is stored packed (``pack``, at build
time, ``rewrites/panel_weights``): each panel is one contiguous run, which the hardware prefetchers stream, and one
kernel serves every row count:

- the j panels (outer) and the tiles of ``mt`` rows (inner) are fused and run in parallel, so a
  panel stays in L2 while the row tiles of a long prompt pass over it;
- per row tile, an ``mt x tj`` accumulator in registers (up to 8 x 48 = 24 zmm) over all of K:
  each ``k`` loads ``tj / 16`` weight vectors and broadcasts ``mt`` values of ``x``; at a decode
  step's 1-8 rows every weight byte is read once for all rows, from memory, as it is stored.

How a decode step's 2-8 rows tile a panel is the one choice measured to flip between hosts (``FewRows``): on Intel,
4 rows in two tiles of 2 with 4 runs of K each beat one 4-row tile with 2 runs; on AMD Zen 4 one tile with one run
won (below; figures: docs/benchmarks.md). No ISA flag or cache size tells the two apart: the difference is in how
each core streams memory (not established further: on Intel more sequential runs in flight helped a core's
bandwidth, on Zen 4 one run is streamed as fast and the extra runs and tiles cost time), so the choice follows the
target's CPU family, its LLVM ``mcpu``, which the build records (a build for another ``mcpu`` tiles for that one);
a family not measured keeps the Intel tiling.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

LANES = 16
#: Panel widths, widest first: 3 x 16 lanes fill AVX-512's 32 registers at 8 rows (24 accumulators).
PANEL_WIDTHS = (48, 32, 16)
TILE_M = 8
#: TVM keeps a kernel's buffer on the stack (so LLVM can hold it in registers) below 1 KiB.
STACK_BYTES = 1024


class FewRows(enum.Enum):
    """How 2-8 rows (a decode or verify step) tile a panel; one row always reads it as up to 4 runs of K."""

    #: tiles of 2 rows (the second reads the panel from L2), each panel as up to 4 runs side by side (Intel)
    SPLIT = "2-row tiles, up to 4 runs"
    #: all the rows in one tile and one sequential run of K (AMD Zen: LLVM's ``znver*``)
    WHOLE = "one tile, one run"


class Gate(enum.Enum):
    """How a gated panel call (SwiGLU's ``silu(x @ G) * (x @ U)``) computes the sigmoid: as the graph's own
    sigmoid would have been compiled (``fast`` math: ``rewrites/fast_gelu``'s ``1 / (1 + fast_exp(-g))``)."""

    FAST_SIGMOID = "1 / (1 + fast_exp(-g))"
    SIGMOID = "sigmoid(g)"

    def silu(self, g: Any) -> Any:
        """``g * sigmoid(g)`` of the tensor ``g``, in the graph's order of operations."""
        from tvm import te, topi

        if self is Gate.SIGMOID:
            sigmoid = topi.sigmoid(g)
        else:
            e = topi.fast_exp(topi.negative(g))
            sigmoid = te.compute(e.shape, lambda *i: 1.0 / (1.0 + e(*i)), name="sigmoid")
        return topi.multiply(g, sigmoid)


def few_rows(mcpu: str) -> FewRows:
    """The tiling measured fastest on the family of LLVM CPU ``mcpu`` (``SPLIT`` where none was measured)."""
    return FewRows.WHOLE if mcpu.startswith("znver") else FewRows.SPLIT


def panel_width(n: int) -> int:
    """The widest panel that divides ``n`` (a multiple of 16)."""
    return next(t for t in PANEL_WIDTHS if n % t == 0)


def row_tile(m: int) -> int:
    """The rows per tile: all of a few rows, else the largest divisor of ``m`` up to 8."""
    return next(t for t in range(min(m, TILE_M), 0, -1) if m % t == 0)


def padded_rows(m: int) -> int:
    """``m``, or the next multiple of 8 when no divisor from 4 to 8 tiles it (a prime prompt bucket)."""
    return m if m <= TILE_M or row_tile(m) >= TILE_M // 2 else -(-m // TILE_M) * TILE_M


def supports(k: int, n: int) -> str:
    """Why the kernel cannot take a ``[K, N]`` weight ('' when it can)."""
    return "" if n % LANES == 0 else f"N={n} is not a multiple of {LANES}"


def pack(w_kn: np.ndarray, tj: int) -> np.ndarray:
    """``[K, N]`` -> ``[N / tj, K, tj]``: panel ``p`` holds columns ``p * tj ..`` of every row, contiguous."""
    k, n = w_kn.shape
    return np.ascontiguousarray(w_kn.reshape(k, n // tj, tj).transpose(1, 0, 2))


def pack_gated(gate_kn: np.ndarray, up_kn: np.ndarray, tj: int) -> np.ndarray:
    """Two ``[K, F]`` weights -> ``[2F / tj, K, tj]``: panel ``p`` holds columns ``p * tj/2 ..`` of ``gate`` then
    the same columns of ``up`` (what ``panel_matmul(..., gate=...)`` reads; ``tj / 2`` divides ``F``)."""
    k, f = gate_kn.shape
    half = tj // 2
    both = np.stack([gate_kn.reshape(k, f // half, half), up_kn.reshape(k, f // half, half)], axis=2)
    return pack(both.reshape(k, 2 * f), tj)


def tiles(m: int, k: int, tj: int, few: FewRows = FewRows.SPLIT) -> tuple[int, int]:
    """Rows per tile and runs of K per task: a prompt's 8-row tiles over whole panels; one row as up to 4 runs
    side by side; 2-8 rows as ``few`` says (accumulators: 24 at most)."""
    if m > TILE_M:
        return row_tile(m), 1
    if few is FewRows.WHOLE and m > 1:
        return m, 1
    mt = (2 if m % 2 == 0 else 1) if m <= TILE_M // 2 else m
    return mt, next(s for s in (4, 2, 1) if k % s == 0 and s * mt * (tj // LANES) <= 24)


def panel_matmul(
    m: int,
    k: int,
    n: int,
    dtype: str = "float32",
    few: FewRows = FewRows.SPLIT,
    *,
    add: bool = False,
    gate: Gate | None = None,
) -> Any:
    """The scheduled PrimFunc ``(x [m, k], w [n / tj, k, tj]) -> out [m, n]``, ``tj = panel_width(n)``; with
    ``add``, ``(x, w, y [m, n]) -> x @ w + y``: a residual added as each tile leaves its registers
    (``rewrites/panel_epilogue``), not in a kernel of its own that reads both again. With ``gate``, ``w`` is
    packed by ``pack_gated`` and the call is ``(x, w) -> out [m, n / 2] = silu(x @ G) * (x @ U)``
    (``rewrites/panel_gate``): each panel holds the same ``tj / 2`` columns of ``G`` and of ``U``, so one task
    has both halves in its registers and writes the gated product once, at half the bytes of the pair.

    ``FewRows.SPLIT``: a few rows (a decode step) read each panel as up to 4 runs of K side by side, their
    partial sums added at the end, because one sequential run per thread leaves the memory system idle between
    misses (measured faster on Intel); 4 rows go as two tiles of 2, the second reading the panel from L2.

    ``FewRows.WHOLE``: the rows in one tile with fewer runs, which measured faster on AMD Zen 4, where SPLIT's
    second pass over the panel costs more than the runs gain; one row keeps its 4 runs.
    Figures: docs/benchmarks.md (make bench-generation)."""
    from tvm import s_tir, te

    tj = panel_width(n)
    mt, runs = tiles(m, k, tj, few)
    if add and gate is not None:
        raise ValueError("panel_matmul: a gated product takes no added input")
    ks = k // runs
    x = te.placeholder((m, k), dtype, name="x")
    w = te.placeholder((n // tj, k, tj), dtype, name="w")
    r = te.reduce_axis((0, ks), name="r")
    part = te.compute(
        (runs, m, n),
        lambda s, i, j: te.sum(x[i, s * ks + r] * w[j // tj, s * ks + r, j % tj], axis=r),
        name="part",
    )
    half = tj // 2
    sch = s_tir.Schedule(te.create_prim_func(_epilogue(x, w, part, add, gate)))
    for block in sch.get_child_blocks(sch.get_sblock("root")):  # a gate's sums and sigmoid, into out
        if sch.get(block).name_hint not in ("part", "out"):
            sch.compute_inline(block)
    final, block = sch.get_sblock("out"), sch.get_sblock("part")
    i, j, *fs = sch.get_loops(final)
    jo, ji = sch.split(j, [None, half if gate is not None else tj])
    io, ii = sch.split(i, [None, mt])
    sch.reorder(jo, io, *fs, ii, ji)
    tasks = sch.fuse(jo, io)
    if (n // tj) * (m // mt) > 1:
        sch.parallel(tasks)
    if (half if gate is not None else tj) % LANES:  # a gated half panel of 24 or 8: one vector, LLVM splits it
        sch.vectorize(ji)
    else:
        sch.vectorize(sch.split(sch.get_loops(final)[-1], [None, LANES])[1])
    # The runs x rows x tj partial sums of a task: registers (on the stack below 1 KiB, so LLVM can).
    sch.compute_at(block, tasks, preserve_unit_loops=True)
    sch.set_scope(block, 0, "global" if runs * mt * tj * 4 < STACK_BYTES else "local")
    s, ii, ji, kr = sch.get_loops(block)[1:]
    lanes_o, lanes = sch.split(ji, [None, LANES])
    sch.reorder(kr, s, ii, lanes_o, lanes)
    sch.vectorize(lanes)
    for loop in (lanes_o, ii, s):
        sch.unroll(loop)
    init = sch.decompose_reduction(block, kr)
    sch.vectorize(sch.split(sch.get_loops(init)[-1], [None, LANES])[1])
    func = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("tirx.noalias", True)
    return func.with_attr("op_pattern", 8)


def _epilogue(x: Any, w: Any, part: Any, add: bool, gate: Gate | None) -> list[Any]:
    """The kernel's arguments, its output last: ``out`` from the ``part`` sums (``[runs, m, n]``), each output
    element's runs added in turn (``te.sum`` over them for a plain product), plus ``y`` or gated."""
    from tvm import te

    runs, m, n = (int(d) for d in part.shape)
    tj = int(w.shape[2])
    half = tj // 2

    def summed(i: Any, c: Any) -> Any:
        return sum((part[s, i, c] for s in range(1, runs)), part[0, i, c])

    if gate is not None:  # column f of the output: G's at column f % (tj/2) of panel f // (tj/2), U's tj/2 on

        def half_of(at: int, name: str) -> Any:
            return te.compute((m, n // 2), lambda i, f: summed(i, f // half * tj + at + f % half), name=name)

        g, u = half_of(0, "g"), half_of(half, "u")
        silu = gate.silu(g)
        return [x, w, te.compute((m, n // 2), lambda i, f: silu[i, f] * u[i, f], name="out")]
    if add:  # a residual added as the sums leave the registers, written out once
        y = te.placeholder((m, n), x.dtype, name="y")
        return [x, w, y, te.compute((m, n), lambda i, j: summed(i, j) + y[i, j], name="out")]
    sr = te.reduce_axis((0, runs), name="sr")
    return [x, w, te.compute((m, n), lambda i, j: te.sum(part[sr, i, j], axis=sr), name="out")]


def panel_rows(count: int, k: int, n: int, index_dtype: str = "int64", dtype: str = "float32") -> Any:
    """The scheduled PrimFunc ``(ids [count], w [n / tj, k, tj]) -> out [count, k]``: row ``ids[i]`` of the
    ``[N, K]`` matrix whose transpose ``w`` packs (a tied embedding's lookup reading the head's panels).
    An id outside ``[0, N)`` is clamped into it (ONNX Gather leaves that undefined)."""
    from tvm import s_tir, te, tirx

    tj = panel_width(n)
    ids = te.placeholder((count,), index_dtype, name="ids")
    w = te.placeholder((n // tj, k, tj), dtype, name="w")

    def row(i: Any) -> Any:
        return tirx.max(tirx.min(ids[i], tirx.const(n - 1, index_dtype)), tirx.const(0, index_dtype))

    out = te.compute((count, k), lambda i, c: w[row(i) // tj, c, row(i) % tj], name="out")
    sch = s_tir.Schedule(te.create_prim_func([ids, w, out]))
    func = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("tirx.noalias", True)
    return func.with_attr("op_pattern", 8)
