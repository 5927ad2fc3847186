"""vLLM 0.32's OpenAI wire format: request validation and response bodies, key for key.

Pure functions over plain data. Key order, null fields and which keys are dropped in streams
(vLLM serialises stream chunks with exclude_none on some models and not others) are copied from
the real captures in tests/fixtures/vllm-0.32.0-cpu/; the fixture-shape tests hold them there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import specproxy.emulator.vocab as vocab
from specproxy.emulator.model import Sequence

__all__ = [
    "Choice",
    "Endpoint",
    "GenerationRequest",
    "RequestError",
    "chat_body",
    "chat_content_chunk",
    "chat_role_chunk",
    "completion_body",
    "completion_chunk",
    "dumps",
    "error_json",
    "parse_request",
    "request_metrics",
    "usage_chunk",
]

Endpoint = Literal["completions", "chat"]
MAX_N = 128


def dumps(obj: Any) -> bytes:
    """Compact JSON, as FastAPI/pydantic writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def error_json(message: str, *, status: int, error_type: str, param: str | None) -> bytes:
    """vLLM's error body (the same shape as `specproxy.errors.error_body`, compact)."""
    return dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    )


class RequestError(Exception):
    """A request vLLM would refuse; rendered with `error_json`."""

    def __init__(self, message: str, *, status: int = 400, error_type: str, param: str | None):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.param = param

    def body(self) -> bytes:
        return error_json(
            str(self), status=self.status, error_type=self.error_type, param=self.param
        )


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    endpoint: Endpoint
    model: str
    prompts: tuple[tuple[int, ...], ...]  # token ids; chat has exactly one
    n: int
    max_tokens: int | None
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    return_token_ids: bool

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))


def _invalid(field: str, kind: str, msg: str, value: Any) -> RequestError:
    detail = {"type": kind, "loc": ("body", field), "msg": msg, "input": value}
    return RequestError(
        f"1 validation error:\n  {detail!r}", error_type="Bad Request", param=f"body.{field}"
    )


def _bad(message: str, param: str | None) -> RequestError:
    return RequestError(message, error_type="BadRequestError", param=param)


