"""Offline check of a built static site: every internal link and anchor resolves, nothing points outside the site.

    python ci/site_check.py out/site

Reads every ``*.html`` under the site with the standard library's ``html.parser`` (no network, no dependency):
the ``href`` / ``src`` of ``a``, ``link``, ``img``, ``script``, ``source`` and ``iframe``, and every ``id`` (and
``a name``) as an anchor. A relative link must name a file inside the site (a folder: its ``index.html``), and a
``#fragment`` on an HTML page must be an id of that page. A link with a scheme (``https:``, ``mailto:``) is external:
counted, not fetched. An absolute path (``/x``), a ``file:`` URL or a relative path that climbs out of the site is
broken: the site is published under a sub-path (``https://<owner>.github.io/<repo>/``) and opened from disk.
Exit status 1 when anything is broken.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

LINK_ATTRS = {"a": "href", "link": "href", "img": "src", "script": "src", "source": "src", "iframe": "src"}
IGNORED_SCHEMES = {"mailto", "javascript", "data", "tel"}


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []  # (tag, url)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id",) + (("name",) if tag == "a" else ()):
            if attrs.get(key):
                self.ids.add(attrs[key])
        url = attrs.get(LINK_ATTRS.get(tag, ""))
        if url is not None and not (tag == "link" and attrs.get("rel") in ("preconnect", "dns-prefetch")):
            self.links.append((tag, url))


@dataclasses.dataclass
class Report:
    pages: int = 0
    links: int = 0  # internal links and resources checked
    anchors: int = 0  # of which with a #fragment checked against the target's ids
    external: int = 0  # links with a scheme: counted, not fetched
    broken: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.pages} pages, {self.links} internal links checked ({self.anchors} with an anchor), "
                f"{self.external} external links not fetched, {len(self.broken)} broken")


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    page.close()
    return page


def check_site(root: str | Path) -> Report:
    root = Path(root).resolve()
    # the pages; a theme's HTML template fragments under _static/ are assets, not pages
    pages = {p.resolve(): parse(p) for p in sorted(root.rglob("*.html")) if "_static" not in p.relative_to(root).parts}
    report = Report(pages=len(pages))
    for path, page in pages.items():
        where = path.relative_to(root)
        for tag, url in page.links:
            parts = urlsplit(url)
            if parts.scheme in IGNORED_SCHEMES:
                continue
            if parts.scheme == "file" or (not parts.scheme and parts.netloc == "" and parts.path.startswith("/")):
                report.broken.append(f"{where}: <{tag}> {url}: an absolute or file path, outside the site")
                continue
            if parts.scheme or parts.netloc:
                report.external += 1
                continue
            if not parts.path and not parts.fragment:
                continue  # href="" or "#": the page itself
            report.links += 1
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if root != target and root not in target.parents:
                report.broken.append(f"{where}: <{tag}> {url}: outside the site")
                continue
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                report.broken.append(f"{where}: <{tag}> {url}: no such file")
                continue
            if parts.fragment and target.suffix == ".html":
                report.anchors += 1
                ids = pages[target].ids if target in pages else parse(target).ids
                if unquote(parts.fragment) not in ids:
                    report.broken.append(f"{where}: <{tag}> {url}: no id {parts.fragment!r} in {target.name}")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", help="the built site's folder (out/site)")
    args = ap.parse_args(argv)
    report = check_site(args.site)
    for line in report.broken:
        print("BROKEN", line)
    print("link check:", report.summary())
    return 1 if report.broken or not report.pages else 0


if __name__ == "__main__":
    sys.exit(main())
