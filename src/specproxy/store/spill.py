"""The local JSONL spill files that keep records when the store is slow or down.

Each process appends to its own file, `<spill_path>.<pid>.<token>`, and holds an exclusive
`flock` on every spill file it owns, so several replicas configured with the same `spill_path`
never replay (and delete) each other's live files. A file left by a dead process is claimed by
the next process that starts (its lock died with it). Replay is idempotent because the store's
inserts are ON CONFLICT DO NOTHING, so a crash half-way through a replay duplicates nothing.

Appends happen on the event loop but are cheap: one `write` of already-encoded lines to the page
cache; `fsync` happens at rotation and close only.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specproxy.records import EngineSample, GpuSample, RequestRecord

__all__ = ["Row", "Sample", "SpillChunk", "SpillFile", "SpillSet", "decode_line", "encode_row"]

log = logging.getLogger(__name__)

Sample = EngineSample | GpuSample  # the scrapers' rows, queued together
Row = RequestRecord | Sample


def encode_row(row: Row) -> str:
    kind = "r" if isinstance(row, RequestRecord) else "g" if isinstance(row, GpuSample) else "e"
    return json.dumps({"k": kind, "v": row.to_dict()}, separators=(",", ":")) + "\n"


def decode_line(line: str) -> Row:
    data = json.loads(line)
    if data["k"] == "r":
        return RequestRecord.from_dict(data["v"])
    if data["k"] == "g":
        return GpuSample.from_dict(data["v"])
    return EngineSample.from_dict(data["v"])


@dataclass(slots=True)
class SpillChunk:
    requests: list[RequestRecord] = field(default_factory=list)
    engine: list[Sample] = field(default_factory=list)  # engine and GPU samples
    bad_lines: int = 0

    def __len__(self) -> int:
        return len(self.requests) + len(self.engine)


@dataclass(slots=True)
class SpillFile:
    """One spill file this process owns (locked), with the number of rows it holds."""

    path: Path
    handle: IO[str]
    rows: int = 0

    def chunks(self, size: int) -> Iterator[SpillChunk]:
        """Read the file from the start in chunks of `size` rows (blocking: call in a thread)."""
        self.handle.flush()
        with open(self.path, encoding="utf-8", errors="replace") as reader:
            chunk = SpillChunk()
            for line in reader:
                if not line.strip():
                    continue
                try:
                    row = decode_line(line)
                except (ValueError, KeyError, TypeError):
                    chunk.bad_lines += 1
                    log.error("spill file %s: unreadable line skipped: %.200s", self.path, line)
                    continue
                if isinstance(row, RequestRecord):
                    chunk.requests.append(row)
                else:
                    chunk.engine.append(row)
                if len(chunk) >= size:
                    yield chunk
                    chunk = SpillChunk()
            if len(chunk) or chunk.bad_lines:
                yield chunk

    def release(self, *, delete: bool) -> None:
        """Drop the lock; delete the file first when it has been replayed."""
        if delete:
            self.path.unlink(missing_ok=True)
        else:
            self.handle.flush()
            os.fsync(self.handle.fileno())
        self.handle.close()


class SpillSet:
    """The active spill file plus the backlog of owned files waiting to be replayed."""

    def __init__(self, base: str | os.PathLike[str]) -> None:
        self.base = Path(base)
        self.active: SpillFile | None = None
        self.backlog: list[SpillFile] = []
        self.total_spilled = 0

    @property
    def pending_rows(self) -> int:
        return sum(f.rows for f in self.backlog) + (self.active.rows if self.active else 0)

    @property
    def rejected_path(self) -> Path:
        return self.base.with_name(self.base.name + ".rejected")

    def append(self, rows: list[Row]) -> None:
        """Write rows to the active file (opened on first use). Raises OSError."""
        if not rows:
            return
        if self.active is None:
            self.active = self._open_new()
        self.active.handle.write("".join(encode_row(r) for r in rows))
        self.active.handle.flush()
        self.active.rows += len(rows)
        self.total_spilled += len(rows)

    def rotate(self) -> None:
        """Move the active file into the backlog so it can be replayed; new rows go elsewhere."""
        if self.active is not None:
            self.active.handle.flush()
            os.fsync(self.active.handle.fileno())
            self.backlog.append(self.active)
            self.active = None

    def claim_leftovers(self) -> int:
        """Lock and adopt spill files of dead processes (blocking: call in a thread)."""
        adopted = 0
        owned = {f.path for f in self.backlog} | ({self.active.path} if self.active else set())
        if not self.base.parent.is_dir():
            return 0
        candidates = [self.base, *sorted(self.base.parent.glob(self.base.name + ".*"))]
        for path in candidates:
            if path in owned or path == self.rejected_path or not path.is_file():
                continue
            claimed = self._try_lock(path)
            if claimed is not None:
                claimed.rows = sum(1 for line in claimed.handle if line.strip())
                self.backlog.append(claimed)
                adopted += claimed.rows
                log.info("claimed spill file %s with %d rows for replay", path, claimed.rows)
        return adopted

    def reject(self, rows: list[Row], reason: str) -> None:
        """Keep rows the store refuses for good next to the spill files, for a human to inspect."""
        try:
            self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.rejected_path, "a", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps({"reason": reason, "row": _as_dict(row)}) + "\n")
        except OSError:
            log.exception("could not write rejected rows to %s", self.rejected_path)

    def close(self) -> None:
        """Make every owned file durable and release the locks (files stay for the next start)."""
        self.rotate()
        for spill in self.backlog:
            spill.release(delete=spill.rows == 0)
        self.backlog.clear()

    def _open_new(self) -> SpillFile:
        self.base.parent.mkdir(parents=True, exist_ok=True)
        path = self.base.with_name(f"{self.base.name}.{os.getpid()}.{secrets.token_hex(4)}")
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - lives as long as the lock
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return SpillFile(path, handle)

    @staticmethod
    def _try_lock(path: Path) -> SpillFile | None:
        try:
            handle = open(path, "r+", encoding="utf-8", errors="replace")  # noqa: SIM115
        except OSError:
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The owner may have replayed and deleted it between our open and our lock.
            if not path.exists() or os.stat(path).st_ino != os.fstat(handle.fileno()).st_ino:
                raise BlockingIOError
        except OSError:
            handle.close()
            return None
        return SpillFile(path, handle)


def _as_dict(row: Row) -> dict[str, Any]:
    return row.to_dict()
