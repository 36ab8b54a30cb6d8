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
from collections.abc import Callable, Iterator
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
    """The counters change in _engine.py (``Engine``); elsewhere only in a copy
    tagged with the ``Engine`` method it copies (the pass, ``_pass.run_due``, and
    the hot paths of Timer). (_tracing's ``scheduled`` and ``cancelled`` are its own
    columns, not the counters.)"""
    outside = [
        (module, line, text.strip())
        for module, line, text in _writes(COUNTERS)
        if module not in ("_engine", "_tracing") and not _tagged(module, line)
    ]
    assert outside == []
    engine_source = (PACKAGE / "_engine.py").read_text()
    for module, line, _text in _writes(COUNTERS):
        if module not in ("_engine", "_tracing"):
            lines = (PACKAGE / f"{module}.py").read_text().splitlines()
            tag = next(text for text in (lines[line - 1], lines[line - 2]) if TAG in text)
            method = tag.split(TAG, 1)[1].split()[0]
            assert method.startswith("Engine."), (module, line, method)
            assert f"def {method.split('.')[1]}(" in engine_source


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


# -- who may write what: every engine attribute and every handle slot -------------------
#
# Each attribute's owner module; a write anywhere else must be a copy tagged
# ``inline copy of <Class.method>`` naming a method the owner module defines (on the
# write's line or the line before). ``Engine.__init__`` declares every engine
# attribute; a handle class's ``__init__`` sets its own and its bases' slots.

_ENGINE_CLASSES = {"Engine"}
# The names a core module gives a reference to an engine (``engine``, ``live``...).
_ENGINE_NAMES = {"engine", "live", "self._engine", "self._live", "calls.engine", "self._host"}

#: engine attribute -> the modules that own its writes
ENGINE_WRITERS: dict[str, set[str]] = {
    **{
        name: {"_engine"}
        for name in [
            "_closed_error",
            "_on_close",
            "affinity",
            "backend",
            "clock",
            "closing",
            "driver",
            "limit",
            "loop",
            "on_error",
            "periodics",
            "stopped",
            "stranded",
            "waiters",
            "wheel",
            "pool",
            "tracing",
            "closed",
            "broken",
            "draining",
            "notify_cancel",
            "loop_debug",
            "loop_debug_run",
            "loop_timers",
            "pending",
            "scheduled",
            "fired",
            "cancelled",
            "failed",
            "lateness_max",
            "recheck_queued",
        ]
    },
    # The pass's own: it holds the driver while it runs (_pass.fire_due).
    "passing": {"_pass"},
    "wakeups": {"_pass"},
    "wake_at": {"_engine", "_pass"},
}

_HANDLE_CLASSES = {
    "WheelEntry": "_wheel",
    "TimerHandle": "_handle",
    "TracedHandle": "_handle",
    "PeriodicHandle": "_periodic",
    "LoopTimerHandle": "_loophandle",
}
# The names a core module gives a reference to a handle.
_HANDLE_NAMES = {"handle", "entry", "periodic", "op", "h", "e", "first", "last", "node", "nxt"}

#: handle slot -> the modules that own its writes. A handle class's __init__ may set
#: its bases' slots (a subclass of WheelEntry links itself as no entry); the rest are
#: the rooms that decide a field of a handle they do not define, listed on purpose.
HANDLE_WRITERS: dict[str, set[str]] = {
    "_bucket": {"_wheel"},
    "_deadline": {"_wheel", "_handle", "_periodic"},  # reset's lazy touch; a period
    "_prev": {"_wheel"},
    "_next": {"_wheel"},
    # Hidden from the collector while linked: the bucket's link and unlink own it; a
    # new handle's constructor sets where it starts (aiowheel/_wheel.py, GC_START).
    "_gc": {"_wheel", "_handle", "_loophandle"},
    "_args": {"_handle", "_loophandle"},
    "_callback": {"_handle", "_loophandle", "_periodic"},  # a stopped periodic's run
    "_context": {"_handle", "_loophandle", "_periodic"},  # a periodic run's context
    "_result": {"_handle"},
    "_timer": {"_handle"},
    # A trace's fields, written through TracedHandle's own methods (_stamp, _restamp,
    # _note_level), and by a periodic handle's next period - the trace's rows read them.
    "_id": {"_handle"},
    "_label": {"_handle"},
    "_level": {"_handle"},
    "_scheduled_at": {"_handle", "_periodic"},
    "_tracer": {"_handle"},
    "_in_run": {"_periodic"},
    "_engine": {"_loophandle"},
    "_repr": {"_loophandle"},
    "_shared_context": {"_loophandle"},
    "_source_traceback": {"_loophandle", "_loop"},  # debug mode: the loop's call_at
    **{
        name: {"_periodic"}
        for name in [
            "_active",
            "_anchor",
            "_fixed_rate",
            "_interval",
            "_k",
            "_origin",
            "_periodics",
            "_rearmed",
            "_user_args",
            "_user_cb",
        ]
    },
}


