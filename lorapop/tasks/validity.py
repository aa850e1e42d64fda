"""Static checks of model-written programs and inputs (docs/METHOD.md, Tasks), and the code strings sent to the sandbox.

Static checks only parse and, for literal-ness, evaluate literal syntax on already size-capped strings, both through
the trainer's one parser of model text (lorapop/tasks/values.py: :func:`parse_text`, :func:`literal_of`, total and
silent); every evaluation of model-written code happens in the executor, and every comparison in the trainer
(lorapop/tasks/values.py). The static checks are a filter that keeps tasks within AZR's rules, not a wall: a
program that gets past them (a module's plain attribute can hand it what the banned names ban) meets the sandbox.
"""

from __future__ import annotations

import ast
import codecs
import functools
import re
import sys
import types

from lorapop.tasks.base import Invalid
from lorapop.modeltext import NotLiteral, literal_of, parse_text
from lorapop.tasks.values import literal_value

MAX_PROGRAM_CHARS = 6000
MAX_INPUT_CHARS = 1000
MAX_OUTPUT_CHARS = 400

# docs/METHOD.md, Tasks list, then whatever touches files, network, processes, interpreter internals or nondeterminism.
BANNED_MODULES = frozenset("""
logging random multiprocessing pebble subprocess threading _thread datetime time hashlib hmac bcrypt calendar
os sys posix nt socket ssl select selectors asyncio concurrent signal resource shutil pathlib io tempfile glob
fileinput filecmp zipfile tarfile gzip bz2 lzma zlib shelve dbm sqlite3 pickle marshal copyreg ctypes cffi gc
inspect importlib imp builtins types code codeop dis traceback atexit faulthandler pty tty fcntl termios mmap
platform sysconfig site zipimport pkgutil runpy secrets uuid urllib http ftplib smtplib poplib imaplib telnetlib
socketserver xmlrpc webbrowser requests weakref tracemalloc sched queue timeit cProfile profile pdb tokenize
""".split())
BANNED_NAMES = frozenset("""
eval exec compile open __import__ globals locals vars getattr setattr delattr breakpoint
__builtins__ __loader__ __spec__ __file__ __build_class__
exit quit credits copyright license help
""".split())  # the last line: builtins the site module adds, which the sandbox's interpreter (-S) has not


def _first_bad_module(name: str | None) -> str | None:
    if not name:
        return None
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        if ".".join(parts[:i]) in BANNED_MODULES:
            return name
    return None


# PEP 263's declaration, read on a program's first two lines as the interpreter reads it in a file
_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.ASCII)


def parse_program(src: str) -> ast.Module | Invalid:
    if len(src) > MAX_PROGRAM_CHARS:
        return Invalid("too_long", f"program has {len(src)} chars")
    for line in re.split(r"\r\n|\r|\n", src, maxsplit=2)[:2]:
        # A script saved as the UTF-8 it is decodes by a declared encoding (`# coding: latin-1` makes 'éé' four
        # characters); runs take the text as the text it is. So any other encoding is refused, never misjudged.
        declared = _CODING.match(line)
        if declared is not None and _codec_name(declared.group(1)) != "utf-8":
            return Invalid("encoding_declared", f"coding: {declared.group(1)[:40]}")
    try:
        return parse_text(src)
    except NotLiteral as exc:
        return Invalid("syntax_error", exc.detail)


def _codec_name(name: str) -> str | None:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def check_program(src: str, importable: frozenset[str] | None = None) -> Invalid | None:
    """None when the program is statically acceptable: imports, then exactly one top-level `def f`, no classes,
    no banned module, builtin or dunder attribute anywhere. ``importable``: the modules the executor's runs can
    import (its ``importable``); an import of any other module is refused too, wherever it is: the line could only
    ever fail in the sandbox, where plain Python, which the student reasons about, would run it (a teacher's program
    importing one on every input but its own had right inputs judged wrong)."""
    tree = parse_program(src)
    if isinstance(tree, Invalid):
        return tree
    n_f = sum(isinstance(n, ast.FunctionDef) and n.name == "f" for n in tree.body)
    if n_f == 0:
        return Invalid("no_f", "no top-level def f")
    if n_f > 1:
        return Invalid("multiple_f", f"{n_f} definitions of f")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "f":
            pass
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            pass
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            pass  # a module docstring
        else:
            return Invalid("extra_toplevel", f"top level may hold only imports and def f, found {type(node).__name__}")
    nodes = list(ast.walk(tree))  # walked once (the walk is most of the check's time), read twice
    bound = _bound_names(nodes)
    for node in nodes:
        if isinstance(node, ast.ClassDef):
            return Invalid("has_class", node.name)
        if isinstance(node, ast.Import):
            for a in node.names:
                if _first_bad_module(a.name):
                    return Invalid("banned_import", a.name)
                if importable is not None and a.name not in importable:
                    return Invalid("banned_import", f"{a.name} (not importable in the sandbox)")
        elif isinstance(node, ast.ImportFrom):
            if node.level or _first_bad_module(node.module):
                return Invalid("banned_import", node.module or ".")
            if importable is not None and node.module not in importable:
                return Invalid("banned_import", f"{node.module} (not importable in the sandbox)")
            for a in node.names:
                full = f"{node.module}.{a.name}"
                # a name taken from a module is that module's attribute: a banned module or builtin under its own
                # name (``from enum import sys``), or anything private, is banned as if imported itself
                if a.name in BANNED_MODULES or a.name in BANNED_NAMES or _first_bad_module(full) or (
                        a.name.startswith("_") and node.module != "__future__"):
                    return Invalid("banned_import", full)
                if importable is not None and full not in importable and _is_submodule(node.module, a.name):
                    return Invalid("banned_import", f"{full} (not importable in the sandbox)")
                own = _module_name(node.module, a.name)  # a module, maybe under another name: enum's bltns (builtins)
                if own is not None and (_first_bad_module(own) or (importable is not None and own not in importable)):
                    return Invalid("banned_import", f"{full} (the module {own})")
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES and (node.id.startswith("__") or node.id not in bound):
            return Invalid("banned_name", node.id)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return Invalid("dunder_access", node.attr)
    return None


