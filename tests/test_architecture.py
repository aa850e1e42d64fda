"""docs/ARCHITECTURE.md is the map of the package: every module it lists exists, every module is listed, and its
Engine Protocol is the code's. Imports flow one way: no circles (function-level imports included), nothing imports
the CLI, the library imports no command, no module imports a floor above its own."""

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
    assert {"records/rundir.py", "engine/", "engine/base.py", "tasks/code_i.py", "tasks/code_f.py",
            "train/stages.py"} <= doc


# ---------------------------------------------------------------- import graph

# Floors, bottom up (docs/ARCHITECTURE.md draws them): a module may import its own floor and those below. Keys are
# modules or packages, the longest prefix decides; every top-level module must be named (a new one is given a floor
# here, on purpose). The library is everything below COMMANDS; the commands sit on it and the CLI on them.
LAYERS = {
    # 0: leaf utilities: no lorapop import above this floor
    "lorapop": 0, "lorapop.configlib": 0, "lorapop.progress": 0, "lorapop.raycluster": 0,
    "lorapop.model": 0, "lorapop.data": 0, "lorapop.hostmem": 0, "lorapop.tmpdirs": 0,
    "lorapop.modeltext": 0,  # the one parser of model-written text: tasks, diagnostics and eval read through it
    "lorapop.faults": 0,  # the test seam (fault injection), called by the trainer and the run directory
    # 1: the run's records: the run directory, members, what a probe and an eval write and read back
    "lorapop.records": 1,
    # 2: the machinery: the multi-LoRA engine, the sandbox, program diagnostics
    "lorapop.engine": 2, "lorapop.executor": 2, "lorapop.diagnostics": 2,
    # 3: the domain: task types, weight-space operators and PBT, adapters from outside
    "lorapop.tasks": 3, "lorapop.evolve": 3,
    "lorapop.adapters": 3,  # reads PEFT dirs and run members for population.init_from; config validates with it
    # 4: the config that composes every section's
    "lorapop.config": 4,
    # 5: what runs: training (and the memory plan it checks before loading weights), evaluation, reports, criteria,
    # the retention study
    "lorapop.plan": 5,
    "lorapop.train": 5, "lorapop.eval": 5, "lorapop.report": 5, "lorapop.criteria": 5, "lorapop.retention": 5,
    # 6: the commands (argument parsing, run-directory preparation, glue); 7: the dispatch table
    "lorapop.commands": 6,
    "lorapop.cli": 7,
}
COMMANDS = LAYERS["lorapop.commands"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    """lorapop module -> the lorapop modules it imports anywhere in its file (module level, inside functions, under
    TYPE_CHECKING): ``from lorapop.x import y`` counts as importing ``lorapop.x.y`` when that is a module, else
    ``lorapop.x``; relative imports are resolved; ``importlib.import_module(f"lorapop.x.{name}")`` (the CLI's
    dispatch table) counts as importing every module under ``lorapop.x.``."""
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
            elif (isinstance(node, ast.Call) and ast.unparse(node.func) == "importlib.import_module" and node.args
                  and isinstance(node.args[0], ast.JoinedStr) and isinstance(node.args[0].values[0], ast.Constant)):
                prefix = node.args[0].values[0].value  # f"lorapop.commands.{module}": any module under the prefix
                out |= {m for m in files if m.startswith(prefix)} if prefix.startswith("lorapop.") else set()
        graph[mod] = out - {mod}
    return graph


def floor_key(mod: str) -> str:
    """The LAYERS key that decides ``mod``'s floor: the longest prefix named there."""
    name = mod
    while name not in LAYERS:
        name = name.rpartition(".")[0]
    return name


def layer(mod: str) -> int:
    return LAYERS[floor_key(mod)]


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
    assert "lorapop.commands.compare" in g["lorapop.cli"]  # a row of the CLI's dispatch table
    assert "lorapop.train.loop" in g["lorapop.commands.train"]  # function-level
    assert "lorapop.tasks.base" in g["lorapop.tasks.buffer"]  # module level
    assert "lorapop.engine.lora" in g["lorapop.engine.decode"] or "lorapop.engine.lora" in g["lorapop.engine.model_runner"]
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
                                                       "lorapop.commands", "lorapop.report")))
    assert not upward, f"lorapop.config imports (directly or through others) {upward}"


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
                    for m, deps in import_graph().items() for d in deps if layer(d) > layer(m))
    assert not upward, "imports must flow down (LAYERS in this file):\n" + "\n".join(upward)


