"""A stand-in for `specproxy stats --follow` that `StatsChild` can run (tests/stats/job/
test_supervisor.py): it writes what it was given to `$FAKE_CHILD_OUT/<pid>.json`, reports
leadership on its status descriptor, then does what `$FAKE_CHILD_MODE` says:

- `serve` (default): waits for SIGTERM and exits 0;
- `crash`: exits 3 at once;
- `stubborn`: ignores SIGTERM (only SIGKILL ends it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> int:
    argv = sys.argv[1:]
    fd = int(argv[argv.index("--status-fd") + 1])
    out = os.environ["FAKE_CHILD_OUT"]
    keep = ("SPECPROXY_STATS_CHILD_CONFIG", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    record = {"argv": argv, "env": {k: os.environ.get(k) for k in keep}, "pgid": os.getpgid(0)}
    with open(os.path.join(out, f"{os.getpid()}.json"), "w") as fh:
        json.dump(record, fh)
    os.write(fd, b"follower\nleader\n")
    mode = os.environ.get("FAKE_CHILD_MODE", "serve")
    if mode == "crash":
        return 3
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    raise SystemExit(main())
