"""The generated malformed-model corpus of the fault-injection suite (tests/test_fault_injection.py).

Every case is a file a careless user or an attacker could hand to ``aotforge compile``: impossible
shapes, unknown element types, graphs without outputs, NaN-producing sources, a Loop of 2^30
iterations, and the bytes of a good model truncated or overwritten. Cases are generated from a
seed, so a failure names a case that reproduces.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto

from tests import hostile_models
from tests.tiny_models import relu_add

Writer = Callable[[Path], Path]


def _model(proto_fn: Callable[[], onnx.ModelProto], name: str) -> Writer:
    def write(directory: Path) -> Path:
        path = directory / f"{name}.onnx"
        onnx.save(proto_fn(), path)
        return path

    return write


def _bytes(name: str, mutate: Callable[[bytes], bytes]) -> Writer:
    def write(directory: Path) -> Path:
        good = relu_add(directory / "good.onnx").read_bytes()
        path = directory / f"{name}.onnx"
        path.write_bytes(mutate(good))
        return path

    return write


def _flip(offset: int, bit: int) -> Callable[[bytes], bytes]:
    def mutate(raw: bytes) -> bytes:
        data = bytearray(raw)
        data[offset % len(data)] ^= 1 << bit
        return bytes(data)

    return mutate


def corpus(seed: int = 0) -> dict[str, Writer]:
    """At least 75 model files; the suite builds each for both CPU targets (>= 150 cases)."""
    rng = random.Random(seed)
    unary = hostile_models._unary
    cases: dict[str, Writer] = {}
    for dims in ([1, -1], [-5], [1, -(2**31)], [0], [3, 0, 2], [1, 2**40], [2**62], [2**33, 2**33], [65536, 65536, 4]):
        name = "dims_" + "_".join(str(d).replace("-", "m") for d in dims)
        cases[name] = _model(lambda dims=dims: unary("g", dims), name)
    for elem in (0, 17, 26, 40, 99, 1000):
        cases[f"elem_{elem}"] = _model(lambda elem=elem: unary("g", [1, 4], elem=elem), f"elem_{elem}")
    for op in ("Relu", "Sigmoid", "Neg"):
        cases[f"int_into_{op}"] = _model(lambda op=op: unary("g", [1, 4], TensorProto.INT64, op), f"int_into_{op}")
    cases["string_input"] = _model(lambda: unary("g", [1, 4], TensorProto.STRING, "Identity"), "string_input")
    cases["no_outputs"] = _model(hostile_models._no_outputs, "no_outputs")
    cases["nan_source"] = _model(hostile_models._nan_source, "nan_source")
    cases["loop_2_30"] = _model(hostile_models._long_loop, "loop_2_30")
    cases["unknown_op"] = _model(lambda: unary("g", [1, 4], op="NoSuchOp"), "unknown_op")
    cases["empty_file"] = _bytes("empty_file", lambda raw: b"")
    cases["not_onnx_text"] = _bytes("not_onnx_text", lambda raw: b"this is not a model\n" * 10)
    cases["zeros"] = _bytes("zeros", lambda raw: bytes(len(raw)))
    for i in range(16):
        cut = rng.randrange(1, 400)
        cases[f"truncated_{i}_{cut}"] = _bytes(f"truncated_{i}", lambda raw, cut=cut: raw[: min(cut, len(raw) - 1)])
    for i in range(36):
        offset, bit = rng.randrange(400), rng.randrange(8)
        cases[f"flip_{i}_{offset}_{bit}"] = _bytes(f"flip_{i}", _flip(offset, bit))
    return cases
