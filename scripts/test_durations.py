"""Write tests/durations.json from a JUnit XML report of a suite run: each test file's seconds (its tests' setup,
call and teardown, module fixtures included), which tests/conftest.py uses to hand the longest files out first.

    .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_durations.py /tmp/suite.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def per_file(xml_path: str) -> dict[str, float]:
    """Seconds per test file (``tests/test_x.py``) summed over the report's test cases."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is the module path, then a class name if the test is in one: keep the test_* module
        names = [m for m in module if m.startswith("test_")]
        if not names:
            continue
        seconds[f"tests/{names[0]}.py"] += float(case.get("time", 0.0))
    return dict(seconds)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    seconds = per_file(argv[0])
    OUT.write_text(json.dumps({f: round(s, 1) for f, s in sorted(seconds.items(), key=lambda kv: -kv[1])},
                              indent=1) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
