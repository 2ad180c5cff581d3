#!/usr/bin/env python3
"""CPU time of bankml_convert's fast tensor kernels, per CHUNK_ELEMS (16,384) values.

    python3 oracle/kernel_timing.py [--types q8_0 ...] [--rounds 7] [--against OTHER/bankml_convert.py]

Each (source dtype -> GGML type) fast kernel converts the same 131,072 normal(0, 0.02) weights
(deterministic; BF16, and the exact F16/F32 forms of those values) in every round, in the chunks it
takes per call; the figure is the median over rounds of process CPU time per 16,384 values, which a
shared, busy machine disturbs far less than wall time. --against times a second copy of the file in alternating rounds, for before/after figures
(e.g. `git show HEAD~3:bankml_convert.py > /tmp/before.py`). Standard library only; the outputs are
checked equal to the simple exact forms once before timing.
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sources(bc, chunks: int) -> dict[str, bytes]:
    """The same values as BF16, F16 and F32 little-endian bytes."""
    rng = random.Random(20261201)
    f32 = struct.pack(f"<{chunks * bc.CHUNK_ELEMS}f", *(rng.gauss(0.0, 0.02) for _ in range(chunks * bc.CHUNK_ELEMS)))
    bf16 = bytes(b for i in range(0, len(f32), 4) for b in f32[i + 2:i + 4])      # truncated: any BF16 will do
    bits = bc._f32_bits_of(bf16, "BF16")
    return {"BF16": bf16, "F16": bc._f16_bytes(bits), "F32": bc._f32_bytes(bits)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="+", default=["q8_0"], help="GGML output types (default q8_0)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--against", type=Path, help="another bankml_convert.py, timed alternately")
    args = parser.parse_args(argv)
    copies = [("this", load(ROOT / "bankml_convert.py", "bankml_this"))]
    if args.against:
        copies.insert(0, ("against", load(args.against, "bankml_against")))
    bc = copies[-1][1]
    data = sources(bc, args.chunks)
    for type_name in args.types:
        ggml_type = next(code for code, t in bc.GGML_TYPES.items() if t.name.lower() == type_name.lower())
        for src_dtype, source in data.items():
            runs = []
            for label, module in copies:
                conversion = module.CONVERSIONS[(src_dtype, ggml_type)]
                for table in conversion.tables:
                    table()
                step = conversion.width * getattr(conversion, "chunk_elems", module.CHUNK_ELEMS)
                chunks = [source[i:i + step] for i in range(0, len(source), step)]
                if conversion.fast(chunks[0]) != conversion.simple(chunks[0]):
                    print(f"{label}: {src_dtype} -> {type_name} fast != simple", file=sys.stderr)
                    return 1
                runs.append((label, conversion.fast, chunks, []))
            values = len(source) // bc.SAFETENSORS_DTYPES[src_dtype]
            for _ in range(args.rounds):
                for _, fast, chunks, times in runs:
                    start = time.process_time()
                    for chunk in chunks:
                        fast(chunk)
                    times.append((time.process_time() - start) / values * bc.CHUNK_ELEMS * 1e6)
            figures = "  ".join(f"{label} {statistics.median(times):6.0f}" for label, _, _, times in runs)
            print(f"{src_dtype:>4} -> {type_name}: {figures} us CPU per {bc.CHUNK_ELEMS:,} values "
                  f"(median of {args.rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
