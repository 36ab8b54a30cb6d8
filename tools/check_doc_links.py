"""Check that every internal link of the built docs points at a page and an anchor
that exist (``python tools/check_doc_links.py docs/_build/html``).

``sphinx-build -n`` checks the cross-references it resolves, but not the links that
extensions write themselves: ``viewcode``'s highlighted sources link each object back
to its documentation by an anchor it computes, and when the object was documented
under another name (a re-export) those anchors pointed nowhere. Exit status 1 and one
line per broken link if any is found.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name"):
                self.ids.add(value)
            elif name == "href" and tag == "a":
                self.links.append(value)


def broken_links(root: Path) -> list[str]:
    pages: dict[Path, _Page] = {}
    for path in sorted(root.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = page
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("mailto:"):
                continue  # external: not ours to check offline
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if target.suffix != ".html":
                if not target.exists():
                    broken.append(f"{path.relative_to(root.resolve())}: {link} (no such file)")
                continue
            if target not in pages:
                broken.append(f"{path.relative_to(root.resolve())}: {link} (no such page)")
            elif parts.fragment and unquote(parts.fragment) not in pages[target].ids:
                broken.append(f"{path.relative_to(root.resolve())}: {link} (no such anchor)")
    return broken


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    broken = broken_links(root)
    for line in broken:
        print(line, file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
