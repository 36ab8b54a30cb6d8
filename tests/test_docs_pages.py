"""What every user page of the docs (README.md and docs/*.md) must hold to: no issue
numbers or the project's internal targets, install lines that work today (from a
checkout; the registry form only as what will work once aiowheel is published), and
one meaning for a ratio (how many times better, above 1x better; a cost is a
percentage, never a ratio above 1 that means worse).

docs/benchmark-history.md is the project's record, not a user page: it keeps the
issues and targets its runs were measured against, and says so at its top.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The project's own record: exempt, and it says why on its first lines.
PROJECT_PAGES = frozenset({"docs/benchmark-history.md"})


def user_pages() -> list[str]:
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
    pages = ["README.md", *docs]
    return [p for p in pages if p not in PROJECT_PAGES]


def _read(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


# --- issue numbers and internal targets ---------------------------------------------

_ISSUE = re.compile(r"\bissues?\s+#?\d+|(?<![\w&/#])#\d{1,4}\b", re.IGNORECASE)
_TARGET = re.compile(
    r"\btargets? of (?:the |its )?(?:project|issues?|design)\b"
    r"|\btargets? (?:the |its )?issues? set\b"
    r"|\*\*(?:not )?met\*\*"
    r"|\((?:not )?met\)",
    re.IGNORECASE,
)


def internal_references(text: str) -> list[str]:
    return [m.group(0) for m in _ISSUE.finditer(text)] + [
        m.group(0) for m in _TARGET.finditer(text)
    ]


@pytest.mark.parametrize("page", user_pages())
def test_a_user_page_cites_no_issue_number_and_no_internal_target(page: str) -> None:
    assert internal_references(_read(page)) == [], page


def test_the_check_catches_an_issue_number_and_a_target() -> None:
    assert internal_references("the reference run (issue 32)") == ["issue 32"]
    assert internal_references("see #31 for the cause") == ["#31"]
    assert internal_references("Against the targets of issue 32: **not met**") == [
        "issue 32",
        "targets of issue",
        "**not met**",
    ]
    assert internal_references("a 1 ms tick; `--kafka-targets`, target rates") == []


def test_the_project_record_says_what_it_is() -> None:
    for page in PROJECT_PAGES:
        head = _read(page)[:2000]
        assert "project's record" in head, page


# --- install lines --------------------------------------------------------------------

_REGISTRY = re.compile(r"""pip install\s+(?:-\S+\s+)*["']?aiowheel\b""")
_CHECKOUT = re.compile(r"""pip install\s+(?:-\S+\s+)*["']?\.""")
_PUBLISHED = re.compile(r"once\b.{0,60}\bpublish", re.IGNORECASE | re.DOTALL)


def _units(text: str) -> list[str]:
    """Paragraphs of prose, and each line of a code block on its own."""
    units: list[str] = []
    for i, part in enumerate(re.split(r"^```.*$", text, flags=re.MULTILINE)):
        if i % 2:  # inside a fence
            units.extend(part.splitlines())
        else:
            units.extend(re.split(r"\n\s*\n", part))
    return units


def registry_installs_without_a_checkout(text: str) -> list[str]:
    """Registry install lines (``pip install aiowheel``, ``"aiowheel[x]"``) that do not
    follow a checkout install in the same paragraph (or code line), nor say that they
    are for once the package is published."""
    bad = []
    for unit in _units(text):
        for m in _REGISTRY.finditer(unit):
            before = unit[: m.start()]
            if _CHECKOUT.search(before) or _PUBLISHED.search(unit):
                continue
            bad.append(" ".join(unit[max(0, m.start() - 60) : m.end() + 20].split()))
    return bad


@pytest.mark.parametrize("page", user_pages())
def test_install_lines_name_the_checkout_first(page: str) -> None:
    assert registry_installs_without_a_checkout(_read(page)) == [], page


