"""The ``aiowheel`` command: ``aiowheel bench ...``, ``aiowheel report ...`` and
``aiowheel --version``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]


def version() -> str:
    """``aiowheel X.Y.Z (compiled core)``, or ``(pure-Python core: why)``."""
    import aiowheel
    from aiowheel import _compiled

    core = "compiled core" if aiowheel.COMPILED else f"pure-Python core: {_compiled.REASON}"
    return f"aiowheel {aiowheel.__version__} ({core})"


def build_parser() -> argparse.ArgumentParser:
    from aiowheel.bench.cli import DESCRIPTION, EPILOG, add_arguments

    parser = argparse.ArgumentParser(
        prog="aiowheel", description="aiowheel: a hierarchical timing-wheel timer."
    )
    # Checked before the required COMMAND, like --help: `aiowheel --version` exits 0.
    parser.add_argument("--version", action="version", version=version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser(
        "bench",
        help="measure aiowheel against loop.call_later and trio, side by side",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(bench)
    # `report` parses its own arguments (aiowheel.analytics.report); everything after
    # the word goes to it untouched, --help included.
    commands.add_parser(
        "report",
        help="analyse timer traces: aiowheel report TRACES... --out DIR [--master URL]",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "report":
        # Imported only for this command: it needs pyspark and friends.
        report = importlib.import_module("aiowheel.analytics.report")
        sys.exit(report.main(args[1:]))
    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command == "bench":
        from aiowheel.bench.cli import run

        sys.exit(run(ns, args[1:]))
    parser.error(f"unknown command {ns.command!r}")  # pragma: no cover - argparse checks


if __name__ == "__main__":
    main()
