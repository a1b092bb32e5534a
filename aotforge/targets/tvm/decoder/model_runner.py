"""The serving runtime's runners (``runtime.runner.ModelRunner``) over a tvm step engine's functions and weights:
:class:`TvmModelRunner` over the paged functions, :class:`TvmRowsRunner` over the slot functions of artifacts built
before them."""

from __future__ import annotations

from typing import Any

import numpy as np

from aotforge.targets.paged_rows import PagedRows

#: ``step_engine.TvmStepEngine``, which makes these runners (naming the class here would be an import circle).
TvmStepEngine = Any


class _SplitPrefill:
    """A prompt through a prefill bucket (:func:`prefill_head`) and the rest through ``extend``: both runners'."""

    #: the function ``extend`` calls (artifacts built with ``--speculative-k`` have it)
    extend_function = ""

    def __init__(self, engine: TvmStepEngine, max_rows: int) -> None:
        self.engine = engine
        self.spec = engine.spec
        self.max_rows = max_rows
        self.can_extend = engine.verify_width > 0 and self.extend_function in engine._functions
        #: the smallest batch bucket that holds ``max_rows``
        self.top = next(b for b in engine.batch_buckets if b >= max_rows)

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        head = prefill_head(self.engine, len(token_ids), self.can_extend)
        logits = self._prefill(token_ids[:head], block_table)
        return self.extend(token_ids[head:], head, block_table) if head < len(token_ids) else logits

    def _prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class TvmModelRunner(_SplitPrefill):
    """The serving runtime's runner (``runtime.runner.ModelRunner``) over an engine's paged functions and weights.

    The pool is one tvm tensor ``[num_blocks, kv_heads, block_size, head_dim]`` per layer and kind. A decode of
    ``rows`` sequences calls the smallest batch bucket's ``paged_decode_<b>`` that holds them, which writes each
    row's new keys/values into its block and reads its attention through its table (``rewrites/paged_kv``). A
    prompt runs through a prompt bucket's (slot) prefill (:func:`prefill_head`), its keys/values copied into its
    blocks, and the tokens past that bucket through ``extend``;
    ``extend`` (a prompt chunk, or the rest after a cached prefix) runs ``paged_verify_1`` (artifacts built with
    ``--speculative-k``), ``verify_width`` tokens a call, the last call padded (its padding writes positions past
    the sequence, in its own last block or the scratch block, which later tokens overwrite).
    """

    extend_function = "paged_verify_1"

    def __init__(self, engine: TvmStepEngine, max_rows: int) -> None:
        super().__init__(engine, max_rows)
        self.pool: list[Any] = []
        self._views: list[np.ndarray] = []
        self.block_size = 0
        #: per bucket: its input tensors' numpy views (ids, positions, write_pos, block tables), the argument list
        self._calls: dict[int, tuple[list[np.ndarray], list[Any]]] = {}

    def allocate(self, num_blocks: int, block_size: int) -> None:
        engine, spec, tvm = self.engine, self.spec, self.engine._tvm
        shape = (num_blocks, spec.kv_heads, block_size, spec.head_dim)
        if self._views and self._views[0].shape == shape:
            # generate() makes an engine a call over the same runner: a new pool would cost the call the first
            # touch of its pages; what the last call wrote is never read (attention stops at each row's position).
            return
        self.block_size = block_size
        self.pool = [tvm.runtime.empty(shape, "float32") for _ in range(2 * spec.layers)]
        self._views = [np.from_dlpack(t) for t in self.pool]
        for view in self._views:
            view.fill(0.0)
        width = -(-spec.max_seq_len // block_size)
        self._calls = {}
        for b in (b for b in engine.batch_buckets if b <= self.top):
            inputs = [tvm.runtime.empty(s, "int64") for s in ((b, 1), (b, 1), (b,), (b, width))]
            name = f"paged_decode_{b}"
            self._calls[b] = ([np.from_dlpack(t) for t in inputs], [*inputs, *self.pool, *engine._weights[name]])

    def kv_cache_bytes(self) -> int:
        return sum(view.nbytes for view in self._views)

    def decode_rows(self, rows: int) -> int:
        return next(b for b in sorted(self._calls) if b >= rows)

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        rows = len(token_ids)
        (ids, pos, write_pos, tables), arguments = self._calls[rows]
        ids[:, 0] = token_ids
        pos[:, 0] = positions
        write_pos[:] = positions
        tables[:] = block_tables
        out = self.engine._functions[f"paged_decode_{rows}"](*arguments)
        return np.from_dlpack(out[0]).reshape(rows, -1)

    def _prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        n = len(token_ids)
        logits, present = prefill_one(self.engine, token_ids)
        bs = self.block_size
        full, rest = divmod(n, bs)
        for view, values in zip(self._views, present, strict=True):
            kv = np.from_dlpack(values)[0]  # [kv_heads, size, dim]
            view[block_table[:full]] = (
                kv[:, : full * bs].reshape(kv.shape[0], full, bs, kv.shape[2]).transpose(1, 0, 2, 3)
            )
            if rest:
                view[block_table[full], :, :rest] = kv[:, full * bs : n]
        return logits.numpy()[0]

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        engine, tvm = self.engine, self.engine._tvm
        width = engine.verify_width
        table = tvm.runtime.tensor(np.ascontiguousarray(block_table, dtype=np.int64)[None, :])
        logits = np.empty(0, dtype=np.float32)
        for at in range(0, len(token_ids), width):
            piece = token_ids[at : at + width]
            ids = np.zeros((1, width), dtype=np.int64)
            ids[0, : len(piece)] = piece
            positions = np.arange(start + at, start + at + width, dtype=np.int64)[None, :]
            arguments = [tvm.runtime.tensor(a) for a in (ids, positions, positions[:, 0].copy())]
            out = engine._functions["paged_verify_1"](*arguments, table, *self.pool, *engine._weights["paged_verify_1"])
            logits = np.from_dlpack(out[0]).reshape(width, -1)[len(piece) - 1].copy()
        return logits


#: What one token of an ``extend`` (a verify call of ``verify_width`` tokens) costs against one of a prefill bucket:
#: a verify call reads every weight for a few tokens, a prefill streams them over its whole bucket.
EXTEND_TOKEN_COST = 1.5


def prefill_head(engine: TvmStepEngine, n: int, can_extend: bool) -> int:
    """How many of a prompt's ``n`` tokens go through a prefill bucket, the rest through ``extend``: a prompt
    just past a bucket (150 tokens: 128 + 22) would otherwise compute the whole next bucket (256), mostly
    padding. The split whose padded tokens cost least, extension tokens weighted by :data:`EXTEND_TOKEN_COST`."""
    buckets, width = engine.prompt_buckets, engine.verify_width
    whole = next(b for b in buckets if b >= n)
    if not can_extend or whole == n:
        return n
    best, cost = n, float(whole)
    for head in (b for b in buckets if b < n):
        split = head + EXTEND_TOKEN_COST * width * -(-(n - head) // width)
        if split < cost:
            best, cost = head, split
    return best


def prefill_one(engine: TvmStepEngine, token_ids: np.ndarray) -> tuple[Any, list[Any]]:
    """One prompt through the smallest prefill bucket that holds it: its logits and each layer's keys / values."""
    n = len(token_ids)
    size = next(p for p in engine.prompt_buckets if p >= n)
    padded = [np.zeros((1, size), dtype=np.int64) for _ in range(3)]
    padded[0][0, :n], padded[1][0, :n], padded[2][0, :n] = token_ids, 1, np.arange(n)
    name = f"prefill_{size}"
    logits, *present = engine._functions[name](*map(engine._tvm.runtime.tensor, padded), *engine._weights[name])
    return logits, present[: 2 * engine.spec.layers]  # (a speculative build's ``hidden`` comes last)


class TvmRowsRunner(_SplitPrefill):
    """The runner of an artifact built before the paged functions: its slot functions over working rows that
    ``targets/paged_rows`` keeps in step with a pool of blocks (as the onnxruntime runner does), ``top + 1`` rows
    of ``max_seq_len`` positions besides the pool (``top``: the smallest batch bucket that holds ``max_rows``;
    the last row is ``extend``'s). A decode of ``rows`` sequences calls the smallest bucket's ``decode_<b>`` over
    views of the first rows; a prompt runs through the prefill function (its tokens past :func:`prefill_head`
    through ``extend``), ``extend`` through ``verify_1``."""

    extend_function = "verify_1"

    def __init__(self, engine: TvmStepEngine, max_rows: int) -> None:
        super().__init__(engine, max_rows)
        self.paged: PagedRows | None = None
        self._extend_rows: list[Any] = []
        self._calls: dict[int, tuple[list[np.ndarray], list[Any]]] = {}

    def allocate(self, num_blocks: int, block_size: int) -> None:
        engine, spec, tvm = self.engine, self.spec, self.engine._tvm
        shape = (self.top + 1, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        cache = [tvm.runtime.empty(shape, "float32") for _ in range(2 * spec.layers)]
        views = [np.from_dlpack(t) for t in cache]
        for view in views:
            view.fill(0.0)
        self.paged = PagedRows(num_blocks, block_size, views)
        # The kernels take no byte offset: the extend row as tensors of their own over the same memory (DLPack).
        self._extend_rows = [tvm.runtime.from_dlpack(view[self.top : self.top + 1]) for view in views]
        self._calls = {}
        for b in (b for b in engine.batch_buckets if b <= self.top):
            inputs = [tvm.runtime.empty(s, "int64") for s in ((b, 1), (b, 1), (b,))]
            rows = [t._create_view((b, *shape[1:])) for t in cache]
            self._calls[b] = ([np.from_dlpack(t) for t in inputs], [*inputs, *rows, *engine._weights[f"decode_{b}"]])

    def _rows(self) -> PagedRows:
        if self.paged is None:
            raise RuntimeError("the runner's KV pool is not allocated: call allocate(num_blocks, block_size) first")
        return self.paged

    def kv_cache_bytes(self) -> int:
        return self._rows().nbytes()

    def decode_rows(self, rows: int) -> int:
        return next(b for b in sorted(self._calls) if b >= rows)

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        paged, rows = self._rows(), len(token_ids)
        order = paged.assign(block_tables)  # sequence i runs on working row order[i]
        for i, row in enumerate(order):
            paged.load(row, block_tables[i], int(positions[i]))
        (ids, pos, write_pos), arguments = self._calls[rows]
        ids[order, 0] = token_ids
        pos[order, 0] = positions
        write_pos[order] = positions
        out = self.engine._functions[f"decode_{rows}"](*arguments)
        paged.store(order, block_tables, np.asarray(positions, dtype=np.int64))
        return np.from_dlpack(out[0]).reshape(rows, -1)[order]

    def _prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        n = len(token_ids)
        logits, present = prefill_one(self.engine, token_ids)
        self._rows().scatter([np.from_dlpack(values)[0, :, :n] for values in present], block_table, 0)
        return logits.numpy()[0]

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        engine, tvm, paged = self.engine, self.engine._tvm, self._rows()
        paged.load(self.top, block_table, start)
        width, n = engine.verify_width, len(token_ids)
        logits = np.empty(0, dtype=np.float32)
        for at in range(0, n, width):
            piece = token_ids[at : at + width]
            ids = np.zeros((1, width), dtype=np.int64)
            ids[0, : len(piece)] = piece
            positions = np.arange(start + at, start + at + width, dtype=np.int64)[None, :]
            arguments = [tvm.runtime.tensor(a) for a in (ids, positions, positions[:, 0].copy())]
            out = engine._functions["verify_1"](*arguments, *self._extend_rows, *engine._weights["verify_1"])
            logits = np.from_dlpack(out[0]).reshape(width, -1)[len(piece) - 1].copy()
        paged.scatter([rows[self.top, :, start : start + n] for rows in paged.rows], block_table, start)
        paged.record(self.top, block_table, start + n)
        return logits
