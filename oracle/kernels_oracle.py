#!/usr/bin/env python3
"""What llama.cpp's converter does to tensor data on the F16 output path, bit for bit.

Run it with the reference venv (oracle/.ref/venv/bin/python); it runs llama.cpp's own code paths:
  - a BF16 or F16 source is loaded as conversion/base.py loads safetensors data
    (LazyTorchTensor.from_local_tensor over a gguf.utility.LocalTensor), a BF16 one is then upcast
    with `.to(torch.float32)` as prepare_tensors does for every dtype other than F16/F32;
  - the result becomes numpy (`.numpy()`) and goes through gguf.quants.quantize(data, F16 or F32),
    i.e. numpy's astype(np.float16) / astype(np.float32, copy=False).

  kernels_oracle.py            print the recorded quantities
  kernels_oracle.py --record   write them to oracle/recorded/kernels.json

Recorded: the sha256 of llama.cpp's output bytes for
  (a) all 65,536 BF16 patterns -> F16 and -> F32,
  (b) all 65,536 F16 patterns -> F32 (and -> F16, the identity),
  (c) a deterministic F32 sample of 3.46M patterns -> F16 (and -> F32, the identity),
plus tables of named special inputs and their outputs for test_bankml_convert.py.

The F32 sample is built by the stdlib code below (test_bankml_convert.py re-implements it and checks the
sha256 of the input bytes recorded here): four parts, concatenated in this order,
  uniform:  2**20 patterns, the little-endian bytes of a SHA-256 counter-mode stream
            (block i = sha256(SEED + b"/uniform/" + i as 8 little-endian bytes)),
  focused:  2**21 patterns from the stream "focused", each top byte b replaced by
            (b & 0x80) | (50 + (b & 0x7f) % 23): exponents 100..145, i.e. f16 subnormals, normals
            near both ends, and overflow,
  ties:     for every finite non-negative f16 h (0..0x7bff), the float32 exactly halfway to the next
            f16 (65536 after 65504) and its float32 neighbours -2..+2 ulp, each positive then negative,
  specials: the named patterns of F32_SPECIALS (zeros, infinities, NaN payloads incl. signalling,
            f32 subnormals, rounding ties, values around 65504/65520 and 2**-24/2**-25).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import struct
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REF = Path(os.environ.get(
    "BANKML_REF", HERE / ".ref" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"))
RECORDED = HERE / "recorded" / "kernels.json"
COMMAND = "/work/main/oracle/.ref/venv/bin/python oracle/kernels_oracle.py --record"


# --- The F32 sample: stdlib only, so that the test can rebuild it without numpy.
# --- Changing anything here changes the recorded input hash, which the test checks.

SEED = b"bankml kernels f32 sample v1"
UNIFORM_LANES = 1 << 20
FOCUSED_LANES = 1 << 21
TIE_OFFSETS = (-2, -1, 0, 1, 2)

F32_SPECIALS = (
    ("+0", 0x00000000), ("-0", 0x80000000),
    ("+inf", 0x7F800000), ("-inf", 0xFF800000),
    ("quiet NaN", 0x7FC00000), ("-quiet NaN", 0xFFC00000),
    ("quiet NaN, all payload bits", 0x7FFFFFFF), ("-quiet NaN, all payload bits", 0xFFFFFFFF),
    ("signalling NaN, payload in the kept bits", 0x7FA00000),
    ("signalling NaN, kept payload 0x1ff", 0x7FBFE000),
    ("signalling NaN, payload only below the kept bits", 0x7F800001),
    ("signalling NaN, payload 0x1fff below the kept bits", 0x7F801FFF),
    ("signalling NaN, lowest kept payload bit", 0x7F802000),
    ("-signalling NaN, payload only below the kept bits", 0xFF800001),
    ("-signalling NaN, lowest kept payload bit", 0xFF802000),
    ("1.0", 0x3F800000), ("-1.0", 0xBF800000),
    ("1 + 2**-11, a tie, rounds down to even", 0x3F801000),
    ("1 + 3 * 2**-11, a tie, rounds up to even", 0x3F803000),
    ("1 + 2**-11 + 2**-23, just above a tie", 0x3F801001),
    ("1 + 2**-11 - 2**-23, just below a tie", 0x3F800FFF),
    ("2 - 2**-23, rounds up into the next exponent", 0x3FFFFFFF),
    ("65504, the largest f16", 0x477FE000), ("-65504", 0xC77FE000),
    ("65519.996, rounds down to 65504", 0x477FEFFF),
    ("65520, a tie, rounds to infinity", 0x477FF000), ("-65520", 0xC77FF000),
    ("65520.004", 0x477FF001),
    ("65536", 0x47800000), ("131072", 0x48000000),
    ("the largest f32", 0x7F7FFFFF), ("-the largest f32", 0xFF7FFFFF),
    ("2**-14, the smallest f16 normal", 0x38800000),
    ("2**-14 - 2**-37, rounds up to the smallest normal", 0x387FFFFF),
    ("2**-14 - 2**-25, a tie between the largest subnormal and the smallest normal", 0x387FC000),
    ("2**-15, a subnormal", 0x38000000),
    ("2**-24, the smallest f16 subnormal", 0x33800000), ("-2**-24", 0xB3800000),
    ("2**-25, a tie, rounds to zero", 0x33000000), ("-2**-25", 0xB3000000),
    ("2**-25 + 2**-48, rounds up to the smallest subnormal", 0x33000001),
    ("2**-25 - 2**-49, rounds to zero", 0x32FFFFFF),
    ("1.5 * 2**-24, a tie, rounds up to 2 * 2**-24", 0x33C00000),
    ("2.5 * 2**-24, a tie, rounds down to 2 * 2**-24", 0x34200000),
    ("2**-26", 0x32800000),
    ("the smallest f32 subnormal", 0x00000001), ("-the smallest f32 subnormal", 0x80000001),
    ("the largest f32 subnormal", 0x007FFFFF), ("the smallest f32 normal", 0x00800000),
)

BF16_SPECIALS = (
    ("+0", 0x0000), ("-0", 0x8000), ("+inf", 0x7F80), ("-inf", 0xFF80),
    ("quiet NaN", 0x7FC0), ("quiet NaN, all payload bits", 0x7FFF),
    ("signalling NaN, lowest payload bit", 0x7F81), ("-signalling NaN, lowest payload bit", 0xFF81),
    ("signalling NaN, payload 0x3f", 0x7FBF),
    ("1.0", 0x3F80), ("-1.0", 0xBF80),
    ("65280, exact", 0x477F), ("65536, overflows to infinity", 0x4780), ("-65536", 0xC780),
    ("the largest finite bf16", 0x7F7F),
    ("2**-14, the smallest f16 normal", 0x3880), ("2**-15, becomes an f16 subnormal", 0x3800),
    ("2**-24, the smallest f16 subnormal", 0x3380), ("2**-25, a tie, rounds to zero", 0x3300),
    ("2**-25 * (1 + 2**-7), rounds up", 0x3301), ("1.5 * 2**-24, a tie, rounds up to 2", 0x33C0),
    ("2**-26", 0x3280), ("the smallest bf16 subnormal", 0x0001), ("-the smallest bf16 subnormal", 0x8001),
)

F16_SPECIALS = (
    ("+0", 0x0000), ("-0", 0x8000), ("+inf", 0x7C00), ("-inf", 0xFC00),
    ("quiet NaN", 0x7E00), ("quiet NaN, all payload bits", 0x7FFF),
    ("signalling NaN, lowest payload bit", 0x7C01), ("-signalling NaN, payload 0x100", 0xFD00),
    ("1.0", 0x3C00), ("65504, the largest f16", 0x7BFF), ("2**-14, the smallest normal", 0x0400),
    ("2**-24, the smallest subnormal", 0x0001), ("-2**-24", 0x8001),
    ("the largest subnormal", 0x03FF), ("a subnormal, 0x155", 0x0155),
)


def stream(label: bytes, nbytes: int) -> bytes:
    """nbytes of a SHA-256 counter-mode stream for `label`."""
    blocks = (nbytes + 31) // 32
    prefix = SEED + b"/" + label + b"/"
    sha = hashlib.sha256
    return b"".join(sha(prefix + i.to_bytes(8, "little")).digest() for i in range(blocks))[:nbytes]


def uniform_part() -> bytes:
    return stream(b"uniform", 4 * UNIFORM_LANES)


# top byte -> the same sign with exponent>>1 in 50..72
FOCUS_TOP_BYTE = bytes((b & 0x80) | (50 + (b & 0x7F) % 23) for b in range(256))


def focused_part() -> bytes:
    raw = stream(b"focused", 4 * FOCUSED_LANES)
    lanes = bytearray(raw)
    lanes[3::4] = raw[3::4].translate(FOCUS_TOP_BYTE)
    return bytes(lanes)


def tie_part() -> bytes:
    half = struct.Struct("<e")
    single = struct.Struct("<f")
    out = bytearray()
    for h in range(0x7C00):
        low = half.unpack(h.to_bytes(2, "little"))[0]
        high = 65536.0 if h == 0x7BFF else half.unpack((h + 1).to_bytes(2, "little"))[0]
        middle = int.from_bytes(single.pack((low + high) / 2), "little")
        for offset in TIE_OFFSETS:
            bits = middle + offset
            out += bits.to_bytes(4, "little")
            out += (bits | 0x80000000).to_bytes(4, "little")
    return bytes(out)


def specials_part() -> bytes:
    return b"".join(bits.to_bytes(4, "little") for _, bits in F32_SPECIALS)


SAMPLE_PARTS = (("uniform", uniform_part), ("focused", focused_part), ("ties", tie_part),
                ("specials", specials_part))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def all_16_bit_patterns() -> bytes:
    return b"".join(i.to_bytes(2, "little") for i in range(1 << 16))


# --- llama.cpp's path: load as conversion/base.py loads safetensors data, convert as prepare_tensors
# --- and gguf.quants.quantize do.

def import_reference():
    sys.path[:0] = [str(REF / "gguf-py"), str(REF)]
    import numpy as np
    import torch
    import gguf
    from conversion.base import LazyTorchTensor
    return np, torch, gguf, LazyTorchTensor


class Reference:
    def __init__(self, scratch: Path):
        self.np, self.torch, self.gguf, self.LazyTorchTensor = import_reference()
        self.scratch = scratch
        self.files = 0

    def loaded(self, data: bytes, dtype: str, shape: tuple[int, ...]):
        """The tensor prepare_tensors gets for `data` stored as safetensors dtype `dtype`."""
        self.files += 1
        path = self.scratch / f"tensor{self.files}.bin"
        path.write_bytes(b"\0" * 8 + data)   # a nonzero offset, as in a real safetensors file
        utility = self.gguf.utility
        local = utility.LocalTensor(dtype, shape, utility.LocalTensorRange(path, 8, len(data)))
        tensor = self.LazyTorchTensor.from_local_tensor(local)
        # prepare_tensors: "convert any unsupported data types to float32"
        if tensor.dtype not in (self.torch.float16, self.torch.float32):
            tensor = tensor.to(self.torch.float32)
        return tensor

    def converted(self, data: bytes, dtype: str, width: int, out_type: str, rows: int = 1) -> bytes:
        """llama.cpp's output bytes for `data` (dtype, elements of `width` bytes) written as out_type."""
        n = len(data) // width
        shape = (rows, n // rows) if rows > 1 else (n,)
        numpy_data = self.loaded(data, dtype, shape).numpy()
        qtype = getattr(self.gguf.GGMLQuantizationType, out_type)
        result = self.gguf.quants.quantize(numpy_data, qtype)
        eager = self.gguf.LazyNumpyTensor.to_eager(result)
        assert eager.dtype == {"F16": self.np.float16, "F32": self.np.float32}[out_type]
        return eager.tobytes()

    def converted_consistently(self, data: bytes, dtype: str, width: int, out_type: str) -> bytes:
        """converted() as a 2-D weight, checked to equal the 1-D result and odd-sized pieces' results,
        so that torch's and numpy's vectorised and scalar loops are known to agree on every value."""
        whole = self.converted(data, dtype, width, out_type, rows=256 if len(data) % (256 * width) == 0 else 1)
        flat = self.converted(data, dtype, width, out_type)
        assert whole == flat, f"{dtype}->{out_type}: 2-D and 1-D results differ"
        step = 1237 * width   # an odd element count, so every piece has scalar tails
        pieces = b"".join(self.converted(data[i:i + step], dtype, width, out_type)
                          for i in range(0, min(len(data), 64 * step), step))
        assert pieces == flat[:len(pieces)], f"{dtype}->{out_type}: piecewise results differ"
        return whole


def special_table(reference: Reference, specials, dtype: str, width: int, out_type: str, out_width: int):
    data = b"".join(bits.to_bytes(width, "little") for _, bits in specials)
    out = reference.converted(data, dtype, width, out_type)
    return [{"name": name, "input": f"{bits:0{2 * width}x}",
             "output": f"{int.from_bytes(out[i * out_width:(i + 1) * out_width], 'little'):0{2 * out_width}x}"}
            for i, (name, bits) in enumerate(specials)]


def record_everything(reference: Reference) -> dict:
    patterns = all_16_bit_patterns()
    parts = [(name, make()) for name, make in SAMPLE_PARTS]
    sample = b"".join(data for _, data in parts)
    np = reference.np
    f32_parts = {}
    for name, data in parts:
        out = reference.converted(data, "F32", 4, "F16")
        f32_parts[name] = {"lanes": len(data) // 4, "input_sha256": sha256(data), "f16_sha256": sha256(out)}
    return {
        "what": "sha256 of llama.cpp's output bytes (torch/numpy via gguf.quants.quantize) per conversion",
        "command": COMMAND,
        "reference": {"llama.cpp": str(REF.relative_to(HERE.parent)) if REF.is_relative_to(HERE.parent) else str(REF),
                      "numpy": np.__version__, "torch": reference.torch.__version__,
                      "python": platform.python_version(), "machine": platform.machine()},
        "all_16_bit_patterns": {
            "input": "the 65,536 values 0..65535 as little-endian uint16, in order",
            "input_sha256": sha256(patterns),
            "bf16_to_f16_sha256": sha256(reference.converted_consistently(patterns, "BF16", 2, "F16")),
            "bf16_to_f32_sha256": sha256(reference.converted_consistently(patterns, "BF16", 2, "F32")),
            "f16_to_f16_sha256": sha256(reference.converted_consistently(patterns, "F16", 2, "F16")),
            "f16_to_f32_sha256": sha256(reference.converted_consistently(patterns, "F16", 2, "F32")),
        },
        "f32_sample": {
            "definition": {
                "seed": SEED.decode(), "uniform_lanes": UNIFORM_LANES, "focused_lanes": FOCUSED_LANES,
                "focus_top_byte": "(b & 0x80) | (50 + (b & 0x7f) % 23)", "tie_offsets": list(TIE_OFFSETS),
                "parts": [name for name, _ in parts],
                "see": "the docstring of oracle/kernels_oracle.py",
            },
            "lanes": len(sample) // 4,
            "input_sha256": sha256(sample),
            "f16_sha256": sha256(reference.converted_consistently(sample, "F32", 4, "F16")),
            "f32_sha256": sha256(reference.converted(sample, "F32", 4, "F32")),
            "parts": f32_parts,
        },
        "specials": {
            "f32_to_f16": special_table(reference, F32_SPECIALS, "F32", 4, "F16", 2),
            "bf16_to_f16": special_table(reference, BF16_SPECIALS, "BF16", 2, "F16", 2),
            "bf16_to_f32": special_table(reference, BF16_SPECIALS, "BF16", 2, "F32", 4),
            "f16_to_f32": special_table(reference, F16_SPECIALS, "F16", 2, "F32", 4),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="store_true", help=f"write {RECORDED.relative_to(HERE.parent)}")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        recorded = record_everything(Reference(Path(scratch)))
    emit_record(recorded, RECORDED, args.record)
    return 0


def emit_record(recorded: dict, path: Path, to_file: bool) -> None:
    """The record as indented JSON: written to path (--record) or shown on stdout."""
    text = json.dumps(recorded, indent=1) + "\n"
    if to_file:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    sys.exit(main())
