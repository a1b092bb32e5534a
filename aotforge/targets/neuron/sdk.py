"""Every call into torch-neuronx / neuronx-cc, kept in one thin module.

``torch_neuronx`` is imported only inside functions: PyPI's ``torch-neuronx`` is a placeholder
that raises on import, and the real SDK exists only on hosts with AWS's Neuron repository.
The sparsity-mask carry-over uses plain torch and runs (and is tested) anywhere.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import importlib
import importlib.metadata
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.core.errors import AotforgeError, CompileError, TargetUnavailableError, UnsupportedModelError
from aotforge.targets.base import ProbeResult
from aotforge.targets.neuron import env

_PACKAGES = {"torch-neuronx": "torch_neuronx", "neuronx-cc": "neuronxcc"}


def probe(python: str = "") -> ProbeResult:
    """What is missing to compile (the packages, here or in a Neuron environment) and to run (a
    device); never raises. ``python`` is the Neuron environment's interpreter (``env.find_python``)."""
    missing, details = [], {}
    for dist, module in _PACKAGES.items():
        try:
            importlib.import_module(module)
            details[dist] = importlib.metadata.version(dist)
        except Exception as e:  # noqa: BLE001 - PyPI's placeholders raise "WRONG PACKAGE" on import
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            missing.append(f"python package {dist!r} ({type(e).__name__}: {first[:120]})")
    devices = sorted(glob.glob("/dev/neuron[0-9]*"))
    if devices:
        details["devices"] = str(len(devices))
    if missing:
        return _probe_worker_env(python, missing, details, bool(devices))
    if not devices:
        reason = "neuron can compile here but not run: no Neuron device (no /dev/neuron*); run on inf2 / trn1 / trn2"
        return ProbeResult(False, reason, can_compile=True, details=details)
    return ProbeResult(True, details=details)


def probe_to_compile(python: str = "") -> ProbeResult:
    """:func:`probe`, refusing with its reason where nothing can compile (neither here nor in a Neuron environment)."""
    found = probe(python)
    if not found.compiles:
        raise TargetUnavailableError(found.reason)
    return found


@dataclasses.dataclass(frozen=True)
class Trace:
    """One graph to compile: the torch module, its example inputs, a key naming its scratch space, its file."""

    module: Any
    examples: list[np.ndarray]
    key: str
    out: Path


def trace_all(found: ProbeResult, traces: Iterable[Trace], args: list[str]) -> dict[str, str]:
    """Compile each of ``traces`` with neuronx-cc, in this process or in the Neuron environment ``found`` (a
    :func:`probe_to_compile` result) names; returns the toolchain versions that compiled them.

    neuronx-cc's scratch space lives outside the artifact: its intermediates must not ship or be hashed. It is
    kept when a trace fails (the error names it), removed once all compiled.
    """
    worker_python = found.details.get("neuron_python")  # set when a separate environment compiles
    scratch = Path(tempfile.mkdtemp(prefix="aotforge-neuronx-cc-"))
    for trace in traces:
        if worker_python:
            trace_in_worker(Path(worker_python), trace.module, trace.examples, args, scratch / trace.key, trace.out)
        else:
            trace_to_file(trace.module, trace.examples, args, scratch / trace.key, trace.out)
    shutil.rmtree(scratch, ignore_errors=True)
    if worker_python:
        return {d: found.details[d] for d in ("torch", "torch-neuronx", "neuronx-cc") if d in found.details}
    return versions()


def worker_env(python: str = "") -> env.NeuronEnv | str:
    """The Neuron environment the worker would compile in, or why there is none usable."""
    try:
        found = env.inspect(env.find_python(python))
    except (AotforgeError, OSError) as e:
        return str(e)
    gaps = found.missing()
    return found if not gaps else f"the Neuron environment at {found.python} lacks: {'; '.join(gaps)}"


def _probe_worker_env(python: str, missing: list[str], details: dict[str, str], devices: bool) -> ProbeResult:
    # torch-neuronx cannot live beside aotforge's torch pin: a separate environment compiles.
    found = worker_env(python)
    if isinstance(found, env.NeuronEnv):
        details.update(neuron_python=str(found.python), neuron_api=found.api)
        details.update({k: v for k, v in found.packages.items() if v})
        reason = (
            f"neuron compiles here through the Neuron environment at {found.python}, but loading and running "
            "need torch-neuronx in aotforge's own process, which its torch pin rules out (not implemented: a "
            "serving worker)"
        )
        return ProbeResult(False, reason, can_compile=True, details=details)
    hint = "install the Neuron SDK from AWS's Neuron pip repository (pip.repos.neuron.amazonaws.com)"
    reason = "neuron needs, and this host lacks: " + "; ".join(missing) + f"; {found}"
    if not devices:
        reason += "; a Neuron device (no /dev/neuron*: run on an inf2 / trn1 / trn2 instance)"
    return ProbeResult(False, f"{reason}: {hint}", can_compile=False, details=details)


