"""The protobuf wire format of a SentencePiece ModelProto, written by hand (standard library only):
the one encoder that oracle/make_gemma_tokenizer_model.py, oracle/make_mistral_v03_tokenizer.py, the
fuzz campaign (oracle/fuzz.py --tokenizer-model) and the tests build tokenizer.model bytes with.

A field is its tag (number << 3 | wire type) as a varint, then its value: a varint (wire type 0), a
length-prefixed byte string (2) or four little-endian bytes (5, a piece's float32 score).
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Callable, Optional

VARINT, LENGTH_DELIMITED, FIXED32 = 0, 2, 5


def varint(n: int) -> bytes:
    """n (non-negative) in base 128, least significant group first, the high bit set on all but the last."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number: int, wire: int, value) -> bytes:
    """One field: an int for a varint, bytes for the others (a fixed-width one given whole)."""
    tag = varint(number << 3 | wire)
    if wire == VARINT:
        return tag + varint(value)
    if wire == LENGTH_DELIMITED:
        return tag + varint(len(value)) + value
    return tag + value


def piece(text: bytes, score: float, kind: int) -> bytes:
    """One ModelProto.pieces entry (field 1): SentencePiece {piece = 1, score = 2, type = 3}."""
    body = field(1, LENGTH_DELIMITED, text) + field(2, FIXED32, struct.pack("<f", score)) + field(3, VARINT, kind)
    return field(1, LENGTH_DELIMITED, body)


def write_model(target: Path, data: bytes, shown: str, check: Optional[Callable[[object], str]] = None) -> None:
    """data written to target, `shown  N B  sha256 H` printed; with check, the file loaded by
    sentencepiece itself (the reference venv has it) and check(the processor) printed."""
    target.write_bytes(data)
    print(f"{shown}  {len(data):,} B  sha256 {hashlib.sha256(data).hexdigest()}")
    if check is not None:
        from sentencepiece import SentencePieceProcessor
        sp = SentencePieceProcessor()
        sp.LoadFromFile(str(target))
        print(f"sentencepiece loads it: {check(sp)}")
