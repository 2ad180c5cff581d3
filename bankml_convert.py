#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bankml_convert: a Hugging Face safetensors Llama directory to GGUF, byte-identical to llama.cpp.

    python3 bankml_convert.py DIR -o OUT.gguf

writes the same bytes as llama.cpp's ``convert_hf_to_gguf.py DIR --outfile OUT.gguf --outtype f16``
(commit 0c1e57098, as vendored by llama-cpp-python 0.3.36) for SmolLM2-class ``LlamaForCausalLM``
directories, pins the result (sha256 of the output and of every input) and refuses, with the reason,
anything it would not reproduce exactly.  Standard library only; one file; vendor it as it is.

The file reads top to bottom the way the data flows: read the directory -> decide (architecture,
refusals, metadata, vocabulary, tensor plan) -> convert (numeric kernels) -> write (GGUF) -> pin ->
command line.  Library use::

    from bankml_convert import convert, Options
    report = convert("path/to/model", "model-F16.gguf", Options())
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import re
import struct
import sys
import threading
from array import array
from codecs import utf_32_le_decode as _utf_32_le_decode
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

__version__ = "0.1.0"

REFERENCE = "llama.cpp convert_hf_to_gguf.py @ 0c1e57098 (llama-cpp-python 0.3.36)"


class Refusal(Exception):
    """Input bankml_convert will not convert, with the reason and the way out.

    The command line prints ``bankml convert: refuse: <reason>`` and exits 2; nothing is written.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Reading the directory: JSON files and safetensors headers, each checked against the file.
# Nothing here decides what the model is; it only says what the files hold.
# ---------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"BF16": 2, "F16": 2, "F32": 4}
# A header larger than this is not a model's tensor table; refusing early avoids allocating it.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class SourceTensor:
    """One tensor of a safetensors file: where its bytes are and what they are."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    start: int          # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def read_json(path: Path) -> object:
    """The parsed JSON of a file; a Refusal naming the file and position if it is not JSON."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise Refusal(f"cannot read {path.name}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise Refusal(f"{path.name} is not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Refusal(f"{path.name} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise Refusal(f"{path.name} is nested too deeply to be a model file") from None


def read_json_object(path: Path) -> dict:
    """The JSON object of a file; a Refusal if the file holds anything but an object."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise Refusal(f"{path.name} must hold a JSON object, not {type(value).__name__}")
    return value


def read_safetensors_header(path: Path) -> list[SourceTensor]:
    """The tensors a safetensors file declares, in header order, each checked against the file.

    safetensors is little-endian by definition and carries no byte-order mark, so the data is
    assumed little-endian; that cannot be checked.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise Refusal(f"{path.name} is {size} bytes, too short to be a safetensors file")
            header_len = int.from_bytes(prefix, "little")
            if header_len > MAX_SAFETENSORS_HEADER or 8 + header_len > size:
                raise Refusal(f"{path.name}: header length {header_len} does not fit the file "
                              f"({size} bytes); the file is truncated or not safetensors")
            raw = f.read(header_len)
    except OSError as e:
        raise Refusal(f"cannot read {path.name}: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys(path.name))
    except UnicodeDecodeError:
        raise Refusal(f"{path.name}: header is not UTF-8; not a safetensors file") from None
    except json.JSONDecodeError as e:
        raise Refusal(f"{path.name}: header is not JSON ({e.msg} at byte {e.pos})") from None
    except RecursionError:
        raise Refusal(f"{path.name}: header is nested too deeply") from None
    if not isinstance(header, dict):
        raise Refusal(f"{path.name}: header must be a JSON object")
    data_start = 8 + header_len
    data_len = size - data_start
    tensors = [_source_tensor(path, name, meta, data_start, data_len)
               for name, meta in header.items() if name != "__metadata__"]
    _check_tensor_layout(path, tensors, data_start, data_len)
    return tensors


def _refuse_duplicate_keys(file_name: str):
    def pairs_to_dict(pairs):
        result = {}
        for key, value in pairs:
            if key in result:
                raise Refusal(f"{file_name}: header names {key!r} twice")
            result[key] = value
        return result
    return pairs_to_dict


def _source_tensor(path: Path, name: str, meta: object, data_start: int, data_len: int) -> SourceTensor:
    if not isinstance(meta, dict):
        raise Refusal(f"{path.name}: entry {name!r} is not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise Refusal(f"{path.name}: tensor {name!r} has dtype {dtype!r}; only BF16, F16 and F32 "
                      f"are converted (llama.cpp's F16 path is reproduced for those alone)")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise Refusal(f"{path.name}: tensor {name!r} has an invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        raise Refusal(f"{path.name}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if end > data_len:
        raise Refusal(f"{path.name}: tensor {name!r} ends at {end}, past the data "
                      f"({data_len} bytes); the file is truncated")
    tensor = SourceTensor(name, dtype, tuple(shape), path, data_start + begin, end - begin)
    if tensor.n_elements * SAFETENSORS_DTYPES[dtype] != tensor.nbytes:
        raise Refusal(f"{path.name}: tensor {name!r} has shape {list(shape)} ({dtype}) but "
                      f"{tensor.nbytes} bytes of data")
    return tensor


def _check_tensor_layout(path: Path, tensors: list[SourceTensor], data_start: int, data_len: int) -> None:
    # The safetensors format packs tensors back to back; overlaps, gaps and trailing bytes mean
    # the header does not describe the file, and guessing which side is right would be approximating.
    position = data_start
    for t in sorted(tensors, key=lambda t: (t.start, t.nbytes)):
        if t.start != position:
            what = "overlaps the one before" if t.start < position else "leaves a gap before it"
            raise Refusal(f"{path.name}: tensor {t.name!r} {what}; the header does not match the data")
        position += t.nbytes
    if position != data_start + data_len:
        raise Refusal(f"{path.name}: {data_start + data_len - position} bytes after the last tensor; "
                      f"the header does not match the data")


def model_part_names(model_dir: Path) -> tuple[list[str], Path | None]:
    """The safetensors files llama.cpp reads, in its order, and the index that named them (if any).

    llama.cpp lists ``model*.safetensors`` in the directory, sorted; when
    ``model.safetensors.index.json`` exists it reads exactly the files the index's weight_map
    names instead, sorted, and ignores any other file.
    """
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise Refusal("model.safetensors.index.json has no weight_map object")
        for tensor, part in weight_map.items():
            if not isinstance(part, str) or not _is_plain_file_name(part):
                raise Refusal(f"model.safetensors.index.json maps {tensor!r} to {part!r}, "
                              f"which is not a file name inside the model directory")
        return sorted(set(weight_map.values())), index
    try:
        names = sorted(n for n in os.listdir(model_dir)
                       if n.startswith("model") and n.endswith(".safetensors"))
    except OSError as e:
        raise Refusal(f"cannot list {model_dir}: {e.strerror or e}") from None
    if not names:
        bins = [n for n in os.listdir(model_dir) if n.endswith((".bin", ".pt", ".pth", ".gguf"))]
        hint = (f" (found {', '.join(sorted(bins)[:3])}: save the model with safetensors, "
                f"e.g. save_pretrained(..., safe_serialization=True))") if bins else ""
        raise Refusal(f"no model*.safetensors in {model_dir}{hint}")
    return names, None


def _is_plain_file_name(name: str) -> bool:
    return (name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name and not os.path.isabs(name))


def index_tensors(model_dir: Path) -> tuple[list[SourceTensor], list[Path]]:
    """Every tensor of the model in llama.cpp's order, and the files they came from.

    llama.cpp's safetensors reader returns each file's tensors sorted by name (as the
    safetensors library does), file after file in sorted file-name order; that order is the
    order of the tensors in the GGUF.
    """
    part_names, index = model_part_names(model_dir)
    tensors: list[SourceTensor] = []
    seen: dict[str, str] = {}
    files: list[Path] = [index] if index else []
    for part in part_names:
        path = model_dir / part
        if not path.is_file():
            raise Refusal(f"model.safetensors.index.json names {part}, which is missing; "
                          f"the download is incomplete")
        files.append(path)
        for t in sorted(read_safetensors_header(path), key=lambda t: t.name):
            if t.name in seen:
                raise Refusal(f"tensor {t.name!r} is in both {seen[t.name]} and {part}")
            seen[t.name] = part
            tensors.append(t)
    if index is not None:
        weight_map = read_json_object(index)["weight_map"]
        missing = sorted(set(weight_map) - set(seen))
        extra = sorted(set(seen) - set(weight_map))
        if missing or extra:
            raise Refusal("model.safetensors.index.json does not match the shards: "
                          + "; ".join(filter(None, [
                              missing and f"missing tensors {', '.join(missing[:5])}",
                              extra and f"tensors not in the index {', '.join(extra[:5])}"])))
        misplaced = sorted(n for n, part in seen.items() if weight_map[n] != part)
        if misplaced:
            raise Refusal(f"model.safetensors.index.json puts {misplaced[0]!r} in "
                          f"{weight_map[misplaced[0]]}, but it is in {seen[misplaced[0]]}")
    return tensors, files


# ---------------------------------------------------------------------------------------------
# Deciding: what llama.cpp would make of the directory -- architecture, hyperparameters, the
# metadata in its order, and the tensor plan -- or a Refusal saying why it would not be the same.
# ---------------------------------------------------------------------------------------------

# Keys that make llama.cpp take a path this file does not reproduce (multimodal wrappers, MoE,
# quantized checkpoints, EAGLE-3 drafts, extra hyperparameters it would write).
_CONFIG_REFUSALS = {
    "text_config": "a multimodal wrapper config (text_config)",
    "llm_config": "a multimodal wrapper config (llm_config)",
    "lm_config": "a multimodal wrapper config (lm_config)",
    "thinker_config": "a multimodal wrapper config (thinker_config)",
    "language_config": "a multimodal wrapper config (language_config)",
    "lfm": "a multimodal wrapper config (lfm)",
    "quantization_config": "a quantized checkpoint (quantization_config)",
    "num_local_experts": "a mixture of experts (num_local_experts)",
    "num_experts": "a mixture of experts (num_experts)",
    "n_routed_experts": "a mixture of experts (n_routed_experts)",
    "num_experts_per_tok": "a mixture of experts (num_experts_per_tok)",
    "draft_vocab_size": "an EAGLE-3 draft model (draft_vocab_size)",
    "transformer_layer_config": "an EAGLE-3 speculator (transformer_layer_config)",
    "n_group": "grouped experts (n_group)",
    "topk_group": "grouped experts (topk_group)",
}
# Alternative spellings llama.cpp's find_hparam would pick up before (or besides) the Llama names,
# writing other values or extra keys.
_CONFIG_ALIASES = ("n_layers", "n_layer", "num_layers", "n_ctx", "n_positions", "max_length",
                   "max_sequence_length", "model_max_length", "n_embd", "dim",
                   "prefix_dense_intermediate_size", "dense_intermediate_size", "n_inner",
                   "hidden_dim", "n_head", "n_heads", "n_kv_heads", "norm_eps", "layer_norm_eps",
                   "layer_norm_epsilon", "norm_epsilon", "global_rope_theta", "rope_global_theta",
                   "rope_theta_global", "rotary_emb_base", "local_rope_theta", "rope_local_theta",
                   "rope_theta_local", "swa_rope_theta", "rope_local_base_freq",
                   "partial_rotary_factor", "rope_pct", "rope_percent",
                   "original_max_position_embeddings", "num_experts_per_token", "top_k_experts",
                   "score_function", "scoring_func", "score_func", "moe_router_activation",
                   "moe_router_activation_func", "expert_selection_fn")


@dataclass(frozen=True)
class LlamaParams:
    """The hyperparameters llama.cpp writes for a Llama model, as transformers' LlamaConfig fills them."""
    block_count: int
    context_length: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    rope_freq_base: float
    rms_norm_eps: float
    head_dim: int
    vocab_size: int


