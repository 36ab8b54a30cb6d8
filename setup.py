"""Build aiowheel: the pure-Python package, plus the compiled core wherever it builds.

Everything else is declared in pyproject.toml; this file only adds the compiled core.
The modules listed in ``aiowheel/_compiled.py`` (``MODULES``) are compiled by mypyc into
extension modules of the same names, next to their ``.py`` sources, which stay in the
package (``AIOWHEEL_PURE=1`` runs them). ``pip install .`` and ``pip install -e .`` both
come here (an editable install builds the extensions in place).

If the compiled core cannot be built, for any reason (no C compiler, mypyc rejects a
source, the compiler or linker fails), the build prints one warning line, removes
whatever it half-built, and installs the pure-Python package, which is complete on its
own. Two environment variables change that:

* ``AIOWHEEL_PURE=1``: build no extension (and remove extensions built in place before);
* ``AIOWHEEL_REQUIRE_COMPILED=1``: a failed compile fails the build (release wheels, CI).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "aiowheel"
# aiowheel/_compiled.py imports only the standard library, so it runs here without the
# package's dependencies; it holds the one list of modules to compile.
CORE: dict[str, Any] = runpy.run_path(os.path.join(HERE, PACKAGE, "_compiled.py"))
MODULES: tuple[str, ...] = CORE["MODULES"]
REQUIRE_ENV = "AIOWHEEL_REQUIRE_COMPILED"
# The setup.py commands that build extensions (the PEP 517 hooks run these).
BUILDING = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop"}


def _source(name: str) -> str:
    return os.path.join(PACKAGE, f"{name}.py")


#: The hand-written C modules, built with the compiled core, never without it:
#: aiowheel/_gcutil.c untracks and tracks an object for the garbage collector, and
#: aiowheel/_ctxutil.c tells whether the current context holds a snapshot's variables
#: without copying it; Python can do neither.
C_MODULES = ("_gcutil", "_ctxutil")


def _c_source(name: str) -> str:
    return os.path.join(PACKAGE, f"{name}.c")


def mypyc_extensions(target_dir: str) -> list[Extension]:
    """Generate the C of the compiled core and describe its extension modules: one
    shared library (``aiowheel/_core__mypyc``) and one small module per source."""
    from mypyc.build import mypycify

    extensions = list(
        mypycify(
            [
                # mypyc type-checks with the [tool.mypy] settings. It also reads the
                # modules the compiled ones import (the package's __init__ imports them
                # all), whose own imports (anyio, pyarrow...) the build environment
                # lacks: their errors are not the build's business (CI runs mypy).
                "--follow-imports=silent",
                # trio is optional: the build need not have it (it is then `Any`).
                "--ignore-missing-imports",
                # Its cache stays in the build tree, out of the project's .mypy_cache.
                "--cache-dir",
                os.path.join(target_dir, "mypy_cache"),
                *(_source(name) for name in MODULES),
            ],
            opt_level="3",
            group_name=f"{PACKAGE}._core",
            target_dir=target_dir,
        )
    )
    weakref_safe(target_dir)
    extensions.extend(
        Extension(f"{PACKAGE}.{name}", sources=[_c_source(name)]) for name in C_MODULES
    )
    return extensions


#: The compiled classes that take weak references with no Python base: Timer (users
#: keep timers in WeakKeyDictionaries; docs/design.md, "Compiled core").
WEAKREF_STRUCTS = ("aiowheel____timer___TimerObject",)
_MARK = "/* aiowheel setup.py: weakref-safe */"


def weakref_safe(target_dir: str) -> None:
    """Make weak references to compiled objects safe, in the C that mypyc generated.

    This mypyc gives a compiled class a ``__weakref__`` slot only through a Python
    base class (``TimerHandle`` has one through ``Generic``), and then treats the slot
    as an owned reference: ``tp_traverse`` visits it, ``tp_clear`` and ``tp_dealloc``
    ``Py_CLEAR`` it. The slot is the head of the object's weak-reference list, a
    borrowed pointer: a handle freed while a weak reference to it lives decrefs that
    weak reference and leaves it pointing at freed memory (the process crashes). So:

    * the slot is neither visited nor cleared, and the deallocator calls
      ``PyObject_ClearWeakRefs`` first when the list is not empty, as CPython's own
      ``subtype_dealloc`` does (one load and one test per dealloc);
    * the classes of ``WEAKREF_STRUCTS``, which have no such base, get the slot: one
      pointer after their struct (``tp_weaklistoffset``), handled the same way.

    Each expected piece of C must be found (or be patched already): if mypyc's output
    changes shape, the build fails here and falls back to the pure core, which
    supports weak references everywhere, rather than ship an unsafe core.
    """
    import glob

    sources = glob.glob(os.path.join(target_dir, "**", "*.c"), recursive=True)
    structs: dict[str, str] = {}  # struct name -> the weak-list slot's C expression
    texts: dict[str, str] = {}
    for path in sources:
        with open(path, encoding="utf-8") as f:
            texts[path] = f.read()
    originals = dict(texts)
    for text in texts.values():
        for struct in re.findall(
            r'\{"__weakref__", T_OBJECT_EX, sizeof\((\w+)\) \+ sizeof\(PyObject \*\), 0, NULL\}',
            text,
        ):
            if struct == "PyObject":
                continue  # a trait (a Protocol): never instantiated
            structs[struct] = (
                f"*((PyObject **)((char *)self + sizeof(PyObject *) + sizeof({struct})))"
            )
    for struct in WEAKREF_STRUCTS:
        structs[struct] = f"*((PyObject **)((char *)self + sizeof({struct})))"
    done: set[str] = set()
    for path, text in texts.items():
        for struct, slot in structs.items():
            text = text.replace(f"Py_VISIT({slot});", f"{_MARK} /* not visited */")
            text = text.replace(f"Py_CLEAR({slot});", f"{_MARK} /* not cleared */")
            dealloc = re.compile(
                r"(_dealloc\(" + struct + r" \*self\)\s*\{\s*PyObject_GC_UnTrack\(self\);)"
            )
            text, found = dealloc.subn(
                lambda m, slot=slot: (
                    f"{m[1]}\n    {_MARK}\n"
                    f"    if ({slot} != NULL) PyObject_ClearWeakRefs((PyObject *)self);"
                ),
                text,
            )
            if found or f"if ({slot} != NULL) PyObject_ClearWeakRefs" in text:
                done.add(struct)
            if struct in WEAKREF_STRUCTS:
                text = text.replace(
                    f".tp_basicsize = sizeof({struct}),",
                    f".tp_basicsize = sizeof({struct}) + sizeof(PyObject *), {_MARK}\n"
                    f"    .tp_weaklistoffset = sizeof({struct}),",
                )
        texts[path] = text
    managed = managed_weakrefs(texts)
    for path, text in texts.items():
        if text != originals[path]:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    every = "\n".join(texts.values())
    missing = [s for s in structs if s not in done]
    missing += [s for s in managed if s not in every]
    missing += [s for s in WEAKREF_STRUCTS if f".tp_weaklistoffset = sizeof({s})," not in every]
    unsafe = re.search(
        r"Py_CLEAR\(\*\(\(PyObject \*\*\)\(\(char \*\)self \+ sizeof\(PyObject \*\) "
        r"\+ sizeof\((?!PyObject\))",
        every,
    )
    if missing or unsafe:
        raise RuntimeError(f"mypyc's C changed shape; cannot make weak references safe: {missing}")


_MANAGED_TEMPLATE = re.compile(r"static PyTypeObject \w+_template_ = \{(.*?)\n\s*\};", re.S)


def managed_weakrefs(texts: dict[str, str]) -> list[str]:
    """CPython 3.12+: give the classes with a Python base their weak references.

    On 3.12 and later this mypyc gives such a class (``TimerHandle``,
    ``LoopTimerHandle``) a ``__dict__`` managed by the interpreter
    (``Py_TPFLAGS_MANAGED_DICT``) and no weak-reference slot at all: no
    ``__weakref__`` member, no ``tp_weaklistoffset``, so ``weakref.ref(handle)``
    raises TypeError ("cannot create weak reference to 'LoopTimerHandle' object").
    The managed dict already allocates the interpreter's two-pointer pre-header,
    whose second pointer is the weak-reference list of ``Py_TPFLAGS_MANAGED_WEAKREF``
    (PyType_Ready then sets ``tp_weaklistoffset`` itself): the flag costs no memory.
    As for a heap type of CPython's own, the deallocator must clear the weak
    references first (``subtype_dealloc`` does; ``PyObject_ClearWeakRefs`` tests the
    list itself, so no test here). Patches ``texts`` in place (the caller writes
    them) and returns the structs of the classes patched.
    """
    patched: list[str] = []
    for path, text in texts.items():
        for body in _MANAGED_TEMPLATE.findall(text):
            if "Py_TPFLAGS_MANAGED_DICT" not in body:
                continue
            size = re.search(r"\.tp_basicsize = sizeof\((\w+)\),", body)
            if size is None:
                raise RuntimeError("mypyc's C changed shape: a type with no tp_basicsize")
            struct = size[1]
            if struct == "PyObject":
                continue  # a trait (a Protocol, _timeout.Schedules): never instantiated
            flagged = re.sub(
                r"(\.tp_flags = [^,]*\bPy_TPFLAGS_MANAGED_DICT)"
                r"(?!\s*\| Py_TPFLAGS_MANAGED_WEAKREF)",
                r"\1 | Py_TPFLAGS_MANAGED_WEAKREF",
                body,
            )
            text = text.replace(body, flagged)
            dealloc = re.compile(
                r"(_dealloc\(" + struct + r" \*self\)\s*\{\s*PyObject_GC_UnTrack\(self\);)"
                r"(?!\s*/\* aiowheel)"
            )
            text = dealloc.sub(
                lambda m: f"{m[1]}\n    {_MARK}\n    PyObject_ClearWeakRefs((PyObject *)self);",
                text,
            )
            if f"{struct} *self)" in text and re.search(
                r"_dealloc\(" + struct + r" \*self\)\s*\{\s*PyObject_GC_UnTrack\(self\);"
                r"\s*/\* aiowheel setup.py: weakref-safe \*/\s*PyObject_ClearWeakRefs",
                text,
            ):
                patched.append(struct)
            else:
                raise RuntimeError(f"mypyc's C changed shape: no deallocator for {struct}")
        texts[path] = text
    return patched


class build_core(build_ext):
    """``build_ext`` that builds the compiled core, or falls back to pure Python."""

    def finalize_options(self) -> None:
        # mypyc generates the C here, so that setuptools sees the real extensions
        # (an editable install asks for their outputs before it runs the build), but
        # only for a command that builds: metadata and sdist commands finalize this
        # one too, to list its sources.
        self.fallback: str | None = "build_ext ran under a command that does not build"
        if CORE["pure_requested"](os.environ):
            self.fallback = f"{CORE['PURE_ENV']} is set"
        elif BUILDING.intersection(self.distribution.commands):
            target = os.path.join(self.get_finalized_command("build").build_temp, "mypyc")
            try:
                self.distribution.ext_modules = mypyc_extensions(target)
                self.fallback = None
            except (Exception, SystemExit) as exc:
                self.fallback = self._failed(exc)
        super().finalize_options()
        if self.fallback is not None:
            self.extensions = []

    def run(self) -> None:
        if self.fallback is None:
            try:
                super().run()
                self._write_manifest({"compiled": True, "modules": self._digests()})
                return
            except (Exception, SystemExit) as exc:
                self.fallback = self._failed(exc)
        self._discard()
        print(
            f"WARNING: aiowheel: installing the pure-Python core: {self.fallback}",
            file=sys.stderr,
            flush=True,
        )
        if not CORE["pure_requested"](os.environ):
            # Said once more by the first import (aiowheel/_compiled.py): pip shows a
            # build's output only when the build fails or with -v.
            self._write_manifest({"compiled": False, "reason": self.fallback})

    def _failed(self, exc: BaseException) -> str:
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
            raise exc
        return _one_line(exc)

    def _outputs(self) -> list[str]:
        # Every file a build of the core may leave: in the build tree (reused by the
        # next build), and in place for an editable install (never otherwise: a
        # `pip install .` must not touch the extensions of an editable one).
        paths = []
        inplace = self.inplace
        try:
            for where in {False, inplace}:
                self.inplace = where
                for name in [*MODULES, "_core__mypyc", *C_MODULES]:
                    path = self.get_ext_fullpath(f"{PACKAGE}.{name}")
                    paths += [path, os.path.join(os.path.dirname(path), CORE["MANIFEST"])]
        finally:
            self.inplace = inplace
        return paths

    def _discard(self) -> None:
        for path in self._outputs():
            if os.path.exists(path):
                os.remove(path)

    def _digests(self) -> dict[str, str]:
        digest = CORE["source_digest"]
        return {name: digest(os.path.join(HERE, _source(name))) for name in MODULES}

    def _write_manifest(self, content: dict[str, object]) -> None:
        # Next to the extensions (in the build tree, or in place for an editable
        # install), checked at import: the digest of each compiled source, or why the
        # compiled core was not built.
        directory = os.path.dirname(self.get_ext_fullpath(f"{PACKAGE}.{MODULES[0]}"))
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, CORE["MANIFEST"]), "w", encoding="utf-8") as f:
            json.dump({"compiler": "mypyc", **content}, f, indent=1, sort_keys=True)


def _one_line(exc: BaseException) -> str:
    """Why the build fell back, in a few words."""
    if isinstance(exc, SystemExit):
        return "mypyc rejected the source (run `mypy --strict aiowheel` to see why)"
    text = " ".join(str(exc).split())
    # distutils/setuptools: "command 'gcc' failed: No such file or directory" (or
    # "[Errno 2] No such file or directory: 'gcc'"), or "Command '['gcc', ...]' returned
    # non-zero exit status 1."
    missing = re.search(
        r"command '([^']+)' failed: No such file or directory"
        r"|No such file or directory: '([^']+)'",
        text,
        re.I,
    )
    if missing:
        return f"no C compiler ({missing[1] or missing[2]} not found)"
    failed = re.search(r"Command '\['([^']+)'.*returned non-zero exit status (\d+)", text)
    if failed:
        return f"the C compiler failed ({failed[1]} exited with status {failed[2]})"
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= 160 else text[:157] + "..."


setup(
    # A placeholder per module, so that the wheel is platform-specific and build_ext
    # runs; build_core replaces them with mypyc's extensions (or builds none).
    ext_modules=[Extension(f"{PACKAGE}.{name}", sources=[_source(name)]) for name in MODULES],
    cmdclass={"build_ext": build_core},
)
