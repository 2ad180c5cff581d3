#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fuzzes bankml_convert with hostile and broken model directories (project issue 5).

    python3 oracle/fuzz.py --inputs N --seed S [--workers W] [--report FILE] [--progress FILE]
    python3 oracle/fuzz.py --seed S --replay INDEX [--only K] [--keep DIR]

Every input starts from a valid tiny model directory written by make_models.py and gets one to
three mutations, all drawn from random.Random(f"{seed}/{index}/{k}"), so an input is reproduced by
its seed and index alone (and a single mutation k of it by --only K).  Each input is converted in
this process (bankml_convert is imported once) and classified:

  success  convert() returned, the output exists, no .part is left, nothing else changed;
  refusal  a Refusal with a one-line reason, nothing written, no .part;
  crash    any other exception, a Refusal whose reason is empty or spans lines, a hang past
           --timeout, or a MemoryError past --memory-mb.

A partial output is any input that leaves the work directory different from before in anything
but the output file of a success (a .part, an output after a refusal, a changed input).  The last
line is ``fuzz: N inputs, C crashes (U unique), P partial outputs, S successes, R refusals``; the
exit status is 1 if there was a crash or a partial output.  Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

ORACLE = Path(__file__).resolve().parent
ROOT = ORACLE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ORACLE))

import bankml_convert as bc  # noqa: E402
import make_models as mm  # noqa: E402