def _int_field(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(name, "int_type", "Input should be a valid integer", value)
    return value


def _bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid(name, "bool_type", "Input should be a valid boolean", value)
    return value


def _completion_prompts(body: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
    prompt = body.get("prompt")
    if prompt is None:
        raise _invalid("prompt", "missing", "Field required", None)
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = list(prompt)
    else:
        raise _bad("Prompt cannot be empty.", "prompt")
    prompts: list[tuple[int, ...]] = []
    for item in items:
        if isinstance(item, str):
            ids = vocab.encode(item)
        elif isinstance(item, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item
        ):
            ids = list(item)
        else:
            raise _invalid("prompt", "string_type", "Input should be a valid string", item)
        if not ids:
            raise _bad("Prompt cannot be empty.", "prompt")
        prompts.append(tuple(ids))
    return tuple(prompts)


def _chat_prompt(body: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
    messages = body.get("messages")
    if messages is None:
        raise _invalid("messages", "missing", "Field required", None)
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "list_type", "Input should be a non-empty list", messages)
    turns: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid("messages", "model_type", "Each message needs a role", message)
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            if len(parts) != len(content) or not all(isinstance(t, str) for t in parts):
                raise _invalid("messages", "string_type", "Unsupported content part", content)
            text = "\n".join(str(t) for t in parts)
        else:
            raise _invalid("messages", "string_type", "Input should be a valid string", content)
        turns.append((message["role"], text))
    return (tuple(vocab.chat_prompt_ids(turns)),)


def parse_request(
    endpoint: Endpoint, raw: bytes, *, served_model: str, max_model_len: int
) -> GenerationRequest:
    """Validate a request body like vLLM 0.32 does; raises `RequestError` with vLLM's wording."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        pos = getattr(exc, "pos", getattr(exc, "start", 0))
        reason = getattr(exc, "msg", getattr(exc, "reason", "JSON decode error"))
        detail = {
            "type": "json_invalid",
            "loc": f"body.{pos}",
            "msg": "JSON decode error",
            "input": "<dict of 0 items>",
            "ctx": {"error": reason},
        }
        raise RequestError(
            f"1 validation error:\n  {detail!r}", error_type="Bad Request", param=f"body.{pos}"
        ) from None
    if not isinstance(body, dict):
        detail = {
            "type": "model_attributes_type",
            "loc": ("body",),
            "msg": "Input should be a valid dictionary or object to extract fields from",
        }
        raise RequestError(
            f"1 validation error:\n  {detail!r}", error_type="Bad Request", param="body"
        )

    model = body.get("model", served_model)
    if model is None:
        model = served_model
    if not isinstance(model, str):
        raise _invalid("model", "string_type", "Input should be a valid string", model)
    if model != served_model:
        raise RequestError(
            f"The model `{model}` does not exist. Valid aliases: {served_model}.",
            status=404,
            error_type="NotFoundError",
            param="model",
        )

    prompts = _completion_prompts(body) if endpoint == "completions" else _chat_prompt(body)
    n = _int_field(body, "n")
    n = 1 if n is None else n
    if not 1 <= n <= MAX_N:
        raise _bad(f"n must be between 1 and {MAX_N}, got {n}.", "n")
    max_tokens = _int_field(body, "max_tokens")
    if endpoint == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = _int_field(body, "max_completion_tokens")
    if max_tokens is not None:
        if max_tokens < 1:
            raise _bad(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        if max_tokens > max_model_len:
            raise _bad(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                f"Please request fewer output tokens. "
                f"(parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
    longest = max(map(len, prompts))
    if longest + (max_tokens or 1) > max_model_len:
        raise _bad(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {longest + (max_tokens or 1)} tokens ({longest} in the messages, "
            f"{max_tokens or 1} in the completion). Please reduce the length of the messages "
            "or completion.",
            "max_tokens" if max_tokens else "prompt",
        )
    temperature = body.get("temperature", 1.0)
    temperature = 1.0 if temperature is None else temperature
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise _invalid("temperature", "float_type", "Input should be a valid number", temperature)
    if temperature < 0:
        raise _bad(f"temperature must be non-negative, got {temperature}.", "temperature")
    seed = _int_field(body, "seed")
    stream = _bool_field(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _invalid("stream_options", "model_type", "Input should be an object", options)
        if not stream:
            raise _bad("Stream options can only be defined when `stream=True`.", "stream_options")
        include_usage = _bool_field(options, "include_usage", False)
    return GenerationRequest(
        endpoint=endpoint,
        model=model,
        prompts=prompts,
        n=n,
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=seed,
        stream=stream,
        include_usage=include_usage,
        return_token_ids=_bool_field(body, "return_token_ids", False),
    )


# ---- response bodies -------------------------------------------------------------------------


def request_metrics(seq: Sequence, *, spec: bool, stream: bool, k: int) -> dict[str, Any]:
    """vLLM's per-request `metrics` block for one finished sequence (n == 1 only)."""
    arrival = seq.arrival
    first = seq.first_token_at if seq.first_token_at is not None else arrival
    last = seq.last_token_at if seq.last_token_at is not None else first
    scheduled = seq.scheduled_at if seq.scheduled_at is not None else arrival
    generation_ms = (last - first) * 1000.0
    total_s = last - arrival
    metrics: dict[str, Any] = {
        "time_to_first_token_ms": (first - arrival) * 1000.0,
        "generation_time_ms": generation_ms,
        "queue_time_ms": (scheduled - arrival) * 1000.0,
        "mean_itl_ms": generation_ms / (seq.generated - 1) if seq.generated > 1 else 0.0,
        "tokens_per_second": seq.generated / total_s if total_s > 0 else 0.0,
    }
    if spec:
        steps = seq.spec_steps
        spec_block: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + seq.accepted / steps if steps else 1.0,
            "draft_acceptance_rate": seq.accepted / seq.drafted if seq.drafted else 0.0,
            "acceptance_histogram": list(seq.histogram) if seq.histogram else [0] * (k + 1),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": seq.accepted,
            "num_draft_tokens": seq.drafted,
            "num_spec_tokens": k,
        }
        if not stream:
            spec_block["per_step_accepted"] = None
            spec_block["per_step_drafted"] = None
        metrics["speculative_decoding"] = spec_block
    elif not stream:
        metrics["speculative_decoding"] = None
    return metrics


def _usage(prompt: int, completion: int, *, details: bool) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        usage["prompt_tokens_details"] = None
        usage["completion_tokens_details"] = None
    return usage


@dataclass(frozen=True, slots=True)
class Choice:
    """One finished choice of a non-streaming response."""

    index: int
    token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    finish_reason: str | None


def completion_body(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[Choice],
    return_token_ids: bool,
    prompt_tokens: int,
    fingerprint: str,
    metrics: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": vocab.decode(c.token_ids),
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": list(c.token_ids) if return_token_ids else None,
                "prompt_logprobs": None,
                "prompt_token_ids": list(c.prompt_token_ids) if return_token_ids else None,
                "routed_experts": None,
            }
            for c in choices
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": _usage(prompt_tokens, sum(len(c.token_ids) for c in choices), details=True),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


def chat_body(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[Choice],
    return_token_ids: bool,
    prompt_token_ids: tuple[int, ...],
    fingerprint: str,
    metrics: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": {
                    "role": "assistant",
                    "content": vocab.decode(c.token_ids),
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                },
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": list(c.token_ids) if return_token_ids else None,
                "routed_experts": None,
            }
            for c in choices
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": _usage(
            len(prompt_token_ids), sum(len(c.token_ids) for c in choices), details=True
        ),
        "prompt_logprobs": None,
        "prompt_token_ids": list(prompt_token_ids) if return_token_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


def completion_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    index: int,
    token_ids: tuple[int, ...],
    finish_reason: str | None,
    return_token_ids: bool,
    prompt_token_ids: tuple[int, ...] | None,
) -> dict[str, Any]:
    """One streamed /v1/completions event (prompt ids ride on a choice's first event only)."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "text": vocab.decode(token_ids),
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": (
                    list(prompt_token_ids)
                    if return_token_ids and prompt_token_ids is not None
                    else None
                ),
                "token_ids": list(token_ids) if return_token_ids else None,
            }
        ],
    }


def chat_role_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    index: int,
    prompt_token_ids: tuple[int, ...] | None,
) -> dict[str, Any]:
    """The first chat event of a choice: the assistant role and empty content."""
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": list(prompt_token_ids) if prompt_token_ids is not None else None,
        "prompt_text": None,
    }


def chat_content_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    index: int,
    token_ids: tuple[int, ...],
    finish_reason: str | None,
    return_token_ids: bool,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "delta": {"content": vocab.decode(token_ids)},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = list(token_ids) if return_token_ids else None
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def usage_chunk(
    *,
    endpoint: Endpoint,
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str,
    metrics: dict[str, Any] | None,
) -> dict[str, Any]:
    """The final `choices: []` event sent when `stream_options.include_usage` is set."""
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if endpoint == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": _usage(prompt_tokens, completion_tokens, details=False),
        "system_fingerprint": fingerprint,
    }
    if metrics is not None:
        chunk["metrics"] = metrics
    return chunk
