"""Running `widenet-ds report` as a user does and reading its page back: the number cells by their
(data-run, data-row, data-key), the images, the section headings."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support.launching import REPO, child_env


def report(*args: str | Path) -> subprocess.CompletedProcess:
    """The real console command, in a child process (as a user runs it)."""
    return subprocess.run([sys.executable, "-m", "widenet_ds.cli", "report", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=child_env())


class Cells(HTMLParser):
    """(data-run, data-row, data-key) -> text of every number cell; img sources; h2/h3 texts."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str, str], str] = {}
        self.images: list[str] = []
        self.headings: list[str] = []
        self._open: tuple[str, str, str] | None = None
        self._heading: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "td" and "data-key" in attrs:
            self._open = (attrs["data-run"], attrs["data-row"], attrs["data-key"])
            self.cells[self._open] = ""
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag in ("h2", "h3"):
            self._heading = ""

    def handle_data(self, data):
        if self._open:
            self.cells[self._open] += data
        if self._heading is not None:
            self._heading += data

    def handle_endtag(self, tag):
        if tag == "td":
            self._open = None
        elif tag in ("h2", "h3") and self._heading is not None:
            self.headings.append(self._heading.strip())
            self._heading = None


def parse_page(page: Path) -> Cells:
    cells = Cells()
    cells.feed(page.read_text())
    return cells


def shown(text: str) -> float:
    return float(text.strip())


def assert_shows(cells: Cells, run: str, row: str, key: str, expected: float) -> None:
    text = cells.cells[(run, row, key)]
    # 4 decimals or 4 significant digits, as the page prints them
    assert shown(text) == pytest.approx(expected, rel=1e-3, abs=6e-5), (run, row, key, text, expected)
