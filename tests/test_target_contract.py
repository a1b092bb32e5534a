"""Every target holds to the contract in ``aotforge.targets.base``: one test, parametrized over all four.

What runs without the device runs for every target (probe, options, plan and its refusals,
the optional hooks); compile -> load -> run runs where ``probe()`` says the target is available (tensorrt and neuron
under their device markers, so ``make device-check`` fails where the device is missing).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import aotforge
from aotforge.core.errors import AotforgeError, OptionsError, UnsupportedModelError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import DimRange, IOSpec, TensorSpec
from aotforge.core.target_record import TargetRecord
from aotforge.targets import SHARD_KINDS, TARGETS, generative_backend, get_target, shard_runtime
from aotforge.targets.base import BuildContext, GenerativeBackend, ProbeResult, ShardRuntime, Target, WeightGrid

ROWS = IOSpec(
    inputs=(TensorSpec("x", "float32", ("batch", 8)),),
    outputs=(TensorSpec("y", "float32", ("batch", 4)),),
    dims=(DimRange("batch", 1, 2, 4),),
)


def _weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)


def _linear_onnx() -> ir.Model:
    """y = relu(x @ W + b): small, standard ONNX, with a named dynamic batch."""
    w_value, b_value = _weights()
    w = helper.make_tensor("w", TensorProto.FLOAT, (8, 4), w_value.ravel())
    b = helper.make_tensor("b", TensorProto.FLOAT, (4,), b_value)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[w, b],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _torch_program() -> Any:
    """What the torch frontend hands neuron: an exported program of the same model, weights included, so one
    reference (ONNX Runtime on the ONNX model) checks every target's compile."""
    w, b = _weights()
    linear = torch.nn.Linear(8, 4)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(w.T.copy()))
        linear.bias.copy_(torch.from_numpy(b))
    module = torch.nn.Sequential(linear, torch.nn.ReLU()).eval()
    return torch.export.export(module, (torch.zeros(2, 8),))


def _ctx(name: str, passes: tuple[str, ...] = (), contrib: tuple[str, ...] = ()) -> BuildContext:
    torch_program = _torch_program() if name == "neuron" else None
    source = "torch" if torch_program is not None else "onnx"
    return BuildContext(
        io=ROWS, passes=passes, source_format=source, torch_program=torch_program, contrib_passes=contrib
    )


@pytest.fixture(params=sorted(TARGETS))
def target(request: pytest.FixtureRequest) -> Target:
    return get_target(str(request.param))


#: Every (target, option) whose default is a number or a boolean: each one refuses a value of another type.
TYPED_OPTIONS = [
    (name, field.name)
    for name in sorted(TARGETS)
    for field in dataclasses.fields(get_target(name).options_type)
    if isinstance(field.default, bool | int | float)
]


def test_target_is_named_as_in_the_table_and_subclasses_the_contract(target: Target) -> None:
    assert isinstance(target, Target) and TARGETS[target.name].endswith(type(target).__name__)
    assert dataclasses.is_dataclass(target.options_type) and target.options_type.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_generative_backend_is_a_module_of_the_targets_folder(target: Target) -> None:
    """A target is one folder and one registry line: its text-generation backend, where it has one, lives beside
    its ``Target`` (``generative_module``) and gives the typed record the build line reads."""
    if not target.generative_module:
        assert target.generative() is None
        return
    folder = type(target).__module__.rpartition(".")[0]
    assert folder != "aotforge.targets" and target.generative_module.startswith(folder + "."), folder
    backend = target.generative()
    assert isinstance(backend, GenerativeBackend) and backend is generative_backend(target.name)


def test_shard_runtimes_are_modules_of_the_targets_folder(target: Target) -> None:
    """A target's tensor- and pipeline-parallel runtimes (``GenerativeBackend.tensor_parallel`` /
    ``pipeline_parallel``) are modules of its folder: the sharded build and the rank / stage processes read them
    from there, never from a table of targets."""
    folder = type(target).__module__.rpartition(".")[0]
    for kind in SHARD_KINDS:
        runtime = shard_runtime(target.name, kind)
        if runtime is None:
            continue
        assert isinstance(runtime, ShardRuntime)
        assert runtime.module.startswith(folder + ".") and runtime.compile.__module__.startswith(folder + ".")
        for module in (runtime.module, *runtime.preload):
            importlib.import_module(module)


def test_weight_grids_are_typed_per_bit_width(target: Target) -> None:
    """The weight-only rounding ``aotforge qat`` trains through is the target's own declaration."""
    assert all(bits in (4, 8) and isinstance(g, WeightGrid) and g.levels > 0 for bits, g in target.weight_grids.items())


