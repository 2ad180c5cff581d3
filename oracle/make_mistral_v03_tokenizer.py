"""Writes oracle/fixtures/Mistral-7B-Instruct-v0.3-shape/tokenizer.model: a synthetic SentencePiece
model with the structure of Mistral v0.3's (32,768 pieces: <unk> <s> </s>, then 768 CONTROL pieces --
[INST] [/INST] [TOOL_CALLS] [AVAILABLE_TOOLS] [/AVAILABLE_TOOLS] [TOOL_RESULTS] [/TOOL_RESULTS] and
[control_8] .. [control_768] -- then the byte pieces and the normal vocabulary).

Mistral's own file is not copied (no licence to ship it here); this one is built from the Apache-2.0
TinyLlama (Llama 2 vocabulary) tokenizer.model: its pieces 0-2, the 768 control pieces, then its
pieces 3.. (the 256 byte pieces first, as in Mistral's), every other ModelProto field kept byte for
byte.  Standard library only; the same bytes every run.

    python3 oracle/make_mistral_v03_tokenizer.py           # writes the file, prints its sha256
    oracle/.ref/venv/bin/python oracle/make_mistral_v03_tokenizer.py --check   # and loads it with sentencepiece
"""

import sys
from pathlib import Path

from sentencepiece_proto import piece, write_model

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fixtures" / "TinyLlama-1.1B-Chat-v1.0" / "tokenizer.model"
TARGET = HERE / "fixtures" / "Mistral-7B-Instruct-v0.3-shape" / "tokenizer.model"
NAMED = ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
         "[TOOL_RESULTS]", "[/TOOL_RESULTS]")
CONTROL = 3  # sentencepiece's ModelProto.SentencePiece.Type
CONTROL_PIECES = NAMED + tuple(f"[control_{i}]" for i in range(8, 769))


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def top_level_fields(data: bytes):
    """(field number, the field's raw bytes including its tag) of a well-formed ModelProto."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = read_varint(data, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = read_varint(data, pos)
        elif wire == 2:
            size, pos = read_varint(data, pos)
            pos += size
        elif wire == 5:
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise ValueError(f"wire type {wire}")
        yield tag >> 3, data[start:pos]


def build() -> bytes:
    out = []
    pieces_seen = 0
    for number, raw in top_level_fields(SOURCE.read_bytes()):
        if number == 1:
            if pieces_seen == 3:
                out += [piece(t.encode(), 0.0, CONTROL) for t in CONTROL_PIECES]
            pieces_seen += 1
        out.append(raw)
    assert pieces_seen + len(CONTROL_PIECES) == 32768, pieces_seen
    return b"".join(out)


def main() -> int:
    data = build()
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    write_model(TARGET, data, str(TARGET.relative_to(HERE.parent)), (lambda sp: (
        f"{sp.vocab_size()} pieces; id 3 {sp.IdToPiece(3)!r} control {sp.IsControl(3)}; "
        f"id 771 {sp.IdToPiece(771)!r} byte {sp.IsByte(771)}")) if "--check" in sys.argv else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
