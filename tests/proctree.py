"""Process-tree helpers for tests that kill a real proxy: who are its descendants, are they gone.

A pid is identified with its start time (field 22 of /proc/PID/stat) so a recycled pid never
reads as a survivor; a zombie counts as gone (it holds no memory and runs nothing).
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["ProcId", "alive", "descendants", "wait_gone"]

ProcId = tuple[int, int]  # (pid, start time in clock ticks)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return fields[0], int(fields[1]), int(fields[19])


def descendants(pid: int) -> set[ProcId]:
    """Every live descendant of `pid` (children, their children, ...)."""
    children: dict[int, list[ProcId]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] != "Z":
                children.setdefault(stat[1], []).append((int(entry.name), stat[2]))
    found: set[ProcId] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def alive(proc: ProcId) -> bool:
    stat = _stat(proc[0])
    return stat is not None and stat[2] == proc[1] and stat[0] != "Z"


def wait_gone(procs: set[ProcId], timeout_s: float) -> set[ProcId]:
    """Wait until none of `procs` is alive; returns those still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    left = {p for p in procs if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p for p in left if alive(p)}
    return left