def test_every_top_level_module_has_a_floor():
    unnamed = sorted(m for m in import_graph() if m.count(".") == 1 and floor_key(m) == "lorapop")
    assert not unnamed, f"give these modules a floor in LAYERS (and in docs/ARCHITECTURE.md's map): {unnamed}"


def test_the_library_imports_no_command():
    """The commands are the top floor but one: the library (engine, executor, tasks, train, evolve, eval, report,
    ...) never imports one, however lazily."""
    bad = sorted(f"{m} imports {d}" for m, deps in import_graph().items()
                 if layer(m) < COMMANDS for d in deps if layer(d) >= COMMANDS)
    assert not bad, "\n".join(bad)


def test_every_command_is_in_the_commands_wing():
    """Every module that adds a subcommand's arguments lives in lorapop/commands/ (configlib's add_arguments makes
    flags from a dataclass, for any command, and is no command)."""
    found = sorted(m for m, path in ((_module_name(p), p) for p in PKG.rglob("*.py"))
                   if "def add_arguments(" in path.read_text()
                   and not m.startswith(("lorapop.commands", "lorapop.cli")) and m != "lorapop.configlib")
    assert not found, f"command code outside lorapop/commands/: {found}"


def test_evolve_holds_only_weight_space_operators_and_pbt():
    """evolve/ imports only itself, the engine's types and the config helpers: nothing of training, evaluation,
    tasks or the run directory (the retention study that trains children is lorapop/retention/)."""
    allowed = ("lorapop.evolve", "lorapop.engine", "lorapop.configlib")
    bad = sorted(f"{m} imports {d}" for m, deps in import_graph().items() if m.startswith("lorapop.evolve")
                 for d in deps if not d.startswith(allowed))
    assert not bad, "\n".join(bad)


def test_every_package_says_what_it_is_for_and_what_it_may_import():
    """Each package's __init__ docstring: at most three lines, naming what the package may import."""
    bad = []
    for init in sorted(PKG.rglob("__init__.py")):
        if init.parent == PKG:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if len(doc.strip().splitlines()) > 3 or "import" not in doc.lower():
            bad.append(init.relative_to(REPO).as_posix())
    assert not bad, f"say in <= 3 lines what the room is for and what it may import: {bad}"


# ---------------------------------------------------------------- the Engine Protocol as documented

def protocol_methods_in_code() -> set[str]:
    tree = ast.parse((PKG / "engine" / "base.py").read_text())
    proto = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    return {n.name for n in proto.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def protocol_methods_in_docs() -> set[str]:
    """``def name(`` lines of the ``class Engine(Protocol):`` block, and ``def a() / b()`` pairs."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    block = text[text.index("class Engine(Protocol):"):]
    block = block[:block.index("```")]
    names = set()
    for line in re.findall(r"^    def (.*)$", block, re.M):
        names.add(re.match(r"\w+", line).group(0))
        names |= set(re.findall(r"/ (\w+)\(", line))
    return names


def test_the_documented_engine_protocol_is_the_code_s():
    code, docs = protocol_methods_in_code(), protocol_methods_in_docs()
    assert docs == code, (f"docs/ARCHITECTURE.md's Engine Protocol and lorapop/engine/base.py's differ: only in the "
                          f"docs {sorted(docs - code)}, only in the code {sorted(code - docs)}")


def test_the_protocol_readers_see_the_methods():
    assert {"generate", "train_step", "state_dict", "load_state_dict"} <= protocol_methods_in_docs()
    assert {"generate", "train_step"} <= protocol_methods_in_code()
