"""The fault suite's rig: a proxy with a real SQLite store in front of the fault upstream, what
the store holds afterwards, the process's RSS, and a table of what each case saw.

Each case prints one `FAULT |` row (case, what the client saw, the records, records lost, RSS
before and after): `pytest tests/faults -s | grep 'FAULT |'` gives the closing table.
"""

from __future__ import annotations

import resource
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy.app import create_app
from specproxy.appkeys import STORE
from specproxy.config import ArmConfig, Config, OnDown, RoutingConfig, StoreConfig, TimeoutConfig
from specproxy.records import RECORD_FIELDS
from specproxy.stats.job.rows import usable_mask
from specproxy.store.buffered import BufferedStore
from tests.faults.serve_proc import kill_leftovers, started
from tests.faults.upstream import FaultUpstream
from tests.store.helpers import read_arrays

RUN = "faults"
MiB = 1024 * 1024


def rss_bytes() -> int:
    """This process's resident set size now (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def fault_row(
    case: str, client: str, record: str, lost: int, rss_before: int, rss_after: int
) -> None:
    print(
        f"\nFAULT | {case} | {client} | {record} | {lost} | "
        f"{rss_before / MiB:.0f} MiB | {rss_after / MiB:.0f} MiB"
    )


@dataclass
class Rig:
    client: TestClient[web.Request, None]
    server: TestServer
    app: web.Application
    upstream: FaultUpstream
    registry: CollectorRegistry
    sent: int = 0
    rss_before: int = field(default_factory=rss_bytes)

    @property
    def store(self) -> BufferedStore:
        return self.app[STORE]

    async def rows(self) -> dict[str, np.ndarray[Any, Any]]:
        """Every stored record of the run, both arms concatenated, after a flush."""
        await self.store.flush()
        arrays = await read_arrays(self.store, run_id=RUN, columns=RECORD_FIELDS)
        return {
            name: np.concatenate([np.asarray(a[name], dtype=object) for a in arrays.values()])
            for name in RECORD_FIELDS
        }

    async def check_records(self, kinds: set[str | None]) -> dict[str, np.ndarray[Any, Any]]:
        """One record per request sent, none lost, none usable unless `kinds` allows success."""
        rows = await self.rows()
        assert len(rows["request_id"]) == self.sent == len(set(rows["request_id"]))
        assert set(rows["error_kind"]) <= kinds, set(rows["error_kind"])
        if None not in kinds:
            assert not usable_mask(rows).any()  # the statistics' own filter drops every one
        assert self.store.dropped == 0
        return rows


MakeRig = Callable[..., Awaitable[Rig]]


@pytest.fixture(autouse=True)
def no_serve_left() -> Iterator[None]:
    """Whatever a test's outcome, no `specproxy serve` it started outlives it."""
    mark = started()
    yield
    kill_leftovers(mark)


@pytest.fixture
async def faulty() -> AsyncIterator[FaultUpstream]:
    async with FaultUpstream() as upstream:
        yield upstream


@pytest.fixture
def make_rig(
    faulty: FaultUpstream,
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
) -> MakeRig:
    async def make(
        *,
        speculative_url: str | None = None,
        store: dict[str, Any] | None = None,
        on_down: OnDown = "control",
        **timeouts: Any,
    ) -> Rig:
        cfg = Config(
            baseline_url=faulty.url,
            speculative_url=speculative_url or faulty.url,
            speculative=ArmConfig(on_down=on_down),
            run_id=RUN,
            routing=RoutingConfig(speculative_share=1.0),
            # generous: a loaded machine must not turn a case's answer into a timeout (a case
            # about timeouts passes its own short ones)
            timeouts=TimeoutConfig(**{"read_s": 60.0, "total_s": 60.0, **timeouts}),
            store=StoreConfig(
                **{
                    "url": f"sqlite:///{tmp_path}/store.db",
                    "spill_path": str(tmp_path / "spill" / "spill.jsonl"),
                    **(store or {}),
                }
            ),
        )
        registry = CollectorRegistry()
        app = create_app(cfg, registry=registry, with_stats=False)
        server = await aiohttp_server(app)
        client: TestClient[web.Request, None] = await aiohttp_client(server)
        return Rig(client, server, app, faulty, registry)

    return make
