"""Time one runtime on one model in this process and print the result as one JSON line.

tools/bench.py starts one of these per (model, runtime) because the runtimes' thread pools keep
spinning after a call and slow down whatever runs next in the same process. Every kind times the
same seeded inputs: the ones the ORT fp32 artifact of the model validated with.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.benchmark import BenchOptions, benchmark
from aotforge.compiler.sample_inputs import make_inputs
from aotforge.compiler.source import Arrays
from aotforge.core.spec import IOSpec

THREADS = 2


def inputs_of(artifact: Path) -> tuple[IOSpec, dict[str, int], Arrays]:
    manifest = read_manifest(artifact)
    io = IOSpec.from_dict(manifest.io)
    sizes = dict(manifest.validation["bound_dims"])
    return io, sizes, make_inputs(io, sizes, seed=0, count=1)[0]


def artifact_runner(artifact: Path, _model: str | None) -> tuple[Callable[[Arrays], Any], float]:
    from aotforge.artifacts.loader import load

    return load(artifact).run, 0.0


def _torch_module(source: str) -> Any:
    """``get_model()`` of a model file, or ``get_model(name)`` for ``file.py:name``."""
    model_file, _, name = source.partition(":")
    spec = importlib.util.spec_from_file_location("bench_model", model_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_model(name) if name else module.get_model()


def torch_runner(artifact: Path, model_file: str | None, *, compiled: bool) -> tuple[Callable[[Arrays], Any], float]:
    import torch

    torch.set_num_threads(THREADS)
    assert model_file is not None
    module = _torch_module(model_file)
    io = IOSpec.from_dict(read_manifest(artifact).io)
    names = [s.name for s in io.inputs]
    if compiled:
        module = torch.compile(module)

    def run(inputs: Arrays) -> Any:
        with torch.inference_mode():
            return module(*(torch.from_numpy(inputs[n]) for n in names))

    started = time.perf_counter()
    if compiled:  # the first call compiles; report it as build time, not latency
        run(inputs_of(artifact)[2])
    return run, time.perf_counter() - started


def tvm_untuned_runner(artifact: Path, _model: str | None) -> tuple[Callable[[Arrays], Any], float]:
    """TVM's stock ``tvm.compile`` pipeline on the same IR: what a user gets without our schedule rules."""
    import onnx_ir as ir
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.targets.tvm.importable import prepare
    from aotforge.targets.tvm.options import TvmOptions, target_dict

    io, sizes, _ = inputs_of(artifact)
    shapes = {s.name: list(s.bind(sizes)) for s in io.inputs}
    started = time.perf_counter()
    proto, _ = prepare(ir.load(artifact / "model.onnx"), shapes)
    mod = from_onnx(proto, shape_dict=shapes, dtype_dict={s.name: s.dtype for s in io.inputs})
    executable = tvm.compile(mod, target=tvm.target.Target(target_dict(TvmOptions())))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    names = [s.name for s in io.inputs]

    def run(inputs: Arrays) -> Any:
        return vm["main"](*(tvm.runtime.tensor(np.ascontiguousarray(inputs[n])) for n in names))

    return run, time.perf_counter() - started


KINDS: dict[str, Callable[[Path, str | None], tuple[Callable[[Arrays], Any], float]]] = {
    "artifact": artifact_runner,
    "torch-eager": lambda a, m: torch_runner(a, m, compiled=False),
    "torch-compile": lambda a, m: torch_runner(a, m, compiled=True),
    "tvm-untuned": tvm_untuned_runner,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--artifact", type=Path, required=True, help="artifact to time, or whose inputs to use")
    parser.add_argument("--inputs-from", type=Path, help="artifact whose validation inputs to time with")
    parser.add_argument("--model", help="model file (or file.py:name), for the torch kinds")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    run, setup_seconds = KINDS[args.kind](args.artifact, args.model)
    inputs = inputs_of(args.inputs_from or args.artifact)[2]
    options = BenchOptions(
        warmup=args.warmup, min_runs=args.runs, max_runs=max(args.runs, 1000), max_seconds=args.seconds
    )
    result = benchmark(run, inputs, options)
    print(json.dumps({**dataclasses.asdict(result), "setup_seconds": round(setup_seconds, 2)}))


if __name__ == "__main__":
    main()
