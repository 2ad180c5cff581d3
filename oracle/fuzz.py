#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fuzzes bankml_convert with hostile and broken model directories (project issue 5).

    python3 oracle/fuzz.py --inputs N --seed S [--workers W] [--report FILE] [--progress FILE] [--mmproj]
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
but the output file of a success (a .part, an output after a refusal, a changed input) -- except
what the stale-.part rule does on purpose: a dead run's .part (one planted by the "output .part
already exists" mutation, its lock free) removed with exactly one notice naming it.  A finding is
also a .part removed without that one line, a notice about a .part that is still there, and a
live run's .part (planted with its lock held by this process) changed in any way.  Among the
mutations: hostile naming fields in README.md with the output then named from them as `-o DIR` names
it (a crash too: a derived name that leaves its folder, holds a control character or is written under
another name), and, on the Qwen3-MoE bases, expert tensors with a zero dimension, expert counts unlike
the tensors' (ten million behind stacked tensors of no bytes) and experts numbered past the count; on the
vision projector bases (Gemma 3's, Qwen3.5's, Gemma 4's, SmolVLM2's), their processor files and vision_config,
converted with --mmproj three times in four (--mmproj: those bases alone; a mutation may turn the flag on or
off for any base).  The last
line is ``fuzz: N inputs, C crashes (U unique), P partial outputs, S successes, R refusals``; the
exit status is 1 if there was a crash or a partial output.  Standard library only.

    python3 oracle/fuzz.py --gguf --inputs N --seed S [--workers W] [--report F] [--progress F] [--coverage]
    python3 oracle/fuzz.py --gguf --seed S --replay INDEX [--only K] [--keep DIR] [--shrink]

--gguf fuzzes the GGUF side instead: small valid GGUF files (most written with the converter's own
gguf_header, one converted from a tiny model) get one to three mutations -- bytes, counts, lengths,
type tags, dims and offsets set to boundary values, truncation, kv and tensor edits, alignment keys,
duplicate keys, nested arrays -- and each mutant goes through read_gguf, describe_gguf,
inspect_gguf_lines, inspect_gguf_json (full and not), diff_files(mutant, base), diff_gguf(base,
mutant), diff_gguf(mutant, its twin with one byte changed) and verify(mutant, pin of the base).
Every call must return or raise GGUFError / Refusal with a one-line message; anything else, a
call running past --timeout (10 s) or a MemoryError past --memory-mb is a crash.  A contract
violation is a call that returned but broke its docstring's promise: diff empty iff
byte-identical, diff_files' exit code, verify held iff identical, one line per output line,
inspect --json strict JSON, and the reader agreeing with the fuzzer's own walk of the bytes.
The last line is ``fuzz: N inputs, C crashes
(U unique), V contract violations (W unique), A accepted, R rejected``; exit 1 on either finding.

    python3 oracle/fuzz.py --tokenizer-model --inputs N --seed S [--start I] [--convert-every K] [--report F]

--checkpoint fuzzes the torch.save reader: oracle/fixtures/torch's small files and a hand-written
.bin get byte, zip-structure and pickle-opcode mutations (hostile globals and payloads that would
create a marker file among them) through read_checkpoint, declared_tensors and both ggml writers;
every K-th (--convert-every) instead converts a tiny pytorch_model.bin model.  The last line is
``fuzz --checkpoint: N inputs, C crashes, E executions, ...``; exit 1 on a crash or an execution.

    python3 oracle/fuzz.py --checkpoint --inputs N --seed S [--convert-every K] [--report F]

    python3 oracle/fuzz.py --model-card --inputs N --seed S [--start I] [--convert-every K] [--report F]

--lora fuzzes LoRA adapter conversion: copies of oracle/fixtures/lora's adapters with their
adapter_config.json (structure and bytes), their safetensors header (names, dtypes, shapes, a tensor
dropped), a pair's shapes (rank 0, ranks that differ, a huge rank of no bytes, the pair again under a
second prefix) or their README.md mutated, or a file removed, each through convert_lora against its base's
config.json in a random output type; the last line is ``fuzz --lora: N inputs, C crashes, P partial
outputs, A converted, R refused``.

    python3 oracle/fuzz.py --lora --inputs N --seed S [--start I] [--report F]

--model-card fuzzes the README.md model-card path: mutants of the cards in oracle/fixtures/cards/ and
make_models.MODEL_CARDS (lines duplicated, dropped, swapped, re-indented, tabbed; YAML indicators,
YAML 1.1 specials, ': ' and quotes inserted; deep nesting, anchors, CRLF, other line breaks, NULs,
no closing line; naming fields set to huge hex/binary/decimal numbers, templates, path parts and
control characters; plus byte damage) go through load_model_card and general_kvs, every K-th also
through convert() in a tiny model directory; the last line is ``fuzz --model-card: N inputs (M also
converted), C crashes, P partial outputs, A read, R refused``.  oracle/cards_oracle.py --random
runs PyYAML and gguf-py beside the reader on generated documents.

--tokenizer-model fuzzes the SentencePiece reader: mutants of a real tokenizer.model (protobuf-aware
edits of pieces, types, scores, wire types, lengths, trainer/normalizer specs, plus byte damage)
go through read_tokenizer_model, every K-th also through convert() in a tiny model directory; the
last line is ``fuzz --tokenizer-model: N inputs (M also converted), C crashes, P partial outputs,
A read, R refused``.  oracle/spm_oracle.py runs the same mutants through sentencepiece itself.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import inspect
import json
import math
import os
import random
import re
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
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

ORACLE = Path(__file__).resolve().parent
ROOT = ORACLE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ORACLE))

import bankml_convert as bc  # noqa: E402
import make_models as mm  # noqa: E402
from sentencepiece_proto import LENGTH_DELIMITED, field as pb_field, varint as pb_varint  # noqa: E402

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
    # Phi-3's own SentencePiece path and keys (Phi-3-mini-4k's config, its 32,064-row vocabulary).
    (mm.Case("fuzz-phi3", tokenizer="phi-3.5-mini-instruct", config_from=mm.PHI_3_MINI_4K_INSTRUCT, tied=False,
             dims=mm.Dims(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, vocab_size=32064, max_position_embeddings=4096)), 5),
    # Qwen3-MoE, its experts stacked as transformers 5 saves them and one tensor per expert: the bases
    # mutate_moe_shapes works on (issue 35).
    (mm.Case("fuzz-moe-fused", tokenizer="qwen3", config_from=mm.QWEN3_30B_A3B, dims=mm.QWEN3_MOE_TINY, head_dim=16,
             tied=False, config_updates=mm._MOE_EXPERTS, fused_experts=True), 6),
    (mm.Case("fuzz-moe", tokenizer="qwen3", config_from=mm.QWEN3_30B_A3B, dims=mm.QWEN3_MOE_TINY, head_dim=16,
             tied=False, config_updates=mm._MOE_EXPERTS), 4),
    # The families of issues 36 and 37, as their golden cases are (hybrid layers, MTP, -exp(A_log), short
    # convolutions, Mamba2; gpt-oss's MXFP4 U8 blocks and scales; Gemma 4's per-layer embeddings and shared KV;
    # Phi-4-mini's o200k vocabulary with gaps).  Those whose tokenizer is fetched (oracle/fetch_*.sh) are left
    # out, saying so, where it is absent.
    (mm.CASES_BY_NAME["qwen3.5-0.8b-text"], 4),
    (mm.CASES_BY_NAME["lfm2-350m-shape"], 3),
    (mm.CASES_BY_NAME["granite-4.0-h-micro-shape"], 3),
    (mm.CASES_BY_NAME["gemma-4-e2b-shape"], 3),
    (mm.CASES_BY_NAME["gpt-oss-20b-mxfp4"], 3),
    (mm.CASES_BY_NAME["phi-4-mini-gqa"], 2),
    # Gemma 3's vision projector (issue 38): its SigLIP tower and processor files, converted with --mmproj
    # (PROJECTOR_BASES) three times in four, else as the text model beside it.
    (mm.CASES_BY_NAME["gemma-3-4b-vision"], 6),
    # ... and Qwen3.5's (qwen3vl): its tower with the Conv3d patch embedding, preprocessor_config.json as Qwen ships it.
    (mm.CASES_BY_NAME["qwen3.5-0.8b-vision"], 4),
    # Gemma 4's (issue 38): the 31B's tower (standardized) and E2B's without its audio tower (0-d clipping
    # bounds), processor_config.json alone; a mutation that gives one an audio_config meets its refusal.
    (mm.CASES_BY_NAME["gemma-4-31b-towers"], 3),
    (mm.CASES_BY_NAME["gemma-4-e2b-vision-tower"], 3),
    # SmolVLM2's (issue 38): its text model under a wrapper (text_config over the top level) and its idefics3
    # projector (the processor's size.longest_edge, the wrapper's scale_factor).
    (mm.CASES_BY_NAME["smolvlm2-256m-shape"], 3),
)
BASE_NAMES = tuple(c.name for c, _ in BASES)
PROJECTOR_BASES = frozenset({"gemma-3-4b-vision", "qwen3.5-0.8b-vision", "gemma-4-31b-towers",
                             "gemma-4-e2b-vision-tower", "smolvlm2-256m-shape"})


def build_bases(root: Path, only: Optional[frozenset] = None) -> dict[str, Path]:
    """Every base directory under root (only those named in only, if given), checked to convert; read-only
    from here on (inputs hard-link it)."""
    bases = {}
    for case, _ in BASES:
        if only is not None and case.name not in only:
            continue
        try:
            d = mm.make_case(case, root)
        except mm.FixtureAbsent as e:
            print(f"fuzz: base {case.name} left out: {e}", file=sys.stderr)
            continue
        for mmproj in (False, True) if case.name in PROJECTOR_BASES else (False,):
            out = root / f"{case.name}.check.gguf"
            bc.convert(d, out, bc.Options(mmproj=mmproj))
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
    default_name: bool = False     # the output named as llama.cpp names it, in out's folder (-o DIR)
    mmproj: bool = False           # the directory's vision projector (--mmproj) instead of its text model

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
        # int() of an inf/NaN (a value an earlier mutation made) would stop the campaign itself;
        # the list keeps its length so every other input's random draws stay as they were.
        return rng.choice([0.0, -value, value * 1e10, value * 1e-10,
                           int(value) if math.isfinite(value) else 0, str(value),
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
    "adapter_config.json": (
        "lora_alpha", "r", "peft_type", "use_dora", "use_rslora", "rank_pattern", "alpha_pattern", "bias",
        "lora_bias", "modules_to_save", "trainable_token_indices", "invocation_string", "alora_invocation_tokens",
        "target_modules", "base_model_name_or_path", "layers_to_transform"),
    "config.json": (
        "architectures", "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "num_hidden_layers", "max_position_embeddings", "intermediate_size", "rope_theta",
        "rope_parameters", "rope_scaling", "rms_norm_eps", "head_dim", "vocab_size", "is_causal",
        "attention_bias", "mlp_bias", "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id",
        "unk_token_id", "sep_token_id", "mask_token_id", "cls_token_id", "text_config",
        "quantization_config", "tie_word_embeddings", "n_layer", "dim", "torch_dtype", "vision_config",
        # what Gemma 4's projector reads besides (its audio tower refused)
        "audio_config", "position_embedding_size", "layer_norm_eps"),
    # what a projector reads of the image processor (MmprojModel, Gemma3VisionModel)
    "preprocessor_config.json": ("image_mean", "image_std", "media_proc_cfg", "image_seq_length", "size",
                                 "image_processor_type"),
    "processor_config.json": ("image_processor", "image_seq_length", "image_mean", "image_std", "processor_class"),
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
              ("model.safetensors.index.json", 6), ("preprocessor_config.json", 10), ("processor_config.json", 10))


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

def reshape_tensors(ctx: Ctx, change: Callable[[str, list], Optional[list]]) -> list[str]:
    """Every safetensors file of the input laid out anew with change(name, shape) -> the tensor's new
    shape (its bytes zeros, unless the shape is its own) or None to drop it, the index kept in step;
    what changed."""
    done = []
    dropped = set()
    for file in sorted(n for n in ctx.files() if n.endswith(".safetensors")):
        st = read_st(ctx.dir / file)
        if st is None:
            continue
        pieces = []
        for name, meta, data in st_pieces(st):
            shape = change(name, list(meta["shape"]))
            if shape is None:
                dropped.add(name)
                done.append(f"{name} dropped")
                continue
            if shape != meta["shape"]:
                data = bytes(math.prod(shape) * element_size(meta["dtype"]))
                done.append(f"{name} shape {shape}")
            pieces.append((name, dict(meta, shape=shape), data))
        write_st(ctx.dir / file, relayout(st, pieces), ctx.rng, length_delta=0)
    index = ctx.dir / "model.safetensors.index.json"
    if dropped and index.is_file():
        doc = json.loads(index.read_bytes())
        doc["weight_map"] = {k: v for k, v in doc.get("weight_map", {}).items() if k not in dropped}
        put(index, json.dumps(doc, indent=2).encode())
    return done


# Expert counts for config.json: none, fewer or more than the tensors hold, and counts a record per
# expert would take gigabytes for (behind tensors of no bytes).
MOE_COUNTS = (0, 1, 3, 5, 64, 10**7, 2**31 - 1)


def mutate_moe_shapes(ctx: Ctx) -> Optional[str]:
    """An MoE base's experts against its config (issue 35): a zero dimension in an expert tensor, an
    expert count unlike the tensors', a huge count behind zero-byte stacked tensors reached first, an
    expert numbered past the count.  None for a base without experts."""
    rng = ctx.rng
    if not (ctx.dir / "config.json").is_file():    # an earlier mutation's FIFO would block the read forever
        return None
    config = json.loads((ctx.dir / "config.json").read_bytes())
    if not isinstance(config, dict) or not isinstance(config.get("num_experts"), int):
        return None
    op = rng.choice(["zero-dim", "zero-dim", "count", "huge-count", "renumber"])
    files = sorted(n for n in ctx.files() if n.endswith(".safetensors"))
    if op == "zero-dim":
        experts = [(n, len(v["shape"])) for f in files for n, v in (read_st(ctx.dir / f) or Safetensors({}, b"", 0)).header.items()
                   if ".experts." in n or n.endswith(".mlp.gate.weight")]
        if not experts:
            return None
        target, rank = rng.choice(experts)
        axis = rng.randrange(rank)
        done = reshape_tensors(ctx, lambda name, shape: shape[:axis] + [0] + shape[axis + 1:]
                               if name == target else shape)
        return f"MoE: {', '.join(done)}"
    if op == "renumber":
        if (ctx.dir / "model.safetensors.index.json").is_file():
            return None     # the index would name the old numbers: single files only
        k = rng.choice((4, 7, 999999, 1000000, 10**7))
        for file in files:
            st = read_st(ctx.dir / file)
            pieces = [(n.replace(".experts.3.", f".experts.{k}."), m, d) for n, m, d in st_pieces(st)]
            write_st(ctx.dir / file, relayout(st, pieces), rng)
        return f"MoE: expert 3 renumbered {k}"
    n = rng.choice(MOE_COUNTS) if op == "count" else rng.choice((10**7, 2**31 - 1))
    config["num_experts"] = n
    put(ctx.dir / "config.json", json.dumps(config, indent=2).encode())
    if op == "count":
        return f"MoE: config.json num_experts {n}"
    # Each layer's stacked tensors given n experts and no bytes, and layer 0's down_proj (first by
    # name) dropped half the time so that its gate_up_proj is the first tensor checked.
    drop_down = chance(rng, 0.5)

    def huge(name: str, shape: list) -> Optional[list]:
        if name.endswith("layers.0.mlp.experts.down_proj") and drop_down:
            return None
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            return [n] + shape[1:-1] + [0]
        return shape
    done = reshape_tensors(ctx, huge)
    return f"MoE: config.json num_experts {n}; {', '.join(done) or 'no stacked tensor'}"


FILE_TARGETS = (("config.json", 20), ("tokenizer.json", 12), ("tokenizer_config.json", 12),
                ("generation_config.json", 8), ("special_tokens_map.json", 6), ("safetensors", 24),
                ("model.safetensors.index.json", 8), ("vocab.json", 2), ("merges.txt", 2),
                ("chat_template.jinja", 3), ("preprocessor_config.json", 4), ("processor_config.json", 4),
                ("any", 3))


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
    links = {"symlink-dangling": ("does-not-exist", "dangling symlink"),
             "symlink-loop": (name, "symlink to itself (loop)"),
             "symlink-dir": (".", "symlink to the directory itself"),
             "symlink-devnull": ("/dev/null", "symlink to /dev/null")}
    if op in links:
        target, what = links[op]
        remove(path)
        os.symlink(target, path)
        return f"{name}: {what}"
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
                     "out-in-model-dir", "model-name", "outtype", "dir-is-file", "mmproj"])
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
        part = bc.part_path(ctx.out)
        put(part, b"someone else's")
        if rng.random() < 0.5:
            hold_live_part(part)
            return "output .part already exists, a live run's (its lock held)"
        return "output .part already exists, a dead run's"
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
    if op == "mmproj":
        ctx.mmproj = not ctx.mmproj
        return f"mmproj {ctx.mmproj}"
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
    (lambda ctx: write_card_mutant(ctx), 3),
    (lambda ctx: write_card_names(ctx), 3),
    (mutate_index, 6),
    (mutate_names, 6),
    # None on the bases without experts (another is drawn): on the MoE bases, about one mutation in four.
    (mutate_moe_shapes, 30),
)


def build_input(seed: str, index: int, bases: dict[str, Path], run: Path,
                only: Optional[int] = None) -> tuple[Ctx, str, list[str]]:
    """Input `index` of `seed` under run/ (emptied first): (context, base name, mutation descriptions)."""
    release_live_parts()       # an input built and never run (a replay of one mutation) holds none
    if run.exists():
        shutil.rmtree(run)
    (run / "out").mkdir(parents=True)
    rng = random.Random(f"{seed}/{index}")
    base = weighted(rng, [(c.name, w) for c, w in BASES if c.name in bases])
    n = rng.choice([1, 1, 1, 1, 2, 2, 3])
    model = run / "in" / bases[base].name
    link_base(bases[base], model)
    ctx = Ctx(rng, model, run / "out" / "model.gguf", str(model))
    if base in PROJECTOR_BASES:
        ctx.mmproj = rng.random() < 0.75
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
                signature=getattr(exc, "signature", None)
                or f"{etype} @ {mine[-1].name if mine else '?'}:{mine[-1].lineno if mine else '?'}",
                traceback="".join(traceback.format_exception(exc))[-4000:])


