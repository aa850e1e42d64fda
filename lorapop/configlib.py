"""Typed dataclass configs from YAML plus ``--section.key=value`` overrides.

Every config concern is a dataclass whose fields carry their documentation in ``metadata["help"]``. This module turns
nested dicts (YAML) into those dataclasses with strict checking: an unknown key or a value of the wrong type raises
:class:`ConfigError` with one line that names the field and what is allowed, before anything heavy (a model) loads.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A config problem; the message is one line naming the field and what is allowed."""


def doc(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A dataclass field with its documentation (mutable defaults are copied per instance)."""
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        value = default
        return dataclasses.field(default_factory=lambda: copy.deepcopy(value), metadata={"help": help}, **kw)
    return dataclasses.field(default=default, metadata={"help": help}, **kw)


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


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise :class:`ConfigError`."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown config key '{full}'{hint}; allowed here: {', '.join(sorted(fields))}")
        kwargs[key] = _coerce(value, hints[key], full)
    try:
        obj = cls(**kwargs)
    except TypeError as e:  # a required field without default
        raise ConfigError(f"{prefix or 'config'}: {e}") from e
    check = getattr(obj, "validate", None)
    if callable(check):
        try:
            check()
        except ConfigError:
            raise
        except ValueError as e:  # sub-configs written with plain ValueError still surface as one line
            raise ConfigError(f"{prefix + ': ' if prefix and not str(e).startswith(prefix) else ''}{e}") from e
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


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per field: ``name (type, default): help`` (for ``lorapop train --help-config``)."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        full = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.extend(describe(tp, full))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        lines.append(f"{full} ({_type_name(tp)}, default {default!r}): {f.metadata.get('help', '')}")
    return lines
