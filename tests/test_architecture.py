"""docs/ARCHITECTURE.md is the map of the package: every module it lists exists and every module is listed. Imports
flow one way: no circles (function-level imports included), nothing imports the CLI, no module imports a layer above
its own."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "lorapop"


def documented_modules() -> set[str]:
    """Paths (relative to lorapop/) named in the module tree: ``dir/`` lines open a package, ``x.py`` names a
    module of the package open at the indentation above it."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    tree = text[text.index("```\nlorapop/\n") + len("```\nlorapop/\n"):]
    tree = tree[:tree.index("```")]
    found, stack = set(), []
    for line in tree.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2 - 1  # "  x.py" sits in lorapop/, "    y.py" one level down
        stack = stack[:depth]
        for name in re.split(r"\s{2,}", line.strip())[0].split():  # names, then two spaces, then the description
            if name.endswith("/"):
                found.add("/".join(stack + [name]))
                stack = stack + [name.rstrip("/")]
            else:
                found.add("/".join(stack + [name]))
    return found


def package_modules() -> set[str]:
    out = set()
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG).as_posix()
        out.add(rel.rsplit("/", 1)[0] + "/" if p.name == "__init__.py" and "/" in rel else rel)
    out.discard("__init__.py")
    return out


def test_every_listed_module_exists():
    missing = sorted(m for m in documented_modules() if not (PKG / m).exists())
    assert not missing, "docs/ARCHITECTURE.md lists modules that do not exist: " + ", ".join(
        f"lorapop/{m}" for m in missing)


def test_every_package_module_is_listed():
    unlisted = sorted(package_modules() - documented_modules())
    assert not unlisted, "add these to the module tree in docs/ARCHITECTURE.md: " + ", ".join(
        f"lorapop/{m}" for m in unlisted)


def test_the_map_parser_sees_nested_and_grouped_entries():
    doc = documented_modules()
    assert {"rundir.py", "engine/", "engine/base.py", "tasks/code_i.py", "tasks/code_f.py", "train/stages.py"} <= doc


# ---------------------------------------------------------------- import graph

# Layers, bottom up: a module may import its own layer and those below. Keys are modules or packages (the longest
# prefix decides); a top-level module not named here is taken for a command (the layer of compare), a new module in a
# package for a member of that package.
LAYERS = {
    "lorapop": 0, "lorapop.configlib": 0, "lorapop.progress": 0, "lorapop.rundir": 0, "lorapop.raycluster": 0,
    "lorapop.model": 0, "lorapop.data": 0, "lorapop.hostmem": 0, "lorapop.tmpdirs": 0,  # leaf utilities, data
    "lorapop.engine": 1, "lorapop.executor": 1, "lorapop.diagnostics": 1,  # the bottom the docs name
    "lorapop.tasks": 2, "lorapop.evolve": 2,
    "lorapop.adapters": 2,  # reads PEFT dirs and run members for population.init_from; config validates with it
    "lorapop.config": 3,  # composes every section's config; imports no training, evaluation or reporting
    "lorapop.plan": 4,  # the memory plan: engine code on fake tensors; lorapop train runs it before loading weights
    "lorapop.plan_measure": 4,  # what the plan measures (the fake-tensor phases, the known shapes)
    "lorapop.plan_cpu": 4,  # the plan of a CPU run (its peak resident memory); lorapop train checks it on CPU
    "lorapop.train": 4, "lorapop.eval": 4, "lorapop.report": 4, "lorapop.report_data": 4, "lorapop.report_svg": 4,
    "lorapop.compare": 5, "lorapop.evolve.retention": 5,  # commands: run training and evaluation themselves
    "lorapop.cli": 6,
}
COMMAND_LAYER = LAYERS["lorapop.compare"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    """lorapop module -> the lorapop modules it imports anywhere in its file (module level, inside functions, under
    TYPE_CHECKING): ``from lorapop.x import y`` counts as importing ``lorapop.x.y`` when that is a module, else
    ``lorapop.x``; relative imports are resolved."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}

    def known(name: str) -> str:
        while name not in files:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {known(a.name) for a in node.names if a.name.split(".")[0] == "lorapop"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.split(".")[0] == "lorapop":
                    out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else known(base) for a in node.names}
        graph[mod] = out - {mod}
    return graph


def layer(mod: str) -> int:
    name = mod
    while name not in LAYERS:
        name = name.rpartition(".")[0]
    if name == "lorapop" and mod != "lorapop":
        return COMMAND_LAYER
    return LAYERS[name]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(mod: str, path: list[str]) -> list[str] | None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep, path + [dep])):
                return cycle
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state and (cycle := visit(mod, [mod])):
            return cycle
    return None


def test_the_import_graph_sees_every_kind_of_import():
    g = import_graph()
    assert "lorapop.compare" in g["lorapop.cli"]  # `from lorapop import compare` inside build_parser
    assert "lorapop.train.loop" in g["lorapop.cli"]  # function-level
    assert "lorapop.tasks.base" in g["lorapop.tasks.buffer"]  # module level
    assert "lorapop.engine.lora" in g["lorapop.engine.decode"] or "lorapop.engine.lora" in g["lorapop.engine.batching"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle (function-level imports count): " + " -> ".join(cycle)


def test_nothing_imports_the_cli():
    importers = sorted(m for m, deps in import_graph().items() if "lorapop.cli" in deps)
    assert not importers, f"lorapop.cli is the top of the package; imported by {importers}"


def test_config_imports_no_training():
    g, seen, todo = import_graph(), set(), ["lorapop.config"]
    while todo:
        for dep in g[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    upward = sorted(m for m in seen if m.startswith(("lorapop.train", "lorapop.eval", "lorapop.cli",
                                                       "lorapop.compare", "lorapop.report")))
    assert not upward, f"lorapop.config imports (directly or through others) {upward}"


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
                    for m, deps in import_graph().items() for d in deps if layer(d) > layer(m))
    assert not upward, "imports must flow down (LAYERS in this file):\n" + "\n".join(upward)
