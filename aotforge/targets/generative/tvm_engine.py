"""tvm step engine: prefill and decode as Relax functions of one ``lib.so``, the weights read once.

Compile: both graphs are imported with their weights as arguments (``tvm_graphs``), prefill once
per prompt-length bucket at batch 1, decode once per batch bucket (a static cache of
``max_seq_len``); the decode graph's cache scatter becomes an in-place write into the cache
argument (``rewrites/kv_inplace``); all functions go through the target's pipeline and schedule
rules together, into one ``lib.so``; the matmul weights are packed (``tvm_weight_only``), and what the
functions take is stored once in ``tvm_weights.data`` in place of ``weights.data`` (``tvm_weight_file``);
``tvm_generative.json`` says which function takes which of its tensors.

Run: ``tvm_weights.data`` is read once into tvm tensors that every function call shares. Each call
of ``generate`` allocates the cache once (per layer and kind, ``[slots, kv_heads, max_seq_len,
head_dim]`` for the smallest batch bucket that holds it); prompts run one row at a time through the
smallest prompt bucket that holds them (right-padded, mask 0), their keys / values copied into
their slots; every decode step passes the same cache tensors, which the function updates in place
and returns (``cache_pointers`` lets a test check that they never move).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, VERIFY_FILE, WEIGHTS_FILE, DecoderSpec
from aotforge.core.errors import AotforgeError, CompileError, OptionsError, UnsupportedModelError, describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult
from aotforge.targets.generative.backend import GenerativeBackend
from aotforge.targets.generative.runner import GenerativeRunner
from aotforge.targets.generative.tvm_graphs import (
    Prepared,
    WeightRef,
    bind_shapes,
    input_dtypes,
    input_shapes,
    weights_as_inputs,
)
from aotforge.targets.generative.tvm_weight_file import TVM_WEIGHTS_FILE, read_weights, write_weights
from aotforge.targets.generative.tvm_weight_only import pack_weights, weight_only_format

LIBRARY = "lib.so"
INFO_FILE = "tvm_generative.json"
#: Smallest prompt bucket; the others double up to ``max_seq_len`` (which is always one).
MIN_PROMPT_BUCKET = 16


def prompt_buckets(spec: DecoderSpec, declared: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Prompt lengths with a prefill function: ``prompt=a/b/c`` if given, else 16, 32, ... and max_seq_len."""
    sizes = declared.get("prompt") or _doubling(MIN_PROMPT_BUCKET, spec.max_seq_len)
    return tuple(sorted({s for s in sizes if 0 < s < spec.max_seq_len} | {spec.max_seq_len}))


