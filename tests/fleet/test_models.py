from __future__ import annotations

import json

from specproxy.fleet.models import OTHER, ModelLabels, parse_models


def test_unknown_models_are_other_until_served() -> None:
    labels = ModelLabels(allow=["llama-dev"])
    assert labels.label("llama-dev") == "llama-dev"
    assert labels.label("qwen") == OTHER
    assert labels.label(None) == OTHER
    labels.set_served(["qwen", "qwen-lora"])
    assert labels.label("qwen") == "qwen"
    assert labels.label("qwen-lora") == "qwen-lora"
    labels.set_served(["llama"])  # refreshed: qwen is no longer served
    assert labels.label("qwen") == OTHER
    assert labels.label("llama-dev") == "llama-dev"  # the allow-list stays


def test_five_thousand_client_values_give_a_bounded_label_set() -> None:
    labels = ModelLabels(allow=["a"], max_served=3)
    labels.set_served(["m1"])
    values = {labels.label(f"model-{i}") for i in range(5000)} | {labels.label("m1")}
    assert values == {"m1", OTHER}
    labels.set_served([f"s{i}" for i in range(100)])  # an engine listing very many models
    assert len(labels.known) == 1 + 3
    assert labels.bound == 1 + 3 + 1
    assert len({labels.label(f"s{i}") for i in range(100)} | {labels.label("a")}) <= labels.bound


def test_a_served_model_called_other_is_not_special() -> None:
    labels = ModelLabels()
    labels.set_served(["other", ""])
    assert labels.known == frozenset()


def test_parse_models_reads_openai_and_vllm_bodies() -> None:
    body = {
        "object": "list",
        "data": [
            {"id": "Qwen/Qwen2.5-0.5B", "object": "model", "owned_by": "vllm", "root": "x"},
            {"id": "sql-lora", "object": "model", "parent": "Qwen/Qwen2.5-0.5B"},
            {"object": "model"},
        ],
    }
    assert parse_models(json.dumps(body).encode()) == ["Qwen/Qwen2.5-0.5B", "sql-lora"]
    assert parse_models(b"<html>") == []
    assert parse_models(b'{"data": 3}') == []
    assert parse_models(b"[1, 2]") == []
    assert parse_models(b"\xff\xfe") == []
