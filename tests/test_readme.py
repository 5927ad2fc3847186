"""README.md is a user guide (issue 28 item 7): the two commands on its first screen, then what
it does, the demo, pointing it at vLLM, reading the results, configuration, deploying and
troubleshooting. How the numbers are made, measurements, test internals and history live in
docs/; a commit hash or an issue number in the README is history that belongs there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
FIRST_SCREEN = 25  # lines
GUIDE = [
    "What it does",
    "The demo",
    "Pointing it at vLLM",
    "Reading the results",
    "Configuration",
    "Deploying",
    "Troubleshooting",
    "Development",
    "Further reading",
]


def readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def test_the_first_screen_has_the_two_commands_and_only_them() -> None:
    text = readme()
    first = FENCE.search(text)
    assert first is not None and text[: first.end()].count("\n") < FIRST_SCREEN
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_sections_are_the_guides() -> None:
    prose = FENCE.sub("", readme())
    assert re.findall(r"^## (.+)$", prose, re.M) == GUIDE


def test_no_history_in_the_guide() -> None:
    prose = FENCE.sub("", readme())
    hashes = [
        word
        for word in re.findall(r"\b[0-9a-f]{7,40}\b", prose)
        if re.search(r"\d", word) and re.search(r"[a-f]", word)
    ]
    assert hashes == []
    assert re.findall(r"\bissue \d+|#\d{2,}\b", prose, re.I) == []
