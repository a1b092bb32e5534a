"""Neuron text generation: context-encoding and token-generation buckets, laid out as NxD Inference does.

neuronx-distributed-inference (NxDI) compiles a decoder as two models over one static KV cache of
``seq_len`` positions: *context encoding* (the prompt, one graph per prompt-length bucket) and *token
generation* (one token per sequence, one graph per bucket of the cache length it attends over: the
cache is sliced to the bucket's first positions, ``KVCacheManager.get_cache(seq_len=bucket)``, and the
new token scattered in at its position). Its default buckets are powers of two from 128 up to the
maximum, the maximum itself last (``modules/autobucketing.py``, ``generate_buckets``; NeuronConfig's
``context_encoding_buckets`` / ``token_generation_buckets``); each graph is compiled at one batch size.
This module plans the same layout for aotforge's prefill and decode graphs (``compiler.generative.graphs``:
the decode graph attends over whatever cache length it is traced with):

* context encoding: ``Prefill`` traced at ``[batch, prompt]`` for each prompt bucket;
* token generation: ``Decode`` traced with ``past_*`` of ``[batch, kv_heads, cache, head_dim]`` for each cache
  bucket; a step runs on the smallest bucket holding every slot's write position;
* batch: the ``batch`` buckets (default: ``max_batch`` only, NxDI's ``batch_size``); a call runs on the smallest
  that holds it, padding rows that are dropped afterwards.

``--target-opt buckets=prompt=32/64,cache=64/128,batch=1/4`` overrides any of them (the largest must be the
maximum). Plain Python; the torch-neuronx calls are :mod:`targets.neuron.sdk`'s. neuronx-cc compiles torch,
not ONNX, so a bundle for this target carries the weights (safetensors) and the device host traces the
graphs' torch modules (``BACKEND.graphs_from``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from math import log2
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import InputSpecError, OptionsError, TargetUnavailableError
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult, DecoderInputs, GenerativeBackend
from aotforge.targets.neuron import sdk
from aotforge.targets.neuron.target import check_instance_family, compiler_args

CONTEXT_ENCODING = "context_encoding"
TOKEN_GENERATION = "token_generation"
#: NxDI's smallest default bucket.
_MIN_BUCKET = 128
_DIMS = ("batch", "prompt", "cache")


def generate_buckets(min_length: int, max_length: int) -> list[int]:
    """NxDI's ``autobucketing.generate_buckets``: powers of two from ``min_length``, then ``max_length``
    (``round`` on the upper log2 so that no bucket lands right below the maximum: 128, 256, 513, not 512, 513)."""
    if min_length >= max_length:
        return [max_length]
    low, high = int(log2(min_length)), round(log2(max_length))
    return sorted({2**i for i in range(low, high)} | {max_length})


@dataclasses.dataclass(frozen=True)
class GenerativeBuckets:
    batch: tuple[int, ...]
    prompt: tuple[int, ...]
    cache: tuple[int, ...]

    def graphs(self) -> list[dict[str, Any]]:
        """Every graph to compile: its kind, sizes and file, context encoding first."""
        out = []
        for b in self.batch:
            for p in self.prompt:
                out.append({"kind": CONTEXT_ENCODING, "batch": b, "length": p, "file": _file(CONTEXT_ENCODING, b, p)})
        for b in self.batch:
            for c in self.cache:
                out.append({"kind": TOKEN_GENERATION, "batch": b, "length": c, "file": _file(TOKEN_GENERATION, b, c)})
        return out


def _file(kind: str, batch: int, length: int) -> str:
    tag = "p" if kind == CONTEXT_ENCODING else "c"
    return f"{kind}.b{batch}-{tag}{length}.neuron.pt"


def plan_buckets(spec: DecoderSpec, options: Any) -> GenerativeBuckets:
    """The buckets of this build (NxDI's defaults unless ``--target-opt buckets=...`` names them)."""
    declared: dict[str, tuple[int, ...]] = {}
    for text in options.buckets:
        name, sep, values = text.partition("=")
        try:
            sizes = tuple(sorted({int(v) for v in values.split("/")})) if sep else ()
        except ValueError:
            sizes = ()
        if name not in _DIMS or not sizes or sizes[0] < 1:
            raise OptionsError(
                f"neuron text-generation bucket {text!r} must read dim=size/size/... for a dim of {', '.join(_DIMS)} "
                "(batch sizes, context-encoding prompt lengths, token-generation cache lengths), e.g. prompt=64/128"
            )
        declared[name] = sizes
    top = {"batch": spec.max_batch, "prompt": spec.max_seq_len, "cache": spec.max_seq_len}
    default_low = min(_MIN_BUCKET, spec.max_seq_len)
    defaults = {
        "batch": (spec.max_batch,),
        "prompt": tuple(generate_buckets(default_low, spec.max_seq_len)),
        "cache": tuple(generate_buckets(default_low, spec.max_seq_len)),
    }
    chosen = {d: declared.get(d, defaults[d]) for d in _DIMS}
    for dim, sizes in chosen.items():
        if sizes[-1] != top[dim]:
            raise OptionsError(
                f"neuron {dim} buckets {list(sizes)} must end at {top[dim]} (--max-batch / --max-seq-len), "
                "or calls up to it could not run"
            )
    buckets = GenerativeBuckets(**chosen)
    count = len(buckets.graphs())
    if count > options.max_buckets:
        raise OptionsError(
            f"neuron would compile {count} text-generation graphs (more than max_buckets={options.max_buckets}): "
            "declare fewer sizes with --target-opt buckets=prompt=a/b, or raise max_buckets"
        )
    return buckets


def plan_generative(spec: DecoderSpec, options: Any) -> None:
    plan_buckets(spec, options)


def bundle_plan_generative(spec: DecoderSpec, options: Any) -> dict[str, Any]:
    """What a bundle records and ``finish`` re-plans: the buckets, their files and the compiler flags."""
    buckets = plan_buckets(spec, options)
    return {
        "layout": "neuronx-distributed-inference: context-encoding graphs per (batch, prompt) bucket, "
        "token-generation graphs per (batch, cache length) bucket over one static KV cache",
        "buckets": dataclasses.asdict(buckets),
        "graphs": buckets.graphs(),
        "compiler_args": compiler_args(options, ()),
        "instance_family": options.target.value,
    }


def example_inputs(spec: DecoderSpec, graph: Mapping[str, Any]) -> list[np.ndarray]:
    """The arrays one graph is traced with, in the module's argument order."""
    b, n = int(graph["batch"]), int(graph["length"])
    if graph["kind"] == CONTEXT_ENCODING:
        ids = np.zeros((b, n), dtype=np.int64)
        return [ids, np.ones_like(ids), np.broadcast_to(np.arange(n, dtype=np.int64), (b, n)).copy()]
    cache = np.zeros((b, spec.kv_heads, n, spec.head_dim), dtype=np.float32)
    tokens = np.zeros((b, 1), dtype=np.int64)
    return [tokens, tokens.copy(), np.zeros(b, dtype=np.int64), *([cache] * (2 * spec.layers))]


def compile_generative(
    workdir: Path, spec: DecoderSpec, options: Any, say: Any, inputs: DecoderInputs = DecoderInputs()
) -> CompileResult:
    """Trace every bucket of ``inputs.modules`` (``{"prefill": Prefill, "decode": Decode}``) with neuronx-cc."""
    modules = inputs.modules
    if modules is None:
        raise OptionsError("neuron compiles the prefill/decode torch modules: this build handed over none")
    found = sdk.probe_to_compile(options.python)
    args = compiler_args(options, ())
    graphs = plan_buckets(spec, options).graphs()

    def traces() -> Iterator[sdk.Trace]:
        for graph in graphs:
            module = modules["prefill" if graph["kind"] == CONTEXT_ENCODING else "decode"]
            say(f"neuronx-cc: {graph['kind']} batch {graph['batch']} length {graph['length']}")
            examples = example_inputs(spec, graph)
            yield sdk.Trace(module, examples, Path(graph["file"]).stem, workdir / graph["file"])

    versions = sdk.trace_all(found, traces(), args)
    info = {
        "instance_family": options.target.value,
        "compiler_args": args,
        "graphs": graphs,
        "shapes": "context encoding per (batch, prompt) bucket, token generation per (batch, cache length) "
        "bucket; a call runs on the smallest bucket that holds it, rows and positions padded",
        **{k.replace("-", "_") + "_version": v for k, v in versions.items()},
    }
    return CompileResult(files=tuple(g["file"] for g in graphs), target_info=info, toolchain=versions)


def load_generative(artifact_dir: Path, record: TargetRecord) -> Any:
    from aotforge.targets.generative.runner import GenerativeRunner

    probe = sdk.probe()
    if not probe.available:
        raise TargetUnavailableError(probe.reason)
    info = record.info
    check_instance_family(str(info.get("instance_family", "")), sdk.host_instance_type())
    spec = DecoderSpec.from_dict(info["decoder"])
    # Every bucket loaded now: a serving host must not pay a load on its first odd-sized request.
    loaded = {
        (g["kind"], int(g["batch"]), int(g["length"])): sdk.load_traced(artifact_dir / g["file"])
        for g in info["graphs"]
    }
    return GenerativeRunner(BucketStepEngine(spec, loaded, lambda key, arrays: sdk.call(loaded[key], arrays)))


#: A bundle for this target carries the source weights: the device host traces the torch modules.
BACKEND = GenerativeBackend(
    compile=compile_generative,
    load=load_generative,
    plan=plan_generative,
    bundle_plan=bundle_plan_generative,
    graphs_from="torch",
)


Key = tuple[str, int, int]


class BucketStepEngine:
    """A step engine over bucketed static graphs: each call padded to the smallest bucket that holds it.

    ``run(key, arrays)`` runs the graph ``key = (kind, batch, length)`` (a traced Neuron graph on the device;
    the torch module itself in the CPU check of a bundle). The KV cache is one host array per layer and kind,
    ``[batch bucket, kv_heads, max_seq_len, head_dim]``, allocated once per call; context encoding writes the
    prompt bucket's positions, token generation reads and rewrites the cache bucket's first positions.
    """

    def __init__(
        self, spec: DecoderSpec, graphs: Mapping[Key, Any], run: Callable[[Key, list[np.ndarray]], list]
    ) -> None:
        self.spec, self.run = spec, run
        self.sizes = {
            kind: {
                "batch": sorted({k[1] for k in graphs if k[0] == kind}),
                "length": sorted({k[2] for k in graphs if k[0] == kind}),
            }
            for kind in (CONTEXT_ENCODING, TOKEN_GENERATION)
        }
        self.cache: list[np.ndarray] = []
        self.rows = 0
        self.calls: list[Key] = []  # which graph each step ran on (tests, and the benchmark's record)

    def start(self, batch: int, prompt_len: int) -> None:
        self.rows = _smallest(self.sizes[TOKEN_GENERATION]["batch"], batch, "batch")
        _smallest(self.sizes[CONTEXT_ENCODING]["batch"], batch, "batch")
        spec = self.spec
        shape = (self.rows, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        self.cache = [np.zeros(shape, dtype=np.float32) for _ in range(2 * spec.layers)]

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        batch, steps = input_ids.shape
        rows = _smallest(self.sizes[CONTEXT_ENCODING]["batch"], batch, "batch")
        length = _smallest(self.sizes[CONTEXT_ENCODING]["length"], steps, "prompt length")
        ids = np.zeros((rows, length), dtype=np.int64)
        mask = np.zeros_like(ids)
        mask[batch:, 0] = 1  # a padding row holds one dummy token: its last-token index stays in range
        positions = np.broadcast_to(np.arange(length, dtype=np.int64), (rows, length)).copy()
        ids[:batch, :steps], mask[:batch, :steps], positions[:batch, :steps] = input_ids, attention_mask, position_ids
        key = (CONTEXT_ENCODING, rows, length)
        logits, *present = self.run(key, [ids, mask, positions])
        self.calls.append(key)
        for cache, values in zip(self.cache, present, strict=True):
            cache[: values.shape[0], :, :length] = values[: self.rows]
        return np.asarray(logits[:batch])

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        batch = input_ids.shape[0]
        length = _smallest(self.sizes[TOKEN_GENERATION]["length"], int(np.max(write_pos)) + 1, "cache length")
        ids = np.zeros((self.rows, 1), dtype=np.int64)
        pos = np.zeros(self.rows, dtype=np.int64)  # padding rows write position 0 of their own (unused) slot
        ids[:batch], pos[:batch] = input_ids, write_pos
        key = (TOKEN_GENERATION, self.rows, length)
        past = [np.ascontiguousarray(c[:, :, :length]) for c in self.cache]
        logits, *present = self.run(key, [ids, pos[:, None].copy(), pos, *past])
        self.calls.append(key)
        for cache, values in zip(self.cache, present, strict=True):
            cache[:, :, :length] = values
        return np.asarray(logits[:batch])


def _smallest(sizes: list[int], need: int, what: str) -> int:
    fits = [s for s in sizes if s >= need]
    if not fits:
        raise InputSpecError(f"neuron: no compiled bucket holds {what} {need} (buckets: {sizes})")
    return fits[0]
