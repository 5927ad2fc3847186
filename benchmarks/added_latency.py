"""Added latency on one connection, measured request by request in turn (issue 27).

wrk at one connection measures one target for a second, then the next: whatever the machine
does in between (a virtual CPU's speed drifts, a neighbour wakes) lands on one target and not
the others, and the single runs of the face-off spread by more than the proxies differ. Here
one client holds a keep-alive connection to every target (the upstream direct, the bare aiohttp
pass-through, each `specproxy serve` tree, nginx as a reverse proxy) and sends one request to
each in every round, in a fresh random order, waiting for each whole answer before the next.
Drift then lands on every target alike, and each round gives paired differences.

Printed per target: p50 and p90 latency, the added p50 (its p50 minus the direct p50, as the
issue defines it), and against bare the median of the per-round differences with its 95%
distribution-free interval (order statistics of the binomial). All proxies share one core by
default (`faceoff.Layout`; only one is ever busy, the client waits for each answer); the
client runs on a load core of its own.

    python benchmarks/added_latency.py --prefix /tmp/fo --tree after=. [--tree before=../before] \\
        [--modes nonstream,unpaced,paced] [--seconds 5] [--reps 3] [--core-each]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import faceoff  # noqa: E402

# A paced stream takes ~13 ms (13 events 1 ms apart), 40-50x a non-stream answer: its runs
# last this many times `--seconds`, for rounds enough to place a median.
PACED_FACTOR = 4

_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED_END = b"0\r\n\r\n"


def request_bytes(path: str, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": stream,
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def answer_end(buf: bytearray, need: int) -> tuple[int, bool]:
    """One answer's framing, read as its bytes come (`buf`: all of them so far): `need` is 0
    until the head is complete, then the whole answer's length, or -1 when chunked. Returns the
    new `need` and whether the answer is complete."""
    if need == 0:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return 0, False
        match = _LENGTH.search(buf, 0, end + 2)
        need = end + 4 + int(match.group(1)) if match else -1
    return need, buf.endswith(_CHUNKED_END) if need < 0 else len(buf) >= need


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time; the answer's end is found by its
    Content-Length or its chunked terminator, and stamped when its last byte arrives."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.need = 0  # > 0: the whole response's length; -1: chunked; 0: headers not yet seen
        self.done: asyncio.Future[float] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    async def request(self, data: bytes) -> float:
        """Seconds from the request's write to its answer's last byte."""
        assert self.transport is not None
        self.buf.clear()
        self.need = 0
        self.done = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        self.transport.write(data)
        return await self.done - sent

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        self.need, finished = answer_end(self.buf, self.need)
        if finished and self.done is not None and not self.done.done():
            self.done.set_result(now)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc}"))


async def interleave(
    targets: Sequence[tuple[int, str]],
    stream: bool,
    seconds: float,
    warmup: float,
    burst: int = 1,
    think_s: float = 0.0,
) -> list[list[float]]:
    """Rounds of one request to every (port, path) target in a random order: each round's
    latencies (seconds) in the targets' order. `warmup` seconds of rounds are not kept.

    `burst` > 1: each target gets that many requests back to back in its turn, and the round
    keeps the median of the later half: a proxy kept busy as wrk at one connection keeps it
    (its caches warm, no wake-up from idle), yet still paired in time with the others;
    `think_s`: the client then waits that long (spinning) after each answer before the next
    request, as a real client does, where wrk at one connection sends at once."""
    loop = asyncio.get_running_loop()
    conns: list[_Conn] = []
    for port, _ in targets:
        _, proto = await loop.create_connection(_Conn, "127.0.0.1", port)
        conns.append(proto)
    data = [request_bytes(path, stream) for _, path in targets]
    order = list(range(len(targets)))
    rng = random.Random(27)
    rounds: list[list[float]] = []
    start = time.perf_counter()
    keep_from, until = start + warmup, start + warmup + seconds
    # `keep_from`: a round that began in the warm-up is not kept
    while True:  # at least one round: a stalled client only makes fewer
        began = time.perf_counter()
        rng.shuffle(order)
        row = [0.0] * len(targets)
        for i in order:
            if burst == 1:
                row[i] = await conns[i].request(data[i])
                continue
            times = []
            for _ in range(burst):
                times.append(await conns[i].request(data[i]))
                if think_s:  # a client's own time between an answer and its next request
                    until_next = time.perf_counter() + think_s
                    while time.perf_counter() < until_next:
                        pass
            row[i] = statistics.median(times[burst // 2 :])
        if began >= keep_from:
            rounds.append(row)
        if time.perf_counter() >= until and rounds:
            break
    for conn in conns:
        assert conn.transport is not None
        conn.transport.close()
    return rounds


def median_interval(diffs: Sequence[float], z: float = 1.96) -> tuple[float, float, float]:
    """The median of `diffs` and its distribution-free ~95% interval (binomial order
    statistics: no assumption on the differences' shape)."""
    ordered = sorted(diffs)
    n = len(ordered)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    k = max(0, math.floor(n / 2 - z * math.sqrt(n) / 2))
    return (statistics.median(ordered), ordered[k], ordered[min(n - 1, n - 1 - k)])


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def summarize(names: Sequence[str], rounds: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per target: p50/p90 (s), added p50 (target p50 minus direct p50, s), and against bare
    the per-round differences' median with its interval (s). `names` holds 'direct' and
    'bare'."""
    cols = {name: [row[i] for row in rounds] for i, name in enumerate(names)}
    direct = pct(cols["direct"], 0.5)
    out: dict[str, Any] = {"rounds": len(rounds)}
    for name, col in cols.items():
        entry: dict[str, float] = {"p50_s": pct(col, 0.5), "p90_s": pct(col, 0.9)}
        entry["added_p50_s"] = entry["p50_s"] - direct
        if name not in ("direct", "bare"):
            med, lo, hi = median_interval([a - b for a, b in zip(col, cols["bare"], strict=True)])
            entry |= {"vs_bare_s": med, "vs_bare_lo_s": lo, "vs_bare_hi_s": hi}
        out[name] = entry
    return out


def table(
    mode: str, names: Sequence[str], summaries: Sequence[dict[str, Any]], first: int = 0
) -> list[str]:
    """Markdown rows, one per repetition (numbered from `first`): added p50 of each proxy and
    the paired difference."""
    lines = []
    for rep, s in enumerate(summaries, start=first):
        added = " | ".join(f"{1e3 * s[n]['added_p50_s']:.3f}" for n in names if n != "direct")
        paired = " | ".join(
            f"{1e3 * s[n]['vs_bare_s']:+.3f} [{1e3 * s[n]['vs_bare_lo_s']:+.3f}, "
            f"{1e3 * s[n]['vs_bare_hi_s']:+.3f}]"
            for n in names
            if n not in ("direct", "bare")
        )
        lines.append(
            f"| {mode} | {rep} | {s['rounds']} | {1e3 * s['direct']['p50_s']:.3f} | {added} | "
            f"{paired} |"
        )
    return lines


def header(names: Sequence[str]) -> list[str]:
    proxies = [n for n in names if n != "direct"]
    ours = [n for n in proxies if n != "bare"]
    cols = ["mode", "rep", "rounds", "direct p50 ms"]
    cols += [f"{n} added p50 ms" for n in proxies]
    cols += [f"{n} - bare, median per round [95%] ms" for n in ours]
    return ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]


def run_client(
    cpu: int,
    targets: Sequence[tuple[int, str]],
    stream: bool,
    seconds: float,
    warmup: float,
    burst: int = 1,
    think_s: float = 0.0,
) -> list[list[float]]:
    """The client in a process of its own, pinned to `cpu`; rounds as JSON on stdout."""
    spec = json.dumps([list(t) for t in targets])
    cmd = ["taskset", "-c", str(cpu), sys.executable, __file__, "--role", "client"]
    cmd += ["--targets", spec, "--seconds", str(seconds), "--warmup", str(warmup)]
    cmd += ["--burst", str(burst), "--think-us", str(1e6 * think_s)]
    cmd += ["--stream"] if stream else []
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    rounds: list[list[float]] = json.loads(out)
    return rounds


def measure(
    rig: faceoff.Rig,
    mode: str,
    started: dict[str, tuple[Any, str]],
    seconds: float,
    warmup: float,
    burst: int = 1,
    think_s: float = 0.0,
) -> dict[str, Any]:
    """One interleaved run of `mode` over direct and every started proxy (all running);
    `PACED_FACTOR` times `seconds` for paced streams."""
    if mode == "paced":
        seconds *= PACED_FACTOR
    base = rig.upstream_base(mode)
    port_path = re.compile(r"http://127\.0\.0\.1:(\d+)(.*)")
    names = ["direct", *started]
    targets: list[tuple[int, str]] = []
    for name in names:
        url = base if name == "direct" else started[name][1]
        m = port_path.fullmatch(url)
        assert m is not None, url
        targets.append((int(m.group(1)), m.group(2) + faceoff.PATH))
    rounds = run_client(
        rig.layout.wrk[0], targets, mode != "nonstream", seconds, warmup, burst, think_s
    )
    return summarize(names, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["client"], help=argparse.SUPPRESS)
    parser.add_argument("--targets", help=argparse.SUPPRESS)
    parser.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", type=Path, help="where the nginx and wrk .debs are unpacked")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--env", action="append", default=[], metavar="TREE:KEY=VALUE")
    parser.add_argument("--modes", default="nonstream,unpaced,paced")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help=f"of each run ({PACED_FACTOR}x for paced)"
    )
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--burst",
        type=int,
        default=1,
        help="requests to each target in a row per round (the round keeps the median of the "
        "later half): >1 measures proxies kept busy, as wrk at one connection does",
    )
    parser.add_argument(
        "--think-us",
        type=float,
        default=0.0,
        help="with --burst: microseconds the client waits after each answer before the next",
    )
    parser.add_argument("--no-nginx", action="store_true", help="leave out nginx as a proxy")
    parser.add_argument("--core-each", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.role == "client":
        import uvloop

        targets = [(int(p), str(path)) for p, path in json.loads(args.targets)]
        think_s = args.think_us / 1e6
        rounds = uvloop.run(
            interleave(targets, args.stream, args.seconds, args.warmup, args.burst, think_s)
        )
        json.dump(rounds, sys.stdout)
        return
    assert args.prefix is not None, "--prefix is required"
    trees, tree_env, native = faceoff.tree_args(args)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    proxies = ["bare", *trees] + ([] if args.no_nginx else ["nginx"])
    layout = faceoff.Layout.plan(n_proxies=len(proxies))
    procs = faceoff.Procs()
    results: dict[str, Any] = {
        "layout": vars(layout),
        "args": vars(args) | {"prefix": str(args.prefix)},
    }
    lines = header(["direct", *proxies])
    with tempfile.TemporaryDirectory(prefix="latency-") as tmp:
        wrk = faceoff.Wrk([str(args.prefix / "usr/bin/wrk")], "", 1, native)
        rig = faceoff.Rig(args, procs, Path(tmp), wrk, [str(args.prefix / "usr/sbin/nginx")],
                          trees, native, layout, tree_env)  # fmt: skip
        try:
            rig.start_upstreams()
            for mode in [m for m in args.modes.split(",") if m]:
                upstream = rig.upstream_base(mode)
                started = {
                    name: rig.start_proxy(
                        name, upstream, str(layout.proxies[i if args.core_each else 0])
                    )
                    for i, name in enumerate(proxies)
                }
                reps = []
                for _ in range(args.reps):
                    reps.append(
                        measure(
                            rig,
                            mode,
                            started,
                            args.seconds,
                            args.warmup,
                            args.burst,
                            args.think_us / 1e6,
                        )
                    )
                    lines += table(mode, ["direct", *proxies], reps[-1:], len(reps) - 1)
                    print(lines[-1], file=sys.stderr, flush=True)
                results[mode] = reps
                for proc, _ in started.values():
                    procs.stop(proc)
        finally:
            procs.stop_all()
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
