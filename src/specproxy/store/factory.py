"""`open_store`: the one place that maps a store URL to its backend."""

from __future__ import annotations

from urllib.parse import urlsplit

from specproxy.config import StoreConfig
from specproxy.errors import ConfigError
from specproxy.store.buffered import BufferedStore

__all__ = ["open_store"]


def open_store(cfg: StoreConfig, *, run_id: str = "default") -> BufferedStore:
    """The backend for `cfg.url`, not started yet (`await store.start()` connects and migrates).

    `run_id` names the run in logs and the flusher task; every record carries its own run id.
    """
    scheme = urlsplit(cfg.url).scheme
    if scheme == "memory":
        from specproxy.store.memory import MemoryStore

        return MemoryStore(cfg, run_id=run_id)
    if scheme == "sqlite":
        from specproxy.store.sqlite import SqliteStore

        return SqliteStore(cfg, run_id=run_id)
    if scheme in ("postgresql", "postgres"):
        from specproxy.store.postgres import PostgresStore

        return PostgresStore(cfg, run_id=run_id)
    raise ConfigError(
        f"store.url scheme {scheme!r} is not one of sqlite://, postgresql://, memory://"
    )
