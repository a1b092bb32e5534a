"""The ONNX backend node suite through aotforge: of the cases ONNX Runtime passes alone, how many
still pass built with ``aotforge.build(model, target=...)``, each validated on its own test data.

Every node case of ``onnx.backend.test`` (onnx's generated ``model.onnx`` + ``test_data_set_*/
input_<i>.pb, output_<i>.pb``) is written to a work dir, then:

- *ORT alone*: an ``onnxruntime.InferenceSession`` on the unmodified model, fed the case's inputs
  (bfloat16 / float8 as OrtValues: ``targets.onnxruntime.session_io``), its outputs compared with the expected ones
  the way onnx's backend runner does (``Runner.assert_similar_outputs``, the case's rtol/atol);
- *aotforge*: ``build(model.onnx, target=T, sample_inputs=<the case dir>, bench=False)`` (default
  passes, validated against the ORT reference on the case's inputs), then the loaded artifact's
  outputs compared with the expected ones the same way.

    python tools/node_suite.py [--target onnxruntime|tvm] [--match REGEX] [--json report.json]

prints the case count, ORT-alone passes, aotforge passes among them, their ratio, and each
failure with its reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path (tests)
import node_suite_update  # noqa: E402
from node_suite_cases import VARIANTS, Case, collect, family, write_case  # noqa: E402


@dataclasses.dataclass
class Report:
    target: str
    variant: str = "generated"
    cases: int = 0
    ort_passes: int = 0
    aotforge_passes: int = 0
    #: Cases ORT passes alone that fail through aotforge: name -> reason.
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Cases ORT fails alone: name -> reason (not counted against aotforge).
    ort_failures: dict[str, str] = dataclasses.field(default_factory=dict)
    #: op family -> [cases ORT passes alone, of those passing through aotforge]
    families: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ratio(self) -> float:
        return self.aotforge_passes / self.ort_passes if self.ort_passes else 0.0

    def merge(self, other: Report) -> None:
        for field in ("cases", "ort_passes", "aotforge_passes", "seconds"):
            setattr(self, field, getattr(self, field) + getattr(other, field))
        self.failures.update(other.failures)
        self.ort_failures.update(other.ort_failures)
        for name, (ort_count, passed) in other.families.items():
            counts = self.families.setdefault(name, [0, 0])
            counts[0] += ort_count
            counts[1] += passed

    def table(self) -> str:
        """The per-op pass table, markdown: families with a failure first, then those that all pass."""
        rows = sorted(self.families.items(), key=lambda kv: (kv[1][1] == kv[1][0], kv[0]))
        lines = [
            f"# ONNX node suite through the {self.target} target",
            "",
            f"`tools/node_suite.py --target {self.target} --variant {self.variant}` (`make tvm-ops-table`): "
            f"{self.aotforge_passes} / {self.ort_passes} of the cases ONNX Runtime passes alone "
            f"({100 * self.ratio:.1f}%), each built and run on its own test data.",
            "",
            "| op | cases ORT passes | pass through aotforge |",
            "|---|---|---|",
        ]
        lines += [f"| {name} | {ort_count} | {passed} |" for name, (ort_count, passed) in rows if ort_count]
        lines += ["", "Cases ONNX Runtime passes that fail through aotforge, and why:", ""]
        lines += [f"- `{name}`: {reason.replace('|', '/')}" for name, reason in sorted(self.failures.items())]
        return "\n".join(lines) + "\n"


def update_table(table: str, report: Report, cases: Sequence[Any]) -> Report:
    """``report``'s re-run ``cases`` merged into a full run's ``table`` (``node_suite_update``)."""
    return node_suite_update.update_table(table, report, cases, family)


def check_outputs(case: Case, data_set: int, outputs: Sequence[Any]) -> None:
    """onnx's own comparison (raises AssertionError): shapes, dtypes, rtol/atol, NaN equal to NaN."""
    from onnx.backend.test.runner import Runner

    Runner.assert_similar_outputs(case.expected[data_set], list(outputs), rtol=case.rtol, atol=case.atol)


