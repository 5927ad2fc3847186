"""One header line between aiohttp's default 8,190 bytes and the documented 64 KiB: a real
`specproxy serve` answers it (forwarded when it fits the 64 KiB header total, else the proxy's
JSON 431 with the request id), never aiohttp's plain-text 400 without one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from specproxy.proxy.headers import REQUEST_ID_HEADER
from specproxy.proxy.limits import MAX_HEADER_BYTES
from tests.faults.conftest import RUN, fault_row
from tests.faults.serve_proc import Serve
from tests.faults.upstream import FaultUpstream
from tests.proxy.conftest import CHAT

pytestmark = pytest.mark.timeout(300)


async def _raw_request(port: int, header_value: str) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"x-fault: ok\r\nAuthorization: Bearer {header_value}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    raw = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    headers_raw, _, payload = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in headers_raw.decode().split("\r\n"):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, payload


async def test_a_long_header_line_is_served_or_a_json_431(
    faulty: FaultUpstream, tmp_path: Path
) -> None:
    toml = f"""
baseline_url = "{faulty.url}"
speculative_url = "{faulty.url}"
run_id = "{RUN}"
[store]
url = "memory://"
"""
    serve = Serve(tmp_path, toml)
    try:
        await serve.ready()
        rss_before = serve.rss_bytes()
        seen = []
        for size in (8_300, 40_000):  # a long JWT: forwarded like any header
            status, _, _ = await _raw_request(serve.port, "j" * size)
            assert status == 200, (size, status)
            seen.append(f"{size} B: {status}")
        status, headers, payload = await _raw_request(serve.port, "j" * (MAX_HEADER_BYTES + 100))
        assert status == 431
        assert headers["content-type"].startswith("application/json")
        error = json.loads(payload)["error"]
        assert headers[REQUEST_ID_HEADER] and error["code"] == 431
        seen.append(f"{MAX_HEADER_BYTES + 100} B: 431 JSON")
        reader, writer = await asyncio.open_connection("127.0.0.1", serve.port)
        writer.write(f"GET /v1/models?q={'u' * 20_000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (await asyncio.wait_for(reader.readline(), 30)).split()[1] != b"400"
        writer.close()  # a 20 kB request line reaches the proxy (aiohttp's default: 400 at 8 kB)
        rss_after = serve.rss_bytes()
    finally:
        serve.proc.terminate()
        await serve.wait()
    fault_row("header line 8.3 kB / 40 kB / 64 KiB+", ", ".join(seen), "memory store", 0,
              rss_before, rss_after)  # fmt: skip