def llama_params(config: dict) -> LlamaParams:
    """The Llama hyperparameters of config.json, or a Refusal for anything llama.cpp would treat otherwise.

    llama.cpp reads config.json through transformers' ``AutoConfig(...).to_dict()``, so a key
    config.json leaves out takes LlamaConfig's default (rms_norm_eps 1e-6, rope_theta 10000,
    num_key_value_heads = num_attention_heads, head_dim = hidden_size // num_attention_heads).
    """
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    if arch != "LlamaForCausalLM":
        raise Refusal(f"architecture {arch!r} is not LlamaForCausalLM; bankml_convert reproduces "
                      f"llama.cpp only for Llama models: use llama.cpp's convert_hf_to_gguf.py for the rest")
    if config.get("model_type", "llama") != "llama":
        raise Refusal(f"model_type {config.get('model_type')!r} is not 'llama'")
    for key, what in _CONFIG_REFUSALS.items():
        if key in config:
            raise Refusal(f"config.json describes {what}; llama.cpp converts it differently and "
                          f"bankml_convert does not reproduce that: use llama.cpp's converter")
    for key in _CONFIG_ALIASES:
        if key in config:
            raise Refusal(f"config.json has {key!r}, which llama.cpp would read as a hyperparameter "
                          f"beside the Llama ones; bankml_convert does not reproduce that")
    if config.get("is_causal") is False:
        raise Refusal("config.json sets is_causal: false (a bidirectional model); llama.cpp writes "
                      "llama.attention.causal for it, which bankml_convert does not reproduce")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise Refusal(f"config.json sets {key}: true; biases are not reproduced")
    _refuse_rope_scaling(config)

    def integer(key: str, default: int | None = None, minimum: int = 1) -> int:
        value = config.get(key, default)
        if value is None:
            value = default
        if type(value) is not int or not minimum <= value < 2**31:
            raise Refusal(f"config.json: {key} is {value!r}; expected a whole number "
                          f"from {minimum} to {2**31 - 1}")
        return value

    def number(key: str, default: float) -> float:
        value = config.get(key, default)
        if value is None:
            value = default
        if type(value) not in (int, float) or not 0 < value < 3.4e38:
            raise Refusal(f"config.json: {key} is {value!r}; expected a positive number")
        return value

    hidden = integer("hidden_size", 4096)
    heads = integer("num_attention_heads", 32)
    if hidden % heads:
        raise Refusal(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads "
                      f"{heads}; transformers rejects such a config and llama.cpp then reads it raw")
    kv_heads = integer("num_key_value_heads", heads)
    if heads % kv_heads:
        raise Refusal(f"config.json: num_attention_heads {heads} is not a multiple of "
                      f"num_key_value_heads {kv_heads}")
    rope = config.get("rope_parameters") or {}
    return LlamaParams(
        block_count=integer("num_hidden_layers", 32),
        context_length=integer("max_position_embeddings", 2048),
        embedding_length=hidden,
        feed_forward_length=integer("intermediate_size", 11008),
        head_count=heads,
        head_count_kv=kv_heads,
        rope_freq_base=number("rope_theta", rope.get("rope_theta", 10000.0)),
        rms_norm_eps=number("rms_norm_eps", 1e-6),
        head_dim=integer("head_dim", hidden // heads),
        vocab_size=integer("vocab_size", 32000),
    )


def _refuse_rope_scaling(config: dict) -> None:
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise Refusal(f"config.json: {key} must be an object or null")
        kind = rope.get("rope_type", rope.get("type", "default"))
        extra = sorted(set(rope) - {"rope_type", "type", "rope_theta"})
        if kind != "default" or extra:
            raise Refusal(f"config.json: {key} asks for rope scaling ({kind!r}"
                          f"{', ' + ', '.join(extra) if extra else ''}); llama.cpp writes rope "
                          f"factors for it that bankml_convert does not reproduce")


# GGUF value types (gguf-py's GGUFValueType); arrays carry their element type.
GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16, GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32 = range(7)
GGUF_BOOL, GGUF_STRING, GGUF_ARRAY, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64 = range(7, 13)


@dataclass(frozen=True)
class KV:
    """One metadata key as written: its GGUF type (element type for arrays) and value."""
    key: str
    vtype: int
    value: object
    array: bool = False


class KvList:
    """Metadata in llama.cpp's order: gguf-py keeps it in a dict, so a key set twice keeps its
    first position and takes the later value, and add_string/add_array skip empty values."""

    def __init__(self) -> None:
        self._items: dict[str, KV] = {}

    def set(self, key: str, vtype: int, value: object, array: bool = False) -> None:
        self._items[key] = KV(key, vtype, value, array)

    def string(self, key: str, value: str | None) -> None:
        if value:
            self.set(key, GGUF_STRING, value)

    def uint32(self, key: str, value: int) -> None:
        self.set(key, GGUF_UINT32, value)

    def int32(self, key: str, value: int) -> None:
        self.set(key, GGUF_INT32, value)

    def float32(self, key: str, value: float) -> None:
        self.set(key, GGUF_FLOAT32, value)

    def bool(self, key: str, value: bool) -> None:
        self.set(key, GGUF_BOOL, value)

    def array(self, key: str, vtype: int, values: list) -> None:
        if values:
            self.set(key, vtype, values, array=True)

    def items(self) -> list[KV]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)


# generation_config.json key -> (GGUF key, type); gguf-py's Metadata.load reads these, in this
# order, and writes each one present (repetition_penalty stands in for penalty_repeat).
_SAMPLING_KEYS = (
    ("sequence", "general.sampling.sequence", GGUF_STRING),
    ("top_k", "general.sampling.top_k", GGUF_INT32),
    ("top_p", "general.sampling.top_p", GGUF_FLOAT32),
    ("min_p", "general.sampling.min_p", GGUF_FLOAT32),
    ("xtc_probability", "general.sampling.xtc_probability", GGUF_FLOAT32),
    ("xtc_threshold", "general.sampling.xtc_threshold", GGUF_FLOAT32),
    ("temperature", "general.sampling.temp", GGUF_FLOAT32),
    ("penalty_last_n", "general.sampling.penalty_last_n", GGUF_INT32),
    ("penalty_repeat", "general.sampling.penalty_repeat", GGUF_FLOAT32),
    ("mirostat", "general.sampling.mirostat", GGUF_INT32),
    ("mirostat_tau", "general.sampling.mirostat_tau", GGUF_FLOAT32),
    ("mirostat_eta", "general.sampling.mirostat_eta", GGUF_FLOAT32),
)


def sampling_kvs(generation_config: dict) -> list[KV]:
    """The general.sampling.* keys llama.cpp takes from generation_config.json, in its order."""
    kvs = []
    for source, key, vtype in _SAMPLING_KEYS:
        value = generation_config.get(source)
        if source == "penalty_repeat" and value is None:
            value = generation_config.get("repetition_penalty")
        if value is None:
            continue
        kv = KV(key, vtype, value)
        try:
            encode_value(kv)
        except (struct.error, TypeError, OverflowError, ValueError):
            raise Refusal(f"generation_config.json: {source} is {value!r}, which llama.cpp cannot "
                          f"write as {_TYPE_NAMES[vtype]} (its converter would stop with an error)") from None
        if vtype == GGUF_STRING and not value:
            continue
        kvs.append(kv)
    return kvs


def load_generation_config(model_dir: Path) -> dict:
    """generation_config.json's object; like gguf-py, a missing file or invalid JSON counts as none."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError:
        return {}
    except UnicodeDecodeError as e:
        # gguf-py catches only JSON and I/O errors here; its converter stops on anything else.
        raise Refusal(f"generation_config.json is not UTF-8 (byte {e.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    except RecursionError:
        raise Refusal("generation_config.json is nested too deeply") from None
    if isinstance(value, dict):
        return value
    if value:
        raise Refusal("generation_config.json must hold a JSON object")
    return {}



# ---------------------------------------------------------------------------------------------
# Naming: general.name, organization, basename, finetune, version and size label, exactly as
# gguf-py's metadata.py heuristics derive them from _name_or_path and the directory's name.
# ---------------------------------------------------------------------------------------------

# Titles: how gguf-py turns an id fragment into general.name / general.organization.

# gguf-py leaves a word alone unless it is all lower case, and even then keeps version numbers
# ("v0.2") and anything starting with a digit ("135m") as they are, so acronyms survive.
_KEEP_AS_IS_WORD = re.compile(r'^(v\d+(?:\.\d+)*|\d.*)$')


def _title_word(word: str) -> str:
    if word.islower() and not _KEEP_AS_IS_WORD.match(word):
        return word.title()
    return word


def id_to_title(s: str) -> str:
    """gguf-py's ``Metadata.id_to_title``: dashes become spaces, lower-case words become Title case."""
    return ' '.join(_title_word(w) for w in s.strip().replace('-', ' ').split())


# Size labels: the "135M" / "8x7B" gguf-py computes from parameter counts.

def _scaled_count(count: int) -> tuple[float, str]:
    # gguf-py compares against float literals (1e12, 1e9, 1e6) and scales by multiplying with
    # 1e-12 etc., not by dividing; both choices show in the last digit, so they are kept.
    if count > 1e12:
        return count * 1e-12, "T"
    if count > 1e9:
        return count * 1e-9, "B"
    if count > 1e6:
        return count * 1e-6, "M"
    return count * 1e-3, "K"


def rounded_count(count: int, min_digits: int = 2) -> str:
    """gguf-py's ``model_weight_count_rounded_notation``: at least ``min_digits`` significant digits."""
    scaled, suffix = _scaled_count(count)
    # The number of decimals depends on the digits of round(scaled) (half to even), after
    # dropping leading zeros, so 0.4 gives "" and asks for two decimals.
    decimals = max(min_digits - len(str(round(scaled)).lstrip('0')), 0)
    return f"{scaled:.{decimals}f}{suffix}"


def size_label(total_params: int, shared_params: int, expert_params: int, expert_count: int) -> str:
    """gguf-py's ``utility.size_label``: "<experts>x<shared+one expert>" for MoE, else the total."""
    if expert_count > 0:
        return f"{expert_count}x{rounded_count(abs(shared_params) + abs(expert_params))}"
    return rounded_count(abs(total_params))


# Id components: gguf-py's reading of "<org>/<name>-<size>-<finetune>-<version>".

class IdParts(NamedTuple):
    name: Optional[str]
    org: Optional[str]
    basename: Optional[str]
    finetune: Optional[str]
    version: Optional[str]
    size_label: Optional[str]


_VERSION_PART = re.compile(r'(v|iter)?\d+([.]\d+)*', re.IGNORECASE)
_QUANT_TYPE_PART = re.compile(r'i?q\d(_\w)*|b?fp?(16|32)', re.IGNORECASE)
_SIZE_PART = re.compile(r'(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)', re.IGNORECASE)
_FINETUNE_PART = re.compile(r'chat|instruct|vision|lora', re.IGNORECASE)


def _org_and_name(model_id: str) -> tuple[Optional[str], str]:
    if '/' not in model_id:
        return None, model_id
    org, name = model_id.split('/', 1)
    # "./x" and "../x" are paths, not organisations.
    if len(org) > 0 and org[0] == '.':
        org = None
    return org, name


def _normalized_size(part: str) -> str:
    part = part.replace("_", ".")
    # bloom-7b1 style: the trailing digit is the first decimal ("7b1" -> "7.1b").
    if part[-1].isdecimal():
        part = part[:-2] + "." + part[-1] + part[-2]
    if len(part) > 1 and part[-2].isdecimal() and part[-1] in "kmbt":
        part = part[:-1] + part[-1].upper()
    return part


def _is_context_length(part: str, total_params: int) -> bool:
    # A size far from the real count is taken for a context length ("8k") and becomes a finetune.
    # A negative total marks a LoRA adapter, which may hold fewer weights than its label says, so
    # only a label below 1/8 of it is rejected; otherwise the label must be within 7/8 either way.
    if total_params == 0:
        return False
    try:
        label_params = float(part[:-1]) * pow(1000, " KMBT".find(part[-1]))
    except ValueError:
        # "8x7B", "A3B", "small": not a number, so gguf-py keeps it as a size label.
        return False
    if total_params < 0:
        return label_params < abs(total_params) // 8
    return abs(label_params - total_params) > 7 * total_params // 8


def _annotated_parts(name: str, total_params: int) -> tuple[list[str], list[set[str]]]:
    parts = [p for p in name.split('-') if len(p) > 0]
    kinds: list[set[str]] = [set() for _ in parts]
    for i, part in enumerate(parts):
        if _VERSION_PART.fullmatch(part):
            kinds[i].add("version")
        elif _QUANT_TYPE_PART.fullmatch(part):
            kinds[i].add("type")
            parts[i] = part.upper()
        elif i > 0 and _SIZE_PART.fullmatch(part):
            part = _normalized_size(part)
            if _is_context_length(part, total_params):
                kinds[i].add("finetune")
                part = part[:-1] + part[-1].lower()
            if len(kinds[i]) == 0:
                kinds[i].add("size_label")
            parts[i] = part
        elif i > 0 and _FINETUNE_PART.fullmatch(part):
            # A LoRA adapter's own "lora" says nothing about what it was tuned for.
            kinds[i].add("type" if total_params < 0 and part.lower() == "lora" else "finetune")
    return parts, kinds


def _drop_word_sizes_beside_numeric_ones(parts: list[str], kinds: list[set[str]]) -> None:
    # "large" is only a size label when no "7B"-style label is present.
    if any(c.isdecimal() for p, k in zip(parts, kinds) if "size_label" in k for c in p):
        for p, k in zip(parts, kinds):
            if "size_label" in k and all(c.isalpha() for c in p):
                k.remove("size_label")


def _mark_basename(parts: list[str], kinds: list[set[str]]) -> None:
    # The basename is the leading run of plain words and versions; anything unannotated after it
    # is taken for a finetune.
    at_start = True
    for p, k in zip(parts, kinds):
        if at_start and ((len(k) == 0 and p[0].isalpha()) or "version" in k):
            k.add("basename")
        else:
            at_start = False
            if len(k) == 0:
                k.add("finetune")
    # A version that ends the basename run is the model's version, not part of its basename.
    for k in reversed(kinds):
        if "basename" in k and len(k) > 1:
            k.remove("basename")
        else:
            break


def _joined(parts: list[str], kinds: list[set[str]], kind: str, unless: str = "") -> Optional[str]:
    return "-".join(p for p, k in zip(parts, kinds) if kind in k and unless not in k) or None


def model_id_components(model_id: Optional[str], total_params: int) -> IdParts:
    """gguf-py's ``Metadata.get_model_id_components``: (full name, org, basename, finetune, version, size label).

    ``total_params`` is the converter's signed count (negative for LoRA adapters, 0 for unknown); it
    decides whether a size in the id is a size label or a context length.
    """
    if model_id is None:
        return IdParts(None, None, None, None, None, None)
    # An id with a space is a human name, used whole.
    if ' ' in model_id:
        return IdParts(model_id, None, None, None, None, None)

    org, full_name = _org_and_name(model_id)
    parts, kinds = _annotated_parts(full_name, total_params)
    _drop_word_sizes_beside_numeric_ones(parts, kinds)
    _mark_basename(parts, kinds)

    basename = _joined(parts, kinds, "basename")
    # Repeated size labels are written once, in first-seen order.
    size = "-".join(dict.fromkeys(p for p, k in zip(parts, kinds) if "size_label" in k)) or None
    finetune = _joined(parts, kinds, "finetune")
    version = _joined(parts, kinds, "version", unless="basename")
    # A name with nothing but a basename is too ambiguous for gguf-py to call it one.
    if size is None and finetune is None and version is None:
        basename = None
    return IdParts(full_name, org, basename, finetune, version, size)


