"""Writes oracle/fixtures/SmolLM2-135M-Instruct-resaved-transformers-5/: the SmolLM2-135M-Instruct
tokenizer as transformers 5 re-saves it.

Fine-tuning pipelines (merge a LoRA, save_pretrained) hand the converter a tokenizer in this shape,
not the Hub's; REFERENCE.md "Facts measured" describes it. Producing it with the real library keeps
the fixture honest instead of hand-editing JSON.

Run in the reference venv (transformers 5.18.0), from the repository root:

    oracle/.ref/venv/bin/python oracle/make_resaved_tokenizer.py [SOURCE]   # SOURCE: a key of RESAVES

It refuses another transformers version, because the saved shape is what changes between versions.
"""

import hashlib
import shutil
import sys
from pathlib import Path

import transformers
from transformers import AutoTokenizer

WANTED_TRANSFORMERS = "5.18.0"
HERE = Path(__file__).resolve().parent
# source fixture folder -> the folder its re-save goes to (the first is the default).
RESAVES = {
    "SmolLM2-135M-Instruct": "SmolLM2-135M-Instruct-resaved-transformers-5",
    # SentencePiece Llama: transformers 5 writes no tokenizer.model, so llama.cpp takes its llama_hf path.
    "TinyLlama-1.1B-Chat-v1.0": "TinyLlama-1.1B-Chat-v1.0-resaved-transformers-5",
}
SOURCE = HERE / "fixtures" / (sys.argv[1] if len(sys.argv) > 1 else "SmolLM2-135M-Instruct")
TARGET = HERE / "fixtures" / RESAVES[SOURCE.name]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    if transformers.__version__ != WANTED_TRANSFORMERS:
        print(f"need transformers {WANTED_TRANSFORMERS}, have {transformers.__version__}", file=sys.stderr)
        return 2
    # A stale file from an earlier run would survive save_pretrained and fake a shape it never wrote.
    if TARGET.exists():
        shutil.rmtree(TARGET)
    tokenizer = AutoTokenizer.from_pretrained(str(SOURCE))
    written = tokenizer.save_pretrained(str(TARGET))
    print(f"transformers {transformers.__version__}: {type(tokenizer).__name__} -> {TARGET}")
    print("save_pretrained returned:", [Path(p).name for p in written])
    for path in sorted(TARGET.iterdir()):
        print(f"{path.stat().st_size:>10}  {sha256_of(path)}  {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
