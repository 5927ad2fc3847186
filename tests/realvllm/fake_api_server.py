"""A stand-in for vLLM's api_server module, so the launcher can be tested without vLLM.

It takes the same command line (only --host and --port matter), answers GET /health, and
misbehaves on request through $FAKE_VLLM_MODE: `crash` exits at once with code 3,
`ignore-term` ignores SIGTERM, `child` starts a long-lived child process in its process group
and prints its pid. $FAKE_VLLM_DELAY delays serving; $FAKE_VLLM_LIFETIME ends it after N s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    print("fake api_server", " ".join(sys.argv[1:]), flush=True)
    print(f"bind={os.environ.get('VLLM_CPU_OMP_THREADS_BIND')}", flush=True)
    if mode == "crash":
        print("boom: cannot start", flush=True)
        sys.exit(3)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "child":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child pid {child.pid}", flush=True)
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
    lifetime = os.environ.get("FAKE_VLLM_LIFETIME")
    if lifetime:
        threading.Timer(float(lifetime), lambda: os._exit(0)).start()
    ThreadingHTTPServer((args.host, args.port), _Health).serve_forever()


if __name__ == "__main__":
    main()