CONVERTER_FILE = Path(bc.__file__).name
# The converter may be edited while a long campaign runs; the report names the version imported.
CONVERTER_SHA256 = hashlib.sha256(Path(bc.__file__).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Base directories: valid tiny models the mutations start from, each converting successfully.
# Tiny dims keep a success near 0.1 s; the 49,152-token vocabulary fixes the embedding's rows.
# ---------------------------------------------------------------------------------------------

TINY = mm.Dims(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1)

# (case, weight): the plain BF16 file is the most common start; the rest cover shards, dtypes,
# untied output, head_dim, sampling keys and the other tokenizer layouts the converter accepts.
BASES: tuple[tuple[mm.Case, int], ...] = (
    (mm.Case("fuzz-bf16", special_values=True, dims=TINY), 30),
    (mm.Case("fuzz-f16", dtype="F16", special_values=True, dims=TINY), 8),
    (mm.Case("fuzz-f32", dtype="F32", special_values=True, dims=TINY), 8),
    (mm.Case("fuzz-sharded", shards=3, dims=TINY), 15),
    (mm.Case("fuzz-shuffled", shuffle=True, dims=TINY), 4),
    (mm.Case("fuzz-untied", tied=False, dims=TINY), 5),
    (mm.Case("fuzz-head-dim", head_dim=8, dims=TINY), 5),
    (mm.Case("fuzz-sampling", sampling="sampling", dims=TINY), 7),
    (mm.Case("fuzz-no-generation-config", sampling="none", dims=TINY), 4),
    (mm.Case("fuzz-resaved", tokenizer="smollm2-135m-instruct-resaved-transformers-5", dims=TINY), 7),
    (mm.Case("fuzz-base", tokenizer="smollm2-135m", config_from="SmolLM2-135M", dims=TINY), 6),
)
BASE_NAMES = tuple(c.name for c, _ in BASES)


def build_bases(root: Path) -> dict[str, Path]:
    """Every base directory under root, checked to convert; read-only from here on (inputs hard-link it)."""
    bases = {}
    for case, _ in BASES:
        d = mm.make_case(case, root)
        out = root / f"{case.name}.check.gguf"
        bc.convert(d, out, bc.Options())
        out.unlink()
        bases[case.name] = d
    return bases


def tree_fingerprint(root: Path, with_hash: bool = False) -> dict[str, tuple]:
    """Every entry under root by relative path: (kind, size, mtime_ns[, sha256]); dirs by kind alone."""
    result: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                result[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                result[rel] = ("dir",)
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest() if with_hash else ""
                result[rel] = ("file", st.st_size, st.st_mtime_ns, digest)
            else:
                result[rel] = ("other", stat.S_IFMT(st.st_mode))
    return result


# ---------------------------------------------------------------------------------------------
# An input: a copy of a base (hard links for files no mutation touches) plus how convert() is
# called; the mutations edit this context and return a one-line description of what they did.
# ---------------------------------------------------------------------------------------------

@dataclass
class Ctx:
    rng: random.Random
    dir: Path              # the model directory as it exists
    out: Path              # the output argument (may hold a template)
    dir_arg: str           # how the directory is passed to convert() (cwd is the run directory)
    model_name: Optional[str] = None
    outtype: str = "f16"

    def files(self) -> list[str]:
        try:
            return sorted(os.listdir(self.dir))
        except OSError:
            return []


def put(path: Path, data: bytes) -> None:
    """Write data as a new file: never through a hard link into a base."""
    remove(path)
    with open(path, "wb") as f:
        f.write(data)


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def link_base(base: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for name in os.listdir(base):
        os.link(base / name, dest / name)


def chance(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def weighted(rng: random.Random, pairs):
    items, weights = zip(*pairs)
    return rng.choices(items, weights=weights)[0]


# ---------------------------------------------------------------------------------------------
# JSON values: the pool a mutation draws replacements from, including text json.dumps cannot
# produce (NaN, 1e400, 5,000-digit integers, deep nesting), spliced in through marker strings.
# ---------------------------------------------------------------------------------------------

class Raw:
    """JSON text spliced in verbatim where a marker string stands in the document."""
    def __init__(self, text: str):
        self.text = text


class Dup:
    """A key written a second time (with another value) in the object that holds this marker."""
    def __init__(self, key: str):
        self.key = key


SCALARS: tuple = (
    None, True, False, 0, 1, -1, 2, 3, 7, 8, 16, 49152, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
    2**63 - 1, 2**63, 2**64, -2**31, -2**63, 10**30, 0.0, -0.0, 0.5, 1e-6, 1.5, 3.4e38, 3.5e38,
    1e308, 5e-324, "", "a", "0", "8", "true", "null", "\ud800", "\udfff", "\udcff", "\x00", "\n",
    "a\nb", "\u2028", "\u00e9", "\U0001f4a5", "x" * 5000, "LlamaForCausalLM", "llama", "BPE",
    "GPT2Tokenizer", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "F16", "BF16", "default",
    "Sequence", "ByteLevel", "TemplateProcessing", "{{ bos_token }}", "{% for m in messages %}",
)
CONTAINERS: tuple = (
    [], [None], [1], [0, 1], ["LlamaForCausalLM"], [[]], ["a", "b"], [{"Sequence": {"id": "A"}}],
    {}, {"type": "Sequence"}, {"type": "ByteLevel"}, {"content": "<|im_end|>"}, {"a": {"b": {}}},
    {"rope_type": "llama3", "factor": 8.0}, {"type": "Sequence", "processors": []},
    {"type": "Sequence", "pretokenizers": [{"type": "Sequence", "pretokenizers": []}]},
)
RAW_TEXTS: tuple = (
    "NaN", "-NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" * 4301, "-" + "9" * 5000,
    "1E+2", "-0", "0.0e0", "1" + "0" * 5000 + ".5", "[" * 64 + "]" * 64, "[" * 400 + "]" * 400,
    "[" * 900 + "]" * 900, "[" * 3000 + "]" * 3000, "[" * 100000 + "]" * 100000,
    '{"a":' * 500 + "1" + "}" * 500, '{"type":"Sequence","pretokenizers":[' * 300 + "]}" * 300,
    "[" + "1," * 100000 + "1]", '"\\ud800"', '"\\udc00\\ud800"', '"\\u0000"',
)


def tweak(rng: random.Random, value):
    """A neighbour of value of (mostly) the same type."""
    if isinstance(value, bool):
        return rng.choice([not value, 0, 1, "true", None])
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, -value, value * 2, value // 2, 0, value * 1000,
                           float(value), str(value), True, value + 2**32])
    if isinstance(value, float):
        return rng.choice([0.0, -value, value * 1e10, value * 1e-10, int(value), str(value),
                           Raw("NaN"), Raw("Infinity")])
    if isinstance(value, str):
        return rng.choice(["", value + "x", value[:-1], value.upper(), value + "\n", value + "\ud800",
                           value * 2, " " + value, value.replace("<", "["), value + "\x00"])
    if isinstance(value, list):
        return rng.choice([[], value[:-1], value + value[:1], value[::-1], [value], value + [None],
                           value[1:]])
    if isinstance(value, dict):
        if value and chance(rng, 0.6):
            drop = rng.choice(list(value))
            return {k: v for k, v in value.items() if k != drop}
        return rng.choice([{}, {**value, "type": "Sequence"}, {"x": value}, list(value.values())])
    return rng.choice(SCALARS)


def draw_value(rng: random.Random, current=None):
    r = rng.random()
    if current is not None and r < 0.35:
        return tweak(rng, current)
    if r < 0.75:
        return rng.choice(SCALARS)
    if r < 0.88:
        return json.loads(json.dumps(rng.choice(CONTAINERS)))
    return Raw(rng.choice(RAW_TEXTS))


def short(value, limit: int = 60) -> str:
    text = value.text if isinstance(value, Raw) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def dumps(doc, rng: random.Random, indent=None) -> bytes:
    """doc as JSON bytes with Raw/Dup markers spliced in; lone surrogates escaped or written raw."""
    splices: list[tuple[str, str]] = []

    def marked(node):
        if isinstance(node, Raw):
            m = f"@@RAW{len(splices)}@@"
            splices.append((json.dumps(m), node.text))
            return m
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if isinstance(k, Dup):
                    m = f"@@DUP{len(splices)}@@"
                    splices.append((json.dumps(m), json.dumps(k.key)))
                    out[m] = marked(v)
                else:
                    out[k] = marked(v)
            return out
        if isinstance(node, list):
            return [marked(v) for v in node]
        return node

    ensure_ascii = chance(rng, 0.7)
    text = json.dumps(marked(doc), indent=indent, ensure_ascii=ensure_ascii)
    for marker, replacement in splices:
        text = text.replace(marker, replacement, 1)
    return text.encode("utf-8", "surrogatepass")


def json_paths(rng: random.Random, doc, limit: int = 48) -> list[tuple]:
    """Paths to nodes of doc; a container with more than `limit` children contributes a sample."""
    paths: list[tuple] = []
    stack = [((), doc)]
    while stack:
        path, node = stack.pop()
        paths.append(path)
        if isinstance(node, dict):
            items = list(node.items())
        elif isinstance(node, list):
            items = list(enumerate(node))
        else:
            continue
        if len(items) > limit:
            items = rng.sample(items, 8)
        stack.extend((path + (k,), v) for k, v in items)
    return paths


def get_at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def set_at(doc, path, value):
    if not path:
        return value
    get_at(doc, path[:-1])[path[-1]] = value
    return doc


def path_text(path: tuple) -> str:
    return "$" + "".join(f"[{k!r}]" if not isinstance(k, int) else f"[{k}]" for k in path)


# Keys each file's readers look at, so that insertions hit code instead of being ignored.
INTERESTING_KEYS: dict[str, tuple[str, ...]] = {
    "config.json": (
        "architectures", "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "num_hidden_layers", "max_position_embeddings", "intermediate_size", "rope_theta",
        "rope_parameters", "rope_scaling", "rms_norm_eps", "head_dim", "vocab_size", "is_causal",
        "attention_bias", "mlp_bias", "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id",
        "unk_token_id", "sep_token_id", "mask_token_id", "cls_token_id", "text_config",
        "quantization_config", "tie_word_embeddings", "n_layer", "dim", "torch_dtype"),
    "generation_config.json": (
        "sequence", "top_k", "top_p", "min_p", "xtc_probability", "xtc_threshold", "temperature",
        "penalty_last_n", "penalty_repeat", "repetition_penalty", "mirostat", "mirostat_tau",
        "mirostat_eta", "bos_token_id", "eos_token_id"),
    "tokenizer_config.json": (
        "add_prefix_space", "added_tokens_decoder", "bos_token", "eos_token", "unk_token", "pad_token",
        "sep_token", "cls_token", "mask_token", "additional_special_tokens", "extra_special_tokens",
        "chat_template", "tokenizer_class", "fast_tokenizer_files", "add_bos_token", "add_eos_token",
        "add_sep_token", "image_token", "model_max_length"),
    "special_tokens_map.json": (
        "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token",
        "additional_special_tokens", "extra_special_tokens"),
    "tokenizer.json": (
        "model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder",
        "truncation", "padding"),
    "model.safetensors.index.json": ("weight_map", "metadata"),
}

# Names a chosen JSON file by weight; a file the directory lacks is skipped.
JSON_FILES = (("config.json", 30), ("generation_config.json", 10), ("tokenizer_config.json", 22),
              ("special_tokens_map.json", 8), ("tokenizer.json", 8),
              ("model.safetensors.index.json", 6))


def mutate_json_doc(rng: random.Random, doc, file_name: str):
    """(new doc, description) after one structural edit of doc."""
    paths = json_paths(rng, doc)
    op = weighted(rng, (("replace", 40), ("delete", 18), ("insert", 22), ("wrap", 5),
                        ("duplicate", 6), ("root", 3), ("raw", 6)))
    if op == "insert":
        dicts = [p for p in paths if isinstance(get_at(doc, p), dict)]
        if dicts:
            p = () if chance(rng, 0.6) and isinstance(doc, dict) else rng.choice(dicts)
            key = rng.choice(INTERESTING_KEYS.get(file_name, ("x",)) + ("x", "", "\ud800"))
            value = draw_value(rng)
            get_at(doc, p)[key] = value
            return doc, f"set {path_text(p + (key,))} = {short(value)}"
        op = "replace"
    if op == "duplicate":
        dicts = [p for p in paths if isinstance(get_at(doc, p), dict) and get_at(doc, p)]
        if dicts:
            p = rng.choice(dicts)
            node = get_at(doc, p)
            key = rng.choice(list(node))
            value = draw_value(rng, node[key])
            node[Dup(key)] = value
            return doc, f"duplicate key {path_text(p + (key,))}, second value {short(value)}"
        op = "replace"
    if op == "root":
        value = draw_value(rng)
        return value, f"root replaced by {short(value)}"
    inner = [p for p in paths if p] or [()]
    # Long lists (added tokens, their flags) would otherwise take most picks; half of them go to
    # the top two levels, where the keys the readers branch on are.
    shallow = [p for p in inner if len(p) <= 2]
    p = rng.choice(shallow if shallow and chance(rng, 0.5) else inner)
    if op == "delete" and p:
        parent = get_at(doc, p[:-1])
        del parent[p[-1]]
        return doc, f"delete {path_text(p)}"
    current = get_at(doc, p)
    if op == "wrap":
        value = rng.choice([[current], {"x": current}, [[[current]]]])
        return set_at(doc, p, value), f"wrap {path_text(p)} in {short(value, 20)}"
    value = Raw(rng.choice(RAW_TEXTS)) if op == "raw" else draw_value(rng, current)
    return set_at(doc, p, value), f"replace {path_text(p)} ({short(current, 30)}) with {short(value)}"


# ---------------------------------------------------------------------------------------------
# Mutations of JSON files: structural edits of the parsed document, or raw byte damage.
# ---------------------------------------------------------------------------------------------

def pick_json_file(ctx: Ctx) -> Optional[str]:
    present = [(n, w) for n, w in JSON_FILES if (ctx.dir / n).is_file()]
    return weighted(ctx.rng, present) if present else None


def mutate_json_structure(ctx: Ctx) -> Optional[str]:
    rng = ctx.rng
    name = pick_json_file(ctx)
    if name is None:
        return None
    path = ctx.dir / name
    try:
        doc = json.loads(path.read_bytes())
        new, what = mutate_json_doc(rng, doc, name)
        data = dumps(new, rng, indent=rng.choice([None, 2]))
    except (ValueError, RecursionError, TypeError, KeyError, IndexError):
        return mutate_json_bytes(ctx, name)
    put(path, data)
    return f"{name}: {what}"


def byte_damage(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """data with one kind of byte-level damage, and what was done."""
    n = len(data)
    op = rng.choice(["truncate", "flip", "insert", "delete", "bom", "utf16", "empty", "garbage",
                     "repeat", "latin1", "nul"])
    at = rng.randrange(n + 1) if n else 0
    if op == "truncate":
        return data[:at], f"truncated to {at} of {n} bytes"
    if op == "flip" and n:
        i = rng.randrange(n)
        b = rng.choice([0x00, 0xFF, 0xC0, 0x80, 0x22, 0x5C, 0x7B, 0x5D, data[i] ^ (1 << rng.randrange(8))])
        return data[:i] + bytes([b]) + data[i + 1:], f"byte {i} set to 0x{b:02x}"
    if op == "insert":
        junk = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b",", b"}", b"\"", b"\\u", b"1e999"])
        return data[:at] + junk + data[at:], f"inserted {junk!r} at byte {at}"
    if op == "delete" and n:
        end = min(n, at + rng.randrange(1, 64))
        return data[:at] + data[end:], f"deleted bytes {at}..{end}"
    if op == "bom":
        return b"\xef\xbb\xbf" + data, "UTF-8 byte order mark prepended"
    if op == "utf16":
        try:
            return data.decode("utf-8").encode("utf-16"), "re-encoded as UTF-16"
        except UnicodeDecodeError:
            pass
    if op == "empty":
        return b"", "emptied (0 bytes)"
    if op == "garbage":
        junk = rng.randbytes(rng.choice([1, 7, 8, 64, 4096]))
        return junk, f"replaced by {len(junk)} random bytes"
    if op == "repeat":
        return data + data, "contents written twice"
    if op == "latin1":
        try:
            return data.decode("utf-8").encode("latin-1", "replace") + "\u00e9".encode("latin-1"), \
                "re-encoded as Latin-1 (with a trailing 0xe9)"
        except UnicodeDecodeError:
            pass
    return data + b"\x00", "NUL byte appended"


def mutate_json_bytes(ctx: Ctx, name: Optional[str] = None) -> Optional[str]:
    name = name or pick_json_file(ctx)
    if name is None:
        return None
    path = ctx.dir / name
    data, what = byte_damage(ctx.rng, path.read_bytes())
    put(path, data)
    return f"{name}: {what}"


# ---------------------------------------------------------------------------------------------
# Mutations of safetensors files: header JSON edits (with the length field kept right or not),
# consistent re-layouts of the data, and raw damage to the length field, header and data.
# ---------------------------------------------------------------------------------------------

@dataclass
class Safetensors:
    header: dict          # the parsed header, key order kept
    data: bytes           # everything after the header
    header_len: int

    def tensors(self) -> list[str]:
        return [k for k, v in self.header.items() if k != "__metadata__" and isinstance(v, dict)]


def read_st(path: Path) -> Optional[Safetensors]:
    if not path.is_file():  # a FIFO would block the reader forever
        return None
    try:
        raw = path.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(header, dict) or len(raw) < 8 + n:
        return None
    return Safetensors(header, raw[8 + n:], n)


def write_st(path: Path, st: Safetensors, rng: random.Random, pad: bytes = b" ",
             length_delta: int = 0) -> None:
    text = dumps(st.header, rng) if not isinstance(st.header, bytes) else st.header
    if pad:
        text += pad * (-len(text) % 8)
    put(path, struct.pack("<Q", len(text) + length_delta) + text + st.data)


def relayout(st: Safetensors, pieces: list[tuple[str, dict, bytes]]) -> Safetensors:
    """A consistent file from (name, meta, bytes) in data order; metadata kept first."""
    header: dict = {}
    if "__metadata__" in st.header:
        header["__metadata__"] = st.header["__metadata__"]
    offset = 0
    for name, meta, data in pieces:
        header[name] = {**meta, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    return Safetensors(header, b"".join(d for _, _, d in pieces), 0)


def st_pieces(st: Safetensors) -> list[tuple[str, dict, bytes]]:
    items = [(k, v) for k, v in st.header.items() if k != "__metadata__"]
    items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, {"dtype": v["dtype"], "shape": v["shape"]},
             st.data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in items]


DTYPE_POOL = ("F16", "BF16", "F32", "I32", "I64", "F64", "U8", "I8", "BOOL", "F8_E4M3", "bf16", "f16",
              "", None, 0, 2, ["F16"], {"F16": 1}, True, "F16\x00", "\ud800")
NAME_POOL = ("", "__metadata__", "model.layers.99.mlp.up_proj.weight", "model.layers.01.mlp.up_proj.weight",
             "model.layers.0.self_attn.rotary_emb.inv_freq", "model.embed_tokens.weight", "lm_head.weight",
             "model.norm.weight", "model.layers.0.mlp.up_proj.bias", "model.embed_tokens.weight\n",
             "\ud800", "model.layers.-1.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight",
             "model.layers.9999999999.mlp.up_proj.weight", "x" * 10000, "model.norm.weight ",
             "model.layers.0.attention.bias", "model.layers.0.self_attn.q_proj.weight")


def element_size(dtype) -> int:
    return {"F16": 2, "BF16": 2, "F32": 4}.get(dtype, 2) if isinstance(dtype, str) else 2


def mutate_safetensors_header(ctx: Ctx) -> Optional[str]:
    rng = ctx.rng
    files = [n for n in ctx.files() if n.endswith(".safetensors") and (ctx.dir / n).is_file()]
    if not files:
        return None
    name = rng.choice(files)
    path = ctx.dir / name
    st = read_st(path)
    if st is None or not st.tensors():
        return safetensors_bytes(ctx, name)
    tensors = st.tensors()
    t = rng.choice(tensors)
    meta = st.header[t]
    op = weighted(rng, (("dtype", 12), ("shape", 12), ("offsets", 12), ("entry", 5), ("rename", 10),
                        ("forget", 5), ("drop", 6), ("add", 7), ("retype", 8), ("reorder", 4),
                        ("metadata", 5), ("root", 2), ("raw", 7), ("duplicate", 4), ("pad", 3),
                        ("length", 4)))
    pad, delta = b" ", 0
    if op == "dtype":
        value = rng.choice(DTYPE_POOL)
        meta["dtype"] = value
        what = f"tensor {t!r} dtype -> {short(value)}"
    elif op == "shape":
        shape = meta["shape"]
        value = rng.choice([[], [0], [-1], [1.0], ["8"], [True], None, "8", {}, [2**64], [10**30] * 9,
                            shape[::-1], shape + [1], shape[:-1], [1] + shape, [0] + shape,
                            [x * 2 for x in shape], [int(v) for v in shape] + [0], [2**63, 0],
                            [1] * 9, [shape[0] * (shape[1] if len(shape) > 1 else 1)]])
        meta["shape"] = value
        what = f"tensor {t!r} shape {shape} -> {short(value)}"
    elif op == "offsets":
        a, b = meta["data_offsets"]
        value = rng.choice([[0, 0], [-1, b], [b, a], [a, b + 2], [a, b - 2], [a + 2, b + 2], [a - 2, b - 2],
                            [a, b, b], [a], None, [float(a), b], [str(a), str(b)], [2**64, 2**64 + b - a],
                            [a, 2**63], [True, b], {"0": a}, [a, len(st.data) + 1]])
        meta["data_offsets"] = value
        what = f"tensor {t!r} data_offsets {[a, b]} -> {short(value)}"
    elif op == "entry":
        value = draw_value(rng)
        st.header[t] = value
        what = f"tensor {t!r} entry replaced by {short(value)}"
    elif op == "rename":
        new = rng.choice(NAME_POOL + (t.upper(), t + "x", t.replace("weight", "weight.weight")))
        st.header = {(new if k == t else k): v for k, v in st.header.items()} if new not in st.header \
            else {**{k: v for k, v in st.header.items()}, Dup(new): meta}
        what = f"tensor {t!r} renamed {short(new)}"
    elif op == "forget":
        del st.header[t]
        what = f"tensor {t!r} removed from the header (its bytes stay)"
    elif op in ("drop", "add", "retype", "reorder"):
        try:
            pieces = st_pieces(st)
        except (KeyError, TypeError, IndexError):
            return None
        i = next(k for k, (n, _, _) in enumerate(pieces) if n == t)
        if op == "drop":
            del pieces[i]
            what = f"tensor {t!r} removed with its bytes (file consistent)"
        elif op == "add":
            new = rng.choice(["model.layers.0.self_attn.rotary_emb.inv_freq", "lm_head.weight",
                              "model.layers.1.attention.masked_bias", "model.layers.0.mlp.gate_proj.bias",
                              "model.embed_tokens.weight.extra", "model.layers.2.input_layernorm.weight"])
            src = pieces[i]
            if new in st.header:
                return None
            pieces.insert(rng.randrange(len(pieces) + 1), (new, dict(src[1]), src[2]))
            what = f"tensor {new!r} added as a copy of {t!r} (file consistent)"
        elif op == "retype":
            old = pieces[i][1]["dtype"]
            dtype = rng.choice([d for d in ("F16", "BF16", "F32") if d != old])
            count = len(pieces[i][2]) // element_size(old)
            fill = rng.choice(["random", "zeros", "nan", "inf"])
            size = element_size(dtype)
            if fill == "random":
                data = rng.randbytes(count * size)
            elif fill == "zeros":
                data = bytes(count * size)
            else:
                word = {("F32", "nan"): b"\x01\x00\xc0\x7f", ("F32", "inf"): b"\x00\x00\x80\xff",
                        ("F16", "nan"): b"\x01\x7e", ("F16", "inf"): b"\x00\xfc",
                        ("BF16", "nan"): b"\x81\x7f", ("BF16", "inf"): b"\x80\xff"}[(dtype, fill)]
                data = word * count
            pieces[i] = (t, {**pieces[i][1], "dtype": dtype}, data)
            what = f"tensor {t!r} {old} -> {dtype} with {fill} data (file consistent)"
        else:
            rng.shuffle(pieces)
            what = "data re-laid out in a shuffled order (file consistent)"
        st = relayout(st, pieces)
    elif op == "metadata":
        value = rng.choice([None, [], "pt", 1, {"format": "pt", "x": {"y": [1, 2]}}, {"format": 5},
                            Raw("[" * 900 + "]" * 900), {"format": "\ud800"}])
        if chance(rng, 0.3) and "__metadata__" in st.header:
            del st.header["__metadata__"]
            what = "__metadata__ removed"
        else:
            st.header["__metadata__"] = value
            what = f"__metadata__ -> {short(value)}"
    elif op == "root":
        value = rng.choice([[], [st.header], "x", 1, None, Raw("[" * 100000 + "]" * 100000), {}])
        st.header = value
        what = f"header root -> {short(value)}"
    elif op == "raw":
        field_name = rng.choice(["dtype", "shape", "data_offsets"])
        text = rng.choice(RAW_TEXTS + ("[" + "9" * 5000 + ",1]", "[0, 1e400]", "[NaN, 1]", "[8, Infinity]"))
        meta[field_name] = Raw(text)
        what = f"tensor {t!r} {field_name} -> raw {short(Raw(text))}"
    elif op == "duplicate":
        other = rng.choice(tensors)
        st.header[Dup(t)] = dict(st.header[other])
        what = f"tensor {t!r} named twice (second entry is {other!r}'s)"
    elif op == "pad":
        pad = rng.choice([b"\t", b"\n", b"\x00", b"", b"\xff", b"}"])
        what = f"header padded with {pad!r} instead of spaces"
    else:
        delta = rng.choice([-1, 1, -8, 8])
        what = f"header length field off by {delta}"
    write_st(path, st, rng, pad, delta)
    return f"{name}: {what}"


def safetensors_bytes(ctx: Ctx, name: Optional[str] = None) -> Optional[str]:
    rng = ctx.rng
    if name is None:
        files = [n for n in ctx.files() if n.endswith(".safetensors") and (ctx.dir / n).is_file()]
        if not files:
            return None
        name = rng.choice(files)
    path = ctx.dir / name
    raw = path.read_bytes()
    size = len(raw)
    hl = int.from_bytes(raw[:8], "little") if size >= 8 else 0
    op = rng.choice(["length", "length", "truncate", "append", "flip-header", "flip-data", "insert-header",
                     "short", "prefix-only", "empty"])
    if op == "length":
        value = rng.choice([0, 1, 2, 7, hl - 1, hl + 1, size - 8, size - 7, size, 2**63, 2**64 - 1,
                            bc.MAX_SAFETENSORS_HEADER, bc.MAX_SAFETENSORS_HEADER + 1, rng.randrange(size + 1)])
        value = max(0, min(value, 2**64 - 1))
        data, what = struct.pack("<Q", value) + raw[8:], f"header length field {hl} -> {value}"
    elif op == "truncate":
        at = rng.choice([0, 4, 8, 9, 8 + hl // 2, 8 + hl, 8 + hl + 1, size - 1, size - 2, rng.randrange(size)])
        data, what = raw[:at], f"truncated to {at} of {size} bytes"
    elif op == "append":
        extra = rng.choice([b"\x00", b"\x00\x00", b" ", bytes(1000), b"GGUF"])
        data, what = raw + extra, f"{len(extra)} trailing bytes appended"
    elif op == "flip-header" and hl:
        i = 8 + rng.randrange(min(hl, size - 8))
        b = rng.choice([0x00, 0xFF, 0x80, 0x22, 0x7D, 0x5B, 0x31, raw[i] ^ (1 << rng.randrange(8))])
        data, what = raw[:i] + bytes([b]) + raw[i + 1:], f"header byte {i} set to 0x{b:02x}"
    elif op == "flip-data" and size > 8 + hl:
        i = rng.randrange(8 + hl, size)
        b = rng.randrange(256)
        data, what = raw[:i] + bytes([b]) + raw[i + 1:], f"data byte {i} set to 0x{b:02x}"
    elif op == "insert-header" and hl:
        i = 8 + rng.randrange(hl)
        junk = rng.choice([b" ", b"\xff", b"\x00", b"{", b"\"x\":1,"])
        data, what = raw[:i] + junk + raw[i:], f"{junk!r} inserted in the header at byte {i}, length not fixed"
    elif op == "short":
        data, what = raw[:rng.randrange(1, 8)], "cut to fewer than 8 bytes"
    elif op == "prefix-only":
        data, what = raw[:8], "only the 8-byte length field left"
    else:
        data, what = b"", "emptied (0 bytes)"
    put(path, data)
    return f"{name}: {what}"


# ---------------------------------------------------------------------------------------------
# Mutations of the directory: files missing, turned into directories, symlinks, FIFOs or empty
# files; safetensors renamed or duplicated; extra files llama.cpp reads (model card, templates).
# ---------------------------------------------------------------------------------------------

FILE_TARGETS = (("config.json", 20), ("tokenizer.json", 12), ("tokenizer_config.json", 12),
                ("generation_config.json", 8), ("special_tokens_map.json", 6), ("safetensors", 24),
                ("model.safetensors.index.json", 8), ("vocab.json", 2), ("merges.txt", 2),
                ("chat_template.jinja", 3), ("any", 3))


def pick_file(ctx: Ctx) -> Optional[str]:
    names = ctx.files()
    if not names:
        return None
    target = weighted(ctx.rng, FILE_TARGETS)
    if target == "safetensors":
        candidates = [n for n in names if n.endswith(".safetensors")]
    elif target == "any":
        candidates = names
    else:
        candidates = [target] if target in names else []
    return ctx.rng.choice(candidates) if candidates else ctx.rng.choice(names)


def mutate_file_kind(ctx: Ctx) -> Optional[str]:
    rng = ctx.rng
    name = pick_file(ctx)
    if name is None:
        return None
    path = ctx.dir / name
    others = [n for n in ctx.files() if n != name]
    op = rng.choice(["delete", "delete", "dir", "dir-with-file", "empty", "symlink-other", "symlink-dangling",
                     "symlink-loop", "symlink-dir", "symlink-devnull", "fifo", "copy-as", "rename"])
    if op == "delete":
        remove(path)
        return f"{name}: deleted"
    if op == "dir":
        remove(path)
        path.mkdir()
        return f"{name}: replaced by an empty directory"
    if op == "dir-with-file":
        remove(path)
        path.mkdir()
        (path / "x").write_bytes(b"{}")
        return f"{name}: replaced by a directory holding a file"
    if op == "empty":
        put(path, b"")
        return f"{name}: emptied (0 bytes)"
    if op == "symlink-other" and others:
        target = rng.choice(others)
        remove(path)
        os.symlink(target, path)
        return f"{name}: symlink to {target}"
    if op == "symlink-dangling":
        remove(path)
        os.symlink("does-not-exist", path)
        return f"{name}: dangling symlink"
    if op == "symlink-loop":
        remove(path)
        os.symlink(name, path)
        return f"{name}: symlink to itself (loop)"
    if op == "symlink-dir":
        remove(path)
        os.symlink(".", path)
        return f"{name}: symlink to the directory itself"
    if op == "symlink-devnull":
        remove(path)
        os.symlink("/dev/null", path)
        return f"{name}: symlink to /dev/null"
    if op == "fifo":
        remove(path)
        os.mkfifo(path)
        return f"{name}: replaced by a FIFO"
    if op == "copy-as":
        new = rng.choice(["model-extra.safetensors", "model.safetensors", "model-00001-of-00003.safetensors",
                          "modelx.safetensors", "config.json", "tokenizer.json", "model.safetensors.index.json"])
        if new == name or not path.is_file():
            return None
        put(ctx.dir / new, path.read_bytes())
        return f"{name}: copied to {new}"
    new = rng.choice(["model.bin", "Model.safetensors", "model.safetensors.bak", "model-00001-of-00001.safetensors",
                      "modelx.safetensors", "pytorch_model.bin", "model.safetensors", "model.gguf",
                      "tokenizer.model", "config.json"])
    if new == name:
        return None
    remove(ctx.dir / new)
    os.rename(path, ctx.dir / new)
    return f"{name}: renamed to {new}"


README_BODIES = (b"---\nlicense: apache-2.0\n---\n# m\n", b"---\r\nlicense: mit\r\n---\r\n", b"# A model\n",
                 b"", b"---", b"\xff\xfe---\n", b"--- \n", b"\n---\n")
EXTRA_FILES = (
    ("README.md", README_BODIES),
    ("additional_chat_templates", (b"{{ x }}", b"")),
    ("chat_template.jinja", (b"{{ messages }}", b"", b"\xff\xfe{{", b"{% for %}\x00", "\u2028".encode(),
                             b"\xed\xa0\x80")),
    ("chat_template.json", (b'{"chat_template": "{{ x }}"}', b'{"chat_template": ["a"]}', b"[]", b'"x"',
                            b"{", b'{"chat_template": null}', b'{"chat_template": 5}', b"null")),
    ("tokenizer.model", (b"", b"\x0a\x05hello")),
    ("added_tokens.json", (b'{"<x>": 49152}', b"{}")),
    ("vocab.json", (b"{}", b"")),
    ("merges.txt", (b"#version: 0.2\n", b"")),
    ("tekken.json", (b"{}",)),
)


def add_extra_file(ctx: Ctx) -> Optional[str]:
    rng = ctx.rng
    if chance(rng, 0.15):
        (ctx.dir / "additional_chat_templates").mkdir(exist_ok=True)
        put(ctx.dir / "additional_chat_templates" / "tool_use.jinja", b"{{ tools }}")
        if chance(rng, 0.7):
            put(ctx.dir / "chat_template.jinja", b"{{ messages }}")
        return "additional_chat_templates/tool_use.jinja added"
    name, bodies = rng.choice(EXTRA_FILES)
    body = rng.choice(bodies)
    put(ctx.dir / name, body)
    return f"{name}: written as {body[:40]!r}"


# ---------------------------------------------------------------------------------------------
# The shard index: weight_map entries pointing elsewhere, outside, at nothing or at non-files,
# added to a single-file model as often as edited in a sharded one.
# ---------------------------------------------------------------------------------------------

def index_for(ctx: Ctx) -> Optional[dict]:
    path = ctx.dir / "model.safetensors.index.json"
    if path.is_file():
        try:
            doc = json.loads(path.read_bytes())
        except ValueError:
            return None
        return doc if isinstance(doc, dict) and isinstance(doc.get("weight_map"), dict) else None
    weight_map = {}
    for n in ctx.files():
        if n.endswith(".safetensors"):
            st = read_st(ctx.dir / n)
            if st is not None:
                weight_map.update({t: n for t in st.tensors()})
    return {"metadata": {"total_size": 0}, "weight_map": weight_map} if weight_map else None


PART_POOL = ("../model.safetensors", "/etc/passwd", "", ".", "..", "model\n.safetensors", "\ud800",
             "\udcff.safetensors", "config.json", "missing.safetensors", "sub/model.safetensors",
             "model.safetensors\x00", "tokenizer.json", "model.safetensors.index.json", "a\\b.safetensors",
             "model.safetensors ", 5, None, ["model.safetensors"])


def mutate_index(ctx: Ctx) -> Optional[str]:
    rng = ctx.rng
    doc = index_for(ctx)
    if doc is None:
        return None
    created = not (ctx.dir / "model.safetensors.index.json").is_file()
    wm = doc["weight_map"]
    op = rng.choice(["none", "part", "part", "move", "drop", "add", "map", "empty", "keys"])
    what = "written for the existing files" if created else "unchanged"
    if op == "part" and wm:
        t = rng.choice(list(wm))
        wm[t] = rng.choice(PART_POOL)
        what = f"weight_map[{t!r}] -> {short(wm[t])}"
    elif op == "move" and wm:
        t = rng.choice(list(wm))
        parts = sorted({v for v in wm.values() if isinstance(v, str)})
        wm[t] = rng.choice(parts)
        what = f"weight_map[{t!r}] -> {wm[t]} (maybe another shard)"
    elif op == "drop" and wm:
        t = rng.choice(list(wm))
        del wm[t]
        what = f"weight_map[{t!r}] removed"
    elif op == "add" and wm:
        name = rng.choice(NAME_POOL)
        wm[name] = rng.choice(list(wm.values()))
        what = f"weight_map[{short(name)}] added"
    elif op == "map":
        doc["weight_map"] = rng.choice([None, [], "model.safetensors", {}, [list(wm.items())]])
        what = f"weight_map -> {short(doc['weight_map'])}"
    elif op == "empty":
        doc = {}
        what = "emptied to {}"
    elif op == "keys":
        doc["weight_map"] = {f"{k}": v for k, v in list(wm.items())[::-1]}
        what = "weight_map written in reverse order"
    put(ctx.dir / "model.safetensors.index.json", dumps(doc, rng, indent=2))
    return f"model.safetensors.index.json: {'created, ' if created else ''}{what}"


# ---------------------------------------------------------------------------------------------
# Names and arguments: the directory's name (general.name comes from it), how it is passed,
# the output name and its {ftype} template, an existing output or .part, --model-name, --outtype.
# ---------------------------------------------------------------------------------------------

DIR_NAMES = ("merged", "x\ny", "with space", "model\udcff", "-", "...", "a" * 200, "SmolLM2-135M-Instruct",
             "Llama-3-8B-Instruct-v0.1-Q4_K", "x-\u0663B", "ab-8x7B-chat", "v1-small-7B", "x-0B", "x-0.5K",
             "\t", " ", "x-7b1-lora", "org-1_5B-iter10", "{ftype}", "x-8k-chat", "--", "x--y",
             "\u00fcber-1.5B", "x-" + "9" * 400 + "B", "x-A3B-bf16", "\u0661\u0662B")
OUT_NAMES = ("model-{ftype}.gguf", "{outtype}.gguf", "{}.gguf", "{0}.gguf", "{1}.gguf", "{ftype.x}.gguf",
             "{ftype[0]}.gguf", "{0[x]}.gguf", "{ftype:>5}.gguf", "{ftype:>99999999999999999999}.gguf",
             "{ftype!z}.gguf", "{", "}", "{{x}}.gguf", "x\ny.gguf", "{FTYPE}.gguf", "{ftype.__class__}.gguf",
             "{ftype:>1000}.gguf", "{0:.0}", "{ftype:/<5}.gguf", "nul\x00.gguf", "\udcff.gguf", ".gguf", " ",
             "{ftype:\n<3}.gguf", "{ftype!r}.gguf", "{ftype:d}.gguf", "{ftype:%}.gguf")
MODEL_NAMES = ("", "\ud800", "x\ny", "a" * 100000, "\u00dcn\u00efcode", "\x00", " ")
OUTTYPES = ("F16", "q8_0", "f32", "bf16", "", "auto", "f16\n", "f16 ")


def mutate_names(ctx: Ctx) -> Optional[str]:
    rng = ctx.rng
    op = rng.choice(["dirname", "dirname", "dirarg", "outname", "outname", "out-exists", "part-exists",
                     "out-is-dir", "out-symlink-input", "out-symlink-loop", "out-missing-dir",
                     "out-in-model-dir", "model-name", "outtype", "dir-is-file"])
    if op == "dirname":
        new = rng.choice(DIR_NAMES)
        target = ctx.dir.with_name(new)
        os.rename(ctx.dir, target)
        ctx.dir = target
        ctx.dir_arg = str(target)
        return f"model directory named {new!r}"
    if op == "dirarg":
        rel = os.path.relpath(ctx.dir)
        ctx.dir_arg = rng.choice([rel, rel + "/", "./" + rel, os.path.join(rel, "..", ctx.dir.name),
                                  str(ctx.dir) + "//"])
        return f"model directory passed as {ctx.dir_arg!r}"
    if op == "outname":
        name = rng.choice(OUT_NAMES)
        ctx.out = ctx.out.parent / name
        return f"output named {name!r}"
    if op == "out-exists":
        put(ctx.out, b"old output")
        return "output file already exists"
    if op == "part-exists":
        put(ctx.out.with_name(ctx.out.name + ".part"), b"someone else's")
        return "output .part already exists"
    remove(ctx.out)
    if op == "out-is-dir":
        ctx.out.mkdir()
        return "output path is a directory"
    if op == "out-symlink-input":
        inputs = [n for n in ctx.files() if (ctx.dir / n).is_file()]
        if not inputs:
            return None
        target = ctx.dir / rng.choice(inputs)
        os.symlink(target, ctx.out)
        return f"output path is a symlink to input {target.name}"
    if op == "out-symlink-loop":
        os.symlink(ctx.out.name, ctx.out)
        return "output path is a symlink to itself"
    if op == "out-missing-dir":
        ctx.out = ctx.out.parent / "missing" / ctx.out.name
        return "output directory does not exist"
    if op == "out-in-model-dir":
        ctx.out = ctx.dir / rng.choice(["model.gguf", "model.safetensors", "config.json", "x.safetensors"])
        return f"output inside the model directory: {ctx.out.name}"
    if op == "model-name":
        ctx.model_name = rng.choice(MODEL_NAMES)
        return f"model_name {short(ctx.model_name)}"
    if op == "outtype":
        ctx.outtype = rng.choice(OUTTYPES)
        return f"outtype {ctx.outtype!r}"
    # The directory argument names a file or nothing.
    ctx.dir_arg = rng.choice([str(ctx.dir / "config.json"), str(ctx.dir) + "-missing", ""])
    return f"model directory argument {ctx.dir_arg!r}"


MUTATORS: tuple[tuple[Callable[[Ctx], Optional[str]], int], ...] = (
    (mutate_json_structure, 38),
    (mutate_json_bytes, 7),
    (mutate_safetensors_header, 22),
    (safetensors_bytes, 8),
    (mutate_file_kind, 9),
    (add_extra_file, 4),
    (mutate_index, 6),
    (mutate_names, 6),
)


def build_input(seed: str, index: int, bases: dict[str, Path], run: Path,
                only: Optional[int] = None) -> tuple[Ctx, str, list[str]]:
    """Input `index` of `seed` under run/ (emptied first): (context, base name, mutation descriptions)."""
    if run.exists():
        shutil.rmtree(run)
    (run / "out").mkdir(parents=True)
    rng = random.Random(f"{seed}/{index}")
    base = weighted(rng, [(c.name, w) for c, w in BASES])
    n = rng.choice([1, 1, 1, 1, 2, 2, 3])
    model = run / "in" / bases[base].name
    link_base(bases[base], model)
    ctx = Ctx(rng, model, run / "out" / "model.gguf", str(model))
    done = []
    for k in range(n):
        if only is not None and k != only:
            continue
        ctx.rng = random.Random(f"{seed}/{index}/{k}")
        for _ in range(8):
            mutator = weighted(ctx.rng, MUTATORS)
            try:
                what = mutator(ctx)
            except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError, OSError):
                # An earlier mutation left the file in a state this one cannot edit; try another.
                what = None
            if what is not None:
                done.append(f"[{k}] {what}")
                break
    return ctx, base, done


# ---------------------------------------------------------------------------------------------
# Running one input: convert() in this process under a time limit, then the classification
# and the listing of the run directory before and after.
# ---------------------------------------------------------------------------------------------

class Timeout(BaseException):
    """Raised by SIGALRM: the converter did not finish in --timeout seconds."""


def _alarm(signum, frame):
    raise Timeout("no result within the time limit")


@dataclass
class Outcome:
    index: int
    kind: str                    # success | refusal | crash
    base: str
    mutations: list[str]
    seconds: float
    signature: str = ""
    error_type: str = ""
    message: str = ""
    last_frame: str = ""
    converter_frame: str = ""
    traceback: str = ""
    leftovers: list[str] = field(default_factory=list)
    reason: str = ""


def frame_text(fs: traceback.FrameSummary) -> str:
    return f"{Path(fs.filename).name}:{fs.lineno} in {fs.name}"


def crash_fields(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if Path(f.filename).name == CONVERTER_FILE]
    last = frame_text(frames[-1]) if frames else "?"
    converter = frame_text(mine[-1]) if mine else "?"
    etype = type(exc).__name__
    return dict(error_type=etype, message=str(exc)[:400], last_frame=last, converter_frame=converter,
                signature=f"{etype} @ {mine[-1].name if mine else '?'}:{mine[-1].lineno if mine else '?'}",
                traceback="".join(traceback.format_exception(exc))[-4000:])


def leftovers(before: dict, after: dict, allowed: set[str]) -> list[str]:
    changed = []
    for rel in sorted(set(before) | set(after)):
        if rel in allowed:
            continue
        if before.get(rel) != after.get(rel):
            state = "new" if rel not in before else "gone" if rel not in after else "changed"
            changed.append(f"{state}: {rel}")
    return changed


def run_input(ctx: Ctx, base: str, mutations: list[str], index: int, run: Path, timeout: float) -> Outcome:
    # The run directory's parent is the working directory: relative writes land there too.
    before = tree_fingerprint(run.parent)
    options = bc.Options(outtype=ctx.outtype, model_name=ctx.model_name)
    result: Outcome
    start = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        report = bc.convert(ctx.dir_arg, ctx.out, options)
        signal.setitimer(signal.ITIMER_REAL, 0)
        result = Outcome(index, "success", base, mutations, 0.0)
    except bc.Refusal as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        reason = e.reason
        result = Outcome(index, "refusal", base, mutations, 0.0, reason=reason if isinstance(reason, str) else "")
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason or "\r" in reason:
            f = crash_fields(e)
            f["error_type"] = "Refusal(not one line)"
            f["signature"] = "Refusal(not one line) @ " + f["signature"].split(" @ ", 1)[1]
            result = Outcome(index, "crash", base, mutations, 0.0, reason=str(reason)[:400], **f)
    except (Exception, Timeout, MemoryError) as e:  # noqa: B014 - every failure is a finding
        signal.setitimer(signal.ITIMER_REAL, 0)
        result = Outcome(index, "crash", base, mutations, 0.0, **crash_fields(e))
    result.seconds = time.perf_counter() - start
    after = tree_fingerprint(run.parent)
    allowed: set[str] = set()
    if result.kind == "success":
        rel = os.path.relpath(os.path.abspath(report.out), run.parent)
        allowed.add(rel)
        if not report.out.is_file() or report.out.stat().st_size != report.bytes:
            result.leftovers.append(f"success without its output: {rel}")
        else:
            with open(report.out, "rb") as f:
                if f.read(4) != b"GGUF":
                    result.leftovers.append(f"output is not GGUF: {rel}")
    result.leftovers += leftovers(before, after, allowed)
    return result


def minimal_mutation(seed: str, index: int, bases, run: Path, timeout: float, outcome: Outcome) -> Optional[int]:
    """The one mutation that alone reproduces the crash's signature, if there is one."""
    ks = [int(m[1:m.index("]")]) for m in outcome.mutations]
    if len(ks) < 2:
        return ks[0] if ks else None
    for k in ks:
        ctx, base, done = build_input(seed, index, bases, run, only=k)
        if not done:
            continue
        o = run_input(ctx, base, done, index, run, timeout)
        if o.kind == "crash" and o.signature == outcome.signature:
            return k
    return None


# ---------------------------------------------------------------------------------------------
# The campaign: inputs over one or more workers, unique crashes by exception type and the
# converter's last frame, a progress line every so often and a JSON report at the end.
# ---------------------------------------------------------------------------------------------

@dataclass
class Unique:
    signature: str
    error_type: str
    message: str
    last_frame: str
    converter_frame: str
    first_index: int
    count: int = 0
    examples: list[dict] = field(default_factory=list)   # first few inputs: mutations, minimal, replay
    traceback: str = ""


def limit_memory(megabytes: int) -> None:
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


_WORKER: dict = {}


def _worker_init(seed: str, bases: dict, work: str, timeout: float, memory_mb: int) -> None:
    limit_memory(memory_mb)
    run = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    os.chdir(run)
    signal.signal(signal.SIGALRM, _alarm)
    _WORKER.update(seed=seed, bases={k: Path(v) for k, v in bases.items()}, run=run / "r", timeout=timeout)


def _worker_run(index: int) -> tuple[Outcome, Optional[int]]:
    w = _WORKER
    # A harness that blocks (a FIFO opened by a mutation) must fail loudly, not stall the campaign.
    signal.setitimer(signal.ITIMER_REAL, 120)
    ctx, base, done = build_input(w["seed"], index, w["bases"], w["run"])
    signal.setitimer(signal.ITIMER_REAL, 0)
    outcome = run_input(ctx, base, done, index, w["run"], w["timeout"])
    minimal = None
    if outcome.kind == "crash":
        minimal = minimal_mutation(w["seed"], index, w["bases"], w["run"], w["timeout"], outcome)
    shutil.rmtree(w["run"], ignore_errors=True)
    return outcome, minimal


def refusal_family(reason: str) -> str:
    """A refusal reason with file-specific details cut, for the histogram of what fired."""
    text = reason.split(":")[0] if reason.startswith(("config.json: ", "model")) else reason
    words = ["<path>" if "/" in w else w[:40] for w in text.replace("'", " ").split()]
    return " ".join(words[:6]).encode("utf-8", "backslashreplace").decode("utf-8")


class Campaign:
    def __init__(self, seed: str, total: int):
        self.seed, self.total = seed, total
        self.counts = Counter()
        self.uniques: dict[str, Unique] = {}
        self.partials: list[dict] = []
        self.refusals = Counter()
        self.successes_by_base = Counter()
        self.done = 0
        self.start = time.perf_counter()
        self.slowest: list[tuple[float, int, str]] = []
        self.long_refusals: list[dict] = []

    def add(self, o: Outcome, minimal: Optional[int]) -> None:
        self.done += 1
        self.counts[o.kind] += 1
        if o.kind == "success":
            self.successes_by_base[o.base] += 1
        if o.kind == "refusal":
            self.refusals[refusal_family(o.reason)] += 1
            # Not a crash, but a one-line reason the size of a page is worth a look.
            if len(o.reason) > 1000 and len(self.long_refusals) < 10:
                self.long_refusals.append({"index": o.index, "chars": len(o.reason), "start": o.reason[:160],
                                           "mutations": o.mutations})
        self.slowest = sorted(self.slowest + [(o.seconds, o.index, o.kind)], reverse=True)[:10]
        if o.leftovers:
            self.counts["partial"] += 1
            if len(self.partials) < 50:
                self.partials.append({"index": o.index, "kind": o.kind, "mutations": o.mutations,
                                      "leftovers": o.leftovers[:10], "replay": self.replay(o.index)})
        if o.kind == "crash":
            u = self.uniques.get(o.signature)
            if u is None:
                u = self.uniques[o.signature] = Unique(o.signature, o.error_type, o.message, o.last_frame,
                                                       o.converter_frame, o.index, traceback=o.traceback)
            u.count += 1
            if len(u.examples) < 5:
                u.examples.append({"index": o.index, "base": o.base, "mutations": o.mutations,
                                   "minimal_mutation": minimal, "message": o.message[:200],
                                   "replay": self.replay(o.index, minimal)})

    def replay(self, index: int, only: Optional[int] = None) -> str:
        extra = f" --only {only}" if only is not None else ""
        return f"python3 oracle/fuzz.py --seed {self.seed} --replay {index}{extra}"

    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.start, 1e-9)

    def line(self) -> str:
        c = self.counts
        return (f"fuzz: {self.done} inputs, {c['crash']} crashes ({len(self.uniques)} unique), "
                f"{c['partial']} partial outputs, {c['success']} successes, {c['refusal']} refusals")

    def progress(self) -> str:
        return (f"{time.strftime('%H:%M:%S')} {self.done}/{self.total} {self.rate():.1f} inputs/s | "
                f"{self.line()}")

    def report(self) -> dict:
        return {
            "command": " ".join([Path(sys.executable).name] + sys.argv),
            "seed": self.seed, "inputs": self.done,
            "converter_sha256": CONVERTER_SHA256,
            "seconds": round(time.perf_counter() - self.start, 1),
            "inputs_per_second": round(self.rate(), 2), "counts": dict(self.counts),
            "successes_by_base": dict(self.successes_by_base),
            "unique_crashes": [asdict(u) for u in sorted(self.uniques.values(), key=lambda u: u.first_index)],
            "partial_outputs": self.partials,
            "refusal_families": self.refusals.most_common(80),
            "long_refusals": self.long_refusals,
            "slowest": self.slowest,
        }


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
    os.replace(tmp, path)


def run_campaign(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="bankml-fuzz-", dir=args.workdir)).resolve()
    bases = build_bases(work / "bases")
    fingerprint = tree_fingerprint(work / "bases", with_hash=True)
    camp = Campaign(args.seed, args.inputs)
    progress = Path(args.progress).resolve() if args.progress else None
    report = Path(args.report).resolve() if args.report else None
    if progress:
        progress.write_text(f"{time.strftime('%H:%M:%S')} start: seed {args.seed}, {args.inputs} inputs, "
                            f"{args.workers} worker(s), work dir {work}\n", encoding="utf-8")
    bases_s = {k: str(v) for k, v in bases.items()}
    init = (args.seed, bases_s, str(work), args.timeout, args.memory_mb)
    indices = range(args.start, args.start + args.inputs)
    if args.workers <= 1:
        _worker_init(*init)
        results: Iterator = map(_worker_run, indices)
        pool = None
    else:
        import multiprocessing
        pool = multiprocessing.get_context("fork").Pool(args.workers, _worker_init, init)
        results = pool.imap_unordered(_worker_run, indices, chunksize=8)
    try:
        for outcome, minimal in results:
            camp.add(outcome, minimal)
            new_crash = outcome.kind == "crash" and camp.uniques[outcome.signature].count == 1
            if new_crash and not args.quiet:
                print(f"new crash #{len(camp.uniques)} at input {outcome.index}: {outcome.signature}: "
                      f"{outcome.message[:120]!r}", file=sys.stderr, flush=True)
            if camp.done % args.every == 0 or new_crash:
                if progress:
                    with open(progress, "a", encoding="utf-8", errors="backslashreplace") as f:
                        f.write(camp.progress() + "\n")
                if report:
                    write_atomically(report, json.dumps(camp.report(), indent=2, ensure_ascii=True))
    finally:
        if pool is not None:
            pool.terminate()
    os.chdir(ROOT)
    if tree_fingerprint(work / "bases", with_hash=True) != fingerprint:
        camp.counts["partial"] += 1
        camp.partials.append({"index": -1, "leftovers": ["a base directory changed: an input was written through"]})
    if report:
        write_atomically(report, json.dumps(camp.report(), indent=2, ensure_ascii=True))
    for u in sorted(camp.uniques.values(), key=lambda u: u.first_index):
        ex = u.examples[0]
        print(f"crash {u.signature} x{u.count}: {u.error_type}: {u.message[:100]!r}\n"
              f"    last frame {u.last_frame}; first input {u.first_index}: {ex['mutations']}\n"
              f"    replay: {ex['replay']}")
    for p in camp.partials[:10]:
        print(f"partial output at input {p['index']}: {p['leftovers'][:3]} {p.get('mutations', '')}")
    print(f"throughput: {camp.rate():.1f} inputs/s over {time.perf_counter() - camp.start:.0f} s")
    if progress:
        with open(progress, "a", encoding="utf-8") as f:
            f.write(camp.progress() + " (done)\n")
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    print(camp.line())
    return 1 if camp.counts["crash"] or camp.counts["partial"] else 0


