"""`specproxy export`: CSV, JSON lines and Parquet from a SQLite store, through the CLI table."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from specproxy.cli import main
from specproxy.store.factory import open_store
from specproxy.store.schema import REQUEST_COLUMNS
from tests.store.conftest import make_record, store_config


@pytest.fixture
async def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(store_config(url, tmp_path))
    await store.start()
    for i in range(30):
        store.record(make_record(i, run_id="a" if i < 20 else "b", ttft_s=0.1 if i % 3 else None))
    await store.close()
    return url


def _export(*args: str) -> int:
    # The CLI runs its own event loop, so it must not run on the test's loop thread.
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from specproxy.cli import main; sys.exit(main())",
            "export",
            *args,
        ],
        capture_output=True,
        check=False,
    ).returncode


def test_csv_jsonl_parquet(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _export("--store", db_url, "--format", "csv", "--out", f"{out}.csv") == 0
    assert (
        _export("--store", db_url, "--format", "jsonl", "--run-id", "b", "--out", f"{out}.jsonl")
        == 0
    )
    assert _export("--store", db_url, "--format", "parquet", "--out", f"{out}.parquet") == 0
    with open(f"{out}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 30 and list(rows[0]) == list(REQUEST_COLUMNS)
    assert rows[0]["ttft_s"] == "" and rows[1]["ttft_s"] == "0.1"
    lines = [json.loads(line) for line in Path(f"{out}.jsonl").read_text().splitlines()]
    assert [r["request_id"] for r in lines] == [f"req-{i}" for i in range(20, 30)]
    assert lines[0]["stream"] is True and lines[0]["tpot_s"] is None
    table = pq.read_table(f"{out}.parquet")
    assert table.num_rows == 30 and table.column_names == list(REQUEST_COLUMNS)
    assert table.column("e2e_s").to_pylist()[:2] == [1.0, 1.001]


def test_bad_requests_fail_cleanly(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path}/nope.db"
    assert main(["export", "--store", missing, "--format", "csv"]) == 2
    assert main(["export", "--store", missing, "--format", "parquet"]) == 2
    assert not (tmp_path / "nope.db").exists()
