"""How close the suite's float comparisons come to their tolerances on this processor.

Runs the test files whose claims are float comparisons with every ``torch.testing.assert_close`` call recorded (the
tolerances of ``tests/floattol.py`` reach it too): per test, the largest ratio ``max |actual - expected| /
(atol + rtol * |expected|)`` over its calls, and the dtype compared. A ratio near 1 is a tolerance fitted to this
processor's rounding; the derivation in ``tests/floattol.py`` aims well below it. Comparisons a test writes by hand
(``assert diff <= tol``) are not seen here. Prints a table, the CPU's model and ISA flags, and ends with one JSON
line (``max_ratio``, ``per_test``).

    PYTHONPATH=. .venv/bin/python bench/float_margins.py [pytest args, default: the float test files]

Run it on each kind of processor the suite must pass on (AVX2, AVX-512, AMX) and keep the tables in
docs/RESULTS.md ("Test suite time per processor").
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ["tests/test_engine.py", "tests/test_engine_decode.py", "tests/test_engine_lora.py", "tests/test_operators.py",
         "tests/test_pbt.py", "tests/test_peft_io.py", "tests/test_lora_compute.py", "tests/test_engine_integration.py",
         "tests/test_replicas.py", "tests/test_onpolicy.py"]


def cpu() -> tuple[str, list[str]]:
    model, flags = "", []
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma")))
    return model, flags


class Recorder:
    """A pytest plugin: wraps torch.testing.assert_close for the session and keeps the worst ratio per test."""

    def __init__(self) -> None:
        self.current = "?"
        self.worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))

    def pytest_sessionstart(self, session) -> None:
        import torch

        orig = torch.testing.assert_close

        def recording(actual, expected, *args, rtol=None, atol=None, **kw):
            if (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
                    and actual.is_floating_point() and atol is not None and actual.numel()):
                a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
                bound = float(atol) + float(rtol or 0.0) * e.abs()
                ratio = float(((a - e).abs() / bound).max()) if float(atol) > 0 or rtol else float("inf")
                if ratio > self.worst[self.current][0]:
                    self.worst[self.current] = (ratio, str(expected.dtype).replace("torch.", ""))
            return orig(actual, expected, *args, rtol=rtol, atol=atol, **kw)

        torch.testing.assert_close = recording

    def pytest_runtest_setup(self, item) -> None:
        self.current = item.nodeid


def main(argv: list[str]) -> dict:
    import pytest

    sys.path.insert(0, str(REPO / "tests"))
    rec = Recorder()
    rc = pytest.main((argv or FILES) + ["-q", "-p", "no:cacheprovider"], plugins=[rec])
    model, flags = cpu()
    rows = sorted(((t, r, d) for t, (r, d) in rec.worst.items() if d), key=lambda x: -x[1])
    print(f"\n{model}; {' '.join(flags)}\n{'ratio':>8}  {'dtype':8}  test")
    for t, r, d in rows:
        print(f"{r:8.3g}  {d:8}  {t}")
    out = {"cpu": model, "flags": flags, "pytest_exit": int(rc),
           "max_ratio": max((r for _, r, _ in rows), default=None),
           "per_test": {t: [round(r, 4), d] for t, r, d in rows}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
