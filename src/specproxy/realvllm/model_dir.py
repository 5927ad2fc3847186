"""The tiny LLaMA model directory that real vLLM serves in CI and `make demo-vllm`.

Nothing may be downloaded here, so the model is made on the spot: a LLaMA config (4 layers,
hidden 256, 4 heads, vocab 2048) whose weights vLLM fills with random values
(`--load-format dummy`), and a byte-level BPE tokenizer trained locally with `tokenizers` on text
generated from a fixed seed. Random weights under greedy decoding fall into short repetition
loops, which n-gram speculation predicts well: real speculative decoding with high acceptance.

The directory is deterministic and cached: its name carries a hash of everything that shapes it,
so a changed recipe builds a new directory and an unchanged one is reused. It is built in a
temporary sibling and renamed into place, so a crash never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "MODEL_CONFIG",
    "SERVED_MODEL_NAME",
    "SPECIAL_TOKENS",
    "build_model_dir",
    "corpus_lines",
    "default_cache_dir",
]

# Bump when the recipe changes in a way the hashed data below does not capture.
RECIPE_VERSION = 1
SERVED_MODEL_NAME = "tiny-llama"
VOCAB_SIZE = 2048
MAX_MODEL_LEN = 1024
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (BOS, EOS, PAD, "<|system|>", "<|user|>", "<|assistant|>")

MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": MAX_MODEL_LEN,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}

# Role markers are special tokens, so a chat prompt tokenises the same way on every server.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORD_TEXT = (
    "the a an of to and in is was for on with as by at from that this it be are were or not "
    "proxy server request response token draft model engine speculative baseline latency stream "
    "speed fast slow queue batch cache memory core thread time second minute hour day week "
    "river mountain city garden window table letter number question answer story reason "
    "red green blue small large quick quiet bright dark warm cold old new early late "
    "run walk read write open close send receive measure compare count test build start stop "
    "one two three four five six seven eight nine ten hundred thousand "
    "why how what when where who which because however therefore although while "
    "def return import class print value list dict string int float json http get post"
)
_WORDS = tuple(_WORD_TEXT.split())


def corpus_lines(*, seed: int = 20240601, lines: int = 4000) -> list[str]:
    """Seeded pseudo-text: sentences, code-like and numeric lines, every printable ASCII byte."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        kind = i % 5
        if kind == 3:
            name = rng.choice(_WORDS)
            args = ", ".join(rng.sample(_WORDS, rng.randint(1, 3)))
            out.append(f"def {name}_{i % 97}({args}):\n    return {name} + {rng.randint(0, 999)}")
        elif kind == 4:
            out.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(8)))
        else:
            words = rng.choices(_WORDS, k=rng.randint(5, 25))
            sentence = " ".join(words).capitalize()
            out.append(sentence + rng.choice((".", "?", "!", ",", ";", ":")))
    out.append("".join(chr(c) for c in range(32, 127)))  # every printable ASCII character once
    return out


def default_cache_dir() -> Path:
    """$SPECPROXY_CACHE_DIR, else $XDG_CACHE_HOME/specproxy, else ~/.cache/specproxy."""
    explicit = os.environ.get("SPECPROXY_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specproxy"


def _recipe_hash() -> str:
    import tokenizers

    recipe = {
        "version": RECIPE_VERSION,
        "config": MODEL_CONFIG,
        "template": CHAT_TEMPLATE,
        "special": SPECIAL_TOKENS,
        "corpus": hashlib.sha256("\n".join(corpus_lines()).encode()).hexdigest(),
        "tokenizers": tokenizers.__version__,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def build_model_dir(cache_dir: Path | None = None) -> Path:
    """The model directory, built on first use and reused afterwards (same recipe, same path)."""
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / f"{SERVED_MODEL_NAME}-{_recipe_hash()}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        _write_model_files(staging)
        try:
            staging.rename(target)
        except OSError:  # another process won the race with an identical directory
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_model_files(directory: Path) -> None:
    tokenizer = _train_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "config.json", MODEL_CONFIG)
    ids = {name: MODEL_CONFIG[f"{name}_token_id"] for name in ("bos", "eos", "pad")}
    _write_json(directory / "generation_config.json", {f"{k}_token_id": v for k, v in ids.items()})
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MAX_MODEL_LEN,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        directory / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD},
    )


def _train_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),  # ids 0.. in this order: <s>=0, </s>=1, <pad>=2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    return tokenizer


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
