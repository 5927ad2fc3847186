"""Every stored request record as CSV, Parquet or JSON lines (`specproxy export`, in `cli`).

For analysis elsewhere (pandas, R, DuckDB): one row per record, the columns of the current schema
in `RequestRecord` order. Rows stream from the store in chunks, so a large store never has to fit
in memory. Parquet's library is imported by its writer alone, only when that format is asked for.
"""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from typing import IO, Any, Literal

from specproxy.config import StoreConfig
from specproxy.errors import ConfigError
from specproxy.store.factory import open_store
from specproxy.store.schema import REQUEST_COLUMNS, TEXT_COLUMNS
from specproxy.store.sqlite import require_existing_store

__all__ = ["FORMATS", "Format", "export"]

Format = Literal["csv", "parquet", "jsonl"]
FORMATS: tuple[Format, ...] = ("csv", "parquet", "jsonl")


async def export(url: str, fmt: Format, *, out: str, run_id: str | None = None) -> int:
    """Write the records of `url` (optionally one run) to `out`; return how many."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}")
    if fmt == "parquet" and out == "-":
        raise ConfigError("--format parquet needs --out FILE")
    await asyncio.to_thread(require_existing_store, url)
    store = open_store(StoreConfig(url=url))
    writer = _writer(fmt, out)
    count = 0
    try:
        async for chunk in store.export_chunks(run_id=run_id):
            await asyncio.to_thread(writer.write, chunk)
            count += len(chunk)
    finally:
        await asyncio.to_thread(writer.close)
        await store.close()
    return count


class _Writer:
    def write(self, rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _open_text(out: str) -> IO[str]:
    if out == "-":
        return sys.stdout
    return open(out, "w", encoding="utf-8", newline="")


class _CsvWriter(_Writer):
    def __init__(self, out: str) -> None:
        self.fh = _open_text(out)
        self.csv = csv.writer(self.fh)
        self.csv.writerow(REQUEST_COLUMNS)

    def write(self, rows: list[tuple[Any, ...]]) -> None:
        self.csv.writerows(rows)

    def close(self) -> None:
        self.fh.flush()
        if self.fh is not sys.stdout:
            self.fh.close()


class _JsonlWriter(_Writer):
    def __init__(self, out: str) -> None:
        self.fh = _open_text(out)

    def write(self, rows: list[tuple[Any, ...]]) -> None:
        self.fh.writelines(
            json.dumps(dict(zip(REQUEST_COLUMNS, row, strict=True))) + "\n" for row in rows
        )

    def close(self) -> None:
        self.fh.flush()
        if self.fh is not sys.stdout:
            self.fh.close()


class _ParquetWriter(_Writer):
    def __init__(self, out: str) -> None:
        try:  # the one use of pyarrow, an optional dependency: imported here only
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ConfigError(
                "--format parquet needs pyarrow, which is not installed (pip install pyarrow)"
            ) from exc
        self.pa = pa
        types = {
            "stream": pa.bool_(),
            "shadow": pa.bool_(),
            "disconnected": pa.bool_(),
            "status": pa.int64(),
            "prompt_tokens": pa.int64(),
            "output_tokens": pa.int64(),
            "n_events": pa.int64(),
            "arm_in_flight": pa.int64(),
            "endpoint_in_flight": pa.int64(),
        }
        self.schema = pa.schema(
            [
                (c, types.get(c, pa.string() if c in TEXT_COLUMNS else pa.float64()))
                for c in REQUEST_COLUMNS
            ]
        )
        self.writer = pq.ParquetWriter(out, self.schema)

    def write(self, rows: list[tuple[Any, ...]]) -> None:
        columns = list(zip(*rows, strict=True))
        table = self.pa.Table.from_arrays(
            [self.pa.array(col, type=f.type) for col, f in zip(columns, self.schema, strict=True)],
            schema=self.schema,
        )
        self.writer.write_table(table)

    def close(self) -> None:
        self.writer.close()


def _writer(fmt: Format, out: str) -> _Writer:
    if fmt == "csv":
        return _CsvWriter(out)
    if fmt == "jsonl":
        return _JsonlWriter(out)
    return _ParquetWriter(out)
