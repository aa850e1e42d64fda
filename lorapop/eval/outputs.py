"""Host side of code judging: rebuild the outputs a sandbox run sent back as data, and compare them with the
expected ones, here in the host process where no candidate code runs (see :mod:`lorapop.eval.code` for why).

The EvalPlus comparison mirrors ``evalplus/eval/__init__.py::unsafe_execute`` (0.3.1): exact ``==``; MBPP special
oracles (``are_equivalent`` always passes, ``sum_div`` also accepts 0, ``surface_Area`` (Mbpp/581) and
``digit_distance_nums`` (Mbpp/558) also accept the answer of EvalPlus's alternative reading of the task, set
equality for eight tasks, "not None" for three); HumanEval's ``find_zero`` checks ``|poly(xs, out)| <= atol``; when
the exact match fails and ``atol`` is non-zero (or the expected value ``is_floats``, which sets atol = 1e-6 for this
and every later input, as EvalPlus's loop does) the types and lengths must match and ``np.allclose(out, exp,
rtol=1e-7, atol)`` (written here in the standard library) must hold.

A candidate chooses its result's text, so it is read within bounds that keep the host's time and memory linear in
the text's size (:func:`read_result`, :func:`decode`), and any exception of a comparison is the candidate's failure
(docs/METHOD.md, "Which layer bounds what, on the host").
"""

from __future__ import annotations

import decimal
import fractions
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from lorapop.modeltext import NotLiteral
from lorapop.tasks.values import literal_value

# What a candidate's outputs may hold, so that rebuilding and comparing them on the host stays linear in their size
# (docs/METHOD.md, "Which layer bounds what"). An int of more bits than this would take seconds to convert for a
# comparison with a Decimal (quadratic in its digits); Fraction and int text stays within CPython's default
# int_max_str_digits (no exponent form: '1e10000000' would be ten million digits); a set, frozenset or dict with more
# distinct members of one hash than this would take time quadratic in their number to build.
MAX_INT_BITS = 1 << 16
MAX_DIGITS = 4300
MAX_SAME_HASH = 64
_RATIONAL = re.compile(r"-?[0-9]{1,%d}(?:/[0-9]{1,%d})?" % (MAX_DIGITS, MAX_DIGITS))


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


