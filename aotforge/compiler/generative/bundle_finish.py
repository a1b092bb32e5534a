"""``aotforge finish`` for text-generation bundles: compile on the device host, validate, benchmark, store.

The bundle (``compiler.generative.bundled``) is read and checked first (``compiler.bundle_format.read_bundle``);
the target re-plans from the bundle's options and must arrive at the plan it carries; the artifact is
validated token for token against the source's greedy tokens and logits stored in the bundle (the device host
never needs the source model) and written through a staging directory, as every build is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aotforge.compiler.build_result import BuildResult
from aotforge.compiler.build_tail import key_toolchain, place_artifact
from aotforge.compiler.bundle_format import VALIDATION_NPZ, finish_job
from aotforge.compiler.generative.bundle_inputs import bundle_inputs, inputs_sha
from aotforge.compiler.generative.decoder_work import DecoderWork
from aotforge.compiler.generative.generative_bundle import (
    finishing_target,
    reference_validator,
    refuse_replanned,
    store_finished,
)
from aotforge.compiler.isolation import Isolation
from aotforge.core.decoder import DecoderSpec
from aotforge.core.options import options_from_dict
from aotforge.targets import generative_backend
from aotforge.targets.base import DecoderInputs

Progress = Callable[[str], None]


def finish_generative(
    path: Path,
    data: Mapping[str, Any],
    out: Path,
    *,
    target_name: str | None = None,
    bench: bool | None = None,
    progress: Progress | None = None,
    worker: Mapping[str, Any] | None = None,
    plots: bool = True,
    cache_dir: Path | None = None,
    isolation: Isolation | None = None,
) -> BuildResult:
    """Compile a checked text-generation bundle (``compiler.bundle.read_bundle``), validate it token for token
    against the references it carries, benchmark, and store the artifact."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    name, target, probe = finishing_target(path, data, target_name)
    graphs_from = data["graphs_from"]
    backend = generative_backend(name)
    target_opts = options_from_dict(
        target.options_type, data["target_options"] if name == data["target"] else {}, what=name
    )
    spec = DecoderSpec.from_dict(data["decoder"])
    bundle_plan = backend.bundle_plan
    if bundle_plan is not None:
        refuse_replanned(name, data, bundle_plan(spec, target_opts))
    draft = data["manifest_draft"]
    place = place_artifact(out, draft["name"], draft["version"], name, plots=plots)
    inputs = bundle_inputs(graphs_from)
    staged = tuple(rel for rel in data["files"] if rel != VALIDATION_NPZ)
    compiled_from = tuple(inputs.compiled_files(path))
    work = DecoderWork(
        backend=backend,
        spec=spec,
        ir_files=compiled_from,
        kept=tuple(rel for rel in staged if rel not in compiled_from),
        inputs=DecoderInputs(),
        info={"decode_attention": data["decode_attention"]},
        ir={"sha256": inputs_sha(path, graphs_from), "opset": int(draft["ir_opset"])},
        validate=reference_validator(path, data, spec),
        bench=bool(data["bench"] if bench is None else bench),
        stored_weights=lambda _stage: data["weights"],
        # A torch bundle's modules are made from the stage and cannot cross to a worker: traced here.
        modules=inputs.modules if graphs_from == "torch" else None,
        after_compile=inputs.after_compile if graphs_from == "torch" else None,
    )
    toolchain = key_toolchain(name, probe)
    job = finish_job(
        path, data, place, target, target_opts, work, toolchain,
        cache_dir=cache_dir, worker=worker, isolation=isolation, build_extra={"toolchain_key": toolchain},
    )  # fmt: skip
    return store_finished(path, staged, out, job, started, say)
