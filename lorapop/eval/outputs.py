"""Host side of code judging: rebuild the outputs a sandbox run sent back as data, and compare them with the
expected ones, here in the host process where no candidate code runs (see :mod:`lorapop.eval.code` for why).

The EvalPlus comparison mirrors ``evalplus/eval/__init__.py::unsafe_execute`` (0.3.1): exact ``==``; MBPP special
oracles (``are_equivalent`` always passes, ``sum_div`` also accepts 0, ``surface_Area`` (Mbpp/581) and
``digit_distance_nums`` (Mbpp/558) also accept the answer of EvalPlus's alternative reading of the task, set
equality for eight tasks, "not None" for three); HumanEval's ``find_zero`` checks ``|poly(xs, out)| <= atol``; when
the exact match fails and ``atol`` is non-zero (or the expected value ``is_floats``, which sets atol = 1e-6 for this
and every later input, as EvalPlus's loop does) the types and lengths must match and ``np.allclose(out, exp,
rtol=1e-7, atol)`` (written here in the standard library) must hold.
"""

from __future__ import annotations

import ast
import decimal
import fractions
import json
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Opaque:
    """A value of a type the wire format does not carry (a generator, a custom object): equal only to another
    opaque value of the same type and repr, never to a plain value (so a custom ``__eq__`` cannot fake a match)."""
    type: str
    repr: str


@dataclass(frozen=True)
class Digest:
    """An output too large to send: the SHA-256 of its encoding (a list or tuple of over 100,000 items: of its
    repr; else over 1 MiB of JSON: of that JSON). Two digests are equal when the encodings are, which is exact
    equality for plain values (no tolerance, no set oracle)."""
    sha256: str
    n_chars: int


class WireError(ValueError):
    """Outputs that are not in the wire format (a forged or broken result)."""


def decode(x: Any) -> Any:
    """A JSON tree from ``_enc`` -> plain Python values (only builtin types, Fraction, Decimal and Opaque)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if not isinstance(x, list) or not x or not isinstance(x[0], str):
        raise WireError(f"not an encoded value: {str(x)[:80]}")
    tag, rest = x[0], x[1:]
    try:
        if tag == "L":
            return _items(rest[0])
        if tag == "T":
            return tuple(_items(rest[0]))
        if tag == "S":
            return set(_items(rest[0]))
        if tag == "F":
            return frozenset(_items(rest[0]))
        if tag == "D":
            return {decode(k): decode(v) for k, v in rest[0]}
        if tag == "I":
            return int(rest[0], 16)
        if tag == "C":
            return complex(float(rest[0]), float(rest[1]))
        if tag == "B":
            return rest[0].encode("latin-1")
        if tag == "Q":
            return fractions.Fraction(rest[0])
        if tag == "M":
            return decimal.Decimal(rest[0])
        if tag == "O":
            return Opaque(str(rest[0]), str(rest[1]))
        if tag == "H":
            return Digest(str(rest[0]), int(rest[1]))
    except (TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as e:
        raise WireError(f"malformed {tag!r} value: {type(e).__name__}: {e}") from e
    raise WireError(f"unknown tag {tag!r}")


def _items(xs: list) -> list:
    if not isinstance(xs, list):
        raise WireError("container payload is not a list")
    # JSON leaves inline (only lists carry tags): a call per element doubles the cost on large outputs
    return [i if type(i) is not list else decode(i) for i in xs]


def read_result(value: str | None) -> dict:
    """``repr(_result)`` of a sandbox run (a JSON string) -> the decoded dict; WireError when it is not one."""
    if value is None:
        raise WireError("no result")
    try:
        text = ast.literal_eval(value)
        if not isinstance(text, str):
            raise WireError("result is not a string")
        out = json.loads(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
        raise WireError(f"unreadable result ({type(e).__name__})") from e
    if not isinstance(out, dict):
        raise WireError("result is not an object")
    return out


def decode_all(values: list) -> list:
    if not isinstance(values, list):
        raise WireError("outputs are not a list")
    try:
        return [decode(v) for v in values]
    except RecursionError as e:
        raise WireError("output nested too deeply") from e


# ---- EvalPlus ---------------------------------------------------------------------------------------------------

MBPP_OUTPUT_SET_EQ_TASKS = ("similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly",
                            "larg_nnum", "intersection_array", "find_dissimilar", "Diff")
MBPP_OUTPUT_NOT_NONE_TASKS = ("check_str", "text_match_three", "text_starta_endb")


def surface_area_oracle(base_edge, height):
    """Mbpp/581: EvalPlus also accepts reading ``height`` as the pyramid's perpendicular height."""
    slant_height = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 4 * (base_edge * slant_height) / 2)


