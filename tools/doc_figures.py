"""The benchmark figures the docs quote, from one reference run's results.

docs/_data/reference-run.json is a run of ``aiowheel bench ... --save`` (its command
is in docs/benchmarks.md). Every figure the README and the docs quote from it sits
between markers that name it, so that this script can rewrite it and check it:

* a table: ``<!-- reference-run table ITEM ITEM ... -->`` ... ``<!-- /reference-run -->``,
  where ITEM is ``WORKLOAD[@VARIANT]:METRIC``: one row per variant and event loop, with
  aiowheel's figure, the usual timer's on the same loop, and how many times better
  aiowheel is (``call_later-rloop``: against the drop-in loop its ratio names);
* a list of one metric's figures: ``<!-- reference-run list ITEM ... -->``: one row per
  contender (for figures with no peer, such as the middleware's cost);
* the machine: ``<!-- reference-run machine -->``;
* one figure in a sentence: ``<!-- ref ITEM CONTENDER [ratio] -->VALUE<!-- /ref -->``.

``python tools/doc_figures.py --write`` rewrites them all from the JSON;
``python tools/doc_figures.py`` (``--check``) exits 1 listing any that differ
(tests/test_doc_figures.py runs the check).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "_data" / "reference-run.json"
#: The files whose marked figures come from the reference run.
FILES = (
    "README.md",
    "docs/index.md",
    "docs/benchmarks.md",
    "docs/benchmark-history.md",
    "docs/loop.md",
)

_BLOCK = re.compile(
    r"(<!-- reference-run (?P<kind>table|list|machine)(?P<spec>[^>]*?)-->\n)"
    r"(?P<body>.*?)"
    r"(<!-- /reference-run -->)",
    re.DOTALL,
)
_INLINE = re.compile(r"(<!-- ref (?P<spec>[^>]*?) -->)(?P<body>.*?)(<!-- /ref -->)")
_BASES = ("asyncio", "uvloop", "trio", "rloop")
X = "\u00d7"


def fmt(value: float | None) -> str:
    """As the bench prints a figure: thousands separators, 3 significant digits."""
    if value is None or not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude == 0:
        return "0"
    return f"{value:.3g}"


def fmt_ratio(value: float | None) -> str:
    """A ratio to the precision a run supports, 2 or 3 significant digits (0.84x,
    2.49x, 15.8x, 2,510x): the figures it divides move by tens of percent."""
    if value is None or not math.isfinite(value):
        return "-"
    rounded = float(f"{value:.3g}")
    if rounded >= 100:
        return f"{rounded:,.0f}{X}"
    if rounded >= 10:
        return f"{rounded:.1f}{X}"
    return f"{value:.2f}{X}"


class Run:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.results: list[dict[str, Any]] = [r for r in document["results"] if r["samples"]]

    def select(self, item: str) -> list[dict[str, Any]]:
        where, _, metric = item.partition(":")
        workload, _, variant = where.partition("@")
        found = [
            r
            for r in self.results
            if r["workload"] == workload
            and r["metric"] == metric
            # A variant by its name or its first word ("idle" for "idle N=10,000").
            and (not variant or variant in (r["variant"], r["variant"].split(" ")[0]))
        ]
        if not found:
            raise ValueError(f"the reference run has no figure {item!r}")
        return found

    def one(self, item: str, contender: str) -> dict[str, Any]:
        found = [r for r in self.select(item) if r["contender"] == contender]
        if len(found) != 1:
            raise ValueError(f"the reference run has no single {item!r} of {contender}")
        return found[0]


def _unit(r: dict[str, Any]) -> str:
    unit = r["unit"]
    return "" if unit in ("", "1/s", "x") else f" {unit}"


def _what(r: dict[str, Any]) -> str:
    unit = {"1/s": "/s", "x": f"{X}"}.get(r["unit"], r["unit"])
    variant = f", {r['variant']}" if r["variant"] else ""
    return f"{r['label']}{variant} ({unit}, {r['better']} is better)"


def table(run: Run, items: list[str]) -> str:
    lines = [
        "| figure | event loop | aiowheel | the usual timer | aiowheel is better by |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for item in items:
        rows = run.select(item)
        variants = list(dict.fromkeys(r["variant"] for r in rows))
        for variant in variants:
            part = [r for r in rows if r["variant"] == variant]
            ours = {r["contender"]: r for r in part if r["kind"] in ("aiowheel", "loop")}
            peers = [r for r in part if r["kind"] not in ("aiowheel", "loop")]
            peers.sort(key=lambda r: _BASES.index(r["backend"]) if r["backend"] in _BASES else 9)
            for peer in peers:
                ratios = peer["ratios"] or {}
                against = next(iter(ratios), None)
                if against is None:
                    # A figure with no ratio: beside aiowheel on the same loop, else
                    # (rloop) on the uvloop base, as the bench compares them.
                    for base in (peer["backend"], "uvloop", "asyncio"):
                        same = [o for o in ours.values() if o["backend"] == base]
                        if same:
                            against = same[0]["contender"]
                            break
                mine = ours.get(against) if against else None
                aiowheel = (
                    f"{fmt(mine['median'])}{_unit(mine)} (`{mine['contender']}`)" if mine else "-"
                )
                usual = f"{fmt(peer['median'])}{_unit(peer)} (`{peer['contender']}`)"
                ratio = fmt_ratio(ratios.get(against)) if against in ratios else "-"
                lines.append(
                    f"| {_what(peer)} | {peer['backend']} | {aiowheel} | {usual} | {ratio} |"
                )
    return "\n".join(lines) + "\n"


def listing(run: Run, items: list[str]) -> str:
    lines = ["| figure | contender | median | min-max |", "| --- | --- | ---: | ---: |"]
    for item in items:
        for r in run.select(item):
            spread = f"{fmt(r['min'])}-{fmt(r['max'])}" if r["reps"] > 1 else "1 rep"
            lines.append(
                f"| {_what(r)} | `{r['contender']}` | {fmt(r['median'])}{_unit(r)} | {spread} |"
            )
    return "\n".join(lines) + "\n"


def machine(run: Run) -> str:
    m = run.document["machine"]
    s = run.document["settings"]
    load = m.get("loadavg") or ["?"]
    reps = s.get("reps")
    return (
        f"Reference run: Python {m['python']} ({m['implementation']}), {m['cpus']} CPUs, "
        f"aiowheel's {m['core']} core, load average {load[0]} at the start, "
        f"{reps} repetitions (medians), "
        f"{'quick' if s.get('quick') else 'default'} sizes; `{REFERENCE.relative_to(ROOT)}`.\n"
    )


def inline(run: Run, spec: str) -> str:
    parts = spec.split()
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "ratio"):
        raise ValueError(f"bad figure reference {spec!r}: ITEM CONTENDER [ratio]")
    r = run.one(parts[0], parts[1])
    if len(parts) == 3:
        ratios = r["ratios"] or {}
        return fmt_ratio(next(iter(ratios.values()), None))
    return f"{fmt(r['median'])}{_unit(r)}"


def render(text: str, run: Run) -> str:
    def block(m: re.Match[str]) -> str:
        kind, items = m["kind"], m["spec"].split()
        if kind == "table":
            body = table(run, items)
        elif kind == "list":
            body = listing(run, items)
        else:
            body = machine(run)
        return f"{m.group(1)}{body}{m.group(5)}"

    text = _BLOCK.sub(block, text)
    return _INLINE.sub(lambda m: f"{m.group(1)}{inline(run, m['spec'])}{m.group(4)}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the marked figures")
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    args = parser.parse_args(argv)
    run = Run(json.loads(args.reference.read_text(encoding="utf-8")))
    stale = []
    for name in FILES:
        path = ROOT / name
        text = path.read_text(encoding="utf-8")
        fresh = render(text, run)
        if fresh != text:
            if args.write:
                path.write_text(fresh, encoding="utf-8")
                print(f"rewrote {name}")
            else:
                stale.append(name)
    if stale:
        print(
            f"figures that do not match {args.reference}: {', '.join(stale)} "
            "(python tools/doc_figures.py --write)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
