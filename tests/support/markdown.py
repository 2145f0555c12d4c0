"""Code blocks of the project's Markdown pages, for tests that run a page's examples as written.

A block's ``title="..."`` (the site renders it as the file name above the block) names the file
a reader saves it as; ``materialize`` writes those files, so a test runs them the way a reader
would, not through a copy that could drift from the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```(?P<lang>\w+)(?P<attrs>[^\n]*)\n(?P<body>.*?)^```\s*$", re.M | re.S)
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, its ``title`` (a file name) if any, its text."""

    lang: str
    title: str | None
    body: str


def code_blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, in order."""
    blocks = []
    for match in _FENCE.finditer(page.read_text()):
        title = _TITLE.search(match["attrs"])
        blocks.append(Block(match["lang"], title["title"] if title else None, match["body"]))
    return blocks


def materialize(blocks: list[Block], target: Path) -> list[Path]:
    """Write each titled block to ``target / title``; return the files written."""
    written = []
    for block in blocks:
        if block.title is None:
            continue
        path = target / block.title
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.body)
        written.append(path)
    return written