# ---------------------------------------------------------------------------------------------
# Directed inputs: hand-made hostile inputs for findings random mutation reaches rarely, run
# through the same classification (and two command-line cases, run as subprocesses).
# ---------------------------------------------------------------------------------------------

# Its first draw is below 0.7, so dumps() escapes lone surrogates instead of writing them raw.
def ascii_rng() -> random.Random:
    return random.Random(1)


def _edit_json(name: str, change: Callable[[object], object]) -> Callable[[Ctx], None]:
    def edit(ctx: Ctx) -> None:
        path = ctx.dir / name
        doc = change(json.loads(path.read_bytes()))
        put(path, dumps(doc, ascii_rng(), indent=2) if not isinstance(doc, bytes) else doc)
    return edit


def _nested_list(depth: int) -> list:
    node: list = []
    for _ in range(depth):
        node = [node]
    return node


def _set(key, value):
    def change(doc):
        doc[key] = value
        return doc
    return change


def _raw_set(key: str, raw: str):
    def change(doc):
        doc[key] = Raw(raw)
        return doc
    return change


def _st_dtype(value) -> Callable[[Ctx], None]:
    def edit(ctx: Ctx) -> None:
        path = ctx.dir / "model.safetensors"
        st = read_st(path)
        st.header["model.norm.weight"]["dtype"] = value
        write_st(path, st, ascii_rng())
    return edit


