"""Sphinx configuration for aiowheel's documentation.

The CI command is ``sphinx-build -W -n -b html docs docs/_build/html``: warnings are
errors, every cross-reference must resolve (``-n``, nitpicky), and the build runs
offline, so nothing here may fetch anything (no intersphinx inventories). Then
``tools/check_doc_links.py`` checks that every internal link of the built pages
points at an anchor that exists (``-n`` does not see the links ``viewcode`` writes).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from sphinx.util import logging

# Document the checkout, not whatever aiowheel happens to be installed.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

# Document the pure-Python core: the same sources as the compiled one, but importable
# as source, so that autodoc reads real signatures and viewcode can highlight
# aiowheel/_timer.py and aiowheel/_handle.py (for an extension module it listed the
# page in its index and then wrote none: a broken link).
os.environ["AIOWHEEL_PURE"] = "1"

import aiowheel

project = "aiowheel"
author = "aiowheel developers"
copyright = "aiowheel developers"
release = aiowheel.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: `{directive}` fences, ::: fences, and anchors for "page.md#section" links.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc: members in source order, type hints in the signatures (short names).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True}
autoclass_content = "both"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# -n (nitpicky) reports every reference it cannot resolve. The ones ignored here cannot
# resolve by construction, and only these:
nitpick_ignore_regex = [
    # The standard library and pyarrow, named in signatures: documented elsewhere, and
    # the build is offline, so no intersphinx inventory links them.
    ("py:class", r"(collections\.abc|asyncio(\.streams|\.protocols|\.events)?|os)\.\w+"),
    ("py:class", r"concurrent\.futures\._base\.Future"),
    ("py:class", r"pa\.Schema"),
    # Private helpers that public signatures and bases name: the base class shared by
    # the handles that are traced (aiowheel/_handle.py) and the stream watch and
    # buffer type of aiowheel/middleware/_streams.py. Not part of the API, so not
    # documented.
    ("py:class", r"aiowheel\._handle\.TracedHandle"),
    # The constructors of the handles (which users never call: the timer does) name
    # the timer as its handles see it (aiowheel/_handle.py, HandleOwner) and, for a
    # periodic handle, its engine's periodic timers (aiowheel/_periodic.py).
    ("py:class", r"aiowheel\._handle\.HandleOwner"),
    ("py:class", r"aiowheel\._periodic\.Periodics"),
    # Timeout's constructor (the timer calls it) names what it uses of its timer: a
    # private protocol of aiowheel/_timeout.py.
    ("py:class", r"(aiowheel\._timeout\.)?Schedules"),
    # The compiled base of DelayedOperation (aiowheel/_purgatory.py), which the
    # purgatory's signatures name, and its own base, the watch list's node (_Link);
    # the public subclass is documented instead.
    ("py:class", r"aiowheel\._purgatory\._(DelayedOperation|Link)"),
    # Type variables (T, and Ts for a callback's arguments) of the generic signatures:
    # Sphinx renders them as class references, but they have no page of their own.
    ("py:class", r"(aiowheel\.\w+\.)?_?(T|Ts)"),
    ("py:class", r"(aiowheel\.middleware\._streams\.)?_(StreamWatch|ReaduntilBuffer)"),
    # The event-loop backend (aiowheel/_driver.py) that Timer.timeout() hands the
    # Timeout it builds: users never build one, and the seam is not part of the API.
    ("py:class", r"(aiowheel\._driver\.)?Backend"),
]

html_theme = "furo"
html_title = f"aiowheel {release}"
html_static_path = ["_static"]
html_css_files = ["aiowheel.css"]
pygments_style = "friendly"
pygments_dark_style = "monokai"

# -- Modules written by other engineers ---------------------------------------------
#
# docs/api.md documents these with a placeholder line ``<!-- optional-modules -->``
# that is replaced when the page is read: a module that does not exist yet is left out
# (with a note on the page and in the build log), so the build keeps passing while
# the module is being written. A module that exists but fails to import is *not*
# hidden: its automodule stays and the build fails under -W, as it should.

OPTIONAL_MODULES = {
    "aiowheel.purgatory": "Purgatory (delayed operations)",
    "aiowheel.middleware": "Idle-timeout middleware",
    "aiowheel.trace": "Timer traces",
}

_MARKER = "<!-- optional-modules -->"
_logger = logging.getLogger(__name__)


def _module_exists(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return False
        raise
    except Exception:
        # It exists but is broken: keep it, so that autodoc reports the error.
        return True
    return True


def _optional_sections() -> str:
    parts = []
    for name, title in OPTIONAL_MODULES.items():
        parts.append(f"## {title}\n")
        if _module_exists(name):
            parts.append(f"```{{eval-rst}}\n.. automodule:: {name}\n```\n")
        else:
            _logger.info("api.md: %s is not importable yet, left out", name)
            parts.append(f"`{name}` is not available in this build yet.\n")
    return "\n".join(parts)


def _fill_api_page(app: Any, docname: str, source: list[str]) -> None:
    if docname == "api" and _MARKER in source[0]:
        source[0] = source[0].replace(_MARKER, _optional_sections())


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _fill_api_page)
    return {"parallel_read_safe": True}