# The written keys: which source wins for each general.* naming key, and their order.

def _first_set(*values: Optional[str]) -> Optional[str]:
    for v in values:
        if v is not None:
            return v
    return None


def _title_or_none(s: Optional[str]) -> Optional[str]:
    return None if s is None else id_to_title(s)


def _is_model_id(name_or_path: Optional[str]) -> bool:
    # gguf-py takes _name_or_path only when it looks like "org/name" or "name", not a deeper path.
    return name_or_path is not None and name_or_path.count('/') <= 1


def naming_kvs(name_or_path: Optional[str], dir_name: str, model_name: Optional[str],
               total_params: int, shared_params: int, expert_params: int,
               expert_count: int) -> list[tuple[str, str]]:
    """The general.* naming keys llama.cpp writes, in its order; every value is a GGUF string.

    Inputs, as ``convert_hf_to_gguf.py DIR --outtype f16`` (no --metadata, no README.md) sees them:

    - ``name_or_path``: config.json's ``_name_or_path`` as the raw JSON holds it (gguf-py reads the file
      with ``json``, not through transformers), or None when the key is absent. It is used only when it
      has at most one '/'.
    - ``dir_name``: ``pathlib.Path(DIR).name`` of the command-line argument, unresolved:
      ``./out/merged`` and ``out/merged/`` give ``merged``, ``.`` gives ``''``, ``..`` gives ``..``.
    - ``model_name``: ``--model-name``, or None. It replaces general.name only.
    - The counts are ``GGUFWriter.get_total_parameter_count()`` after ``prepare_tensors``: the element
      counts of the tensors actually written to the GGUF, summed. For a plain Llama that is every
      tensor of the safetensors except ``*.rotary_emb.inv_freq`` (and the other buffers base.py skips);
      llama.cpp does nothing special for tied embeddings, so a directory without ``lm_head.weight``
      (SmolLM2) counts the embedding once and writes no ``output.weight``, and one with it counts both.
      Without experts ("_exps." tensors) it passes ``total_params``, ``shared_params == total_params``,
      ``expert_params == 0``, ``expert_count == 0``. SmolLM2-135M gives 134,515,008.

    Precedence per field: ``_name_or_path`` first, then the directory's name; general.name is
    ``model_name`` when given; the size label falls back to ``size_label(...)`` of the counts when
    no id supplies one and ``total_params > 0``. Keys are written in ``set_gguf_meta_model``'s order,
    and an empty string is not written at all (``GGUFWriter.add_string`` skips falsy values).
    """
    from_config = model_id_components(name_or_path, total_params) if _is_model_id(name_or_path) else IdParts(None, None, None, None, None, None)
    from_dir = model_id_components(dir_name, total_params)

    name = _first_set(_title_or_none(from_config.name), _title_or_none(from_dir.name))
    if model_name is not None:
        name = model_name
    if name is None:
        name = dir_name
    size = _first_set(from_config.size_label, from_dir.size_label)
    if size is None and total_params > 0:
        size = size_label(total_params, shared_params, expert_params, expert_count)

    written = [
        ("general.name", name),
        ("general.version", _first_set(from_config.version, from_dir.version)),
        ("general.organization", _first_set(_title_or_none(from_config.org), _title_or_none(from_dir.org))),
        ("general.finetune", _first_set(from_config.finetune, from_dir.finetune)),
        ("general.basename", _first_set(from_config.basename, from_dir.basename)),
        ("general.size_label", size),
    ]
    return [(key, value) for key, value in written if value]



# ---------------------------------------------------------------------------------------------
# Vocabulary: the tokenizer.* keys llama.cpp writes for a byte-level BPE tokenizer (its gpt2 path
# through transformers 5.18), reproduced from the JSON files for the shapes measured by the oracle.
# ---------------------------------------------------------------------------------------------

# gguf-py's TokenType values; a BPE vocabulary uses only these three.
NORMAL, CONTROL, UNUSED = 1, 3, 5

# SpecialVocab's special_token_types, in the order it looks them up and stores them.
SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")

# SpecialVocab.add_to_gguf calls gw.add_{typ}_token_id / gw.add_add_{typ}_token and skips the types
# GGUFWriter has no method for (cls ids; unk, pad, cls, mask add-flags), so only these reach the file.
ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic, gguf-py's spelling
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
}
ADD_KEYS = {
    "bos": "tokenizer.ggml.add_bos_token",
    "eos": "tokenizer.ggml.add_eos_token",
    "sep": "tokenizer.ggml.add_sep_token",
}


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]                     # id order, [PAD{i}] for ids the vocabulary lacks
    toktypes: list[int]                   # NORMAL / CONTROL / UNUSED per token
    merges: list[str]                     # "a b", as SpecialVocab reads them
    pre: str                              # tokenizer.ggml.pre
    special_ids: list[tuple[str, int]]    # SpecialVocab.special_token_ids, insertion order
    add_flags: list[tuple[str, bool]]     # SpecialVocab.add_special_token, insertion order
    chat_template: Optional[str]          # None: no key; "" is skipped by add_string too
    add_space_prefix: Optional[bool]      # tokenizer_config.json add_prefix_space, when not null
    llama_add_bos_false: bool             # LlamaModel.set_vocab's rule for 49,152-token vocabularies
    model: str = "gpt2"


def vocab_kvs(v: Vocab) -> list[KV]:
    """Every tokenizer.* key llama.cpp writes for ``v``, in file order."""
    kv = KvList()
    # LlamaModel.set_vocab writes add_prefix_space before it picks a tokenizer path at all.
    if v.add_space_prefix is not None:
        kv.bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix)
    kv.string("tokenizer.ggml.model", v.model)
    kv.string("tokenizer.ggml.pre", v.pre)
    kv.array("tokenizer.ggml.tokens", GGUF_STRING, list(v.tokens))
    kv.array("tokenizer.ggml.token_type", GGUF_INT32, list(v.toktypes))
    kv.array("tokenizer.ggml.merges", GGUF_STRING, list(v.merges))
    for typ, tid in v.special_ids:
        if typ in ID_KEYS:
            kv.uint32(ID_KEYS[typ], tid)
    for typ, flag in v.add_flags:
        if typ in ADD_KEYS:
            kv.bool(ADD_KEYS[typ], flag)
    if v.chat_template is not None:
        kv.string("tokenizer.chat_template", v.chat_template)
    # "Apply to granite small models only" in llama.cpp, but it tests only the vocabulary size,
    # so every 49,152-token Llama (SmolLM, SmolLM2) gets it, after SpecialVocab's keys; a key set
    # before keeps its position and takes the value False.
    if v.llama_add_bos_false:
        kv.bool("tokenizer.ggml.add_bos_token", False)
    return kv.items()


# Identifying the pre-tokenizer: llama.cpp hashes token ids, we hash the files.

class TokenizerShape(NamedTuple):
    """Everything besides vocabulary and merges that decides the ids transformers 5 gives llama.cpp's
    check text (the chkhsh), in canonical form."""
    tokenizer_class: str        # tokenizer_config.json; GPT2Tokenizer rebuilds the pipeline itself
    add_prefix_space: str       # tokenizer_config.json, JSON-encoded ("false", "null", ...)
    pre_tokenizer: str          # tokenizer.json's, e.g. Sequence[Digits(...),ByteLevel(...)]
    post_processor: str         # tokenizer.json's
    added_tokens_sha256: str    # the added tokens (id, content and flags): they are matched first


class KnownTokenizer(NamedTuple):
    pre: str
    vocab_merges_sha256: str
    shape: TokenizerShape
    chkhsh: str                 # what llama.cpp's get_vocab_base_pre computed for it
    measured_on: str


_SMOLLM_VOCAB_MERGES = "60e5ec7477255109c571457df28dbbc3b15a8a3d36d35a5ae7c7c5824479dd2f"
_SMOLLM_ADDED_TOKENS = "acb314029db4098fc949790c48e687dcc57a0af2e0a5eabdb63c11e1b5f5d5d7"
_BYTE_LEVEL = "ByteLevel(add_prefix_space=false,trim_offsets=true,use_regex=true)"

# Measured with `oracle/.ref/venv/bin/python oracle/vocab_oracle.py --chkhsh DIR` (recorded in
# oracle/recorded/vocab.json; parts/test_vocab.py checks these against it). Both SmolLM shapes give
# llama.cpp's "smollm" chkhsh: transformers 5's GPT2Tokenizer rebuilds a ByteLevel-only pipeline, so
# the Digits step the Hub files list never reaches the hash (and SmolLM's merges join no digits).
KNOWN_TOKENIZERS: tuple[KnownTokenizer, ...] = (
    KnownTokenizer(
        pre="smollm",
        vocab_merges_sha256=_SMOLLM_VOCAB_MERGES,
        shape=TokenizerShape(
            tokenizer_class="GPT2Tokenizer",
            add_prefix_space="false",
            pre_tokenizer=f"Sequence[Digits(individual_digits=true),{_BYTE_LEVEL}]",
            post_processor="null",
            added_tokens_sha256=_SMOLLM_ADDED_TOKENS,
        ),
        chkhsh="855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249",
        measured_on="SmolLM2-135M(-Instruct), SmolLM2-360M(-Instruct), SmolLM-135M Hub files",
    ),
    KnownTokenizer(
        pre="smollm",
        vocab_merges_sha256=_SMOLLM_VOCAB_MERGES,
        shape=TokenizerShape(
            tokenizer_class="GPT2Tokenizer",
            add_prefix_space="false",
            pre_tokenizer=_BYTE_LEVEL,
            post_processor='TemplateProcessing(pair=[{"Sequence":{"id":"A","type_id":0}},'
                           '{"Sequence":{"id":"B","type_id":1}}],single=[{"Sequence":{"id":"A","type_id":0}}],'
                           'special_tokens={})',
            added_tokens_sha256=_SMOLLM_ADDED_TOKENS,
        ),
        chkhsh="855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249",
        measured_on="SmolLM2-135M-Instruct re-saved by transformers 5.18 save_pretrained",
    ),
)


def vocab_merges_sha256(tokens: list[str], merges: list[str]) -> str:
    """sha256 of every token in id order, each followed by a newline, a blank line, then every
    merge as "a b" and a newline."""
    h = hashlib.sha256()
    for t in tokens:
        h.update(t.encode("utf-8") + b"\n")
    h.update(b"\n")
    for m in merges:
        h.update(m.encode("utf-8") + b"\n")
    return h.hexdigest()


def canonical_component(node: object) -> str:
    """A tokenizers component as Type(key=value,...) with keys sorted, Sequences as Type[...]."""
    if isinstance(node, dict) and isinstance(node.get("type"), str):
        items = {k: v for k, v in node.items() if k != "type"}
        if node["type"] == "Sequence":
            for members in ("pretokenizers", "processors", "normalizers", "decoders"):
                if members in items and len(items) == 1:
                    return "Sequence[" + ",".join(canonical_component(m) for m in items[members]) + "]"
        inner = ",".join(f"{k}={canonical_component(items[k])}" for k in sorted(items))
        return f"{node['type']}({inner})"
    if isinstance(node, list):
        return "[" + ",".join(canonical_component(m) for m in node) + "]"
    return json.dumps(node, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def tokenizer_shape(tokenizer_json: dict, tokenizer_config: dict, added: list[AddedToken]) -> TokenizerShape:
    return TokenizerShape(
        tokenizer_class=str(tokenizer_config.get("tokenizer_class")),
        add_prefix_space=json.dumps(tokenizer_config.get("add_prefix_space")),
        pre_tokenizer=canonical_component(tokenizer_json.get("pre_tokenizer")),
        post_processor=canonical_component(tokenizer_json.get("post_processor")),
        added_tokens_sha256=added_tokens_sha256(added),
    )


def known_pre(vm_sha256: str, shape: TokenizerShape) -> str:
    for known in KNOWN_TOKENIZERS:
        if known.vocab_merges_sha256 == vm_sha256 and known.shape == shape:
            return known.pre
    raise Refusal(
        "unknown tokenizer: llama.cpp names a BPE pre-tokenizer by hashing the ids transformers gives "
        "a fixed text (chkhsh), and this vocabulary/shape was never measured. "
        f"vocab_merges_sha256={vm_sha256} shape={tuple(shape)!r}. Measure it with "
        "`oracle/.ref/venv/bin/python oracle/vocab_oracle.py --chkhsh DIR`; if llama.cpp maps the "
        "chkhsh to a pre name whose output this converter reproduces, add "
        "(pre, vocab_merges_sha256, shape, chkhsh) to KNOWN_TOKENIZERS in parts/vocab.py")


# Reading the tokenizer files the way llama.cpp and transformers do.

class AddedToken(NamedTuple):
    id: int
    content: str
    special: bool
    normalized: bool
    lstrip: bool
    rstrip: bool
    single_word: bool


def added_tokens_sha256(added: list[AddedToken]) -> str:
    rows = [list(t) for t in sorted(added)]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


def as_added_token(tid: int, d: dict) -> AddedToken:
    return AddedToken(tid, d.get("content"), bool(d.get("special", False)), bool(d.get("normalized", True)),
                      bool(d.get("lstrip", False)), bool(d.get("rstrip", False)), bool(d.get("single_word", False)))


def json_added_tokens(tokenizer_json: dict) -> list[AddedToken]:
    return [as_added_token(t.get("id"), t) for t in tokenizer_json.get("added_tokens") or []]


def config_added_tokens(tokenizer_config: dict) -> Optional[list[AddedToken]]:
    decoder = tokenizer_config.get("added_tokens_decoder")
    if decoder is None:
        return None
    return [as_added_token(int(i), d) for i, d in decoder.items()]


def base_vocab(tokenizer_json: dict) -> list[str]:
    """tokenizer.json's model vocabulary in id order."""
    vocab = tokenizer_json["model"].get("vocab")
    if not isinstance(vocab, dict):
        raise Refusal("tokenizer.json's BPE vocab is not a token -> id object; not reproduced")
    by_id: dict[int, str] = {}
    for token, tid in vocab.items():
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
            raise Refusal(f"tokenizer.json vocab id {tid!r} for {token!r} is not a non-negative integer")
        if tid in by_id:
            # llama.cpp inverts transformers' vocab dict, whose order comes from a Rust hash map.
            raise Refusal(f"tokenizer.json vocab gives id {tid} to both {by_id[tid]!r} and {token!r}")
        by_id[tid] = token
    if sorted(by_id) != list(range(len(by_id))):
        raise Refusal("tokenizer.json vocab ids are not 0..n-1 without gaps; not reproduced")
    return [by_id[i] for i in range(len(by_id))]


def merges_as_written(tokenizer_json: dict) -> list[str]:
    """SpecialVocab's merges: strings as they are, pairs joined by a space with spaces inside a part
    written as U+0120 (transformers >= 4.45 stores pairs so a part may hold a space)."""
    merges = tokenizer_json["model"].get("merges")
    if not isinstance(merges, list) or not merges:
        raise Refusal("tokenizer.json has no BPE merges: llama.cpp would fall back to merges.txt while "
                         "transformers tokenizes without merges; not reproduced")
    if all(isinstance(m, str) for m in merges):
        return list(merges)
    if all(isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m) for m in merges):
        return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair)
                for pair in merges]
    raise Refusal("tokenizer.json merges mix strings and pairs (or are neither); SpecialVocab would "
                     "write them unconverted or fail")


