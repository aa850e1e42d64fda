"""docs/ARCHITECTURE.md is the map of the package: every module it lists exists and every module is listed."""

from __future__ import annotations

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
