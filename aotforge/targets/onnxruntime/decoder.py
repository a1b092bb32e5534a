"""ONNX Runtime step engine: two sessions over the shared weights, the KV cache updated in place.

The cache is one numpy array per layer and kind, wrapped once per call as an ``OrtValue`` (same
memory) and bound through I/O binding as both the decode graph's ``past_*`` input and its
``present_*`` output: GroupQueryAttention (or, in a graph exported with masked attention,
ScatterElements) writes the new token's keys/values into the very buffer it reads, so no
cache-sized tensor is allocated per token.
``cache_pointers`` lets a test check that the buffers never move.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, VERIFY_FILE, DecoderSpec
from aotforge.core.errors import CompileError, describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult, DecoderInputs, GenerativeBackend, ShardRuntime
from aotforge.targets.generative.runner import GenerativeRunner
from aotforge.targets.huge_pages import huge_pages as advise_huge_pages
from aotforge.targets.onnxruntime.model_runner import OrtModelRunner
from aotforge.targets.onnxruntime.target import SESSION_FILE, session_options, stored_options

#: Pass defaults of text-generation builds, under the user's (``--pass-opt weight-only.accuracy_level=0`` still
#: wins): MatMulNBits with int8 activations, as ONNX Runtime GenAI's builder sets for CPU, because a decode step's
#: one row is far slower with fp32 compute (an encoder's batch is not, so the pass's own default stays 0); the LM
#: head at 8 bits, as llama.cpp keeps its output layer above the rest, because int4 there costs the most quality;
#: the prompt graphs on 8-bit integer GEMM (``prompt_int8``), because a prompt's many rows run several times faster
#: through ONNX Runtime's QGEMM than through MatMulNBits, at no cost to the held-out perplexity.
#: Figures: docs/benchmarks.md (make bench-generation, make bench-serve) and the build's own validation.quality.
PASS_DEFAULTS = {"weight-only": {"accuracy_level": 4, "head_bits": 8, "prompt_int8": True}}
#: Target-option defaults of text-generation builds, under the user's (``--target-opt intra_op_spin_us=-1`` gives
#: back ORT's own): an idle intra-op thread spins 20 us, which covers the gaps between a decode step's ~300 small
#: kernels without holding a shared core the other thread needs; and the sessions' weights on transparent huge
#: pages (``targets/huge_pages.py``), because a step streams every weight and 4 KiB pages cost a TLB miss each.
#: Figures: docs/benchmarks.md (make bench-generation).
TARGET_DEFAULTS = {"intra_op_spin_us": 20, "huge_pages": True}
#: A rank's or a stage's session: one intra-op thread, the shards being the parallelism.
SHARD_DEFAULTS = {"intra_op_threads": 1}


def prepare_graphs(graphs: dict[str, Any], spec: DecoderSpec) -> dict[str, dict[str, int]]:
    """Before the build's passes (``decoder_fusions.pack_for_ort``): q/k/v and gate/up MatMuls packed, standard ops.

    Returns each graph's counts (``target.info.fusions``)."""
    from aotforge.targets.onnxruntime.decoder_fusions import pack_for_ort

    return {name.removesuffix(".onnx"): pack_for_ort(graph) for name, graph in graphs.items()}


def rewrite_graphs(graphs: dict[str, Any], spec: DecoderSpec) -> dict[str, dict[str, int]]:
    """After the passes, ONNX Runtime contrib ops in every graph (``decoder_fusions.fuse_for_ort``): RMSNorm,
    residual + RMSNorm, rotary embeddings, rotary and packed QKV into GroupQueryAttention."""
    from aotforge.targets.onnxruntime.decoder_fusions import fuse_for_ort

    return {name.removesuffix(".onnx"): fuse_for_ort(graph, spec.max_seq_len) for name, graph in graphs.items()}


