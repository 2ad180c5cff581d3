#!/usr/bin/env python3
"""Which characters the regex engine of tokenizers (Oniguruma) puts in the classes the split patterns
use -- \\p{L}, \\p{N}, \\p{M} and \\s -- over every Unicode scalar value, against Python's unicodedata.

Run it with the reference venv (oracle/.ref/venv/bin/python): it asks tokenizers' own Split, not a
re-implementation.  Writes oracle/recorded/unicode_classes.json:
- for each class, how many characters Oniguruma holds in it and, as runs of code points, every one
  where Python's rule (general category L*, N*, M*; str.isspace without U+001C-001F) disagrees: where
  the Unicode versions differ (newer characters Oniguruma knows), or the rule would;
- for each class, which characters of llama.cpp's check text (bankml_convert.CHKTXT) Oniguruma holds:
  bankml's replay lists its classes over those characters only (check_classes), and
  test_bankml_convert.py holds them to these, so the replay is exact on any Python.

  oracle/.ref/venv/bin/python oracle/unicode_classes_oracle.py
"""
from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

import tokenizers
from tokenizers import Regex, pre_tokenizers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import bankml_convert  # noqa: E402  (the check text only)

RECORDED = HERE / "recorded" / "unicode_classes.json"
CLASSES = {
    "L": (r"\p{L}", lambda c: unicodedata.category(c).startswith("L")),
    "N": (r"\p{N}", lambda c: unicodedata.category(c).startswith("N")),
    "M": (r"\p{M}", lambda c: unicodedata.category(c).startswith("M")),
    "s": (r"\s", lambda c: c.isspace() and c not in "\x1c\x1d\x1e\x1f"),
}


def scalar_values() -> str:
    """Every Unicode scalar value (a Rust str holds no surrogate), in order."""
    return "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


def in_class(pattern: str, text: str) -> set[str]:
    """The characters of text the class matches: Split(removed) keeps the runs outside it."""
    kept = set()
    for _, (start, end) in pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text):
        kept.update(range(start, end))
    return {c for i, c in enumerate(text) if i not in kept}


def ranges(chars: list[str]) -> list[str]:
    """Sorted characters as runs of consecutive code points: "U+1C89-U+1C8A", or "U+0897" alone."""
    runs: list[list[int]] = []
    for c in map(ord, chars):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return [f"U+{a:04X}" if a == b else f"U+{a:04X}-U+{b:04X}" for a, b in runs]


def main() -> None:
    every = scalar_values()
    check_text = sorted(set(bankml_convert.CHKTXT))
    classes = {}
    for name, (pattern, python_rule) in CLASSES.items():
        onig = in_class(pattern, every)
        differ = sorted(c for c in every if (c in onig) != python_rule(c))
        classes[name] = {
            "pattern": pattern,
            "count": len(onig),
            "only_oniguruma": ranges([c for c in differ if c in onig]),
            "only_python": ranges([c for c in differ if c not in onig]),
            "check_text_members": [f"U+{ord(c):04X}" for c in check_text if c in onig],
        }
        print(f"{pattern:<6} {len(onig):>7} characters, Python's rule differs on {len(differ)}, "
              f"{len(classes[name]['check_text_members'])} of the check text's")
    RECORDED.write_text(json.dumps({
        "command": "oracle/.ref/venv/bin/python oracle/unicode_classes_oracle.py",
        "reference": f"tokenizers {tokenizers.__version__} (Split with a Regex: Oniguruma)",
        "python_unidata_version": unicodedata.unidata_version,
        "check_text_characters": len(check_text),
        "classes": classes,
    }, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
