"""The one weight file of a tvm text-generation artifact: every tensor its functions take, stored once.

The export writes the float weights to ``weights.data`` (``compiler.generative.export``); the tvm build
then packs the matmul weights into other layouts (``weight_only.pack_weights``), after which the
functions read the packed copies and only a few originals (an embedding's lookup table). Storing both
files would put the weights on disk twice, so the build writes one ``tvm_weights.data`` holding what
the functions take and removes ``weights.data``; the ONNX graphs stay in the artifact as the record of
the IR it compiled, without their weight bytes (nothing runs them from a tvm artifact). Tensors with
equal bytes are stored once (an untied head packed from ``[vocab, hidden]`` for prefill / decode and
from the exporter's ``[hidden, vocab]`` transpose for verify), and at load every ref to one place of
the file gets one tvm tensor.

At load the file is read once into one anonymous mapping, 2 MiB aligned and advised onto transparent huge
pages (``targets/huge_pages.py``: a decode step streams every weight, and on 4 KiB pages nearly every page
is a TLB miss), and each tensor is a zero-copy view of it (page-aligned offsets, so 64-byte aligned too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import WEIGHTS_FILE
from aotforge.core.errors import CompileError
from aotforge.targets.huge_pages import HugePageReport, huge_page_region
from aotforge.targets.tvm.decoder.graphs import WeightRef

TVM_WEIGHTS_FILE = "tvm_weights.data"
_ALIGN = 4096  # page-aligned offsets, like weights.data: a runtime may map the file


def write_weights(workdir: Path, taken: Iterable[WeightRef], packed: Mapping[str, np.ndarray]) -> list[WeightRef]:
    """``taken`` (refs into the export's ``weights.data``) and ``packed`` written to ``TVM_WEIGHTS_FILE`` in
    ``workdir``, equal bytes once; their refs into it. ``weights.data`` is removed after."""
    out: list[WeightRef] = []
    stored: dict[str, int] = {}
    source = workdir / WEIGHTS_FILE
    with (workdir / TVM_WEIGHTS_FILE).open("wb") as f, source.open("rb") as original:

        def store(name: str, raw: bytes, dtype: str, shape: tuple[int, ...]) -> None:
            key = hashlib.sha256(raw).hexdigest()
            if key not in stored:
                f.write(b"\0" * (-f.tell() % _ALIGN))
                stored[key] = f.tell()
                f.write(raw)
            out.append(WeightRef(name, stored[key], len(raw), dtype, tuple(int(d) for d in shape), TVM_WEIGHTS_FILE))

        for ref in taken:
            store(ref.name, _read_raw(original, ref), ref.dtype, ref.shape)
        for name, array in packed.items():
            store(name, array.tobytes(), str(array.dtype), tuple(array.shape))
    source.unlink()
    return out


def _read_raw(f: Any, ref: WeightRef) -> bytes:
    f.seek(ref.offset)
    raw = f.read(ref.length)
    if len(raw) != ref.length:
        raise CompileError(f"{WEIGHTS_FILE} ends before tensor {ref.name} ({ref.length} bytes at {ref.offset})")
    return bytes(raw)


def read_weights(
    artifact_dir: Path, refs: Iterable[WeightRef], huge_pages: bool = True, report: HugePageReport | None = None
) -> dict[str, Any]:
    """Each weight tensor as a tvm tensor, read once; refs to the same bytes share one tensor. ``huge_pages``:
    ``TVM_WEIGHTS_FILE`` lands in one region on 2 MiB pages (what the kernel granted goes to ``report``).

    Artifacts built before ``TVM_WEIGHTS_FILE`` held everything name ``weights.data`` too: those tensors are
    read one by one into tvm's own allocations, as before."""
    import tvm

    out: dict[str, Any] = {}
    tensors: dict[tuple[str, int, int, str, tuple[int, ...]], Any] = {}
    regions: dict[str, np.ndarray] = {}
    for ref in refs:
        if ref.file not in (WEIGHTS_FILE, TVM_WEIGHTS_FILE):
            raise CompileError(f"{artifact_dir} names a weight file {ref.file!r} of no tvm artifact")
        where = (ref.file, ref.offset, ref.length, ref.dtype, ref.shape)
        if where in tensors:
            pass
        elif ref.file == TVM_WEIGHTS_FILE:
            if ref.file not in regions:
                regions[ref.file] = _read_region(artifact_dir / ref.file, huge_pages, report or HugePageReport())
            tensors[where] = tvm.runtime.from_dlpack(_view(regions[ref.file], ref, artifact_dir / ref.file))
        else:
            tensors[where] = _read_tensor(tvm, artifact_dir / ref.file, ref)
        out[ref.name] = tensors[where]
    return out


def _read_region(path: Path, huge_pages: bool, report: HugePageReport) -> np.ndarray:
    """``path``'s bytes in one region on 2 MiB pages (``huge_page_region``; plain pages unless ``huge_pages``)."""
    size = path.stat().st_size
    with huge_page_region(size, huge_pages, report) as region, path.open("rb") as f:
        done = 0
        while done < size:
            got = f.readinto(region[done:].data)
            if not got:
                raise CompileError(f"{path} is shorter than its {size} bytes: the artifact is damaged; rebuild it")
            done += got
    return region


def _view(region: np.ndarray, ref: WeightRef, path: Path) -> np.ndarray:
    if ref.offset + ref.length > region.size:
        raise CompileError(f"{path} ends before tensor {ref.name} ({ref.length} bytes at {ref.offset})")
    return region[ref.offset : ref.offset + ref.length].view(ref.dtype).reshape(ref.shape)


def _read_tensor(tvm: Any, path: Path, ref: WeightRef) -> Any:
    tensor = tvm.runtime.empty(ref.shape, ref.dtype)
    view = np.from_dlpack(tensor)
    with path.open("rb") as f:
        f.seek(ref.offset)
        if f.readinto(view.reshape(-1).view(np.uint8).data) != ref.length:
            raise CompileError(f"{path} ends before tensor {ref.name} ({ref.length} bytes at {ref.offset})")
    return tensor