def test_the_check_catches_a_registry_install_line() -> None:
    assert registry_installs_without_a_checkout(
        'Install the loops with the extras: `pip install "aiowheel[uvloop,trio]"`.'
    )
    assert registry_installs_without_a_checkout(
        '```console\n$ pip install "aiowheel[analytics]"   # pyspark\n```\n'
    )
    assert not registry_installs_without_a_checkout(
        'In a checkout: `pip install ".[uvloop]"` (or `pip install "aiowheel[uvloop]"`).'
    )
    assert not registry_installs_without_a_checkout(
        "Once published, `pip install aiowheel` will install the wheel."
    )


# --- one meaning of a ratio -------------------------------------------------------------

_RATIO = r"\d(?:[\d,]*\d)?(?:\.\d+)?\s?[\u00d7x](?![\w])"
#: A ratio read as a cost: "1.5x the time", "0.80x the plain loop's CPU", "2x slower",
#: "1.5x on a time is +50%". A ratio says how many times *better*; a cost is a percentage.
_COST_RATIO = re.compile(
    _RATIO + r"(?:\s+to\s+" + _RATIO + r")?\**\s*"
    r"(?:the\b|as (?:long|much|slow)|slower\b|longer\b|more\b|worse\b"
    r"|(?:on an? \w+ )?(?:=|is)\s*[+-]\d)",
    re.IGNORECASE,
)
_TABLE_RATIO = re.compile(r"\|[^|\n]*" + _RATIO + r"[^|\n]*\|")


def _strip_code(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


#: "above 1x the drop-in loop is better", "below 1x worse": the line, not a figure.
_THRESHOLD = re.compile(r"(?:above|below|near|under|over)\s+$", re.IGNORECASE)


def cost_ratios(text: str) -> list[str]:
    text = _strip_code(text)
    return [
        " ".join(m.group(0).split())
        for m in _COST_RATIO.finditer(text)
        if not _THRESHOLD.search(text[max(0, m.start() - 8) : m.start()])
    ]


def tables_without_a_direction(text: str) -> list[str]:
    """The tables that hold a ratio (a figure followed by x or the multiplication
    sign) but do not say which way it goes: the header, or the row itself, must say
    what is better."""
    bad = []
    for table in re.findall(r"(?:^\|.*\n)+", _strip_code(text), flags=re.MULTILINE):
        rows = table.splitlines()
        header = rows[0].lower()
        for row in rows[2:]:
            if _TABLE_RATIO.search(row) and "better" not in header and "better" not in row:
                bad.append(row[:120])
    return bad


@pytest.mark.parametrize("page", user_pages())
def test_a_ratio_means_how_many_times_better(page: str) -> None:
    text = _read(page)
    assert cost_ratios(text) == [], page
    assert tables_without_a_direction(text) == [], page


def test_the_checks_catch_a_cost_ratio_and_an_undirected_table() -> None:
    assert cost_ratios("full tracing makes a pair take **1.5x to 1.7x** the time")
    assert cost_ratios("200 tasks cost 0.80x the plain loop's CPU per sleep")
    assert cost_ratios("the untraced run (1.5\u00d7 = +50%)")
    assert cost_ratios("it ran 2.4\u00d7 slower")
    assert cost_ratios("compared with the untraced one (1.5\u00d7 on a time is +50%)")
    assert not cost_ratios("it files and removes 3x to 4.5x faster than a dict")
    assert not cost_ratios("above 1\u00d7 the drop-in loop is better, below 1\u00d7 worse")
    undirected = "| figure | ratio |\n| --- | ---: |\n| re-arm | 15.8\u00d7 |\n"
    assert tables_without_a_direction(undirected) == ["| re-arm | 15.8\u00d7 |"]
    directed = "| figure | aiowheel is better by |\n| --- | ---: |\n| re-arm | 15.8\u00d7 |\n"
    assert tables_without_a_direction(directed) == []