# Which path llama.cpp takes: only the gpt2 one through transformers' GPT2Tokenizer is ported.

def refuse_other_paths(d: Path, tokenizer_json: Optional[dict], tokenizer_config: dict) -> None:
    # LlamaModel.set_vocab tries SentencePiece first: any tokenizer.model wins over tokenizer.json.
    if (d / "tokenizer.model").is_file():
        raise Refusal("SentencePiece tokenizer (tokenizer.model): llama.cpp writes tokenizer.ggml.model "
                         "'llama' with scores and SentencePiece token types; only byte-level BPE is supported")
    if tokenizer_json is None:
        raise Refusal("no tokenizer.json: llama.cpp would build the vocabulary through transformers from "
                         "vocab.json/merges.txt (or tekken.json); only tokenizer.json is supported")
    if tokenizer_config.get("tokenizer_class") == "HybridDNATokenizer":
        raise Refusal("HybridDNATokenizer: llama.cpp writes tokenizer.ggml.model 'hybriddna'")
    model = tokenizer_json.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else model
        raise Refusal(f"tokenizer.json model is {kind!r}, not BPE; only byte-level BPE is supported")
    if "decoder" not in tokenizer_json:
        raise Refusal("tokenizer.json has no 'decoder' key: llama.cpp's LlamaHfVocab check fails (KeyError)")
    if model.get("byte_fallback", False):
        decoder = tokenizer_json["decoder"]
        if isinstance(decoder, dict) and decoder.get("type") == "Sequence":
            raise Refusal("byte-fallback BPE with a Sequence decoder (Llama/Mistral style): llama.cpp "
                             "converts it with LlamaHfVocab as tokenizer.ggml.model 'llama'; not supported")
        raise Refusal("byte-fallback BPE: transformers' GPT2Tokenizer drops byte fallback; not reproduced")


def refuse_unported_features(d: Path, tokenizer_json: dict, tokenizer_config: dict) -> None:
    if tokenizer_config.get("tokenizer_class") != "GPT2Tokenizer":
        # transformers 5 maps the class name to the code that builds the tokenizer llama.cpp hashes and
        # reads: GPT2Tokenizer rebuilds a ByteLevel BPE from tokenizer.json's vocab and merges; others
        # (PreTrainedTokenizerFast, LlamaTokenizer, none) build different ones.
        raise Refusal(f"tokenizer_class {tokenizer_config.get('tokenizer_class')!r}: only GPT2Tokenizer "
                         "tokenizers are measured against llama.cpp")
    if "fast_tokenizer_files" in tokenizer_config:
        raise Refusal("tokenizer_config.json fast_tokenizer_files: transformers may load another tokenizer file")
    if (d / "added_tokens.json").is_file():
        raise Refusal("added_tokens.json: transformers' legacy added tokens are not reproduced")
    if tokenizer_json.get("normalizer") is not None:
        raise Refusal("tokenizer.json has a normalizer: GPT2Tokenizer drops it while llama.cpp writes "
                         "normalizer flags from it; not supported")


# Added and special tokens: what transformers' added vocabulary holds, and llama.cpp's token types.

STANDARD_TOKEN_KEYS = tuple(f"{t}_token" for t in SPECIAL_TYPES)


