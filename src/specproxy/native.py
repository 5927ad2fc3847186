"""The compiled modules, and the one switch that turns them all off.

Each C module (`proxy._sse`, `proxy._usage`, `proxy.transports._wire`) is the twin of a
pure-Python reference in the module that uses it, tested equal to it. `pip install` builds them
where a C compiler is found (setup.py); without one, or with `SPECPROXY_NO_EXTENSIONS` set
(non-empty), every user runs its reference instead.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Final

__all__ = ["NO_EXTENSIONS_ENV", "compiled"]

NO_EXTENSIONS_ENV: Final = "SPECPROXY_NO_EXTENSIONS"


def compiled(module: str, name: str) -> Any | None:
    """`module.name` when the compiled `module` was built and is not switched off, else None."""
    if os.environ.get(NO_EXTENSIONS_ENV):
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None
