"""tvm text generation: prefill and decode (and verify) as Relax functions of one ``lib.so``, the weights read once.

Compile: both graphs are imported with their weights as arguments (``graphs``), prefill once
per prompt-length bucket at batch 1, decode once per batch bucket (a static cache of
``max_seq_len``); the decode graph's cache scatter becomes an in-place write into the cache
argument (``rewrites/kv_inplace``); all functions go through the target's pipeline and schedule
rules together, into one ``lib.so``; the matmul weights are packed (``weight_only``), and what the
functions take is stored once in ``tvm_weights.data`` in place of ``weights.data`` (``weight_file``);
``tvm_generative.json`` says which function takes which of its tensors.

Run: ``step_engine``; the buckets: ``buckets``.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path
from typing import Any

from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, VERIFY_FILE, WEIGHTS_FILE, DecoderSpec
from aotforge.core.errors import AotforgeError, CompileError, UnsupportedModelError, describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult, DecoderInputs, GenerativeBackend
from aotforge.targets.generative.runner import GenerativeRunner
from aotforge.targets.tvm.decoder.buckets import plan_generative
from aotforge.targets.tvm.decoder.graphs import Prepared, bind_shapes, input_dtypes, input_shapes, weights_as_inputs
from aotforge.targets.tvm.decoder.step_engine import INFO_FILE, LIBRARY, TvmStepEngine
from aotforge.targets.tvm.decoder.weight_file import TVM_WEIGHTS_FILE, write_weights
from aotforge.targets.tvm.decoder.weight_only import WeightPacking, weight_only_format


def check_compile_passes(passes: dict[str, Any]) -> None:
    """Refuse, before the export, parameters of the passes it compiles itself that this backend cannot honour."""
    if "weight-only" in passes:
        weight_only_format(passes["weight-only"])


def compile_generative(
    workdir: Path,
    spec: DecoderSpec,
    options: Any,
    say: Any,
    inputs: DecoderInputs = DecoderInputs(),
) -> CompileResult:
    import tvm

    from aotforge.targets.tvm.bucket_module import merge_buckets
    from aotforge.targets.tvm.host import isa_features
    from aotforge.targets.tvm.options import target_dict
    from aotforge.targets.tvm.pipeline import compile_relax, decoder_phase
    from aotforge.targets.tvm.rewrites.paged_kv import PREFIX

    verify_width, passes = inputs.verify_width, inputs.passes
    prompts, batches = plan_generative(spec, options)
    prefill, decode = weights_as_inputs(workdir / PREFILL_FILE), weights_as_inputs(workdir / DECODE_FILE)
    say(f"importing prefill (prompt buckets {_sizes(prompts)}) and decode (batch buckets {_sizes(batches)})")
    imports = [(f"prefill_{p}", _import(prefill, {"batch": 1, "prompt": p})) for p in prompts]
    imports += [(f"decode_{b}", _import(decode, {"batch": b})) for b in batches]
    verify = weights_as_inputs(workdir / VERIFY_FILE) if verify_width else None
    if verify is not None:
        say(f"importing verify ({verify_width} tokens, batch buckets {_sizes(batches)})")
        imports += [(f"verify_{b}", _import(verify, {"batch": b, "steps": verify_width})) for b in batches]
    target = tvm.target.Target(target_dict(options))
    refs = {w.name: w for g in (prefill, decode, verify) if g is not None for w in g.weights}
    fmt = weight_only_format(passes["weight-only"]) if passes and "weight-only" in passes else None
    fmt = dataclasses.replace(fmt, head_n=spec.vocab) if fmt is not None else None  # the head: vocab outputs
    packing = WeightPacking(workdir, WEIGHTS_FILE, refs, fmt, options.fast_math)
    # The cache's updates: one K and one V a layer, in every decode (and verify) function.
    updates = 2 * spec.layers * len(batches) * (2 if verify is not None else 1)
    steps = [name for name, _ in imports if not name.startswith("prefill_")]
    decoder = decoder_phase(
        kv_updates=updates, packing=packing, paged=steps, layers=spec.layers, max_seq=spec.max_seq_len
    )
    say(
        "compiling (the decoder phase packs the matmul weights"
        + (" weight-only)" if fmt is not None else " as fp32 panels)")
    )
    try:
        executable, report = compile_relax(merge_buckets(imports), target, fast_math=options.fast_math, decoder=decoder)
        executable.export_library(str(workdir / LIBRARY), **({"cc": options.cc} if options.cc else {}))
    except AotforgeError:
        raise
    except Exception as e:
        raise CompileError(
            f"tvm failed to compile the decoder for {target_dict(options)}: {describe(e, last=True)}"
        ) from e
    reports = report.pop("decoder")
    kv_report, attention_report = reports["kv_cache"], reports["decode_attention"]
    verify_attention = attention_report.pop("verify_rewritten")
    if attention_report["rewritten"] != spec.layers * len(batches):
        say(f"tvm: decode attention stays over all of max_seq_len in some layers: {attention_report}")
    if verify is not None and verify_attention != spec.layers * len(batches):
        say(
            f"tvm: verify attention stays over all of max_seq_len in some layers ({verify_attention} of "
            f"{spec.layers * len(batches)} rewritten): {attention_report['skipped']}"
        )
    functions = {name: reports["weight_arguments"][name] for name, _ in imports}
    paged = reports["paged_kv"]
    functions |= {PREFIX + name: reports["weight_arguments"][PREFIX + name] for name in paged.get("functions", ())}
    used = {w for names in functions.values() for w in names}
    originals = [ref for name, ref in refs.items() if name in used and name not in packing.packed]
    stored = write_weights(workdir, originals, {name: a for name, a in packing.packed.items() if name in used})
    info = {
        "prompt_buckets": list(prompts),
        "batch_buckets": list(batches),
        "functions": functions,
        "weights": {ref.name: ref.to_dict() for ref in stored},
        "verify_width": verify_width,
        "hidden_size": _hidden_size(verify),
        "huge_pages": options.huge_pages,
        # the functions over a paged cache (``rewrites/paged_kv``) are named ``paged_<slot function>``
        "paged": bool(paged.get("functions")),
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
            "verify_attention": {"rewritten": verify_attention},
            "paged_kv": paged,
            # RMSNorms whose square joined the norm's kernel (rewrites/mean_of_square)
            "norm_squares_fused": reports["norm_squares_fused"]["fused"],
            "huge_pages": options.huge_pages,
            **reports["weight_packing"],
            "weights_file": {"file": TVM_WEIGHTS_FILE, "bytes": (workdir / TVM_WEIGHTS_FILE).stat().st_size},
        },
        "pipeline": report,
        "platform": {"system": platform.system(), "machine": built["mtriple"].split("-")[0]},
        "cpu_features": isa_features(built),
    }
    return CompileResult(
        files=(LIBRARY, INFO_FILE, TVM_WEIGHTS_FILE), target_info=target_info, toolchain={"tvm": tvm.__version__}
    )


def _hidden_size(verify: Prepared | None) -> int:
    """``d`` of the verify graph's ``hidden [batch, steps, d]`` output (the prefill graph returns it too), else 0."""
    outputs = {str(v.name): v for v in verify.model.graph.outputs} if verify is not None else {}
    shape = outputs["hidden"].shape if "hidden" in outputs else None
    return int(shape[-1]) if shape is not None and isinstance(shape[-1], int) else 0


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
    # weight-only runs on the imported module (``weight_only``), not on the ONNX graphs; its kernel computes
    # with int8 activations: the manifest records the level it runs (the user's 0 is taken too).
    compile_passes=frozenset({"weight-only"}),
    check_compile_passes=check_compile_passes,
    pass_defaults={"weight-only": {"accuracy_level": 4, "head_bits": 8}},  # the head at 8 bits as onnxruntime's
    # The packed weights replace the export's weights.data (``weight_file``).
    weights_file=TVM_WEIGHTS_FILE,
)
