"""A tiny deterministic tokenizer and vocabulary, so the emulator counts and emits plausible tokens.

Real token counts drive the timing model (prefill cost, KV usage) and the usage block, so prompts
are split into word-ish pieces and hashed to ids with CRC32 (stable across processes, unlike
`hash`). Output tokens are drawn from a fixed vocabulary of English words and punctuation, so the
text streamed by the emulator looks like text and its token ids round-trip through `decode`.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterable, Sequence

__all__ = ["VOCAB", "VOCAB_SIZE", "chat_prompt_ids", "decode", "draw_token", "encode"]

_WORD_LIST = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there been one all we their has would when if so no will more out
can up said about other into what some time could them these two than may then do first any my
now such like only over our even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good
very make world still see own men work long here get both between life being under never day
same another know while last us might great old year off come since against go came right used
take three model token cache batch draft target engine request stream speed latency server queue
step decode prefill accept reject sample vector matrix layer head value key query weight bias
memory device kernel graph
"""
_WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())
_PUNCT = (".", ",", ":", ";", "!", "?", "\n", " -", " (", ")", '"', "'s")


def _build_vocab() -> tuple[str, ...]:
    pieces: list[str] = []
    for word in _WORDS:
        pieces.extend((" " + word, word, " " + word.capitalize()))
    pieces.extend(_PUNCT)
    syllables = ("ab", "er", "in", "on", "al", "ing", "ed", "ly", "ch", "st", "re", "an")
    filler = (a + b for a in syllables for b in (*syllables, "s", "t", "x", "y", "z"))
    for piece in filler:
        if len(pieces) >= 2048:
            break
        pieces.append(piece)
    i = 0
    while len(pieces) < 2048:
        pieces.append(f"<0x{i:02X}>")
        i += 1
    return tuple(pieces)


VOCAB: tuple[str, ...] = _build_vocab()
VOCAB_SIZE = len(VOCAB)
_OUTPUT_IDS = tuple(
    i for i, p in enumerate(VOCAB) if p.startswith(" ") and p[1:].isalpha() and p[1:].islower()
)
_PUNCT_IDS = tuple(VOCAB.index(p) for p in (".", ",", ":", "\n"))
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s+")


def encode(text: str) -> list[int]:
    """Token ids of `text`: word pieces of at most 5 characters, hashed into the vocabulary."""
    ids: list[int] = []
    for piece in _PIECE.findall(text):
        for start in range(0, len(piece), 5):
            ids.append(zlib.crc32(piece[start : start + 5].encode()) % VOCAB_SIZE)
    return ids


def decode(ids: Iterable[int]) -> str:
    return "".join(VOCAB[i % VOCAB_SIZE] for i in ids)


def draw_token(rng: random.Random) -> int:
    """One output token: mostly a word with a leading space, sometimes punctuation."""
    if rng.random() < 0.1:
        return rng.choice(_PUNCT_IDS)
    return rng.choice(_OUTPUT_IDS)


def chat_prompt_ids(messages: Sequence[tuple[str, str]]) -> list[int]:
    """Ids of a chat in a LLaMA-style template: a header per turn, then the assistant's."""
    ids: list[int] = [1]  # <s>
    for role, content in messages:
        ids.extend(encode(f"<|{role}|>\n"))
        ids.extend(encode(content))
        ids.append(2)  # end of turn
    ids.extend(encode("<|assistant|>\n"))
    return ids