def compile_generative(
    workdir: Path, spec: DecoderSpec, options: Any, say: Any, inputs: DecoderInputs = DecoderInputs()
) -> CompileResult:
    """ORT optimizes each graph when a session opens it; the artifact keeps the session settings.

    Both graphs are opened here once, so an op ORT lacks fails the build, not the serving host."""
    import onnxruntime as ort

    settings = _write_settings(workdir, options)
    # Opened only to check them: no huge pages (the load that serves does that).
    OrtStepEngine(workdir, spec, session_options(options), list(options.providers), inputs.verify_width)
    return CompileResult(
        files=(SESSION_FILE,),
        target_info={"device": "cpu", "options": settings},
        toolchain={"onnxruntime": ort.__version__},
    )


def compile_shard(shard_dir: Path, options: Any, spec: DecoderSpec, degree: int) -> CompileResult:
    """A rank's or a stage's compile: its session settings only; its sessions open in the shard processes, which
    supply the graphs' collective ops (the build's validation opens them)."""
    import importlib.metadata

    import onnxruntime as ort

    _write_settings(shard_dir, options)
    extensions = importlib.metadata.version("onnxruntime-extensions")
    versions = {"onnxruntime": ort.__version__, "onnxruntime_extensions": extensions}
    return CompileResult(files=(SESSION_FILE,), target_info={"device": "cpu"}, toolchain=versions)


def _write_settings(workdir: Path, options: Any) -> dict[str, Any]:
    """The session settings the artifact keeps (``SESSION_FILE``), which its load reads back."""
    settings = dataclasses.asdict(options)
    (workdir / SESSION_FILE).write_text(json.dumps(settings, sort_keys=True, indent=2) + "\n")
    return settings


def load_generative(artifact_dir: Path, record: TargetRecord) -> GenerativeRunner:
    options = stored_options(artifact_dir, record)
    spec = DecoderSpec.from_dict(record.info["decoder"])
    width = int(record.info.get("speculative", {}).get("verify_width", 0))
    engine = OrtStepEngine(
        artifact_dir, spec, session_options(options), list(options.providers), width, huge_pages=options.huge_pages
    )
    return GenerativeRunner(engine)


def gqa_refusal(config: Any, head_dim: int) -> str:
    """Why ORT's CPU GroupQueryAttention cannot be this model's attention ('' when it can): the kernel refuses a
    head_dim off a multiple of 8 when it runs, not when the session opens (Granite 120 wide over 6 heads). A
    sliding window and soft-capped scores (Gemma 2) it computes as transformers does (``local_window_size``,
    ``softcap``: ``slot_attention``)."""
    if head_dim % 8:
        return f"head_dim {head_dim} is not a multiple of 8 (ONNX Runtime's GroupQueryAttention needs one)"
    return ""


BACKEND = GenerativeBackend(
    compile=compile_generative,
    load=load_generative,
    # ORT's GroupQueryAttention writes each slot's new key/value into the bound cache and attends over the
    # slot's filled length only.
    decode_attention="gqa",
    decode_attention_refusal=lambda model, spec: gqa_refusal(model.config, spec.head_dim),
    speculative=True,
    prepare_graphs=prepare_graphs,
    rewrite_graphs=rewrite_graphs,
    pass_defaults=PASS_DEFAULTS,
    target_defaults=TARGET_DEFAULTS,
    finishes_onnx_bundles=True,
    tensor_parallel=ShardRuntime(
        compile_shard,
        "aotforge.targets.onnxruntime.tensor_parallel",
        ("aotforge.targets.onnxruntime.tensor_parallel",),
        sequence_parallel=True,
        target_defaults=SHARD_DEFAULTS,
    ),
    pipeline_parallel=ShardRuntime(
        compile_shard,
        "aotforge.targets.onnxruntime.pipeline_parallel",
        ("aotforge.targets.onnxruntime.pipeline_parallel",),
        target_defaults=SHARD_DEFAULTS,
    ),
)


