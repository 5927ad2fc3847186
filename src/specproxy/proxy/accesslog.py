"""The structured access log: one JSON line per client request, bounded in rate.

Off by default (`[telemetry] access_log`). Each measured request that was routed writes one line
when its record is made (`request`): time (UTC ISO-8601), request id, arm (and the treatment it
was rerouted from), endpoint, model, stream, status, e2e and TTFT in seconds, error kind. Any
other `/v1/*` call, forwarded to the control unmeasured, writes one when its answer is over
(`passthrough`: its path instead of endpoint and model). A request the proxy answered itself
(bad JSON, too large, an unknown forced arm, ...) writes one too (`rejected`), with the reason,
and no arm. So a 502 from an arm that refused leaves a line, as does every 4xx.

Bounded: two token buckets of `per_s` lines a second (one second of burst, at least one line),
one for answered requests and one for errors (an error kind, or a status of 400 or more), so a
flood of one never hides the other. A line that finds its bucket empty is dropped and counted;
the next line written from that bucket carries `"dropped": n`. Lines go to stderr, unbuffered by
this module, one `write` each; the clock is injected.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from specproxy.errors import ErrorKind
from specproxy.records import RequestRecord

__all__ = ["MAX_PATH_CHARS", "AccessLog"]

MAX_PATH_CHARS = 256  # of a forwarded call's path (a client's): the line stays one short line


def _stderr_line(line: str) -> None:
    sys.stderr.write(line + "\n")


class _Bucket:
    __slots__ = ("capacity", "dropped", "last", "per_s", "tokens")

    def __init__(self, per_s: float, now: float) -> None:
        self.per_s = per_s
        # one second of lines, and never less than one: below 1 line/s a bucket holding less
        # than one token would never write a line
        self.capacity = max(per_s, 1.0)
        self.tokens = self.capacity
        self.last = now
        self.dropped = 0

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.per_s)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.dropped += 1
        return False


class AccessLog:
    """Writes the access lines (`emit`: one line, without its newline)."""

    def __init__(
        self,
        per_s: float,
        *,
        emit: Callable[[str], None] = _stderr_line,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._emit = emit
        self._clock = clock
        self._wall = wall
        now = clock()
        self._ok = _Bucket(per_s, now)
        self._errors = _Bucket(per_s, now)

    def request(self, rec: RequestRecord) -> None:
        """The line of a routed request, from its record."""
        line: dict[str, object] = {
            "request_id": rec.request_id,
            "arm": rec.arm,
            "endpoint": rec.endpoint,
            "model": rec.model,
            "stream": rec.stream,
            "status": rec.status,
            "e2e_s": round(rec.e2e_s, 6),
            "ttft_s": None if rec.ttft_s is None else round(rec.ttft_s, 6),
            "error_kind": None if rec.error_kind is None else rec.error_kind.value,
        }
        if rec.rerouted_from is not None:
            line["rerouted_from"] = rec.rerouted_from
        self._write(line, error=rec.error_kind is not None or rec.status >= 400)

    def passthrough(
        self,
        request_id: str,
        arm: str,
        path: str,
        status: int,
        e2e_s: float,
        error_kind: ErrorKind | None,
    ) -> None:
        """The line of a request forwarded unmeasured (any other `/v1/*` call): its path
        instead of an endpoint and a model, no TTFT."""
        line: dict[str, object] = {
            "request_id": request_id,
            "arm": arm,
            "path": path[:MAX_PATH_CHARS],
            "status": status,
            "e2e_s": round(e2e_s, 6),
            "error_kind": None if error_kind is None else error_kind.value,
        }
        self._write(line, error=error_kind is not None or status >= 400)

    def rejected(self, request_id: str, status: int, reason: str) -> None:
        """The line of a request the proxy answered itself."""
        line = {"request_id": request_id, "status": status, "rejected": reason}
        self._write(line, error=True)

    def _write(self, fields: dict[str, object], *, error: bool) -> None:
        bucket = self._errors if error else self._ok
        if not bucket.take(self._clock()):
            return
        stamp = datetime.fromtimestamp(self._wall(), UTC).isoformat(timespec="milliseconds")
        line: dict[str, object] = {"time": stamp.replace("+00:00", "Z"), "log": "access"}
        line.update(fields)
        if bucket.dropped:
            line["dropped"] = bucket.dropped
            bucket.dropped = 0
        self._emit(json.dumps(line, ensure_ascii=False, separators=(",", ":")))