# The .part files planted by the "output .part already exists" mutation that a live run holds: their
# locked descriptors, kept open (in this process, the one that converts) until the input is judged.
LIVE_PARTS: dict[str, int] = {}


def hold_live_part(part: Path) -> None:
    import fcntl
    fd = os.open(part, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    LIVE_PARTS[os.path.abspath(part)] = fd


def release_live_parts() -> list[str]:
    held = list(LIVE_PARTS)
    for fd in LIVE_PARTS.values():
        os.close(fd)
    LIVE_PARTS.clear()
    return held


STALE_NOTICE = re.compile(r"removed (.*), left behind by a conversion that is no longer running", re.S)


def stale_part_findings(before: dict, after: dict, root: Path, notices: list[str], live: list[str]) -> tuple[set, list]:
    """What the stale-.part rule promises, checked: a .part that was there before the run and is gone
    after it was a dead run's, and exactly one notice names it; a live run's (its lock held) is left
    as it was.  The names it accounts for (not partial outputs), and its findings."""
    said = Counter(os.path.abspath(m.group(1)) for m in map(STALE_NOTICE.fullmatch, notices) if m)
    accounted, findings = set(), []
    for rel in sorted(set(before) - set(after)):
        path = os.path.abspath(root / rel)
        if not rel.endswith(".part") or path in live:
            continue
        accounted.add(rel)
        if said[path] != 1:
            findings.append(f"a dead run's .part removed with {said[path]} lines saying so: {rel}")
    for path in live:
        rel = os.path.relpath(path, root)
        if before.get(rel) != after.get(rel):
            findings.append(f"a live run's .part changed: {rel}")
    findings += [f"a notice about a .part that was not removed: {p}" for p in said
                 if os.path.relpath(p, root) not in accounted]
    return accounted, findings


def leftovers(before: dict, after: dict, allowed: set[str]) -> list[str]:
    changed = []
    for rel in sorted(set(before) | set(after)):
        if rel in allowed:
            continue
        if before.get(rel) != after.get(rel):
            state = "new" if rel not in before else "gone" if rel not in after else "changed"
            changed.append(f"{state}: {rel}")
    return changed


class DerivedName(Exception):
    """A default output name that left its folder, held a control character or was not written as
    derived: a finding, counted as a crash, its kind of failure its signature."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.signature = f"DerivedName @ {kind}"


def check_derived_name(ctx: Ctx, options, written: Path) -> None:
    """DerivedName unless the file convert() wrote for `-o FOLDER` (it names it as main does) is one
    printable file name inside FOLDER, and exactly llama.cpp's default name (never filled as a template)."""
    folder = ctx.out.parent
    if written.parent != folder or written.name in ("", ".", "..") or \
            os.path.realpath(written.parent) != os.path.realpath(folder):
        raise DerivedName(f"the derived name {os.path.relpath(written, folder)!r} leaves its folder", "leaves")
    if not written.name.isprintable():
        raise DerivedName(f"the derived name {written.name!r} holds control characters", "control")
    model_dir = Path(ctx.dir_arg)
    expected = bc.default_output_name(model_dir, options, bc.tensor_plan_of(model_dir, options))
    if written.name != expected:
        raise DerivedName(f"llama.cpp's name {expected!r} was written as {written.name!r}", "template")


def run_input(ctx: Ctx, base: str, mutations: list[str], index: int, run: Path, timeout: float) -> Outcome:
    # The run directory's parent is the working directory: relative writes land there too.
    before = tree_fingerprint(run.parent)
    notices: list[str] = []
    options = bc.Options(outtype=ctx.outtype, model_name=ctx.model_name, notice=notices.append, mmproj=ctx.mmproj)
    result: Outcome
    start = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        report = bc.convert(ctx.dir_arg, ctx.out.parent if ctx.default_name else ctx.out, options)
        if ctx.default_name:
            try:
                check_derived_name(ctx, options, Path(report.out))
            except DerivedName:
                Path(report.out).unlink()
                raise
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
    live = release_live_parts()
    after = tree_fingerprint(run.parent)
    # A dead run's .part replaced, with one line saying so, is the stale-.part rule at work, not a
    # partial output; a live one must be left alone.
    allowed, findings = stale_part_findings(before, after, run.parent, notices, live)
    result.leftovers += findings
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


def sole_mutation(mutations: list[str], reproduces: Callable[[int], bool]) -> Optional[int]:
    """The one mutation k ("[k] ...") that alone reproduces a finding, if there is one: the only
    mutation of a single-mutation input, else the first k with reproduces(k)."""
    ks = [int(m[1:m.index("]")]) for m in mutations]
    if len(ks) < 2:
        return ks[0] if ks else None
    return next((k for k in ks if reproduces(k)), None)


def minimal_mutation(seed: str, index: int, bases, run: Path, timeout: float, outcome: Outcome) -> Optional[int]:
    """The one mutation that alone reproduces the crash's signature, if there is one."""
    def reproduces(k: int) -> bool:
        ctx, base, done = build_input(seed, index, bases, run, only=k)
        if not done:
            return False
        o = run_input(ctx, base, done, index, run, timeout)
        return o.kind == "crash" and o.signature == outcome.signature
    return sole_mutation(outcome.mutations, reproduces)


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


def worker_directory(work: str, memory_mb: int) -> Path:
    """A worker's own directory under work, made after its memory is limited and SIGALRM set to
    raise Timeout."""
    limit_memory(memory_mb)
    run = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    signal.signal(signal.SIGALRM, _alarm)
    return run


def _worker_init(seed: str, bases: dict, work: str, timeout: float, memory_mb: int) -> None:
    run = worker_directory(work, memory_mb)
    os.chdir(run)
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


class Tracker:
    """What a random campaign (the converter's, --gguf's) keeps as it runs: counts, unique findings
    by signature, the slowest inputs, its pace; `line` and `report` are the campaign's own."""
    flag = ""  # the campaign's option before --seed in a replay command

    def __init__(self, seed: str, total: int):
        self.seed, self.total = seed, total
        self.counts = Counter()
        self.uniques: dict[str, Unique] = {}
        self.done = 0
        self.start = time.perf_counter()
        self.slowest: list = []

    def replay(self, index: int, only: Optional[int] = None) -> str:
        extra = f" --only {only}" if only is not None else ""
        return f"python3 oracle/fuzz.py {self.flag}--seed {self.seed} --replay {index}{extra}"

    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.start, 1e-9)

    def line(self) -> str:
        raise NotImplementedError

    def report(self) -> dict:
        raise NotImplementedError

    def progress(self) -> str:
        return (f"{time.strftime('%H:%M:%S')} {self.done}/{self.total} {self.rate():.1f} inputs/s | "
                f"{self.line()}")


class Campaign(Tracker):
    def __init__(self, seed: str, total: int):
        super().__init__(seed, total)
        self.partials: list[dict] = []
        self.refusals = Counter()
        self.successes_by_base = Counter()
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

    def line(self) -> str:
        c = self.counts
        return (f"fuzz: {self.done} inputs, {c['crash']} crashes ({len(self.uniques)} unique), "
                f"{c['partial']} partial outputs, {c['success']} successes, {c['refusal']} refusals")

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


def campaign_outputs(args, work: Path, mode: str = "") -> tuple[Optional[Path], Optional[Path]]:
    """The --progress and --report paths (None when not asked for), the progress file begun with
    the campaign's settings."""
    progress = Path(args.progress).resolve() if args.progress else None
    report = Path(args.report).resolve() if args.report else None
    if progress:
        progress.write_text(f"{time.strftime('%H:%M:%S')} start: {mode}seed {args.seed}, {args.inputs} inputs, "
                            f"{args.workers} worker(s), work dir {work}\n", encoding="utf-8")
    return progress, report


def campaign_results(args, init: Callable, init_args: tuple, run: Callable, chunksize: int,
                     started: Callable[[], object] = lambda: None) -> tuple[Iterator, Optional[object]]:
    """run over the campaign's input indices and the pool running it: with one worker in this process
    (init first, then started()) and no pool, else unordered in --workers forked processes."""
    indices = range(args.start, args.start + args.inputs)
    if args.workers <= 1:
        init(*init_args)
        started()
        return map(run, indices), None
    import multiprocessing
    pool = multiprocessing.get_context("fork").Pool(args.workers, init, init_args)
    return pool.imap_unordered(run, indices, chunksize=chunksize), pool


def write_progress(camp: Tracker, progress: Optional[Path], report: Optional[Path]) -> None:
    """A progress line appended (--progress) and the report so far written (--report)."""
    if progress:
        with open(progress, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(camp.progress() + "\n")
    if report:
        write_atomically(report, json.dumps(camp.report(), indent=2, ensure_ascii=True))


def campaign_done(args, camp: Tracker, progress: Optional[Path], work: Path) -> None:
    """The campaign's last progress line, its work directory removed (unless --keep-work), its
    summary line printed."""
    if progress:
        with open(progress, "a", encoding="utf-8") as f:
            f.write(camp.progress() + " (done)\n")
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    print(camp.line())


def run_campaign(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="bankml-fuzz-", dir=args.workdir)).resolve()
    bases = build_bases(work / "bases", PROJECTOR_BASES if args.mmproj else None)
    fingerprint = tree_fingerprint(work / "bases", with_hash=True)
    camp = Campaign(args.seed, args.inputs)
    progress, report = campaign_outputs(args, work)
    bases_s = {k: str(v) for k, v in bases.items()}
    init = (args.seed, bases_s, str(work), args.timeout, args.memory_mb)
    results, pool = campaign_results(args, _worker_init, init, _worker_run, chunksize=8)
    try:
        for outcome, minimal in results:
            camp.add(outcome, minimal)
            new_crash = outcome.kind == "crash" and camp.uniques[outcome.signature].count == 1
            if new_crash and not args.quiet:
                print(f"new crash #{len(camp.uniques)} at input {outcome.index}: {outcome.signature}: "
                      f"{outcome.message[:120]!r}", file=sys.stderr, flush=True)
            if camp.done % args.every == 0 or new_crash:
                write_progress(camp, progress, report)
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
    campaign_done(args, camp, progress, work)
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


# (label, edit of the fuzz-bf16 base); each is one finding of the first campaigns (now a refusal with a test) or a near miss.
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
    bases = build_bases(work / "bases", PROJECTOR_BASES if args.mmproj else None)
    run = work / "r"
    limit_memory(args.memory_mb)
    signal.signal(signal.SIGALRM, _alarm)
    os.chdir(work)  # as in a campaign: the run directory's parent is the working directory
    ctx, base, done = build_input(args.seed, args.replay, bases, run, only=args.only)
    print(f"input {args.replay} of seed {args.seed}: base {base}")
    for m in done:
        print(f"  {m}")
    print(f"  convert({ctx.dir_arg!r}, {str(ctx.out)!r}, Options(outtype={ctx.outtype!r}, "
          f"model_name={short(ctx.model_name)}, mmproj={ctx.mmproj}))")
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


# ---------------------------------------------------------------------------------------------
# GGUF mode (--gguf): mutated GGUF files through the reader and everything built on it (the
# listings, inspect --json, diff, verify).  Each call must return or raise GGUFError / Refusal.
# ---------------------------------------------------------------------------------------------

# The fuzzer keeps its own copy of the format's numbers instead of trusting the reader's tables:
# a mutation must be able to say "type 13" without the reader's opinion of what 13 is.
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
(T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY,
 T_UINT64, T_INT64, T_FLOAT64) = range(13)
SCALAR_SIZES = {T_UINT8: 1, T_INT8: 1, T_UINT16: 2, T_INT16: 2, T_UINT32: 4, T_INT32: 4, T_FLOAT32: 4,
                T_BOOL: 1, T_UINT64: 8, T_INT64: 8, T_FLOAT64: 8}
SCALAR_FMTS = {T_UINT8: "B", T_INT8: "b", T_UINT16: "H", T_INT16: "h", T_UINT32: "I", T_INT32: "i",
               T_FLOAT32: "f", T_BOOL: "B", T_UINT64: "Q", T_INT64: "q", T_FLOAT64: "d"}
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30


# --- Base files: small valid GGUFs, most written with the converter's own writer
# --- (gguf_header / encode_value / KV), one converted from a tiny model directory.

@dataclass
class GBase:
    name: str
    path: Path
    pin: Path          # a FORK.json whose output is this file, for verify()


def _tensor_bytes(name: str, n: int) -> bytes:
    return random.Random(f"gguf-base/{name}").randbytes(n)


def _planned(name: str, ggml_type: int, dims: tuple[int, ...]) -> bc.PlannedTensor:
    """A tensor for bc.gguf_header: only its name, type, dims and byte count matter there."""
    nbytes = bc.ggml_nbytes(ggml_type, math.prod(dims))
    src = bc.SourceTensor(name, "F32", tuple(reversed(dims)), Path("."), 0, nbytes)
    return bc.PlannedTensor(name, src, ggml_type, dims, 0)


def written_gguf(kvs: list, tensors: list) -> bytes:
    """A GGUF as bankml_convert writes one: its header, then each tensor's bytes padded to 32."""
    data = b"".join(_tensor_bytes(t.name, t.nbytes) + bytes(bc.padding(t.nbytes)) for t in tensors)
    return bc.gguf_header(kvs, tensors) + data


def _f32(bits: int) -> float:
    return struct.unpack("<f", U32.pack(bits))[0]


def every_type_gguf() -> bytes:
    """One key of every scalar type, an array of every element type, and four small tensors."""
    KV = bc.KV
    kvs = [
        KV("general.architecture", T_STRING, "llama"), KV("general.alignment", T_UINT32, 32),
        KV("t.u8", T_UINT8, 7), KV("t.i8", T_INT8, -3), KV("t.u16", T_UINT16, 65535),
        KV("t.i16", T_INT16, -2), KV("t.u32", T_UINT32, 4000000000), KV("t.i32", T_INT32, -7),
        KV("t.f32", T_FLOAT32, 0.1), KV("t.f32.nan", T_FLOAT32, _f32(0x7FC00001)),
        KV("t.f32.negzero", T_FLOAT32, -0.0), KV("t.bool", T_BOOL, True), KV("t.bool.false", T_BOOL, False),
        KV("t.str", T_STRING, "h\u00e9llo \U0001f4a5 \u4e16"), KV("t.str.empty", T_STRING, ""),
        KV("t.u64", T_UINT64, 2**64 - 1), KV("t.i64", T_INT64, -2**63), KV("t.f64", T_FLOAT64, -1.5e300),
        KV("a.u8", T_UINT8, [0, 1, 255], True), KV("a.i8", T_INT8, [-128, 127], True),
        KV("a.u16", T_UINT16, [1, 2], True), KV("a.i16", T_INT16, [-1], True),
        KV("a.u32", T_UINT32, [3, 4, 5], True), KV("a.i32", T_INT32, [-5, 0, 5], True),
        KV("a.f32", T_FLOAT32, [0.5, -0.0, float("inf")], True), KV("a.bool", T_BOOL, [True, False], True),
        KV("a.str", T_STRING, ["a", "", "\u00e9\u00e9", "<|im_end|>"], True),
        KV("a.u64", T_UINT64, [2**63], True), KV("a.i64", T_INT64, [-1, 1], True),
        KV("a.f64", T_FLOAT64, [1e-310, float("nan")], True), KV("a.empty", T_UINT8, [], True),
    ]
    tensors = [_planned("t.f32", GGML_F32, (4, 2)), _planned("t.f16", GGML_F16, (8,)),
               _planned("t.q8_0", GGML_Q8_0, (32, 2)), _planned("t.bf16", GGML_BF16, (3,))]
    return written_gguf(kvs, tensors)


