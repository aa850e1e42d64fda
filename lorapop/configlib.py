"""Typed dataclass configs from YAML plus ``--section.key=value`` overrides, and argparse flags from a dataclass.

Every config concern is a dataclass whose fields carry their documentation in ``metadata["help"]`` and, where a
value has a range, that range (``metadata`` keys ``choices``, ``ge``, ``gt``, ``le``, ``lt``; :func:`doc` writes
both). This module turns nested dicts (YAML, ``--section.key=value`` overrides merged in) into those dataclasses with
strict checking: an unknown key, a value of the wrong type or out of its field's range raises :class:`ConfigError`
with one line that names the dotted field, the value and what is allowed ("did you mean" for a near miss), before
anything heavy (a model) loads; rules that tie fields together live in the section's ``validate()``, which raises
the same error. :func:`add_arguments` / :func:`from_args` give a flat dataclass (``lorapop eval``'s ``EvalConfig``)
one typed, documented ``--field-name`` flag per field, so a new field is a new flag with no CLI code.

Why our own ~250 lines rather than a library (OmegaConf, Hydra, simple-parsing, tyro, jsonargparse): we need exactly
dataclasses + YAML + ``--a.b=c`` overrides + per-field help + one-line "did you mean" errors, with no new dependency
and no change to how configs, ``config.yaml`` and ``--help-config`` look. Those libraries each bring a larger surface
(interpolation, config groups, their own CLI grammar) and error messages we would have to wrap to keep the one-line
contract; this module is small, fully tested (tests/test_config.py) and has no dependency beyond PyYAML.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union

# PyYAML is imported where a file or a flag is parsed, not here: the executor declares its config with doc() and is
# imported by the unprivileged sandbox probes, which run on the system interpreter without the venv's packages.


class ConfigError(ValueError):
    """A config problem; the message is one line naming the field and what is allowed."""


RANGE_KEYS = ("choices", "ge", "gt", "le", "lt")


def doc(default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple | None = None, ge: float | None = None,
        gt: float | None = None, le: float | None = None, lt: float | None = None, why: str = "", **kw: Any) -> Any:
    """A dataclass field with its documentation and the range its value must lie in (``choices``, or bounds
    ``ge``/``gt``/``le``/``lt``; :func:`check_fields` enforces it, adding ``why`` to its error). Mutable defaults
    are copied per instance."""
    bounds = {"choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "why": why or None}
    meta = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        value = default
        return dataclasses.field(default_factory=lambda: copy.deepcopy(value), metadata=meta, **kw)
    return dataclasses.field(default=default, metadata=meta, **kw)


def allowed(meta: Any) -> str:
    """A field's range in words: ``one of 'a', 'b'``, ``>= 1``, ``in (0, 1]``; "" when it declares none."""
    if "choices" in meta:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    low = (f"[{meta['ge']}" if "ge" in meta else f"({meta['gt']}" if "gt" in meta else None)
    high = (f"{meta['le']}]" if "le" in meta else f"{meta['lt']})" if "lt" in meta else None)
    if low and high:
        return f"in {low}, {high}"
    if low:
        return (">= " if low[0] == "[" else "> ") + low[1:]
    if high:
        return ("<= " if high[-1] == "]" else "< ") + high[:-1]
    return ""


def in_range(value: Any, meta: Any) -> bool:
    if "choices" in meta:
        return value in meta["choices"]
    return (("ge" not in meta or value >= meta["ge"]) and ("gt" not in meta or value > meta["gt"])
            and ("le" not in meta or value <= meta["le"]) and ("lt" not in meta or value < meta["lt"]))


def field_name(prefix: str, name: str, flags: bool = False) -> str:
    """A field's name in an error: dotted (``engine.rank``), or as its flag (``--max-new-tokens``) for a flat
    dataclass whose fields are flags (:func:`add_arguments`)."""
    if flags:
        return "--" + name.replace("_", "-")
    return f"{prefix}.{name}" if prefix else name


