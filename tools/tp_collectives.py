"""What one all-reduce of a decode step costs on this host, by the ways a CPU rank graph could run it.

Two processes (one thread each) all-reduce a ``[1, hidden]`` float vector ``--calls`` times:
``shm`` (``targets/generative/shm_all_reduce.py`` called from Python), ``shm-in-ort`` (the same, called from
inside an ONNX Runtime session as the rank graphs call it: an onnxruntime-extensions Python op between two
Adds, so the op's own crossing is in the figure), ``native-in-ort`` (the native custom-op library the rank
graphs run, ``targets/onnxruntime/native_all_reduce.py``, in the same chain) and ``gloo``
(``torch.distributed.all_reduce`` over loopback TCP). Used by tools/bench_tensor_parallel.py; run alone it
prints microseconds per call.

    python tools/tp_collectives.py [--hidden 576] [--calls 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any

import numpy as np

METHODS = ("shm", "shm-in-ort", "native-in-ort", "gloo")


def _graph(calls: int, hidden: int) -> bytes:
    from onnx import TensorProto, helper

    nodes, prev = [], "x"
    for i in range(calls):
        nodes += [
            helper.make_node("Add", [prev, "one"], [f"a{i}"]),
            helper.make_node("AllReduce", [f"a{i}"], [f"r{i}"], domain="ai.onnx.contrib"),
        ]
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, hidden]) for n in ("x", "y")]
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [0.0])
    graph = helper.make_graph(nodes, "chain", io[:1], io[1:], [one])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    return bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())


def _rank(method: str, rank: int, shm_name: str, port: int, hidden: int, calls: int, out: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    x = np.full((1, hidden), rank + 1, dtype=np.float32)
    if method == "gloo":
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        t = torch.from_numpy(x)
        run: Any = lambda: dist.all_reduce(t)  # noqa: E731
    else:
        from aotforge.targets.generative.shm_all_reduce import ShmAllReduce

        comm = ShmAllReduce(shm_name, rank, 2, 1 << 16)
        if method == "shm":
            run = lambda: comm(x)  # noqa: E731
        else:
            import onnxruntime as ort

            from aotforge.targets.onnxruntime import native_all_reduce, python_ops
            from aotforge.targets.onnxruntime.tensor_parallel import register_all_reduce

            library = str(native_all_reduce.build_library()) if method == "native-in-ort" else ""
            register_all_reduce(comm, library)
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.register_custom_ops_library(library or python_ops.library_path())
            session = ort.InferenceSession(_graph(100, hidden), options, ["CPUExecutionProvider"])
            calls //= 100
            run = lambda: session.run(None, {"x": x})  # noqa: E731
    for _ in range(max(calls // 10, 1)):  # warm up
        run()
    started = time.perf_counter()
    for _ in range(calls):
        run()
    per = (time.perf_counter() - started) / (calls * (100 if method.endswith("in-ort") else 1))
    out.put((rank, per * 1e6))


def measure(method: str, hidden: int = 576, calls: int = 2000) -> float:
    """Microseconds per all-reduce by ``method`` (the slower rank's), two processes of one thread."""
    from aotforge.targets.generative.shm_all_reduce import create_segment

    context = multiprocessing.get_context("spawn")
    segment = create_segment(2, 1 << 16)
    queue = context.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [context.Process(target=_rank, args=(method, r, segment.name, port, hidden, calls, queue)) for r in (0, 1)]
    try:
        for p in procs:
            p.start()
        results = [queue.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
    finally:
        segment.close()
        segment.unlink()
    return max(us for _, us in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    for method in METHODS:
        print(f"{method}: {measure(method, args.hidden, args.calls):.1f} us per all-reduce", flush=True)


if __name__ == "__main__":
    main()