def token_content(value: object) -> Optional[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def named_special_tokens(tokenizer_config: dict, special_tokens_map: Optional[dict]) -> list[str]:
    """The tokens transformers registers as special whatever the added-token lists say: the named ones,
    the additional/extra ones, (legacy) special_tokens_map.json's and GPT2Tokenizer's defaults."""
    for key, value in tokenizer_config.items():
        if key.endswith("_token") and key not in STANDARD_TOKEN_KEYS and value is not None \
                and not isinstance(value, bool):
            raise Refusal(f"tokenizer_config.json {key}: model-specific special tokens are not reproduced")
    sources = [tokenizer_config]
    # transformers reads special_tokens_map.json only when tokenizer_config.json lists no added tokens.
    if "added_tokens_decoder" not in tokenizer_config and special_tokens_map:
        sources.append(special_tokens_map)
    named: list[str] = []
    for source in sources:
        for key in STANDARD_TOKEN_KEYS + ("additional_special_tokens", "extra_special_tokens"):
            value = source.get(key)
            values = value.values() if isinstance(value, dict) and "content" not in value else \
                value if isinstance(value, list) else [value]
            named += [c for v in values if (c := token_content(v)) is not None]
    for key in ("unk_token", "bos_token", "eos_token"):
        if not any(key in source for source in sources):
            named.append("<|endoftext|>")  # GPT2Tokenizer's default for these three
    return named


def added_vocab(tokenizer_json: dict, tokenizer_config: dict, vocab: list[str],
                special_tokens_map: Optional[dict]) -> list[AddedToken]:
    """transformers' added_tokens_decoder, when it adds nothing to what the files already list."""
    from_json = json_added_tokens(tokenizer_json)
    from_config = config_added_tokens(tokenizer_config)
    # transformers takes tokenizer_config.json's list when there is one and tokenizer.json's otherwise;
    # llama.cpp's SpecialVocab always looks ids up in tokenizer.json's.
    if from_config is not None and sorted(from_config) != sorted(from_json):
        raise Refusal("tokenizer_config.json added_tokens_decoder and tokenizer.json added_tokens differ; "
                         "not reproduced")
    index = {i: t for i, t in enumerate(vocab)}
    for t in from_json:
        if index.get(t.id) != t.content:
            # transformers appends such a token at a new id; llama.cpp then sees a different vocab.
            raise Refusal(f"added token {t.content!r} (id {t.id}) is not the vocabulary's token at that id; "
                             "not reproduced")
        if not t.special:
            raise Refusal(f"non-special added token {t.content!r}: llama.cpp writes it as USER_DEFINED after "
                             "a transformers decode round trip; not reproduced")
        if not t.normalized and not all("!" <= c <= "~" for c in t.content):
            # llama.cpp replaces a non-normalized added token by decode(encode(token)); for printable
            # ASCII without spaces the byte-level decoder and the space clean-up leave it unchanged.
            raise Refusal(f"added token {t.content!r} is not printable ASCII: llama.cpp rewrites it by a "
                             "transformers decode round trip; not reproduced")
    contents = {t.content for t in from_json}
    for c in named_special_tokens(tokenizer_config, special_tokens_map):
        if c not in contents:
            raise Refusal(f"special token {c!r} is not an added token: transformers would add it (and llama.cpp "
                             "mark it CONTROL or see a new id); not reproduced")
    return from_json


def token_list(vocab: list[str], added: list[AddedToken], vocab_size: int) -> tuple[list[str], list[int]]:
    """get_vocab_base: ids past the vocabulary become [PAD{i}], added tokens (all special here) CONTROL."""
    if len(vocab) > vocab_size:
        raise Refusal(f"the tokenizer has {len(vocab)} tokens but vocab_size is {vocab_size}: "
                         "llama.cpp's assertion fails")
    control = {t.id for t in added}
    tokens = list(vocab) + [f"[PAD{i}]" for i in range(len(vocab), vocab_size)]
    types = [CONTROL if i in control else NORMAL for i in range(len(vocab))] + [UNUSED] * (vocab_size - len(vocab))
    return tokens, types


# SpecialVocab: special token ids, add_*_token flags and the chat template.

def post_processor_add_flags(tokenizer_json: dict) -> list[tuple[str, bool]]:
    """The add flags SpecialVocab derives from tokenizer.json's post_processor, for the processors
    that leave encoding unchanged (others are refused)."""
    post = tokenizer_json.get("post_processor")
    if not post:
        return []
    flags: dict[str, bool] = {}
    for proc in post.get("processors", [post]):
        kind = proc.get("type")
        if kind == "ByteLevel":
            flags.setdefault("bos", False)
            flags.setdefault("eos", False)
        elif kind == "TemplateProcessing" and is_noop_template(proc):
            pass  # a lone $A and $A $B: SpecialVocab finds no special token to add
        else:
            added = sorted({item["SpecialToken"]["id"] for part in ("single", "pair") for item in proc.get(part, [])
                            if isinstance(item, dict) and isinstance(item.get("SpecialToken"), dict)})
            raise Refusal(f"tokenizer.json post_processor {kind} adds special tokens {added or ''}: llama.cpp "
                             "derives add_bos/add_eos/add_sep from it and transformers adds them to the text "
                             "whose ids name the pre-tokenizer; not supported (Llama 3's tokenizer, which "
                             "llama.cpp names 'llama-bpe', is one)")
    return list(flags.items())


def is_noop_template(proc: dict) -> bool:
    def seq_ids(items: list) -> Optional[list[str]]:
        ids = []
        for item in items:
            if set(item) != {"Sequence"}:
                return None
            ids.append(item["Sequence"].get("id"))
        return ids
    return (seq_ids(proc.get("single", [])) == ["A"] and seq_ids(proc.get("pair", [])) in (["A", "B"], [])
            and not proc.get("special_tokens"))


def special_ids(tokenizer_json: dict, tokenizer_config: dict, config: Optional[dict]) -> list[tuple[str, int]]:
    """SpecialVocab.special_token_ids: tokenizer_config.json's named tokens looked up among tokenizer.json's
    added tokens, then config.json's *_token_id; the first setting of a type wins."""
    ids: dict[str, int] = {}

    def put(typ: str, tid: object) -> None:
        if not isinstance(tid, int):
            return
        if tid < 0:
            raise Refusal(f"invalid value for special token type {typ}: {tid} (llama.cpp raises)")
        ids.setdefault(typ, int(tid))  # bool is an int to SpecialVocab; written as 0/1

    if tokenizer_config:
        tc = dict(tokenizer_config)
        # SpecialVocab falls back to cls for bos and sep for eos.
        if not tc.get("bos_token") and tc.get("cls_token"):
            tc["bos_token"] = tc["cls_token"]
        if not tc.get("eos_token") and tc.get("sep_token"):
            tc["eos_token"] = tc["sep_token"]
        added = tokenizer_json.get("added_tokens") or []
        for typ in SPECIAL_TYPES:
            content = token_content(tc.get(f"{typ}_token"))
            if content is None:
                continue
            put(typ, next((a.get("id") for a in added if a.get("content") == content), None))
    if config is not None:
        for typ in SPECIAL_TYPES:
            tid = config.get(f"{typ}_token_id")
            if tid is None and isinstance(config.get("text_config"), dict):
                tid = config["text_config"].get(f"{typ}_token_id")
            put(typ, tid)
    return list(ids.items())


def add_flags(tokenizer_json: dict, tokenizer_config: dict) -> list[tuple[str, bool]]:
    """SpecialVocab.add_special_token: the post-processor's, then tokenizer_config.json's add_*_token."""
    flags = dict(post_processor_add_flags(tokenizer_json))
    if tokenizer_config:
        for typ in SPECIAL_TYPES:
            value = tokenizer_config.get(f"add_{typ}_token")
            if isinstance(value, bool):
                flags.setdefault(typ, value)  # the post-processor's wins
    return list(flags.items())


def chat_template(d: Path, tokenizer_config: dict) -> Optional[str]:
    """tokenizer_config.json's chat_template, else chat_template.jinja, else chat_template.json's."""
    if not tokenizer_config:
        return None  # SpecialVocab stops before the template without a tokenizer_config.json
    alt: object = None
    if (d / "chat_template.jinja").is_file():
        alt = (d / "chat_template.jinja").read_text(encoding="utf-8")
        if list((d / "additional_chat_templates").glob("*.jinja")):
            raise Refusal("additional_chat_templates/: llama.cpp writes named chat templates; not supported")
    elif (d / "chat_template.json").is_file():
        alt = read_json(d / "chat_template.json").get("chat_template")  # type: ignore[union-attr]
    template = tokenizer_config.get("chat_template", alt)
    if isinstance(template, list):
        raise Refusal("a list of chat templates: llama.cpp writes named chat templates; not supported")
    return template if isinstance(template, str) else None


# The whole vocabulary of a directory.

def optional_json(path: Path) -> Optional[object]:
    return read_json(path) if path.is_file() else None


def bpe_vocab(model_dir: Path, config: dict, vocab_size: int) -> Vocab:
    """The vocabulary llama.cpp writes for the Llama model in ``model_dir``.

    ``config`` is config.json as the file holds it (SpecialVocab reads it raw, for the *_token_id
    fallbacks); ``vocab_size`` is llama.cpp's, LlamaConfig's default filled in.
    """
    d = Path(model_dir)
    tokenizer_config = optional_json(d / "tokenizer_config.json") or {}
    tokenizer_json = optional_json(d / "tokenizer.json")
    if not isinstance(tokenizer_config, dict) or (tokenizer_json is not None and not isinstance(tokenizer_json, dict)):
        raise Refusal("tokenizer_config.json or tokenizer.json is not a JSON object")
    refuse_other_paths(d, tokenizer_json, tokenizer_config)
    assert tokenizer_json is not None
    add_prefix_space = tokenizer_config.get("add_prefix_space")
    if add_prefix_space is not None and not isinstance(add_prefix_space, bool):
        raise Refusal(f"tokenizer_config.json add_prefix_space {add_prefix_space!r} is not a boolean")

    flags = add_flags(tokenizer_json, tokenizer_config)  # refuses post-processors that add tokens
    refuse_unported_features(d, tokenizer_json, tokenizer_config)
    vocab = base_vocab(tokenizer_json)
    merges = merges_as_written(tokenizer_json)
    special_tokens_map = optional_json(d / "special_tokens_map.json")
    added = added_vocab(tokenizer_json, tokenizer_config, vocab,
                        special_tokens_map if isinstance(special_tokens_map, dict) else None)
    shape = tokenizer_shape(tokenizer_json, tokenizer_config, added)
    pre = known_pre(vocab_merges_sha256(vocab, merges), shape)

    if vocab_size == 32016:
        raise Refusal("vocab_size 32016: llama.cpp adds CodeLlama's infill tokens; not supported")
    tokens, toktypes = token_list(vocab, added, vocab_size)
    return Vocab(
        tokens=tokens,
        toktypes=toktypes,
        merges=merges,
        pre=pre,
        special_ids=special_ids(tokenizer_json, tokenizer_config, config),
        add_flags=flags,
        chat_template=chat_template(d, tokenizer_config),
        add_space_prefix=add_prefix_space,
        llama_add_bos_false=vocab_size == 49152,
    )


# ---------------------------------------------------------------------------------------------
# Tensor plan: which tensors llama.cpp writes, under which names, in which types and order,
# checked against the config; no tensor data is read here.
# ---------------------------------------------------------------------------------------------

# GGML tensor types and the file types llama.cpp names after them (gguf-py's constants).
GGML_F32, GGML_F16 = 0, 1
GGML_TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16"}
GGML_TYPE_SIZES = {GGML_F32: 4, GGML_F16: 2}


@dataclass(frozen=True)
class OutType:
    """An --outtype: the GGML type of its matrices and the general.file_type llama.cpp writes."""
    name: str           # as on the command line
    file_type: int      # LlamaFileType
    label: str          # the {ftype} of a templated file name
    matrix_type: int    # GGML type of 2-D weights


OUT_TYPES = {
    "f16": OutType("f16", 1, "F16", GGML_F16),
}
# Types llama.cpp's converter offers that bankml_convert does not reproduce (yet).
_OUT_TYPES_REFUSED = ("f32", "bf16", "q8_0", "tq1_0", "tq2_0", "auto")

# HF LlamaForCausalLM tensor names -> GGUF names (gguf-py's TensorNameMap for MODEL_ARCH.LLAMA).
_TOP_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_BLOCK_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_BLOCK_NAME = re.compile(r"model\.layers\.(0|[1-9][0-9]{0,5})\.(.+)")
# Buffers old checkpoints saved beside the weights; llama.cpp drops them before anything else.
_DROPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


@dataclass(frozen=True)
class PlannedTensor:
    """One GGUF tensor: its name, source, GGML type, dims (GGML order) and row permutation."""
    name: str
    source: SourceTensor
    ggml_type: int
    dims: tuple[int, ...]
    permute_heads: int      # 0, or the head count of llama.cpp's rotate-half -> GGML row permutation

    @property
    def nbytes(self) -> int:
        return self.source.n_elements * GGML_TYPE_SIZES[self.ggml_type]


def gguf_tensor_name(hf_name: str, block_count: int) -> str | None:
    """The GGUF name llama.cpp gives an HF Llama tensor, or None if it has none."""
    if hf_name in _TOP_TENSORS:
        return _TOP_TENSORS[hf_name]
    m = _BLOCK_NAME.fullmatch(hf_name)
    if m and int(m.group(1)) < block_count and m.group(2) in _BLOCK_TENSORS:
        return f"blk.{m.group(1)}.{_BLOCK_TENSORS[m.group(2)]}"
    return None


def expected_shape(gguf_name: str, p: LlamaParams) -> tuple[int, ...]:
    """The HF shape (rows first) a Llama tensor must have for the config llama.cpp writes."""
    q_rows, kv_rows = p.head_count * p.head_dim, p.head_count_kv * p.head_dim
    kind = gguf_name.split(".")[-2]
    return {
        "token_embd": (p.vocab_size, p.embedding_length),
        "output": (p.vocab_size, p.embedding_length),
        "output_norm": (p.embedding_length,),
        "attn_norm": (p.embedding_length,),
        "ffn_norm": (p.embedding_length,),
        "attn_q": (q_rows, p.embedding_length),
        "attn_k": (kv_rows, p.embedding_length),
        "attn_v": (kv_rows, p.embedding_length),
        "attn_output": (p.embedding_length, q_rows),
        "ffn_gate": (p.feed_forward_length, p.embedding_length),
        "ffn_up": (p.feed_forward_length, p.embedding_length),
        "ffn_down": (p.embedding_length, p.feed_forward_length),
    }[kind]


def tensor_type(gguf_name: str, n_dims: int, out: OutType) -> int:
    """The GGML type llama.cpp writes a tensor in.

    llama.cpp keeps 1-D tensors and every ``*_norm.weight`` in F32 because most of its kernels
    take norms only in F32; every other Llama weight gets the output type's matrix type.
    """
    if n_dims <= 1 or gguf_name.endswith("_norm.weight"):
        return GGML_F32
    return out.matrix_type


def plan_tensors(sources: list[SourceTensor], p: LlamaParams, out: OutType) -> list[PlannedTensor]:
    """The GGUF tensors in llama.cpp's order, each checked against the config, or a Refusal."""
    plan: list[PlannedTensor] = []
    for src in sources:
        if src.name.endswith(_DROPPED_SUFFIXES):
            continue
        name = gguf_tensor_name(src.name, p.block_count)
        if name is None:
            raise Refusal(f"tensor {src.name!r} is not one llama.cpp maps for a Llama model with "
                          f"{p.block_count} layers; bankml_convert converts plain LlamaForCausalLM weights only")
        want = expected_shape(name, p)
        if src.shape != want:
            raise Refusal(f"tensor {src.name!r} has shape {list(src.shape)}, but config.json "
                          f"implies {list(want)}")
        heads = 0
        if name.endswith("attn_q.weight"):
            heads = p.head_count
        elif name.endswith("attn_k.weight"):
            heads = p.head_count_kv
        if heads and p.head_dim % 2:
            raise Refusal(f"head_dim {p.head_dim} is odd; llama.cpp's Q/K permutation needs it even")
        plan.append(PlannedTensor(name, src, tensor_type(name, len(src.shape), out),
                                  tuple(reversed(src.shape)), heads))
    _refuse_incomplete(plan, p)
    return plan


def _refuse_incomplete(plan: list[PlannedTensor], p: LlamaParams) -> None:
    # llama.cpp would write a model missing a tensor without complaint, and llama.cpp's loader
    # would then fail on it; saying so now is kinder than a file that cannot load.
    names = {t.name for t in plan}
    needed = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{b}.{n}" for b in range(p.block_count) for n in _BLOCK_TENSORS.values()]
    missing = [n for n in needed if n not in names]
    if missing:
        raise Refusal(f"the model has no tensor {missing[0]}"
                      f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; "
                      f"the checkpoint is incomplete")


def parameter_count(plan: list[PlannedTensor]) -> int:
    """The parameter count gguf-py derives from the tensors written (no experts, no LoRA)."""
    return sum(t.source.n_elements for t in plan)


# >>> kernels
# ---------------------------------------------------------------------------------------------
# Kernels: tensor bytes from one float format to another, bit for bit as torch and numpy convert
# them in llama.cpp's converter; a simple exact form per conversion and a fast one that must agree.
# ---------------------------------------------------------------------------------------------

# Elements per chunk of the fast path: big enough that per-chunk Python overhead vanishes, small enough
# that the chunk's big integers stay in cache.
CHUNK_ELEMS = 1 << 14

# The fast path reads and patches lanes through native-order memoryviews; a big-endian host takes
# the simple path instead.
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"

# array typecodes of exactly 2 and 4 bytes ('I' is 4 bytes on every platform CPython targets today).
_U16 = "H"
_U32 = "I" if array("I").itemsize == 4 else "L"


# --- Element rules: one value's bits to another's, by integer arithmetic only.
# --- These define the semantics (numpy's astype / torch's bf16 upcast); everything else must agree.

def _rounded_half_even(value: int, shift: int) -> int:
    """value / 2**shift rounded to the nearest integer, ties to even (shift >= 1)."""
    quotient = value >> shift
    remainder = value - (quotient << shift)
    half = 1 << (shift - 1)
    if remainder > half or (remainder == half and quotient & 1):
        quotient += 1
    return quotient


def f16_bits_from_f32_bits(bits: int) -> int:
    """The binary16 bits numpy's astype(np.float16) gives for a float32 with these bits."""
    sign = (bits >> 16) & 0x8000
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    if exponent == 0xFF:
        if mantissa == 0:
            return sign | 0x7C00
        # numpy keeps the top ten payload bits as they are (a signalling NaN stays signalling) and
        # sets the lowest one only when all ten are zero, so that the result is still a NaN.
        return sign | 0x7C00 | ((mantissa >> 13) or 1)
    if exponent == 0:
        significand, scale = mantissa, -149
    else:
        significand, scale = mantissa | 0x800000, exponent - 150
    if significand == 0:
        return sign
    # value = significand * 2**scale.  binary16 spaces its values 2**-24 apart below 2**-14
    # (subnormals) and 2**(floor(log2 value) - 10) apart above.
    magnitude = significand.bit_length() - 1 + scale
    step = max(magnitude, -14) - 10
    steps = _rounded_half_even(significand, step - scale)
    # steps * 2**step encoded: exponent field step + 25 and mantissa steps - 1024 for normals, just
    # `steps` for subnormals; both are this sum, which also carries a rounding overflow (steps ==
    # 2048) into the exponent.  Anything from 65520 up rounds to 0x7C00 or beyond: infinity.
    return sign | min(((step + 24) << 10) + steps, 0x7C00)


def f32_bits_from_f16_bits(bits: int) -> int:
    """The float32 bits numpy's astype(np.float32) gives for a binary16 with these bits."""
    sign = (bits & 0x8000) << 16
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    if exponent == 0x1F:
        # numpy moves the payload up unchanged: a signalling NaN is not quieted.
        return sign | 0x7F800000 | (mantissa << 13)
    if exponent == 0:
        if mantissa == 0:
            return sign
        # mantissa * 2**-24 is a normal float32: 2**(top - 24) * 1.fraction
        top = mantissa.bit_length() - 1
        return sign | ((top - 24 + 127) << 23) | ((mantissa << (23 - top)) & 0x7FFFFF)
    return sign | ((exponent + 112) << 23) | (mantissa << 13)


def f32_bits_from_bf16_bits(bits: int) -> int:
    """The float32 bits torch's bfloat16 .to(torch.float32) gives: the bf16 bits as the high half."""
    return bits << 16


# --- Lookup tables for 16-bit sources, built once from the element rules.
# --- They make the simple path fast enough for exhaustive tests and patch the fast path's odd lanes.

@lru_cache(maxsize=None)
def bf16_to_f16_table() -> array:
    """array('H') of 65,536 entries: f16 bits for each bf16 bit pattern."""
    return array("H", [f16_bits_from_f32_bits(b << 16) for b in range(1 << 16)])


@lru_cache(maxsize=None)
def _bf16_to_f16_list() -> list:
    return list(bf16_to_f16_table())


@lru_cache(maxsize=None)
def f16_to_f32_table() -> array:
    """array of 65,536 uint32 entries: f32 bits for each f16 bit pattern."""
    return array(_U32, [f32_bits_from_f16_bits(h) for h in range(1 << 16)])


# --- Simple conversions: element by element through the rules above.
# --- The reference the fast path is tested against (and the path a big-endian host takes).

def _lanes(data, typecode: str, width: int) -> array:
    """The little-endian lanes of `data` as an array of unsigned integers."""
    view = _byte_view(data, width)
    lanes = array(typecode)
    lanes.frombytes(view)
    if sys.byteorder != "little":
        lanes.byteswap()
    return lanes


def _little_endian_bytes(lanes: array) -> bytes:
    if sys.byteorder != "little":
        lanes = array(lanes.typecode, lanes)
        lanes.byteswap()
    return lanes.tobytes()


def _byte_view(data, width: int) -> memoryview:
    """A flat byte view of `data`, refused unless it holds whole elements of `width` bytes."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if len(view) % width:
        raise ValueError(f"{len(view)} bytes is not a whole number of {width}-byte elements")
    return view


def simple_bf16_to_f16(data) -> bytes:
    return _little_endian_bytes(array("H", map(f16_bits_from_f32_bits,
                                               map(f32_bits_from_bf16_bits, _lanes(data, "H", 2)))))


def simple_f32_to_f16(data) -> bytes:
    return _little_endian_bytes(array("H", map(f16_bits_from_f32_bits, _lanes(data, _U32, 4))))


def simple_f16_to_f16(data) -> bytes:
    return bytes(_byte_view(data, 2))


def simple_bf16_to_f32(data) -> bytes:
    return _little_endian_bytes(array(_U32, map(f32_bits_from_bf16_bits, _lanes(data, "H", 2))))


def simple_f16_to_f32(data) -> bytes:
    return _little_endian_bytes(array(_U32, map(f32_bits_from_f16_bits, _lanes(data, "H", 2))))


def simple_f32_to_f32(data) -> bytes:
    return bytes(_byte_view(data, 4))


# --- Fast chunk kernels: one chunk as one big integer, a few whole-chunk operations, then the lanes
# --- the formula does not cover patched from the rules/tables.  All assume a little-endian host.

@dataclass(frozen=True)
class _Masks16:
    """Per-lane constants, repeated over n 16-bit lanes."""
    low12: int
    exponent_bit4: int
    sign: int


@dataclass(frozen=True)
class _Masks32:
    """Per-lane constants, repeated over n 32-bit lanes."""
    bit0: int           # 0x00000001
    rebias_round: int   # (16 << 23) + 0x0fff
    result: int         # 0x7fff0000
    sign32: int         # 0x80000000
    low15: int          # 0x00007fff
    sign16: int         # 0x00008000
    f16_bias: int       # 112 << 23


def _repeated(lane: int, width: int, n: int) -> int:
    return int.from_bytes(lane.to_bytes(width, "little") * n, "little")


@lru_cache(maxsize=16)
def _masks16(n: int) -> _Masks16:
    return _Masks16(_repeated(0x0FFF, 2, n), _repeated(0x0800, 2, n), _repeated(0x8000, 2, n))


@lru_cache(maxsize=16)
def _masks32(n: int) -> _Masks32:
    return _Masks32(_repeated(1, 4, n), _repeated((16 << 23) + 0x0FFF, 4, n), _repeated(0x7FFF0000, 4, n),
                    _repeated(0x80000000, 4, n), _repeated(0x7FFF, 4, n), _repeated(0x8000, 4, n),
                    _repeated(112 << 23, 4, n))


def _byte_classes(lane_class) -> bytes:
    """A bytes.translate table: the class (0 = the formula is exact) of each value of a lane's top byte."""
    return bytes(lane_class(b) for b in range(256))


# A bf16's top byte is sign<<7 | exponent>>1.  The formula holds for exponents 113..142 (f16 normals
# without rounding); top bytes whose exponent pair straddles that range's ends are patched too.
_BF16_ODD_LANES = _byte_classes(lambda b: 0 if 57 <= (b & 0x7F) <= 70 else 1)
# An f32's top byte is the same sign<<7 | exponent>>1.  Class 1: below 2**-13 (zeros, f32 and f16
# subnormals, the smallest f16 normals), which Python's own binary16 packing rounds exactly; class 2:
# 2**15 and up (overflow, inf, NaN), left to the element rule.
_F32_ODD_LANES = _byte_classes(lambda b: 0 if 57 <= (b & 0x7F) <= 70 else 1 if (b & 0x7F) <= 56 else 2)
# An f16's top byte is sign<<7 | exponent<<2 | mantissa>>8: zero/subnormal and inf/NaN exponents.
_F16_ODD_LANES = _byte_classes(lambda b: 1 if (b & 0x7C) in (0, 0x7C) else 0)

# At most 1 lane in this many is patched one by one (about 150-300 ns a lane); a chunk with more goes
# whole through the table or struct (about 40 ns a lane).
_PATCH_LIMIT = 8

_HALF = struct.Struct("<e")


def _odd_runs(classes: bytes, marker: bytes, n: int) -> list | None:
    """The runs of lanes between `marker` lanes (each run as a bytes object; `len` is what counts),
    or None when more than n / _PATCH_LIMIT lanes are marked."""
    limit = n // _PATCH_LIMIT + 1
    runs = classes.split(marker, limit)
    if len(runs) > limit:
        return None
    runs.pop()
    return runs


def _bf16_to_f16_chunk(chunk: bytes):
    n = len(chunk) >> 1
    runs = _odd_runs(chunk[1::2].translate(_BF16_ODD_LANES), b"\x01", n)
    if runs is None:
        if chunk.count(0) == len(chunk):
            return bytes(2 * n)
        table = _bf16_to_f16_list()
        return struct.pack(f"<{n}H", *[table[lane] for lane in struct.unpack(f"<{n}H", chunk)])
    m = _masks16(n)
    x = int.from_bytes(chunk, "little")
    # exponents 113..142 become f16 exponents 1..30 by flipping exponent bit 4 of the low five
    # bits (e - 112 == (e & 31) ^ 16 there); the 7 mantissa bits move up 3; nothing can carry.
    out = (((x & m.low12) ^ m.exponent_bit4) << 3 | (x & m.sign)).to_bytes(2 * n, "little")
    if not runs:
        return out
    patched = bytearray(out)
    lanes_out = memoryview(patched).cast("H")
    lanes_in = memoryview(chunk).cast("H")
    table = bf16_to_f16_table()
    i = -1
    for run in runs:
        i += len(run) + 1
        lanes_out[i] = table[lanes_in[i]]
    return patched


def _f32_to_f16_chunk(chunk: bytes):
    n = len(chunk) >> 2
    classes = chunk[3::4].translate(_F32_ODD_LANES)
    runs = _odd_runs(classes, b"\x01", n)
    large = classes.find(2) >= 0
    if runs is None:
        if not large and chunk.count(0) == len(chunk):
            return bytes(2 * n)
        values = array("f", chunk)
        if large:
            for i in _marked(classes, 2):
                values[i] = 0.0
        patched = bytearray(struct.pack(f"<{n}e", *values))
        if large:
            _patch_large_f32(patched, chunk, classes)
        return patched
    m = _masks32(n)
    x = int.from_bytes(chunk, "little")
    # For exponents 113..142: adding 16 to the exponent leaves e - 112 in its low five bits, and
    # 0x0fff plus the last kept mantissa bit carries into that bit exactly when round-to-nearest-even
    # rounds up (a carry out of the mantissa increments the exponent: to infinity past 65504).  The
    # result, bits 13..27, moves up to bits 16..30 beside the sign.  Only a lane with exponent 239
    # or more and its sign set can carry into the next lane: both are patched.
    rounded = x + m.rebias_round + ((x >> 13) & m.bit0)
    wide = (((rounded << 3) & m.result) | (x & m.sign32)).to_bytes(4 * n, "little")
    try:
        # 32-bit lanes read two bytes late hold the 16-bit results in their low halves, which the
        # codecs narrow to 16 bits at C speed.  Results in the surrogate range (-1024..-128) refuse,
        # and take the array path.
        text, _ = _utf_32_le_decode(memoryview(wide)[2:], "strict", False)
        out = text.encode("utf-16-le") + wide[-2:]
    except UnicodeDecodeError:
        out = array("H", wide)[1::2].tobytes()
    if not runs and not large:
        return out
    patched = bytearray(out)
    pack_into = _HALF.pack_into
    floats = memoryview(chunk).cast("f")
    i = -1
    for run in runs:
        i += len(run) + 1
        pack_into(patched, 2 * i, floats[i])
    if large:
        _patch_large_f32(patched, chunk, classes)
    return patched


def _patch_large_f32(patched: bytearray, chunk: bytes, classes: bytes) -> None:
    """Class-2 lanes (2**15 and up, inf, NaN) by the element rule; a negative lane with exponent 239
    or more carried into its neighbour in the SWAR sum, so that neighbour is redone too."""
    lanes_out = memoryview(patched).cast("H")
    lanes_in = memoryview(chunk).cast(_U32)
    n = len(lanes_in)
    for i in _marked(classes, 2):
        bits = lanes_in[i]
        if 0x477FF000 <= bits & 0x7FFFFFFF <= 0x7F800000:
            lanes_out[i] = (bits >> 16) & 0x8000 | 0x7C00   # 65520 up to infinity
        else:
            lanes_out[i] = f16_bits_from_f32_bits(bits)
        if bits >> 23 >= 0x1EF and i + 1 < n:
            lanes_out[i + 1] = f16_bits_from_f32_bits(lanes_in[i + 1])


def _marked(classes: bytes, marker: int) -> Iterator[int]:
    i = classes.find(marker)
    while i >= 0:
        yield i
        i = classes.find(marker, i + 1)


def _bf16_to_f32_chunk(chunk: bytes):
    n = len(chunk) >> 1
    try:
        # UTF-16 -> UTF-32 widens each 16-bit unit to a 32-bit lane at C speed; two leading zero
        # bytes move every unit into its lane's high half.  Surrogate units refuse or pair up
        # (caught by the length), and take the slicing path.
        text = chunk.decode("utf-16-le")
        if len(text) == n:
            return b"\x00\x00" + text.encode("utf-32-le")[:-2]
    except UnicodeDecodeError:
        pass
    out = bytearray(4 * n)
    out[2::4] = chunk[0::2]
    out[3::4] = chunk[1::2]
    return bytes(out)


def _f16_to_f32_chunk(chunk: bytes):
    n = len(chunk) >> 1
    table = f16_to_f32_table()
    lanes_in = memoryview(chunk).cast("H")
    runs = _odd_runs(chunk[1::2].translate(_F16_ODD_LANES), b"\x01", n)
    try:
        text = chunk.decode("utf-16-le")
        if runs is None or len(text) != n:
            raise UnicodeError
    except UnicodeError:
        if chunk.count(0) == len(chunk):
            return bytes(4 * n)
        return array(_U32, [table[lane] for lane in lanes_in]).tobytes()
    m = _masks32(n)
    x = int.from_bytes(text.encode("utf-32-le"), "little")
    # normal f16 lanes: exponent + 112, mantissa up 13, sign from bit 15 to bit 31; no carries.
    out = ((((x & m.low15) << 13) + m.f16_bias) | ((x & m.sign16) << 16)).to_bytes(4 * n, "little")
    if not runs:
        return out
    patched = bytearray(out)
    lanes_out = memoryview(patched).cast(_U32)
    i = -1
    for run in runs:
        i += len(run) + 1
        lanes_out[i] = table[lanes_in[i]]
    return patched


def _copy_chunk(chunk: bytes):
    return chunk


# --- Public entry points: whole buffers, or chunk by chunk for streaming writers.
# --- An iterator yields bytes or bytearray pieces whose concatenation is the whole-buffer result.

def _pieces(view: memoryview, step: int, kernel) -> Iterator[bytes]:
    for start in range(0, len(view), step):
        yield kernel(view[start:start + step].tobytes())


def _chunked(width: int, kernel, simple):
    def chunks(data, chunk_elems: int = CHUNK_ELEMS) -> Iterator[bytes]:
        """Convert `data` CHUNK_ELEMS elements at a time; refuses a partial element at once."""
        if chunk_elems < 1:
            raise ValueError("chunk_elems must be positive")
        view = _byte_view(data, width)
        return _pieces(view, width * chunk_elems, kernel if _LITTLE_ENDIAN_HOST else simple)
    return chunks


iter_bf16_to_f16 = _chunked(2, _bf16_to_f16_chunk, simple_bf16_to_f16)
iter_f32_to_f16 = _chunked(4, _f32_to_f16_chunk, simple_f32_to_f16)
iter_f16_to_f16 = _chunked(2, _copy_chunk, simple_f16_to_f16)
iter_bf16_to_f32 = _chunked(2, _bf16_to_f32_chunk, simple_bf16_to_f32)
iter_f16_to_f32 = _chunked(2, _f16_to_f32_chunk, simple_f16_to_f32)
iter_f32_to_f32 = _chunked(4, _copy_chunk, simple_f32_to_f32)


def bf16_to_f16(data) -> bytes:
    """BF16 -> F16 as torch .to(float32) then numpy astype(float16): one round-to-nearest-even."""
    return b"".join(iter_bf16_to_f16(data))


def f32_to_f16(data) -> bytes:
    """F32 -> F16 as numpy astype(float16)."""
    return b"".join(iter_f32_to_f16(data))


def f16_to_f16(data) -> bytes:
    """F16 -> F16: astype(float16, copy=False) on float16 data is the identity."""
    return simple_f16_to_f16(data)


def bf16_to_f32(data) -> bytes:
    """BF16 -> F32 as torch .to(float32): exact."""
    return b"".join(iter_bf16_to_f32(data))


def f16_to_f32(data) -> bytes:
    """F16 -> F32 as numpy astype(float32): exact, NaN payloads kept."""
    return b"".join(iter_f16_to_f32(data))


def f32_to_f32(data) -> bytes:
    """F32 -> F32: the identity."""
    return simple_f32_to_f32(data)
# <<< kernels


# ---------------------------------------------------------------------------------------------
# Tensor data: each planned tensor's bytes in its output type, produced in bounded chunks
# read through one reused buffer, Q/K rows reordered as llama.cpp's permute does.
# ---------------------------------------------------------------------------------------------

CHUNK_BYTES = 1 << 20


def kernel(src_dtype: str, ggml_type: int):
    """The streaming conversion of little-endian src_dtype bytes to ggml_type, exactly as llama.cpp.

    It yields the converted bytes in pieces; streaming them keeps the output's memory warm
    instead of faulting in a fresh buffer per chunk.
    """
    return {
        ("BF16", GGML_F16): iter_bf16_to_f16,
        ("F16", GGML_F16): iter_f16_to_f16,
        ("F32", GGML_F16): iter_f32_to_f16,
        ("BF16", GGML_F32): iter_bf16_to_f32,
        ("F16", GGML_F32): iter_f16_to_f32,
        ("F32", GGML_F32): iter_f32_to_f32,
    }[(src_dtype, ggml_type)]


def permuted_rows(rows: int, n_head: int) -> list[int]:
    """For each output row, the input row llama.cpp's LlamaModel.permute puts there.

    HF stores each head's rotary pairs as two halves (rotate-half); GGML wants them interleaved.
    llama.cpp's ``reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)`` makes output row
    (h, j, i) the input row (h, i, j): the halves of every head are zipped together.
    """
    half = rows // n_head // 2
    return [h * 2 * half + i * half + j
            for h in range(n_head) for j in range(half) for i in range(2)]


@dataclass(frozen=True)
class Job:
    """A run of whole rows of one tensor: converted on its own, written at a known offset."""
    tensor: PlannedTensor
    first_row: int
    rows: int
    out_pos: int        # absolute offset of the converted rows in the GGUF
    pad_after: int      # zero bytes after them (the tensor's alignment padding, on its last job)

    @property
    def src_pos(self) -> int:
        return self.tensor.source.start + self.first_row * _row_bytes(self.tensor.source)

    @property
    def src_len(self) -> int:
        return self.rows * _row_bytes(self.tensor.source)

    @property
    def out_len(self) -> int:
        rows = _row_count(self.tensor.source)
        return self.tensor.nbytes * self.rows // rows if rows else 0


def _row_count(t: SourceTensor) -> int:
    return t.shape[0] if len(t.shape) > 1 else 1


def _row_bytes(t: SourceTensor) -> int:
    rows = _row_count(t)
    return t.nbytes // rows if rows else 0


def data_jobs(tensors: list[PlannedTensor], data_start: int) -> list[Job]:
    """The tensor data cut into jobs of about CHUNK_BYTES of input, in file order.

    Jobs hold whole rows, and a permuted tensor's jobs whole heads, because llama.cpp's Q/K
    permutation moves rows only within a head.
    """
    jobs = []
    out_pos = data_start
    for t in tensors:
        rows, row_bytes = _row_count(t.source), _row_bytes(t.source)
        unit = rows // t.permute_heads if t.permute_heads else 1
        per_job = max(unit, CHUNK_BYTES // max(row_bytes, 1) // unit * unit)
        starts = list(range(0, rows, per_job)) or [0]
        for first in starts:
            n = min(per_job, rows - first)
            job = Job(t, first, n, out_pos, padding(t.nbytes) if first == starts[-1] else 0)
            jobs.append(job)
            out_pos += job.out_len + job.pad_after
    return jobs


def job_pieces(job: Job, f, buffer: bytearray) -> Iterator[bytes]:
    """The converted bytes of one job, in pieces, its source read from f through buffer."""
    t = job.tensor
    convert = kernel(t.source.dtype, t.ggml_type)
    data = _read_exactly(f, job.src_pos, memoryview(buffer)[:job.src_len])
    if t.permute_heads:
        rows_per_head = _row_count(t.source) // t.permute_heads
        row_bytes = _row_bytes(t.source)
        order = [(first_row_of_head + r) * row_bytes
                 for first_row_of_head in range(0, job.rows, rows_per_head)
                 for r in permuted_rows(rows_per_head, 1)]
        data = b"".join(data[o:o + row_bytes] for o in order)
    yield from convert(data)


def _read_exactly(f, pos: int, into: memoryview) -> memoryview:
    f.seek(pos)
    got = 0
    while got < len(into):
        n = f.readinto(into[got:])
        if not n:
            # The header was checked against the file's size; running out means it changed under us.
            raise Refusal(f"{Path(f.name).name} changed while it was being converted "
                          f"(it ends before byte {pos + len(into)})")
        got += n
    return into


# ---------------------------------------------------------------------------------------------
# Writing: the GGUF v3 layout gguf-py's GGUFWriter produces -- header, metadata, tensor table,
# data aligned to 32 bytes -- streamed to OUT.part, hashed as written, renamed when complete.
# ---------------------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_ALIGNMENT = 32
_SCALAR_FORMATS = {GGUF_UINT8: "<B", GGUF_INT8: "<b", GGUF_UINT16: "<H", GGUF_INT16: "<h",
                   GGUF_UINT32: "<I", GGUF_INT32: "<i", GGUF_FLOAT32: "<f", GGUF_BOOL: "?",
                   GGUF_UINT64: "<Q", GGUF_INT64: "<q", GGUF_FLOAT64: "<d"}
_TYPE_NAMES = {GGUF_UINT8: "uint8", GGUF_INT8: "int8", GGUF_UINT16: "uint16", GGUF_INT16: "int16",
               GGUF_UINT32: "uint32", GGUF_INT32: "int32", GGUF_FLOAT32: "float32",
               GGUF_BOOL: "bool", GGUF_STRING: "string", GGUF_ARRAY: "array",
               GGUF_UINT64: "uint64", GGUF_INT64: "int64", GGUF_FLOAT64: "float64"}


def encode_string(s: str) -> bytes:
    """A GGUF string: u64 byte length, then UTF-8 (gguf-py's _pack_val)."""
    if not isinstance(s, str):
        raise TypeError(f"expected a string, got {type(s).__name__}")
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _encode_scalar(vtype: int, value: object) -> bytes:
    if vtype == GGUF_STRING:
        return encode_string(value)
    # struct packs exactly as gguf-py does (it uses struct too), including float32 rounding and
    # accepting a bool where an int is asked; what struct rejects stopped llama.cpp too.
    return struct.pack(_SCALAR_FORMATS[vtype], value)


def encode_value(kv: KV) -> bytes:
    """The bytes of one metadata value after its key: type tag, then the value."""
    if not kv.array:
        return struct.pack("<I", kv.vtype) + _encode_scalar(kv.vtype, kv.value)
    parts = [struct.pack("<IIQ", GGUF_ARRAY, kv.vtype, len(kv.value))]
    if kv.vtype == GGUF_STRING:
        parts.extend(encode_string(s) for s in kv.value)
    else:
        parts.append(struct.pack(f"<{len(kv.value)}{_SCALAR_FORMATS[kv.vtype][-1]}", *kv.value))
    return b"".join(parts)


def padding(n: int, align: int = GGUF_ALIGNMENT) -> int:
    """How many zero bytes bring n up to a multiple of align."""
    return -n % align


def gguf_header(kvs: list[KV], tensors: list[PlannedTensor]) -> bytes:
    """Everything before the tensor data: header, metadata, tensor table, padding to alignment."""
    parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kvs))]
    for kv in kvs:
        try:
            parts.append(encode_string(kv.key))
            parts.append(encode_value(kv))
        except (struct.error, OverflowError, TypeError, UnicodeEncodeError) as e:
            raise Refusal(f"{kv.key} cannot be written as {_TYPE_NAMES[kv.vtype]} ({e}); llama.cpp's "
                          f"converter stops on it too") from None
    offset = 0
    for t in tensors:
        parts.append(encode_string(t.name))
        parts.append(struct.pack(f"<I{len(t.dims)}QIQ", len(t.dims), *t.dims, t.ggml_type, offset))
        offset += t.nbytes + padding(t.nbytes)
    head = b"".join(parts)
    return head + bytes(padding(len(head)))