def digit_distance_oracle(num1, num2):
    """Mbpp/558: EvalPlus also accepts zero-padding the shorter number before summing the digit differences."""
    a, b = str(num1), str(num2)
    n = max(len(a), len(b))
    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(n), b.zfill(n)))


def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def _num(x) -> bool:
    return isinstance(x, (int, float, complex))  # bool included, as numpy takes it


def allclose(a, b, atol: float, rtol: float = 1e-07) -> bool:
    """``np.allclose(a, b)`` for scalars and nested same-shape sequences; non-numbers make numpy raise -> False."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))) or len(a) != len(b):
            return False
        return all(allclose(x, y, atol, rtol) for x, y in zip(a, b))
    if not (_num(a) and _num(b)):
        return False
    if a == b:
        return True
    if not (isinstance(a, complex) or isinstance(b, complex)) and (math.isinf(a) or math.isinf(b)):
        return False
    return abs(a - b) <= atol + rtol * abs(b)


def _poly(xs, x):
    return sum(c * math.pow(x, i) for i, c in enumerate(xs))


def _exact(dataset: str, entry: str, inp, out, exp, atol: float) -> bool:
    exact = out == exp
    if dataset != "mbpp":
        return bool(exact)
    if entry == "are_equivalent":
        return True
    if entry == "sum_div":
        return bool(exact or out == 0)
    if entry == "surface_Area":
        return bool(exact or abs(out - surface_area_oracle(*inp)) <= atol)
    if entry == "digit_distance_nums":
        return bool(exact or out == digit_distance_oracle(*inp))
    if entry in MBPP_OUTPUT_SET_EQ_TASKS:
        return set(out) == set(exp)
    if entry in MBPP_OUTPUT_NOT_NONE_TASKS:
        return (out == exp) if isinstance(out, bool) else (exp == (out is not None))
    return bool(exact)


def evalplus_check(dataset: str, entry: str, inputs: list, outs: list, expected: list, atol: float
                   ) -> tuple[bool, str | None]:
    """(all inputs pass, the first failure's reason). ``outs`` may be shorter than ``inputs`` (the run stopped)."""
    atol = float(atol)
    for i, (inp, exp) in enumerate(zip(inputs, expected)):
        if i >= len(outs):
            return False, f"test {i}: no output"
        out = outs[i]
        try:
            if dataset == "humaneval" and entry == "find_zero":
                ok = abs(_poly(*inp, out)) <= atol
            else:
                ok = _exact(dataset, entry, inp, out, exp, atol)
                if atol == 0 and is_floats(exp):
                    atol = 1e-6  # EvalPlus sets it once and keeps it for the rest of the inputs
                if not ok and atol != 0:
                    ok = type(out) == type(exp) and (not isinstance(exp, (list, tuple)) or len(out) == len(exp)) \
                        and allclose(out, exp, atol)
        except (TypeError, ValueError, ArithmeticError, AttributeError, RecursionError):
            ok = False  # EvalPlus counts any exception of the comparison as a failure
        if not ok:
            return False, f"test {i}: wrong output"
    return True, None


# ---- LiveCodeBench ----------------------------------------------------------------------------------------------

def _lines(s: str) -> list[str]:
    return [line.strip() for line in s.strip().split("\n")]


def _decimals(line: str):
    try:
        return [decimal.Decimal(x) for x in line.split()]
    except (decimal.InvalidOperation, ValueError):
        return None


def lcb_stdio_ok(pred: str, gt: str) -> bool:
    """Stripped lines equal, or equal as Decimals (``lcb_runner``'s stdio comparison)."""
    p, g = _lines(pred), _lines(gt)
    if len(p) != len(g):
        return False
    for a, b in zip(p, g):
        if a == b:
            continue
        da, db = _decimals(a), _decimals(b)
        if da is None or db is None or da != db:
            return False
    return True


def lcb_check(tests: list[dict], outs: list, functional: bool) -> tuple[bool, str | None]:
    for i, t in enumerate(tests):
        if i >= len(outs):
            return False, f"test {i}: no output"
        out = outs[i]
        try:
            if functional:
                out = list(out) if isinstance(out, tuple) else out
                ok = out == json.loads(t["output"])
            else:
                ok = isinstance(out, str) and lcb_stdio_ok(out, t["output"])
        except (TypeError, ValueError, RecursionError):
            ok = False
        if not ok:
            return False, f"test {i}: wrong output"
    return True, None
