"""The tensorrt layer report (``targets/tensorrt/report``) read from TensorRT's own published output: engine
inspector JSON of several versions and build logs (``tests/data/tensorrt``). Runs without TensorRT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aotforge.targets.tensorrt.report import precision, summarize_layers

TRT_DATA = Path(__file__).parent / "data" / "tensorrt"  # where each file comes from: its README.md


@pytest.mark.parametrize(
    ("fixture", "layers", "precisions", "io"),
    [
        # NVIDIA's TREx examples: real DETAILED inspector output of ResNet-50 engines on an A100.
        ("trex_a100_fp16.graph.json", 36, {"FP16": 35, "FP32": 1}, ["input.1", "191"]),
        ("trex_a100_qat.graph.json", 37, {"FP16": 14, "FP32": 4, "INT8": 19}, ["input.1", "422"]),
        # Myelin layers say "Float" / "Half" (sampleEditableTimingCache's layer as JSON).
        ("trt10_editable_timing_cache.layer.json", 2, {"FP16": 1, "FP32": 1}, ["input", "output"]),
        # 11.x: I/O Tensors objects, Format and Datatype apart.
        ("trt11_migration_doc.engine.json", 3, {"BF16": 1, "FP16": 1, "FP32": 1}, ["input_0", "output_0"]),
    ],
)
def test_layer_report_reads_published_inspector_json(
    fixture: str, layers: int, precisions: dict[str, int], io: list[str]
) -> None:
    report = summarize_layers((TRT_DATA / fixture).read_text(), sparse_requested=False)
    assert report["layer_count"] == layers and report["precisions"] == precisions
    assert [t["name"] for t in report["io_tensors"]] == io
    assert all(entry["outputs"] for entry in report["per_layer"]), "a layer's output type was not recognised"
    assert "note" not in report and report["sparse_layers"] == []


def test_11x_io_tensors_carry_their_mode_and_type() -> None:
    report = summarize_layers((TRT_DATA / "trt11_migration_doc.engine.json").read_text(), sparse_requested=False)
    assert report["io_tensors"] == [
        {"name": "input_0", "mode": "Input", "dtype": "FP32"},
        {"name": "output_0", "mode": "Output", "dtype": "FP32"},
    ]


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("Float", "FP32"),
        ("Half", "FP16"),
        ("BFloat16", "BF16"),
        ("FP8", "FP8"),
        ("Int8", "INT8"),
        ("Row major linear FP32", "FP32"),
        ("Row major linear FP32 format (kLINEAR)", "FP32"),
        ("Channel major FP16 format where channel % 8 == 0", "FP16"),
        ("Channel major BFloat16 format where channel % 8 == 0", "BF16"),
        ("Row major linear FP8 format", "FP8"),
        ("Thirty-two wide channel vectorized row major Int8 format", "INT8"),
        ("Row major linear UInt8 format", "UINT8"),
        ("Row major linear FP4 format (kLINEAR)", "FP4"),
        ("Unknown format", ""),
    ],
)
def test_type_strings_map_to_one_name(text: str, canonical: str) -> None:
    assert precision(text) == canonical


def test_sparse_layers_come_from_tensorrts_own_log_line() -> None:
    # NVIDIA/TensorRT#1403's build: one layer eligible, none picked -> the pass gained nothing,
    # even though a tactic name says "sparse" (the log is TensorRT's word; names are a guess).
    log = (TRT_DATA / "sparsity_build.log").read_text().splitlines()
    engine = {"Layers": [{"Name": "Conv_0", "TacticName": "sm80_xmma_fprop_sparse_conv", "Outputs": []}]}
    report = summarize_layers(json.dumps(engine), sparse_requested=True, log_lines=log)
    assert report["sparse_eligible"] == ["Conv_0"] and report["sparse_layers"] == []
    assert report["sparse_source"] == "build log" and "gained nothing" in report["note"]
    picked = [*log, "(Sparsity) TRT inference plan picked sparse implementation for layers: Conv_0, Conv_3 + Relu_4"]
    report = summarize_layers(json.dumps(engine), sparse_requested=True, log_lines=picked)
    assert report["sparse_layers"] == ["Conv_0", "Conv_3 + Relu_4"] and "note" not in report
    # No (Sparsity) lines at all (an older log): tactic names are the fallback.
    guessed = summarize_layers(json.dumps(engine), sparse_requested=True)
    assert guessed["sparse_layers"] == ["Conv_0"] and guessed["sparse_source"] == "tactic names"


def test_layer_report_skips_bare_layer_names() -> None:
    # Without DETAILED verbosity the inspector lists bare names (NVIDIA/TensorRT#4020's output).
    report = summarize_layers(
        json.dumps({"Layers": ["Reformatting CopyNode for Input Tensor 0"]}), sparse_requested=False
    )
    assert report["layer_count"] == 0 and report["precisions"] == {}
