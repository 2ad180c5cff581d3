#!/usr/bin/env python3
"""bankml_convert's tokenizer.model reader against sentencepiece itself, on the fuzz campaign's mutants.

Run with the reference venv (its sentencepiece is the one llama.cpp's converter loads):

    oracle/.ref/venv/bin/python oracle/spm_oracle.py [--inputs N] [--start I] [--seed S]

For each mutant of `oracle/fuzz.py --tokenizer-model` (same seed, same index, same bytes) both read
the file.  Whenever bankml_convert accepts it, SentencePieceProcessor must load it too and give the
same pieces, the same score bits and the token types llama.cpp derives (IsUnknown, IsControl,
IsUnused, IsByte); a file bankml accepts and sentencepiece rejects, or reads otherwise, is a
violation.  Files bankml refuses but sentencepiece loads are counted (the reader is conservative).
Last line: ``spm oracle: N inputs, V violations, A agree-read, R agree-refused, C conservative``.
"""
from __future__ import annotations

import argparse
import struct
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bankml_convert as bc  # noqa: E402
import fuzz  # noqa: E402
from sentencepiece import SentencePieceProcessor  # noqa: E402


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def sentencepiece_view(data: bytes):
    """[(piece, score bits, llama.cpp's type)] as llama.cpp reads data through sentencepiece, or None
    where that fails (the load, or reading a piece back)."""
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(data)
    except Exception:
        return None
    out = []
    try:
        for i in range(sp.vocab_size()):
            kind = 2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 5 if sp.IsUnused(i) else 6 if sp.IsByte(i) else 1
            out.append((sp.IdToPiece(i), f32_bits(sp.GetScore(i)), kind))
    except Exception:
        return None     # e.g. a piece that is not UTF-8: llama.cpp's converter stops on it too
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", type=int, default=2000)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--seed", default="1")
    args = p.parse_args()
    bases = fuzz.spm_bases()
    counts: Counter = Counter()
    for index in range(args.start, args.start + args.inputs):
        _, data, mutations = fuzz.spm_mutant(args.seed, index, bases)
        try:
            pieces = bc.checked_pieces(*bc.parsed_pieces(data))
            ours = [(x.piece, f32_bits(x.score), bc.spm_token_type(x.type)) for x in pieces]
        except bc.Refusal:
            ours = None
        theirs = sentencepiece_view(data)
        if ours is None:
            counts["agree-refused" if theirs is None else "conservative"] += 1
        elif ours == theirs:
            counts["agree-read"] += 1
        else:
            counts["violation"] += 1
            what = "sentencepiece refuses it" if theirs is None else \
                f"first difference at id {next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))}"
            print(f"violation at input {index}: bankml reads it, {what}; mutations {mutations}")
    print(f"spm oracle: {args.inputs} inputs, {counts['violation']} violations, {counts['agree-read']} agree-read, "
          f"{counts['agree-refused']} agree-refused, {counts['conservative']} conservative")
    return 1 if counts["violation"] else 0


if __name__ == "__main__":
    sys.exit(main())
