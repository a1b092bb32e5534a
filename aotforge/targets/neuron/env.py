"""Which Python environment holds the Neuron SDK, and how the target talks to it.

The Neuron SDK's torch cannot share aotforge's environment (torch-neuronx 2.9 pins torch 2.9;
aotforge pins torch 2.13), so compiling goes through :mod:`targets.neuron.worker`, run by that
environment's interpreter as a subprocess with one JSON request and one JSON response.

Which interpreter: the ``python`` target option when given, else the first of the locations AWS's
Deep Learning AMI documents for its Neuron PyTorch venv (aws-neuron-sdk
``setup/pytorch/update-dlami.rst``: ``/opt/aws_neuronx_venv_pytorch_2_9``). Never an environment
variable: the choice is an input, recorded with the build.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from aotforge.core.errors import CompileError, OptionsError, TargetUnavailableError
from aotforge.targets.neuron import worker

WORKER = Path(worker.__file__)
#: Neuron PyTorch venvs of the Deep Learning AMI, newest first (aws-neuron-sdk setup/pytorch/update-dlami.rst).
DLAMI_PYTHONS = (Path("/opt/aws_neuronx_venv_pytorch_2_9/bin/python"),)
#: torch-neuronx releases up to 2.9 are XLA-based with ``torch_neuronx.trace``; from torch 2.10 the
#: SDK ships TorchNeuron (eager / ``torch.compile``, Trn2/Trn3), which documents no ``trace``.
LAST_TRACE_TORCH = (2, 9)


def find_python(explicit: str, candidates: tuple[Path, ...] = DLAMI_PYTHONS) -> Path:
    """The Neuron environment's interpreter: ``explicit`` if set (it must exist), else the first candidate."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise OptionsError(f"neuron python={explicit!r} does not exist: point it at the Neuron venv's bin/python")
        return path
    for path in candidates:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in candidates) or "none"
    raise TargetUnavailableError(
        f"neuron: no Neuron SDK environment found (tried {tried}): create one from AWS's Neuron repository "
        "(make neuron-env) and pass --target-opt python=PATH/bin/python"
    )


@dataclasses.dataclass(frozen=True)
class NeuronEnv:
    """What one environment's worker reported about itself."""

    python: Path
    packages: dict[str, str | None]
    import_error: str

    @property
    def api(self) -> str:
        """``trace`` (XLA torch-neuronx), ``torchneuron`` (torch >= 2.10), or "" without torch."""
        torch = self.packages.get("torch")
        if not torch:
            return ""
        major_minor = tuple(int(p) for p in torch.split("+")[0].split(".")[:2] if p.isdigit())
        return "trace" if major_minor <= LAST_TRACE_TORCH else "torchneuron"

    def missing(self) -> list[str]:
        """What this environment lacks for ``torch_neuronx.trace``, by name; empty when it can compile."""
        gaps = [f"python package {d!r}" for d in ("torch", "torch-neuronx", "neuronx-cc") if not self.packages.get(d)]
        if not gaps and self.import_error:
            gaps.append(f"a working 'import torch_neuronx' ({self.import_error})")
        if self.api == "torchneuron":
            gaps.append(
                f"torch <= 2.9 (it has torch {self.packages['torch']}: TorchNeuron, whose documented API is "
                "eager / torch.compile on Trn2/Trn3, has no torch_neuronx.trace)"
            )
        return gaps


def call(python: Path, request: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """Run one request through the worker under ``python``; the ``result`` of an ok response."""
    with tempfile.TemporaryDirectory(prefix="aotforge-neuron-worker-") as tmp:
        req, resp = Path(tmp) / "request.json", Path(tmp) / "response.json"
        req.write_text(json.dumps({"protocol": worker.PROTOCOL, **request}, sort_keys=True))
        try:
            done = subprocess.run(
                [str(python), "-I", str(WORKER), str(req), str(resp)], capture_output=True, text=True, timeout=timeout
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CompileError(f"neuron worker under {python} did not finish: {e}") from e
        if not resp.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise CompileError(f"neuron worker under {python} exited {done.returncode} without an answer: {tail}")
        response: dict[str, Any] = json.loads(resp.read_text())
    if response.get("protocol") != worker.PROTOCOL:
        raise CompileError(f"neuron worker under {python} speaks protocol {response.get('protocol')!r}")
    if not response["ok"]:
        raise CompileError(f"neuron worker op {request['op']!r} failed under {python}: {response['error']}")
    result: dict[str, Any] = response["result"]
    return result


def inspect(python: Path) -> NeuronEnv:
    """Ask the environment's own worker what it holds (a subprocess, about a second)."""
    result = call(python, {"op": "probe"}, timeout=120)
    return NeuronEnv(python=python, packages=dict(result["packages"]), import_error=str(result["import_error"]))
