"""CPU time per request of one relay, by thread: a figure a busy 2-core machine can still give.

Throughput ratios need a quiet machine (`faceoff.py`); CPU seconds per request do not, or much
less: they count only the cycles the relay itself spent. This runs an nginx upstream (the
face-off's recorded 13-event stream, or its non-stream body; `--mode paced`: the face-off's
paced replay instead, chunked as uvicorn sends it, an event a millisecond) and one proxy pinned
to one core,
drives it with wrk from another core, and prints the proxy's CPU microseconds per request, its
main thread (the event loop) and its other threads (the store's writer) apart, from /proc.

    python benchmarks/relay_cpu.py --prefix /tmp/fo --mode unpaced --seconds 5 \\
        --proxy bare --proxy sqlite --proxy sqlite-py --reps 3

Proxies: `bare` (the aiohttp pass-through of `bench_proxy.py`), `sqlite` (`specproxy serve`
with a SQLite store, statistics computed elsewhere: `compute = "external"`) and `sqlite-py`
(the same with the pure-Python SSE scanner, `SPECPROXY_NO_EXTENSIONS=1`) and `sqlite-deferred`
(the same with deferred rollups, `store.rollups = "deferred"`: the writer inserts rows only); each
may name another source tree after an `@` (`sqlite@/tmp/before`: that tree's `src`), so that a
change and the tree before it take turns in one run. The .debs are unpacked into --prefix as for
the face-off.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import faceoff  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of `pid`'s main thread ("main": the event loop), of its other threads
    ("threads": the store's writer, and the loop's executor), by /proc's tids."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        kind = "main" if int(tid) == pid else "threads"
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=Path, required=True)
    parser.add_argument("--mode", choices=["unpaced", "nonstream", "paced"], default="unpaced")
    parser.add_argument("--proxy", action="append", default=[])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--conc", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy's folded stacks (threads apart) of each specproxy run, to PROFILE-NAME-REP",
    )
    args = parser.parse_args()
    proxies = args.proxy or ["bare", "sqlite", "sqlite-py"]
    libs = ":".join(
        str(args.prefix / d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
    )
    native = {"LD_LIBRARY_PATH": libs}
    procs = faceoff.Procs()
    per: dict[str, list[dict[str, float]]] = {p: [] for p in proxies}
    with tempfile.TemporaryDirectory(prefix="relaycpu-") as tmp:
        work = Path(tmp)
        try:
            root = work / "www"
            for prefix, src in (("stream", faceoff.STREAM_FILE), ("json", faceoff.BODY_FILE)):
                target = root / prefix / faceoff.PATH.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, target)
            port = faceoff.free_port()
            conf = faceoff.nginx_conf(work / "up", 1, faceoff.upstream_server(port, root))
            nginx = [str(args.prefix / "usr/sbin/nginx"), "-p", str(work / "up"), "-c", str(conf)]
            procs.start(nginx, faceoff.cores(0), env=native)
            faceoff.wait_http(f"http://127.0.0.1:{port}/health")
            prefix = "/json" if args.mode == "nonstream" else "/stream"
            upstream = f"http://127.0.0.1:{port}{prefix}"
            if args.mode == "paced":  # the face-off's paced replay: chunked, an event a ms
                paced = faceoff.free_port()
                role = [sys.executable, str(HERE / "faceoff.py"), "--role", "paced"]
                procs.start([*role, "--port", str(paced)], faceoff.cores(0))
                faceoff.wait_http(f"http://127.0.0.1:{paced}/health")
                upstream = f"http://127.0.0.1:{paced}"
            wrk = faceoff.Wrk([str(args.prefix / "usr/bin/wrk")], faceoff.cores(0), 1, native)
            script = faceoff.lua(work, stream=args.mode != "nonstream")
            for rep in range(args.reps):
                for name in proxies if rep % 2 == 0 else proxies[::-1]:
                    proc, base = start(procs, name, upstream, work)
                    wrk.run(base + faceoff.PATH, script, args.conc, 1)  # warm
                    sampler = None
                    if args.profile and name != "bare":
                        label = name.replace("/", "_")
                        out = args.profile.with_name(f"{args.profile.name}-{label}-{rep}")
                        sampler = spy(proc.pid, args.seconds, out)
                    before = thread_cpu(proc.pid)
                    began = time.monotonic()
                    run = wrk.run(base + faceoff.PATH, script, args.conc, args.seconds)
                    wall = time.monotonic() - began
                    after = thread_cpu(proc.pid)
                    n = run["rps"] * max(1, round(args.seconds))
                    spent = {k: after[k] - before.get(k, 0.0) for k in after}
                    us = {k: 1e6 * v / n for k, v in spent.items()}
                    us["total"] = sum(us.values())
                    us["busy%"] = 100 * sum(spent.values()) / wall
                    us["rps"] = run["rps"]
                    per[name].append(us)
                    print(f"{name} rep{rep}: " + ", ".join(f"{k} {v:.1f}" for k, v in us.items()))
                    if sampler is not None:
                        sampler.wait()
                        faceoff.print_folded(out, top=30)
                    procs.stop(proc)
        finally:
            procs.stop_all()
    print(f"\nCPU us per request, {args.mode}, c{args.conc}, median of {args.reps}:")
    for name, runs in per.items():
        keys = sorted({k for r in runs for k in r if r[k] > 0.05})
        cells = ", ".join(f"{k} {statistics.median(r.get(k, 0.0) for r in runs):.1f}" for k in keys)
        print(f"- {name}: {cells}")


def spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` (every thread, idle frames dropped) for the measured run."""
    spy_bin = shutil.which("py-spy")
    if spy_bin is None:
        raise SystemExit("--profile needs py-spy on PATH")
    record = ["record", "-r", "500", "-d", str(int(seconds)), "-f", "raw", "--threads"]
    return subprocess.Popen(
        [spy_bin, *record, "-o", str(out), "-p", str(pid), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start(
    procs: faceoff.Procs, name: str, upstream: str, work: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = faceoff.free_port()
    base = f"http://127.0.0.1:{port}"
    cpu = faceoff.cores(1)
    if name == "bare":
        cmd = [sys.executable, str(HERE / "faceoff.py"), "--role", "bare", "--port", str(port)]
        proc = procs.start([*cmd, "--upstream", upstream], cpu)
        faceoff.wait_http(base + "/")
        return proc, base
    kind, _, tree = name.partition("@")
    if kind not in ("sqlite", "sqlite-py", "sqlite-deferred"):
        raise SystemExit(
            f"unknown proxy {name!r}: bare, sqlite[@TREE], sqlite-py[@TREE] or "
            "sqlite-deferred[@TREE]"
        )
    env = faceoff.serve_env(Path(tree) if tree else HERE.parent)
    if kind == "sqlite-py":
        env["SPECPROXY_NO_EXTENSIONS"] = "1"
    if kind == "sqlite-deferred":
        env["SPECPROXY_STORE__ROLLUPS"] = "deferred"
    cmd = [sys.executable, "-m", "specproxy", "serve", "--port", str(port), "--baseline", upstream]
    cmd += ["--speculative", upstream, "--store", f"sqlite:///{work}/{kind}-{port}.db"]
    cmd += ["--log-level", "error"]
    proc = procs.start(cmd, cpu, env=env, cwd=work)
    faceoff.wait_http(base + "/healthz")
    time.sleep(1.0)
    return proc, base


if __name__ == "__main__":
    main()