class HashingWriter:
    """Writes chunks to a file and hashes them, in order, on a thread of its own.

    sha256 and file writes release the GIL, so hashing and writing the output overlap the
    conversion on a second core; the queue is short, so memory stays bounded.
    """

    def __init__(self, f) -> None:
        self._f = f
        self._sha = hashlib.sha256()
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._stopped = False
        self._pending: list[bytes] = []
        self._pending_size = 0
        self.size = 0
        self._thread = threading.Thread(target=self._run, name="bankml-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self._error is None and not self._stopped:
                try:
                    self._sha.update(chunk)
                    self._f.write(chunk)
                except BaseException as e:  # handed to the producer at its next write
                    self._error = e

    def write(self, data) -> None:
        # Pieces are gathered into blocks of about CHUNK_BYTES: handing the thread many small
        # pieces costs more in GIL hand-offs than the hashing it takes off this thread.
        if self._error is not None:
            raise self._error
        self._pending.append(bytes(data))
        self._pending_size += len(data)
        self.size += len(data)
        if self._pending_size >= CHUNK_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._queue.put(b"".join(self._pending))
            self._pending, self._pending_size = [], 0

    def close(self) -> str:
        """Wait for every chunk to be written; the sha256 of all of them."""
        self._flush()
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sha.hexdigest()

    def abort(self) -> None:
        self._stopped = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join()


# ---------------------------------------------------------------------------------------------
# Converting a directory: the pieces above in llama.cpp's order, the result renamed into place
# only when complete, and a Report of what was written and read.
# ---------------------------------------------------------------------------------------------

# Small files whose bytes can change the output; each one present is pinned as an input.
_SMALL_INPUTS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                 "added_tokens.json", "vocab.json", "merges.txt", "README.md")


