"""Run a tvm text-generation artifact: its prefill, decode and verify functions over one set of weights.

``tvm_weights.data`` is read once into tvm tensors that every function call shares. Each call of
``generate`` allocates the cache once (per layer and kind, ``[slots, kv_heads, max_seq_len, head_dim]`` for
the smallest batch bucket that holds it); prompts run one row at a time through the smallest prompt bucket
that holds them (right-padded, mask 0), their keys / values copied into their slots; every decode step
passes the same cache tensors, which the function updates in place and returns (``cache_pointers`` lets a
test check that they never move).

A decode or verify call is small (tens of microseconds for a draft model), so its inputs are tvm tensors made
in ``start`` that each call refills through numpy views, its arguments one list made there too, and its logits
come back as a view of the function's output: ``tvm.runtime.tensor`` of a numpy array took ~15 us a call,
``.numpy()`` ~6 us and unpacking the returned tuple ~4 us (the 2-layer draft's whole VM call: ~18 us).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import CompileError, describe
from aotforge.targets.huge_pages import HugePageReport
from aotforge.targets.paged_rows import PagedRows
from aotforge.targets.tvm.decoder.graphs import WeightRef
from aotforge.targets.tvm.decoder.weight_file import read_weights
from aotforge.targets.tvm.threads import fix_thread_count

LIBRARY = "lib.so"
#: Which function takes which weights, and the buckets (written by ``engine.compile_generative``).
INFO_FILE = "tvm_generative.json"


class TvmStepEngine:
    def __init__(self, artifact_dir: Path, spec: DecoderSpec) -> None:
        import tvm
        from tvm import relax

        fix_thread_count()  # before any kernel runs: each parallel launch would read sysfs otherwise
        self._tvm = tvm
        self.spec = spec
        info = json.loads((artifact_dir / INFO_FILE).read_text())
        self.prompt_buckets = tuple(info["prompt_buckets"])
        self.batch_buckets = tuple(info["batch_buckets"])
        self.verify_width = int(info.get("verify_width", 0))
        #: the functions over a paged KV cache are there (``paged_<name>``; artifacts built before have none)
        self.paged = bool(info.get("paged", False))
        try:
            vm = relax.VirtualMachine(tvm.runtime.load_module(str(artifact_dir / LIBRARY)), tvm.cpu())
        except Exception as e:
            raise CompileError(f"tvm cannot load {artifact_dir / LIBRARY}: {describe(e, last=True)}") from e
        refs = [WeightRef.from_dict(w) for w in info["weights"].values()]
        #: What the kernel granted of the weights' huge pages (``weight_file.read_weights``).
        self.huge_pages = HugePageReport()
        weights = read_weights(artifact_dir, refs, bool(info.get("huge_pages", True)), self.huge_pages)
        self.vm = vm  # tools/tvm_decode_profile.py sets its instrument
        self._functions = {name: vm[name] for name in info["functions"]}
        self._weights = {name: [weights[w] for w in names] for name, names in info["functions"].items()}
        self.weights = weights
        self.cache: list[Any] = []
        self._views: list[np.ndarray] = []
        self._last: Any = ()  # the last decode / verify call's outputs (logits, then the cache)
        self._slots = 0
        #: per step function (decode, verify): its input tensors' numpy views and its whole argument list
        self._steps: dict[str, tuple[list[np.ndarray], list[Any]]] = {}

    def start(self, batch: int, prompt_len: int) -> None:
        spec = self.spec
        self._slots = next(b for b in self.batch_buckets if b >= batch)
        shape = (self._slots, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        # Zeroed once per call: positions a slot has not written are masked, never read as garbage.
        self.cache = [self._tvm.runtime.empty(shape, "float32") for _ in range(2 * spec.layers)]
        self._views = [np.from_dlpack(t) for t in self.cache]
        for view in self._views:
            view.fill(0.0)
        self._last = ()
        self._steps = {}
        for kind, width in (("decode", 1), ("verify", self.verify_width)):
            name = f"{kind}_{self._slots}"
            if name in self._functions:  # ids [slots, width], their positions [slots, width], write_pos [slots]
                inputs = [self._tvm.runtime.empty(s, "int64") for s in ((self._slots, width),) * 2 + ((self._slots,),)]
                self._steps[kind] = ([np.from_dlpack(t) for t in inputs], [*inputs, *self.cache, *self._weights[name]])

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        rows = []
        for row in range(input_ids.shape[0]):
            real = np.flatnonzero(attention_mask[row])
            used = int(real[-1]) + 1 if real.size else 1
            rows.append(
                self._prefill_row(row, input_ids[row, :used], attention_mask[row, :used], position_ids[row, :used])
            )
        return np.stack(rows)

    def _prefill_row(self, row: int, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        size = next(p for p in self.prompt_buckets if p >= ids.shape[0])
        used = ids.shape[0]
        padded = [np.zeros((1, size), dtype=np.int64) for _ in range(3)]
        for buffer, values in zip(padded, (ids, mask, positions), strict=True):
            buffer[0, :used] = values
        name = f"prefill_{size}"
        logits, *present = self._functions[name](*map(self._tvm.runtime.tensor, padded), *self._weights[name])
        for view, values in zip(self._views, present, strict=True):
            view[row, :, :used] = np.from_dlpack(values)[0, :, :used]
        return logits.numpy()[0]

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        batch = input_ids.shape[0]
        return self._step("decode", input_ids.reshape(batch, 1), write_pos)[:batch]

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """``[batch, w]`` tokens at ``write_pos ..`` -> ``logits [batch, w, vocab]``: the function takes
        ``verify_width`` tokens, so a shorter call is padded (its padding writes positions nobody reads
        before they are written again; ``verify_positions``)."""
        batch, width = input_ids.shape
        return self._step("verify", input_ids, write_pos)[:batch, :width]

    def _step(self, kind: str, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """Fill the ``kind`` function's input tensors (rows past ``batch`` and columns past ``width``: token 0 at
        position 0) and call it; its logits, all ``slots`` rows."""
        (ids, positions, pos), arguments = self._steps[kind]
        batch, width = input_ids.shape
        ids.fill(0)
        pos.fill(0)
        ids[:batch, :width], pos[:batch] = input_ids, write_pos
        np.add(pos[:, None], np.arange(ids.shape[1], dtype=np.int64), out=positions)
        self._last = self._functions[f"{kind}_{self._slots}"](*arguments)
        # A view, not a copy: the logits are this call's own output tensor, which the view keeps alive.
        return np.from_dlpack(self._last[0])

    def verify_positions(self, width: int) -> int:
        return self.verify_width

    def model_runner(self, max_rows: int) -> TvmModelRunner | TvmRowsRunner:
        """The serving runtime's runner over these functions and weights, with a paged cache of its own (an
        artifact built before the paged functions: its slot functions over rows kept in step with the pool)."""
        return TvmModelRunner(self, max_rows) if self.paged else TvmRowsRunner(self, max_rows)

    def cache_pointers(self) -> list[int]:
        """Where the last decode step's ``present_*`` outputs live (the cache, if it was updated in place)."""
        return [t.data_ptr() for t in list(self._last)[1:]]

    def buffer_pointers(self) -> list[int]:
        return [t.data_ptr() for t in self.cache]


