"""No class writes another class's private attribute but through a tagged copy.

The rule, checked over every module of the package by reading its source (AST):
a write ``x._name = ...`` (``+=``, an annotated assignment, a ``for`` or ``with``
target, ``del x._name``, ``setattr(x, "_name", ...)``) where ``x`` is not ``self``
is allowed only when

* ``_name`` is declared by a class in the writer's own module (in its ``__slots__``,
  as a class-level annotation or assignment, or by a ``self._name = ...`` in one of
  its methods). The type of ``x`` cannot be inferred in general, so a module's
  classes are friends: ``Wheel`` re-linking a ``WheelEntry`` or a ``Bucket`` in
  aiowheel/_wheel.py is one data structure's own business;
* or the line, or the line before it, carries ``inline copy of Class.method``: a hot
  path that copies the owner's method on purpose (tests/test_copies_agree.py drives
  each such copy against its original), and that method exists;
* or it is listed in ``ALLOWED`` below, with the module and the reason.

A single-underscore name is private; dunders are not.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "aiowheel"

#: (module, attribute) -> why that module writes a private attribute that no class of
#: its own declares, untagged. Each entry is a known debt or a deliberate exception;
#: an entry no write needs any more fails ``test_every_allowance_is_still_needed``.
ALLOWED: dict[tuple[str, str], str] = {
    # Outside the core.
    ("middleware._asgi", "_request"): "the held path's hold(), inline (RequestHolder.hold)",
    ("bench.env", "_ssock_stop"): "patches rloop's event loop, not an aiowheel class",
}

_TAG = re.compile(r"inline copy of ([A-Za-z_]\w*)\.([A-Za-z_]\w*)")
_SETTERS = {"setattr", "delattr", "object.__setattr__", "object.__delattr__"}


@dataclass(frozen=True)
class Write:
    module: str
    line: int
    written: str  # the target as written: ``handle._label``
    attribute: str


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def package_sources() -> dict[str, str]:
    """Every module of the package: dotted name under ``aiowheel`` -> source."""
    sources: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        sources[module] = path.read_text(encoding="utf-8")
    return sources


def declared(tree: ast.AST) -> set[str]:
    """The attribute names the module's classes declare: ``__slots__``, class-level
    annotations and assignments, ``self.x = ...`` in their methods."""
    names: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for statement in cls.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                names.add(statement.target.id)
            elif isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if not isinstance(target, ast.Name):
                        continue
                    names.add(target.id)
                    if target.id == "__slots__":
                        slots = ast.literal_eval(statement.value)
                        names.update([slots] if isinstance(slots, str) else slots)
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and _is_self(node.value)
            ):
                names.add(node.attr)
    return names


def private_writes(module: str, tree: ast.AST) -> Iterator[Write]:
    """Every write of a private attribute on something other than ``self``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if _private(node.attr) and not _is_self(node.value):
                yield Write(module, node.lineno, ast.unparse(node), node.attr)
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in _SETTERS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _is_self(node.args[0])
        ):
            yield Write(module, node.lineno, ast.unparse(node), node.args[1].value)


def _methods(trees: dict[str, ast.AST]) -> set[tuple[str, str]]:
    """(class, method) for every method a class of the package defines."""
    found: set[tuple[str, str]] = set()
    for tree in trees.values():
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef):
                for item in cls.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.add((cls.name, item.name))
    return found


@dataclass
class Found:
    foreign: list[Write]  # untagged writes of names no class of the module declares
    tagged: list[tuple[Write, str]]  # (write, the Class.method its tag names)
    bad_tags: list[tuple[Write, str]]  # tags that name no method of the package


def foreign_writes(sources: dict[str, str]) -> Found:
    """Apply the rule to ``sources`` (module -> source): what it finds."""
    trees: dict[str, ast.AST] = {module: ast.parse(src) for module, src in sources.items()}
    methods = _methods(trees)
    found = Found([], [], [])
    for module, tree in trees.items():
        friends = declared(tree)
        lines = sources[module].splitlines()
        for write in private_writes(module, tree):
            if write.attribute in friends:
                continue
            near = lines[write.line - 1] + "\n" + (lines[write.line - 2] if write.line > 1 else "")
            tag = _TAG.search(near)
            if tag is None:
                found.foreign.append(write)
            elif (tag[1], tag[2]) in methods:
                found.tagged.append((write, f"{tag[1]}.{tag[2]}"))
            else:
                found.bad_tags.append((write, f"{tag[1]}.{tag[2]}"))
    return found


def _show(writes: list[Write]) -> str:
    return "\n".join(f"  aiowheel/{w.module}:{w.line}: {w.written}" for w in writes)


