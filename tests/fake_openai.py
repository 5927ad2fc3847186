"""A minimal fake OpenAI/vLLM server for the harness tests (deterministic, no timing physics).

It streams `tokens_per_event`-token SSE events with the real vLLM 0.32 framing (usage chunk with
`metrics.speculative_decoding`, then `[DONE]`) and exposes V1 speculative counters on /metrics
that grow with every request, so acceptance can be derived from deltas.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["FakeOpenAI"]


@dataclass
class FakeOpenAI:
    """Counts requests and remembers their bodies; `acceptance` drives the /metrics counters."""

    model: str = "fake-model"
    tokens_per_event: int = 2
    event_delay_s: float = 0.0
    acceptance: float = 0.75
    fail_every: int = 0  # every n-th request answers 500 (0: never)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # each request's headers
    drafts: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        draft_tokens = self.drafts * 4
        accepted = round(draft_tokens * self.acceptance)
        labels = f'{{engine="0",model_name="{self.model}"}}'
        text = (
            "# TYPE vllm:spec_decode_num_drafts_total counter\n"
            f"vllm:spec_decode_num_drafts_total{labels} {self.drafts}\n"
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
            f"vllm:spec_decode_num_draft_tokens_total{labels} {draft_tokens}\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            f"vllm:spec_decode_num_accepted_tokens_total{labels} {accepted}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} 0\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.fail_every and len(self.bodies) % self.fail_every == 0:
            return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)
        max_tokens = int(body.get("max_tokens", 16))
        chat = "messages" in body
        events = max(1, -(-max_tokens // self.tokens_per_event))
        self.drafts += events
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": max_tokens,
            "total_tokens": 10 + max_tokens,
        }
        spec = {"draft_acceptance_rate": self.acceptance, "mean_acceptance_length": 2.5}
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            choice |= (
                {"message": {"role": "assistant", "content": "x" * max_tokens}}
                if chat
                else {"text": "x" * max_tokens}
            )
            return web.json_response(
                {"choices": [choice], "usage": usage, "metrics": {"speculative_decoding": spec}}
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        left = max_tokens
        for _ in range(events):
            n = min(self.tokens_per_event, left)
            left -= n
            piece: dict[str, Any] = {"delta": {"content": "x" * n}} if chat else {"text": "x" * n}
            await resp.write(_sse({"choices": [{"index": 0, **piece}]}))
            if self.event_delay_s:
                await asyncio.sleep(self.event_delay_s)
        if body.get("stream_options", {}).get("include_usage"):
            await resp.write(
                _sse({"choices": [], "usage": usage, "metrics": {"speculative_decoding": spec}})
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
