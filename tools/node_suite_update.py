"""``tools/node_suite.py --update``: merge the results of re-run cases into a per-op table from a full run.

A full tvm sweep takes about an hour on 2 cores, so a change to a few op families re-runs only their
cases (``--match``) and replaces those cases' results in the checked-in table; the table says which
re-runs it holds and that the other rows come from the last full run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def update_table(table: str, report: Any, cases: Sequence[Any], family: Callable[[str, Any], str]) -> Any:
    """The report a full run's ``table`` says, with ``cases`` (re-run as ``report``) replaced by their new results.

    A case ORT fails alone is in neither; one it passes counts as failing before if the table lists it.
    ``family(name, model)`` is the op row a case counts in.
    """
    old = type(report)(report.target, report.variant)
    for line in table.splitlines():
        row = re.fullmatch(r"\| (\S+) \| (\d+) \| (\d+) \|", line.strip())
        if row:
            old.families[row[1]] = [int(row[2]), int(row[3])]
        failure = re.fullmatch(r"- `([^`]+)`: (.*)", line.strip())
        if failure:
            old.failures[failure[1]] = failure[2]
    for case in cases:
        if case.name in report.ort_failures:
            continue
        counts = old.families.setdefault(family(case.name, case.model), [0, 0])
        was, now = case.name not in old.failures, case.name not in report.failures
        counts[1] += int(now) - int(was)
        if now:
            old.failures.pop(case.name, None)
        else:
            old.failures[case.name] = report.failures[case.name]
    old.ort_passes = sum(n for n, _ in old.families.values())
    old.aotforge_passes = sum(k for _, k in old.families.values())
    return old


def write_updated(path: Path, report: Any, cases: Sequence[Any], family: Callable[[str, Any], str], note: str) -> None:
    """Rewrite the table at ``path`` with ``report``'s re-run ``cases``, adding ``note`` to the re-runs it lists."""
    before = path.read_text()
    updated = update_table(before, report, cases, family)
    line = (
        f"\nUpdated by re-running {note} ({report.cases} cases, {time.strftime('%Y-%m-%d', time.gmtime())}); "
        "the other rows are from the last full run.\n"
    )
    head, _, rest = updated.table().partition("\n\n| op")
    notes = [f"\n{n}" for n in re.findall(r"Updated by re-running .*", before)]
    path.write_text(head + "".join(notes) + line + "\n| op" + rest)