def _out_name(name: str) -> Callable[[Ctx], None]:
    def edit(ctx: Ctx) -> None:
        ctx.out = ctx.out.parent / name
    return edit


def _dir_named(name: str, drop: Optional[str] = None) -> Callable[[Ctx], None]:
    def edit(ctx: Ctx) -> None:
        target = ctx.dir.with_name(name)
        os.rename(ctx.dir, target)
        ctx.dir, ctx.dir_arg = target, str(target)
        if drop:
            remove(target / drop)
    return edit


def _out_loop(ctx: Ctx) -> None:
    os.symlink(ctx.out.name, ctx.out)


def _index_part(tensor: str, part: str) -> Callable[[Ctx], None]:
    def edit(ctx: Ctx) -> None:
        put(ctx.dir / "model.safetensors.index.json",
            dumps({"weight_map": {tensor: part}}, ascii_rng()))
    return edit


def _out_missing_dir(name: str) -> Callable[[Ctx], None]:
    def edit(ctx: Ctx) -> None:
        ctx.out = ctx.out.parent / name / "model.gguf"
    return edit


# (label, edit of the fuzz-bf16 base); each is one finding of parts/fuzz_findings.md or a near miss.
DIRECTED: tuple[tuple[str, Callable[[Ctx], None]], ...] = (
    ("tokenizer.json pre_tokenizer nested 400 lists deep",
     _edit_json("tokenizer.json", _set("pre_tokenizer", _nested_list(400)))),
    ("config.json num_hidden_layers 2147483647", _edit_json("config.json", _set("num_hidden_layers", 2**31 - 1))),
    ("config.json a 4301-digit integer", _edit_json("config.json", _raw_set("x", "1" * 4301))),
    ("generation_config.json a 4301-digit integer",
     _edit_json("generation_config.json", _raw_set("x", "1" * 4301))),
    ("safetensors header a 5000-digit integer", _st_dtype(Raw("9" * 5000))),
    ("safetensors dtype [\"F16\"] (a list)", _st_dtype(["F16"])),
    ("safetensors dtype {} (an object)", _st_dtype({})),
    ("output name {ftype.x}.gguf", _out_name("{ftype.x}.gguf")),
    ("output name {0[x]}.gguf", _out_name("{0[x]}.gguf")),
    ("output name {0:.0} (expands to '')", _out_name("{0:.0}")),
    ("output name {0:.0}. (expands to '.')", _out_name("{0:.0}.")),
    ("output name {ftype:>300}.gguf (too long)", _out_name("{ftype:>300}.gguf")),
    ("output name with a NUL byte", _out_name("nul\x00.gguf")),
    ("output path a symlink to itself", _out_loop),
    ("output directory missing, named with a newline", _out_missing_dir("a\nb")),
    ("model directory named with a newline, no config.json", _dir_named("x\ny", drop="config.json")),
    ("index weight_map part 'model\\n.safetensors'", _index_part("model.norm.weight", "model\n.safetensors")),
    ("index weight_map tensor 'model.norm.weight\\n'",
     _index_part("model.norm.weight\n", "model.safetensors")),
    ("model directory named 'm\\udcff' (non-UTF-8 bytes)", _dir_named("m\udcff")),
    ("config.json bos_token_id 2**40", _edit_json("config.json", _set("bos_token_id", 2**40))),
    ("tokenizer_config.json chat_template with a lone surrogate",
     _edit_json("tokenizer_config.json", _set("chat_template", "\ud800"))),
)