def _target_name_tables(path: Path, rel: Path) -> list[str]:
    """Where ``path`` names a target in a dict's keys, a tuple / list / set or a comparison: a per-target table."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            values: list[Any] = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            values = list(node.elts)
        elif isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
        else:
            continue
        found += [
            f"{rel}:{node.lineno} {v.value!r}" for v in values if isinstance(v, ast.Constant) and v.value in TARGETS
        ]
    return found


#: Names of libraries that happen to be targets' names too (the CLI quiets their loggers).
LIBRARY_LOGGERS = {"aotforge/compiler/cli/progress.py"}


def test_a_new_target_is_one_folder_and_one_registry_line() -> None:
    """No module outside a target's folder and the registry (``targets/__init__.py``) keeps a table of targets: what
    differs between targets is a field of the ``Target`` contract or of its ``GenerativeBackend``."""
    package = Path(aotforge.__file__).parent
    tables = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        if rel.parts[1] == "targets" and (
            len(rel.parts) == 3 and rel.parts[2] == "__init__.py" or rel.parts[2] in TARGETS
        ):
            continue
        if rel.as_posix() not in LIBRARY_LOGGERS:
            tables += _target_name_tables(path, rel)
    assert tables == []


def test_probe_says_why_when_unavailable(target: Target) -> None:
    probe = target.probe()
    assert isinstance(probe, ProbeResult)
    if not probe.available:  # a sentence saying what is missing, not a bare "no"
        assert len(probe.reason.split()) >= 4, probe.reason


def test_options_default_and_round_trip_through_json(target: Target) -> None:
    """The CLI, recipes and bundles all parse options through options_from_dict: defaults build,
    and a JSON round trip (a bundle's target_options) gives back equal options."""
    options = options_from_dict(target.options_type, {}, what=target.name)
    again = options_from_dict(
        target.options_type, json.loads(json.dumps(dataclasses.asdict(options))), what=target.name
    )
    assert again == options


def test_unknown_option_is_refused_naming_the_valid_ones(target: Target) -> None:
    with pytest.raises(OptionsError, match=rf"unknown {target.name} option\(s\) no_such_knob; valid: "):
        options_from_dict(target.options_type, {"no_such_knob": "1"}, what=target.name)


def test_plan_accepts_a_plain_model(target: Target) -> None:
    options = options_from_dict(target.options_type, {}, what=target.name)
    target.plan(_linear_onnx(), options, _ctx(target.name))


@pytest.mark.parametrize("emitting", ["fuse-ort", "weight-only"])
def test_plan_refuses_contrib_op_passes_except_onnxruntime(target: Target, emitting: str) -> None:
    options = options_from_dict(target.options_type, {}, what=target.name)
    ctx = _ctx(target.name, passes=(emitting,), contrib=(emitting,))
    if target.runs_contrib_ops:
        target.plan(_linear_onnx(), options, ctx)  # onnxruntime: the one runtime that has those contrib ops
        return
    with pytest.raises(UnsupportedModelError, match=rf"{target.name} cannot honour pass '{emitting}'"):
        target.plan(_linear_onnx(), options, ctx)


def test_every_target_has_typed_options_to_refuse() -> None:
    """The parametrization below covers every target (none drops out for want of a numeric option)."""
    assert {name for name, _ in TYPED_OPTIONS} == set(TARGETS)


@pytest.mark.parametrize(("name", "option"), TYPED_OPTIONS)
def test_every_refusal_is_an_aotforge_error(name: str, option: str) -> None:
    """A value of the wrong type, from the CLI, is one clear error (never a ValueError traceback)."""
    with pytest.raises(AotforgeError, match=rf"{name} option {option} expects"):
        options_from_dict(get_target(name).options_type, {option: "not-a-number"}, what=name)


def test_optional_hooks_have_working_defaults(target: Target, tmp_path: Path) -> None:
    options = options_from_dict(target.options_type, {}, what=target.name)
    assert isinstance(target.with_cache_dir(options, tmp_path), target.options_type)
    assert all(isinstance(v, dict) for v in target.pass_defaults.values())
    assert all(isinstance(p, str) and p for p in target.runtime_packages)
    assert all(isinstance(v, float) and v > 0 for v in target.build_resources.values())
    assert isinstance(target.runs_contrib_ops, bool)
    coverage = target.coverage(_linear_onnx(), ROWS, options)
    assert coverage is None or {"direct", "refused"} <= set(coverage)
    plan = target.bundle_plan(_linear_onnx(), options, _ctx(target.name))
    assert plan is None or json.loads(json.dumps(plan)) == plan


#: The device targets' runs carry their marker: deselected by default, run (and failing where the device is
#: missing) under ``make device-check``'s AOTFORGE_REQUIRE.
DEVICE_MARKS = {"tensorrt": pytest.mark.gpu, "neuron": pytest.mark.neuron}


@pytest.mark.parametrize("name", [pytest.param(n, marks=DEVICE_MARKS.get(n, ())) for n in sorted(TARGETS)])
def test_compile_load_run_matches_the_source(name: str, tmp_path: Path) -> None:
    target = get_target(name)
    if not target.probe().available:
        pytest.skip(f"{target.name} is not available here: {target.probe().reason}")
    model, options = _linear_onnx(), options_from_dict(target.options_type, {}, what=target.name)
    ctx = _ctx(target.name)
    target.plan(model, options, ctx)
    ir.save(model, tmp_path / "model.onnx")
    compiled = target.compile(model, options, ctx, tmp_path)
    assert compiled.files and all((tmp_path / f).is_file() for f in compiled.files)
    record = TargetRecord(target.name, dataclasses.asdict(options), dict(compiled.target_info))
    runner = target.load(tmp_path, TargetRecord.from_dict(json.loads(json.dumps(dataclasses.asdict(record)))), ROWS)
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