def ort_alone(case: Case) -> str | None:
    """None when ONNX Runtime alone passes the case, else why not."""
    import onnxruntime as ort

    from aotforge.targets.onnxruntime.session_io import run_session

    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(case.model), options, providers=["CPUExecutionProvider"])
        in_names = [i.name for i in session.get_inputs()]
        out_names = [o.name for o in session.get_outputs()]
        for k, inputs in enumerate(case.inputs):
            got = run_session(session, out_names, dict(zip(in_names, inputs, strict=False)))
            check_outputs(case, k, [got[n] for n in out_names])
    except Exception as e:
        return _reason(e)
    return None


def through_aotforge(case: Case, target: str, out: Path, isolate: bool = True) -> str | None:
    """None when the artifact built from the case, validated on its own data, gives the expected outputs.

    ``isolate=False`` compiles in this process (no worker; a crash in the backend then ends the caller)."""
    import aotforge

    try:
        result = aotforge.build(
            str(case.model),
            target=target,
            sample_inputs=str(case.model.parent),
            bench=False,
            out=out,
            name=case.name,
            isolate_backend=isolate,
        )
        artifact = aotforge.load(result.path)
        names = [s.name for s in artifact.io.inputs]
        outputs = [o.name for o in artifact.io.outputs]
        for k, inputs in enumerate(case.inputs):
            got = artifact.run(dict(zip(names, inputs, strict=True)))
            check_outputs(case, k, [got[n] for n in outputs])
    except Exception as e:
        return _reason(e)
    return None


def _reason(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {' | '.join(lines[:3])[:300]}"


def run_suite(
    cases: Iterable[Any], target: str, work: Path, progress: bool = False, variant: str = "generated"
) -> Report:
    report = Report(target, variant)
    started = time.perf_counter()
    for case in cases:
        files = write_case(case, work / "cases", variant)
        report.cases += 1
        reason = ort_alone(files)
        if reason is not None:
            report.ort_failures[files.name] = reason
            continue
        report.ort_passes += 1
        counts = report.families.setdefault(files.family, [0, 0])
        counts[0] += 1
        reason = through_aotforge(files, target, work / "out")
        if reason is None:
            report.aotforge_passes += 1
            counts[1] += 1
        else:
            report.failures[files.name] = reason
        if progress and report.cases % 100 == 0:
            print(f"{report.cases} cases, {report.aotforge_passes}/{report.ort_passes}", file=sys.stderr)
    report.seconds = round(time.perf_counter() - started, 1)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="onnxruntime")
    parser.add_argument("--match", help="only cases whose name matches this regular expression")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--workdir", type=Path, help="keep the cases and artifacts here (default: a temp dir)")
    parser.add_argument("--variant", choices=VARIANTS, default="generated", help="constants: shape-like inputs bound")
    parser.add_argument("--shard", default="0/1", help="K/N: only every N-th case from the K-th (parallel runs)")
    parser.add_argument("--merge", type=Path, nargs="*", help="merge these --json reports instead of running")
    parser.add_argument("--table", type=Path, help="write the per-op markdown table here")
    parser.add_argument(
        "--update",
        action="store_true",
        help="with --table and --match: replace only the matched cases' results in the existing table",
    )
    parser.add_argument("--note", help="with --update: what was re-run, in words (default: the --match pattern)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.merge:
        report = Report(args.target, args.variant)
        for path in args.merge:
            report.merge(Report(**{k: v for k, v in json.loads(path.read_text()).items() if k != "ratio"}))
    else:
        shard, shards = (int(x) for x in args.shard.split("/"))
        cases = collect(args.match)[shard::shards]
        with tempfile.TemporaryDirectory() as tmp:
            report = run_suite(cases, args.target, args.workdir or Path(tmp), progress=True, variant=args.variant)
    print(
        f"target {report.target} ({report.variant}): {report.cases} cases, ORT alone passes {report.ort_passes}, "
        f"aotforge passes {report.aotforge_passes} of those ({100 * report.ratio:.2f}%), {report.seconds} s"
    )
    for name, reason in sorted(report.failures.items()):
        print(f"  FAIL {name}: {reason}")
    if args.json:
        args.json.write_text(
            json.dumps({**dataclasses.asdict(report), "ratio": report.ratio}, indent=2, sort_keys=True)
        )
    if args.table and args.update:
        note = args.note or f"the cases matching `{args.match}`"
        node_suite_update.write_updated(args.table, report, collect(args.match), family, note)
    elif args.table:
        args.table.write_text(report.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
