"""The map of the core, checked: docs/design.md's module map is what the imports say.

design.md, "Module map", holds two blocks this test reads:

* ``floors``: every module of ``aiowheel/`` (the package's top level, not its
  subpackages) on the floor its run-time imports put it. A module's floor is one
  above the highest floor it imports at run time, at module level or inside a
  function; a module that imports nothing of aiowheel is on floor 0. Floors exist
  only if the run-time imports form a DAG, so the block also says they do.
* ``type-only edges``: the imports made under ``if TYPE_CHECKING:`` that point up
  or sideways (to a module on the same floor or above). They give mypyc a concrete
  class to bind native calls against (docs/design.md, "Rules for compiled modules");
  each one is a place where a lower room calls a higher one at run time, so the list
  is the set of such calls a reviewer has to know about, and it changes only on
  purpose.

The block is the truth a newcomer reads; this test fails when the code moves and the
map does not (or the other way round). The largest circle that the type-only edges
close is stated in design.md too, and checked here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiowheel

PACKAGE = Path(aiowheel.__file__).parent
# The checkout's docs, beside these tests: the package may be installed elsewhere
# (nox installs it into its own environment), and its sources are read from there.
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"

RUNTIME = "runtime"
TYPE_ONLY = "type"


def _targets(node: ast.stmt, here: str, modules: set[str]) -> Iterator[str]:
    """The top-level aiowheel modules an import statement names."""
    names: list[str] = []
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level == 1 and not module:
            names = [alias.name for alias in node.names]
        elif node.level == 1:
            names = [module.split(".")[0]]
        elif module == "aiowheel":
            names = [alias.name for alias in node.names]
        elif module.startswith("aiowheel."):
            names = [module.split(".")[1]]
    elif isinstance(node, ast.Import):
        names = [a.name.split(".")[1] for a in node.names if a.name.startswith("aiowheel.")]
    yield from (name for name in names if name in modules and name != here)


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def import_graph() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> the kinds of import between them (run time, type only)."""
    sources = {p.stem: p for p in PACKAGE.glob("*.py")}
    modules = set(sources)
    edges: dict[tuple[str, str], set[str]] = {}

    def visit(node: ast.AST, here: str, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for inner in child.body:
                    visit_statement(inner, here, TYPE_ONLY)
                for inner in child.orelse:
                    visit_statement(inner, here, kind)
            elif isinstance(child, ast.stmt):
                visit_statement(child, here, kind)
            else:
                visit(child, here, kind)

    def visit_statement(statement: ast.stmt, here: str, kind: str) -> None:
        for target in _targets(statement, here, modules):
            edges.setdefault((here, target), set()).add(kind)
        visit(statement, here, kind)

    for name, path in sources.items():
        visit(ast.parse(path.read_text(), str(path)), name, RUNTIME)
    return edges


def floors(
    edges: dict[tuple[str, str], set[str]], modules: set[str] | None = None
) -> dict[str, int]:
    """Each module's floor over the run-time imports; AssertionError on a cycle."""
    if modules is None:
        modules = {p.stem for p in PACKAGE.glob("*.py")}
    below = {
        m: {b for (a, b), kinds in edges.items() if a == m and RUNTIME in kinds} for m in modules
    }
    floor: dict[str, int] = {}
    visiting: list[str] = []

    def place(module: str) -> int:
        if module in floor:
            return floor[module]
        assert module not in visiting, f"run-time import cycle: {' -> '.join([*visiting, module])}"
        visiting.append(module)
        floor[module] = 1 + max((place(b) for b in below[module]), default=-1)
        visiting.pop()
        return floor[module]

    for module in sorted(modules):
        place(module)
    return floor


def type_only_edges_up(
    edges: dict[tuple[str, str], set[str]], floor: dict[str, int]
) -> set[tuple[str, str]]:
    return {
        (a, b) for (a, b), kinds in edges.items() if kinds == {TYPE_ONLY} and floor[b] >= floor[a]
    }


def largest_circle(edges: dict[tuple[str, str], set[str]]) -> set[str]:
    """The largest strongly connected set of modules over every import, type-only too."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())

    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reachable = {m: reach(m) for m in graph}
    circles = [{m for m in reachable[a] if a in reachable[m]} for a in graph]
    return max(circles, key=len)


def _block(name: str) -> list[str]:
    """The lines of design.md's fenced block whose first line is ``# <name>``."""
    text = DESIGN.read_text()
    match = re.search(rf"```text\n# {re.escape(name)}\n(.*?)```", text, re.S)
    assert match, f"docs/design.md has no ```text block opening with '# {name}'"
    return [line for line in match.group(1).splitlines() if line.strip()]


def documented_floors() -> dict[str, int]:
    found: dict[str, int] = {}
    for line in _block("floors"):
        head, _, names = line.partition(":")
        number = int(head.removeprefix("floor").strip())
        for module in names.split():
            assert module not in found, f"{module} is on two floors in docs/design.md"
            found[module] = number
    return found


def documented_type_only_edges() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for line in _block("type-only edges"):
        importer, _, imported = line.partition("->")
        for target in imported.split(","):
            found.add((importer.strip(), target.strip()))
    return found


def test_the_run_time_imports_stand_on_the_floors_design_md_draws() -> None:
    floor = floors(import_graph())
    assert documented_floors() == floor


def test_the_type_only_edges_back_are_the_ones_design_md_lists() -> None:
    edges = import_graph()
    assert documented_type_only_edges() == type_only_edges_up(edges, floors(edges))


def test_the_largest_circle_is_the_one_design_md_names() -> None:
    text = DESIGN.read_text()
    match = re.search(r"the largest circle \(type-only edges included\) is (\d+) modules", text)
    assert match, "docs/design.md does not state the largest import circle"
    assert len(largest_circle(import_graph())) == int(match.group(1))


def test_the_module_map_has_a_row_for_every_module() -> None:
    """The table's first column names every file of aiowheel/ and every subpackage."""
    text = DESIGN.read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([\w./]+)` \|", section, re.M))
    files = {p.name for p in PACKAGE.glob("*.py")}
    packages = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert rows == files | packages


def test_a_cycle_is_found_and_named() -> None:
    """The floor computation refuses a run-time cycle rather than looping, and a
    type-only edge closes none."""
    cycle = {("_a", "_b"): {RUNTIME}, ("_b", "_a"): {RUNTIME}}
    with pytest.raises(AssertionError, match="_a -> _b -> _a"):
        floors(cycle, {"_a", "_b"})
    assert floors({("_a", "_b"): {RUNTIME}, ("_b", "_a"): {TYPE_ONLY}}, {"_a", "_b"}) == {
        "_a": 1,
        "_b": 0,
    }


# -- one writer per piece of state (docs/design.md, "Accounting") ----------------------

COUNTERS = {"pending", "scheduled", "fired", "cancelled"}
TAG = "inline copy of "


def _writes(attributes: set[str]) -> list[tuple[str, int, str]]:
    """(module, line, source line) of every assignment to one of ``attributes`` on
    another object (``x.attr = ...``, ``x.attr += ...``) in the core's modules."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(PACKAGE.glob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), str(path))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in attributes:
                    found.append((path.stem, target.lineno, lines[target.lineno - 1]))
    return found


def _tagged(module: str, line: int) -> bool:
    """Whether the write at ``line`` belongs to a tagged inline copy: the tag on that
    line or on the one just before it (a copy of two statements)."""
    lines = (PACKAGE / f"{module}.py").read_text().splitlines()
    return any(TAG in lines[n - 1] for n in (line, line - 1) if n >= 1)


def test_the_counters_have_one_writer() -> None:
    """The counters change in _state.py (``EngineState``); elsewhere only in a copy
    tagged with the ``EngineState`` method it copies (the pass, ``Engine.run_due``, and
    the hot paths of Timer). (_tracing's ``scheduled`` and ``cancelled`` are its own
    columns, not the counters.)"""
    outside = [
        (module, line, text.strip())
        for module, line, text in _writes(COUNTERS)
        if module not in ("_state", "_tracing") and not _tagged(module, line)
    ]
    assert outside == []
    state_source = (PACKAGE / "_state.py").read_text()
    for module, line, _text in _writes(COUNTERS):
        if module not in ("_state", "_tracing"):
            lines = (PACKAGE / f"{module}.py").read_text().splitlines()
            tag = next(text for text in (lines[line - 1], lines[line - 2]) if TAG in text)
            method = tag.split(TAG, 1)[1].split()[0]
            assert method.startswith("EngineState."), (module, line, method)
            assert f"def {method.split('.')[1]}(" in state_source


def test_a_handles_state_has_one_writer() -> None:
    """A handle's ``_result`` changes in _handle.py's transition methods; elsewhere
    only in a copy tagged with the method it copies (the pass, ``Timer._cancel``)."""
    outside = [
        (module, line, text.strip())
        for module, line, text in _writes({"_result"})
        if module != "_handle" and not _tagged(module, line)
    ]
    assert outside == []
    handle_source = (PACKAGE / "_handle.py").read_text()
    for module, line, _text in _writes({"_result"}):
        if module != "_handle":
            lines = (PACKAGE / f"{module}.py").read_text().splitlines()
            tag = next(text for text in (lines[line - 1], lines[line - 2]) if TAG in text)
            method = tag.split(TAG, 1)[1].split()[0]
            assert method.startswith("TimerHandle."), (module, line, method)
            assert f"def {method.split('.')[1]}(" in handle_source


def test_no_module_but_the_driver_imports_trio() -> None:
    """The backend seam is whole (aiowheel/_driver.py): no other core module imports
    trio, at module level, inside a function or for types."""
    importers: set[str] = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(name.split(".")[0] == "trio" for name in names):
                importers.add(path.stem)
    assert importers <= {"_driver"}