def _is_submodule(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module of this interpreter's library rather than an attribute of ``package``
    (``from json import tool`` imports one). Searched in the package's directory where the trainer has the package
    loaded (the sandbox's are standard ones: json, encodings, collections), without importing anything."""
    path = getattr(sys.modules.get(package), "__path__", None)
    return name != "*" and path is not None and _found_in(f"{package}.{name}", tuple(path))


@functools.lru_cache(maxsize=4096)  # the library's directories do not change while the trainer runs; names repeat
def _found_in(full: str, path: tuple[str, ...]) -> bool:
    from importlib.machinery import PathFinder

    try:
        return PathFinder.find_spec(full, list(path)) is not None
    except Exception:  # noqa: BLE001 - a name no module can have
        return False


def _module_name(module: str, name: str) -> str | None:
    """The module's own name where the attribute ``module.name`` is a module (enum keeps builtins as ``bltns``), else
    None. Looked up in the namespaces of the modules this process has loaded, never imported nor asked (importing a
    module a program names runs its code in the trainer: ``from venv.__main__ import x`` made a virtual environment,
    ``lib2to3.__main__`` raised SystemExit; a loaded package's own ``__getattr__`` imports lazily: 128 names from
    transformers loaded 2661 modules). The trainer runs the same interpreter as the sandbox, so a standard module it
    has loaded (enum is) has the same attributes there."""
    mod = sys.modules.get(module)
    value = vars(mod).get(name) if isinstance(mod, types.ModuleType) else None  # no module __getattr__ runs
    own = getattr(value, "__name__", None) if isinstance(value, types.ModuleType) else None
    return own if isinstance(own, str) else None


def _bound_names(nodes: list[ast.AST]) -> set[str]:
    """Names the program binds itself (a parameter called `vars` is not the builtin); ``nodes``: all of its tree."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def _is_literal(node: ast.AST) -> bool:
    try:
        literal_of(node)
        return True
    except NotLiteral:
        return False


def check_call_args(text: str) -> Invalid | None:
    """`text` must be the argument list of a call made only of literals: `f(<text>)` is then safe to build."""
    if not isinstance(text, str) or not text.strip():
        return Invalid("not_literal", "empty input")
    if len(text) > MAX_INPUT_CHARS:
        return Invalid("too_long", f"input has {len(text)} chars")
    try:
        tree = parse_text(f"f({text})", mode="eval")
    except NotLiteral as exc:
        return Invalid("not_literal", exc.detail)
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        return Invalid("not_literal", "not a plain argument list")
    for a in call.args:
        if isinstance(a, ast.Starred) or not _is_literal(a):
            return Invalid("not_literal", ast.get_source_segment(f"f({text})", a) or "argument")
    for k in call.keywords:
        if k.arg is None or not _is_literal(k.value):
            return Invalid("not_literal", f"keyword {k.arg}")
    return None


def check_literal(text: str, max_chars: int = MAX_OUTPUT_CHARS) -> Invalid | None:
    """A single Python literal expression (a predicted or produced output), read by the same parser that judges it
    (lorapop/tasks/values.py)."""
    try:
        literal_value(text, max_chars)
    except NotLiteral as exc:
        return Invalid(exc.reason, exc.detail)
    return None


def call_code(program: str, input_text: str) -> str:
    """Program, then `_result = f(<input>)`; the input was checked by `check_call_args`."""
    return f"{program}\n\n_result = f({input_text})\n"


def status_to_invalid(status: str, error: str | None) -> Invalid:
    if status == "output_limit":
        return Invalid("output_too_long", error or "")
    return Invalid({"timeout": "timeout", "memory": "memory", "error": "runtime_error",
                    "crashed": "crashed"}.get(status, status), error or "")