def trace_in_worker(
    python: Path, module: Any, examples: list[np.ndarray], args: list[str], workdir: Path, out: Path
) -> None:
    """:func:`trace_to_file` in the Neuron environment: the (masked) module goes as a
    ``torch.export`` program file, the examples as an npz; the worker traces and saves."""
    import torch

    workdir.mkdir(parents=True, exist_ok=True)
    tensors = tuple(torch.from_numpy(a) for a in examples)
    # Exported by aotforge's torch and loaded by the Neuron environment's older one: torch.export's
    # serialized schema is versioned, and an older reader may refuse a newer file (the worker says so).
    torch.export.save(torch.export.export(module, tensors), str(workdir / "program.pt2"))
    np.savez(workdir / "examples.npz", *examples)  # arr_0, arr_1, ... in the model's input order
    request = {
        "op": "trace",
        "program": str(workdir / "program.pt2"),
        "examples": str(workdir / "examples.npz"),
        "compiler_args": args,
        "workdir": str(workdir / "neuronx-cc"),
        "out": str(out),
        "cpu_backend": not has_device(),
    }
    env.call(python, request, timeout=4 * 3600)


def versions() -> dict[str, str]:
    return {dist: importlib.metadata.version(dist) for dist in _PACKAGES}


def module_of(program: Any) -> Any:
    """A private copy of the program's module: masks and tracing must not touch the reference."""
    module = program.module() if hasattr(program, "module") else program
    return copy.deepcopy(module).eval()


def carry_sparsity_masks(module: Any, model: ir.Model) -> list[str]:
    """Zero the torch weights that the sparsity pass zeroed in the IR, matched by name and shape.

    The passes run on the ONNX IR, but Neuron compiles the torch program: without this the
    Neuron build would silently be dense. Returns the parameter names that received a mask.
    """
    import torch

    zeros = _zero_masks(model)
    masked = []
    with torch.no_grad():
        for name, param in module.named_parameters():
            mask = zeros.get(name)
            if mask is not None and tuple(mask.shape) == tuple(param.shape) and mask.any():
                param.masked_fill_(torch.from_numpy(mask), 0)
                masked.append(name)
    if not masked:
        raise UnsupportedModelError(
            "neuron: a sparsity pass ran but no weight of the torch program matches a sparsified ONNX initializer "
            "by name and shape, so the masks cannot be carried over; drop the sparsity pass for this target"
        )
    return sorted(masked)


def _zero_masks(model: ir.Model) -> dict[str, np.ndarray]:
    masks = {}
    for name, value in model.graph.initializers.items():
        if value.const_value is not None:
            array = value.const_value.numpy()
            if array.dtype.kind == "f":
                masks[str(name)] = array == 0
    return masks


def has_device() -> bool:
    return bool(glob.glob("/dev/neuron[0-9]*"))


def trace_to_file(module: Any, examples: list[np.ndarray], args: list[str], workdir: Path, out: Path) -> None:
    """Compile one bucket with neuronx-cc and save it as TorchScript into the artifact.

    ``workdir`` is neuronx-cc's scratch space, outside the artifact (its intermediates must not
    ship or be hashed). Without a Neuron device the trace runs on the CPU: ``cpu_backend=True``
    with ``--target`` in ``compiler_args``, as torch-neuronx documents it (aws-neuron-sdk
    ``frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.rst``).
    """
    import torch
    import torch_neuronx

    workdir.mkdir(parents=True, exist_ok=True)
    tensors = tuple(torch.from_numpy(a) for a in examples)
    try:
        traced = torch_neuronx.trace(
            module, tensors, compiler_args=args, compiler_workdir=str(workdir), cpu_backend=not has_device()
        )
    except Exception as e:  # neuronx-cc reports failures as generic RuntimeErrors
        raise CompileError(
            f"neuronx-cc failed for shapes {[a.shape for a in examples]}: {str(e).strip().splitlines()[-1:]}; "
            f"its logs are under {workdir}"
        ) from e
    torch.jit.save(traced, str(out))


def host_instance_type() -> str:
    """This host's EC2 instance type as ``neuron-ls`` prints it ("" without neuron-ls or a device)."""
    exe = shutil.which("neuron-ls")
    if exe is None:
        return ""
    try:
        out = subprocess.run([exe], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return parse_instance_type(out)


def parse_instance_type(neuron_ls_output: str) -> str:
    """The ``instance-type:`` line of neuron-ls (aws-neuron-sdk ``tools/neuron-sys-tools/neuron-ls.rst``)."""
    found = re.search(r"^\s*instance-type:\s*(\S+)", neuron_ls_output, flags=re.MULTILINE)
    return found.group(1) if found else ""


def load_traced(path: Path) -> Any:
    import torch
    import torch_neuronx  # noqa: F401 - registers the Neuron ops TorchScript needs to load the graph

    return torch.jit.load(str(path))


def call(graph: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        # np.require keeps a 0-d input 0-d (np.ascontiguousarray makes it 1-d).
        result = graph(*(torch.from_numpy(np.require(a, requirements="C")) for a in inputs))
    values = result if isinstance(result, tuple | list) else (result,)
    return [v.detach().cpu().numpy() for v in values]