def cli_cases(base: Path, work: Path) -> list[tuple[str, list]]:
    """Command lines whose pin (--fork) must hold names that are not UTF-8."""
    odd_dir = work / "cli" / os.fsdecode(b"m\xff")
    if not odd_dir.exists():
        shutil.copytree(base, odd_dir)
    return [
        ("CLI --fork with a non-UTF-8 output name",
         [str(base), "-o", os.fsdecode(os.fsencode(str(work / "cli")) + b"/\xff.gguf"),
          "--fork", str(work / "cli" / "pin1.json")]),
        ("CLI --fork from a non-UTF-8 directory name (with --model-name)",
         [str(odd_dir), "-o", str(work / "cli" / "m.gguf"), "--model-name", "M",
          "--fork", str(work / "cli" / "pin2.json")]),
    ]


def run_directed(args) -> int:
    import subprocess
    work = Path(tempfile.mkdtemp(prefix="bankml-fuzz-directed-")).resolve()
    bases = build_bases(work / "bases")
    limit_memory(args.memory_mb)
    signal.signal(signal.SIGALRM, _alarm)
    os.chdir(work)
    run = work / "r"
    bad = 0
    for label, edit in DIRECTED:
        if run.exists():
            shutil.rmtree(run)
        (run / "out").mkdir(parents=True)
        model = run / "in" / bases["fuzz-bf16"].name
        link_base(bases["fuzz-bf16"], model)
        ctx = Ctx(ascii_rng(), model, run / "out" / "model.gguf", str(model))
        edit(ctx)
        o = run_input(ctx, "fuzz-bf16", [label], -1, run, args.timeout)
        verdict = o.kind.upper() if o.kind == "crash" else o.kind
        detail = f"{o.signature}: {o.message[:90]!r}" if o.kind == "crash" else o.reason[:110]
        print(f"{verdict:8} {label}: {detail}" + (f" LEFTOVERS {o.leftovers[:3]}" if o.leftovers else ""))
        bad += o.kind == "crash" or bool(o.leftovers)
    (work / "cli").mkdir(exist_ok=True)
    for label, argv in cli_cases(bases["fuzz-bf16"], work):
        before = tree_fingerprint(work / "cli")
        p = subprocess.run([sys.executable, str(ROOT / CONVERTER_FILE), *argv], capture_output=True,
                           timeout=300)
        err = p.stderr.decode("utf-8", "backslashreplace")
        left = [k for k in tree_fingerprint(work / "cli") if k not in before and k.endswith(".part")]
        crashed = "Traceback" in err or p.returncode not in (0, 2) or left
        last = err.strip().splitlines()[-1] if err.strip() else ""
        print(f"{'CRASH' if crashed else 'ok':8} {label}: exit {p.returncode}, {last[:120]!r}"
              + (f" LEFTOVERS {left}" if left else ""))
        bad += bool(crashed)
    os.chdir(ROOT)
    shutil.rmtree(work, ignore_errors=True)
    print(f"directed: {len(DIRECTED) + 2} inputs, {bad} crashes or partial outputs")
    return 1 if bad else 0


