"""Each package keeps its secrets, and no module or function grows past a size a reader can hold without a reason
written down.

**Private names.** The rooms are lorapop's packages: each subpackage of ``lorapop/`` (a nested package belongs to
the top one: ``tasks/styles/`` is in ``tasks``), and the top-level modules of ``lorapop/`` together as one more. A
name is private when it starts with one underscore (dunders are not). Outside the room that defines a private name
two things are refused:

* importing it: ``from lorapop.engine.decode import _mix32`` (or ``from lorapop.engine import _x``) in a module of
  another room;
* reading it as an attribute, ``obj._name``, where ``_name`` is defined (a def, a class, an assignment, an attribute
  store, an import alias) in another room of lorapop and nowhere in the reader's own room. ``self._x`` and
  ``cls._x`` are the object's own and always allowed.

The attribute rule goes by name, not by type (the AST does not know what ``obj`` is): a private name that two rooms
both define is allowed in both, and private names of other libraries (``torch._dynamo``, a transformers layer's
``_gradient_checkpointing_func``) are outside it. Test modules are exempt: a test may look inside what it checks.

**Sizes.** No module of lorapop over :data:`MAX_FILE_LINES` lines and no function over :data:`MAX_FUNCTION_LINES`
unless docs/ARCHITECTURE.md's section "Over the size limits" lists it with a sentence saying why; an entry whose
module or function is back under the limit (or gone) must leave the list.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "lorapop"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def room(rel: str) -> str:
    """The room of a module path relative to lorapop/: its top subpackage, or "lorapop" for a top-level module."""
    return rel.split("/")[0] if "/" in rel else "lorapop"


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _stored_names(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.alias):
            yield node.asname or node.name.split(".")[0]
        elif isinstance(node, ast.arg):
            yield node.arg


def _import_room(rel: str, node: ast.ImportFrom) -> str | None:
    """The room an ``from ... import`` reads from (None: outside lorapop)."""
    if node.level:
        package = rel.split("/")[:-1]  # the importing module's package under lorapop/, as path parts
        target = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    else:
        mod = (node.module or "").split(".")
        if mod[0] != "lorapop":
            return None
        target = mod[1:]
    if not target or (len(target) == 1 and (PKG / f"{target[0]}.py").exists()):
        return "lorapop"
    return target[0]


def violations(sources: dict[str, str]) -> list[str]:
    """Every read of another room's private name in ``sources`` (path relative to lorapop/ -> source text)."""
    trees = {rel: ast.parse(src) for rel, src in sources.items()}
    defined: dict[str, set[str]] = {}
    for rel, tree in trees.items():
        for name in _stored_names(tree):
            if private(name):
                defined.setdefault(name, set()).add(room(rel))
    found = []
    for rel, tree in trees.items():
        mine = room(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = _import_room(rel, node)
                found += [f"lorapop/{rel}:{node.lineno} imports {a.name} from {node.module} (room {src})"
                          for a in node.names if src is not None and src != mine and private(a.name)]
            elif isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.ctx, ast.Load):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                owners = defined.get(node.attr, set())
                if owners and mine not in owners:
                    found.append(f"lorapop/{rel}:{node.lineno} reads {ast.unparse(node)} "
                                 f"(private to {', '.join(sorted(owners))})")
    return found