def llama_tiny_gguf() -> bytes:
    """The keys a converted Llama carries, with a ten-token vocabulary and three tensors."""
    KV = bc.KV
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "\u0120", "\u0120a", "ab", "\u010a", "c"]
    kvs = [
        KV("general.architecture", T_STRING, "llama"), KV("general.type", T_STRING, "model"),
        KV("general.name", T_STRING, "Tiny"), KV("general.size_label", T_STRING, "1K"),
        KV("llama.block_count", T_UINT32, 1), KV("llama.context_length", T_UINT32, 2048),
        KV("llama.embedding_length", T_UINT32, 8), KV("llama.feed_forward_length", T_UINT32, 16),
        KV("llama.attention.head_count", T_UINT32, 2), KV("llama.attention.head_count_kv", T_UINT32, 1),
        KV("llama.rope.freq_base", T_FLOAT32, 100000.0),
        KV("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5),
        KV("general.file_type", T_UINT32, 1), KV("llama.vocab_size", T_UINT32, len(tokens)),
        KV("general.quantization_version", T_UINT32, 2), KV("tokenizer.ggml.model", T_STRING, "gpt2"),
        KV("tokenizer.ggml.pre", T_STRING, "smollm"), KV("tokenizer.ggml.tokens", T_STRING, tokens, True),
        KV("tokenizer.ggml.token_type", T_INT32, [3, 3, 3] + [1] * 7, True),
        KV("tokenizer.ggml.merges", T_STRING, ["a b", "\u0120 a"], True),
        KV("tokenizer.ggml.bos_token_id", T_UINT32, 1), KV("tokenizer.ggml.eos_token_id", T_UINT32, 2),
        KV("tokenizer.ggml.add_bos_token", T_BOOL, False),
        KV("tokenizer.chat_template", T_STRING, "{% for m in messages %}\n{{ m['content'] }}\n{% endfor %}"),
    ]
    tensors = [_planned("token_embd.weight", GGML_F16, (8, 10)), _planned("output_norm.weight", GGML_F32, (8,)),
               _planned("blk.0.attn_q.weight", GGML_Q8_0, (32, 8))]
    return written_gguf(kvs, tensors)


def kv_only_gguf() -> bytes:
    KV = bc.KV
    return written_gguf([KV("general.architecture", T_STRING, "llama"), KV("general.name", T_STRING, "kv only"),
                         KV("x.u32", T_UINT32, 1), KV("x.strs", T_STRING, ["x", "y"], True)], [])


def block_types_gguf() -> bytes:
    """One tensor of every ggml type the reader knows, one block (one row) each."""
    tensors = [GTensor(f"t.{name.lower()}".encode(), [block, 1] if block > 1 else [3, 2], code, 0)
               for code, (name, block, _) in sorted(bc.GGML_TYPES.items())]
    m = GModel(b"GGUF", 3, [GKv(b"general.architecture", T_STRING, str_payload(b"llama"))], tensors, b"")
    return encode_model(gguf_relayout(m, random.Random("block-types")))


def odd_shapes_gguf() -> bytes:
    """Shapes a converter never writes but the format allows: zero elements, four dims, ne0 = 1."""
    tensors = [GTensor(b"zero", [0], GGML_F32, 0), GTensor(b"zero.2d", [5, 0], GGML_F16, 0),
               GTensor(b"four.dims", [1, 2, 1, 3], GGML_F32, 0), GTensor(b"column", [1, 7], GGML_BF16, 0),
               GTensor(b"scalar", [], GGML_F32, 0), GTensor(b"zero.q8", [32, 0], GGML_Q8_0, 0)]
    kvs = [GKv(b"general.architecture", T_STRING, str_payload(b"odd"))]
    return encode_model(gguf_relayout(GModel(b"GGUF", 3, kvs, tensors, b""), random.Random("odd-shapes")))


def realigned(data: bytes, alignment: int) -> bytes:
    """data (a valid GGUF) laid out again for another general.alignment."""
    m = walk(data).model
    kvs = [kv for kv in m.kvs if kv.key != b"general.alignment"]
    kvs.insert(0, GKv(b"general.alignment", T_UINT32, U32.pack(alignment)))
    return encode_model(gguf_relayout(GModel(m.magic, m.version, kvs, m.tensors, m.data), random.Random(alignment)))


# (name, weight): hand-built files take almost every input; the converted one parses 49,152
# tokens and merges (about 0.2 s a read), so it gets few inputs and its mutations aim at the header.
GGUF_BASES: tuple[tuple[str, float], ...] = (
    ("every-type", 26), ("llama-tiny", 20), ("kv-only", 6), ("empty", 4), ("block-types", 12),
    ("align-1", 8), ("align-256", 5), ("odd-shapes", 12), ("converted", 0.15),
)


def build_gguf_bases(root: Path) -> dict[str, GBase]:
    """Every base file under root with its pin, each checked to read, and to diff as identical to itself."""
    root.mkdir(parents=True, exist_ok=True)
    every = every_type_gguf()
    made = {"every-type": every, "llama-tiny": llama_tiny_gguf(), "kv-only": kv_only_gguf(),
            "empty": written_gguf([], []), "block-types": block_types_gguf(),
            "align-1": realigned(every, 1), "align-256": realigned(llama_tiny_gguf(), 256),
            "odd-shapes": odd_shapes_gguf()}
    bases = {}
    for name, data in made.items():
        path = root / f"{name}.gguf"
        path.write_bytes(data)
        report = bc.Report(path, hashlib.sha256(data).hexdigest(), len(data), 0, 0, 0, name, ())
        bases[name] = GBase(name, path, _write_pin(path, report))
    model = mm.make_case(mm.Case("fuzz-bf16", special_values=True, dims=TINY), root / "models")
    path = root / "converted.gguf"
    bases["converted"] = GBase("converted", path,
                               _write_pin(path, bc.convert(model, path, bc.Options(workers=1))))
    for b in bases.values():
        bc.read_gguf(b.path)
        assert bc.diff_gguf(b.path, b.path) == [], b.name
        assert bc.verify(b.path, b.pin)[1], b.name
    return bases


def _write_pin(path: Path, report) -> Path:
    pin = path.with_name(path.name + ".FORK.json")
    pin.write_text(bc.fork_json(report, "oracle/fuzz.py --gguf base"), encoding="utf-8")
    return pin


# --- A lenient walk of a GGUF's fields, independent of the reader: where each count, length,
# --- tag and offset sits (for targeted mutations) and, when it all decodes, an editable model.

@dataclass
class GField:
    at: int
    size: int
    kind: str


@dataclass
class GKv:
    key: bytes
    vtype: int
    payload: bytes     # everything after the type tag


@dataclass
class GTensor:
    name: bytes
    dims: list
    gtype: int
    offset: int


@dataclass
class GModel:
    magic: bytes
    version: int
    kvs: list
    tensors: list
    data: bytes        # from where the tensor data starts to the end of the file


@dataclass
class GWalk:
    fields: list
    model: Optional[GModel]   # None unless the header, every kv and every tensor info decoded
    end: int                  # where the walk stopped (the end of the tensor infos if it got there)


class _Short(Exception):
    """The walk ran out of bytes or met a tag it cannot follow."""


class _Walker:
    def __init__(self, data: bytes):
        self.data, self.pos, self.fields, self.record = data, 0, [], True

    def take(self, n: int, kind: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise _Short
        if n and self.record:
            self.fields.append(GField(self.pos, n, kind))
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def u32(self, kind: str) -> int:
        return U32.unpack(self.take(4, kind))[0]

    def u64(self, kind: str) -> int:
        return U64.unpack(self.take(8, kind))[0]

    def string(self, kind: str) -> bytes:
        return self.take(self.u64(kind + "_len"), kind)

    def value(self, vtype: int, depth: int) -> None:
        if vtype in SCALAR_SIZES:
            self.take(SCALAR_SIZES[vtype], "scalar")
        elif vtype == T_STRING:
            self.string("text")
        elif vtype == T_ARRAY and depth < 3:
            etype = self.u32("elem_type")
            n = self.u64("array_len")
            if n > len(self.data) - self.pos:
                raise _Short
            if etype in SCALAR_SIZES:
                self.take(n * SCALAR_SIZES[etype], "array_data")
                return
            # 49,152 token strings would make as many fields; a sample of them is enough to aim at
            was = self.record
            for i in range(n):
                self.record = was and (i < 16 or i >= n - 16 or i % 1009 == 0)
                self.value(etype, depth + 1)
            self.record = was
        else:
            raise _Short


def walk(data: bytes) -> GWalk:
    w = _Walker(data)
    try:
        magic = w.take(4, "magic")
        version = w.u32("version")
        n_tensors = w.u64("tensor_count")
        n_kv = w.u64("kv_count")
        if n_kv > len(data) or n_tensors > len(data):
            raise _Short
        kvs = []
        for _ in range(n_kv):
            key = w.string("key")
            vtype = w.u32("type")
            start = w.pos
            w.value(vtype, 0)
            kvs.append(GKv(key, vtype, data[start:w.pos]))
        tensors = []
        for _ in range(n_tensors):
            name = w.string("tname")
            n_dims = w.u32("n_dims")
            if n_dims > 16:
                raise _Short
            dims = [w.u64("dim") for _ in range(n_dims)]
            tensors.append(GTensor(name, dims, w.u32("ggml_type"), w.u64("data_offset")))
    except _Short:
        return GWalk(w.fields, None, w.pos)
    start = w.pos + (-w.pos % layout_alignment(kvs))
    return GWalk(w.fields, GModel(magic, version, kvs, tensors, data[start:]), w.pos)


_BASE_WALKS: dict[int, tuple[bytes, GWalk]] = {}


def base_walk(data: bytes) -> GWalk:
    """walk(data) of a base file, computed once per process: the converted base takes 0.2 s."""
    hit = _BASE_WALKS.get(id(data))
    if hit is None or hit[0] is not data:
        hit = _BASE_WALKS[id(data)] = (data, walk(data))
    return hit[1]


def layout_alignment(kvs: list) -> int:
    """The alignment a file with these kvs is laid out for; 32 when the key is absent or unusable.

    Capped at 64 KiB: a mutant declaring 2**31 must not make the fuzzer write 2 GB of padding.
    """
    for kv in kvs:
        if kv.key == b"general.alignment":
            if kv.vtype == T_UINT32 and len(kv.payload) == 4:
                a = U32.unpack(kv.payload)[0]
                if 0 < a <= 1 << 16 and not a & (a - 1):
                    return a
            return 32
    return 32


def str_payload(b: bytes) -> bytes:
    return U64.pack(len(b)) + b


def encode_model(m: GModel, n_tensors: Optional[int] = None, n_kv: Optional[int] = None) -> bytes:
    parts = [m.magic, U32.pack(m.version), U64.pack(len(m.tensors) if n_tensors is None else n_tensors),
             U64.pack(len(m.kvs) if n_kv is None else n_kv)]
    for kv in m.kvs:
        parts += [str_payload(kv.key), U32.pack(kv.vtype), kv.payload]
    for t in m.tensors:
        parts += [str_payload(t.name), U32.pack(len(t.dims)), b"".join(U64.pack(d) for d in t.dims),
                  U32.pack(t.gtype), U64.pack(t.offset)]
    head = b"".join(parts)
    return head + bytes(-len(head) % layout_alignment(m.kvs)) + m.data


def tensor_nbytes(t: GTensor) -> Optional[int]:
    """Bytes of t's data if it is small and well formed (None otherwise), from the format's block sizes."""
    if t.gtype not in bc.GGML_TYPES or any(d > 1 << 20 for d in t.dims):
        return None
    _, block, size = bc.GGML_TYPES[t.gtype]
    n = math.prod(t.dims)
    if (t.dims[0] if t.dims else 1) % block or n // block * size > 1 << 20:
        return None
    return n // block * size


def gguf_relayout(m: GModel, rng: random.Random) -> Optional[GModel]:
    """m with every tensor's data placed in order and padded as gguf-py does: a file the reader
    should accept (None if a tensor is too big or malformed to place); old bytes are kept."""
    align = layout_alignment(m.kvs)
    tensors, parts, at = [], [], 0
    for t in m.tensors:
        n = tensor_nbytes(t)
        if n is None:
            return None
        old = m.data[t.offset:t.offset + n] if t.offset < len(m.data) else b""
        body = old + rng.randbytes(n - len(old))
        tensors.append(GTensor(t.name, list(t.dims), t.gtype, at))
        parts += [body, bytes(-n % align)]
        at += n + (-n % align)
    return GModel(m.magic, m.version, [GKv(k.key, k.vtype, k.payload) for k in m.kvs], tensors, b"".join(parts))


def copy_model(m: GModel) -> GModel:
    return GModel(m.magic, m.version, [GKv(k.key, k.vtype, k.payload) for k in m.kvs],
                  [GTensor(t.name, list(t.dims), t.gtype, t.offset) for t in m.tensors], m.data)


# --- Value pools: boundary numbers for counts, lengths, tags and offsets; hostile keys, names,
# --- strings and typed values for new or changed kv pairs.

U64_VALUES = (0, 1, 2, 3, 7, 8, 13, 14, 24, 31, 32, 33, 255, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
              2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 32, 2**64 - 1, 1024**3, 1024**3 + 1)
U32_VALUES = (0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 31, 32, 255, 256, 2**16, 2**31 - 1, 2**31, 2**32 - 1)
TYPE_TAGS = tuple(range(14)) + (255, 2**31, 2**32 - 1)
GGML_CODES = tuple(range(44)) + (255, 2**31, 2**32 - 1)
N_DIMS = (0, 1, 2, 3, 4, 5, 8, 2**31, 2**32 - 1)
VERSIONS = (0, 1, 2, 3, 4, 0x03000000, 0x00030000, 2**32 - 1)
MAGICS = (b"GGUF", b"GGML", b"gguf", b"FUGG", b"\x00\x00\x00\x00", b"GGJT", b"GGU\x00")
KEYS = (b"general.alignment", b"", b"a", b"a\nb", b"a\rb", b"\xff", b"\xc3", b"\xed\xa0\x80", b"general.name",
        b"general.architecture", b"x" * 300, "\u043a\u043b\u044e\u0447".encode(), b"k\x00", b"\x1b[2J",
        b"tokenizer.ggml.tokens", b"general.alignment ", b"GENERAL.ALIGNMENT", b"\xef\xbb\xbfkey")
# 63 and 64 bytes: either side of the longest tensor name gguf.cpp accepts (GGML_MAX_NAME - 1)
NAMES = (b"", b"t", b"a\nb", b"\xff", b"\xc3\xa9", b"x" * 70000, b"n" * 63, b"n" * 64, b"token_embd.weight",
         b"\x00", "\u2028".encode())
STRINGS = (b"", b"x", b"a\nb", b"\r\n", "\u00e9".encode(), "\U0001f4a5".encode(), b"\xff", b"\xc3",
           b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\x80", b"\x00", b"\x1b[31mred", "\u2028".encode(),
           b"x" * 70000, b"'\"\\")
DIMS = ([], [0], [1], [0, 4], [4, 0], [3], [33], [31, 2], [256], [1, 1, 1, 1], [1, 1, 1, 1, 1], [2**31],
        [2**32, 2**32], [2**62, 4], [2**63 - 1], [2**63], [2**64 - 1], [1, 2**63 - 1], [32, 2**40],
        [2**21], [8, 2**61])
# scalar bit patterns by size: zero, all ones, sign bit only, NaN / infinity / -0.0 for floats
SCALAR_BITS = {1: (0, 1, 2, 0x7F, 0x80, 0xFF), 2: (0, 0xFFFF, 0x8000, 0x7C00, 0x7E01),
               4: (0, 0xFFFFFFFF, 0x80000000, 0x7FC00000, 0x7F800001, 0x7F800000, 0xFF800000, 1, 0x7F7FFFFF),
               8: (0, 2**64 - 1, 2**63, 0x7FF8000000000000, 0x7FF0000000000001, 0x7FF0000000000000, 1)}


def scalar_payload(vtype: int, rng: random.Random) -> bytes:
    size = SCALAR_SIZES[vtype]
    return rng.choice(SCALAR_BITS[size]).to_bytes(size, "little")


def array_payload(etype: int, elements: list[bytes], n: Optional[int] = None) -> bytes:
    return U32.pack(etype) + U64.pack(len(elements) if n is None else n) + b"".join(elements)


def element_payload(etype: int, rng: random.Random, depth: int = 0) -> bytes:
    if etype in SCALAR_SIZES:
        return scalar_payload(etype, rng)
    if etype == T_STRING:
        return str_payload(rng.choice(STRINGS[:-2]))
    if etype == T_ARRAY and depth < 2:
        inner = rng.choice((T_UINT8, T_STRING, T_ARRAY))
        return array_payload(inner, [element_payload(inner, rng, depth + 1) for _ in range(rng.randrange(3))])
    return rng.randbytes(rng.choice((0, 1, 4, 8)))


def draw_gguf_value(rng: random.Random) -> tuple[int, bytes, str]:
    """(type tag, payload, description) of a value for a new or changed kv."""
    r = rng.random()
    if r < 0.35:
        vtype = rng.choice(tuple(SCALAR_SIZES))
        payload = scalar_payload(vtype, rng)
        return vtype, payload, f"type {vtype} bytes {payload.hex()}"
    if r < 0.55:
        s = rng.choice(STRINGS)
        return T_STRING, str_payload(s), f"string {s[:20]!r}({len(s)} bytes)"
    if r < 0.9:
        etype = rng.choice(tuple(range(13)) + (T_ARRAY, T_ARRAY, 13, 2**32 - 1))
        n = rng.choice((0, 1, 3, 100))
        elements = [element_payload(etype, rng) for _ in range(n)]
        claimed = rng.choice((None, None, None, n + 1, n - 1 if n else 2**64 - 1, 2**63))
        return T_ARRAY, array_payload(etype, elements, claimed), \
            f"array of type {etype}, {n} elements" + (f" claiming {claimed}" if claimed is not None else "")
    vtype = rng.choice((13, 255, 2**31, 2**32 - 1))
    payload = rng.randbytes(rng.choice((0, 1, 8)))
    return vtype, payload, f"unknown type {vtype} with {len(payload)} bytes"


# --- Mutations: each takes a GCtx (its rng, the bytes so far, the other bases) and returns (new
# --- bytes, what it did), or None when it does not apply (the input then draws another).  Raw ones damage bytes where
# --- the walk says a field sits; model ones edit the decoded file and write it again.

@dataclass
class GCtx:
    rng: random.Random
    data: bytes
    others: dict            # base name -> bytes, for splices
    _walk: Optional[GWalk] = None

    def walk(self) -> GWalk:
        if self._walk is None:
            self._walk = walk(self.data)
        return self._walk


FIELD_KINDS = (("tensor_count", 6), ("kv_count", 6), ("version", 2), ("magic", 1), ("key_len", 6),
               ("text_len", 6), ("tname_len", 5), ("type", 8), ("elem_type", 6), ("array_len", 7),
               ("n_dims", 6), ("dim", 8), ("ggml_type", 7), ("data_offset", 8), ("scalar", 4), ("key", 3),
               ("text", 4), ("tname", 3), ("array_data", 2))


def pick_field(ctx: GCtx, kinds=FIELD_KINDS) -> Optional[GField]:
    fields = ctx.walk().fields
    present = {f.kind for f in fields}
    options = [(k, w) for k, w in kinds if k in present]
    if not options:
        return None
    kind = weighted(ctx.rng, options)
    return ctx.rng.choice([f for f in fields if f.kind == kind])


def field_value(ctx: GCtx, f: GField) -> bytes:
    """A replacement for field f of the same size: a boundary value or a neighbour of the old one."""
    rng, old = ctx.rng, ctx.data[f.at:f.at + f.size]
    if f.kind == "magic":
        return rng.choice(MAGICS)
    if f.kind in ("key", "text", "tname", "array_data"):
        i = rng.randrange(f.size)
        return old[:i] + bytes([rng.choice((0xFF, 0xC0, 0x80, 0xED, 0x00, 0x0A, old[i] ^ 0x40))]) + old[i + 1:]
    if f.kind == "scalar":
        return rng.choice(SCALAR_BITS[f.size]).to_bytes(f.size, "little")
    if f.size == 4:
        pool = {"type": TYPE_TAGS, "elem_type": TYPE_TAGS, "ggml_type": GGML_CODES, "n_dims": N_DIMS,
                "version": VERSIONS}.get(f.kind, U32_VALUES)
        return U32.pack(rng.choice(pool))
    value = U64.unpack(old)[0]
    after = len(ctx.data) - f.at - 8
    near = (value + 1, value - 1, value * 2, value + 32, after, after + 1, len(ctx.data))
    return U64.pack(max(0, min(2**64 - 1, rng.choice(U64_VALUES + near))))


def m_field(ctx: GCtx):
    f = pick_field(ctx)
    if f is None:
        return None
    new = field_value(ctx, f)
    old = ctx.data[f.at:f.at + f.size]
    shown = (f"{int.from_bytes(old, 'little')} -> {int.from_bytes(new, 'little')}" if f.size in (4, 8)
             and f.kind not in ("key", "text", "tname", "array_data", "magic", "scalar")
             else f"{old[:16].hex()} -> {new[:16].hex()}")
    return ctx.data[:f.at] + new + ctx.data[f.at + f.size:], f"{f.kind} field at byte {f.at}: {shown}"


def m_length_past_end(ctx: GCtx):
    f = pick_field(ctx, (("key_len", 3), ("text_len", 3), ("tname_len", 2), ("array_len", 3), ("kv_count", 1),
                         ("tensor_count", 1)))
    if f is None:
        return None
    after = len(ctx.data) - f.at - 8
    value = max(0, after + ctx.rng.choice((-1, 0, 1, 2, 7, 8, 9, 1 << 20)))
    return (ctx.data[:f.at] + U64.pack(value) + ctx.data[f.at + 8:],
            f"{f.kind} at byte {f.at} set to {value} ({after} bytes follow the field)")


def _boundary(ctx: GCtx) -> int:
    """A position: mostly a field's start or end, sometimes anywhere."""
    fields = ctx.walk().fields
    if fields and chance(ctx.rng, 0.7):
        f = ctx.rng.choice(fields)
        return max(0, min(len(ctx.data), f.at + ctx.rng.choice((0, 0, f.size, f.size, 1, -1))))
    return ctx.rng.randrange(len(ctx.data) + 1)


def _header_biased(ctx: GCtx) -> int:
    # Tensor data is opaque to the reader; most damage goes where the structure is.
    end = ctx.walk().end
    if chance(ctx.rng, 0.8) and end:
        return ctx.rng.randrange(min(len(ctx.data), end + 64))
    return ctx.rng.randrange(len(ctx.data))


def m_flip(ctx: GCtx):
    if not ctx.data:
        return None
    data, what = bytearray(ctx.data), []
    for _ in range(ctx.rng.choice((1, 1, 2, 4))):
        i = _header_biased(ctx)
        b = ctx.rng.choice((0x00, 0xFF, 0x80, 0x7F, 0x0A, data[i] ^ (1 << ctx.rng.randrange(8)),
                            ctx.rng.randrange(256)))
        data[i] = b
        what.append(f"{i}=0x{b:02x}")
    return bytes(data), "bytes set: " + ", ".join(what)


INSERTS = (b"\x00", b"\x00" * 4, b"\x00" * 8, b"\xff" * 8, b"\x01", b"GGUF", b"\x00" * 32,
           b"\x08" + b"\x00" * 7 + b"abcdefgh")


def m_insert(ctx: GCtx):
    at = _boundary(ctx)
    junk = ctx.rng.choice(INSERTS + (ctx.rng.randbytes(ctx.rng.randrange(1, 17)),))
    return ctx.data[:at] + junk + ctx.data[at:], f"inserted {junk[:16].hex()} ({len(junk)} bytes) at byte {at}"


def m_delete(ctx: GCtx):
    fields = ctx.walk().fields
    if fields and chance(ctx.rng, 0.6):
        f = ctx.rng.choice(fields)
        start, end = f.at, f.at + f.size
    else:
        start = _header_biased(ctx) if ctx.data else 0
        end = min(len(ctx.data), start + ctx.rng.randrange(1, 17))
    return ctx.data[:start] + ctx.data[end:], f"deleted bytes {start}..{end}"


def m_truncate(ctx: GCtx):
    w = ctx.walk()
    at = ctx.rng.choice((_boundary(ctx), _boundary(ctx), ctx.rng.randrange(len(ctx.data) + 1), w.end, w.end + 1,
                         len(ctx.data) - 1, len(ctx.data) - 32, 0, 4, 8, 23, 24))
    at = max(0, min(at, len(ctx.data)))
    return ctx.data[:at], f"truncated to {at} of {len(ctx.data)} bytes"


def m_append(ctx: GCtx):
    extra = ctx.rng.choice((b"\x00", bytes(31), bytes(32), bytes(33), b"\xff" * 7, bytes(4096), b"GGUF",
                            ctx.data[:64]))
    return ctx.data + extra, f"{len(extra)} bytes appended"


def m_fill(ctx: GCtx):
    if not ctx.data:
        return None
    start = _header_biased(ctx)
    end = min(len(ctx.data), start + ctx.rng.choice((2, 4, 8, 16, 64)))
    b = ctx.rng.choice((0x00, 0xFF))
    return ctx.data[:start] + bytes([b]) * (end - start) + ctx.data[end:], f"bytes {start}..{end} set to 0x{b:02x}"


def m_splice(ctx: GCtx):
    name = ctx.rng.choice(sorted(ctx.others))
    other = ctx.others[name]
    at = _boundary(ctx)
    fields = base_walk(other).fields
    f = ctx.rng.choice(fields) if fields else GField(0, 0, "")
    return ctx.data[:at] + other[f.at:], f"bytes from {at} on replaced by {name}'s from byte {f.at}"


def model_mutator(needs: str = "") -> Callable:
    """A mutation of the walked model: fn(ctx, m) on a copy m of it; not applicable (None) when the
    file does not walk into a model, or when m's list `needs` (kvs, tensors) is empty."""
    def wrap(fn: Callable[[GCtx, GModel], object]) -> Callable[[GCtx], object]:
        @functools.wraps(fn)
        def mutation(ctx: GCtx):
            m = ctx.walk().model
            if m is None or needs and not getattr(m, needs):
                return None
            return fn(ctx, copy_model(m))
        return mutation
    return wrap


def _encoded(ctx: GCtx, m: GModel, what: str, p: float) -> tuple[bytes, str]:
    """m's bytes, laid out again first (so that only the edit itself is wrong) with probability p,
    and what was done."""
    if chance(ctx.rng, p):
        r = gguf_relayout(m, ctx.rng)
        if r is not None:
            return encode_model(r), what + ", data laid out again"
    return encode_model(m), what


@model_mutator()
def m_kv_insert(ctx: GCtx, m: GModel):
    rng = ctx.rng
    if m.kvs and chance(rng, 0.3):
        src = rng.choice(m.kvs)
        key = src.key
        vtype, payload, what = (src.vtype, src.payload, "the same value") if chance(rng, 0.5) else draw_gguf_value(rng)
    else:
        key = rng.choice(KEYS)
        vtype, payload, what = draw_gguf_value(rng)
    at = rng.randrange(len(m.kvs) + 1)
    m.kvs.insert(at, GKv(key, vtype, payload))
    return _encoded(ctx, m, f"kv {key[:40]!r} inserted at {at}: {what}", 0.3)


@model_mutator("kvs")
def m_kv_edit(ctx: GCtx, m: GModel):
    rng = ctx.rng
    i = rng.randrange(len(m.kvs))
    kv = m.kvs[i]
    op = rng.choice(("delete", "swap", "value", "value", "retype", "rename", "move-to-end"))
    if op == "delete":
        del m.kvs[i]
        what = f"kv {kv.key[:40]!r} deleted"
    elif op == "swap" and len(m.kvs) > 1:
        j = rng.randrange(len(m.kvs))
        m.kvs[i], m.kvs[j] = m.kvs[j], m.kvs[i]
        what = f"kvs {i} and {j} swapped"
    elif op == "value":
        kv.payload, what = _changed_payload(rng, kv)
        what = f"kv {kv.key[:40]!r} value: {what}"
    elif op == "rename":
        kv.key = rng.choice(KEYS + (kv.key + b"x", kv.key[:-1], kv.key.upper()))
        what = f"kv renamed {kv.key[:40]!r}"
    elif op == "move-to-end":
        m.kvs.append(m.kvs.pop(i))
        what = f"kv {kv.key[:40]!r} moved to the end"
    else:
        kv.vtype, kv.payload, what = draw_gguf_value(rng)
        what = f"kv {kv.key[:40]!r} retyped: {what}"
    return _encoded(ctx, m, what, 0.5)


def _changed_payload(rng: random.Random, kv: GKv) -> tuple[bytes, str]:
    """A neighbour of the kv's value in the same type, so the file stays readable but differs."""
    p = kv.payload
    if kv.vtype in SCALAR_SIZES:
        new = scalar_payload(kv.vtype, rng)
        return new, f"{p.hex()} -> {new.hex()}"
    if kv.vtype == T_STRING:
        s = p[8:]
        new = rng.choice((s + b"x", s[:-1], b"", s.upper(), s + "\u00e9".encode(), b"x" + s[1:], s * 2))
        return str_payload(new), f"string -> {new[:30]!r}"
    if kv.vtype == T_ARRAY and len(p) >= 12:
        etype, n = U32.unpack(p[:4])[0], U64.unpack(p[4:12])[0]
        body = p[12:]
        if etype in SCALAR_SIZES:
            size = SCALAR_SIZES[etype]
            op = rng.choice(("element", "shorter", "longer", "empty"))
            if op == "element" and n:
                i = rng.randrange(n)
                body = body[:i * size] + scalar_payload(etype, rng) + body[(i + 1) * size:]
                return array_payload(etype, [body], n), f"element {i} changed"
            if op == "shorter" and n:
                return array_payload(etype, [body[:-size]], n - 1), "last element dropped"
            if op == "longer":
                return array_payload(etype, [body, scalar_payload(etype, rng)], n + 1), "an element appended"
            return array_payload(etype, [], 0), "emptied"
        if etype == T_STRING:
            return array_payload(etype, [body, str_payload(rng.choice(STRINGS[:-2]))], n + 1), "a string appended"
    return p, "unchanged"


@model_mutator()
def m_alignment(ctx: GCtx, m: GModel):
    rng = ctx.rng
    kvs = [kv for kv in m.kvs if kv.key != b"general.alignment"]
    r = rng.random()
    if r < 0.75:
        value = rng.choice((0, 1, 2, 3, 4, 8, 16, 24, 32, 64, 256, 4096, 65536, 2**31, 2**32 - 1))
        kv, what = GKv(b"general.alignment", T_UINT32, U32.pack(value)), f"UINT32 {value}"
    elif r < 0.9:
        vtype = rng.choice((T_UINT64, T_INT32, T_UINT16, T_UINT8, T_FLOAT32, T_BOOL))
        kv = GKv(b"general.alignment", vtype, struct.pack("<" + SCALAR_FMTS[vtype], 1 if vtype == T_BOOL else 32))
        what = f"type {vtype} holding 32"
    else:
        kv = GKv(b"general.alignment", T_ARRAY, array_payload(T_UINT32, [U32.pack(32)]))
        what = "an array [32]"
    kvs.insert(rng.randrange(len(kvs) + 1), kv)
    if chance(rng, 0.15):
        kvs.insert(rng.randrange(len(kvs) + 1), GKv(b"general.alignment", T_UINT32, U32.pack(32)))
        what += " and again as UINT32 32"
    m.kvs = kvs
    return _encoded(ctx, m, f"general.alignment {what}", 0.7)


@model_mutator("tensors")
def m_tensor(ctx: GCtx, m: GModel):
    rng = ctx.rng
    i = rng.randrange(len(m.tensors))
    t = m.tensors[i]
    op = weighted(rng, (("dims", 5), ("type", 4), ("offset", 5), ("name", 3), ("add", 3), ("delete", 2),
                        ("reorder", 2), ("swap-offsets", 2), ("shift", 2)))
    p = 0.5
    if op == "dims":
        t.dims = list(rng.choice(DIMS + (t.dims[::-1], t.dims + [1], t.dims[:-1], [d * 2 for d in t.dims])))
        what = f"tensor {t.name[:30]!r} dims -> {t.dims}"
    elif op == "type":
        t.gtype = rng.choice(GGML_CODES)
        what = f"tensor {t.name[:30]!r} type -> {t.gtype}"
    elif op == "offset":
        others = [u.offset for u in m.tensors]
        t.offset = rng.choice(U64_VALUES + tuple(others) + (t.offset + 1, t.offset + 32,
                                                          t.offset - 32 if t.offset >= 32 else 1,
                                                          len(m.data), len(m.data) - 32, 2**64 - 32))
        what, p = f"tensor {t.name[:30]!r} data offset -> {t.offset}", 0.0
    elif op == "name":
        t.name = rng.choice(NAMES + tuple(u.name for u in m.tensors) + (t.name + b"\xff",))
        what, p = f"tensor renamed {t.name[:30]!r}", 0.0
    elif op == "add":
        m.tensors.insert(rng.randrange(len(m.tensors) + 1),
                         GTensor(rng.choice((t.name + b".copy", t.name, b"new")), list(t.dims), t.gtype, t.offset))
        what, p = f"tensor {t.name[:30]!r} listed again", 0.6
    elif op == "delete":
        del m.tensors[i]
        what = f"tensor {t.name[:30]!r} deleted"
    elif op == "reorder":
        rng.shuffle(m.tensors)
        what, p = "tensor infos shuffled, offsets kept", 0.0
    elif op == "swap-offsets":
        j = rng.randrange(len(m.tensors))
        t.offset, m.tensors[j].offset = m.tensors[j].offset, t.offset
        what, p = f"data offsets of tensors {i} and {j} swapped", 0.0
    else:
        # Valid, but with bytes before the first tensor that no tensor owns: llama.cpp never
        # writes such a gap, so it is where a listing or a diff can forget a region.
        gap = layout_alignment(m.kvs) * rng.choice((1, 2, 3))
        for u in m.tensors:
            u.offset += gap
        m.data = rng.randbytes(gap) + m.data
        what, p = f"every data offset moved {gap} bytes on, the gap filled with random bytes", 0.0
    return _encoded(ctx, m, what, p)


@model_mutator()
def m_data(ctx: GCtx, m: GModel):
    """Damage where the reader does not look but diff does: tensor bytes, padding, trailing bytes."""
    rng = ctx.rng
    placed = [(t, tensor_nbytes(t)) for t in m.tensors]
    placed = [(t, n) for t, n in placed if n and t.offset + n <= len(m.data)]
    op = rng.choice(("tensor", "tensor", "special", "padding", "info-padding"))
    data = bytearray(m.data)
    if op in ("tensor", "special") and placed:
        t, n = rng.choice(placed)
        i = t.offset + rng.randrange(n)
        if op == "tensor":
            data[i] ^= 1 << rng.randrange(8)
            what = f"tensor {t.name[:30]!r} data byte {i - t.offset} flipped"
        else:
            pattern = rng.choice((b"\x00\x80", b"\x00\x00\xc0\x7f", b"\x01\x7c", b"\x00\x00\x80\x7f", b"\x80"))
            data[i:i + len(pattern)] = pattern
            del data[len(m.data):]
            what = f"tensor {t.name[:30]!r} data at {i - t.offset} set to {pattern.hex()}"
    elif op == "padding" and placed:
        t, n = rng.choice(placed)
        end = t.offset + n
        if end >= len(m.data) or data[end] != 0:
            return None
        data[end] = rng.choice((1, 0xFF))
        what = f"padding after tensor {t.name[:30]!r} made nonzero"
    else:
        out = encode_model(m)
        head_len, end = len(out) - len(m.data), walk(out).end
        if end >= head_len:
            return None
        i = rng.randrange(end, head_len)
        return out[:i] + b"\x01" + out[i + 1:], f"padding byte {i} after the tensor infos made nonzero"
    m.data = bytes(data)
    return encode_model(m), what


@model_mutator()
def m_counts(ctx: GCtx, m: GModel):
    """Header counts that disagree with what follows, by a little or a lot."""
    which = ctx.rng.choice(("tensor", "kv"))
    real = len(m.tensors) if which == "tensor" else len(m.kvs)
    value = ctx.rng.choice((real + 1, real - 1 if real else 1, 0, 2**63, 2**64 - 1, 2**31))
    return (encode_model(m, n_tensors=value) if which == "tensor" else encode_model(m, n_kv=value),
            f"{which} count {real} -> {value}")


@model_mutator()
def m_big(ctx: GCtx, m: GModel):
    """Large but legal values: long strings and arrays, many kvs or tensors, for hangs and memory."""
    rng = ctx.rng
    op = rng.choice(("array", "strings", "kvs", "tensors", "string"))
    if op == "array":
        n = rng.choice((100000, 1000000))
        kv, what = GKv(b"big.array", T_ARRAY, array_payload(T_UINT8, [bytes(n)])), f"UINT8 array of {n}"
        m.kvs.append(kv)
    elif op == "strings":
        n = rng.choice((10000, 50000))
        m.kvs.append(GKv(b"big.strings", T_ARRAY, array_payload(T_STRING, [str_payload(b"")] * n)))
        what = f"array of {n} empty strings"
    elif op == "kvs":
        n = rng.choice((1000, 5000))
        m.kvs += [GKv(b"k%d" % i, T_UINT8, b"\x00") for i in range(n)]
        what = f"{n} kvs added"
    elif op == "tensors":
        n = rng.choice((1000, 5000))
        m.tensors += [GTensor(b"z%d" % i, [0], GGML_F32, 0) for i in range(n)]
        what = f"{n} empty tensors added"
    else:
        n = rng.choice((1 << 20, 4 << 20))
        m.kvs.append(GKv(b"big.string", T_STRING, str_payload(b"\xc3\xa9" * (n // 2))))
        what = f"a {n}-byte string"
    return _encoded(ctx, m, what, 0.8)


GGUF_MUTATORS: tuple = (
    (m_field, 22), (m_length_past_end, 7), (m_flip, 8), (m_insert, 5), (m_delete, 5), (m_truncate, 6),
    (m_append, 2), (m_fill, 2), (m_splice, 2), (m_kv_insert, 9), (m_kv_edit, 9), (m_alignment, 6),
    (m_tensor, 12), (m_data, 6), (m_counts, 3), (m_big, 0.5),
)


def build_gguf_input(seed: str, index: int, bases: dict[str, bytes],
                     only: Optional[int] = None) -> tuple[bytes, str, list[str]]:
    """Input `index` of `seed`: (mutant bytes, base name, mutation descriptions)."""
    rng = random.Random(f"gguf/{seed}/{index}")
    base = weighted(rng, GGUF_BASES)
    n = rng.choice([1, 1, 1, 1, 2, 2, 3])
    data = bases[base]
    done = []
    for k in range(n):
        if only is not None and k != only:
            continue
        others = {b: d for b, d in bases.items() if b != "converted"}
        ctx = GCtx(random.Random(f"gguf/{seed}/{index}/{k}"), data, others,
                   base_walk(data) if data is bases[base] else None)
        for _ in range(8):
            result = weighted(ctx.rng, GGUF_MUTATORS)(ctx)
            if result is not None:
                data, what = result
                done.append(f"[{k}] {what}")
                break
    return data, base, done


# --- Running one input: every call on the mutant (and the base beside it), each under the time
# --- limit; crashes are exceptions other than GGUFError/Refusal, violations are broken promises.

@dataclass
class GFinding:
    call: str
    kind: str              # crash | violation
    signature: str
    error_type: str
    message: str
    last_frame: str = ""
    converter_frame: str = ""
    traceback: str = ""


@dataclass
class GOutcome:
    index: int
    base: str
    mutations: list
    seconds: float
    size: int
    accepted: bool         # read_gguf returned
    rejection: str         # read_gguf's GGUFError, if it raised one
    findings: list
    gguf_cpp: str = ""     # accepted, but llama.cpp's gguf.cpp would refuse it: why


def one_line(text: object) -> bool:
    return isinstance(text, str) and bool(text.strip()) and "\n" not in text and "\r" not in text


class _Calls:
    """Runs the calls of one input and collects what went wrong."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.findings: list[GFinding] = []

    def run(self, call: str, fn):
        """(True, result) or (False, the GGUFError/Refusal); anything else is recorded as a crash."""
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            result = fn()
            signal.setitimer(signal.ITIMER_REAL, 0)
            return True, result
        except (bc.GGUFError, bc.Refusal) as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            text = e.reason if isinstance(e, bc.Refusal) else str(e)
            if not one_line(text):
                f = crash_fields(e)
                etype = f"{type(e).__name__}(not one line)"
                self.findings.append(GFinding(call, "crash", etype + " @ " + f["signature"].split(" @ ", 1)[1],
                                              etype, repr(text)[:400], f["last_frame"], f["converter_frame"],
                                              f["traceback"]))
            return False, e
        except (Exception, Timeout, MemoryError) as e:  # noqa: B014 - every other failure is a finding
            signal.setitimer(signal.ITIMER_REAL, 0)
            f = crash_fields(e)
            self.findings.append(GFinding(call, "crash", f["signature"], f["error_type"], f["message"],
                                          f["last_frame"], f["converter_frame"], f["traceback"]))
            return False, None

    def violation(self, call: str, check: str, detail: str, owner: str = "") -> None:
        """A broken promise; deduplicated by the check and the function that owns it (default: the call's)."""
        owner = owner or call.split("(")[0]
        self.findings.append(GFinding(call, "violation", f"violation: {check} @ {owner}",
                                      "violation", f"{check}: {detail}"[:400]))

    def lines(self, call: str, lines, owner: str) -> None:
        """Output the command line prints one entry per line must hold one line each."""
        bad = [s for s in lines if not isinstance(s, str) or "\n" in s or "\r" in s]
        if bad:
            self.violation(call, "an output line spans lines", repr(bad[0])[:200], owner)


def twin_of(data: bytes, flip: tuple[int, int, int]) -> bytes:
    """data with one byte changed.  flip is (where, position, xor mask): where 0 takes the position
    modulo the size; where 1 counts it from the end of the tensor infos (modulo 96), where the
    padding and the start of the data are, the bytes no kv or tensor info owns."""
    if not data:
        return b"\x00"
    where, pos, mask = flip
    i = (walk(data).end + pos % 96 if where else pos) % len(data)
    return data[:i] + bytes([data[i] ^ mask]) + data[i + 1:]


def draw_flip(seed: str, index: int) -> tuple[int, int, int]:
    rng = random.Random(f"gguf/{seed}/{index}/twin")
    return rng.randrange(2), rng.randrange(1 << 30), rng.randrange(1, 256)


def run_gguf_input(mutant: Path, data: bytes, base: GBase, base_data: bytes, timeout: float,
                   flip: tuple[int, int, int] = (0, 0, 1)) -> tuple[bool, str, list, str]:
    """Every call on one mutant: (read_gguf accepted it, its GGUFError if not, findings, and why
    gguf.cpp would refuse a file the reader accepted).

    Besides the base, the mutant is diffed against its twin (the mutant with one byte changed
    anywhere): the base never has gaps between tensors or odd padding, a mutant's twin does, which
    is how the diff's last resort (naming the region of the first differing byte) gets reached.
    """
    c = _Calls(timeout)
    identical = data == base_data
    accepted, f = c.run("read_gguf(mutant)", lambda: bc.read_gguf(mutant))
    rejection = str(f) if not accepted and isinstance(f, bc.GGUFError) else ""
    cpp = gguf_cpp_refusal(f) if accepted else ""
    if accepted:
        disagreement = walk_disagreement(f, walk(data))
        if disagreement:
            c.violation("read_gguf(mutant)", "the reader and the fuzzer's own walk disagree", disagreement)
        for full in (False, True):
            ok, lines = c.run(f"describe_gguf(f, full={full})", lambda: bc.describe_gguf(f, full))
            if ok:
                c.lines(f"describe_gguf(f, full={full})", lines, "describe_gguf")
    ok, lines = c.run("inspect_gguf_lines(mutant)", lambda: bc.inspect_gguf_lines(mutant))
    if ok:
        c.lines("inspect_gguf_lines(mutant)", lines, "describe_gguf")
    if ok != accepted:
        c.violation("inspect_gguf_lines(mutant)", "disagrees with read_gguf", f"read ok={accepted}, inspect ok={ok}")
    for full in (True, False):
        call = f"inspect_gguf_json(mutant, full={full})"
        ok, doc = c.run(call, lambda: bc.inspect_gguf_json(mutant, full=full))
        if ok:
            try:
                json.dumps(doc, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                c.violation(call, "not strict JSON", str(e), "inspect_gguf_json")
    ok, result = c.run("diff_files(mutant, base)", lambda: bc.diff_files(mutant, base.path))
    if ok:
        lines, code = result
        c.lines("diff_files(mutant, base)", lines, "diff_gguf")
        want = 0 if identical else (1 if accepted else 2)
        if code != want or bool(lines) == identical:
            c.violation("diff_files(mutant, base)", "exit code or emptiness",
                        f"identical={identical} readable={accepted}: code {code}, {len(lines)} lines, want code {want}")
    ok, lines = c.run("diff_gguf(base, mutant)", lambda: bc.diff_gguf(base.path, mutant))
    if ok:
        c.lines("diff_gguf(base, mutant)", lines, "diff_gguf")
        if bool(lines) == identical:
            c.violation("diff_gguf(base, mutant)", "[] iff byte-identical",
                        f"identical={identical}, {len(lines)} lines")
    twin = mutant.with_name("twin.gguf")
    twin.write_bytes(twin_of(data, flip))
    ok, lines = c.run("diff_gguf(mutant, twin)", lambda: bc.diff_gguf(mutant, twin))
    if ok:
        c.lines("diff_gguf(mutant, twin)", lines, "diff_gguf")
        if not lines:
            c.violation("diff_gguf(mutant, twin)", "[] iff byte-identical", f"one byte changed at {flip}, no lines")
    ok, result = c.run("verify(mutant, pin)", lambda: bc.verify(mutant, base.pin))
    if ok:
        lines, held = result
        c.lines("verify(mutant, pin)", lines, "verify")
        if held != identical:
            c.violation("verify(mutant, pin)", "held iff identical", f"identical={identical}, held={held}")
    return accepted, rejection, c.findings, cpp


VALUE_TYPE_NAMES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
                    "UINT64", "INT64", "FLOAT64")


def _walked_type(kv: GKv) -> object:
    if kv.vtype == T_ARRAY:
        return ("array", VALUE_TYPE_NAMES[U32.unpack(kv.payload[:4])[0]])
    return VALUE_TYPE_NAMES[kv.vtype]


def walk_disagreement(f, w: GWalk) -> str:
    """What a file read_gguf accepted holds by the reader and by walk(), where they differ ('' if not).

    Two independent readings of the same bytes: a reader that skipped or misplaced a field would
    still return, and only a second opinion notices.
    """
    m = w.model
    if m is None:
        return "the walk cannot decode a file the reader accepted"
    mine = [(kv.key.decode("utf-8", "replace"), _walked_type(kv)) for kv in m.kvs]
    theirs = [(kv.key, ("array", kv.vtype.name) if kv.array else kv.vtype.name) for kv in f.kvs]
    if mine != theirs:
        return f"kvs: walk {mine[:3]}..., reader {theirs[:3]}..."
    mine_t = [(t.name.decode("utf-8", "replace"), list(t.dims), t.gtype, t.offset) for t in m.tensors]
    theirs_t = [(t.name, list(t.dims), t.ggml_type, t.offset_in_data) for t in f.tensors]
    if mine_t != theirs_t:
        return f"tensors: walk {mine_t[:2]}..., reader {theirs_t[:2]}..."
    if f.info_end != w.end:
        return f"tensor infos end at {w.end} by the walk, {f.info_end} by the reader"
    if f.alignment <= 1 << 16 and f.alignment != layout_alignment(m.kvs):
        return f"alignment {layout_alignment(m.kvs)} by the walk, {f.alignment} by the reader"
    return ""


def gguf_cpp_refusal(f) -> str:
    """Why llama.cpp's gguf.cpp would refuse a file read_gguf accepted ('' if it would not).

    Not a finding: gguf-py's GGUFReader accepts these too, and which of the two readers to follow
    is a decision, not a bug.  Counted so that the decision can be taken with numbers.  Only the
    two rules of gguf_init_from_file_impl the reader does not apply are checked.
    """
    if any(len(t.name.encode("utf-8")) >= 64 for t in f.tensors):
        return "a tensor name of 64 or more bytes (GGML_MAX_NAME)"
    at = 0
    for t in f.tensors:
        # gguf.cpp: each offset must be the padded size of the tensors before it, in info order
        if t.offset_in_data != at:
            return "tensor data offsets are not contiguous in info order"
        at += t.nbytes + bc.padding(t.nbytes, f.alignment)
    return ""


def rejection_family(message: str) -> str:
    """A GGUFError with its numbers and quoted names cut, for the histogram of checks that fired."""
    text = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "'…'", message)
    text = re.sub(r"b'…'", "'…'", text)
    text = re.sub(r"0x[0-9a-f]+|(?<![A-Za-z_-])\d+", "N", text)
    return text[:110]


# --- The campaign: like the converter's, with inputs accepted or rejected by the reader and
# --- unique findings by exception type and the converter's last frame.

_GWORKER: dict = {}


def _gguf_worker_init(seed: str, bases: dict, work: str, timeout: float, memory_mb: int) -> None:
    run = worker_directory(work, memory_mb)
    gb = {k: GBase(k, Path(p), Path(pin)) for k, (p, pin) in bases.items()}
    _GWORKER.update(seed=seed, bases=gb, data={k: b.path.read_bytes() for k, b in gb.items()},
                    mutant=run / "mutant.gguf", timeout=timeout)


def _gguf_one(index: int, only: Optional[int] = None) -> GOutcome:
    w = _GWORKER
    signal.setitimer(signal.ITIMER_REAL, 120)  # a mutation that blocks must fail loudly too
    data, base, done = build_gguf_input(w["seed"], index, w["data"], only)
    signal.setitimer(signal.ITIMER_REAL, 0)
    w["mutant"].write_bytes(data)
    start = time.perf_counter()
    accepted, rejection, findings, cpp = run_gguf_input(w["mutant"], data, w["bases"][base], w["data"][base],
                                                        w["timeout"], draw_flip(w["seed"], index))
    return GOutcome(index, base, done, time.perf_counter() - start, len(data), accepted, rejection, findings, cpp)


def _gguf_worker_run(index: int) -> tuple[GOutcome, dict]:
    outcome = _gguf_one(index)
    minimal = {}
    for f in outcome.findings:
        if f.signature not in minimal:
            minimal[f.signature] = _gguf_minimal(index, outcome, f.signature)
    return outcome, minimal


def _gguf_minimal(index: int, outcome: GOutcome, signature: str) -> Optional[int]:
    """The one mutation that alone reproduces a finding, if there is one."""
    return sole_mutation(outcome.mutations,
                         lambda k: any(f.signature == signature for f in _gguf_one(index, only=k).findings))


class GgufCampaign(Tracker):
    flag = "--gguf "

    def __init__(self, seed: str, total: int):
        super().__init__(seed, total)
        self.rejections = Counter()
        self.gguf_cpp = Counter()
        self.gguf_cpp_examples: dict[str, list[int]] = {}
        self.accepted_by_base = Counter()
        self.inputs_by_base = Counter()
        self.bytes = 0

    def add(self, o: GOutcome, minimal: dict) -> list[str]:
        """Count one input; the signatures it found for the first time."""
        self.done += 1
        self.bytes += o.size
        self.inputs_by_base[o.base] += 1
        self.counts["accepted" if o.accepted else "rejected"] += 1
        if o.accepted:
            self.accepted_by_base[o.base] += 1
            if o.gguf_cpp:
                self.gguf_cpp[o.gguf_cpp] += 1
                examples = self.gguf_cpp_examples.setdefault(o.gguf_cpp, [])
                if len(examples) < 5:
                    examples.append(o.index)
        elif o.rejection:
            self.rejections[rejection_family(o.rejection)] += 1
        self.slowest = sorted(self.slowest + [(round(o.seconds, 3), o.index, o.base)], reverse=True)[:10]
        kinds = {f.kind for f in o.findings}
        for kind in kinds:
            self.counts[kind] += 1
        new, seen = [], set()
        for f in o.findings:
            if f.signature in seen:  # one input counts once per signature, however many calls hit it
                continue
            seen.add(f.signature)
            u = self.uniques.get(f.signature)
            if u is None:
                u = self.uniques[f.signature] = Unique(f.signature, f.error_type, f.message, f.last_frame,
                                                       f.converter_frame, o.index, traceback=f.traceback)
                new.append(f.signature)
            u.count += 1
            if len(u.examples) < 5 and all(e["index"] != o.index for e in u.examples):
                k = minimal.get(f.signature)
                u.examples.append({"index": o.index, "base": o.base, "call": f.call, "mutations": o.mutations,
                                   "minimal_mutation": k, "message": f.message[:200],
                                   "replay": self.replay(o.index, k)})
        return new

    def unique(self, kind: str) -> int:
        return sum(1 for u in self.uniques.values() if (u.error_type == "violation") == (kind == "violation"))

    def line(self) -> str:
        c = self.counts
        return (f"fuzz: {self.done} inputs, {c['crash']} crashes ({self.unique('crash')} unique), "
                f"{c['violation']} contract violations ({self.unique('violation')} unique), "
                f"{c['accepted']} accepted, {c['rejected']} rejected")

    def report(self) -> dict:
        return {
            "mode": "gguf",
            "command": " ".join([Path(sys.executable).name] + sys.argv),
            "seed": self.seed, "inputs": self.done, "converter_sha256": CONVERTER_SHA256,
            "seconds": round(time.perf_counter() - self.start, 1),
            "inputs_per_second": round(self.rate(), 2), "mean_input_bytes": round(self.bytes / max(self.done, 1)),
            "counts": dict(self.counts), "inputs_by_base": dict(self.inputs_by_base),
            "accepted_by_base": dict(self.accepted_by_base),
            "unique_findings": [asdict(u) for u in sorted(self.uniques.values(), key=lambda u: u.first_index)],
            "rejection_families": self.rejections.most_common(200),
            "accepted_but_gguf_cpp_refuses": [{"reason": r, "inputs": n, "examples": self.gguf_cpp_examples[r]}
                                              for r, n in self.gguf_cpp.most_common()],
            "slowest": self.slowest,
        }


def _gguf_init_args(args, bases: dict[str, GBase], work: Path) -> tuple:
    return (args.seed, {k: (str(b.path), str(b.pin)) for k, b in bases.items()}, str(work),
            args.timeout, args.memory_mb)


def default_gguf_workdir() -> Optional[str]:
    # Each input writes two files and every call opens them again; on tmpfs that costs nothing.
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def run_gguf_campaign(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="bankml-fuzz-gguf-", dir=args.workdir or default_gguf_workdir())).resolve()
    bases = build_gguf_bases(work / "bases")
    fingerprint = tree_fingerprint(work / "bases", with_hash=True)
    camp = GgufCampaign(args.seed, args.inputs)
    progress, report = campaign_outputs(args, work, "--gguf, ")
    tracer = LineCoverage() if args.coverage else None
    results, pool = campaign_results(args, _gguf_worker_init, _gguf_init_args(args, bases, work), _gguf_worker_run,
                                     chunksize=16, started=tracer.start if tracer else lambda: None)
    try:
        for outcome, minimal in results:
            new = camp.add(outcome, minimal)
            if new and not args.quiet:
                for sig in new:
                    u = camp.uniques[sig]
                    print(f"new finding #{list(camp.uniques).index(sig) + 1} at input {outcome.index}: {sig}: "
                          f"{u.message[:120]!r}",
                          file=sys.stderr, flush=True)
            if camp.done % args.every == 0 or new:
                write_progress(camp, progress, report)
    finally:
        if tracer:
            tracer.stop()
        if pool is not None:
            pool.terminate()
    changed = tree_fingerprint(work / "bases", with_hash=True) != fingerprint
    doc = camp.report()
    if tracer:
        doc["coverage"] = tracer.summary()
        for line in tracer.lines():
            print(line)
    if report:
        write_atomically(report, json.dumps(doc, indent=2, ensure_ascii=True))
    for u in sorted(camp.uniques.values(), key=lambda u: u.first_index):
        ex = u.examples[0]
        print(f"{'violation' if u.error_type == 'violation' else 'crash'} {u.signature} x{u.count}: "
              f"{u.error_type}: {u.message[:100]!r}\n"
              f"    in {ex['call']}, last frame {u.last_frame}; first input {u.first_index}: {ex['mutations']}\n"
              f"    replay: {ex['replay']}")
    for r, n in camp.gguf_cpp.most_common():
        print(f"note (not a finding): {n} accepted inputs that gguf.cpp would refuse: {r}; e.g. inputs "
              f"{camp.gguf_cpp_examples[r]}")
    if changed:
        print("a base file changed: a call wrote through the files it reads")
    print(f"throughput: {camp.rate():.1f} inputs/s over {time.perf_counter() - camp.start:.0f} s "
          f"(mean input {doc['mean_input_bytes']} bytes)")
    campaign_done(args, camp, progress, work)
    return 1 if camp.counts["crash"] or camp.counts["violation"] or changed else 0


# --- Coverage (--coverage, one worker): which lines of the reader, the listings, the diff and
# --- verify the campaign executed, from a trace function that only follows bankml_convert frames.

class LineCoverage:
    FUNCTIONS = ("read_gguf", "inspect_gguf_lines", "inspect_gguf_json", "kv_json", "_json_scalar",
                 "trailing_bytes", "verify", "read_pin", "_pinned_file", "_output_checks", "diff_files")

    def __init__(self):
        self.hit: set[int] = set()
        self.file = bc.__file__

    def _trace(self, frame, event, arg):
        if frame.f_code.co_filename != self.file:
            return None
        self.hit.add(frame.f_lineno)
        return self._local

    def _local(self, frame, event, arg):
        if event == "line":
            self.hit.add(frame.f_lineno)
        return self._local

    def start(self) -> None:
        sys.settrace(self._trace)

    def stop(self) -> None:
        sys.settrace(None)

    def targets(self) -> dict[str, set[int]]:
        """Executable lines of every function in the 'Reading GGUF' section and of FUNCTIONS."""
        source = Path(self.file).read_text(encoding="utf-8").splitlines()
        start = next(i for i, s in enumerate(source, 1) if s.startswith("# Reading GGUF"))
        end = next(i for i, s in enumerate(source, 1) if i > start and s.startswith("# Around the file"))
        out: dict[str, set[int]] = {}
        for obj in list(vars(bc).values()):
            if inspect.isfunction(obj):
                fns = [obj]
            elif inspect.isclass(obj) and obj.__module__ == bc.__name__:
                fns = [v for v in vars(obj).values() if inspect.isfunction(v)]
            else:
                continue
            for fn in fns:
                code = fn.__code__
                if code.co_filename != self.file:
                    continue
                if start <= code.co_firstlineno < end or fn.__name__ in self.FUNCTIONS:
                    out[fn.__qualname__] = {ln for _, _, ln in code.co_lines()
                                            if ln is not None and ln != code.co_firstlineno}
        return out

    def summary(self) -> dict:
        t = self.targets()
        total = sum(len(v) for v in t.values())
        missed = {k: sorted(v - self.hit) for k, v in t.items() if v - self.hit}
        return {"functions": len(t), "lines": total, "executed": total - sum(len(v) for v in missed.values()),
                "missed": missed}

    def lines(self) -> list[str]:
        s = self.summary()
        out = [f"coverage: {s['executed']} of {s['lines']} lines in {s['functions']} reader/diff/verify functions"]
        for fn, lines in sorted(s["missed"].items()):
            out.append(f"  not executed: {fn}: lines {', '.join(map(str, lines))}")
        return out



# --- Replaying one input: the mutations, every call's result and the tracebacks; --shrink cuts
# --- the mutant down, byte range by byte range, to a smaller file with the same finding.

def shrink_gguf(data: bytes, signature: str, path: Path, base: GBase, base_data: bytes, timeout: float,
                flip: tuple[int, int, int], budget: float = 120.0) -> bytes:
    """A shorter mutant that still produces `signature` (ddmin-style chunk removal, time-bounded)."""
    def keeps(candidate: bytes) -> bool:
        path.write_bytes(candidate)
        found = run_gguf_input(path, candidate, base, base_data, timeout, flip)[2]  # the findings
        return any(f.signature == signature for f in found)

    deadline = time.perf_counter() + budget
    parts = 2
    while len(data) > 1 and time.perf_counter() < deadline:
        chunk = max(1, len(data) // parts)
        for start in range(0, len(data), chunk):
            candidate = data[:start] + data[start + chunk:]
            if keeps(candidate):
                data, parts = candidate, max(parts - 1, 2)
                break
        else:
            if chunk == 1:
                break
            parts = min(len(data), parts * 2)
    path.write_bytes(data)
    return data


def run_gguf_replay(args) -> int:
    work = Path(args.keep or tempfile.mkdtemp(prefix="bankml-fuzz-gguf-replay-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    bases = build_gguf_bases(work / "bases")
    _gguf_worker_init(*_gguf_init_args(args, bases, work))
    data, base, done = build_gguf_input(args.seed, args.replay, _GWORKER["data"], args.only)
    mutant = work / "mutant.gguf"
    mutant.write_bytes(data)
    print(f"input {args.replay} of seed {args.seed} (--gguf): base {base}, {len(data)} bytes")
    for m in done:
        print(f"  {m}")
    start = time.perf_counter()
    flip = draw_flip(args.seed, args.replay)
    accepted, rejection, findings, cpp = run_gguf_input(mutant, data, bases[base], _GWORKER["data"][base],
                                                        args.timeout, flip)
    print(f"read_gguf: {'accepted' if accepted else 'rejected: ' + rejection} ({time.perf_counter() - start:.2f} s "
          f"for every call)" + (f"; gguf.cpp would refuse it: {cpp}" if cpp else ""))
    for f in findings:
        print(f"{f.kind} in {f.call}: {f.signature}: {f.message}")
        if f.traceback:
            print(f.traceback)
    if args.shrink and findings:
        small = shrink_gguf(data, findings[0].signature, work / "minimal.gguf", bases[base],
                            _GWORKER["data"][base], args.timeout, flip)
        print(f"shrunk to {len(small)} bytes with the same {findings[0].signature!r} (base {base}):")
        print(f"  {small!r}")
    if args.keep:
        print(f"mutant kept as {mutant}" + (f", shrunk as {work / 'minimal.gguf'}" if args.shrink and findings else ""))
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if findings else 0


# ---------------------------------------------------------------------------------------------
# --tokenizer-model: mutated SentencePiece tokenizer.model files (issue 13).  Every mutant goes
# through bankml_convert's reader (read_tokenizer_model) and every --convert-every'th one, placed
# in a tiny SentencePiece model directory, through convert(): each must return or refuse in one
# line, never raise anything else, hang or leave a partial output.  The mutants start from the
# real Llama 2 (TinyLlama) tokenizer.model, the synthetic Mistral v0.3 one and a 600-piece cut of
# the real one (fast, so most mutants are cheap); oracle/spm_oracle.py runs the same mutants
# through sentencepiece itself to check that whatever bankml accepts, sentencepiece reads alike.
# ---------------------------------------------------------------------------------------------

SPM_SOURCES = (("llama-2", mm.FIXTURES / "TinyLlama-1.1B-Chat-v1.0" / "tokenizer.model", 10),
               ("mistral-v0.3", mm.FIXTURES / "Mistral-7B-Instruct-v0.3-shape" / "tokenizer.model", 5))


def pb_fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """(field number, wire type, raw bytes of the whole field) of a message; what cannot be split
    into fields (an earlier mutation broke it) is kept whole as field -1."""
    out, pos = [], 0
    while pos < len(data):
        start = pos
        try:
            tag, pos = bc._varint(data, pos)
            wire = tag & 7
            if wire == 0:
                _, pos = bc._varint(data, pos)
            elif wire == 2:
                size, pos = bc._varint(data, pos)
                pos += size
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                raise bc.Refusal("group")
        except bc.Refusal:
            pos = len(data) + 1
        if pos > len(data):
            out.append((-1, -1, data[start:]))
            break
        out.append((tag >> 3, wire, data[start:pos]))
    return out


def pb_payload(raw: bytes) -> bytes:
    """The value of a length-delimited field given whole (tag included); b"" if it is not one."""
    try:
        _, pos = bc._varint(raw, 0)
        size, pos = bc._varint(raw, pos)
    except bc.Refusal:
        return b""
    return raw[pos:pos + size]


def pb_message(number: int, payload: bytes) -> bytes:
    return pb_field(number, LENGTH_DELIMITED, payload)


def spm_cut(data: bytes, keep: int) -> bytes:
    """The model with only its first `keep` pieces (the other fields kept): still a valid model."""
    out, seen = [], 0
    for number, _, raw in pb_fields(data):
        if number == 1:
            seen += 1
            if seen > keep:
                continue
        out.append(raw)
    return b"".join(out)


def spm_bases() -> dict[str, bytes]:
    bases = {name: path.read_bytes() for name, path, _ in SPM_SOURCES}
    bases["llama-2-cut-600"] = spm_cut(bases["llama-2"], 600)
    return bases


SPM_BASE_WEIGHTS = {"llama-2": 10, "mistral-v0.3": 5, "llama-2-cut-600": 85}
PIECE_TEXTS = (b"", b"\x00", b"a\x00b", b"\xff", b"\xc3", b"\xed\xa0\x80", b"<0x41>", b"<0x4g>", b"<0x0a>",
               b"<unk>", b"<s>", b"\xe2\x96\x81the", b"a" * 7999, b"a" * 8000, b"[PAD5]", b"<|im_start|>")
PIECE_TYPES = (0, 1, 2, 3, 4, 5, 6, 7, 255, 2**31, 2**32 - 1, 2**63, 2**64 - 1)
SCORE_BITS = (0x7FC00000, 0x7F800001, 0xFF800000, 0x7F800000, 0x80000000, 0x00000001, 0x7F7FFFFF, 0xFFFFFFFF)


def piece_body(text: bytes, score_bits: int, kind: Optional[int]) -> bytes:
    body = b"\x0a" + pb_varint(len(text)) + text + b"\x15" + struct.pack("<I", score_bits)
    return body + (b"\x18" + pb_varint(kind) if kind is not None else b"")


def mutate_spm(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """One structural or byte-level mutation of a serialized ModelProto, and what it was."""
    fields = pb_fields(data)
    pieces = [i for i, f in enumerate(fields) if f[0] == 1 and f[1] == 2]
    op = rng.choice(["bytes", "bytes", "piece-text", "piece-type", "piece-score", "piece-wire", "piece-extra",
                     "duplicate-piece", "drop-piece", "swap-pieces", "length", "trainer", "normalizer",
                     "self-test", "unknown-field", "tag"])
    if op == "bytes" or not pieces:
        return byte_damage(rng, data)
    i = rng.choice(pieces)
    raw = fields[i][2]
    body = pb_payload(raw)
    new: Optional[bytes] = None
    if op == "piece-text":
        text = rng.choice(PIECE_TEXTS + (pb_payload(fields[rng.choice(pieces)][2])[2:12],))
        new = pb_message(1, piece_body(text, 0, rng.choice((None, 1, 4))))
        what = f"piece field {i} text set to {text[:20]!r}"
    elif op == "piece-type":
        kind = rng.choice(PIECE_TYPES)
        new = pb_message(1, body + b"\x18" + pb_varint(kind))
        what = f"piece field {i} type set to {kind}"
    elif op == "piece-score":
        bits = rng.choice(SCORE_BITS)
        new = pb_message(1, body + b"\x15" + struct.pack("<I", bits))
        what = f"piece field {i} score bits set to 0x{bits:08x}"
    elif op == "piece-wire":
        number, wire = rng.choice((1, 2, 3)), rng.choice((0, 1, 2, 3, 4, 5, 6, 7))
        extra = pb_varint(number << 3 | wire) + rng.choice((b"\x01", b"\x04abcd", b"\x00" * 8, b""))
        new = pb_message(1, body + extra)
        what = f"piece field {i} given field {number} with wire type {wire}"
    elif op == "piece-extra":
        number = rng.choice((4, 9, 100, 2**29 - 1, 2**29, 0))
        new = pb_message(1, body + pb_varint(number << 3 | 2) + b"\x02zz")
        what = f"piece field {i} given unknown field {number}"
    elif op == "duplicate-piece":
        fields.insert(rng.choice(pieces), fields[i])
        return b"".join(f[2] for f in fields), f"piece field {i} duplicated"
    elif op == "drop-piece":
        del fields[i]
        return b"".join(f[2] for f in fields), f"piece field {i} dropped"
    elif op == "swap-pieces":
        j = rng.choice(pieces)
        fields[i], fields[j] = fields[j], fields[i]
        return b"".join(f[2] for f in fields), f"piece fields {i} and {j} swapped"
    elif op == "length":
        size = rng.choice((0, len(body) - 1, len(body) + 1, 2**31, 2**62, 2**64 - 1))
        new = b"\x0a" + rng.choice((pb_varint(size), pb_varint(len(body)).rstrip(b"\x00") + b"\x80\x00")) + body
        what = f"piece field {i} length set to {size} (or padded)"
    elif op == "trainer":
        spec = rng.choice((b"", b"\x18\x01", b"\x18\x03", b"\x18\x02\x98\x02\x00", b"\x98\x02\x01", b"\x18\xff\x01"))
        fields = [f for f in fields if f[0] != 2] + [(2, 2, pb_message(2, spec))]
        return b"".join(f[2] for f in fields), f"trainer_spec replaced by {spec!r}"
    elif op == "normalizer":
        charsmap = rng.choice((b"", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x04\x00\x00\x00abcd"))
        return data + pb_message(rng.choice((3, 5)), b"\x0a\x03nfk" + b"\x12" + pb_varint(len(charsmap)) + charsmap), \
            f"normalizer charsmap {charsmap!r} appended"
    elif op == "self-test":
        return data + pb_message(4, pb_message(1, b"\x0a\x01a\x12\x04\xe2\x96\x81a")), "self-test sample appended"
    elif op == "unknown-field":
        number, wire = rng.choice((6, 7, 200, 2**29 - 1)), rng.choice((0, 1, 2, 3, 4, 5, 6, 7))
        at = rng.choice(pieces)
        junk = pb_varint(number << 3 | wire) + rng.choice((b"\x05", b"\x02ab", bytes(8), b"\xff" * 10))
        fields.insert(at, (number, wire, junk))
        return b"".join(f[2] for f in fields), f"field {number} wire {wire} inserted before field {at}"
    else:  # "tag"
        fields.insert(rng.choice(pieces), (0, 2, b"\x02\x00"))
        return b"".join(f[2] for f in fields), "a field numbered 0 inserted"
    fields[i] = (1, 2, new)
    return b"".join(f[2] for f in fields), what


def spm_mutant(seed: str, index: int, bases: dict[str, bytes]) -> tuple[str, bytes, list[str]]:
    """Input `index` of campaign `seed`: its base, its bytes and its mutations."""
    rng = random.Random(f"{seed}/spm/{index}")
    names = sorted(SPM_BASE_WEIGHTS)
    base = rng.choices(names, [SPM_BASE_WEIGHTS[n] for n in names])[0]
    data, done = bases[base], []
    for k in range(rng.choice((1, 1, 2, 3))):
        data, what = mutate_spm(random.Random(f"{seed}/spm/{index}/{k}"), data)
        done.append(what)
    return base, data, done


SPM_CASE = mm.Case("fuzz-spm", tokenizer="tinyllama-1.1b-chat", config_from=mm.TINYLLAMA, tied=False,
                   dims=mm.Dims(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1, vocab_size=32000))


def spm_outcome(call: Callable[[], object], timeout: float) -> tuple[str, str]:
    """('ok' | 'refusal' | 'crash', detail) of one call."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        call()
        return "ok", ""
    except bc.Refusal as e:
        message = str(e)
        if not message or "\n" in message:
            return "crash", f"Refusal with a bad message: {message!r}"
        return "refusal", message
    except (Exception, Timeout, MemoryError, RecursionError) as e:
        tb = traceback.extract_tb(e.__traceback__)
        return "crash", f"{type(e).__name__}: {e} at {frame_text(tb[-1]) if tb else '?'}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class FileCampaign(NamedTuple):
    """A campaign over one input file of a model directory: mutants through its reader, every K-th
    also through convert() with the mutant in place (--tokenizer-model, --model-card)."""
    flag: str                                           # the command-line flag, for the report
    file_name: str                                      # where a mutant goes in the model directory
    model_case: "mm.Case"                               # the tiny model directory it goes into
    mutant: Callable[[str, int, dict], tuple[str, bytes, list[str]]]
    read: Callable[[Path], object]                      # the reader, on the model directory
    refusal_key: Callable[[str], str]                   # a refusal's histogram bucket


class Tally:
    """What a campaign of calls one input at a time (--tokenizer-model, --model-card, --checkpoint,
    --lora) found: counts by outcome, a histogram of refusals, its crashes and partial outputs."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.refusals: Counter = Counter()
        self.crashes: list[dict] = []
        self.partials: list[dict] = []
        self.start = time.perf_counter()

    def add(self, kind: str, detail: str, refusal_key: Callable[[str], str], crash: dict, counted: str = "") -> None:
        """One call's (kind, detail) from spm_outcome, counted under `counted` (default: kind); a
        crash recorded as `crash` with its error."""
        self.counts[counted or kind] += 1
        if kind == "refusal":
            self.refusals[refusal_key(detail)] += 1
        elif kind == "crash":
            self.crashes.append(dict(crash, error=detail))

    def inputs(self, args) -> Iterator[int]:
        """The campaign's input indices, a progress line (--progress) after every --every-th input."""
        for index in range(args.start, args.start + args.inputs):
            yield index
            if (index + 1) % args.every == 0 and args.progress:
                with open(args.progress, "a", encoding="utf-8") as f:
                    f.write(f"{time.strftime('%H:%M:%S')} {index + 1 - args.start} inputs: {dict(self.counts)}\n")

    def report(self, args, found: dict, measured: Optional[dict] = None, flag: str = "") -> tuple[dict, float]:
        """The JSON report, with the campaign's own findings (found) and figures (measured), and the
        seconds since the tally began."""
        seconds = time.perf_counter() - self.start
        return {"seed": args.seed, "inputs": args.inputs, "start": args.start, "counts": dict(self.counts),
                "crashes": self.crashes[:50], **found, "seconds": round(seconds, 1), **(measured or {}),
                "refusals": self.refusals.most_common(), "converter_sha256": CONVERTER_SHA256,
                "command": "python3 oracle/fuzz.py " + flag + " ".join(sys.argv[1:])}, seconds

    def findings(self, args, report: dict) -> None:
        """A campaign's end, before its summary line: the report written (--report), then its first
        crashes and partial outputs and its commonest refusals printed."""
        if args.report:
            write_atomically(Path(args.report), json.dumps(report, indent=2, ensure_ascii=True))
        for c in self.crashes[:10]:
            print(f"crash at input {c['index']}: {c['error'][:200]} ({c.get('mutations')})")
        for p in self.partials[:10]:
            print(f"partial output at input {p['index']}: {p['leftovers']} ({p['mutations']})")
        for reason, n in self.refusals.most_common(12):
            print(f"  {n:>7}  {reason}")


@contextlib.contextmanager
def file_campaign_work(args, name: str) -> Iterator[Path]:
    """A file campaign's work directory (bankml-fuzz-NAME-*), removed at the end, under the
    --memory-mb limit."""
    limit_memory(args.memory_mb)
    work = Path(tempfile.mkdtemp(prefix=f"bankml-fuzz-{name}-", dir=args.workdir)).resolve()
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_file_campaign(args, campaign: FileCampaign, bases: dict[str, bytes]) -> int:
    with file_campaign_work(args, campaign.flag.strip('-')) as work:
        model = mm.make_case(campaign.model_case, work / "base")
        t = Tally()
        for index in t.inputs(args):
            base, data, mutations = campaign.mutant(args.seed, index, bases)
            (model / campaign.file_name).write_bytes(data)
            kind, detail = spm_outcome(lambda: campaign.read(model), args.timeout)
            t.add(kind, detail, campaign.refusal_key, {"index": index, "base": base, "mutations": mutations})
            if args.convert_every and index % args.convert_every == 0:
                before = sorted(p.name for p in work.iterdir())
                out = work / "out.gguf"
                ckind, cdetail = spm_outcome(lambda: bc.convert(model, out, bc.Options(hash_inputs=False)),
                                             args.timeout * 3)
                t.counts["convert-" + ckind] += 1
                if ckind == "crash":
                    t.crashes.append({"index": index, "base": base, "mutations": mutations, "error": cdetail,
                                      "in": "convert"})
                if ckind == "ok" and kind != "ok" or ckind != kind and "crash" not in (kind, ckind):
                    t.crashes.append({"index": index, "mutations": mutations,
                                      "error": f"reader {kind} but convert {ckind}: {cdetail}"})
                out.unlink(missing_ok=True)
                after = sorted(p.name for p in work.iterdir())
                if after != before:
                    t.partials.append({"index": index, "mutations": mutations,
                                       "leftovers": sorted(set(after) - set(before))})
                    for name in set(after) - set(before):
                        (work / name).unlink()
    report, seconds = t.report(args, {"partials": t.partials[:50]})
    t.findings(args, report)
    conversions = sum(v for k, v in t.counts.items() if k.startswith("convert-"))
    print(f"fuzz {campaign.flag}: {args.inputs} inputs ({conversions} also converted), {len(t.crashes)} crashes, "
          f"{len(t.partials)} partial outputs, {t.counts['ok']} read, {t.counts['refusal']} refused, "
          f"{seconds:.0f} s")
    return 1 if t.crashes or t.partials else 0


def run_spm_campaign(args) -> int:
    bases = spm_bases()
    for name, data in bases.items():
        assert bc.checked_pieces(*bc.parsed_pieces(data)), name          # every base is read
    return run_file_campaign(args, FileCampaign(
        "--tokenizer-model", "tokenizer.model", SPM_CASE, spm_mutant,
        lambda d: bc.read_tokenizer_model(d / "tokenizer.model"),
        lambda detail: re.sub(r"\d+", "N", detail.split(":")[1] if ":" in detail else detail)[:70]), bases)


# ---------------------------------------------------------------------------------------------
# --checkpoint: torch.save files (oracle/fixtures/torch, and a hand-written .bin model part) mutated
# at the byte, zip and pickle level -- hostile globals and payloads spliced in among them -- through
# read_checkpoint, the ggml job's reader and writers, and every K-th through a model conversion.
# ---------------------------------------------------------------------------------------------

CK_FIXTURES = ROOT / "oracle" / "fixtures" / "torch"
# Payloads that would create the marker file were anything from the file ever run.
CK_MARKER = "bankml-fuzz-payload-ran"


def ck_bases() -> dict[str, bytes]:
    bases = {p.name: p.read_bytes() for p in sorted(CK_FIXTURES.glob("*.pt")) if p.stat().st_size < 120_000}
    part = mm.Entry("model.norm.weight", "F16", (4,), lambda: b"\0\x3c" * 4)
    tied = mm.Entry("lm_head.weight", "F16", (4,), part.payload, shares="model.norm.weight")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pytorch_model.bin"
        mm.write_torch_bin(path, [part, tied])
        bases["pytorch_model.bin"] = path.read_bytes()
    return bases


def ck_members(data: bytes) -> Optional[list[tuple[str, bytes]]]:
    import io
    import zipfile
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return [(i.filename, z.read(i)) for i in z.infolist()]
    except Exception:
        return None


def ck_zip(members: list[tuple[str, bytes]], deflate: set[str] = frozenset()) -> bytes:
    import io
    import zipfile
    import warnings
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as z:
        warnings.simplefilter("ignore")     # the duplicate members are the point
        for name, body in members:
            z.writestr(name, body, zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
    return buf.getvalue()


def ck_payload(rng: random.Random, marker: str) -> bytes:
    command = f"touch {marker}".encode()
    arg = b"X" + struct.pack("<I", len(command)) + command
    return rng.choice([
        b"cos\nsystem\n(" + arg + b"tR", b"cposix\nsystem\n(" + arg + b"tR",
        b"cbuiltins\neval\n(X" + struct.pack("<I", len(command) + 30) + b"__import__('os').system('" + command
        + b"')tR",
        b"\x8c\x02os\x8c\x06system\x93(" + arg + b"tR", b"(" + arg + b"ios\nsystem\n",
        b"(cos\nsystem\n" + arg + b"o", b"cos\nsystem\n(" + arg + b"t\x81", b"\x82\x01(" + arg + b"tR",
        b"ctorch._utils\n_rebuild_tensor_v2\n(" + arg + b"K\x00)\x29\x89}tR",
        b"ccollections\nOrderedDict\n)R}X\x09\x00\x00\x00__class__cos\nsystem\nsb",
        b"P" + command + b"\n", b"c__main__\nNet\n)R",
    ])


def ck_mutate_pickle(rng: random.Random, pkl: bytes, marker: str) -> tuple[bytes, str]:
    import pickletools
    try:
        ops = [(pos, op.code, arg) for op, arg, pos in pickletools.genops(pkl)]
    except Exception:
        ops = [(0, "", None)]
    pos, code, _ = rng.choice(ops)
    next_pos = min([p for p, _, _ in ops if p > pos] or [len(pkl)])
    kind = rng.randrange(9)
    if kind == 0:
        return pkl[:pos] + ck_payload(rng, marker) + pkl[pos:], f"payload at op {pos}"
    if kind == 1:
        return pkl[:pos] + bytes([rng.randrange(256)]) + pkl[pos + 1:], f"opcode at {pos} replaced"
    if kind == 2:
        return pkl[:pos] + pkl[next_pos:], f"op at {pos} deleted"
    if kind == 3:
        return pkl[:next_pos] + pkl[pos:next_pos] + pkl[next_pos:], f"op at {pos} doubled"
    if kind == 4 and next_pos - pos > 1:
        value = rng.choice([0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF])
        width = min(4, next_pos - pos - 1)
        return (pkl[:pos + 1] + (value & ((1 << 8 * width) - 1)).to_bytes(width, "little")
                + pkl[pos + 1 + width:]), f"argument of op at {pos} set to {value:#x}"
    if kind == 5:
        glob = rng.choice([b"cos\nsystem\n", b"ctorch\nLongStorage\n", b"ctorch\nfloat16\n",
                           b"ctorch._utils\n_rebuild_tensor_v3\n", b"ctorch._utils\n_rebuild_parameter\n",
                           b"ccollections\nOrderedDict\n", b"ctorch.storage\nUntypedStorage\n", b"c__builtin__\nset\n"])
        return pkl[:pos] + glob + pkl[next_pos:], f"op at {pos} replaced by {glob[1:-1]!r}"
    if kind == 6:
        return pkl[:pos] + rng.choice([b"(" * 300, b"]" * 5000, b"r\x00\x00\x00\x40", b"N" * 1000,
                                       b"h\xff", b"\x95" + b"\xff" * 8, b"e", b"u", b"b", b"."]) + pkl[pos:], \
            f"bomb at {pos}"
    if kind == 7:
        a, b = sorted(rng.randrange(len(pkl) + 1) for _ in range(2))
        return pkl[:a] + pkl[b:], f"bytes {a}..{b} cut"
    return pkl[:rng.randrange(len(pkl) + 1)], "truncated"


def ck_mutate(rng: random.Random, data: bytes, marker: str) -> tuple[bytes, str]:
    if not data:    # an earlier mutation truncated it to nothing
        return bytes([rng.randrange(256)]) * rng.randrange(1, 64), "bytes from nothing"
    members = ck_members(data) if data[:2] == b"PK" else None
    kind = rng.randrange(10)
    if members and kind < 5:
        names = [n for n, _ in members]
        pkl_name = next((n for n in names if n.endswith("data.pkl")), names[0])
        if kind < 3:
            body = dict(members)[pkl_name]
            new, what = ck_mutate_pickle(rng, body, marker)
            return ck_zip([(n, new if n == pkl_name else b) for n, b in members]), what
        if kind == 3:
            victim = rng.choice(names)
            change = rng.randrange(5)
            if change == 0:
                return ck_zip([(n, b) for n, b in members if n != victim]), f"{victim} removed"
            if change == 1:
                return ck_zip(members, {victim}), f"{victim} deflated"
            if change == 2:
                return ck_zip(members + [(victim, b"")]), f"{victim} twice"
            if change == 3:
                return ck_zip([(rng.choice(["../" + n, n + "/", "x/" + n]) if n == victim else n, b)
                               for n, b in members]), f"{victim} renamed"
            return ck_zip([(n, b[:len(b) // 2] if n == victim else b) for n, b in members]), f"{victim} halved"
        # a central directory or local header field set to a boundary value
        for _ in range(10):
            at = data.find(rng.choice([b"PK\x01\x02", b"PK\x03\x04", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"]),
                           rng.randrange(len(data)))
            if at >= 0:
                break
        else:
            at = rng.randrange(len(data))
        off = at + rng.randrange(4, 46)
        width = rng.choice([2, 4, 8])
        value = rng.choice([0, 1, 0xFFFF, 0xFFFFFFFF, (1 << 64) - 1, len(data), len(data) + 1, 2**40]) & ((1 << 8 * width) - 1)
        mutated = bytearray(data)
        mutated[off:off + width] = value.to_bytes(width, "little")
        return bytes(mutated[:len(data)]), f"zip field at {off} = {value:#x}"
    if data[:2] == b"\x80\x02" and kind < 7:
        cut = rng.randrange(len(data))
        new, what = ck_mutate_pickle(rng, data[:cut], marker)
        return new + data[cut:], "legacy: " + what
    if kind < 8:
        mutated = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 8))):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        return bytes(mutated), "bytes flipped"
    if kind == 8:
        return data[:rng.randrange(len(data))], "file truncated"
    a = rng.randrange(len(data))
    return data[:a] + data[a:a + rng.randrange(1, 200)] * 2 + data[a + 200:], "bytes repeated"


def ck_mutant(seed: str, index: int, bases: dict[str, bytes], marker: str) -> tuple[str, bytes, list[str]]:
    rng = random.Random(f"{seed}/ck/{index}")
    base = rng.choice(sorted(bases))
    data, done = bases[base], []
    for k in range(rng.choice((1, 1, 2, 3))):
        data, what = ck_mutate(random.Random(f"{seed}/ck/{index}/{k}"), data, marker)
        done.append(what)
    return base, data, done


def _ck_refusal_key(detail: str) -> str:
    reason = detail.split(": ", 1)[1] if ": " in detail else detail
    return re.sub(r"\d+", "N", reason)[:70]


def run_checkpoint_campaign(args) -> int:
    bases = ck_bases()
    executions: list[int] = []
    with file_campaign_work(args, "ck") as work:
        marker = work / CK_MARKER
        model = mm.make_case(mm.replace(mm.CASES_BY_NAME["bin-module-tied"], name="fuzz-bin", dims=mm.Dims(
            hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=49152)), work / "model")
        model_bin = (model / "pytorch_model.bin").read_bytes()
        path = work / "state.pt"
        t = Tally()
        for index in t.inputs(args):
            if args.convert_every and index % args.convert_every == 0:
                base, data, mutations = ck_mutant(args.seed, index, {"model": model_bin}, str(marker))
                (model / "pytorch_model.bin").write_bytes(data)
                out = work / "out.gguf"
                calls = {"convert": lambda: bc.convert(model, out, bc.Options(hash_inputs=False, workers=1))}
            else:
                base, data, mutations = ck_mutant(args.seed, index, bases, str(marker))
                path.write_bytes(data)
                out = work / "out.ggml"
                calls = {"read_checkpoint": lambda: bc.read_checkpoint(path),
                         "declared_tensors": lambda: bc.declared_tensors(path),
                         "ggml": lambda: bc.convert_state_dict(path, out),
                         "mnist-fc": lambda: bc.convert_state_dict(path, out, "mnist-fc")}
            for name, call in calls.items():
                kind, detail = spm_outcome(call, args.timeout)
                t.add(kind, detail, _ck_refusal_key,
                      {"index": index, "base": base, "call": name, "mutations": mutations}, counted=f"{name}-{kind}")
                if out.with_name(out.name + ".part").exists():
                    t.crashes.append({"index": index, "call": name, "error": "a .part was left"})
                out.unlink(missing_ok=True)
            if marker.exists():
                executions.append(index)
                marker.unlink()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report, seconds = t.report(args, {"executions": executions[:50]},
                               {"peak_rss_mb": round(peak_mb, 1), "memory_limit_mb": args.memory_mb}, "--checkpoint ")
    t.findings(args, report)
    accepted = sum(v for k, v in t.counts.items() if k.endswith("-ok"))
    print(f"fuzz --checkpoint: {args.inputs} inputs, {len(t.crashes)} crashes, {len(executions)} executions, "
          f"{accepted} calls returned, {sum(t.refusals.values())} refused, peak RSS {peak_mb:.0f} MB, "
          f"{seconds:.0f} s ({args.inputs / max(seconds, 1e-9):.0f} inputs/s)")
    return 1 if t.crashes or executions else 0



# ---------------------------------------------------------------------------------------------
# --model-card: README.md front matter, mutated line by line and byte by byte (issue 15).
# ---------------------------------------------------------------------------------------------

CARD_INSERTS = ("&a ", "*a", "!!str ", "|", ">-", "{", "}", "[", "]", ", ", ": ", " #", "? ", "- ", "'", '"',
                "%", "@", "`", "~", "\\", "\t", "\r", "\x85", "\u2028", "\ufeff", "\x00", "\x07", "---", "...")
CARD_SPECIALS = ("yes", "no", "on", "Off", "~", "null", "0x1f", "0b2", "012", "08", "1:30", "1:30.5", ".inf",
                 ".NaN", "1e999", "1_000", "2024-01-02", "2024-13-45", "2001-12-14t21:59:43.10-05:00", "=",
                 "<<", "", "''", '""', '"\\ud800"', '"\\x4"', "[]", "[a, b]", "|", "- x")


# The card fields a derived output name and general.* are made of (issue 35), and values for them: whole
# numbers past str()'s 4,300 digits (YAML 1.1 hex, binary, decimal), templates, path parts, control
# characters (double-quoted escapes, which YAML lets through), a name too long for a file system.
CARD_NAME_FIELDS = ("name", "model_name", "size_label", "finetune", "version", "basename")
CARD_NAME_VALUES = ("0x" + "f" * 3600, "0b" + "1" * 16000, "-0x" + "a" * 5000, "9" * 4300, "9" * 4301, "0x1f",
                    "0o17", "017", "1:30", "{ftype}", "Model {ftype}", "M {ftype.__class__.__mro__}",
                    "M {0:>100000000}", "'{}'", "'{0}'", "'{'", "x/llama", "../../../ESCAPED", "..", ".", "/",
                    "a/../b", "/etc/passwd", "'..'", '"a\\eb"', '"a\\x07b"', '"a\\nb"', '"x\\x1b[31m"', '"\\0"',
                    '"\\u202e"', '"a\\rb"', '"\\x85"', "a" * 300, "[0x" + "f" * 3600 + "]")


def card_name_field(rng: random.Random) -> str:
    """One `field: value` line of the naming fields and values above."""
    return f"{rng.choice(CARD_NAME_FIELDS)}: {rng.choice(CARD_NAME_VALUES)}"


def card_bases() -> dict[str, bytes]:
    bases = {f"fixtures/cards/{p.name}": p.read_bytes() for p in sorted((ORACLE / "fixtures" / "cards").glob("*.md"))
             if p.name != "PROVENANCE.md"}
    bases.update({f"make_models.MODEL_CARDS[{k}]": v.encode("utf-8") for k, v in mm.MODEL_CARDS.items()})
    return bases


def mutate_card(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """data with one line-level or byte-level change a card reader must survive, and what was done."""
    if chance(rng, 0.15):
        return byte_damage(rng, data)
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return byte_damage(rng, data)
    n = len(lines)
    i = rng.randrange(n)
    op = rng.choice(["dup", "drop", "swap", "indent", "dedent", "insert", "special", "nest", "anchors",
                     "crlf", "unclose", "huge-key", "long-list", "quote-open", "name-field", "name-field"])
    if op == "dup":
        lines.insert(i, lines[i])
        what = f"line {i + 1} doubled"
    elif op == "drop" and n > 1:
        del lines[i]
        what = f"line {i + 1} dropped"
    elif op == "swap" and n > 1:
        j = rng.randrange(n)
        lines[i], lines[j] = lines[j], lines[i]
        what = f"lines {i + 1} and {j + 1} swapped"
    elif op == "indent":
        k = rng.choice([1, 2, 3, 4, 8])
        lines[i] = " " * k + lines[i]
        what = f"line {i + 1} indented by {k}"
    elif op == "dedent":
        lines[i] = lines[i].lstrip(" ")
        what = f"line {i + 1} dedented"
    elif op == "insert":
        at = rng.randrange(len(lines[i]) + 1)
        junk = rng.choice(CARD_INSERTS)
        lines[i] = lines[i][:at] + junk + lines[i][at:]
        what = f"{junk!r} inserted in line {i + 1} at {at}"
    elif op == "special":
        head, sep, _ = lines[i].partition(": ")
        value = rng.choice(CARD_SPECIALS)
        lines[i] = (head + ": " if sep else lines[i] + " ") + value if not lines[i].lstrip().startswith("- ") \
            else lines[i][:lines[i].index("- ") + 2] + value
        what = f"line {i + 1} given the value {value!r}"
    elif op == "nest":
        depth = rng.choice([10, 47, 48, 49, 60, 500])
        block = [" " * d + f"k{d}:" for d in range(depth)] if chance(rng, 0.5) else ["k: " + "- " * depth + "x"]
        lines[i:i] = block
        what = f"{depth} levels of nesting at line {i + 1}"
    elif op == "anchors":
        lines[i:i] = ["a: &a [x, x, x]", "b: &b [*a, *a, *a]", "c: *b"]
        what = f"anchors and aliases at line {i + 1}"
    elif op == "crlf":
        return data.replace(b"\n", b"\r\n"), "CRLF line ends"
    elif op == "unclose":
        closing = [k for k, line in enumerate(lines) if k > 0 and line == "---"]
        if not closing:
            return data + b"---\n", "a closing --- appended"
        del lines[closing[0]]
        what = "the closing --- removed"
    elif op == "huge-key":
        k = rng.choice([999, 1000, 1001, 1025, 5000])
        lines.insert(i, "k" * k + ": v")
        what = f"a {k}-character key at line {i + 1}"
    elif op == "name-field":
        # At the end of the front matter, so that it wins over the card's own key of that name.
        line = card_name_field(rng)
        if lines[0] == "---":
            lines.insert(next((k for k in range(1, n) if lines[k] == "---"), n), line)
        else:
            lines[0:0] = ["---", line, "---"]
        what = f"{short(line)} at the front matter's end"
    elif op == "long-list":
        k = rng.choice([1000, 20000])
        lines[i:i] = ["tags:"] + [f"- t{j}" for j in range(k)]
        what = f"a {k}-item list at line {i + 1}"
    else:
        lines[i] = lines[i] + rng.choice(['"', "'", ' "open', " 'open", " [open", ' "\\'])
        what = f"an unclosed quote or bracket at the end of line {i + 1}"
    return "\n".join(lines).encode("utf-8", "surrogatepass"), what


_CARD_BASES: dict[str, bytes] = {}


def write_card_mutant(ctx: Ctx) -> Optional[str]:
    """A README.md model card, mutated as --model-card mutates it (the whole campaign covers cards too)."""
    if not _CARD_BASES:
        _CARD_BASES.update(card_bases())
    base = ctx.rng.choice(sorted(_CARD_BASES))
    data, what = mutate_card(ctx.rng, _CARD_BASES[base])
    put(ctx.dir / "README.md", data)
    return f"README.md: {base}, {what}"


def write_card_names(ctx: Ctx) -> Optional[str]:
    """A README.md whose naming fields are hostile, the output then named from them most times: the
    derived name must stay one printable file name in its folder, written as derived (issue 35)."""
    fields = [card_name_field(ctx.rng) for _ in range(ctx.rng.choice((1, 1, 2, 3)))]
    put(ctx.dir / "README.md", ("---\n" + "\n".join(fields) + "\n---\n").encode("utf-8"))
    ctx.default_name = chance(ctx.rng, 0.7)
    return f"README.md: {short('; '.join(fields))}{', output named from it' if ctx.default_name else ''}"


def card_mutant(seed: str, index: int, bases: dict[str, bytes]) -> tuple[str, bytes, list[str]]:
    """Input `index` of campaign `seed`: its base card, its bytes and its mutations."""
    rng = random.Random(f"{seed}/card/{index}")
    base = rng.choice(sorted(bases))
    data, done = bases[base], []
    for k in range(rng.choice((1, 1, 2, 3))):
        data, what = mutate_card(random.Random(f"{seed}/card/{index}/{k}"), data)
        done.append(what)
    return base, data, done


def read_card(card_dir: Path) -> object:
    """The card path of a conversion: the front matter read, then every general.* key it gives."""
    return bc.general_kvs(None, card_dir.name, None, 134_515_008, 134_515_008, 0, 0, bc.load_model_card(card_dir))


def _card_refusal_key(detail: str) -> str:
    reason = re.sub(r"^README\.md line \d+: ", "", detail).split(";")[0]
    return re.sub(r"\d+", "N", re.sub(r"\(.*\)", "(...)", reason))[:70]


def run_card_campaign(args) -> int:
    return run_file_campaign(args, FileCampaign("--model-card", "README.md", BASES[0][0], card_mutant, read_card,
                                                _card_refusal_key), card_bases())

# --lora: PEFT adapters (oracle/fixtures/lora) with adapter_config.json, the adapter's safetensors
# header and its model card mutated, each converted with convert_lora against its base's config.json.
# ---------------------------------------------------------------------------------------------

LORA_ADAPTERS = ("smollm2-lora-r8", "qwen2.5-0.5b-lora-r8", "gemma-3-1b-lora-r8", "qwen3.5-0.8b-lora-r8")


def mutate_adapter(rng: random.Random, adapter: Path) -> str:
    """One change to an adapter directory: its adapter_config.json (structure or bytes), a tensor
    name, dtype or shape of its safetensors header, or its README.md."""
    target = weighted(rng, (("config", 60), ("header", 25), ("pairs", 15), ("card", 10), ("gone", 5)))
    path = adapter / "adapter_config.json"
    if target in ("config", "header", "pairs", "gone") and not (path.is_file() and (adapter / "adapter_model.safetensors").is_file()):
        return "nothing: a file was removed before"
    if target == "config":
        if chance(rng, 0.2):
            data, what = byte_damage(rng, path.read_bytes())
            path.write_bytes(data)
            return f"adapter_config.json: {what}"
        try:
            new, what = mutate_json_doc(rng, json.loads(path.read_bytes()), "adapter_config.json")
            path.write_bytes(dumps(new, rng, indent=rng.choice([None, 2])))
        except (ValueError, RecursionError, TypeError, KeyError, IndexError):
            data, what = byte_damage(rng, path.read_bytes())
            path.write_bytes(data)
        return f"adapter_config.json: {what}"
    if target == "header":
        st = read_st(adapter / "adapter_model.safetensors")
        if st is None:
            return "adapter_model.safetensors: unreadable, left"
        pieces = st_pieces(st)
        i = rng.randrange(len(pieces))
        name, info, data = pieces[i]
        op = rng.choice(["rename", "dtype", "shape", "drop"])
        if op == "rename":
            new = rng.choice(NAME_POOL + (name.replace("lora_A", "lora_B"), name.replace(".weight", ".bias"),
                                          name.replace("lora_A.weight", "lora_magnitude_vector"),
                                          "base_model.model.lm_head.lora_A.weight", "base_model.model.model.norm.weight",
                                          name.replace("layers.0", "layers.7"), name.replace("q_proj", "embed_tokens")))
            pieces[i] = (new, info, data)
            what = f"{name} renamed {new!r}"
        elif op == "dtype":
            info = dict(info, dtype=rng.choice(DTYPE_POOL))
            pieces[i] = (name, info, data)
            what = f"{name} dtype {info['dtype']}"
        elif op == "shape":
            shape = list(info["shape"])
            shape[rng.randrange(len(shape))] = rng.choice([0, 1, 3, 4, 16, 32, 2**31])
            pieces[i] = (name, dict(info, shape=shape), data)
            what = f"{name} shape {shape}"
        else:
            del pieces[i]
            what = f"{name} dropped"
        write_st(adapter / "adapter_model.safetensors", relayout(st, pieces), rng)
        return f"adapter_model.safetensors: {what}"
    if target == "pairs":
        return mutate_lora_pair(rng, adapter / "adapter_model.safetensors")
    if target == "card":
        if not _CARD_BASES:
            _CARD_BASES.update(card_bases())
        data, what = mutate_card(rng, _CARD_BASES[rng.choice(sorted(_CARD_BASES))])
        (adapter / "README.md").write_bytes(data)
        return f"README.md: {what}"
    name = rng.choice(["adapter_config.json", "adapter_model.safetensors"])
    (adapter / name).unlink()
    return f"{name} removed"


def mutate_lora_pair(rng: random.Random, path: Path) -> str:
    """One LoRA pair's shapes against each other (issue 35): rank 0, ranks that differ, a huge rank
    behind factors of no bytes; or the pair again under the bare name beside PEFT's prefixed one."""
    st = read_st(path)
    if st is None:
        return "adapter_model.safetensors: unreadable, left"
    pieces = st_pieces(st)
    by_name = {name: i for i, (name, _, _) in enumerate(pieces)}
    stems = [n[:-len(".lora_A.weight")] for n in by_name if n.endswith(".lora_A.weight")
             and n.replace("lora_A", "lora_B") in by_name]
    if not stems:
        return "adapter_model.safetensors: no pair left"
    stem = rng.choice(stems)
    ia, ib = by_name[stem + ".lora_A.weight"], by_name[stem + ".lora_B.weight"]
    (a, meta_a, _), (b, meta_b, _) = pieces[ia], pieces[ib]
    r, n_in, n_out = meta_a["shape"][0], meta_a["shape"][-1], meta_b["shape"][0]
    op = rng.choice(["rank0", "rank0", "ranks", "huge-rank", "duplicate", "duplicate"])
    if op == "duplicate":
        bare = stem.replace("base_model.model.", "", 1) if stem.startswith("base_model.model.") else \
            "base_model.model." + stem
        pieces += [(bare + name[len(stem):], meta, data) for name, meta, data in (pieces[ia], pieces[ib])]
        what = f"{stem} pair again as {bare}"
    else:
        shapes = {"rank0": ([0, n_in], [n_out, 0]), "ranks": ([r + rng.choice((-1, 1, r)), n_in], [n_out, r]),
                  "huge-rank": ([2**31, 0], [0, 2**31])}[op]
        for i, shape in zip((ia, ib), shapes):
            name, meta, _ = pieces[i]
            pieces[i] = (name, dict(meta, shape=shape), bytes(math.prod(shape) * element_size(meta["dtype"])))
        what = f"{stem} lora_A {shapes[0]}, lora_B {shapes[1]}"
    write_st(path, relayout(st, pieces), rng)
    return f"adapter_model.safetensors: {what}"


def _lora_refusal_key(detail: str) -> str:
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'...'", detail))[:70]


def run_lora_campaign(args) -> int:
    with file_campaign_work(args, "lora") as work:
        t = Tally()
        bases = {}
        for name in LORA_ADAPTERS:
            case = mm.CASES_BY_NAME[mm.ADAPTERS_BY_NAME[name].base]
            bases[name] = mm.make_base_config_dir(case, work / "bases" / case.name)
        out_dir = work / "out"
        out_dir.mkdir()
        for index in t.inputs(args):
            rng = random.Random(f"{args.seed}/lora/{index}")
            name = rng.choice(LORA_ADAPTERS)
            adapter = work / "adapters" / name
            shutil.rmtree(adapter, ignore_errors=True)
            shutil.copytree(mm.LORA_FIXTURES / name, adapter)
            mutations = [mutate_adapter(random.Random(f"{args.seed}/lora/{index}/{k}"), adapter)
                         for k in range(rng.choice((1, 1, 2, 3)))]
            outtype = rng.choice(("f32", "f16", "bf16", "q8_0", "auto"))
            kind, detail = spm_outcome(lambda: bc.convert_lora(adapter, out_dir / "out.gguf", bases[name],
                                                               bc.Options(outtype=outtype, hash_inputs=False)),
                                       args.timeout)
            t.add(kind, detail, _lora_refusal_key, {"index": index, "base": name, "mutations": mutations})
            left = sorted(p.name for p in out_dir.iterdir())
            if left != (["out.gguf"] if kind == "ok" else []):
                t.partials.append({"index": index, "mutations": mutations, "leftovers": left})
            for p in out_dir.iterdir():
                p.unlink()
    report, seconds = t.report(args, {"partials": t.partials[:50]})
    t.findings(args, report)
    print(f"fuzz --lora: {args.inputs} inputs, {len(t.crashes)} crashes, {len(t.partials)} partial outputs, "
          f"{t.counts['ok']} converted, {t.counts['refusal']} refused, {seconds:.0f} s")
    return 1 if t.crashes or t.partials else 0


# The on/off options of main(), in --help's order: the modes and their switches.
SWITCHES = (
    ("--directed", "run the hand-made hostile inputs (DIRECTED) instead of a random campaign"),
    ("--quiet", "no line per new crash on stderr"),
    ("--gguf", "fuzz the GGUF reader, listings, diff and verify with mutated GGUF files instead"),
    ("--coverage", "with --gguf and one worker: report the reader/diff/verify lines never executed"),
    ("--shrink", "with --gguf --replay: cut the mutant down to a smaller file with the same finding"),
    ("--model-card", "fuzz the README.md model-card reader (and every --convert-every-th input through convert)"),
    ("--tokenizer-model",
     "fuzz the SentencePiece tokenizer.model reader (and conversion) with mutated files instead"),
    ("--checkpoint", "fuzz the torch.save checkpoint reader and the ggml job with mutated checkpoints instead"),
    ("--lora", "fuzz LoRA adapter conversion (adapter_config.json, the adapter's header, its card) instead"),
    ("--mmproj", "the converter campaign (and --replay) on the vision projector bases alone (PROJECTOR_BASES): their "
                 "processor files and vision_config mutated, three inputs in four converted with --mmproj"),
)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description="Fuzz bankml_convert with mutated model directories.")
    p.add_argument("--inputs", type=int, default=2000, help="how many inputs (default 2000)")
    p.add_argument("--seed", default="1", help="campaign seed; input i is fully determined by (seed, i)")
    p.add_argument("--start", type=int, default=0, help="first input index (default 0)")
    p.add_argument("--workers", type=int, default=1, help="processes (default 1; the machine is shared)")
    p.add_argument("--report", help="JSON report: unique crashes with reproducers, partial outputs, refusal histogram")
    p.add_argument("--progress", help="append a progress line here every --every inputs and on each new crash")
    p.add_argument("--every", type=int, default=200, help="progress interval in inputs (default 200)")
    p.add_argument("--timeout", type=float,
                   help="seconds before an input (with --gguf: one call) counts as a hang (default 20; --gguf 10)")
    p.add_argument("--memory-mb", type=int, default=2048, help="address-space limit per process (default 2048; 0: none)")
    p.add_argument("--workdir", help="where the temporary work directory goes (default: the system temp dir)")
    p.add_argument("--keep-work", action="store_true", help="do not delete the work directory")
    p.add_argument("--replay", type=int, metavar="INDEX", help="rebuild and run only input INDEX, with its traceback")
    p.add_argument("--only", type=int, metavar="K", help="with --replay: apply only mutation K of the input")
    p.add_argument("--keep", metavar="DIR", help="with --replay: build the input in DIR and leave it there")
    for flag, help_text in SWITCHES:
        p.add_argument(flag, action="store_true", help=help_text)
    p.add_argument("--convert-every", type=int, default=25,
                   help="with --tokenizer-model: also convert every Nth mutant in a tiny model directory (0: never)")
    args = p.parse_args(argv)
    if args.timeout is None:
        args.timeout = 10.0 if args.gguf else 20.0
    if args.gguf and args.directed:
        p.error("--directed is for the converter mode")
    if args.coverage and (not args.gguf or args.workers > 1):
        p.error("--coverage needs --gguf and --workers 1")
    # Messages quote hostile input (lone surrogates included); printing them must not fail.
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(errors="backslashreplace")
    if args.checkpoint:
        return run_checkpoint_campaign(args)
    if args.lora:
        return run_lora_campaign(args)
    if args.tokenizer_model:
        return run_spm_campaign(args)
    if args.model_card:
        return run_card_campaign(args)
    if args.gguf:
        return run_gguf_replay(args) if args.replay is not None else run_gguf_campaign(args)
    if args.replay is not None:
        return run_replay(args)
    if args.directed:
        return run_directed(args)
    return run_campaign(args)


if __name__ == "__main__":
    sys.exit(main())