def test_no_class_writes_another_class_private_attribute() -> None:
    found = foreign_writes(package_sources())
    unexplained = [w for w in found.foreign if (w.module, w.attribute) not in ALLOWED]
    assert not unexplained, (
        "a private attribute no class of the writing module declares is written, "
        "untagged; go through the owner's method, tag an inline copy "
        "('inline copy of Class.method') or list it in ALLOWED with a reason:\n"
        + _show(unexplained)
    )


def test_every_tag_names_a_method_that_exists() -> None:
    found = foreign_writes(package_sources())
    assert not found.bad_tags, [(w.module, w.line, name) for w, name in found.bad_tags]


def test_every_allowance_is_still_needed() -> None:
    """An allowance outlives its write only by mistake: remove it when the write goes."""
    found = foreign_writes(package_sources())
    used = {(w.module, w.attribute) for w in found.foreign}
    assert set(ALLOWED) - used == set(), "ALLOWED lists writes that are gone: remove them"


def test_the_wheel_writes_no_other_module_s_private_attribute() -> None:
    """aiowheel/_wheel.py is one data structure: it needs no tag and no allowance."""
    found = foreign_writes(package_sources())
    assert [w for w in found.foreign if w.module == "_wheel"] == []
    assert [w for w, _ in found.tagged if w.module == "_wheel"] == []
    assert not [key for key in ALLOWED if key[0] == "_wheel"]


# -- the pass itself finds what it must ------------------------------------------------

_OWNER = """
class Owner:
    __slots__ = ("_slot",)
    _annotated: int

    def __init__(self) -> None:
        self._slot = 0
        self._assigned = 0

    def touch(self, other: "Owner") -> None:
        other._slot = 1  # a friend: the same module declares it
        self._free = 2
"""

_WRITER = """
from owner import Owner

class Writer:
    def __init__(self) -> None:
        self._mine = 0

    def plain(self, owner: Owner) -> None:
        owner._slot = 1

    def augmented(self, owner: Owner) -> None:
        owner._assigned += 1

    def annotated(self, owner: Owner) -> None:
        owner._annotated: int = 3

    def chained(self, owner: Owner) -> None:
        owner.inner._free = self._mine = 4

    def unpacked(self, owner: Owner, other: Owner) -> None:
        owner._slot, other._slot = 5, 6

    def deleted(self, owner: Owner) -> None:
        del owner._assigned

    def reflected(self, owner: Owner) -> None:
        setattr(owner, "_slot", 7)
        object.__setattr__(owner, "_assigned", 8)

    def looped(self, owners: list[Owner]) -> None:
        for owners[0]._slot in range(3):
            pass

    def tagged(self, owner: Owner) -> None:
        owner._slot = 9  # inline copy of Owner.touch
        # inline copy of Owner.touch
        owner._assigned = 10

    def badly_tagged(self, owner: Owner) -> None:
        owner._slot = 11  # inline copy of Owner.nowhere

    def allowed(self, owner: Owner) -> None:
        self._mine = owner._slot  # a read: fine
        owner.public = 12  # not private
        owner.__dict__ = {}  # a dunder, not private
        setattr(owner, name, 13)  # a name the source does not spell: not seen
"""


def test_a_write_to_another_module_s_private_attribute_is_found() -> None:
    found = foreign_writes({"owner": _OWNER, "writer": _WRITER})
    lines = _WRITER.splitlines()
    seen = sorted((lines[w.line - 1].strip(), w.attribute) for w in found.foreign)
    assert seen == sorted(
        [
            ("owner._slot = 1", "_slot"),
            ("owner._assigned += 1", "_assigned"),
            ("owner._annotated: int = 3", "_annotated"),
            ("owner.inner._free = self._mine = 4", "_free"),
            ("owner._slot, other._slot = 5, 6", "_slot"),
            ("owner._slot, other._slot = 5, 6", "_slot"),
            ("del owner._assigned", "_assigned"),
            ('setattr(owner, "_slot", 7)', "_slot"),
            ('object.__setattr__(owner, "_assigned", 8)', "_assigned"),
            ("for owners[0]._slot in range(3):", "_slot"),
        ]
    )
    assert all(w.module == "writer" for w in found.foreign)
    assert sorted((w.line, name) for w, name in found.tagged) == [
        (lines.index("        owner._slot = 9  # inline copy of Owner.touch") + 1, "Owner.touch"),
        (lines.index("        owner._assigned = 10") + 1, "Owner.touch"),
    ]
    assert [name for _, name in found.bad_tags] == ["Owner.nowhere"]


def test_a_module_s_classes_are_friends() -> None:
    """The same write is no finding when a class of the writer's module declares the
    name (its slots, an annotation, or ``self._x =`` in a method)."""
    together = _OWNER + _WRITER.replace("from owner import Owner\n", "")
    found = foreign_writes({"both": together})
    assert found.foreign == []
    assert found.bad_tags == []
