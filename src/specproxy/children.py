"""Helper processes die with the proxy, even when it is SIGKILLed and no cleanup code runs.

A supervisor that kills hard (a failed liveness probe, a kill timeout) must not accumulate the
proxy's helpers: its stats process (`specproxy stats --follow --child-of PID`, started by serve
or by the `--workers` parent, `stats.job.supervisor`) and the workers of `--workers`.

`die_with_parent` runs first in the child (the stats command's first act, a `preexec_fn`). On
Linux it asks the kernel for SIGKILL when the parent goes (`prctl(PR_SET_PDEATHSIG)`), which
needs no cooperation from the dying parent. Elsewhere a daemon thread polls the parent pid once
a second. Either way a child whose parent is already gone by then exits at once (the race
between spawn and prctl).

PR_SET_PDEATHSIG fires when the *thread* that spawned the child exits, so spawn children from a
thread that lives as long as the process (the event loop's).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

__all__ = ["PARENT_POLL_S", "die_with_parent"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 1.0


def die_with_parent(parent_pid: int) -> None:
    """Make this (child) process exit when `parent_pid`, its parent, exits or is killed."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    else:  # pragma: no cover - the proxy is deployed on Linux; kept for local runs elsewhere
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def _watch_parent(parent_pid: int) -> None:  # pragma: no cover - non-Linux fallback
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)
