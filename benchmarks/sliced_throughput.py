"""Throughput of proxies sharing one core, in short alternating slices (issue 27).

The face-off's wrk runs measure one proxy for seconds, then the next. On a virtual machine the
core's speed drifts over seconds (the same proxy's CPU per request moved by up to 77% between
its own runs on the device), so a ratio of two such runs carries that drift. Here every target
(a proxy at one concurrency, in a process of its own: the bare aiohttp pass-through and each
`--tree`'s `specproxy serve` at each `--conc`) runs on the same core at once, with its
connections open, and the load moves from one target to the next every `--slice` seconds, in a
fresh random order each cycle: only one target is busy at a time, the others wait idle on their
sockets. A cycle's ratio of two targets compares them within a second or two, on the same core;
the cycles give a median and a distribution-free 95% interval, for each tree against bare at the
same concurrency and for each proxy's largest concurrency against its smallest (the issue's
"c128 within 10% of c32").

Two measures per target:
  - req/s: the answers completed in its slices, after `--settle` seconds (the previous target's
    last requests finishing on the shared core);
  - req per CPU-second: every answer it completed in a cycle over the CPU its process tree spent
    in that cycle (each process's CPU clock, read on the schedule). This one charges work a
    proxy defers past its slice (a store writer's batch, 0.5 s later) to that proxy wherever it
    lands, where the first credits it to the proxy and bills whichever target holds the core.
    On a saturated core it is the sustained req/s.

The load: closed-loop connections spread over client processes on the load cores, raw asyncio
on uvloop, one request per connection at a time, like wrk; the connections stay open for the
whole run (no new-connection bursts). The client processes follow one schedule on the clock.

    python benchmarks/sliced_throughput.py --prefix /tmp/fo --tree after=. \\
        [--env after:SPECPROXY_STORE__ROLLUPS=deferred] [--modes nonstream,unpaced,paced] \\
        [--conc 32,128] [--seconds 90] [--slice 0.25] [--settle 0.03] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
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

from benchmarks import added_latency, faceoff  # noqa: E402


def schedule(n_targets: int, cycles: int, seed: int = 27) -> list[int]:
    """The target of each slice: every target once per cycle, in a fresh random order."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(cycles):
        cycle = list(range(n_targets))
        rng.shuffle(cycle)
        order += cycle
    return order


