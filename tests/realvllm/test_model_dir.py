"""The tiny model directory: the agreed shape, deterministic bytes, built once and reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from specproxy.realvllm.model_dir import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    build_model_dir,
    default_cache_dir,
)


def test_config_and_tokenizer_have_the_agreed_shape(tmp_path: Path) -> None:
    model = build_model_dir(tmp_path)
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"]) == (4, 256)
    assert (config["num_attention_heads"], config["vocab_size"]) == (4, 2048)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 2048
    for name, token in (("bos", "<s>"), ("eos", "</s>"), ("pad", "<pad>")):
        assert tokenizer.token_to_id(token) == config[f"{name}_token_id"]
    text = "Why is the proxy 2.2x faster? def f(x): return {'a': [1, 2]}\n\tok ~^`|"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte-level: nothing is lost
    assert len(tokenizer.encode("the speculative server").ids) <= 4  # merges were learned
    assert tokenizer.encode("<|user|>").ids == [SPECIAL_TOKENS.index("<|user|>")]
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == CHAT_TEMPLATE and tok_config["eos_token"] == "</s>"
    generation = json.loads((model / "generation_config.json").read_text())
    assert "temperature" not in generation  # vLLM would adopt it as every request's default


def test_build_is_deterministic_and_cached(tmp_path: Path) -> None:
    first = build_model_dir(tmp_path / "a")
    second = build_model_dir(tmp_path / "b")
    assert first.name == second.name
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    stamp = (first / "tokenizer.json").stat().st_mtime_ns
    assert build_model_dir(tmp_path / "a") == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "a").iterdir()] == [first.name]  # no staging left over


def test_default_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROXY_CACHE_DIR", "/tmp/explicit")
    assert default_cache_dir() == Path("/tmp/explicit")
    monkeypatch.delenv("SPECPROXY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/tmp/xdg")
    assert default_cache_dir() == Path("/tmp/xdg/specproxy")