class TvmModelRunner:
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

    def __init__(self, engine: TvmStepEngine, max_rows: int) -> None:
        self.engine = engine
        self.spec = engine.spec
        self.max_rows = max_rows
        self.can_extend = engine.verify_width > 0 and "paged_verify_1" in engine._functions
        self.top = next(b for b in engine.batch_buckets if b >= max_rows)
        self.pool: list[Any] = []
        self._views: list[np.ndarray] = []
        self.block_size = 0
        #: per bucket: its input tensors' numpy views (ids, positions, write_pos, block tables), the argument list
        self._calls: dict[int, tuple[list[np.ndarray], list[Any]]] = {}

    def allocate(self, num_blocks: int, block_size: int) -> None:
        engine, spec, tvm = self.engine, self.spec, self.engine._tvm
        self.block_size = block_size
        shape = (num_blocks, spec.kv_heads, block_size, spec.head_dim)
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

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        head = prefill_head(self.engine, len(token_ids), self.can_extend)
        logits = self._prefill(token_ids[:head], block_table)
        return self.extend(token_ids[head:], head, block_table) if head < len(token_ids) else logits

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
    return logits, present


class TvmRowsRunner:
    """The runner of an artifact built before the paged functions: its slot functions over working rows that
    ``targets/paged_rows`` keeps in step with a pool of blocks (as the onnxruntime runner does), ``top + 1`` rows
    of ``max_seq_len`` positions besides the pool (``top``: the smallest batch bucket that holds ``max_rows``;
    the last row is ``extend``'s). A decode of ``rows`` sequences calls the smallest bucket's ``decode_<b>`` over
    views of the first rows; a prompt runs through the prefill function (its tokens past :func:`prefill_head`
    through ``extend``), ``extend`` through ``verify_1``."""

    def __init__(self, engine: TvmStepEngine, max_rows: int) -> None:
        self.engine = engine
        self.spec = engine.spec
        self.max_rows = max_rows
        self.can_extend = engine.verify_width > 0 and "verify_1" in engine._functions
        self.top = next(b for b in engine.batch_buckets if b >= max_rows)
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

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        head = prefill_head(self.engine, len(token_ids), self.can_extend)
        logits = self._prefill(token_ids[:head], block_table)
        return self.extend(token_ids[head:], head, block_table) if head < len(token_ids) else logits

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