Use = tuple[ast.Attribute, str | None, str | None]


def _attribute_uses(tree: ast.AST) -> Iterator[Use]:
    """Every ``x.attr`` with the class and the function it sits in (None if none)."""

    def visit(node: ast.AST, cls: str | None, func: str | None) -> Iterator[Use]:
        for child in ast.iter_child_nodes(node):
            inner, name = cls, func
            if isinstance(child, ast.ClassDef):
                inner, name = child.name, None
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            if isinstance(child, ast.Attribute):
                yield child, cls, func
            yield from visit(child, inner, name)

    yield from visit(tree, None, None)


def _core_sources() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(PACKAGE.glob("*.py"))}


IsWrite = Callable[[ast.Attribute, str | None, str | None], bool]


def _engine_write(node: ast.Attribute, cls: str | None, func: str | None) -> bool:
    """A write to an engine, but its declaration (``Engine.__init__``)."""
    receiver = ast.unparse(node.value)
    if receiver == "self" and cls == "Engine" and func == "__init__":
        return False
    return (receiver == "self" and cls in _ENGINE_CLASSES) or receiver in _ENGINE_NAMES


def _handle_write(node: ast.Attribute, cls: str | None, func: str | None) -> bool:
    """A write to a handle, but a handle class setting up its own slots and its
    bases' (``__init__``)."""
    receiver = ast.unparse(node.value)
    if receiver == "self" and cls in _HANDLE_CLASSES:
        return func != "__init__"
    return receiver in _HANDLE_NAMES


def _declared_engine_attributes() -> set[str]:
    names: set[str] = set()
    tree = ast.parse((PACKAGE / "_engine.py").read_text())
    for node, cls, _func in _attribute_uses(tree):
        store = isinstance(node.ctx, ast.Store)
        if cls in _ENGINE_CLASSES and store and ast.unparse(node.value) == "self":
            names.add(node.attr)
    for cls_node in ast.walk(tree):
        if isinstance(cls_node, ast.ClassDef) and cls_node.name == "Engine":
            for statement in cls_node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    names.add(statement.target.id)
    return names


