"""The contract's shape: narrow protocols, every backend implementing all of them, and a store
that never loads numpy (the proxy's write path stays free of it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specproxy.store.contract import (
    Export,
    History,
    Lifecycle,
    Sink,
    SummaryReader,
    TierRead,
)
from specproxy.store.memory import MemoryStore
from specproxy.store.postgres import PostgresStore
from specproxy.store.registry import STORE_SCHEMES, backend_class
from specproxy.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = (Sink, Lifecycle, SummaryReader, History, Export)


def _members(protocol: type) -> set[str]:
    return {
        name
        for klass in protocol.__mro__
        if klass.__module__ == "specproxy.store.contract"
        for name in vars(klass)
        if not name.startswith("_")
    }


def test_each_protocol_is_narrow() -> None:
    sizes = {p.__name__: len(_members(p)) for p in PROTOCOLS}
    assert all(0 < n <= 8 for n in sizes.values()), sizes
    assert _members(Sink) == {
        "record",
        "record_engine",
        "record_gpu",
        "label_models",
        "flush",
        "pending",
        "dropped",
    }


@pytest.mark.parametrize("scheme", STORE_SCHEMES)
def test_every_backend_implements_every_protocol(scheme: str) -> None:
    backend = backend_class(scheme)
    assert not getattr(backend, "__abstractmethods__", None)
    for protocol in PROTOCOLS:
        assert protocol in backend.__mro__
        for name in _members(protocol):
            assert getattr(backend, name) is not getattr(protocol, name), (protocol, name)


def test_a_tier_read_counts_its_packed_bins_alike() -> None:
    minutes = [(5, "m", "baseline", 3, 1.5, 0.75)]
    for packed in (("1,2,7", "1,1,1"), (b"\x00" * 12, b"\x00" * 24), ([1, 2, 7], [1, 1, 1])):
        read = TierRead(
            [(0, 60, "m", "speculative", 9)], {}, minutes, {(5, "m", "baseline"): packed}
        )
        assert read.rows == 1 + 1 + 3
        assert read.requests() == {"speculative": 9, "baseline": 3}


def _typed(store: MemoryStore | SqliteStore | PostgresStore) -> None:
    """mypy checks that each backend is each protocol (this function is never called)."""
    sink: Sink = store
    life: Lifecycle = store
    reader: SummaryReader = store
    history: History = store
    export: Export = store
    del sink, life, reader, history, export


_WRITE_THROUGH_STORES = """
    import asyncio, sys, tempfile
    import specproxy.store.memory, specproxy.store.postgres, specproxy.store.sqlite
    from specproxy.config import StoreConfig
    from specproxy.records import Arm, EngineSample, RequestRecord
    from specproxy.store.contract import TierVersions
    from specproxy.store.factory import open_store

    async def write(url, spill):
        store = open_store(StoreConfig(url=url, spill_path=spill))
        await store.start()
        for i in range(50):
            store.record(RequestRecord(
                f"r{i}", "run", "baseline", 60.0 + i, "m", "completions", True, 200,
                0.5 + i / 100, 0.4, ttft_s=0.1, tpot_s=0.01, prompt_tokens=5, output_tokens=9,
            ))
        store.record_engine(EngineSample(t=61.0, run_id="run", arm="baseline", up=True))
        await store.flush()
        rows = await store.read_records(run_id="run", columns=["t_start", "shadow"])
        tiers = await store.read_tiers(run_id="run", metric="e2e", known=TierVersions())
        await store.close()
        assert len(rows["baseline"]) == 50 and tiers.minutes, (rows, tiers)

    folder = tempfile.mkdtemp()
    asyncio.run(write("memory://", folder + "/m.jsonl"))
    asyncio.run(write(f"sqlite:///{folder}/s.db", folder + "/s.jsonl"))
    loaded = sorted(
        m for m in sys.modules
        if m.split(".")[0] in ("numpy", "scipy", "pyarrow") or m.startswith("specproxy.stats")
    )
    print("loaded:", loaded)
    sys.exit(1 if loaded else 0)
"""


def test_writing_through_a_store_never_imports_numpy() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WRITE_THROUGH_STORES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
