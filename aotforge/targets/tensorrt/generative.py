"""TensorRT text generation: the prefill and decode graphs as two engines, each with its optimization profile.

Plain Python (plans, the engine's I/O contract); the builder and runtime calls are in
:mod:`targets.tensorrt.sdk` and :mod:`targets.tensorrt.step_engine`, imported only to build or load.

Two engines, not one engine with two profiles: the graphs are two ONNX files (``compiler.generative.export``)
and an engine is one network; a network holding both would run both on every call. Each engine has
one profile, laid out as TensorRT-LLM lays out its context and generation profiles
(``tensorrt_llm/models/generation_mixin.py``, ``prepare_basic_inputs``: ``bb_range_cxt = [1, (max_batch_size
+ 1) // 2, max_batch_size]``, ``inlen_range_cxt = [1, (max_input_len + 1) // 2, max_input_len]``, generation
batch the same, generation length 1):

* prefill: ``input_ids`` / ``attention_mask`` / ``position_ids`` ``[batch, prompt]``, batch 1 / (B+1)//2 / B,
  prompt 1 / (S+1)//2 / S;
* decode: one token per slot, batch 1 / (B+1)//2 / B, and the static cache ``past_*`` ``[batch, kv_heads,
  max_seq_len, head_dim]`` whose only dynamic dim is the batch.

The decode graph is the ``masked`` export (standard ONNX ops: ScatterElements writes the new token at each
slot's ``write_pos``): TensorRT's ONNX parser has no ``com.microsoft`` ops, so ORT's GroupQueryAttention
is out. Its ``present_*`` outputs are a new tensor each step, so the runtime keeps two caches, allocated
once per call, and swaps which one is ``past`` (double buffering: never a per-token allocation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, DecoderSpec
from aotforge.core.errors import TargetUnavailableError
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult, DecoderInputs, GenerativeBackend, ShardRuntime
from aotforge.targets.tensorrt.compat import check_engine_compat
from aotforge.targets.tensorrt.plan import Profile, TrtBuildPlan
from aotforge.targets.tensorrt.target import builder_flags, query_gpu

PREFILL_ENGINE = "prefill.engine"
DECODE_ENGINE = "decode.engine"
ENGINES = {"prefill": (PREFILL_FILE, PREFILL_ENGINE), "decode": (DECODE_FILE, DECODE_ENGINE)}
PREFILL_INPUTS = ("input_ids", "attention_mask", "position_ids")
#: A tensor-parallel rank's record beside its engines: what they were built with, and where the rank runs.
RANK_FILE = "rank.json"


def _range(n: int) -> tuple[int, int, int]:
    """min / opt / max as TensorRT-LLM sets them: ``[1, (n + 1) // 2, n]``."""
    return 1, (n + 1) // 2, n


def engine_plans(spec: DecoderSpec, options: Any) -> dict[str, TrtBuildPlan]:
    """The builder plan of each engine: its one profile, and the target options' builder settings."""
    b, s = _range(spec.max_batch), _range(spec.max_seq_len)
    prefill = tuple(Profile(n, *((b[i], s[i]) for i in range(3))) for n in PREFILL_INPUTS)
    cache = (spec.kv_heads, spec.max_seq_len, spec.head_dim)
    decode = (
        Profile("input_ids", *((b[i], 1) for i in range(3))),
        Profile("position_ids", *((b[i], 1) for i in range(3))),
        Profile("write_pos", *((b[i],) for i in range(3))),
        *(Profile(n, *((b[i], *cache) for i in range(3))) for n in spec.kv_names("past")),
    )
    common = {
        "flags": builder_flags(options, ()),
        "workspace_bytes": options.workspace_mb << 20,
        "optimization_level": options.builder_optimization_level,
        "hardware_compatibility": options.hardware_compatibility.value,
    }
    return {"prefill": TrtBuildPlan(profiles=prefill, **common), "decode": TrtBuildPlan(profiles=decode, **common)}


def plan_generative(spec: DecoderSpec, options: Any) -> None:
    """Refuse, before the export, what the engines could not be built with."""
    engine_plans(spec, options)


def bundle_plan_generative(spec: DecoderSpec, options: Any) -> dict[str, Any]:
    """What a ``--prepare-only`` bundle records and ``finish`` re-plans and compares: both engines' profiles."""
    plans = engine_plans(spec, options)
    graphs = {
        kind: {"onnx": onnx_file, "engine": engine_file, "plan": plans[kind].to_dict()}
        for kind, (onnx_file, engine_file) in ENGINES.items()
    }
    plan: dict[str, Any] = json.loads(
        json.dumps(
            {
                "graphs": graphs,
                "kv_cache": {
                    "layout": "[batch, kv_heads, max_seq_len, head_dim] float32 per layer and kind, two copies "
                    "(decode reads one and writes the other)",
                    "bytes_at_max_batch": 2 * spec.kv_cache_bytes(spec.max_batch),
                },
            }
        )
    )
    return plan


def compile_generative(
    workdir: Path, spec: DecoderSpec, options: Any, say: Any, inputs: DecoderInputs = DecoderInputs()
) -> CompileResult:
    """Build both engines from the ONNX graphs in ``workdir`` (:func:`build_engines`)."""
    info = build_engines(workdir, spec, options, say)
    version = info["tensorrt_version"]
    return CompileResult(files=(PREFILL_ENGINE, DECODE_ENGINE), target_info=info, toolchain={"tensorrt": version})


def build_engines(workdir: Path, spec: DecoderSpec, options: Any, say: Any, ranks: int = 1) -> dict[str, Any]:
    """Both engines from the ONNX graphs in ``workdir``, one timing cache across them; what the manifest records of
    them. ``ranks`` > 1: the graphs are a tensor-parallel rank's, whose all-reduces become TensorRT's
    (``rank_graphs``)."""
    from aotforge.targets.tensorrt import sdk
    from aotforge.targets.tensorrt.rank_graphs import marked_graph
    from aotforge.targets.tensorrt.report import summarize_layers

    probe = sdk.probe_host()
    if not probe.available:
        raise TargetUnavailableError(probe.reason + ": build on an NVIDIA host with TensorRT installed")
    plans = engine_plans(spec, options)
    cache_path = Path(options.timing_cache) if options.timing_cache else None
    cache = cache_path.read_bytes() if cache_path and cache_path.exists() else b""
    layers, version = {}, ""
    for kind, (onnx_file, engine_file) in ENGINES.items():
        say(f"building the tensorrt {kind} engine")
        if ranks > 1:
            graph, all_reduces = marked_graph(workdir / onnx_file)
            try:
                built = sdk.build_engine(graph, plans[kind], cache, all_reduces, ranks)
            finally:
                graph.unlink(missing_ok=True)
        else:
            built = sdk.build_engine(workdir / onnx_file, plans[kind], cache)
        (workdir / engine_file).write_bytes(built.engine)
        cache, version = built.timing_cache, built.version
        report = summarize_layers(built.layers_json, sparse_requested=False, log_lines=built.build_log)
        layers[kind] = {k: v for k, v in report.items() if k not in ("per_layer", "io_tensors")}
    if cache_path:
        from aotforge.targets.tensorrt.timing_cache import merge_into

        merge_into(cache_path, cache, sdk.combine_timing_caches)
    gpu = query_gpu() or {}
    return {
        "tensorrt_version": version,
        "gpu_name": gpu.get("name", ""),
        "compute_capability": gpu.get("compute_capability", ""),
        "hardware_compatibility": options.hardware_compatibility.value,
        "version_compatible": options.version_compatible,
        "engines": {kind: {"file": e, "plan": plans[kind].to_dict()} for kind, (_, e) in ENGINES.items()},
        "layers": layers,
        "shapes": "prefill: batch 1..max_batch x prompt 1..max_seq_len; decode: batch 1..max_batch over the "
        "static max_seq_len cache (one optimization profile per engine)",
    }


def load_generative(artifact_dir: Path, record: TargetRecord) -> Any:
    from aotforge.targets.generative.runner import GenerativeRunner
    from aotforge.targets.tensorrt import sdk

    probe = sdk.probe_host()
    if not probe.available:
        raise TargetUnavailableError(probe.reason + ": run it on an NVIDIA host with TensorRT installed")
    info = record.info
    check_engine_compat(info, sdk.version(), (query_gpu() or {}).get("compute_capability", ""))
    spec = DecoderSpec.from_dict(info["decoder"])
    engine = sdk.step_engine(
        (artifact_dir / PREFILL_ENGINE).read_bytes(),
        (artifact_dir / DECODE_ENGINE).read_bytes(),
        spec,
        allow_host_code=bool(info.get("version_compatible")),
    )
    return GenerativeRunner(engine)


def compile_shard(shard_dir: Path, options: Any, spec: DecoderSpec, degree: int) -> CompileResult:
    """A tensor-parallel rank's engines (:func:`build_engines` over its graphs, its all-reduces TensorRT's), and
    what its load checks them against (``RANK_FILE``)."""
    info = build_engines(shard_dir, spec, options, lambda _msg: None, ranks=degree)
    rank = int(shard_dir.name)
    record = {k: info[k] for k in ("tensorrt_version", "compute_capability", "hardware_compatibility")}
    record |= {"version_compatible": info["version_compatible"], "mapping": rank_mapping(rank, degree)}
    (shard_dir / RANK_FILE).write_text(json.dumps(record, sort_keys=True, indent=2) + "\n")
    files = (PREFILL_ENGINE, DECODE_ENGINE, RANK_FILE)
    return CompileResult(files=files, target_info={"device": "gpu"}, toolchain={"tensorrt": info["tensorrt_version"]})


def rank_mapping(rank: int, degree: int) -> dict[str, Any]:
    """Where rank ``rank`` of ``degree`` runs, as TensorRT-LLM's ``Mapping`` places ranks: ``rank = pp_rank *
    tp_size + tp_rank`` (pipeline size 1 here, so ``tp_rank = rank``), on GPU ``rank % gpus_per_node`` of its host
    (the GPUs the host shows the rank's process)."""
    return {"world_size": degree, "tp_size": degree, "pp_size": 1, "rank": rank, "tp_rank": rank, "pp_rank": 0}


#: A bundle for this target carries the ONNX graphs over their shared weights to the device host.
BACKEND = GenerativeBackend(
    compile=compile_generative,
    load=load_generative,
    plan=plan_generative,
    bundle_plan=bundle_plan_generative,
    graphs_from="onnx",
    tensor_parallel=ShardRuntime(compile_shard, "aotforge.targets.tensorrt.tensor_parallel", gpus_per_shard=1),
)
