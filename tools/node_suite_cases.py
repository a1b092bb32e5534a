"""The node suite's cases as files: each case of ``onnx.backend.test`` written as onnx's generate-data writes
it (``model.onnx`` + ``test_data_set_<k>/input_<i>.pb, output_<i>.pb``), with its data in memory and the op
family it counts in (``tools/node_suite.py`` runs them).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path
from typing import Any

import node_suite_constants
import numpy as np
import onnx
from onnx import numpy_helper


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: Path
    inputs: list[list[Any]]  # per data set, in graph-input order
    expected: list[list[Any]]  # per data set, in graph-output order
    rtol: float
    atol: float
    family: str = ""


def collect(match: str | None = None) -> list[Any]:
    """onnx's node test cases (``onnx.backend.test.case.node``), optionally those whose name matches."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cases' own numpy runs divide by zero on purpose
        cases = node.collect_testcases(None)
    pattern = re.compile(match) if match else None
    return [c for c in cases if pattern is None or pattern.search(c.name)]


VARIANTS = ("generated", "constants")


def write_case(case: Any, root: Path, variant: str = "generated") -> Case:
    """``model.onnx`` and ``test_data_set_<k>/input_<i>.pb, output_<i>.pb``, as onnx's generate-data writes them.

    ``variant="constants"`` first binds the shape-like inputs to their values (``node_suite_constants``).
    """
    directory = root / case.name
    (directory).mkdir(parents=True, exist_ok=True)
    model_path = directory / "model.onnx"
    model, kept = (
        node_suite_constants.bind_constant_inputs(case.model, case.data_sets)
        if variant == "constants"
        else (case.model, None)
    )
    onnx.save(model, model_path)
    graph = model.graph
    all_inputs, all_expected = [], []
    for k, (inputs, outputs) in enumerate(case.data_sets):
        inputs = list(inputs) if kept is None else [inputs[i] for i in kept]
        data = directory / f"test_data_set_{k}"
        data.mkdir(exist_ok=True)
        for prefix, values, infos in (("input", inputs, graph.input), ("output", outputs, graph.output)):
            for j, value in enumerate(values):
                (data / f"{prefix}_{j}.pb").write_bytes(_proto(value, infos[j]).SerializeToString())
        all_inputs.append([_array(v) for v in inputs])
        all_expected.append([_array(v) for v in outputs])
    return Case(
        case.name, model_path, all_inputs, all_expected, float(case.rtol), float(case.atol), family(case.name, model)
    )


def family(case_name: str, model: onnx.ModelProto) -> str:
    """The op a case tests: the longest schema name whose snake_case the case name starts with."""
    rest = case_name.removeprefix("test_")
    best = ""
    best_length = 0
    for name, snake in _snake_ops().items():
        for form in (snake, name.lower()):
            if (rest == form or rest.startswith(form + "_")) and len(form) > best_length:
                best, best_length = name, len(form)
    return best or (model.graph.node[0].op_type if model.graph.node else "?")


_SNAKE: dict[str, str] = {}


def _snake_ops() -> dict[str, str]:
    if not _SNAKE:
        for schema in onnx.defs.get_all_schemas_with_history():
            if schema.domain in ("", "ai.onnx"):
                _SNAKE[schema.name] = re.sub(
                    r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", schema.name
                ).lower()
    return _SNAKE


def _proto(value: Any, info: onnx.ValueInfoProto) -> Any:
    if isinstance(value, onnx.TensorProto):
        return value
    if info.type.HasField("sequence_type"):
        return numpy_helper.from_list(value, info.name)
    if info.type.HasField("optional_type"):
        return numpy_helper.from_optional(value, info.name)
    return numpy_helper.from_array(np.asarray(value), info.name)


def _array(value: Any) -> Any:
    # numpy scalars (np.float32(2)) stand for 0-d tensors; sequences stay lists, empty optionals None.
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value if isinstance(value, list) or value is None else np.asarray(value)
