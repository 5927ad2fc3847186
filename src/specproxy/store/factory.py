"""`open_store`: a store URL -> its backend, through the scheme registry (`store.registry`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from specproxy.config import StoreConfig
from specproxy.store.buffered import BufferedStore
from specproxy.store.registry import backend_class

__all__ = ["open_store"]


def open_store(cfg: StoreConfig, *, run_id: str = "default") -> BufferedStore:
    """The backend for `cfg.url`, not started yet (`await store.start()` connects and migrates).

    `run_id` names the run in logs and the flusher task; every record carries its own run id.
    """
    backend = backend_class(urlsplit(cfg.url).scheme)
    if not issubclass(backend, BufferedStore):
        raise TypeError(f"{backend.__qualname__} is not a BufferedStore")
    return backend(cfg, run_id=run_id)
