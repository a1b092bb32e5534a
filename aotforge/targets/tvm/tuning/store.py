"""A content-addressed store of MetaSchedule tuning results, shared by every model built here.

TVM's own database keys a record by the workload alone and ignores the target (apache/tvm#15549),
so a schedule tuned for one CPU would be served for another. Here each tuned workload is one file,
``<dir>/<key[:2]>/<key>.json``, keyed by the sha256 of (the workload's structural hash, the full
target dict with kind / mcpu / mtriple / num-cores, the TVM version): two models sharing a matmul
shape share its entry, a different CPU or core count or TVM does not. An entry holds the workload,
its best records, the time the default (search-free) schedule takes on the same runner (so the
pipeline uses a tuned schedule only where it beats the default) and the trials the workload has been
searched with, so a later build asking for more searches it again. Writes merge under a lock (the
best records of both, never a worse best) and land with ``os.replace`` of a complete temporary
file; an entry whose JSON or checksum fails is removed and reported, never served.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aotforge.core.file_lock import locked

SCHEMA_VERSION = 1
#: ``Entry.default_secs`` when the default schedule could not be built or run.
DEFAULT_FAILED = -1.0
#: Records kept per workload: the best few, so a merge of two tuning runs keeps both winners.
TOP_K = 3
#: The trials assumed spent on an entry written before trials were recorded (``Entry.trials`` None),
#: when deciding whether a build's budget is larger. The real count is unknown, and 0 would re-tune
#: every such entry on the first build after the upgrade even at the budget that made it. The old
#: search gave a task one batch of ``min(64, trials // tasks)`` before sharing the rest by gradient,
#: so 64 (also MetaSchedule's stock batch) is the most one batch gave: a request above 64 per
#: workload is clearly more search than such an entry is known to have had, one at or below may not be.
LEGACY_TRIALS = 64


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def target_fields(target: Any) -> dict[str, Any]:
    """The whole target as a JSON dict (``str(Target)`` is its canonical JSON in TVM 0.27)."""
    fields: dict[str, Any] = json.loads(str(target))
    return fields


def workload_key(structural_hash: int, target: Mapping[str, Any], tvm_version: str) -> str:
    """The entry key of one workload tuned for one target with one TVM."""
    return _sha(
        {"schema": SCHEMA_VERSION, "workload": str(structural_hash), "target": dict(target), "tvm": tvm_version}
    )


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tuned workload: TVM's JSON for the workload and its records, plus our own facts."""

    key: str
    workload: Any
    records: tuple[Any, ...]
    #: Best run seconds of each record, same order as ``records`` (fastest first).
    run_secs: tuple[float, ...]
    #: The default schedule's run seconds on the same runner; None: not timed yet; DEFAULT_FAILED.
    default_secs: float | None
    key_fields: Mapping[str, Any]
    #: The per-workload trial budget searched so far (over all builds); None: unknown (old entry).
    trials: int | None = None

    def covers(self, budget: int) -> bool:
        """Whether a search of ``budget`` trials per workload has nothing to add to this entry."""
        return budget <= (LEGACY_TRIALS if self.trials is None else self.trials)

    @property
    def beats_default(self) -> bool:
        default = self.default_secs
        return bool(self.run_secs) and (default is None or default < 0 or self.run_secs[0] < default)

    def to_json(self) -> dict[str, Any]:
        body = {
            "schema": SCHEMA_VERSION,
            "key": self.key,
            "key_fields": dict(self.key_fields),
            "workload": self.workload,
            "records": list(self.records),
            "run_secs": list(self.run_secs),
            "default_secs": self.default_secs,
        }
        if self.trials is not None:  # absent, an old entry keeps its checksum and old readers read it
            body["trials"] = self.trials
        return {**body, "sha256": _sha(body)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Entry:
        body = {k: v for k, v in data.items() if k != "sha256"}
        if data.get("schema") != SCHEMA_VERSION or data.get("sha256") != _sha(body):
            raise ValueError("schema or checksum mismatch")
        return Entry(
            key=str(data["key"]),
            workload=data["workload"],
            records=tuple(data["records"]),
            run_secs=tuple(float(s) for s in data["run_secs"]),
            default_secs=None if data["default_secs"] is None else float(data["default_secs"]),
            key_fields=dict(data["key_fields"]),
            trials=None if data.get("trials") is None else int(data["trials"]),
        )


class TuningStore:
    """The directory of entries. Safe for concurrent builds: readers see whole files only."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        #: Keys whose file was unreadable or failed its checksum (and was removed), in read order.
        self.corrupt: list[str] = []

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def read(self, key: str) -> Entry | None:
        path = self.path(key)
        try:
            entry = Entry.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):  # torn, edited or foreign: retune it
            self.corrupt.append(key)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return entry if entry.key == key else None

    def merge(self, entry: Entry) -> Entry:
        """Store ``entry``, keeping the best ``TOP_K`` records of it and any entry already there."""
        path = self.path(entry.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path.parent / ".lock"):
            old = self.read(entry.key)
            merged = _merge(old, entry) if old is not None else entry
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(merged.to_json(), f, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())  # the rename must not land before the bytes do
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return merged


def _merge(old: Entry, new: Entry) -> Entry:
    pairs = sorted(zip(old.run_secs + new.run_secs, old.records + new.records, strict=True), key=lambda p: p[0])
    seen: set[str] = set()
    kept = []
    for secs, record in pairs:
        # One schedule (TVM's record is [trace, run_secs, ...]) measured by two runs: keep its faster time.
        text = json.dumps(record[0] if isinstance(record, list) and record else record, sort_keys=True)
        if text not in seen:
            seen.add(text)
            kept.append((secs, record))
    kept = kept[:TOP_K]
    default = new.default_secs if new.default_secs is not None else old.default_secs
    known = [t for t in (old.trials, new.trials) if t is not None]
    return dataclasses.replace(
        new,
        records=tuple(r for _, r in kept),
        run_secs=tuple(s for s, _ in kept),
        default_secs=default,
        trials=max(known) if known else None,
    )


def digest(entries: Sequence[Entry]) -> str:
    """sha256 over the entries a build used (key and checksum each): what its schedules came from."""
    return _sha(sorted([e.key, e.to_json()["sha256"]] for e in entries))