def decode(x: Any, max_int_bits: int | None = MAX_INT_BITS) -> Any:
    """A JSON tree from ``_enc`` -> plain Python values (only builtin types, Fraction, Decimal and Opaque).
    ``max_int_bits``: the largest int the tree may hold (None: any; only for the canonical solutions' outputs)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if not isinstance(x, list) or not x or not isinstance(x[0], str):
        raise WireError(f"not an encoded value: {str(x)[:80]}")
    tag, rest = x[0], x[1:]
    try:
        if tag == "L":
            return _items(rest[0], max_int_bits)
        if tag == "T":
            return tuple(_items(rest[0], max_int_bits))
        if tag == "S":
            return set(few_per_hash(_items(rest[0], max_int_bits)))
        if tag == "F":
            return frozenset(few_per_hash(_items(rest[0], max_int_bits)))
        if tag == "D":
            pairs = [(decode(k, max_int_bits), decode(v, max_int_bits)) for k, v in rest[0]]
            few_per_hash([k for k, _ in pairs])
            return dict(pairs)
        if tag == "I":
            if max_int_bits is not None and len(rest[0]) > max_int_bits // 4 + 3:
                raise WireError(f"int of more than {max_int_bits} bits")
            return int(rest[0], 16)
        if tag == "C":
            return complex(float(rest[0]), float(rest[1]))
        if tag == "B":
            return rest[0].encode("latin-1")
        if tag == "Q":
            if not isinstance(rest[0], str) or not _RATIONAL.fullmatch(rest[0]):
                raise WireError("a Fraction is written n or n/d, each of at most %d digits" % MAX_DIGITS)
            return fractions.Fraction(rest[0])
        if tag == "M":
            return decimal.Decimal(rest[0])
        if tag == "O":
            return Opaque(str(rest[0]), str(rest[1]))
        if tag == "H":
            return Digest(str(rest[0]), int(rest[1]))
    except WireError:
        raise
    except (TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as e:
        raise WireError(f"malformed {tag!r} value: {type(e).__name__}: {str(e)[:200]}") from e
    raise WireError(f"unknown tag {tag!r}")


def _items(xs: list, max_int_bits: int | None) -> list:
    if not isinstance(xs, list):
        raise WireError("container payload is not a list")
    # JSON leaves inline (only lists carry tags): a call per element doubles the cost on large outputs
    return [i if type(i) is not list else decode(i, max_int_bits) for i in xs]


def few_per_hash(items: list) -> list:
    """``items`` unchanged, when no more than MAX_SAME_HASH distinct ones share a hash; else WireError. Ints, floats
    and tuples of them hash the same in every process, so a candidate can choose thousands of distinct values of one
    hash, and a set or dict of them takes time quadratic in their number; this check takes at most MAX_SAME_HASH
    comparisons per item. Unhashable items raise TypeError, as ``set()`` would."""
    seen: dict[int, list] = {}
    for x in items:
        group = seen.setdefault(hash(x), [])
        if any(x == y for y in group):
            continue
        if len(group) >= MAX_SAME_HASH:
            raise WireError(f"more than {MAX_SAME_HASH} distinct items of one hash")
        group.append(x)
    return items


def is_one_string_literal(text: str) -> bool:
    """Whether ``text`` is one quoted string literal as ``repr(str)`` writes it (one line, no NUL, no prefix, no
    triple quotes, no second literal), checked in one pass over its characters. Its parse is then one constant: memory
    about the text's size, however the text was forged (a list literal of the same size would build an object per
    item)."""
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0] or any(c in text for c in "\n\r\x00"):
        return False
    body = text[1:-1].replace("\\\\", "")  # escaped backslashes; any backslash left escapes the character after it
    return not body.endswith("\\") and text[0] not in body.replace("\\" + text[0], "")


def read_result(value: str | None, max_chars: int) -> dict:
    """``repr(_result)`` of a sandbox run (a JSON string of at most ``max_chars`` characters) -> the decoded dict;
    WireError when it is not one. The text is parsed by the verdicts' literal parser
    (:func:`lorapop.tasks.values.literal_value`) once it is known to be one string literal, then by ``json``."""
    if value is None:
        raise WireError("no result")
    if not isinstance(value, str) or len(value) > max_chars:
        raise WireError(f"result over {max_chars} chars")
    if not is_one_string_literal(value):
        raise WireError("result is not a string")
    try:
        out = json.loads(literal_value(value, max_chars))
    except NotLiteral as e:
        raise WireError(f"unreadable result ({e.reason})") from e
    except (ValueError, MemoryError, RecursionError) as e:
        raise WireError(f"unreadable result ({type(e).__name__})") from e
    if not isinstance(out, dict):
        raise WireError("result is not an object")
    return out


def decode_all(values: list, max_int_bits: int | None = MAX_INT_BITS) -> list:
    if not isinstance(values, list):
        raise WireError("outputs are not a list")
    try:
        return [decode(v, max_int_bits) for v in values]
    except (RecursionError, MemoryError) as e:
        raise WireError(f"outputs unreadable ({type(e).__name__})") from e


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
        return set(few_per_hash(list(out))) == set(exp)
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
        except Exception:  # noqa: BLE001 - EvalPlus counts any exception of the comparison as a failure
            ok = False
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
        try:
            if da is None or db is None or da != db:
                return False
        except ArithmeticError:  # a signaling NaN raises on comparison: lcb_runner's check fails on it too
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
        except Exception:  # noqa: BLE001 - any exception of the comparison is the candidate's failure
            ok = False
        if not ok:
            return False, f"test {i}: wrong output"
    return True, None
