"""Each test file's seconds in a pytest junit report, as ``tests/file_durations.json``: the default run hands the
heaviest files to its workers first (tests/conftest.py), so no worker is left finishing a long file alone at the
end. ``make test-durations`` runs the default suite with a junit report and rewrites the file from it."""

from __future__ import annotations

import argparse
import collections
import json
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "file_durations.json"


def file_seconds(junit: Path) -> dict[str, int]:
    """Seconds per test file (``test_x.py``), summed over its test cases, whole seconds, heaviest first."""
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        if len(module) >= 2 and module[0] == "tests":
            seconds[f"{module[1]}.py"] += float(case.get("time") or 0)
    return {name: round(s) for name, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("junit", type=Path, help="a junit XML report of the default run (pytest --junitxml)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(json.dumps(file_seconds(args.junit), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