def run_replay(args) -> int:
    """Rebuild one input, describe it, convert it and print the full traceback of a crash."""
    work = Path(args.keep or tempfile.mkdtemp(prefix="bankml-fuzz-replay-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    bases = build_bases(work / "bases")
    run = work / "r"
    limit_memory(args.memory_mb)
    signal.signal(signal.SIGALRM, _alarm)
    os.chdir(work)  # as in a campaign: the run directory's parent is the working directory
    ctx, base, done = build_input(args.seed, args.replay, bases, run, only=args.only)
    print(f"input {args.replay} of seed {args.seed}: base {base}")
    for m in done:
        print(f"  {m}")
    print(f"  convert({ctx.dir_arg!r}, {str(ctx.out)!r}, Options(outtype={ctx.outtype!r}, "
          f"model_name={short(ctx.model_name)}))")
    o = run_input(ctx, base, done, args.replay, run, args.timeout)
    print(f"result: {o.kind} in {o.seconds:.2f} s")
    if o.reason:
        print(f"reason: {o.reason}")
    if o.kind == "crash":
        print(o.traceback)
    for left in o.leftovers:
        print(f"leftover: {left}")
    if args.keep:
        print(f"input kept in {run}")
    else:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if o.kind == "crash" or o.leftovers else 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description="Fuzz bankml_convert with mutated model directories.")
    p.add_argument("--inputs", type=int, default=2000, help="how many inputs (default 2000)")
    p.add_argument("--seed", default="1", help="campaign seed; input i is fully determined by (seed, i)")
    p.add_argument("--start", type=int, default=0, help="first input index (default 0)")
    p.add_argument("--workers", type=int, default=1, help="processes (default 1; the machine is shared)")
    p.add_argument("--report", help="JSON report: unique crashes with reproducers, partial outputs, refusal histogram")
    p.add_argument("--progress", help="append a progress line here every --every inputs and on each new crash")
    p.add_argument("--every", type=int, default=200, help="progress interval in inputs (default 200)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before an input counts as a hang (default 20)")
    p.add_argument("--memory-mb", type=int, default=2048, help="address-space limit per process (default 2048; 0: none)")
    p.add_argument("--workdir", help="where the temporary work directory goes (default: the system temp dir)")
    p.add_argument("--keep-work", action="store_true", help="do not delete the work directory")
    p.add_argument("--replay", type=int, metavar="INDEX", help="rebuild and run only input INDEX, with its traceback")
    p.add_argument("--only", type=int, metavar="K", help="with --replay: apply only mutation K of the input")
    p.add_argument("--keep", metavar="DIR", help="with --replay: build the input in DIR and leave it there")
    p.add_argument("--directed", action="store_true",
                   help="run the hand-made hostile inputs (DIRECTED) instead of a random campaign")
    p.add_argument("--quiet", action="store_true", help="no line per new crash on stderr")
    args = p.parse_args(argv)
    # Messages quote hostile input (lone surrogates included); printing them must not fail.
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(errors="backslashreplace")
    if args.replay is not None:
        return run_replay(args)
    if args.directed:
        return run_directed(args)
    return run_campaign(args)


if __name__ == "__main__":
    sys.exit(main())
