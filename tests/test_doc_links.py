"""Relative links in README.md and docs/*.md resolve: the file exists and, for a `#fragment`
into Markdown, a heading with that GitHub anchor does. Sections move between the README and
docs/ (issue 28); a stale link must fail here, not on GitHub."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, backticks and punctuation other than
    `-` and `_` dropped, spaces to `-`; a repeated heading gets `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def broken_links(doc: Path) -> list[str]:
    """The relative links of `doc` (outside code blocks) whose file or anchor is missing."""
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: ...
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif (
            fragment
            and dest.suffix == ".md"
            and fragment not in github_anchors(dest.read_text(encoding="utf-8"))
        ):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_anchor_rule_matches_githubs() -> None:
    text = "## Failure handling: when an arm is down\n## The proxy's `footprint`\n## A\n## A\n"
    assert github_anchors(text) == {
        "failure-handling-when-an-arm-is-down",
        "the-proxys-footprint",
        "a",
        "a-1",
    }


def test_a_missing_file_or_heading_is_reported(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# Top\n[a](#top) [b](#gone) [c](y.md) [d](https://example.com/#z)\n")
    assert broken_links(doc) == ["#gone: no such heading", "y.md: no such file"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken_links(doc) == []
