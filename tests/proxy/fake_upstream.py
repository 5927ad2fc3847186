"""A fake vLLM arm for proxy tests: replays the real vLLM 0.32.0 fixture files.

Behaviour is chosen per request with headers, so one server serves every test:
`x-fake-mode` = stream (default) | hang | break | timed | slow | error404, plus
`x-fake-chunk` (bytes per write; 0 = one write per event) and, for `timed`,
`x-fake-ttft`, `x-fake-gap`, `x-fake-n`. Chat ids are normalised to one value so that the
usage and no-usage fixtures differ only where vLLM itself makes them differ.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.conftest import fixture_path

__all__ = ["FIXED_ID", "FakeUpstream", "fixture_stream"]

FIXED_ID = b"chatcmpl-0000000000000000"
SSE_TYPE = "text/event-stream; charset=utf-8"


def fixture_stream(name: str) -> bytes:
    """A fixture SSE file with its chat completion id normalised."""
    return re.sub(rb"chatcmpl-[0-9a-f]+", FIXED_ID, fixture_path(name).read_bytes())


def split_events(data: bytes) -> list[bytes]:
    return [event + b"\n\n" for event in data.split(b"\n\n") if event]


@dataclass
class FakeUpstream:
    arm: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    aborted: int = 0
    completed: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        self.seen.append({"path": request.path, "headers": dict(request.headers), "body": None})
        return web.Response(
            body=fixture_path("models.json").read_bytes(), content_type="application/json"
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
        mode = request.headers.get("x-fake-mode", "stream")
        if mode == "hang":
            await asyncio.sleep(30)
        if mode == "error404":
            return web.Response(
                status=404,
                body=fixture_path("error_unknown_model.json").read_bytes(),
                content_type="application/json",
            )
        if not body.get("stream"):
            kind = "chat" if request.path.endswith("chat/completions") else "completion"
            payload = fixture_path(f"{kind}_nonstream_{_arm_file(self.arm)}.json").read_bytes()
            return web.Response(
                body=payload, content_type="application/json", headers=self._headers(request)
            )
        if mode == "timed":
            return await self._timed(request)
        data = self._stream_bytes(request.path, body)
        resp = web.StreamResponse(headers={"Content-Type": SSE_TYPE, **self._headers(request)})
        await resp.prepare(request)
        try:
            if mode == "break":
                events = split_events(data)
                for event in events[:3]:
                    await resp.write(event)
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.abort()
                return resp
            if mode == "slow":
                for _ in range(400):
                    await resp.write(split_events(data)[1])
                    await asyncio.sleep(0.02)
            chunk = int(request.headers.get("x-fake-chunk", "0"))
            pieces = split_events(data) if chunk <= 0 else _chunks(data, chunk)
            for piece in pieces:
                await resp.write(piece)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.aborted += 1
            raise
        self.completed += 1
        return resp

    def _headers(self, request: web.Request) -> dict[str, str]:
        """x-fake-arm, and with `x-fake-own-headers` the proxy's own headers, as if the upstream
        were itself a proxy (the proxy must override them)."""
        headers = {"x-fake-arm": self.arm}
        if "x-fake-own-headers" in request.headers:
            headers["x-specproxy-arm"] = "upstream-arm"
            headers["x-specproxy-request-id"] = "upstream-id"
        return headers

    def _stream_bytes(self, path: str, body: dict[str, Any]) -> bytes:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if path.endswith("chat/completions"):
            name = "usage" if include_usage else "nousage"
            return fixture_stream(f"chat_stream_{name}_spec.sse")
        if body.get("n", 1) != 1:
            return fixture_stream("completion_stream_n2_spec.sse")
        return fixture_stream("completion_stream_usage_tokenids_spec.sse")

    async def _timed(self, request: web.Request) -> web.StreamResponse:
        """Known timings: first content after ttft, then one 1-token event every gap."""
        ttft = float(request.headers["x-fake-ttft"])
        gap = float(request.headers["x-fake-gap"])
        n = int(request.headers["x-fake-n"])
        resp = web.StreamResponse(headers={"Content-Type": SSE_TYPE})
        await resp.prepare(request)
        await asyncio.sleep(ttft)
        for i in range(n):
            if i:
                await asyncio.sleep(gap)
            event = {"id": "cmpl-t", "choices": [{"index": 0, "text": f"t{i}", "token_ids": [i]}]}
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
        final = {"id": "cmpl-t", "choices": [], "usage": usage}
        await resp.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _arm_file(arm: str) -> str:
    return "spec" if arm == "speculative" else "baseline"


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]
