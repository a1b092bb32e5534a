"""The Neuron worker: runs inside the Neuron SDK's own Python environment, never in aotforge's.

torch-neuronx pins its own torch (2.9 for the last XLA-based ``torch_neuronx.trace``, Neuron
2.31), which cannot be installed beside aotforge's torch pin. So the target runs this file with
the Neuron environment's interpreter, ``python -I worker.py REQUEST RESPONSE``: ``-I`` keeps
aotforge's ``PYTHONPATH`` and user site out, and this file imports only the standard library at
the top (aotforge is not installed there). One JSON request in, one JSON response out
(``targets/neuron/env.py`` writes and reads them); ``protocol`` must match on both sides.

Ops: ``probe`` (what this environment holds: versions, which Neuron API) and ``trace`` (compile
one bucket from a ``torch.export`` program file and save the TorchScript result).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import traceback
from typing import Any

PROTOCOL = 1
PACKAGES = ("torch", "torch-neuronx", "neuronx-cc", "libneuronxla")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe(_request: dict[str, Any]) -> dict[str, Any]:
    """Versions of the Neuron packages here, and whether ``import torch_neuronx`` works."""
    result: dict[str, Any] = {
        "executable": sys.executable,
        "python": ".".join(map(str, sys.version_info[:3])),
        "packages": {dist: _version(dist) for dist in PACKAGES},
        "import_error": "",
    }
    try:
        import torch_neuronx  # noqa: F401
    except Exception as e:  # noqa: BLE001 - PyPI's placeholder raises "WRONG PACKAGE"; report, never crash
        result["import_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return result


def trace(request: dict[str, Any]) -> dict[str, Any]:
    """``torch_neuronx.trace`` of the program's module on the example inputs, saved as TorchScript."""
    import numpy as np
    import torch

    # The hand-off first: a program file this torch cannot read fails here, before neuronx-cc.
    module = torch.export.load(request["program"]).module()
    with np.load(request["examples"]) as npz:
        examples = tuple(torch.from_numpy(npz[f"arr_{i}"]) for i in range(len(npz.files)))
    module(*examples)
    import torch_neuronx

    traced = torch_neuronx.trace(
        module,
        examples,
        compiler_args=request["compiler_args"],
        compiler_workdir=request["workdir"],
        cpu_backend=bool(request["cpu_backend"]),
    )
    torch.jit.save(traced, request["out"])
    return {"out": request["out"]}


OPS = {"probe": probe, "trace": trace}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """One request to one response; a failure is a response too, with the traceback's last lines."""
    if request.get("protocol") != PROTOCOL:
        return {"protocol": PROTOCOL, "ok": False, "error": f"protocol {request.get('protocol')!r}, worker {PROTOCOL}"}
    op = OPS.get(str(request.get("op")))
    if op is None:
        return {"protocol": PROTOCOL, "ok": False, "error": f"unknown op {request.get('op')!r}; ops: {sorted(OPS)}"}
    try:
        return {"protocol": PROTOCOL, "ok": True, "result": op(request)}
    except Exception as e:  # noqa: BLE001 - the caller raises it with context
        tail = "".join(traceback.format_exception(e)[-3:]).strip()
        return {"protocol": PROTOCOL, "ok": False, "error": f"{type(e).__name__}: {e}", "traceback": tail}


def main(argv: list[str]) -> int:
    request_path, response_path = argv
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    response = handle(request)
    with open(response_path, "w", encoding="utf-8") as f:
        json.dump(response, f, sort_keys=True)
    return 0 if response["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