def _slots() -> set[str]:
    found: set[str] = set()
    for cls, module in _HANDLE_CLASSES.items():
        tree = ast.parse((PACKAGE / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for statement in node.body:
                    if isinstance(statement, ast.Assign) and ast.unparse(statement.targets[0]) == (
                        "__slots__"
                    ):
                        found |= set(ast.literal_eval(statement.value)) - {"__weakref__"}
    return found


def writes_outside_owner(
    table: dict[str, set[str]], is_write: IsWrite
) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    """(untagged writes outside the owner, tagged copies outside it) as (module, line,
    attribute)."""
    untagged: list[tuple[str, int, str]] = []
    tagged: list[tuple[str, int, str]] = []
    for module, source in _core_sources().items():
        for node, cls, func in _attribute_uses(ast.parse(source)):
            if not isinstance(node.ctx, ast.Store) or node.attr not in table:
                continue
            if not is_write(node, cls, func) or module in table[node.attr]:
                continue
            site = (module, node.lineno, node.attr)
            (tagged if _tagged(module, node.lineno) else untagged).append(site)
    return untagged, tagged


def test_every_engine_attribute_has_an_owner_in_the_table() -> None:
    assert _declared_engine_attributes() == set(ENGINE_WRITERS)


def test_every_handle_slot_has_an_owner_in_the_table() -> None:
    assert _slots() == set(HANDLE_WRITERS)


@pytest.mark.parametrize(
    ("table", "is_write"),
    [(ENGINE_WRITERS, _engine_write), (HANDLE_WRITERS, _handle_write)],
    ids=["engine", "handle"],
)
def test_no_attribute_is_written_outside_its_owner_but_by_a_tagged_copy(
    table: dict[str, set[str]], is_write: IsWrite
) -> None:
    """Engine attributes and handle slots are written by their owner modules only
    (docs/design.md, "Accounting"); elsewhere through a copy tagged with a method of
    an owner that exists."""
    untagged, tagged = writes_outside_owner(table, is_write)
    assert untagged == []
    sources = _core_sources()
    for module, line, attribute in tagged:
        lines = sources[module].splitlines()
        tag = next(text for text in (lines[line - 1], lines[line - 2]) if TAG in text)
        method = tag.split(TAG, 1)[1].split()[0].rstrip(".,;:)")
        owners = "".join(sources[owner] for owner in table[attribute])
        assert f"def {method.split('.')[-1]}(" in owners, (module, line, attribute, method)


def test_a_write_outside_the_owner_is_found() -> None:
    """The pass above sees an untagged write from another module (a fake table that
    gives ``closed`` to another owner finds _engine's own writes)."""
    untagged, _ = writes_outside_owner({"closed": {"_pass"}}, _engine_write)
    assert ("_engine", "closed") in {(module, attribute) for module, _, attribute in untagged}


# -- a handle's private names, touched from other rooms ---------------------------------
#
# The rooms that serve a timer reach a handle through a narrow face: its public API,
# and a few private methods that name what they do (the transitions of ``_result``,
# ``_stamp``, ``_trace_row``, ``PeriodicHandle._begin``...). What is left of reads and
# calls of a handle's private names (its slots and methods) from modules that do not
# define a handle class is the hot paths' inline copies and the few steps that decide a
# handle's state from outside (the cancel, the pass). ``_loop`` and ``_loophandle`` are
# the drop-in loop's handle's own rooms, not counted here.

#: The receivers that name a handle in the core (``handle._x``, ``self.entry._x``...).
_TOUCH_NAMES = _HANDLE_NAMES | {"timer_handle", "th"}
#: The modules whose touches do not count: the ones that define the handle classes and
#: the drop-in loop's.
_TOUCH_EXEMPT = {"_handle", "_wheel", "_loop", "_loophandle"}
#: The most touches allowed (the count when the rooms moved behind the handle's face:
#: 115 before).
HANDLE_TOUCH_CEILING = 55


def _private_handle_names() -> set[str]:
    """Every private slot and method name of the handle classes (not dunders)."""
    names: set[str] = set()
    for cls, module in _HANDLE_CLASSES.items():
        for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for statement in node.body:
                    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(statement.name)
                    elif isinstance(statement, ast.Assign) and (
                        ast.unparse(statement.targets[0]) == "__slots__"
                    ):
                        names |= set(ast.literal_eval(statement.value))
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def handle_touches(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """(module, line, ``receiver.name``) of each read, write or call of a handle's
    private name on a handle that is not ``self`` (``handle._bucket``,
    ``periodic._stop()``), in the modules that define no handle class."""
    names = _private_handle_names()
    found: list[tuple[str, int, str]] = []
    for module, source in sources.items():
        if module in _TOUCH_EXEMPT:
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Attribute) or node.attr not in names:
                continue
            receiver = ast.unparse(node.value)
            if receiver == "self" or receiver.startswith("self."):
                continue
            if receiver.split(".")[-1] in _TOUCH_NAMES:
                found.append((module, node.lineno, f"{receiver}.{node.attr}"))
    return found


def test_other_rooms_touch_a_handles_private_names_at_most_the_ceiling() -> None:
    """The rooms keep to the handle's narrow face: the touches of its private names
    from other modules do not grow back (lower the ceiling when they fall)."""
    touches = handle_touches(_core_sources())
    assert len(touches) <= HANDLE_TOUCH_CEILING, sorted(touches)


def test_a_touch_of_a_handles_private_name_is_counted() -> None:
    """The count sees a new read, a call and a write on a handle from another room,
    and not ``self``'s own."""
    sources = _core_sources()
    before = len(handle_touches(sources))
    fake = sources["_waiters"] + (
        "\n\ndef _peek(self, handle, entry):\n"
        "    handle._stop()\n"
        "    entry._deadline = handle._deadline\n"
        "    return self._bucket, self.entry._bucket\n"
    )
    after = handle_touches({**sources, "_waiters": fake})
    assert len(after) == before + 3
    assert {t for _m, _l, t in after} >= {"handle._stop", "entry._deadline", "handle._deadline"}


# -- the names a core module's docstring cites exist where it says ---------------------

_CORE_DOCSTRING_NAME = re.compile(r"``([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+|_?\w+\.py)(?:\(\))?``")


def _definitions() -> tuple[dict[str, set[str]], dict[str, str], dict[str, set[str]]]:
    """(class -> the names its body defines, class -> its module, module -> its
    top-level names)."""
    members: dict[str, set[str]] = {}
    where: dict[str, str] = {}
    top: dict[str, set[str]] = {}
    for module, source in _core_sources().items():
        tree = ast.parse(source)
        names = top.setdefault(module, set())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        for cls_node in ast.walk(tree):
            if isinstance(cls_node, ast.ClassDef):
                where[cls_node.name] = module
                members.setdefault(cls_node.name, set()).update(_class_members(cls_node))
    return members, where, top


def _class_members(node: ast.ClassDef) -> Iterator[str]:
    """The names a class's own body defines: methods, ``self.x`` attributes, class
    attributes and slots."""
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield inner.name
        elif isinstance(inner, ast.Attribute) and ast.unparse(inner.value) == "self":
            yield inner.attr
        elif isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name):
            yield inner.target.id
        elif isinstance(inner, ast.Assign):
            for target in inner.targets:
                if isinstance(target, ast.Name):
                    yield target.id
                if ast.unparse(target) == "__slots__":
                    yield from ast.literal_eval(inner.value)


def cited_names_missing() -> list[tuple[str, str]]:
    """(module, name) for each backticked ``Class.method``, ``module.Class.method`` or
    ``_module.py`` in a core module's docstring that does not exist where it says: the
    class's own body defines the method (not a base class), the module exists."""
    members, _where, top = _definitions()
    modules = set(top)
    missing: list[tuple[str, str]] = []
    for module, source in _core_sources().items():
        docstring = ast.get_docstring(ast.parse(source)) or ""
        for name in _CORE_DOCSTRING_NAME.findall(docstring):
            if name.endswith(".py"):
                if name.startswith("_") and name.removesuffix(".py") not in modules:
                    missing.append((module, name))
                continue
            parts = name.split(".")
            if parts[0] in modules:  # _module.Name[.member]
                if parts[1] not in top[parts[0]]:
                    missing.append((module, name))
                    continue
                parts = parts[1:]
            if len(parts) < 2 or parts[0] not in members:
                continue  # not a core class (asyncio.TimerHandle, loop.timer...)
            if parts[1] not in members[parts[0]]:
                missing.append((module, name))
    return missing


def test_the_names_a_core_docstring_cites_exist_where_it_says() -> None:
    assert cited_names_missing() == []


def test_a_name_cited_on_the_wrong_class_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Timer._cancel`` resolves by inheritance, but lives in ``TimerLifecycle``."""
    sources = _core_sources()
    fake = '"""``Timer._cancel`` and ``_nowhere.py``."""\n' + sources["_exceptions"]
    monkeypatch.setattr("test_module_map._core_sources", lambda: {**sources, "_exceptions": fake})
    assert set(cited_names_missing()) >= {
        ("_exceptions", "Timer._cancel"),
        ("_exceptions", "_nowhere.py"),
    }


def test_every_core_module_docstring_points_to_the_map() -> None:
    """A module's docstring says what it owns and points to docs/design.md's map for
    where it stands, rather than restating the map."""
    missing = [
        module
        for module, source in _core_sources().items()
        if module.startswith("_")
        and not module.startswith("__")
        and "docs/design.md" not in (ast.get_docstring(ast.parse(source)) or "")
    ]
    assert missing == []