@dataclass(frozen=True)
class Options:
    """How to convert: the output type, llama.cpp's --model-name, and whether a model card may be ignored."""
    outtype: str = "f16"
    model_name: str | None = None
    ignore_model_card: bool = False
    workers: int | None = None      # processes converting in parallel; None: one per core where safe


@dataclass(frozen=True)
class InputFile:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Report:
    """What a conversion wrote (path, sha256, size, counts, general.name) and every input it read."""
    out: Path
    sha256: str
    bytes: int
    tensors: int
    kv: int
    params: int
    name: str
    inputs: tuple[InputFile, ...]


@dataclass(frozen=True)
class Plan:
    """Everything decided before a byte is written: metadata, tensors, and the files they come from."""
    kvs: list[KV]
    tensors: list[PlannedTensor]
    inputs: list[Path]
    params: int
    name: str
    header: bytes       # everything before the tensor data, already encoded


def refuse_model_card(model_dir: Path, options: Options) -> None:
    """Refuse a README.md with YAML front matter unless told to ignore it.

    llama.cpp copies a model card's licence, tags, languages, base models and datasets into the
    GGUF; a README without front matter (first line not ``---``) adds nothing, so it is accepted.
    """
    card = model_dir / "README.md"
    if options.ignore_model_card or not card.is_file():
        return
    try:
        first = card.read_bytes().split(b"\n", 1)[0].rstrip(b"\r")
    except OSError as e:
        raise Refusal(f"cannot read README.md: {e.strerror or e}") from None
    if first == b"---":
        raise Refusal("README.md has a model card (YAML front matter); llama.cpp would copy its "
                      "licence, tags, base models and datasets into the GGUF, which bankml_convert "
                      "does not reproduce: pass --ignore-model-card to convert without it (the "
                      "result then differs from llama.cpp's) or move README.md away")


def plan_conversion(model_dir: Path, options: Options) -> Plan:
    """Decide everything llama.cpp would write for model_dir, or raise a Refusal."""
    if not model_dir.is_dir():
        raise Refusal(f"{model_dir} is not a directory")
    out = out_type(options.outtype)
    refuse_model_card(model_dir, options)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise Refusal(f"no config.json in {model_dir}; is this a Hugging Face model directory?")
    config = read_json_object(config_path)
    params = llama_params(config)
    sources, weight_files = index_tensors(model_dir)
    tensors = plan_tensors(sources, params, out)
    vocab = tokenizer_vocab(model_dir, config, params.vocab_size)
    n_params = parameter_count(tensors)

    kv = KvList()
    kv.string("general.architecture", "llama")
    kv.string("general.type", "model")
    for s in sampling_kvs(load_generation_config(model_dir)):
        kv.set(s.key, s.vtype, s.value)
    name_or_path = config.get("_name_or_path")
    for key, value in naming_kvs(name_or_path if isinstance(name_or_path, str) else None,
                                 model_dir.name, options.model_name, n_params, n_params, 0, 0):
        kv.string(key, value)
    kv.uint32("llama.block_count", params.block_count)
    kv.uint32("llama.context_length", params.context_length)
    kv.uint32("llama.embedding_length", params.embedding_length)
    kv.uint32("llama.feed_forward_length", params.feed_forward_length)
    kv.uint32("llama.attention.head_count", params.head_count)
    kv.uint32("llama.attention.head_count_kv", params.head_count_kv)
    kv.float32("llama.rope.freq_base", params.rope_freq_base)
    kv.float32("llama.attention.layer_norm_rms_epsilon", params.rms_norm_eps)
    kv.uint32("llama.attention.key_length", params.head_dim)
    kv.uint32("llama.attention.value_length", params.head_dim)
    kv.uint32("general.file_type", out.file_type)
    kv.uint32("llama.vocab_size", params.vocab_size)
    kv.uint32("llama.rope.dimension_count", params.head_dim)
    kv.uint32("general.quantization_version", 2)
    for t in vocab_kvs(vocab):
        kv.set(t.key, t.vtype, t.value, t.array)

    kvs = kv.items()
    name = next((k.value for k in kvs if k.key == "general.name"), "")
    small = [model_dir / n for n in _SMALL_INPUTS if (model_dir / n).is_file()]
    return Plan(kvs, tensors, small + weight_files, n_params, name, gguf_header(kvs, tensors))


