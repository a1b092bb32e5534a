"""Run a tvm text-generation artifact: its prefill, decode and verify functions over one set of weights.

``tvm_weights.data`` is read once into tvm tensors that every function call shares. Each call of
``generate`` allocates the cache once (per layer and kind, ``[slots, kv_heads, max_seq_len, head_dim]`` for
the smallest batch bucket that holds it); prompts run one row at a time through the smallest prompt bucket
that holds them (right-padded, mask 0), their keys / values copied into their slots; every decode step
passes the same cache tensors, which the function updates in place and returns (``cache_pointers`` lets a
test check that they never move).

A decode or verify call is small (tens of microseconds for a draft model), so its inputs are tvm tensors made
in ``start`` that each call refills through numpy views, its arguments one list made there too, and its logits
come back as a view of the function's output: making a tvm tensor of a numpy array, ``.numpy()`` and unpacking
the returned tuple each cost about as much as a draft model's whole VM call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import CompileError, describe
from aotforge.targets.huge_pages import HugePageReport
from aotforge.targets.tvm.decoder.graphs import WeightRef
from aotforge.targets.tvm.decoder.model_runner import TvmModelRunner, TvmRowsRunner
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
        #: The LM head's input size where the prefill and verify functions return it last (``hidden``: a build
        #: with ``--speculative-k``), else 0; ``hidden()`` reads the last prefill's or verify call's.
        self.hidden_size = int(info.get("hidden_size", 0))
        self._hidden: np.ndarray = np.zeros((0, self.hidden_size), dtype=np.float32)
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
        if self.hidden_size:
            self._hidden = np.stack([hidden for _, hidden in rows if hidden is not None])
        return np.stack([logits for logits, _ in rows])

    def hidden(self) -> np.ndarray:
        """The LM head's input of the last prefill (``[batch, d]``, at each prompt's last token) or verify call
        (``[batch, w, d]``, a view of the function's output, as the logits)."""
        return self._hidden

    def _prefill_row(
        self, row: int, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One prompt's logits and (a speculative build) LM-head input at its last token; its keys / values into
        the cache's ``row``."""
        size = next(p for p in self.prompt_buckets if p >= ids.shape[0])
        used = ids.shape[0]
        padded = [np.zeros((1, size), dtype=np.int64) for _ in range(3)]
        for buffer, values in zip(padded, (ids, mask, positions), strict=True):
            buffer[0, :used] = values
        name = f"prefill_{size}"
        logits, *present = self._functions[name](*map(self._tvm.runtime.tensor, padded), *self._weights[name])
        hidden = present.pop().numpy()[0] if self.hidden_size else None
        for view, values in zip(self._views, present, strict=True):
            view[row, :, :used] = np.from_dlpack(values)[0, :, :used]
        return logits.numpy()[0], hidden

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        batch = input_ids.shape[0]
        return self._step("decode", input_ids.reshape(batch, 1), write_pos)[:batch]

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """``[batch, w]`` tokens at ``write_pos ..`` -> ``logits [batch, w, vocab]``: the function takes
        ``verify_width`` tokens, so a shorter call is padded (its padding writes positions nobody reads
        before they are written again; ``verify_positions``)."""
        batch, width = input_ids.shape
        logits = self._step("verify", input_ids, write_pos)[:batch, :width]
        if self.hidden_size:
            self._hidden = np.from_dlpack(self._last[-1])[:batch, :width]
        return logits

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
        return [t.data_ptr() for t in list(self._last)[1 : 1 + 2 * self.spec.layers]]

    def buffer_pointers(self) -> list[int]:
        return [t.data_ptr() for t in self.cache]
