#!/usr/bin/env python3
"""What llama.cpp's converter writes for --outtype bf16 / q8_0 / auto, bit for bit.

Run it with the reference venv (oracle/.ref/venv/bin/python); it runs llama.cpp's own code paths:
  - data is loaded as conversion/base.py loads safetensors data (LazyTorchTensor.from_local_tensor
    over a gguf.utility.LocalTensor); a BF16 source is upcast with `.to(torch.float32)` as
    prepare_tensors does for every dtype other than F16/F32; F16 stays float16;
  - `.numpy()` (lazy), then gguf.quants.quantize(data, BF16 or Q8_0), then to_eager -- the calls
    prepare_tensors makes;
  - the rules: gguf-py's constants, QuantError on rows that are not whole Q8_0 blocks, and
    ModelBase.__init__'s GUESSED ("auto") heuristic on small generated model directories.

  quant_oracle.py            print the recorded quantities
  quant_oracle.py --record   write them to oracle/recorded/quant.json

Inputs (stdlib only, so that test_bankml_convert.py imports these functions and checks the
recorded input sha256s before comparing outputs):
  - the 65,536 16-bit patterns in order, and SHUFFLES permutations of them (sorted by a key from
    the stream "shuffle/<i>"), read as BF16 and as F16, in blocks of 32 consecutive values;
  - an F32 sample, parts concatenated in this order:
      uniform:  UNIFORM_LANES random patterns (every exponent; about 12% of blocks hold a NaN/inf),
      weights:  for each top byte c in WEIGHT_CENTERS, WEIGHT_LANES patterns whose top byte is
                sign | max(0, c - k) with k drawn 0 (1/2), 1 (1/4), 2 (1/8) ... 6, or 127 (1/128)
                -- blocks whose values span a few binades below their maximum, from f32 subnormals
                to NaN/inf;
      halves:   blocks whose first value is 127 * 2**s (so d = 2**s, id = 2**-s exactly) and whose
                others are +-(k + 1/2) * 2**s: every product an exact half;
      near:     blocks with a random maximum m; the others are the float32 nearest (k + 1/2) / id
                and its neighbours -2..+2 ulp, id computed from m the way Q8_0 does: products
                that round (in float32) onto, or just past, a half;
      specials: the named blocks of special_blocks() (zeros, inf, NaN positions and payloads,
                ties of the maximum, subnormal and huge blocks), also recorded block by block;
  - a BF16 sample, read as BF16:
      weights:  the top halves of the F32 weights part (bf16 truncations of the same values),
      near:     for each exponent in BF16_NEAR_EXPONENTS and each of the 128 significands of a
                block maximum m, a block of m and every bf16 x <= m (up to 31, 8 binades down)
                whose x * id is within 2**-16 of a half, or on one -- in bf16 these come with
                x = m / 2 and its neighbours -- the rest random values below m, random signs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kernels_oracle  # noqa: E402  (its loading of tensors as llama.cpp does; stdlib at import)

REF = Path(os.environ.get(
    "BANKML_REF", HERE / ".ref" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"))
RECORDED = HERE / "recorded" / "quant.json"
COMMAND = "/work/main/oracle/.ref/venv/bin/python oracle/quant_oracle.py --record"


# --- Inputs: stdlib only.  Changing anything here changes the recorded input hashes.

SEED = b"bankml quant sample v1"
SHUFFLES = 3
UNIFORM_LANES = 1 << 18
WEIGHT_LANES = 1 << 15
WEIGHT_CENTERS = (0, 1, 2, 3, 4, 5, 8, 20, 40, 55, 58, 60, 61, 62, 63, 64, 65, 70, 90, 110, 120,
                  125, 126, 127)
HALF_SCALES = tuple(range(-24, 25, 3))
NEAR_BLOCKS = 4096
NEAR_OFFSETS = (-2, -1, 0, 1, 2)

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def stream(label: str, nbytes: int) -> bytes:
    """nbytes of the SHAKE-256 stream for `label`."""
    return hashlib.shake_256(SEED + b"/" + label.encode()).digest(nbytes)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def all_16_bit_patterns() -> bytes:
    return array("H", range(1 << 16)).tobytes() if sys.byteorder == "little" else \
        b"".join(i.to_bytes(2, "little") for i in range(1 << 16))


def shuffled_16_bit_patterns(i: int) -> bytes:
    keys = array("I", stream(f"shuffle/{i}", 4 << 16))
    if sys.byteorder != "little":
        keys.byteswap()
    order = sorted(range(1 << 16), key=keys.__getitem__)
    return b"".join(v.to_bytes(2, "little") for v in order)


def f32(x: float) -> float:
    """x rounded to float32 (inputs only; the outputs come from numpy)."""
    return _F32.unpack(_F32.pack(x))[0]


def f32_bits(x: float) -> int:
    return _U32.unpack(_F32.pack(x))[0]


def from_bits(b: int) -> float:
    return _F32.unpack(_U32.pack(b))[0]


def lanes_bytes(bits) -> bytes:
    return b"".join(b.to_bytes(4, "little") for b in bits)


def uniform_part() -> bytes:
    return stream("uniform", 4 * UNIFORM_LANES)


def _offset(b: int) -> int:
    low = b & 0x7F
    if low == 0x7F:
        return 127
    return min(6, 7 - low.bit_length())      # 64..126 -> 0, 32..63 -> 1, ... 0..1 -> 6


def weights_part() -> bytes:
    out = []
    for c in WEIGHT_CENTERS:
        raw = stream(f"weights/{c}", 4 * WEIGHT_LANES)
        table = bytes((b & 0x80) | max(0, c - _offset(b)) for b in range(256))
        lanes = bytearray(raw)
        lanes[3::4] = raw[3::4].translate(table)
        out.append(bytes(lanes))
    return b"".join(out)


def halves_part() -> bytes:
    r = stream("halves", 64 * len(HALF_SCALES))
    bits = []
    for n, s in enumerate(HALF_SCALES):
        ks, signs = r[64 * n:64 * n + 32], r[64 * n + 32:64 * n + 64]
        bits.append(f32_bits(127.0 * 2.0 ** s) | (signs[0] & 1) << 31)
        bits += [f32_bits((ks[j] % 127 + 0.5) * 2.0 ** s) | (signs[j] & 1) << 31 for j in range(1, 32)]
    return lanes_bytes(bits)


def near_part() -> bytes:
    r = stream("near", 4 * 32 * NEAR_BLOCKS)
    words = array("I", r)
    if sys.byteorder != "little":
        words.byteswap()
    bits = []
    for n in range(NEAR_BLOCKS):
        w = words[32 * n:32 * n + 32]
        m_bits = 0x30000000 + w[0] % 0x1C000000          # 2**-31 .. 2**25, any mantissa
        m = from_bits(m_bits)
        d = f32(m / 127)
        inv = f32(1 / d)
        bits.append(m_bits)
        for j in range(1, 32):
            k = w[j] % 127
            target = f32_bits(f32((k + 0.5) / inv))
            x = target + NEAR_OFFSETS[(w[j] >> 8) % len(NEAR_OFFSETS)]
            if from_bits(x) > m:
                x = m_bits
            bits.append(x | ((w[j] >> 16) & 1) << 31)
    return lanes_bytes(bits)


def special_blocks() -> list[tuple[str, list[int]]]:
    """Named Q8_0 blocks (32 float32 bit patterns) at the edges of the rule."""
    one = 0x3F800000
    ramp = [f32_bits((j + 1) / 32) for j in range(32)]

    def with_(base, changes):
        b = list(base)
        for pos, val in changes:
            b[pos] = val
        return b

    blocks = [
        ("all +0", [0] * 32),
        ("all -0", [0x80000000] * 32),
        ("+0 and -0", [0x80000000 * (j & 1) for j in range(32)]),
        ("a ramp 1/32 .. 1", ramp),
        ("a ramp, negated", [b | 0x80000000 for b in ramp]),
        ("maximum tie +1 and -1", with_(ramp, [(3, 0xBF800000), (31, one)])),
        ("maximum negative only", with_(ramp, [(31, 0xBF800000)])),
        ("all 1.0", [one] * 32),
        ("all -1.0", [0xBF800000] * 32),
        ("127 and exact halves 0.5 .. 30.5", [f32_bits(127.0)] + [f32_bits(j + 0.5) for j in range(31)]),
        ("127 and exact negative halves", [f32_bits(127.0)] + [f32_bits(-(j + 0.5)) for j in range(31)]),
        ("127 and halves 96.5 .. 126.5", [f32_bits(127.0)] + [f32_bits(96 + j + 0.5) for j in range(31)]),
        ("smallest subnormals: max 63 * 2**-149, d rounds to 0", [j * 63 // 31 for j in range(32)]),
        ("subnormals: max 64 * 2**-149, d the smallest subnormal, 1/d overflows",
         [j * 64 // 31 for j in range(32)]),
        ("subnormals: max 2**-127, 1/d overflows", [0x00400000 >> (j % 8) for j in range(32)]),
        ("tiny normals: max 2**-120, d subnormal, 1/d finite", [0x03800000 + j * 0x10000 for j in range(32)]),
        ("max 1.5e-36, d just below the smallest normal", [f32_bits(1.5e-36)] + ramp[:31]),
        ("max 127 * 2**-24, d = 2**-24, an f16 subnormal", [f32_bits(127 * 2.0 ** -24)] + ramp[:31]),
        ("max 127 * 2**-25, d = 2**-25, rounds to f16 zero", [f32_bits(127 * 2.0 ** -25)] + ramp[:31]),
        ("max 127 * 65504, d = 65504", [f32_bits(127 * 65504.0)] + ramp[:31]),
        ("max 127 * 65520, d = 65520, f16 infinity", [f32_bits(127 * 65520.0)] + ramp[:31]),
        ("max 127 * 65519, d rounds to 65504", [f32_bits(127 * 65519.0)] + ramp[:31]),
        ("max the largest float32", [0x7F7FFFFF] + ramp[:31]),
        ("the largest float32, both signs", [0x7F7FFFFF, 0xFF7FFFFF] * 16),
        ("all the largest float32", [0x7F7FFFFF] * 32),
    ]
    for pos in (0, 5, 16, 17, 31):
        blocks.append((f"+inf at {pos}", with_(ramp, [(pos, 0x7F800000)])))
    blocks.append(("-inf at 9", with_(ramp, [(9, 0xFF800000)])))
    blocks.append(("+inf and -inf", with_(ramp, [(2, 0x7F800000), (20, 0xFF800000)])))
    blocks.append(("+inf and the largest float32", with_([0x7F7FFFFF] * 32, [(7, 0x7F800000)])))
    for pos in (0, 1, 15, 16, 17, 18, 24, 25, 28, 29, 31):
        blocks.append((f"signalling NaN 0x7f801234 at {pos}", with_(ramp, [(pos, 0x7F801234)])))
    blocks += [
        ("quiet NaN 0x7fc01234 at 20", with_(ramp, [(20, 0x7FC01234)])),
        ("negative NaN 0xff812345 at 19", with_(ramp, [(19, 0xFF812345)])),
        ("NaN payload only in the low 13 bits at 30", with_(ramp, [(30, 0x7F800001)])),
        ("NaNs at 29 (0x11) and 30 (0x22)", with_(ramp, [(29, 0x7F800011), (30, 0x7F800022)])),
        ("NaNs at 30 (0x22) and 29 (0x11) swapped", with_(ramp, [(30, 0x7F800011), (29, 0x7F800022)])),
        ("NaN at 3 and NaN 0x7fa00000 at 26", with_(ramp, [(3, 0x7F800003), (26, 0x7FA00000)])),
        ("NaN at 26 after +inf at 25", with_(ramp, [(25, 0x7F800000), (26, 0x7FB00000)])),
        ("+inf at 3 and NaN at 27", with_(ramp, [(3, 0x7F800000), (27, 0x7F9FFFFF)])),
        ("all NaN 0x7fffffff", [0x7FFFFFFF] * 32),
    ]
    return blocks


def specials_part() -> bytes:
    return b"".join(lanes_bytes(bits) for _, bits in special_blocks())


SAMPLE_PARTS = (("uniform", uniform_part), ("weights", weights_part), ("halves", halves_part),
                ("near", near_part), ("specials", specials_part))

BF16_NEAR_EXPONENTS = (12, 120, 130, 200)


def bf16_weights_part() -> bytes:
    f32 = weights_part()
    out = bytearray(len(f32) // 2)
    out[0::2] = f32[2::4]
    out[1::2] = f32[3::4]
    return bytes(out)


def bf16_near_part() -> bytes:
    r = stream("bf16 near", 64 * 128 * len(BF16_NEAR_EXPONENTS))
    lanes = []
    for n, e_m in enumerate(BF16_NEAR_EXPONENTS):
        for mm in range(128):
            rand = r[64 * (128 * n + mm):64 * (128 * n + mm + 1)]
            m_bits = e_m << 7 | mm
            m = from_bits(m_bits << 16)
            inv = f32(1 / f32(m / 127))
            near = []
            for shift in range(9):
                for mx in range(128):
                    x_bits = (e_m - shift) << 7 | mx
                    v = from_bits(x_bits << 16) * inv
                    if x_bits <= m_bits and abs(v - int(v) - 0.5) < 2.0 ** -16 * max(v, 1.0):
                        near.append(x_bits)
            block = [m_bits] + near[:31]
            block += [max(0, m_bits - rand[len(block) + i] * 4) for i in range(32 - len(block))]
            lanes += [b | (rand[32 + i] & 1) << 15 for i, b in enumerate(block)]
    return b"".join(b.to_bytes(2, "little") for b in lanes)


BF16_PARTS = (("weights", bf16_weights_part), ("near", bf16_near_part))

# Named float32 values for the BF16 rounding table.
BF16_SPECIALS = (
    ("+0", 0x00000000), ("-0", 0x80000000), ("+inf", 0x7F800000), ("-inf", 0xFF800000),
    ("quiet NaN", 0x7FC00000), ("-quiet NaN, all payload bits", 0xFFFFFFFF),
    ("signalling NaN, payload only in the low half", 0x7F800001),
    ("signalling NaN, payload in the kept bits", 0x7F810000),
    ("-signalling NaN, payload 0x7fff in the low half", 0xFF807FFF),
    ("1.0", 0x3F800000), ("1 + 2**-8, a tie, rounds down to even", 0x3F808000),
    ("1 + 3 * 2**-8, a tie, rounds up to even", 0x3F818000),
    ("1 + 2**-8 + 2**-23, just above a tie", 0x3F808001),
    ("2 - 2**-23, rounds up into the next exponent", 0x3FFFFFFF),
    ("the largest float32, rounds to infinity", 0x7F7FFFFF), ("-the largest float32", 0xFF7FFFFF),
    ("the largest float32 that stays finite", 0x7F7F7FFF), ("the smallest tie to infinity", 0x7F7F8000),
    ("the smallest float32 subnormal", 0x00000001), ("a subnormal tie, rounds to even", 0x00018000),
    ("the largest float32 subnormal, rounds up to the smallest normal", 0x007FFFFF),
)


# --- llama.cpp's path, in the reference venv.

class Reference(kernels_oracle.Reference):
    """Data loaded exactly as llama.cpp loads it (kernels_oracle's), then gguf-py's quantize."""

    def quantized(self, data: bytes, dtype: str, out_type: str, row: int = 32) -> bytes:
        """llama.cpp's bytes for `data` (rows of `row` values) written as out_type."""
        width = 4 if dtype == "F32" else 2
        n = len(data) // width
        numpy_data = self.loaded(data, dtype, (n // row, row)).numpy()
        qtype = getattr(self.gguf.GGMLQuantizationType, out_type)
        result = self.gguf.LazyNumpyTensor.to_eager(self.gguf.quants.quantize(numpy_data, qtype))
        return result.tobytes()

    def quantized_consistently(self, data: bytes, dtype: str, out_type: str) -> bytes:
        """quantized() with rows of 32 and of 576 (SmolLM2's), checked equal: blocks are independent
        of how rows are grouped."""
        small = self.quantized(data, dtype, out_type, 32)
        width = 4 if dtype == "F32" else 2
        if len(data) % (576 * width) == 0:
            assert self.quantized(data, dtype, out_type, 576) == small, f"{dtype}->{out_type}: rows differ"
        return small


def q8_0_by_lanes() -> dict:
    """The Q8_0 of the uniform part and the BF16 patterns under numpy's AVX2 and SSE kernels too."""
    out = {}
    disable = {
        "16": "",
        "8": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL",
        "4": "AVX AVX2 FMA3 F16C AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL",
    }
    for lanes, features in disable.items():
        env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=features)
        r = subprocess.run([sys.executable, __file__, "--lanes-probe"], env=env, capture_output=True,
                           text=True, check=True)
        out[lanes] = json.loads(r.stdout)
    return out


def lanes_probe() -> int:
    import warnings
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as scratch:
        ref = Reference(Path(scratch))
        found = ref.np.__config__.CONFIG["SIMD Extensions"]["found"]
        result = {
            "numpy_found": found,
            "uniform_q8_0_sha256": sha256(ref.quantized(uniform_part(), "F32", "Q8_0")),
            "bf16_patterns_q8_0_sha256": sha256(ref.quantized(all_16_bit_patterns(), "BF16", "Q8_0")),
        }
    print(json.dumps(result))
    return 0


# --- The rules.

def rules(ref: Reference) -> dict:
    gguf, np = ref.gguf, ref.np
    ftypes = {}
    for name, member in (("f32", "ALL_F32"), ("f16", "MOSTLY_F16"), ("bf16", "MOSTLY_BF16"),
                         ("q8_0", "MOSTLY_Q8_0")):
        ft = getattr(gguf.LlamaFileType, member)
        ftypes[name] = {"file_type": int(ft), "label": ft.name.partition("_")[2]}
    qt = gguf.GGMLQuantizationType
    types = {t: {"id": int(getattr(qt, t)), "block": list(gguf.GGML_QUANT_SIZES[getattr(qt, t)])}
             for t in ("F32", "F16", "BF16", "Q8_0")}
    quant_errors = []
    for shape, t in (((4, 48), "Q8_0"), ((4, 64), "Q8_0"), ((64, 4), "Q8_0"), ((4, 47), "BF16"),
                     ((3, 5, 32), "Q8_0"), ((2, 5, 33), "Q8_0")):
        data = ref.gguf.LazyNumpyTensor.from_eager(np.zeros(shape, np.float32))
        try:
            gguf.quants.quantize(data, getattr(qt, t))
            raised = False
        except gguf.QuantError:
            raised = True
        quant_errors.append({"shape": list(shape), "type": t, "quant_error": raised})
    return {"out_types": ftypes, "ggml_types": types, "quant_error": quant_errors,
            "auto": auto_cases()}


AUTO_CASES = (
    # name, [(file, tensor name, dtype, shape)], llama.cpp's choice recorded below
    ("bf16 matrix", [("model.safetensors", "model.embed_tokens.weight", "BF16", (64, 32))]),
    ("f16 matrix", [("model.safetensors", "model.embed_tokens.weight", "F16", (64, 32))]),
    ("all f32", [("model.safetensors", "model.embed_tokens.weight", "F32", (64, 32)),
                 ("model.safetensors", "model.norm.weight", "F32", (32,))]),
    ("f32 matrix first, then a bf16 one", [
        ("model.safetensors", "model.embed_tokens.weight", "F32", (64, 32)),
        ("model.safetensors", "model.layers.0.mlp.down_proj.weight", "BF16", (32, 64))]),
    ("1-D f16 first, then a bf16 matrix", [
        ("model.safetensors", "model.layers.0.input_layernorm.weight", "F16", (32,)),
        ("model.safetensors", "model.layers.0.mlp.down_proj.weight", "BF16", (32, 64))]),
    ("name order within a file: mlp (f16) sorts before self_attn (bf16)", [
        ("model.safetensors", "model.layers.0.self_attn.q_proj.weight", "BF16", (32, 32)),
        ("model.safetensors", "model.layers.0.mlp.down_proj.weight", "F16", (32, 64))]),
    ("file order before name order", [
        ("model-00001-of-00002.safetensors", "model.layers.0.self_attn.q_proj.weight", "F16", (32, 32)),
        ("model-00002-of-00002.safetensors", "model.embed_tokens.weight", "BF16", (64, 32))]),
    ("a dropped 2-D tensor still decides", [
        ("model.safetensors", "model.layers.0.attention.bias", "F16", (4, 4)),
        ("model.safetensors", "model.layers.0.mlp.down_proj.weight", "BF16", (32, 64))]),
)


def write_safetensors(path: Path, tensors) -> None:
    header, offset, blobs = {}, 0, []
    for name, dtype, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        size = n * (4 if dtype == "F32" else 2)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        blobs.append(bytes(size))
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def auto_cases() -> list:
    from conversion import get_model_class
    gguf = sys.modules["gguf"]
    results = []
    for name, tensors in AUTO_CASES:
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
                      "vocab_size": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 128,
                      "model_type": "llama"}
            (d / "config.json").write_text(json.dumps(config))
            files = sorted({f for f, *_ in tensors})
            for f in files:
                write_safetensors(d / f, [(n, t, s) for ff, n, t, s in tensors if ff == f])
            if len(files) > 1:
                weight_map = {n: f for f, n, *_ in tensors}
                (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
            cls = get_model_class("LlamaForCausalLM")
            model = cls(d, gguf.LlamaFileType.GUESSED, d / "out.gguf", dry_run=True)
            results.append({"name": name, "tensors": [[f, n, t, list(s)] for f, n, t, s in tensors],
                            "file_type": int(model.ftype), "label": model.ftype.name.partition("_")[2]})
    return results


# --- Recording.

def q8_0_table(ref: Reference) -> list:
    table = []
    for name, bits in special_blocks():
        out = ref.quantized(lanes_bytes(bits), "F32", "Q8_0")
        table.append({"name": name, "input": [f"{b:08x}" for b in bits], "output": out.hex()})
    return table


def bf16_table(ref: Reference) -> list:
    out = ref.quantized(lanes_bytes(b for _, b in BF16_SPECIALS), "F32", "BF16", row=1)
    return [{"name": name, "input": f"{bits:08x}",
             "output": f"{int.from_bytes(out[2 * i:2 * i + 2], 'little'):04x}"}
            for i, (name, bits) in enumerate(BF16_SPECIALS)]


def record_everything(ref: Reference) -> dict:
    np, torch = ref.np, ref.torch
    patterns = all_16_bit_patterns()
    shuffled = [shuffled_16_bit_patterns(i) for i in range(SHUFFLES)]
    parts = [(name, make()) for name, make in SAMPLE_PARTS]
    sample = b"".join(data for _, data in parts)
    f32_parts = {}
    for name, data in parts:
        f32_parts[name] = {"lanes": len(data) // 4, "input_sha256": sha256(data),
                           "q8_0_sha256": sha256(ref.quantized(data, "F32", "Q8_0")),
                           "bf16_sha256": sha256(ref.quantized(data, "F32", "BF16"))}
    return {
        "what": "llama.cpp's output bytes (torch/numpy via gguf.quants.quantize) for BF16 and Q8_0, "
                "and the rules that pick the output types",
        "command": COMMAND,
        "reference": {"llama.cpp": str(REF.relative_to(HERE.parent)) if REF.is_relative_to(HERE.parent) else str(REF),
                      "numpy": np.__version__, "torch": torch.__version__,
                      "python": platform.python_version(), "machine": platform.machine(),
                      "numpy_simd_found": np.__config__.CONFIG["SIMD Extensions"]["found"]},
        "all_16_bit_patterns": {
            "input": "the 65,536 values 0..65535 as little-endian uint16, in order",
            "input_sha256": sha256(patterns),
            "bf16_to_bf16_sha256": sha256(ref.quantized_consistently(patterns, "BF16", "BF16")),
            "f16_to_bf16_sha256": sha256(ref.quantized_consistently(patterns, "F16", "BF16")),
            "bf16_to_q8_0_sha256": sha256(ref.quantized_consistently(patterns, "BF16", "Q8_0")),
            "f16_to_q8_0_sha256": sha256(ref.quantized_consistently(patterns, "F16", "Q8_0")),
        },
        "shuffled_16_bit_patterns": [
            {"input_sha256": sha256(s),
             "bf16_to_q8_0_sha256": sha256(ref.quantized(s, "BF16", "Q8_0")),
             "f16_to_q8_0_sha256": sha256(ref.quantized(s, "F16", "Q8_0"))} for s in shuffled],
        "f32_sample": {
            "definition": {"seed": SEED.decode(), "uniform_lanes": UNIFORM_LANES,
                           "weight_lanes": WEIGHT_LANES, "weight_centers": list(WEIGHT_CENTERS),
                           "half_scales": list(HALF_SCALES), "near_blocks": NEAR_BLOCKS,
                           "parts": [name for name, _ in parts],
                           "see": "the docstring of oracle/quant_oracle.py"},
            "lanes": len(sample) // 4,
            "input_sha256": sha256(sample),
            "q8_0_sha256": sha256(ref.quantized_consistently(sample, "F32", "Q8_0")),
            "bf16_sha256": sha256(ref.quantized_consistently(sample, "F32", "BF16")),
            "parts": f32_parts,
        },
        "bf16_sample": {
            "definition": {"near_exponents": list(BF16_NEAR_EXPONENTS),
                           "parts": [name for name, _ in BF16_PARTS],
                           "see": "the docstring of oracle/quant_oracle.py"},
            "parts": {name: {"lanes": len(data) // 2, "input_sha256": sha256(data),
                             "q8_0_sha256": sha256(ref.quantized_consistently(data, "BF16", "Q8_0"))}
                      for name, data in ((name, make()) for name, make in BF16_PARTS)},
        },
        "q8_0_by_numpy_simd_lanes": q8_0_by_lanes(),
        "specials": {"q8_0_blocks": q8_0_table(ref), "f32_to_bf16": bf16_table(ref)},
        "rules": rules(ref),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="store_true", help=f"write {RECORDED.relative_to(HERE.parent)}")
    p.add_argument("--lanes-probe", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.lanes_probe:
        return lanes_probe()
    import warnings
    warnings.simplefilter("ignore")     # numpy's "invalid value encountered" on NaN blocks
    with tempfile.TemporaryDirectory() as scratch:
        recorded = record_everything(Reference(Path(scratch)))
    kernels_oracle.emit_record(recorded, RECORDED, args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
