"""Test doubles for the fleet: a resolver the test controls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path


class HostsFileResolver:
    """Resolves names from a hosts-format file the test rewrites: a resolver we control."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fail = False
        self.calls = 0

    async def __call__(self, name: str, port: int) -> Sequence[str]:
        self.calls += 1
        if self.fail:
            raise OSError("SERVFAIL")
        return await asyncio.to_thread(self._lookup, name)

    def _lookup(self, name: str) -> list[str]:
        out = []
        for line in self.path.read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and name in fields[1:]:
                out.append(fields[0])
        return out