class _Loop(asyncio.Protocol):
    """One closed-loop connection: while its target holds the slice, send, await the whole
    answer, stamp it, send again."""

    def __init__(self, load: _Load, target: int, data: bytes) -> None:
        self.load, self.target, self.data = load, target, data
        self.buf = bytearray()
        self.need = 0
        self.busy = False
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def kick(self) -> None:
        if not self.busy:
            self.busy = True
            self.buf.clear()
            self.need = 0
            self.transport.write(self.data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.need, finished = added_latency.answer_end(self.buf, self.need)
        if finished:
            self.busy = False
            self.load.done(self.target, time.time())
            if self.load.active == self.target:
                self.kick()

    def connection_lost(self, exc: Exception | None) -> None:
        self.load.lost += 1


class _Load:
    def __init__(self) -> None:
        self.active = -1
        self.stamps: list[tuple[int, float]] = []
        self.lost = 0

    def done(self, target: int, at: float) -> None:
        self.stamps.append((target, at))


async def drive(
    targets: Sequence[tuple[int, str, int]],
    stream: bool,
    order: Sequence[int],
    start: float,
    slice_s: float,
    settle_s: float,
) -> list[int]:
    """Answers completed in each slice's window (after `settle_s`) by the slice's target, then
    every answer each target completed in each cycle (cycle-major)."""
    loop = asyncio.get_running_loop()
    load = _Load()
    conns: list[list[_Loop]] = []
    for i, (port, path, n_conns) in enumerate(targets):
        data = added_latency.request_bytes(path, stream)
        mine = []
        for _ in range(n_conns):
            _, proto = await loop.create_connection(
                functools.partial(_Loop, load, i, data), "127.0.0.1", port
            )
            mine.append(proto)
        conns.append(mine)
    for k, target in enumerate(order):
        await asyncio.sleep(max(0.0, start + k * slice_s - time.time()))
        load.active = target
        for conn in conns[target]:
            conn.kick()
    await asyncio.sleep(max(0.0, start + len(order) * slice_s - time.time()))
    load.active = -1
    await asyncio.sleep(0.2)  # the last answers
    for mine in conns:
        for conn in mine:
            conn.transport.close()
    if load.lost > sum(map(len, conns)):
        raise RuntimeError(f"{load.lost} connections lost before the end")
    n = len(targets)
    counts = [0] * len(order)  # in each slice's window, by its target
    totals = [0] * len(order)  # cycle c, target t at [c * n + t]: every answer it completed then
    for target, at in load.stamps:
        k = math.floor((at - start) / slice_s)
        if not 0 <= k < len(order):
            continue
        totals[k - k % n + target] += 1
        if order[k] == target and at - start - k * slice_s >= settle_s:
            counts[k] += 1
    return counts + totals


def summarize(
    names: Sequence[str], order: Sequence[int], counts: Sequence[int], totals: Sequence[int],
    cpu: Sequence[Sequence[float]], window_s: float, warmup_cycles: int,
    pairs: Sequence[tuple[str, str]],
) -> dict[str, Any]:  # fmt: skip
    """Per target (each its own process), over the cycles after `warmup_cycles`:
      - `rps`: the median rate (answers/s) of its slices' windows;
      - `per_cpu_s`: the median of its answers per CPU-second of its process tree over whole
        cycles, which counts work a proxy defers past its slice (a store writer's batch)
        against it wherever that lands.
    And for each (a, b) of `pairs`, the median of the cycles' ratios a/b of both, with its 95%
    interval (`pairs`: {"a/b": {"rps": (median, lo, hi), "per_cpu_s": (...)}}).
    `cpu[c][t]`: target t's CPU seconds at cycle c's start (one more entry: the end)."""
    n = len(names)
    cycles = len(order) // n
    rates: list[dict[str, float]] = []
    effs: list[dict[str, float]] = []
    for c in range(warmup_cycles, cycles):
        rates.append({names[order[c * n + j]]: counts[c * n + j] / window_s for j in range(n)})
        effs.append(
            {
                name: totals[c * n + t] / max(1e-9, cpu[c + 1][t] - cpu[c][t])
                for t, name in enumerate(names)
            }
        )
    out: dict[str, Any] = {"cycles": len(rates), "pairs": {}}
    for name in names:
        out[name] = {
            "rps": statistics.median(r[name] for r in rates),
            "per_cpu_s": statistics.median(e[name] for e in effs),
        }
    for a, b in pairs:
        out["pairs"][f"{a}/{b}"] = {
            key: added_latency.median_interval([r[a] / r[b] for r in rows if r[b] > 0])
            for key, rows in (("rps", rates), ("per_cpu_s", effs))
        }
    return out


def run_clients(
    cpus: Sequence[int],
    targets: Sequence[tuple[int, str, int]],
    stream: bool,
    order: Sequence[int],
    slice_s: float,
    settle_s: float,
    pids: Sequence[int],
) -> tuple[list[int], list[int], list[dict[int, float]]]:
    """One client process per load CPU, sharing each target's connections (its third field):
    the summed windowed counts and cycle totals (`drive`), and the CPU seconds each target's
    process tree (`pids`) had spent at each cycle's start and at the end, read on the
    schedule."""
    procs = max(1, min(len(cpus), min(t[2] for t in targets)))
    conns = sum(t[2] for t in targets)
    start = time.time() + 2.0 + conns / 200  # after every connection opens
    children = []
    for p in range(procs):
        mine = [(port, path, c // procs + (1 if p < c % procs else 0)) for port, path, c in targets]
        spec = json.dumps({"targets": mine, "order": list(order), "start": start,
                           "slice": slice_s, "settle": settle_s, "stream": stream})  # fmt: skip
        cmd = ["taskset", "-c", str(cpus[p]), sys.executable, __file__, "--role", "client"]
        children.append(subprocess.Popen([*cmd, "--spec", spec], stdout=subprocess.PIPE, text=True))
    n = len(targets)
    cpu: list[dict[int, float]] = []
    for c in range(len(order) // n + 1):  # every cycle's start, and the end
        time.sleep(max(0.0, start + c * n * slice_s - time.time()))
        cpu.append({pid: faceoff.tree_cpu(pid) for pid in pids})
    summed = [0] * (2 * len(order))
    for child in children:
        out, _ = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"client exited {child.returncode}")
        for k, got in enumerate(json.loads(out)):
            summed[k] += got
    return summed[: len(order)], summed[len(order) :], cpu


def pairs_of(proxies: Sequence[str], concs: Sequence[int]) -> list[tuple[str, str]]:
    """Each proxy against bare at each concurrency, then each proxy's largest concurrency
    against its smallest."""
    out = [(f"{p}@c{c}", f"bare@c{c}") for c in concs for p in proxies if p != "bare"]
    if len(concs) > 1:
        out += [(f"{p}@c{max(concs)}", f"{p}@c{min(concs)}") for p in proxies]
    return out


def table(mode: str, summary: dict[str, Any], labels: Sequence[str]) -> list[str]:
    lines = [f"| {mode} | {label} | {summary[label]['rps']:.0f} | "
             f"{summary[label]['per_cpu_s']:.0f} |" for label in labels]  # fmt: skip
    return lines


def pair_table(mode: str, summary: dict[str, Any]) -> list[str]:
    def cell(v: Sequence[float]) -> str:
        return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

    return [
        f"| {mode} | {pair} | {summary['cycles']} | {cell(v['rps'])} | {cell(v['per_cpu_s'])} |"
        for pair, v in summary["pairs"].items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["client"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", type=Path, help="where the nginx and wrk .debs are unpacked")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--env", action="append", default=[], metavar="TREE:KEY=VALUE")
    parser.add_argument("--modes", default="nonstream,unpaced,paced")
    parser.add_argument("--conc", default="32,128", help="connections per proxy")
    parser.add_argument("--seconds", type=float, default=90.0, help="of slices, per mode")
    parser.add_argument("--slice", type=float, default=0.25)
    parser.add_argument("--settle", type=float, default=0.03)
    parser.add_argument("--warmup-cycles", type=int, default=2)
    parser.add_argument(
        "--nginx",
        action="store_true",
        help="add nginx as a proxy (the client may then be the limit: nginx is far faster)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.role == "client":
        import uvloop

        spec = json.loads(args.spec)
        targets = [(int(p), str(path), int(c)) for p, path, c in spec["targets"]]
        counts = uvloop.run(
            drive(
                targets,
                spec["stream"],
                spec["order"],
                spec["start"],
                spec["slice"],
                spec["settle"],
            )
        )
        json.dump(counts, sys.stdout)
        return
    assert args.prefix is not None, "--prefix is required"
    trees, tree_env, native = faceoff.tree_args(args)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    proxies = ["bare", *trees] + (["nginx"] if args.nginx else [])
    concs = [int(c) for c in args.conc.split(",") if c]
    labels = [f"{p}@c{c}" for c in concs for p in proxies]  # a target: one process of its own
    pairs = pairs_of(proxies, concs)
    layout = faceoff.Layout.plan(n_proxies=1)
    procs = faceoff.Procs()
    results: dict[str, Any] = {
        "layout": vars(layout),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    cycles = max(1, round(args.seconds / (args.slice * len(labels)))) + args.warmup_cycles
    order = schedule(len(labels), cycles)
    rows: list[str] = []
    pair_rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sliced-") as tmp:
        wrk = faceoff.Wrk([str(args.prefix / "usr/bin/wrk")], "", 1, native)
        rig = faceoff.Rig(args, procs, Path(tmp), wrk, [str(args.prefix / "usr/sbin/nginx")],
                          trees, native, layout, tree_env)  # fmt: skip
        port_path = re.compile(r"http://127\.0\.0\.1:(\d+)(.*)")
        try:
            rig.start_upstreams()
            for mode in [m for m in args.modes.split(",") if m]:
                upstream = rig.upstream_base(mode)
                core = str(layout.proxies[0])
                started = {
                    label: rig.start_proxy(label.split("@")[0], upstream, core) for label in labels
                }
                targets = []
                for label in labels:
                    m = port_path.fullmatch(started[label][1])
                    assert m is not None
                    conc = int(label.rsplit("@c", 1)[1])
                    targets.append((int(m.group(1)), m.group(2) + faceoff.PATH, conc))
                pids = [started[label][0].pid for label in labels]
                counts, totals, cpu_at = run_clients(
                    layout.wrk, targets, mode != "nonstream", order, args.slice, args.settle, pids
                )
                cpu = [[at[pid] for pid in pids] for at in cpu_at]
                window = args.slice - args.settle
                summary = summarize(
                    labels, order, counts, totals, cpu, window, args.warmup_cycles, pairs
                )
                results[mode] = {"summary": summary, "counts": counts, "totals": totals, "cpu": cpu}
                rows += table(mode, summary, labels)
                pair_rows += pair_table(mode, summary)
                print("\n".join(pair_rows[-len(pairs) :]), file=sys.stderr, flush=True)
                for proc, _ in started.values():
                    procs.stop(proc)
        finally:
            procs.stop_all()
    lines = [
        "| mode | proxy@connections | req/s (median of its slices) | req per CPU-s (median of "
        "cycles) |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "| mode | pair | cycles | req/s ratio, median of cycles [95%] | req per CPU-s ratio "
        "[95%] |",
        "| --- | --- | --- | --- | --- |",
        *pair_rows,
    ]
    results["order"] = order
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