@functools.lru_cache(maxsize=1)
def package_sources() -> dict[str, str]:
    return {p.relative_to(PKG).as_posix(): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def test_no_module_reads_another_packages_private_names():
    found = violations(package_sources())
    assert not found, "make these public in their own package, or move the code there:\n" + "\n".join(found)


def test_the_rule_sees_imports_and_attributes_across_rooms_only():
    sources = {
        "engine/torch_engine.py": "class E:\n    def __init__(self):\n        self._ctx = 1\n"
                                  "def _helper():\n    pass\n",
        "engine/replicas.py": "from .torch_engine import _helper\n\ndef f(e):\n    return e._ctx\n",
        "plan/measure.py": "from lorapop.engine.torch_engine import _helper\n\ndef g(eng):\n    return eng._ctx\n",
        "plan/gpu.py": "from lorapop.plan.measure import _at_depth\nimport torch\nx = torch._dynamo\n",
        "executor/sandbox.py": "from lorapop.executor.handle import _PAGE\n",
    }
    found = violations(sources)
    assert len(found) == 2, found
    assert any("plan/measure.py:1 imports _helper" in f for f in found)
    assert any("plan/measure.py:4 reads eng._ctx" in f for f in found)


# ------------------------------------------------------------------ sizes
@functools.lru_cache(maxsize=1)
def allowed() -> dict[str, str]:
    """docs/ARCHITECTURE.md's "Over the size limits" entries: ``- `path` reason`` or ``- `path:function` reason``."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Over the size limits"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    out = {}
    for m in re.finditer(r"^- `([^`]+)`:? (.+)$", section, re.M):
        out[m.group(1)] = m.group(2).strip()
    return out


def oversized() -> set[str]:
    """Modules over MAX_FILE_LINES (``path``) and functions over MAX_FUNCTION_LINES (``path:name``)."""
    out = set()
    for rel, src in package_sources().items():
        if src.count("\n") > MAX_FILE_LINES:
            out.add(rel)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    out.add(f"{rel}:{node.name}")
    return out


def test_every_oversized_module_and_function_has_its_reason_in_the_architecture():
    missing = sorted(oversized() - set(allowed()))
    assert not missing, (f"over {MAX_FILE_LINES} lines (module) or {MAX_FUNCTION_LINES} (function): split them, or "
                         "add a line saying why to docs/ARCHITECTURE.md's 'Over the size limits': "
                         + ", ".join(missing))


def test_the_size_exceptions_are_current_and_say_why():
    stale = sorted(set(allowed()) - oversized())
    assert not stale, "back under the limit or gone; take them off 'Over the size limits': " + ", ".join(stale)
    assert all(len(why.split()) >= 5 for why in allowed().values()), allowed()


# ------------------------------------------------------------------ one door per name
def _top_level_names(src: str) -> set[str]:
    """The names a module defines at its top level (defs, classes, assignments, also under if/try)."""
    out = set()
    for node in ast.parse(src).body:
        for n in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for target in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    out |= {x.id for x in ast.walk(target) if isinstance(x, ast.Name)}
    return out


def second_doors(sources: dict[str, str], packages: set[str]) -> list[str]:
    """Every ``from lorapop.x import name`` (absolute or relative) in ``sources`` (path relative to the repository ->
    text) where ``lorapop.x`` is a module, not a package's ``__init__``, that does not define ``name`` itself: a name
    reached through a module that only imports it. ``packages``: the dotted names of lorapop's packages."""
    modules = {p[:-3].replace("/", "."): s for p, s in sources.items() if p.startswith("lorapop/")}
    modules = {m[:-len(".__init__")] if m.endswith(".__init__") else m: s for m, s in modules.items()}
    found = []
    for path, src in sorted(sources.items()):
        here = path[:-3].replace("/", ".").split(".")
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parent = here[:-1]  # the package of a module, or of an __init__ its own
                base = ".".join(parent[:len(parent) - node.level + 1] + ([base] if base else []))
            if not base.startswith("lorapop") or base in packages or base not in modules:
                continue
            defined = _top_level_names(modules[base])
            found += [f"{path}:{node.lineno} imports {a.name} from {base}, which does not define it"
                      for a in node.names if f"{base}.{a.name}" not in modules and a.name not in defined]
    return found


def test_every_name_has_one_door():
    """A name is imported from the module that defines it or from its package's __init__, nowhere else: no module
    of the package, test, bench script or script passes on a name it only imports."""
    sources = {p.relative_to(REPO).as_posix(): p.read_text()
               for d in ("lorapop", "tests", "bench", "scripts") for p in sorted((REPO / d).rglob("*.py"))}
    packages = {p.parent.relative_to(REPO).as_posix().replace("/", ".") for p in PKG.rglob("__init__.py")}
    found = second_doors(sources, packages)
    assert not found, "import these from where they are defined (or the package's __init__):\n" + "\n".join(found)


def test_the_door_rule_sees_relative_and_absolute_imports():
    sources = {"lorapop/a/__init__.py": "from lorapop.a.base import X\n",
               "lorapop/a/base.py": "X = 1\n",
               "lorapop/a/impl.py": "from .base import X\n",
               "lorapop/b.py": "from lorapop.a.impl import X\nfrom lorapop.a import X\nfrom lorapop.a.base import X\n",
               "tests/t.py": "from lorapop.a.impl import X\n"}
    found = second_doors(sources, {"lorapop", "lorapop.a"})
    assert found == ["lorapop/b.py:1 imports X from lorapop.a.impl, which does not define it",
                     "tests/t.py:1 imports X from lorapop.a.impl, which does not define it"], found
