"""A deterministic offline tokenizer: regex word pieces hashed to stable ids.

Real tokenizers need their vocabulary files (a hub download); the simulator needs only what a
prefix cache and a latency model need from one: the same text always gives the same ids, a shared
text prefix gives a shared id prefix, and the count is close to a BPE's (about one token per four
characters of English). Chat special tokens (``<|im_end|>``...) are one token each.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

# Special tokens first; then up to four word characters with an optional leading space (BPE-like
# granularity), single punctuation marks, and runs of whitespace.
_PIECE = re.compile(r"<\|[a-z_]+\|>| ?[^\W_]{1,4}| ?_|[^\w\s]|\s+", re.UNICODE)


@lru_cache(maxsize=65536)
def _piece_id(piece: str) -> int:
    # 31 bits: ids stay small ints (cheap to hash in block tuples) and never collide with -1 markers.
    return int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=4).digest(), "big") & 0x7FFFFFFF


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def encode(text: str) -> list[int]:
    return [_piece_id(p) for p in _PIECE.findall(text)]


def count(text: str) -> int:
    return sum(1 for _ in _PIECE.finditer(text))
