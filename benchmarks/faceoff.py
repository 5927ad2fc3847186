"""The streaming face-off (issue 27): specproxy beside a bare aiohttp pass-through and nginx, each
proxy alone on one core, before and after a change, in one go and without network.

Roles (processes pinned with taskset, by `Layout`: whole physical cores, SMT siblings left idle;
on a machine too small for that the cores wrap modulo its count, so the same command proves
itself on a 2-core box at a tiny size):
  upstream   nginx (from Debian packages unpacked with `dpkg -x` into `--prefix`) on its own
             cores serving the recorded 13-event vLLM chat stream (`chat_stream_usage_spec.sse`,
             unpaced) and the non-streaming body; nginx cannot pace, so the 1 ms paced stream
             comes from raw-asyncio replay processes sharing one port (SO_REUSEPORT), the same
             replay as `bench_proxy.py --role replay-upstream`;
  proxies    the bare aiohttp pass-through (uvloop, `bench_proxy.py --role bare`), `specproxy
             serve` from each `--tree` (e.g. before=main, after=the branch; its store a SQLite
             file, statistics computed elsewhere) and nginx as a reverse proxy (keep-alive
             upstream, no buffering), each alone on one core: by default all on the same core,
             the ones not under load stopped (SIGSTOP), because a virtual machine's vCPUs differ
             in speed by more than the proxies do (`--core-each`: a core each);
  load       wrk (a Lua script for the POST) on cores of its own.

Measured, for non-stream, unpaced and paced streams at each `--conc`: requests (streams) per
second and wrk's p50/p99, `--reps` repetitions alternating the proxies (each after `--warmup`
seconds of the same load), median, and each repetition's ratio to the bare run beside it; the
proxy's CPU during each run (busy share of its core, CPU us per request); added p50
latency (one connection, proxy minus direct, a request to every target in turn:
`added_latency.py`); `specproxy serve --workers N` on N cores, req/s
and its efficiency against N x one worker; the RSS of every serve process, idle and after load.
It prints markdown tables and writes all figures as JSON (`--json`).

    python benchmarks/faceoff.py --prefix /tmp/fo --tree before=../before --tree after=. \\
        [--seconds 3] [--warmup 0] [--reps 3] [--conc 32,128] [--modes nonstream,unpaced,paced] \\
        [--workers 1,2,4,8] [--core-each] [--json faceoff.json]

On the 16-core device machine: carry the .debs (`apt-get download nginx wrk libluajit-5.1-2
libluajit-5.1-common libssl3 libpcre2-8-0 zlib1g libcrypt1`) and both trees, `dpkg -x` each
.deb into one prefix, and run the line above with the device's python3.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # `benchmarks.*` when run as a script
FIXTURES = HERE.parent / "tests/fixtures/vllm-0.32.0-cpu"
STREAM_FILE = FIXTURES / "chat_stream_usage_spec.sse"  # 13 events: content, usage, [DONE]
BODY_FILE = FIXTURES / "chat_nonstream_spec.json"
PATH = "/v1/chat/completions"
MODES = ("nonstream", "unpaced", "paced")
PACE_S = 0.001
MODELS = '{"object":"list","data":[{"id":"tiny-llama"}]}'


def cores(*wanted: int) -> str:
    """The CPU list for taskset: `wanted`, modulo this machine's cores."""
    n = os.cpu_count() or 1
    return ",".join(sorted({str(c % n) for c in wanted}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer in {deadline_s} s")


# ------------------------------------------------------------------------------ processes


@dataclass
class Procs:
    """Every process started here, each in its own session: killed as a group at the end."""

    running: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, cmd: Sequence[str], cpu: str, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
        proc = subprocess.Popen(
            ["taskset", "-c", cpu, *cmd],
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.running.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped one (`only`) acts on it now
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.running.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.running):
            self.stop(proc)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds (every thread) spent so far by `pid` and its descendants: each process's
    CPU-time clock (`clock_getcpuclockid`, nanoseconds), or /proc's ticks where it cannot be
    read (10 ms steps)."""
    total = 0.0
    for p in descendants(pid):
        try:
            total += time.clock_gettime(((~p) << 3) | 2)  # CPUCLOCK_SCHED of the whole process
            continue
        except OSError:
            pass
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def tree_rss(pid: int) -> dict[str, int]:
    """VmRSS (KiB) of `pid` and every descendant, by `pid:name`."""
    out: dict[str, int] = {}
    for p in descendants(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        rss = re.search(r"VmRSS:\s+(\d+)", status)
        if rss is None or cmdline[0] in (b"taskset",):
            continue
        name = b" ".join(cmdline[1:4]).decode(errors="replace")[-40:]
        out[f"{p}:{name}"] = int(rss.group(1))
    return out


# ------------------------------------------------------------------------------ cores


def physical_cores() -> list[list[int]]:
    """This machine's CPUs grouped by physical core (SMT siblings together), in CPU order."""
    groups: dict[str, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            key = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
            sib = key.read_text().strip()
        except OSError:
            sib = str(cpu)
        groups.setdefault(sib, []).append(cpu)
    return sorted(groups.values())


@dataclass(frozen=True)
class Layout:
    """Which CPUs each role gets. A proxy under test gets a physical core to itself (its SMT
    sibling, if any, left idle) so that neither wrk nor the upstream shares its core; the
    upstream and wrk take whole physical cores at either end. On a machine too small for that
    (the 2-core build box) every role wraps modulo the CPU count, as a smoke test."""

    upstream: list[int]
    wrk: list[int]
    proxies: list[int]  # one CPU per proxy under test, each on its own physical core
    spare: list[int]  # the rest, for `--workers N` (proxies' CPUs first, then their siblings)
    smt: bool

    @classmethod
    def plan(cls, n_proxies: int, side: int = 4) -> Layout:
        groups = physical_cores()
        smt = any(len(g) > 1 for g in groups)
        head: list[int] = []
        tail: list[int] = []
        rest = list(groups)
        while rest and len(head) < side:
            head += rest.pop(0)
        while rest and len(tail) < side:
            tail = rest.pop() + tail
        if len(rest) < n_proxies:  # too small: the modulo layout
            n = os.cpu_count() or 1
            return cls(
                upstream=sorted({c % n for c in range(side)}),
                wrk=sorted({c % n for c in range(12, 12 + side)}),
                proxies=[(4 + i) % n for i in range(n_proxies)],
                spare=[(4 + i) % n for i in range(8)],
                smt=smt,
            )
        firsts = [g[0] for g in rest]
        siblings = [c for g in rest for c in g[1:]]
        return cls(upstream=head, wrk=tail, proxies=firsts[:n_proxies],
                   spare=firsts + siblings, smt=smt)  # fmt: skip

    def workers(self, n: int) -> str:
        """The CPU list of `--workers n`: n CPUs, whole physical cores first."""
        return ",".join(str(c) for c in sorted(self.spare[: max(1, n)]))


def cpulist(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in sorted(set(cpus)))


# ------------------------------------------------------------------------------ nginx


def nginx_conf(work: Path, workers: int, body: str) -> Path:
    """A complete nginx config (no files of the package's own), every path under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    temps = "".join(
        f"    {kind}_temp_path {work}/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = work / "nginx.conf"
    conf.write_text(
        f"{user}worker_processes {workers};\npid {work}/nginx.pid;\n"
        f"error_log {work}/error.log warn;\ndaemon off;\n"
        "events { worker_connections 8192; multi_accept on; }\n"
        "http {\n    access_log off;\n    keepalive_requests 1000000;\n"
        f"    keepalive_timeout 60s;\n{temps}{body}}}\n"
    )
    return conf


def upstream_server(port: int, root: Path) -> str:
    """nginx serving the recorded stream and the non-stream body to POSTs (static files answer
    a POST with 405: `error_page 405 =200 $uri` serves them anyway)."""
    return f"""    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        root {root};
        location ~ /health$ {{ return 200; }}
        location ~ /metrics$ {{ default_type text/plain; return 200 ""; }}
        location ~ /v1/models$ {{ default_type application/json; return 200 '{MODELS}'; }}
        location = /stream{PATH} {{ default_type "text/event-stream; charset=utf-8";
            error_page 405 =200 $uri; }}
        location = /json{PATH} {{ default_type application/json; error_page 405 =200 $uri; }}
    }}
"""


def proxy_server(port: int, upstream: str) -> str:
    """nginx as a reverse proxy: keep-alive to the upstream, streamed (no buffering)."""
    host, _, path = upstream.split("//", 1)[1].partition("/")
    return f"""    upstream engine {{ server {host}; keepalive 512; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://engine/{path + "/" if path else ""};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
"""


def run_paced(port: int, gap_s: float) -> None:
    """One paced replay process; several share `port` (SO_REUSEPORT)."""
    sys.path.insert(0, str(HERE.parent))
    import uvloop

    from benchmarks import bench_proxy

    raw = STREAM_FILE.read_bytes()
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    chunks = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    chunks[-1] += b"0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )

    def write(transport: Any, piece: bytes) -> None:
        if not transport.is_closing():
            transport.write(piece)

    def answer(server: bench_proxy.RawServer, body: bytes) -> None:
        server.transport.write(head)
        loop = asyncio.get_running_loop()
        for i, piece in enumerate(chunks):
            loop.call_later((i + 1) * gap_s, write, server.transport, piece)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(
            lambda: bench_proxy.RawServer(answer), "127.0.0.1", port, backlog=4096, reuse_port=True
        )
        await asyncio.Event().wait()

    uvloop.run(main())


# ------------------------------------------------------------------------------ wrk


def lua(work: Path, stream: bool) -> Path:
    body: dict[str, Any] = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}]}
    if stream:
        body["stream"] = True
    script = work / f"post-{'stream' if stream else 'json'}.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(body, separators=(',', ':')))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    return script


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert match is not None, text
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Wrk:
    binary: list[str]
    cpu: str
    threads: int
    env: dict[str, str]

    def run(self, url: str, script: Path, conc: int, seconds: float) -> dict[str, float]:
        """Requests/s, p50/p99 (s) and errors of one closed-loop wrk run."""
        threads = max(1, min(self.threads, conc))
        cmd = ["taskset", "-c", self.cpu, *self.binary, f"-t{threads}", f"-c{conc}"]
        cmd += [
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "--timeout",
            "10s",
            "-s",
            str(script),
            url,
        ]
        env = {**os.environ, **self.env}
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        pcts = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
        errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        return {
            "rps": rps,
            "p50_s": _seconds(pcts["50"]),
            "p99_s": _seconds(pcts["99"]),
            "errors": errors + (int(non2xx.group(1)) if non2xx else 0),
        }


# ------------------------------------------------------------------------------ the face-off


@dataclass
class Rig:
    args: argparse.Namespace
    procs: Procs
    work: Path
    wrk: Wrk
    nginx: list[str]
    trees: dict[str, Path]
    native: dict[str, str]
    layout: Layout
    tree_env: dict[str, dict[str, str]] = field(default_factory=dict)
    upstream_port: int = 0
    paced_port: int = 0

    def upstream_base(self, mode: str) -> str:
        """The engine base URL a proxy is given (nginx tells the answers apart by a prefix)."""
        if mode == "paced":
            return f"http://127.0.0.1:{self.paced_port}"
        prefix = "/json" if mode == "nonstream" else "/stream"
        return f"http://127.0.0.1:{self.upstream_port}{prefix}"

    def worker_trees(self) -> list[str]:
        """The trees `--workers` runs measure (`--workers-trees`; default every tree)."""
        chosen = self.args.workers_trees
        return [t for t in self.trees if not chosen or t in chosen]

    def start_upstreams(self) -> None:
        root = self.work / "www"
        for prefix, src in (("stream", STREAM_FILE), ("json", BODY_FILE)):
            target = root / prefix / PATH.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, target)
        self.upstream_port = free_port()
        conf = nginx_conf(self.work / "up", 4, upstream_server(self.upstream_port, root))
        nginx = [*self.nginx, "-p", str(self.work / "up"), "-c", str(conf)]
        self.procs.start(nginx, cpulist(self.layout.upstream), env=self.native)
        self.paced_port = free_port()
        for cpu in self.layout.upstream:
            self.procs.start(
                [sys.executable, __file__, "--role", "paced", "--port", str(self.paced_port)],
                str(cpu),
            )
        wait_http(f"http://127.0.0.1:{self.upstream_port}/health")
        wait_http(f"http://127.0.0.1:{self.paced_port}/health")

    def start_proxy(
        self, name: str, upstream: str, cpu: str, workers: int = 1
    ) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        if name == "bare":
            cmd = [sys.executable, __file__, "--role", "bare", "--port", str(port)]
            proc = self.procs.start([*cmd, "--upstream", upstream], cpu)
        elif name == "nginx":
            work = self.work / f"px-{port}"
            conf = nginx_conf(work, 1, proxy_server(port, upstream))
            proc = self.procs.start(
                [*self.nginx, "-p", str(work), "-c", str(conf)], cpu, self.native
            )
        else:
            tree = self.trees[name]
            db = self.work / f"{name}-{port}.db"
            cmd = [sys.executable, "-m", "specproxy", "serve", "--workers", str(workers)]
            cmd += ["--port", str(port), "--baseline", upstream, "--speculative", upstream]
            cmd += ["--store", f"sqlite:///{db}", "--log-level", "error"]
            env = {**serve_env(tree), **self.tree_env.get(name, {})}
            proc = self.procs.start(cmd, cpu, env=env, cwd=self.work)
        base = f"http://127.0.0.1:{port}"
        wait_http(base + ("/healthz" if name in self.trees else "/"))
        time.sleep(1.0 if name in self.trees else 0.2)  # every worker listening
        return proc, base


def serve_env(tree: Path) -> dict[str, str]:
    """`specproxy serve` from `tree`, its statistics computed elsewhere (`compute = "external"`,
    the Kubernetes layout): the core under test holds the relay, its store writer and its
    metrics, and no stats process whose ticks would take turns with the relay."""
    return {"PYTHONPATH": str(tree / "src"), "SPECPROXY_STATS__COMPUTE": "external"}


def profile(rig: Rig, out: Path) -> None:
    """One serve of the first tree on one core under cProfile, unpaced streams, closed loop."""
    import pstats

    name, tree = next(iter(rig.trees.items()))
    port = free_port()
    upstream = rig.upstream_base("unpaced")
    spy = shutil.which("py-spy")
    cmd = [sys.executable] if spy else [sys.executable, "-m", "cProfile", "-o", str(out.resolve())]
    cmd += ["-m", "specproxy", "serve", "--port", str(port), "--baseline", upstream]
    cmd += ["--speculative", upstream, "--store", f"sqlite:///{rig.work / 'profile.db'}"]
    cmd += ["--log-level", "error"]
    env = {**serve_env(tree), **rig.tree_env.get(name, {})}  # as the face-off runs it
    proc = rig.procs.start(cmd, str(rig.layout.proxies[0]), env=env, cwd=rig.work)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/healthz")
    time.sleep(1.0)
    conc = rig.args.conc[0]
    sampler = None
    if spy:  # sampling: no per-call overhead to distort the small functions of the event path
        record = ["record", "-r", "500", "-d", str(int(rig.args.seconds)), "-f", "raw"]
        sampler = subprocess.Popen(
            [spy, *record, "-o", str(out), "-p", str(proc.pid), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    run = rig.wrk.run(base + PATH, lua(rig.work, stream=True), conc, rig.args.seconds + 1)
    print(f"profiled {name}: unpaced c{conc} {run['rps']:.0f} streams/s", flush=True)
    if sampler is not None:
        sampler.wait()
        rig.procs.stop(proc)
        print_folded(out)
        return
    rig.procs.stop(proc)  # SIGTERM: serve exits, cProfile writes its file
    stats = pstats.Stats(str(out))
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(35)


def print_folded(path: Path, top: int = 45) -> None:
    """Self and inclusive shares of py-spy's folded stacks (`-f raw`), by function."""
    total = 0
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    for title, table in (("self", own), ("inclusive", incl)):
        print(f"== {title} ({total} samples)")
        for f, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"{100 * n / total:5.1f}% {f}")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measured(rig: Rig, proc: subprocess.Popen[bytes], url: str, script: Path, conc: int,
             seconds: float) -> dict[str, float]:  # fmt: skip
    """One wrk run after `--warmup` seconds of the same load, with the CPU the proxy's process
    tree spent during it: `busy` (CPU seconds per second: 1.0 is its core saturated) and
    `cpu_us` (CPU microseconds per request). A proxy below 1.0 busy was held back by something
    other than its own CPU."""
    if rig.args.warmup > 0:
        rig.wrk.run(url, script, conc, rig.args.warmup)
    before, began = tree_cpu(proc.pid), time.monotonic()
    run = rig.wrk.run(url, script, conc, seconds)
    wall, spent = time.monotonic() - began, tree_cpu(proc.pid) - before
    run["busy"] = spent / wall
    run["cpu_us"] = 1e6 * spent / max(1.0, run["rps"] * max(1, round(seconds)))
    return run


def only(started: dict[str, tuple[subprocess.Popen[bytes], str]], name: str | None) -> None:
    """Let `name` run and hold every other started proxy stopped (SIGSTOP), so that proxies
    sharing one core take no turns with the one under load (`None`: every one stopped)."""
    for other, (proc, _) in started.items():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT if other == name else signal.SIGSTOP)


def single_core(rig: Rig, results: dict[str, Any]) -> None:
    """Each proxy alone on one core. By default every proxy is on the same core and the ones
    not under load are stopped, so that a core's own speed (a virtual machine's vCPUs differ,
    and drift) cannot pass for a proxy's; `--core-each` gives each its own core instead."""
    args = rig.args
    proxies = ["bare", *rig.trees, "nginx"]
    for mode in args.modes:
        upstream = rig.upstream_base(mode)
        script = lua(rig.work, stream=mode != "nonstream")
        started = {
            name: rig.start_proxy(
                name, upstream, str(rig.layout.proxies[i if args.core_each else 0])
            )
            for i, name in enumerate(proxies)
        }
        for name in rig.trees:
            results["memory"][f"{mode}/{name}/idle"] = tree_rss(started[name][0].pid)
        # Added latency: one connection to each target, a request to each in turn in every
        # round (`added_latency`), so drift lands on all alike; all running, one busy at a time.
        if args.latency_seconds > 0:
            from benchmarks import added_latency

            for name in started:
                os.killpg(started[name][0].pid, signal.SIGCONT)
            for rep in range(args.reps):
                summary = added_latency.measure(rig, mode, started, args.latency_seconds, 1.0)
                results["latency"].setdefault(mode, []).append(summary)
                print(added_latency.table(mode, ["direct", *proxies], [summary], rep)[0],
                      flush=True)  # fmt: skip
        for conc in args.conc:
            for rep in range(args.reps):
                order = proxies if rep % 2 == 0 else proxies[::-1]  # alternating
                for name in order:
                    only(started, name)
                    proc, base = started[name]
                    run = measured(rig, proc, base + PATH, script, conc, args.seconds)
                    results["throughput"].setdefault(f"{mode}/c{conc}/{name}", []).append(run)
                    print(f"{mode} c{conc} rep{rep} {name}: {run['rps']:.0f}/s, busy "
                          f"{run['busy']:.2f}, {run['cpu_us']:.1f} us/req", flush=True)  # fmt: skip
        for name in rig.trees:
            results["memory"][f"{mode}/{name}/loaded"] = tree_rss(started[name][0].pid)
        for proc, _ in started.values():
            rig.procs.stop(proc)  # SIGCONT first: a stopped process cannot act on SIGTERM
        args.json.write_text(json.dumps(results, indent=1))  # kept if a later mode dies


def soak(rig: Rig, results: dict[str, Any]) -> None:
    """One worker of each `--workers-trees` tree under unpaced streams at the largest `--conc`
    for `--soak` seconds: streams/s, p50/p99 and the RSS of its processes before and after."""
    upstream = rig.upstream_base("unpaced")
    script = lua(rig.work, stream=True)
    conc = max(rig.args.conc)
    for name in rig.worker_trees():
        proc, base = rig.start_proxy(name, upstream, str(rig.layout.proxies[0]))
        idle = tree_rss(proc.pid)
        run = rig.wrk.run(base + PATH, script, conc, rig.args.soak)
        loaded = tree_rss(proc.pid)
        results["soak"][name] = {"run": run, "idle": idle, "loaded": loaded}
        mib = sum(loaded.values()) / 1024
        print(f"soak {name}: {run['rps']:.0f}/s c{conc} {rig.args.soak:.0f} s, RSS "
              f"{sum(idle.values()) / 1024:.0f} -> {mib:.0f} MiB", flush=True)  # fmt: skip
        rig.procs.stop(proc)


def multi_worker(rig: Rig, results: dict[str, Any]) -> None:
    """`specproxy serve --workers N` on N cores, unpaced streams, 32 connections per worker."""
    args = rig.args
    upstream = rig.upstream_base("unpaced")
    script = lua(rig.work, stream=True)
    for n in args.workers:
        for name in rig.worker_trees():
            proc, base = rig.start_proxy(name, upstream, rig.layout.workers(n), workers=n)
            results["memory"][f"workers{n}/{name}/idle"] = tree_rss(proc.pid)
            for _ in range(args.reps):
                run = rig.wrk.run(base + PATH, script, 32 * n, args.seconds)
                results["workers"].setdefault(f"{n}/{name}", []).append(run)
                print(f"workers {n} {name}: {run['rps']:.0f}/s", flush=True)
            results["memory"][f"workers{n}/{name}/loaded"] = tree_rss(proc.pid)
            rig.procs.stop(proc)


# ------------------------------------------------------------------------------ tables


def tables(results: dict[str, Any], trees: Sequence[str], args: argparse.Namespace) -> str:
    lines: list[str] = []
    proxies = ["bare", *trees, "nginx"]
    thr = results["throughput"]
    lines.append("### Requests (streams) per second, one core each, median of "
                 f"{args.reps} alternating repetitions ({args.seconds} s each)\n")  # fmt: skip
    head = " | ".join(proxies) + " | " + " | ".join(f"{t}/bare" for t in trees)
    lines += [f"| mode | conc | {head} | p50 / p99 ms ({', '.join(trees)}, bare) |",
              "|" + " --- |" * (3 + len(proxies) + len(trees))]  # fmt: skip
    for mode in args.modes:
        for conc in args.conc:
            med = {
                p: median([r["rps"] for r in thr.get(f"{mode}/c{conc}/{p}", [])]) for p in proxies
            }
            ratios = " | ".join(f"{med[t] / med['bare']:.2f}x" for t in trees)
            pp = ", ".join(
                "{:.2f} / {:.2f}".format(
                    1e3 * median([r["p50_s"] for r in thr[f"{mode}/c{conc}/{p}"]]),
                    1e3 * median([r["p99_s"] for r in thr[f"{mode}/c{conc}/{p}"]]),
                )
                for p in (*trees, "bare")
            )
            cells = " | ".join(f"{med[p]:.0f}" for p in proxies)
            lines.append(f"| {mode} | {conc} | {cells} | {ratios} | {pp} |")
    lines.append(
        "\n### The same runs: each repetition's ratio to bare (the run beside it), and the "
        "proxy's CPU (busy: CPU s per s; us: CPU us per request), medians\n"
    )
    lines += ["| mode | conc | " + " | ".join(f"{t}/bare by rep" for t in trees) + " | "
              + " | ".join(f"{p} busy, us" for p in proxies) + " |",
              "|" + " --- |" * (2 + len(trees) + len(proxies))]  # fmt: skip
    for mode in args.modes:
        for conc in args.conc:
            runs = {p: thr.get(f"{mode}/c{conc}/{p}", []) for p in proxies}
            by_rep = {
                t: [a["rps"] / b["rps"] for a, b in zip(runs[t], runs["bare"], strict=True)]
                for t in trees
            }
            paired = " | ".join(
                ", ".join(f"{r:.2f}" for r in by_rep[t]) + f" (median {median(by_rep[t]):.2f})"
                for t in trees
            )
            cpu = " | ".join(
                f"{median([r.get('busy', float('nan')) for r in runs[p]]):.2f}, "
                f"{median([r.get('cpu_us', float('nan')) for r in runs[p]]):.1f}"
                for p in proxies
            )
            lines.append(f"| {mode} | {conc} | {paired} | {cpu} |")
    if results["latency"]:
        from benchmarks import added_latency

        lines.append(
            "\n### Added p50 latency, one connection (ms; proxy p50 minus direct p50; requests "
            "to every target in turn, `added_latency.py`), and each tree minus bare per round\n"
        )
        lines += added_latency.header(["direct", *proxies])
        for mode in args.modes:
            lines += added_latency.table(mode, ["direct", *proxies], results["latency"][mode])
    wtrees = [t for t in trees if any(k.endswith(f"/{t}") for k in results["workers"])]
    if results["workers"]:
        trees = wtrees
        lines.append("\n### `--workers N`, unpaced streams, 32 connections per worker\n")
        lines += ["| N | " + " | ".join(f"{t} streams/s | {t} efficiency | {t} RSS/worker idle, "
                                        "loaded MiB" for t in trees) + " |",
                  "|" + " --- |" * (1 + 3 * len(trees))]  # fmt: skip
        for n in args.workers:
            row: list[str] = []
            for t in trees:
                rps = median([r["rps"] for r in results["workers"][f"{n}/{t}"]])
                one = median([r["rps"] for r in results["workers"].get(f"1/{t}", [])])
                idle = sum(results["memory"][f"workers{n}/{t}/idle"].values()) / 1024 / n
                loaded = sum(results["memory"][f"workers{n}/{t}/loaded"].values()) / 1024 / n
                row.append(f"{rps:.0f} | {rps / (n * one):.2f} | {idle:.0f}, {loaded:.0f}")
            lines.append(f"| {n} | " + " | ".join(row) + " |")
    for name, soaked in results["soak"].items():
        run = soaked["run"]
        lines.append(
            f"\nSoak, {name}: {run['rps']:.0f} streams/s, p50 {1e3 * run['p50_s']:.1f} ms, p99 "
            f"{1e3 * run['p99_s']:.1f} ms; RSS {sum(soaked['idle'].values()) / 1024:.0f} MiB idle, "
            f"{sum(soaked['loaded'].values()) / 1024:.0f} MiB after"
        )
    lines.append("\n### RSS of each serve process (MiB), one worker\n")
    for key, procs in results["memory"].items():
        if key.startswith(("unpaced/", "workers1/")):
            listing = ", ".join(
                f"{name.split(':', 1)[1]} {kib / 1024:.0f}" for name, kib in procs.items()
            )
            lines.append(f"- {key}: {sum(procs.values()) / 1024:.0f} total ({listing})")
    return "\n".join(lines)


def tree_args(
    args: argparse.Namespace,
) -> tuple[dict[str, Path], dict[str, dict[str, str]], dict[str, str]]:
    """`--tree NAME=PATH` and `--env TREE:KEY=VALUE` as {name: path} and {name: {key: value}},
    and the environment nginx and wrk need to find their libraries under `--prefix` (Python
    keeps its own)."""
    trees = {k: Path(v).resolve() for k, v in (t.split("=", 1) for t in args.tree)}
    tree_env: dict[str, dict[str, str]] = {}
    for item in args.env:
        tree, _, pair = item.partition(":")
        key, _, value = pair.partition("=")
        tree_env.setdefault(tree, {})[key] = value
    libs = ":".join(
        str(args.prefix / d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
    )
    return trees, tree_env, {"LD_LIBRARY_PATH": libs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["paced", "bare"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream")
    parser.add_argument("--prefix", type=Path, help="where the nginx and wrk .debs are unpacked")
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=PATH", help="a tree (before=...)"
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--warmup", type=float, default=0.0, help="seconds of unrecorded load before each run"
    )
    parser.add_argument(
        "--core-each",
        action="store_true",
        help="give each proxy its own core (default: all on one core, one running at a time)",
    )
    parser.add_argument(
        "--modes",
        type=lambda s: [m for m in s.split(",") if m],
        default=list(MODES),
        help=f"which of {','.join(MODES)} the single-core runs cover",
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=3.0,
        help="seconds of each one-connection latency run (4x for paced), after 1 s unrecorded "
        "(0: none)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--conc", type=lambda s: [int(x) for x in s.split(",") if x], default=[32, 128]
    )
    parser.add_argument(
        "--workers", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 2, 4, 8]
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="TREE:KEY=VALUE",
        help="an environment variable for one tree's serve (e.g. a pure-Python scanner: "
        "--tree py=. --env py:SPECPROXY_NO_EXTENSIONS=1)",
    )
    parser.add_argument(
        "--workers-trees",
        type=lambda s: [x for x in s.split(",") if x],
        default=[],
        help="the trees the --workers and --soak runs measure (default: every tree)",
    )
    parser.add_argument(
        "--soak", type=float, default=0.0, help="seconds of one worker at the largest --conc"
    )
    parser.add_argument("--json", type=Path, default=Path("faceoff.json"))
    parser.add_argument(
        "--profile",
        type=Path,
        help="instead of the face-off: cProfile the first --tree's serve under unpaced streams "
        "at the first --conc for --seconds, write the pstats here and print the top functions",
    )
    args = parser.parse_args()
    if args.role == "paced":
        run_paced(args.port, PACE_S)
        return
    if args.role == "bare":
        from benchmarks import bench_proxy

        bench_proxy.run_bare(args.port, args.upstream)
        return
    assert args.prefix is not None, "--prefix is required"
    trees, tree_env, native = tree_args(args)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    procs = Procs()
    results: dict[str, Any] = {
        "throughput": {},
        "latency": {},
        "workers": {},
        "memory": {},
        "soak": {},
    }
    layout = Layout.plan(n_proxies=2 + len(trees))
    results["setup"] = {
        "cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
        "layout": vars(layout),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    print(f"layout: {vars(layout)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="faceoff-") as tmp:
        wrk = Wrk([str(args.prefix / "usr/bin/wrk")], cpulist(layout.wrk), len(layout.wrk), native)
        rig = Rig(args, procs, Path(tmp), wrk, [str(args.prefix / "usr/sbin/nginx")], trees,
                  native, layout, tree_env)  # fmt: skip
        try:
            rig.start_upstreams()
            if args.profile is not None:
                profile(rig, args.profile)
                return
            phases = [single_core, multi_worker] + ([soak] if args.soak else [])
            for phase in phases:
                phase(rig, results)
                args.json.write_text(json.dumps(results, indent=1))  # kept if a later one dies
        finally:
            procs.stop_all()
    args.json.write_text(json.dumps(results, indent=1))
    print(tables(results, list(trees), args))


if __name__ == "__main__":
    main()