def check_fields(obj: Any, prefix: str, flags: bool = False) -> None:
    """Every field of the dataclass ``obj`` against its annotation and its declared range: the one check every
    config section gets, from a YAML file, a ``--section.key=value`` override, a flag or code. Raises
    :class:`ConfigError` ``<prefix>.<field>: must be <range>, got <value>`` (choices: ``<value> is not one of ...``;
    ``None`` passes a range: "unset")."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        name, value = field_name(prefix, f.name, flags), getattr(obj, f.name)
        if dataclasses.is_dataclass(value) or value is None:
            continue
        _coerce(value, hints[f.name], name)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(k in f.metadata for k in RANGE_KEYS) and not all(in_range(v, f.metadata) for v in values):
            if "choices" in f.metadata:
                raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(str, f.metadata['choices']))}")
            why = f": {f.metadata['why']}" if f.metadata.get("why") else ""
            raise ConfigError(f"{name}: must be {allowed(f.metadata)}, got {value!r}{why}")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_name(inner)}"
    if origin is tuple:
        return "a list [" + ", ".join(_type_name(a) for a in typing.get_args(tp)) + "]"
    if origin is dict:
        k, v = typing.get_args(tp) or (Any, Any)
        return f"a mapping of {_type_name(k)} to {_type_name(v)}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints and numeric strings (YAML 1.1 reads ``3e-4`` as a string)
    are accepted for floats, nothing else is converted."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{name}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if tp is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, name)
            except ConfigError:
                continue
        raise bad
    if tp is type(None):
        if value is not None:
            raise bad
        return None
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise bad
        (inner,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or (args and args[-1] is not Ellipsis and len(value) != len(args)):
            raise bad
        if args and args[-1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value))
        return tuple(_coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        kt, vt = typing.get_args(tp) or (Any, Any)
        return {_coerce(k, kt, f"{name} key"): _coerce(v, vt, f"{name}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a section (mapping), got {type(value).__name__} {value!r}")
        return from_dict(tp, value, name)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string; accept what float() reads
            try:
                return float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise bad
    return value


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "", flags: bool = False) -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys, wrong types, values out of their field's range and the
    section's own rules (``validate()``) raise :class:`ConfigError`; ``flags``: fields are named as flags."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        full = field_name(prefix, str(key), flags)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown config key '{full}'{hint}; allowed here: {', '.join(sorted(fields))}")
        kwargs[key] = _coerce(value, hints[key], full)
    try:
        obj = cls(**kwargs)
    except TypeError as e:  # a required field without default
        raise ConfigError(f"{prefix or 'config'}: {e}") from e
    check_fields(obj, prefix, flags)
    check = getattr(obj, "validate", None)
    if callable(check):
        try:
            check()
        except ConfigError as e:  # a section's rule names its fields from the section down; the prefix completes them
            if prefix and not str(e).startswith(prefix):
                raise ConfigError(f"{prefix}.{e}") from e
            raise
    return obj


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def parse_overrides(args: list[str]) -> list[tuple[list[str], Any]]:
    """``["--a.b=3", "--c=x"]`` -> ``[(["a","b"], 3), (["c"], "x")]``; values are parsed as YAML scalars/lists."""
    import yaml

    out = []
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ConfigError(f"override '{arg}': expected the form --section.key=value")
        key, raw = arg[2:].split("=", 1)
        if not key:
            raise ConfigError(f"override '{arg}': empty key")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        out.append((key.split("."), value))
    return out


def merge_overrides(data: dict[str, Any], overrides: list[tuple[list[str], Any]]) -> dict[str, Any]:
    for path, value in overrides:
        node = data
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override --{'.'.join(path)}: '{part}' is not a section")
            node = nxt
        node[path[-1]] = value
    return data


def load_yaml(path: str) -> dict[str, Any]:
    import yaml

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError as e:
        raise ConfigError(f"config file not found: {path}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def describe(cls: type, prefix: str = "", obj: Any = None, loaded: Any = None) -> list[str]:
    """One line per field: ``name (type, default): help`` (for ``lorapop train --help-config``). The defaults are read
    off ``obj`` (an instance built with no values) where given, else off the fields: a nested section's default is
    the instance its parent's field makes, which may differ from its class's own defaults. Where ``loaded`` (the same
    config after validation) holds another value, the line gives both: ``default 'auto' -> 'adversarial'``."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f, default, resolved in field_defaults(cls, obj, loaded):
        full = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.extend(describe(tp, full, default, resolved))
            continue
        shown = repr(default) + (f" -> {resolved!r}" if loaded is not None and resolved != default else "")
        lines.append(f"{full} ({_type_name(tp)}, default {shown}): {f.metadata.get('help', '')}")
    return lines


def field_defaults(cls: type, obj: Any = None, loaded: Any = None) -> list[tuple[dataclasses.Field, Any, Any]]:
    """``(field, default, loaded value)`` per field of ``cls``: the default from ``obj`` when given, else the field's
    own (``"required"`` when it has none); the loaded value from ``loaded`` when given, else the default."""
    out = []
    for f in dataclasses.fields(cls):
        if obj is not None:
            default = getattr(obj, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        out.append((f, default, getattr(loaded, f.name) if loaded is not None else default))
    return out


def suggest(word: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, else ``""``."""
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _flag_value(tp: Any, flag: str):
    import yaml

    def convert(text: str) -> Any:
        try:
            parsed = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            parsed = text
        for value in (parsed, text):  # YAML's reading first (numbers, null), else the text as written
            try:
                return _coerce(value, tp, flag)
            except ConfigError as e:
                err = e
        raise argparse.ArgumentTypeError(str(err))
    convert.__name__ = _type_name(tp)  # argparse names the type in its "invalid ... value" message
    return convert


def _pair(flag: str):
    def convert(text: str) -> tuple[str, str]:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{flag} expects KEY=VALUE, got {text!r}")
        return key, value
    return convert


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One ``--field-name`` flag per field of the flat dataclass ``cls`` (except ``skip``), typed and documented
    from the field. Unset flags stay out of the namespace, so :func:`from_args` keeps the dataclass defaults. A bool
    gets ``--x/--no-x``; a dict field is repeatable ``--x KEY=VALUE``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag, tp, text = "--" + f.name.replace("_", "-"), hints[f.name], f.metadata.get("help", "")
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text)
        elif typing.get_origin(tp) is dict:
            parser.add_argument(flag, action="append", type=_pair(flag), default=argparse.SUPPRESS,
                                metavar="KEY=VALUE", help=text if "repeatable" in text else f"{text} (repeatable)")
        else:
            default = f.default if f.default is not dataclasses.MISSING else None
            parser.add_argument(flag, type=_flag_value(tp, flag), default=argparse.SUPPRESS,
                                metavar=f.name.upper(),
                                help=text if "default" in text else f"{text} (default: {default!r})")


def from_args(cls: type, ns: argparse.Namespace, **values: Any) -> Any:
    """The dataclass from the flags :func:`add_arguments` made (plus ``values``), checked like a YAML config."""
    hints = typing.get_type_hints(cls)
    data = {}
    for f in dataclasses.fields(cls):
        if hasattr(ns, f.name):
            v = getattr(ns, f.name)
            data[f.name] = dict(v) if typing.get_origin(hints[f.name]) is dict else v
    data.update(values)
    return from_dict(cls, data, flags=True)