def batch_buckets(spec: DecoderSpec, declared: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Batch sizes with a decode function: ``batch=a/b`` if given, else 1, 2, 4, ... and max_batch."""
    sizes = declared.get("batch") or _doubling(1, spec.max_batch)
    return tuple(sorted({s for s in sizes if 0 < s < spec.max_batch} | {spec.max_batch}))


def _doubling(start: int, below: int) -> tuple[int, ...]:
    sizes = []
    while start < below:
        sizes.append(start)
        start *= 2
    return tuple(sizes)


def _declared(options: Any) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for text in options.buckets:
        name, _, values = text.partition("=")
        try:
            sizes = tuple(sorted({int(v) for v in values.split("/")}))
        except ValueError:
            sizes = ()
        if name not in ("prompt", "batch") or not sizes:
            raise OptionsError(
                f"tvm bucket {text!r} of a text-generation build must read prompt=a/b/c (prefill lengths) "
                "or batch=a/b (decode batch sizes)"
            )
        out[name] = sizes
    return out


def plan_generative(spec: DecoderSpec, options: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The prompt and batch buckets ``options`` ask for; options this path cannot honour are refused."""
    if options.dynamic or options.tuning:
        raise OptionsError("tvm text-generation builds take neither dynamic=true nor tuning yet: leave them out")
    declared = _declared(options)
    return prompt_buckets(spec, declared), batch_buckets(spec, declared)


def check_compile_passes(passes: dict[str, Any]) -> None:
    """Refuse, before the export, parameters of the passes it compiles itself that this backend cannot honour."""
    if "weight-only" in passes:
        weight_only_format(passes["weight-only"])


def compile_generative(
    workdir: Path,
    spec: DecoderSpec,
    options: Any,
    say: Any,
    verify_width: int = 0,
    passes: dict[str, Any] | None = None,
) -> CompileResult:
    import tvm

    from aotforge.targets.tvm.bucket_module import merge_buckets
    from aotforge.targets.tvm.host import isa_features
    from aotforge.targets.tvm.options import target_dict
    from aotforge.targets.tvm.pipeline import compile_relax
    from aotforge.targets.tvm.rewrites.decode_attention import attention_over_filled_cache
    from aotforge.targets.tvm.rewrites.kv_inplace import kv_cache_in_place

    prompts, batches = plan_generative(spec, options)
    prefill, decode = weights_as_inputs(workdir / PREFILL_FILE), weights_as_inputs(workdir / DECODE_FILE)
    say(f"importing prefill (prompt buckets {_sizes(prompts)}) and decode (batch buckets {_sizes(batches)})")
    imports = [(f"prefill_{p}", _import(prefill, {"batch": 1, "prompt": p})) for p in prompts]
    imports += [(f"decode_{b}", _import(decode, {"batch": b})) for b in batches]
    verify = weights_as_inputs(workdir / VERIFY_FILE) if verify_width else None
    if verify is not None:
        say(f"importing verify ({verify_width} tokens, batch buckets {_sizes(batches)})")
        imports += [(f"verify_{b}", _import(verify, {"batch": b, "steps": verify_width})) for b in batches]
    mod, kv_report = kv_cache_in_place(merge_buckets(imports))
    updates = 2 * spec.layers * len(batches) * (2 if verify is not None else 1)
    if kv_report["in_place"] != updates:
        raise CompileError(
            f"tvm: {kv_report['in_place']} of the decode graphs' {updates} KV-cache updates "
            f"could be made in place ({kv_report['skipped']}): the cache would be copied every token"
        )
    mod, attention_report = attention_over_filled_cache(mod)
    if attention_report["rewritten"] != spec.layers * len(batches):
        say(f"tvm: decode attention stays over all of max_seq_len in some layers: {attention_report}")
    target = tvm.target.Target(target_dict(options))
    refs = {w.name: w for g in (prefill, decode, verify) if g is not None for w in g.weights}
    fmt = weight_only_format(passes["weight-only"]) if passes and "weight-only" in passes else None
    say("packing the matmul weights" + (" (weight-only)" if fmt is not None else " (fp32 panels)"))
    mod, packed, packing = pack_weights(mod, workdir, WEIGHTS_FILE, refs, fmt, target)
    mod = tvm.relax.transform.DeadCodeElimination()(mod)  # the transposes the panels made unused
    try:
        executable, report = compile_relax(mod, target, fast_math=options.fast_math)
        executable.export_library(str(workdir / LIBRARY), **({"cc": options.cc} if options.cc else {}))
    except AotforgeError:
        raise
    except Exception as e:
        raise CompileError(
            f"tvm failed to compile the decoder for {target_dict(options)}: {describe(e, last=True)}"
        ) from e
    functions = {name: _weight_arguments(mod[name]) for name, _ in imports}
    used = {w for names in functions.values() for w in names}
    originals = [ref for name, ref in refs.items() if name in used and name not in packed]
    stored = write_weights(workdir, originals, {name: a for name, a in packed.items() if name in used})
    info = {
        "prompt_buckets": list(prompts),
        "batch_buckets": list(batches),
        "functions": functions,
        "weights": {ref.name: ref.to_dict() for ref in stored},
        "verify_width": verify_width,
    }
    (workdir / INFO_FILE).write_text(json.dumps(info, sort_keys=True, indent=1) + "\n")
    built = target_dict(options)
    target_info = {
        "device": "cpu",
        "arch": built["mcpu"],
        "target": built,
        "generative": {
            "prompt_buckets": list(prompts),
            "batch_buckets": list(batches),
            "kv_cache": kv_report,
            "decode_attention": attention_report,
            **packing,
            "weights_file": {"file": TVM_WEIGHTS_FILE, "bytes": (workdir / TVM_WEIGHTS_FILE).stat().st_size},
        },
        "pipeline": report,
        "platform": {"system": platform.system(), "machine": built["mtriple"].split("-")[0]},
        "cpu_features": isa_features(built),
    }
    return CompileResult(
        files=(LIBRARY, INFO_FILE, TVM_WEIGHTS_FILE), target_info=target_info, toolchain={"tvm": tvm.__version__}
    )


def _weight_arguments(func: Any) -> list[str]:
    """The weight arguments a function takes, in order (after its ``num_input`` runtime inputs)."""
    return [str(p.name) for p in func.params[int(func.attrs["num_input"]) :]]


def _sizes(sizes: tuple[int, ...]) -> str:
    return "/".join(map(str, sizes))


def _import(prepared: Prepared, sizes: dict[str, int]) -> Any:
    from tvm.relax.frontend.onnx import from_onnx

    proto = bind_shapes(prepared, sizes)
    try:
        mod = from_onnx(proto, shape_dict=input_shapes(proto), dtype_dict=input_dtypes(proto))
    except Exception as e:
        raise UnsupportedModelError(f"tvm cannot import the decoder graph: {describe(e, last=True)}") from e
    # The runtime inputs come first, the weights after (what Relax's LiftTransformParams reads).
    mod["main"] = mod["main"].with_attr("num_input", len(prepared.inputs))
    return mod


def load_generative(artifact_dir: Path, record: TargetRecord) -> GenerativeRunner:
    spec = DecoderSpec.from_dict(record.info["decoder"])
    return GenerativeRunner(TvmStepEngine(artifact_dir, spec))


BACKEND = GenerativeBackend(
    compile=compile_generative,
    load=load_generative,
    # A verify graph (``--speculative-k``): one function per batch bucket at ``verify_width`` tokens.
    speculative=True,
    plan=plan_generative,
    # weight-only runs on the imported module (``tvm_weight_only``), not on the ONNX graphs; its kernel computes
    # with int8 activations: the manifest records the level it runs (the user's 0 is taken too).
    compile_passes=frozenset({"weight-only"}),
    check_compile_passes=check_compile_passes,
    pass_defaults={"weight-only": {"accuracy_level": 4}},
)


class TvmStepEngine:
    def __init__(self, artifact_dir: Path, spec: DecoderSpec) -> None:
        import tvm
        from tvm import relax

        self._tvm = tvm
        self.spec = spec
        info = json.loads((artifact_dir / INFO_FILE).read_text())
        self.prompt_buckets = tuple(info["prompt_buckets"])
        self.batch_buckets = tuple(info["batch_buckets"])
        self.verify_width = int(info.get("verify_width", 0))
        try:
            vm = relax.VirtualMachine(tvm.runtime.load_module(str(artifact_dir / LIBRARY)), tvm.cpu())
        except Exception as e:
            raise CompileError(f"tvm cannot load {artifact_dir / LIBRARY}: {describe(e, last=True)}") from e
        weights = read_weights(artifact_dir, [WeightRef.from_dict(w) for w in info["weights"].values()])
        self.vm = vm  # tools/tvm_decode_profile.py sets its instrument
        self._functions = {name: vm[name] for name in info["functions"]}
        self._weights = {name: [weights[w] for w in names] for name, names in info["functions"].items()}
        self.weights = weights
        self.cache: list[Any] = []
        self._views: list[np.ndarray] = []
        self._written: list[Any] = []
        self._slots = 0

    def start(self, batch: int, prompt_len: int) -> None:
        spec = self.spec
        self._slots = next(b for b in self.batch_buckets if b >= batch)
        shape = (self._slots, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        # Zeroed once per call: positions a slot has not written are masked, never read as garbage.
        self.cache = [self._tvm.runtime.empty(shape, "float32") for _ in range(2 * spec.layers)]
        self._views = [np.from_dlpack(t) for t in self.cache]
        for view in self._views:
            view.fill(0.0)
        self._written = []

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
        ids = np.zeros((self._slots, 1), dtype=np.int64)
        pos = np.zeros(self._slots, dtype=np.int64)
        ids[:batch], pos[:batch] = input_ids.reshape(batch, 1), write_pos
        name = f"decode_{self._slots}"
        tensor = self._tvm.runtime.tensor
        logits, *self._written = self._functions[name](
            tensor(ids), tensor(pos[:, None].copy()), tensor(pos), *self.cache, *self._weights[name]
        )
        return logits.numpy()[:batch]

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """``[batch, w]`` tokens at ``write_pos ..`` -> ``logits [batch, w, vocab]``: the function takes
        ``verify_width`` tokens, so a shorter call is padded (its padding writes positions nobody reads
        before they are written again; ``verify_positions``)."""
        batch, width = input_ids.shape
        ids = np.zeros((self._slots, self.verify_width), dtype=np.int64)
        pos = np.zeros(self._slots, dtype=np.int64)
        ids[:batch, :width], pos[:batch] = input_ids, write_pos
        positions = pos[:, None] + np.arange(self.verify_width, dtype=np.int64)[None, :]
        name = f"verify_{self._slots}"
        tensor = self._tvm.runtime.tensor
        logits, *self._written = self._functions[name](
            tensor(ids), tensor(positions), tensor(pos), *self.cache, *self._weights[name]
        )
        return logits.numpy()[:batch, :width]

    def verify_positions(self, width: int) -> int:
        return self.verify_width

    def cache_pointers(self) -> list[int]:
        """Where the last decode step's ``present_*`` outputs live (the cache, if it was updated in place)."""
        return [t.data_ptr() for t in self._written]

    def buffer_pointers(self) -> list[int]:
        return [t.data_ptr() for t in self.cache]
