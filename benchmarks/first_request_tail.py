"""Where a saturated relay's p99 comes from (issue 27, "graceful under overload").

wrk opens every connection at the start of each run, so its p99 at c128 mixes two things: the
steady state, and the burst at the start, when every connection sends its first request at once.
This drives each proxy with a closed-loop client of its own (raw asyncio on uvloop, one request
per connection at a time, like wrk) that stamps every request, and prints the latency of
  - every request (what wrk reports),
  - each connection's first request (the burst),
  - every later request (the steady state),
and how many requests each connection completed (a starved connection would show there).

Roles as in the face-off (`faceoff.Layout`): the nginx upstream serving the recorded 13-event
stream, each proxy alone on one core (the bare aiohttp pass-through and `specproxy serve` with a
SQLite store, rollups deferred and statistics computed elsewhere), the client on the load cores.

    python benchmarks/first_request_tail.py --prefix /tmp/fo --conc 128,256 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import faceoff  # noqa: E402

BODY = b'{"model":"tiny-llama","messages":[{"role":"user","content":"Hi"}],"stream":true}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
END = b"0\r\n\r\n"  # the chunked body's end: every stream here is chunked


class _Conn(asyncio.Protocol):
    """One closed-loop connection: sends, waits for the whole stream, records, sends again."""

    def __init__(self, cid: int, until: float, out: list[tuple[int, int, float, float]]) -> None:
        self.cid, self.until, self.out = cid, until, out
        self.n = 0
        self.tail = b""
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._send()

    def _send(self) -> None:
        self.tail = b""
        self.sent = time.perf_counter()
        self.transport.write(REQUEST)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-len(END) :]
        if self.tail != END:
            return
        now = time.perf_counter()
        self.out.append((self.cid, self.n, self.sent, now - self.sent))
        self.n += 1
        if now < self.until:
            self._send()
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def drive(port: int, conc: int, seconds: float) -> list[tuple[int, int, float, float]]:
    """(connection, its request number, sent at, latency s) of every request completed."""
    loop = asyncio.get_running_loop()
    out: list[tuple[int, int, float, float]] = []
    until = time.perf_counter() + seconds
    conns = await asyncio.gather(
        *(
            loop.create_connection(functools.partial(_Conn, i, until, out), "127.0.0.1", port)
            for i in range(conc)
        )
    )
    await asyncio.gather(*(proto.done for _, proto in conns))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(name: str, conc: int, seconds: float, rows: list[tuple[int, int, float, float]]) -> str:
    first = [lat for _, n, _, lat in rows if n == 0]
    later = [lat for _, n, _, lat in rows if n > 0]
    every = first + later
    per_conn: dict[int, int] = {}
    for cid, *_ in rows:
        per_conn[cid] = per_conn.get(cid, 0) + 1
    counts = sorted(per_conn.values())

    def cell(values: list[float]) -> str:
        p50, p99, top = (1e3 * pct(values, q) for q in (0.5, 0.99, 1.0))
        return f"{p50:.1f} / {p99:.1f} / {top:.0f}"

    return (
        f"| {name} | {conc} | {len(rows) / seconds:.0f} | {cell(every)} | {cell(first)} | "
        f"{cell(later)} | {counts[0]} / {statistics.median(counts):.0f} / {counts[-1]} |"
    )


def client_main(port: int, conc: int, seconds: float) -> list[tuple[int, int, float, float]]:
    import uvloop

    return uvloop.run(drive(port, conc, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=Path, required=True, help="the unpacked nginx .debs")
    parser.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",")], default=[128])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--role", choices=["client"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "client":  # one run, pinned by the parent; rows as text on stdout
        for row in client_main(args.port, args.conc[0], args.seconds):
            print(*row)
        return
    libs = ":".join(
        str(args.prefix / d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
    )
    native = {"LD_LIBRARY_PATH": libs}
    layout = faceoff.Layout.plan(n_proxies=1)
    procs = faceoff.Procs()
    lines = [
        "| proxy | conc | streams/s | every request p50 / p99 / max ms | first on its connection "
        "| later requests | requests per connection min / median / max |",
        "|" + " --- |" * 7,
    ]
    with tempfile.TemporaryDirectory(prefix="tail-") as tmp:
        work = Path(tmp)
        try:
            root = work / "www"
            target = root / "stream" / faceoff.PATH.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(faceoff.STREAM_FILE.read_bytes())
            port = faceoff.free_port()
            conf = faceoff.nginx_conf(work / "up", 4, faceoff.upstream_server(port, root))
            nginx = [str(args.prefix / "usr/sbin/nginx"), "-p", str(work / "up"), "-c", str(conf)]
            procs.start(nginx, faceoff.cpulist(layout.upstream), env=native)
            faceoff.wait_http(f"http://127.0.0.1:{port}/health")
            upstream = f"http://127.0.0.1:{port}/stream"
            cpu = str(layout.proxies[0])
            for name in ("bare", "specproxy"):
                proxy_port = faceoff.free_port()
                if name == "bare":
                    cmd = [sys.executable, str(HERE / "faceoff.py"), "--role", "bare"]
                    cmd += ["--port", str(proxy_port), "--upstream", upstream]
                    proc = procs.start(cmd, cpu)
                    faceoff.wait_http(f"http://127.0.0.1:{proxy_port}/")
                else:
                    env = faceoff.serve_env(HERE.parent)
                    env["SPECPROXY_STORE__ROLLUPS"] = "deferred"
                    cmd = [sys.executable, "-m", "specproxy", "serve", "--port", str(proxy_port)]
                    cmd += ["--baseline", upstream, "--speculative", upstream, "--log-level"]
                    cmd += ["error", "--store", f"sqlite:///{work}/tail.db"]
                    proc = procs.start(cmd, cpu, env=env, cwd=work)
                    faceoff.wait_http(f"http://127.0.0.1:{proxy_port}/healthz")
                time.sleep(1.0)
                for conc in args.conc:
                    rows = run_client(layout, proxy_port, conc, args.seconds)
                    lines.append(summary(name, conc, args.seconds, rows))
                    print(lines[-1], file=sys.stderr, flush=True)  # progress
                procs.stop(proc)
        finally:
            procs.stop_all()
    print("\n".join(lines))


def run_client(
    layout: faceoff.Layout, port: int, conc: int, seconds: float
) -> list[tuple[int, int, float, float]]:
    """The client in a process of its own on the load cores (the first of them)."""
    import subprocess

    cmd = ["taskset", "-c", str(layout.wrk[0]), sys.executable, __file__, "--prefix", "-"]
    cmd += ["--role", "client", "--port", str(port), "--conc", str(conc)]
    cmd += ["--seconds", str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows: list[tuple[int, int, float, float]] = []
    for line in out.splitlines():
        cid, n, sent, lat = line.split()
        rows.append((int(cid), int(n), float(sent), float(lat)))
    return rows


if __name__ == "__main__":
    main()
