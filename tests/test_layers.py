"""The package is layered: no import circle, no private name taken across modules, no format
escape (docs/architecture.md, "Layers").

Every ``loom`` import inside src/loom is an arrow from its module to the imported one, classed
by where it stands: at module level ("runtime"), under ``if TYPE_CHECKING:`` ("typing"), or
inside a function ("local"); a package's ``__init__`` is a module of its own. A circle is a set
of modules that reach each other (Tarjan's strongly connected components), looked for three
ways: over every import, without the typing-only ones, and over module-level imports only.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "loom"

Arrows = dict[str, set[str]]


def modules(root: Path) -> dict[str, Path]:
    """Module name (``loom.crew.crew``; a package is its ``__init__``) -> file."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


class _Imports(ast.NodeVisitor):
    """The arrows of one module: imported module -> the kinds of place it is imported from."""

    def __init__(self, module: str, is_package: bool, known: dict[str, Path]) -> None:
        self.module, self.is_package, self.known = module, is_package, known
        self.where: list[str] = []
        self.found: dict[str, set[str]] = collections.defaultdict(set)

    def visit_If(self, node: ast.If) -> None:
        typing_only = "TYPE_CHECKING" in ast.unparse(node.test)
        if typing_only:
            self.where.append("typing")
        for child in node.body:
            self.visit(child)
        if typing_only:
            self.where.pop()
        for child in node.orelse:
            self.visit(child)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.where.append("local")
        self.generic_visit(node)
        self.where.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def _add(self, target: str) -> None:
        while target and target not in self.known:
            target = target.rpartition(".")[0]
        if target and target != self.module:
            kind = (
                "local"
                if "local" in self.where
                else "typing"
                if "typing" in self.where
                else "runtime"
            )
            self.found[target].add(kind)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.module.split(".")
            keep = len(parts) - node.level + (1 if self.is_package else 0)
            base = ".".join(parts[:keep] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            full = f"{base}.{alias.name}"
            self._add(full if full in self.known else base)


def import_arrows(mods: dict[str, Path]) -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> the kinds of import between them."""
    out: dict[tuple[str, str], set[str]] = {}
    for name, path in mods.items():
        visitor = _Imports(name, path.name == "__init__.py", mods)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        for target, kinds in visitor.found.items():
            out[(name, target)] = kinds
    return out


def circles(nodes: list[str], arrows: Arrows) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(arrows.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(arrows.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


MODES = {
    "every import": {"runtime", "typing", "local"},
    "without typing-only imports": {"runtime", "local"},
    "module-level imports only": {"runtime"},
}

# No circle is left in any mode; a new one fails the test.
KNOWN_CIRCLES: dict[str, list[list[str]]] = {mode: [] for mode in MODES}


def circles_of(mode: str) -> list[list[str]]:
    mods = modules(PACKAGE)
    arrows: Arrows = collections.defaultdict(set)
    for (a, b), kinds in import_arrows(mods).items():
        if kinds & MODES[mode]:
            arrows[a].add(b)
    return circles(sorted(mods), arrows)


def test_the_checker_finds_a_circle_of_each_kind(tmp_path: Path) -> None:
    # the check itself must see what it is meant to see: a typing-only circle, a local one
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n"
    )
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("from pkg import d\n")
    (pkg / "d.py").write_text("from . import c\n")
    mods = modules(pkg)
    found = import_arrows(mods)
    assert found[("pkg.a", "pkg.b")] == {"typing"} and found[("pkg.b", "pkg.a")] == {"local"}
    every = {a: {b for (x, b) in found if x == a} for a in mods}
    assert circles(sorted(mods), every) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    runtime_only = {
        a: {b for (x, b), k in found.items() if x == a and "runtime" in k} for a in mods
    }
    assert circles(sorted(mods), runtime_only) == [["pkg.c", "pkg.d"]]


@pytest.mark.parametrize("mode", list(MODES))
def test_no_import_circle(mode: str) -> None:
    found = circles_of(mode)
    assert [c for c in found if c not in KNOWN_CIRCLES[mode]] == []
    if found:
        left = "; ".join(" ".join(m.removeprefix("loom.") for m in c) for c in found)
        pytest.xfail(f"circles left ({mode}): {left}")


# The seams read an AgentSpec, the engine a TurnSpec, definitions know definitions: none of them
# imports Agent, Crew or the runtime, not even for an annotation (docs/architecture.md).
SEAMS = [
    "loom.context",
    "loom.hooks",
    "loom.definition",
    "loom.crew.file",
    "loom.memory.builder",
    "loom.memory.describe",
    "loom.memory.tools",
    "loom.policy.approval",
    "loom.policy.permissions",
    "loom.output",
    "loom.engine.recovery",
    "loom.backends.wiring",
    "loom.judge.turn",
    "loom.patterns.turn",
    "loom.spec",
    "loom.engine.turn_spec",
    "loom.engine.run_deps",
    "loom.engine.loop",
    "loom.engine.calls",
]
ABOVE_THE_SEAMS = {"loom", "loom.agent", "loom.crew", "loom.crew.crew", "loom.engine.runtime"}


def test_the_seams_never_import_agent_crew_or_the_runtime() -> None:
    mods = modules(PACKAGE)
    taken = {
        f"{a} -> {b} ({'/'.join(sorted(kinds))})"
        for (a, b), kinds in import_arrows(mods).items()
        if a in SEAMS and b in ABOVE_THE_SEAMS
    }
    assert sorted(taken) == []


def private_imports(mods: dict[str, Path]) -> set[str]:
    """``module: _name from other`` for every ``_name`` imported from another loom module."""
    out: set[str] = set()
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if not (node.level or (node.module or "").startswith("loom")):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.add(f"{name}: {alias.name} from {'.' * node.level}{node.module or ''}")
    return out


def test_no_private_name_is_imported_across_modules() -> None:
    found = private_imports(modules(PACKAGE))
    assert sorted(found) == []


@pytest.mark.parametrize("folder", ["src", "tests", "benchmarks"])
def test_no_format_escapes(folder: str) -> None:
    marker = "# fmt: " + "skip"  # spelled in two parts so this file does not hold it
    holders = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / folder).rglob("*.py"))
        if marker in p.read_text(encoding="utf-8")
    ]
    assert holders == []