@dataclasses.dataclass
class _VerifyCall:
    """The buffers a verify call of one width writes its inputs into and reads its logits from, and its bindings."""

    ids: np.ndarray
    positions: np.ndarray  # [batch, width]; its first column is bound as write_pos too
    logits: np.ndarray
    hidden: np.ndarray  # [batch, width, d] (an artifact whose verify graph returns ``hidden``; else [batch, width, 0])
    steps: np.ndarray  # [1, width]: 0 .. width - 1, the offsets of each token's position
    rows: list[Any] = dataclasses.field(default_factory=list)


class OrtStepEngine:
    def __init__(
        self,
        artifact_dir: Path,
        spec: DecoderSpec,
        session_options: Any,
        providers: list[str],
        verify_width: int = 0,
        huge_pages: bool = False,
    ) -> None:
        import onnxruntime as ort

        self.spec = spec
        self.verify_width = verify_width
        self.verify_session: Any = None

        def open_graph(name: str) -> Any:
            return ort.InferenceSession(str(artifact_dir / name), session_options, providers)

        try:
            with advise_huge_pages(huge_pages) as self.huge_pages:  # the weights each session prepacked
                self.prefill_session = open_graph(PREFILL_FILE)
                self.decode_session = open_graph(DECODE_FILE)
                if verify_width:
                    self.verify_session = open_graph(VERIFY_FILE)
        except Exception as e:
            raise CompileError(f"onnxruntime cannot open the prefill/decode graphs: {describe(e, last=True)}") from e
        self._past, self._present = spec.kv_names("past"), spec.kv_names("present")
        #: The LM head's input size where the prefill and verify graphs return it (``hidden``: a build with
        #: ``--speculative-k``), else 0; ``hidden()`` reads the last prefill's or verify call's.
        self.hidden_size = _hidden_size(self.verify_session)
        self._hidden: np.ndarray = np.zeros((0, self.hidden_size), dtype=np.float32)
        self.cache: list[np.ndarray] = []
        self._binding: Any = None
        self._verify_calls: dict[int, _VerifyCall] = {}
        self._logits = np.empty((0, spec.vocab), dtype=np.float32)
        self._ids = self._positions = self._write_pos = np.zeros(0, dtype=np.int64)

    def start(self, batch: int, prompt_len: int) -> None:
        import onnxruntime as ort

        spec = self.spec
        shape = (batch, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        # Zeroed once per call: positions a slot has not written yet are masked out, never read as garbage.
        if self.cache and self.cache[0].shape == shape:  # the last call's batch: its buffers and bindings serve
            for buffer in self.cache:
                buffer.fill(0.0)
            return
        self.cache = [np.zeros(shape, dtype=np.float32) for _ in self._past]
        self._logits = np.empty((batch, spec.vocab), dtype=np.float32)
        binding = self.decode_session.io_binding()
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self._logits))
        # The step's inputs too are bound once, over buffers each step writes (a bind per input per token
        # is a few microseconds each: a draft model's step is a few tens). position_ids and write_pos are
        # the same numbers: one buffer, bound as both (one write per step).
        self._ids = np.zeros((batch, 1), dtype=np.int64)
        self._positions = np.zeros((batch, 1), dtype=np.int64)
        self._write_pos = self._positions.reshape(batch)
        for name, array in (
            ("input_ids", self._ids),
            ("position_ids", self._positions),
            ("write_pos", self._write_pos),
        ):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        for past, present, buffer in zip(self._past, self._present, self.cache, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        self._binding = binding
        self._verify_calls = {}

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        names = ["logits", *self._present, *(["hidden"] if self.hidden_size else [])]
        logits, *present = self.prefill_session.run(names, feeds)
        if self.hidden_size:
            self._hidden = present.pop()
        steps = input_ids.shape[1]
        for buffer, values in zip(self.cache, present, strict=True):
            buffer[:, :, :steps] = values  # once per call: the prompt's keys/values into its slots
        return np.asarray(logits)

    def hidden(self) -> np.ndarray:
        """The LM head's input of the last prefill (``[batch, d]``, at each prompt's last token) or verify call
        (``[batch, w, d]``); a buffer of this engine, as the logits."""
        return self._hidden

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        self._ids[:] = input_ids  # [batch, 1] (np.reshape's dispatch alone costs more than the copy)
        self._write_pos[:] = write_pos  # and position_ids: the same buffer
        self.decode_session.run_with_iobinding(self._binding)
        return self._logits  # written in place by ORT

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """``[batch, w]`` tokens at ``write_pos ..`` of each slot -> ``logits [batch, w, vocab]``, a call per slot.

        The logits are a buffer of this engine, valid until the next verify call of the same width."""
        batch, width = input_ids.shape
        call = self._verify_calls.get(width) or self._bind_verify(width)
        call.ids[:batch] = input_ids
        np.add(write_pos[:, None], call.steps, out=call.positions[:batch])
        for binding in call.rows[:batch]:
            self.verify_session.run_with_iobinding(binding)
        self._hidden = call.hidden[:batch, :width]
        return call.logits[:batch]

    def _bind_verify(self, width: int) -> _VerifyCall:
        """The verify session's bindings for calls of ``width`` tokens, made on first use in a ``generate`` call.

        GroupQueryAttention takes several new tokens against a past only at batch 1: one binding per slot, over
        that slot's rows of the input buffers and of the same cache buffers (views, no copies)."""
        import onnxruntime as ort

        batch = self.cache[0].shape[0]
        call = _VerifyCall(
            ids=np.zeros((batch, width), dtype=np.int64),
            positions=np.zeros((batch, width), dtype=np.int64),
            logits=np.empty((batch, width, self.spec.vocab), dtype=np.float32),
            hidden=np.empty((batch, width, self.hidden_size), dtype=np.float32),
            steps=np.arange(width, dtype=np.int64)[None, :],
        )
        for row in range(batch):
            binding = self.verify_session.io_binding()
            for name, array in (
                ("input_ids", call.ids[row : row + 1]),
                ("position_ids", call.positions[row : row + 1]),
                ("write_pos", call.positions[row : row + 1, 0]),  # one number: contiguous whatever its stride
            ):
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
            binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(call.logits[row : row + 1]))
            if self.hidden_size:
                binding.bind_ortvalue_output("hidden", ort.OrtValue.ortvalue_from_numpy(call.hidden[row : row + 1]))
            for past, present, buffer in zip(self._past, self._present, self.cache, strict=True):
                value = ort.OrtValue.ortvalue_from_numpy(buffer[row : row + 1])
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
            call.rows.append(binding)
        self._verify_calls[width] = call
        return call

    def verify_positions(self, width: int) -> int:
        return width

    def model_runner(self, max_rows: int) -> OrtModelRunner:
        """The serving runtime's runner over these sessions, with a paged cache of its own."""
        return OrtModelRunner(
            self.spec, self.prefill_session, self.decode_session, self.verify_session, max_rows=max_rows
        )

    def cache_pointers(self) -> list[int]:
        """Where ORT last wrote each ``present_*`` output (the cache buffers, if nothing was reallocated)."""
        return [value.data_ptr() for value in self._binding.get_outputs()[1:]]

    def buffer_pointers(self) -> list[int]:
        return [buffer.ctypes.data for buffer in self.cache]


def _hidden_size(verify_session: Any) -> int:
    """``d`` of the verify graph's ``hidden [batch, steps, d]`` output; 0 without one (no verify graph, or one
    built before the graphs returned it)."""
    if verify_session is None:
        return 0
    shapes = {o.name: o.shape for o in verify_session.get_outputs()}
    return int(shapes["hidden"][-1]) if "hidden" in shapes else 0
