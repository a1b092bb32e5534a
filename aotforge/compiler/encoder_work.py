"""The tail's work for one graph (``build_tail.TailWork``): the IR staged as ``model.onnx``, validated per output.

The compile and the validation runs of the compiled artifact happen in a spawned worker where isolation is on
(``compiler.backend_stage``): native code never runs in the build's own process before it has run every
validation input once. The benchmark runs in a process of its own.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotforge.artifacts.card_plots import latency_plot
from aotforge.artifacts.hashing import sha256_file
from aotforge.artifacts.store import MODEL_FILE
from aotforge.compiler.backend_stage import CALL, OUTPUTS, compiled_of, load_outputs, request_for
from aotforge.compiler.bench import bench_artifact
from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.build_tail import Checked, Compiled, Progress, TailJob
from aotforge.compiler.compile_cache import CacheKey, compile_cached, graph_cache_key
from aotforge.compiler.isolation import run_isolated
from aotforge.compiler.source import Arrays
from aotforge.compiler.validation import validate
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import BuildContext, CompileResult

if TYPE_CHECKING:
    import onnx_ir as ir


@dataclasses.dataclass(frozen=True)
class EncoderWork:
    """An ONNX graph (or a torch program) compiled by ``Target.compile``, validated output by output."""

    model: ir.Model
    ctx: BuildContext
    #: Validation inputs and what the source model computes on them.
    samples: Sequence[Arrays]
    reference: Callable[[Arrays], Arrays]
    #: The manifest's validation record so far (``compiler.validation.validation_plan``).
    validation: Mapping[str, Any]
    bench: BenchOptions | None
    batch: int

    def cache_key(self, toolchain: Mapping[str, str], passes: Sequence[Mapping[str, Any]]) -> CacheKey:
        return graph_cache_key(self.ctx, toolchain, passes)

    def compile(self, job: TailJob, stage: Path, say: Progress) -> Compiled:
        """``compile_cached`` in this process, or (isolation enabled) the compile and the validation runs in a
        spawned worker whose files land in ``stage``; then ``outputs`` are the artifact's on ``samples``."""
        if not job.isolation.enabled or job.target.compiles_torch_program:
            # A torch program does not cross to a worker; Neuron's SDK runs in its own worker process anyway.
            key = self.cache_key(job.toolchain, job.passes)
            compiled, cache = compile_cached(
                job.target,
                job.target_options,
                stage,
                job.cache_dir,
                key,
                lambda options: job.target.compile(self.model, options, self.ctx, stage),
                say,
            )
            return Compiled(compiled, cache)
        with tempfile.TemporaryDirectory(prefix="aotforge-worker-") as handoff:
            request = request_for(
                job.target,
                options=job.target_options,
                ctx=dataclasses.replace(self.ctx, torch_program=None),
                stage=stage,
                cache_dir=job.cache_dir,
                toolchain=job.toolchain,
                passes=job.passes,
                samples=list(self.samples),
                outputs_dir=Path(handoff),
                run_deadline_s=job.isolation.run_deadline_s,
            )
            stage_name = f"the {job.target.name} compile"
            result = run_isolated(CALL, request, stage=stage_name, limits=job.isolation, say=say, worker=job.worker)
            outputs = load_outputs(Path(handoff) / OUTPUTS, result["outputs"])
        return Compiled(compiled_of(result), result["cache"], outputs)

    def target_info(self, stage: Path, compiled: CompileResult) -> dict[str, Any]:
        return dict(compiled.target_info)

    def extra_passes(self, compiled: CompileResult) -> list[dict[str, Any]]:
        return []

    def check(self, job: TailJob, stage: Path, record: TargetRecord, compiled: Compiled, say: Progress) -> Checked:
        # Isolated, the artifact already ran every sample in the worker: this process never loads it
        # (the benchmark runs in a process of its own too).
        runner = job.target.load(stage, record, self.ctx.io) if compiled.outputs is None else None
        run = runner.run if runner is not None else _replay(self.samples, compiled.outputs)
        say("validating against the source model")
        validation = validate(
            self.reference, run, self.samples, self.validation, model=job.place.name, target=job.target.name
        )
        del runner, run  # its thread pool would spin beside the benchmark process
        bench = None
        if self.bench is not None:
            say("benchmarking (in a process of its own)")
            (timed,) = bench_artifact(
                stage, self.samples[0], batch=self.batch, options=self.bench, staged=(record, self.ctx.io)
            )
            bench = timed.result
            if job.place.plots:
                latency_plot(stage, timed.times_ms, bench)
        return Checked(validation, bench)

    def ir_record(self, stage: Path) -> dict[str, Any]:
        return {"sha256": sha256_file(stage / MODEL_FILE), "opset": self.model.opset_imports.get("", 0)}

    def io_record(self) -> dict[str, Any]:
        return self.ctx.io.to_dict()


def _replay(samples: Sequence[Arrays], outputs: list[Arrays] | None) -> Callable[[Arrays], Arrays]:
    """The worker's outputs, answered by sample (validation asks for exactly these samples)."""
    by_id = {id(s): o for s, o in zip(samples, outputs or [], strict=True)}
    return lambda sample: by_id[id(sample)]
