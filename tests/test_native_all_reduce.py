"""The native all-reduce library (``targets/onnxruntime/native_all_reduce.py``) inside ONNX Runtime sessions.

A one-node graph ``AllReduce(x) * 2`` run by two rank processes over one segment sums their inputs exactly, in
chunks when the input is larger than a buffer; a rank whose peer never arrives, or whose group was aborted,
returns from the run and raises on its check. A sequence-parallel prefill's ``ReduceScatter`` then ``AllGather``
give each rank its positions of the sum and then the whole sum back, natively and in the Python fallback. The rank
graphs' own use is tested end to end in ``test_tensor_parallel.py`` and ``test_sequence_parallel.py``.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aotforge.core.errors import RankFailedError
from aotforge.targets.generative.shm_all_reduce import ShmAllReduce, abort_segment, create_segment
from aotforge.targets.onnxruntime import native_all_reduce

HIDDEN = 576


def _graph(path: Path) -> Path:
    nodes = [
        helper.make_node("AllReduce", ["x"], ["r"], domain="ai.onnx.contrib"),
        helper.make_node("Mul", ["r", "two"], ["y"]),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", HIDDEN]) for n in ("x", "y")]
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(nodes, "all_reduce", io[:1], io[1:], [two])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def _session(library: Path, graph: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def _rank(library: Path, graph: Path, segment: str, rank: int, capacity: int, out: Any) -> None:
    comm = ShmAllReduce(segment, rank, 2, capacity)
    native_all_reduce.attach(library, comm)
    session = _session(library, graph)
    x = np.random.default_rng(rank).standard_normal((3, HIDDEN)).astype(np.float32)
    y = [session.run(None, {"x": x[: i + 1]})[0] for i in range(3)]  # three calls: both banks, then the first again
    comm.check()
    out.put((rank, x, y))


@pytest.fixture(scope="module")
def library() -> Path:
    return native_all_reduce.build_library()


def test_two_ranks_sum_their_inputs_exactly(library: Path, tmp_path: Path) -> None:
    capacity = 600  # a row of 576 goes whole, two and three rows in chunks (the last one short)
    graph = _graph(tmp_path / "all_reduce.onnx")
    segment = create_segment(2, capacity)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_rank, args=(library, graph, segment.name, r, capacity, queue)) for r in (0, 1)]
    try:
        for proc in procs:
            proc.start()
        results = sorted((queue.get(timeout=120) for _ in procs), key=lambda r: r[0])
    finally:
        for proc in procs:
            proc.join(timeout=30)
        segment.close()
        segment.unlink()
    (_, x0, y0), (_, x1, y1) = results
    for i in range(3):
        want = 2 * (x0[: i + 1] + x1[: i + 1])
        np.testing.assert_array_equal(y0[i], want)
        np.testing.assert_array_equal(y1[i], y0[i])


@pytest.mark.parametrize(
    ("timeout_s", "aborted", "message"),
    [(0.5, False, "abandoned"), (600.0, True, "")],  # rank 1 never comes: gives up after 0.5 s / the driver aborts
    ids=["peer-never-arrives", "group-aborted"],
)
def test_a_rank_left_alone_returns_and_raises_on_its_check(
    timeout_s: float, aborted: bool, message: str, library: Path, tmp_path: Path
) -> None:
    """A rank whose peer never arrives gives up at its timeout; one whose group was aborted (as the driver does
    when a rank died) returns at once, not after its 600 s; either way its check raises."""
    segment = create_segment(2, 1 << 10)
    try:
        comm = ShmAllReduce(segment.name, 0, 2, 1 << 10, timeout_s=timeout_s)
        native_all_reduce.attach(library, comm)
        session = _session(library, _graph(tmp_path / "all_reduce.onnx"))
        if aborted:
            abort_segment(segment)
        session.run(None, {"x": np.ones((1, HIDDEN), dtype=np.float32)})
        with pytest.raises(RankFailedError, match=message):
            comm.check()
        native_all_reduce.detach(library)
        comm.close()
    finally:
        segment.close()
        segment.unlink()


def _split_graph(path: Path) -> Path:
    nodes = [
        helper.make_node("ReduceScatter", ["x"], ["mine"], domain="ai.onnx.contrib"),
        helper.make_node("AllGather", ["mine", "tokens"], ["whole"], domain="ai.onnx.contrib"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "T", HIDDEN])
    tokens = helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "T"])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("mine", "whole")]
    graph = helper.make_graph(nodes, "split", [x, tokens], outs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


#: Prompt lengths: shorter than the degree (rank 1 holds only padding), odd, even; each batch spans several chunks.
LENGTHS = (1, 5, 4)


def _split_rank(library: Path | None, graph: Path, segment: str, rank: int, capacity: int, out: Any) -> None:
    comm = ShmAllReduce(segment, rank, 2, capacity)
    if library is not None:
        native_all_reduce.attach(library, comm)
        session = _session(library, graph)
    results = []
    for length in LENGTHS:
        x = np.random.default_rng([rank, length]).standard_normal((2, length, HIDDEN)).astype(np.float32)
        if library is not None:
            tokens = np.zeros((2, length), dtype=np.int64)
            results.append(tuple(session.run(None, {"x": x, "tokens": tokens})))
        else:
            mine = comm.reduce_scatter(x)
            results.append((mine, comm.all_gather(mine, length)))
        results[-1] = (x, *results[-1])
    comm.check()
    out.put((rank, results))


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_reduce_scatter_keeps_each_ranks_positions_and_all_gather_restores_the_sum(
    native: bool, library: Path, tmp_path: Path
) -> None:
    capacity = 2 * HIDDEN + 7  # two rows a chunk: the batch of 2 x 5 rows goes in five exchanges
    graph = _split_graph(tmp_path / "split.onnx")
    segment = create_segment(2, capacity)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    args = [(library if native else None, graph, segment.name, r, capacity, queue) for r in (0, 1)]
    procs = [context.Process(target=_split_rank, args=a) for a in args]
    try:
        for proc in procs:
            proc.start()
        results = dict(queue.get(timeout=120) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
        segment.close()
        segment.unlink()
    for i, length in enumerate(LENGTHS):
        total = results[0][i][0] + results[1][i][0]  # the all-reduce's sum, in its rank order
        size = -(-length // 2)
        padded = np.concatenate([total, np.zeros((2, 2 * size - length, HIDDEN), np.float32)], axis=1)
        for rank in (0, 1):
            _, mine, whole = results[rank][i]
            np.testing.assert_array_equal(mine, padded[:, rank * size : (rank + 1) * size])
            np.testing.assert_array_equal(whole, total)


def test_the_library_is_built_once_per_source(library: Path) -> None:
    assert native_all_reduce.build_library() == library
    assert library.parent.parent == native_all_reduce.CACHE and library.is_file()