def tokenizer_vocab(model_dir: Path, config: dict, vocab_size: int) -> Vocab:
    """The vocabulary of model_dir; tokenizer files too malformed to read are refused, not crashed on."""
    try:
        return bpe_vocab(model_dir, config, vocab_size)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise Refusal(f"the tokenizer files are malformed ({type(e).__name__}: {e})") from None


def out_type(name: str) -> OutType:
    """The OutType for an --outtype name, or a Refusal naming the ones reproduced."""
    if name in OUT_TYPES:
        return OUT_TYPES[name]
    if name in _OUT_TYPES_REFUSED:
        raise Refusal(f"--outtype {name} is not reproduced byte for byte yet; "
                      f"use {', '.join(OUT_TYPES)} or llama.cpp's converter")
    raise Refusal(f"--outtype {name!r} is unknown; use {', '.join(OUT_TYPES)}")


def templated_output(out: Path, outtype: OutType) -> Path:
    """The output path with llama.cpp's {ftype}/{outtype} templates filled in its file name."""
    label = outtype.label
    try:
        name = out.name.format(label.lower(), outtype=label.lower(), ftype=label.lower(),
                               OUTTYPE=label.upper(), FTYPE=label.upper())
    except (KeyError, IndexError, ValueError) as e:
        raise Refusal(f"output name {out.name!r} has a template llama.cpp cannot fill ({e}); "
                      f"use {{ftype}} or {{outtype}}, or no braces") from None
    return out.with_name(name)


def check_output_path(out: Path, model_dir: Path, inputs: list[Path]) -> None:
    """Refuse an output that would overwrite an input or land inside the model directory's files."""
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise Refusal(f"the output's directory {parent} does not exist")
    if out.is_dir():
        raise Refusal(f"the output {out} is a directory; name a file such as {out / 'model-F16.gguf'}")
    target = out.resolve()
    if target == model_dir.resolve():
        raise Refusal("the output would replace the model directory")
    for f in inputs:
        if f.resolve() == target:
            raise Refusal(f"the output {out} is one of the inputs ({f.name})")


def write_gguf(out: Path, plan: Plan, workers: int = 1,
               hasher: InputHasher | None = None) -> tuple[str, int]:
    """Write the GGUF to OUT.part, hashing as it goes, then rename it to OUT; (sha256, size).

    The .part is created exclusively, so two conversions to one output cannot interleave; on any
    failure or interrupt it is removed and an existing OUT is left as it was.
    """
    part = out.with_name(out.name + ".part")
    try:
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise Refusal(f"{part} exists: another conversion is writing {out.name}, or one was "
                      f"killed; remove {part.name} if no conversion is running") from None
    except OSError as e:
        raise Refusal(f"cannot create {part}: {e.strerror or e}") from None
    jobs = data_jobs(plan.tensors, len(plan.header))
    size = jobs[-1].out_pos + jobs[-1].out_len + jobs[-1].pad_after if jobs else len(plan.header)
    try:
        with open(fd, "wb", buffering=0) as f:
            if workers > 1 and len(jobs) > 1:
                f.write(plan.header)
                os.ftruncate(fd, size)      # the padding between tensors is these zeros
                sha = hashlib.sha256(plan.header)
                _convert_in_workers(fd, jobs, workers, sha, hasher)
                sha = sha.hexdigest()
            else:
                if hasher:
                    hasher.start()
                w = HashingWriter(f)
                try:
                    w.write(plan.header)
                    _write_tensor_data(w, jobs)
                    sha = w.close()
                except BaseException:
                    w.abort()
                    raise
            if os.fstat(fd).st_size != size:
                raise AssertionError(f"wrote {os.fstat(fd).st_size} bytes, planned {size}")
            os.fsync(fd)
        os.replace(part, out)
    except BaseException as e:
        try:
            os.unlink(part)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise Refusal(f"writing {out} failed: {e.strerror or e}; nothing was written") from None
        raise
    return sha, size


def _write_tensor_data(w: HashingWriter, jobs: list[Job]) -> None:
    files: dict[Path, object] = {}
    buffer = bytearray(max((j.src_len for j in jobs), default=0))
    try:
        for job in jobs:
            path = job.tensor.source.path
            if path not in files:
                files[path] = open(path, "rb", buffering=0)
            written = 0
            for piece in job_pieces(job, files[path], buffer):
                w.write(piece)
                written += len(piece)
            if written != job.out_len:
                raise AssertionError(f"{job.tensor.name}: converted {written} bytes, planned {job.out_len}")
            w.write(bytes(job.pad_after))
    finally:
        for f in files.values():
            f.close()


def default_workers() -> int:
    """How many processes convert in parallel: one per core, where fork is safe.

    Forking is only safe from a single-threaded process (a library caller may run threads) and
    only where os.fork exists; elsewhere the conversion runs in this process.
    """
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    return max(1, min(os.cpu_count() or 1, 4))


_DONE = struct.Struct("<i")


def _convert_in_workers(fd: int, jobs: list[Job], workers: int, sha, hasher: InputHasher | None) -> None:
    """Convert jobs in forked workers that pwrite straight into the output, and hash it in order.

    Worker k takes every workers-th job, so all finish together; each reports a finished job on
    a pipe, and this process hashes the output as soon as the next range in file order is
    complete (reading it back from the page cache), so no second pass is needed at the end.
    A worker that fails reports why; any failure ends the others and raises here.
    """
    for build in (bf16_to_f16_table, f16_to_f32_table):
        build()     # once, before forking, rather than once per worker
    read_end, write_end = os.pipe()
    pids = []
    try:
        for k in range(workers):
            pid = os.fork()
            if pid == 0:
                os.close(read_end)
                _worker(fd, jobs[k::workers], k, workers, write_end)
            pids.append(pid)
        os.close(write_end)
        write_end = -1
        if hasher:
            hasher.start()      # a thread only after forking: fork copies just the calling thread
        _hash_as_done(fd, jobs, read_end, sha)
        failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
        pids = []
        if failed:
            raise Refusal("a conversion worker failed; nothing was written")
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def _worker(fd: int, jobs: list[Job], k: int, workers: int, report: int) -> None:
    # A forked child: it must never return into the parent's stack, whatever happens.
    status = 1
    try:
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # the parent handles interrupts
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        files: dict[Path, int] = {}
        buffer = bytearray(max((j.src_len for j in jobs), default=0))
        for i, job in enumerate(jobs):
            path = job.tensor.source.path
            if path not in files:
                files[path] = open(path, "rb", buffering=0)
            data = b"".join(job_pieces(job, files[path], buffer))
            if len(data) != job.out_len:
                raise AssertionError(f"{job.tensor.name}: converted {len(data)} bytes, planned {job.out_len}")
            if os.pwrite(fd, data, job.out_pos) != len(data):
                raise OSError(28, "short write")
            os.write(report, _DONE.pack(k + i * workers))
        status = 0
    except BaseException as e:
        message = (e.reason if isinstance(e, Refusal) else
                   f"{e.strerror}" if isinstance(e, OSError) and e.strerror else repr(e))
        try:
            os.write(report, _DONE.pack(-1) + message.encode("utf-8", "replace")[:3000])
        except OSError:
            pass
    finally:
        os._exit(status)


def _hash_as_done(fd: int, jobs: list[Job], report: int, sha) -> None:
    done = bytearray(len(jobs))
    next_job = 0
    hashed = jobs[0].out_pos if jobs else 0
    buffer = bytearray(max((j.out_len + j.pad_after for j in jobs), default=0))
    pending = b""
    while next_job < len(jobs):
        got = os.read(report, 4096)
        if not got:
            raise Refusal("a conversion worker stopped before finishing; nothing was written")
        pending += got
        while len(pending) >= 4:
            (i,) = _DONE.unpack_from(pending)
            if i < 0:
                raise Refusal(f"converting failed: {pending[4:].decode('utf-8', 'replace')}")
            done[i] = 1
            pending = pending[4:]
        while next_job < len(jobs) and done[next_job]:
            job = jobs[next_job]
            end = job.out_pos + job.out_len + job.pad_after
            view = memoryview(buffer)[:end - hashed]
            if os.preadv(fd, [view], hashed) != len(view):
                raise Refusal("the output file changed while it was being written")
            sha.update(view)
            hashed = end
            next_job += 1


def hash_file(path: Path) -> InputFile:
    """An input's name, size and sha256."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(4 * CHUNK_BYTES)
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            sha.update(view[:n])
            size += n
    return InputFile(path.name, size, sha.hexdigest())


class InputHasher:
    """Hashes the input files on a thread while the conversion runs (sha256 releases the GIL)."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = paths
        self._result: list[InputFile] = []
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="bankml-inputs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = [hash_file(p) for p in self._paths]
        except OSError as e:
            self._error = e

    def result(self) -> tuple[InputFile, ...]:
        if not self._thread.is_alive() and self._thread.ident is None:
            self._run()
        self._thread.join()
        if self._error is not None:
            raise Refusal(f"cannot read an input: {self._error.strerror or self._error}")
        return tuple(self._result)


def convert(model_dir, out, options: Options | None = None) -> Report:
    """Convert model_dir to the GGUF llama.cpp would write at out; a Refusal says why not.

    ``out`` may hold llama.cpp's ``{ftype}`` template.  Nothing exists at ``out`` unless the
    conversion completed.
    """
    options = options or Options()
    model_dir = Path(model_dir)
    plan = plan_conversion(model_dir, options)
    out = templated_output(Path(out), out_type(options.outtype))
    check_output_path(out, model_dir, plan.inputs)
    workers = options.workers if options.workers is not None else default_workers()
    hasher = InputHasher(plan.inputs)
    sha, size = write_gguf(out, plan, workers, hasher)
    inputs = hasher.result()
    return Report(out, sha, size, len(plan.tensors), len(plan.kvs), plan.params, plan.name, inputs)


# ---------------------------------------------------------------------------------------------
# Pinning: the FORK.json that records what was made from what, so the file can be verified
# like any imported model.
# ---------------------------------------------------------------------------------------------

def fork_json(report: Report, source: str) -> str:
    """The pin of a conversion as JSON text: the output's sha256 and size, every input's, the source."""
    doc = {
        "tool": f"bankml_convert {__version__}",
        "reference": REFERENCE,
        "source": source,
        "output": {"name": report.out.name, "bytes": report.bytes, "sha256": report.sha256},
        "general.name": report.name,
        "inputs": [{"name": i.name, "bytes": i.size, "sha256": i.sha256} for i in report.inputs],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line: `bankml_convert.py DIR -o OUT.gguf`; the sha256 on stdout, a summary on stderr,
# and every refusal as one line with exit code 2.
# ---------------------------------------------------------------------------------------------

class _Interrupted(BaseException):
    def __init__(self, signum: int):
        self.signum = signum


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bankml_convert.py",
        description="Convert a Hugging Face safetensors Llama directory to GGUF, byte-identical to "
                    "llama.cpp's convert_hf_to_gguf.py, and pin it.",
        epilog="example: python3 bankml_convert.py ./smollm2-135m-instruct -o smollm2-F16.gguf "
               "--fork smollm2-F16.gguf.FORK.json")
    p.add_argument("model_dir", metavar="DIR", help="the model directory (config.json, tokenizer, *.safetensors)")
    p.add_argument("-o", "--outfile", required=True, metavar="OUT.gguf",
                   help="output file; {ftype} is filled in as llama.cpp does")
    p.add_argument("--outtype", default="f16", metavar="TYPE", help="output type: f16 (default)")
    p.add_argument("--model-name", metavar="NAME", help="general.name instead of the heuristics' (llama.cpp's flag)")
    p.add_argument("--fork", metavar="FORK.json", help="also write the pin: output and input sha256s")
    p.add_argument("--source", metavar="SRC", help="where the directory came from, recorded in the pin "
                   "(default: the directory's canonical path)")
    p.add_argument("--ignore-model-card", action="store_true",
                   help="convert although README.md has a model card (the result then differs from llama.cpp's)")
    p.add_argument("--version", action="version", version=f"bankml_convert {__version__} ({REFERENCE})")
    return p


def _summary(r: Report) -> str:
    return (f"bankml convert: {r.name!r}: {r.tensors} tensors, {r.kv} metadata keys, "
            f"{r.params:,} parameters, {r.bytes:,} bytes -> {r.out}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import signal

    def interrupted(signum, frame):
        raise _Interrupted(signum)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    options = Options(outtype=args.outtype, model_name=args.model_name,
                      ignore_model_card=args.ignore_model_card)
    try:
        if args.fork:
            _check_pin_path(Path(args.fork))
        report = convert(args.model_dir, args.outfile, options)
        if args.fork:
            source = args.source or str(Path(args.model_dir).resolve())
            _write_text_atomically(Path(args.fork), fork_json(report, source))
    except Refusal as e:
        print(f"bankml convert: refuse: {e.reason}", file=sys.stderr)
        return 2
    except _Interrupted as e:
        print(f"bankml convert: interrupted by signal {e.signum}; nothing was written", file=sys.stderr)
        return 128 + e.signum
    print(f"{report.sha256}  {report.out}")
    print(_summary(report), file=sys.stderr)
    return 0


def _check_pin_path(path: Path) -> None:
    # Checked before converting, so a pin that cannot be written does not leave a GGUF without one.
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise Refusal(f"the pin's directory {parent} does not exist")
    if path.is_dir():
        raise Refusal(f"the pin {path} is a directory")


def _write_text_atomically(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    except OSError as e:
        try:
            part.unlink()
        except OSError:
            pass
        raise Refusal(f"cannot write the pin {path}: {e.strerror or e}") from None


if __name__ == "__main__":
    sys.exit(main())
