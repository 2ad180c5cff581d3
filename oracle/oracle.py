#!/usr/bin/env python3
"""The oracle: run llama.cpp's convert_hf_to_gguf.py and bankml_convert on the same generated
model directories and compare the files sha256 for sha256.

    python3 oracle/oracle.py record [RUN ...]    # llama.cpp's sha256s -> oracle/recorded/golden.json
    python3 oracle/oracle.py compare [RUN ...]   # both converters; exit 1 on any mismatch
    python3 oracle/oracle.py names               # gguf-py's name heuristics vs bankml's, every id
    python3 oracle/oracle.py cards [--record] [--random N] [--mutants N]
                                                 # PyYAML/gguf-py's model-card reading vs bankml's: YAML
                                                 # typing, documents, oracle/fixtures/cards/ (the corpus)
    python3 oracle/oracle.py chkhsh [DIR ...]    # llama.cpp's pre-tokenizer hash and name beside bankml's
                                                 # (default: every tokenizer case; --record saves them)
    python3 oracle/oracle.py inspect [RUN ...]   # bankml's inspect vs gguf-py's reader (default: full size)
    python3 oracle/oracle.py load [RUN ...|all] [--tokens N] [--timeout S] [--keep]
                                                 # llama.cpp's runtime loads each recorded output and
                                                 # generates (oracle/runtime_oracle.py)
    python3 oracle/oracle.py list

Standard library only; the reference runs in its own venv (oracle/setup_reference.sh, called here
when needed).  The expected sha256s in test_bankml_convert.py come from `record` and nothing else.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import make_models  # noqa: E402

GOLDEN = HERE / "recorded" / "golden.json"
WORK = Path(os.environ.get("BANKML_ORACLE_WORK", ROOT / "build" / "oracle"))


@dataclass(frozen=True)
class Run:
    """One comparison: a generated case, the flags both converters get, and what bankml must do."""
    name: str
    case: str
    args: tuple[str, ...] = ()
    refused: bool = False       # bankml_convert must refuse (llama.cpp converts it another way)
    adapter: str = ""           # a LoRA run: make_models.ADAPTERS' name; case is its base (config.json only)

    @property
    def outtype(self) -> str:
        return self.args[self.args.index("--outtype") + 1] if "--outtype" in self.args else "f16"

    @property
    def split(self) -> bool:
        """Whether the run splits its output into shards (llama.cpp's split flags)."""
        return any(a in SPLIT_FLAGS for a in self.args)


SPLIT_FLAGS = ("--split-max-size", "--split-max-tensors", "--no-tensor-first-split")


def written_files(out: Path) -> list[Path]:
    """What a converter wrote for --outfile out: out itself, or its shards (STEM-00001-of-0000N.gguf, ...)."""
    if out.exists():
        return [out]
    return sorted(out.parent.glob(f"{out.stem}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].gguf"))


def clear_outputs(out: Path) -> None:
    """Remove what an earlier conversion wrote for out, shards too (so a set of another count is not
    taken for this run's, nor refused by bankml as an earlier set left beside its own)."""
    for f in written_files(out):
        f.unlink()


def shard_entries(files: list[Path], stem: str) -> list[dict]:
    """The shards as golden.json records them: named for --outfile OUT, as its "command" says."""
    return [{"name": "OUT" + f.name[len(stem):], "sha256": sha256_of(f), "bytes": f.stat().st_size} for f in files]


OTHER_OUTTYPES = ("f32", "bf16", "q8_0", "auto")
# Cases llama.cpp converts and bankml_convert must refuse (its output would not be what the user needs).
# Qwen3.5 without its MTP weights: llama.cpp counts the MTP layer it declares and writes no tensors for
# it, a file llama.cpp's runtime refuses to load (bankml asks for --no-nextn).
REFUSED_CASES = frozenset({"smollm3-nope-every-3rd", "qwen3.5-0.8b-no-mtp", "qwen3.5-moe-no-mtp",
                           # Phi-4-mini's chat tokens outside the model vocab: llama.cpp writes them at the ids
                           # tokenizers gives them (200,000...), not the model's (200,019...)
                           "phi-4-mini-chat-tokens-added-only",
                           # Gemma 4 whose shared layers would reuse the KV of a layer of the other kind: the
                           # runtime aborts on llama.cpp's file
                           "gemma-4-e2b-shared-kv-mismatch",
                           # Qwen3.5 saved in F16 (the projector case's text model): llama.cpp's -exp of an F16
                           # A_log is not reproduced (bankml asks for bfloat16)
                           "qwen3.5-0.8b-vision-f16"})
# Adapters llama.cpp converts and bankml_convert must refuse: a LoRA on the embedding of a base with tied
# embeddings, which llama.cpp's runtime also applies to the output head, where it aborts (oracle.py load).
# And on Qwen3.5: a LoRA on the MTP layer, whose tensors llama.cpp's runtime loads only for MTP drafting
# (otherwise it refuses the whole adapter: "LoRA tensor 'blk.4.attn_q.weight' does not exist in base model"),
# and one on the output head of a tied base, whose file has no output.weight ("LoRA tensor 'output.weight'
# does not exist in base model").
REFUSED_ADAPTERS = frozenset({"smollm2-lora-embed-bf16", "qwen3.5-0.8b-lora-mtp", "qwen3.5-0.8b-lora-head"})
RUNS: tuple[Run, ...] = tuple(
    [Run(c.name, c.name, ("--outtype", "f16"), refused=c.name in REFUSED_CASES) for c in make_models.CASES]
    + [Run("model-name", "bf16", ("--outtype", "f16", "--model-name", "mindx-gen39 merged"))]
    # Every other output type on each source dtype (with special values), on a shape whose rows
    # are not whole Q8_0 blocks (llama.cpp's F16 fallback), on the full-size model, and on every
    # SentencePiece Llama/Mistral case.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("bf16", "f16", "f32", "shape-360m-instruct", "example", "full-135m-instruct",
                    *(c.name for c in make_models.SPM_CASES),
                    "qwen2.5-0.5b-bf16", "qwen2.5-0.5b-f16", "qwen2.5-7b-untied", "qwen2.5-7b-untied-f16",
                    "qwen2.5-0.5b-sharded", "qwen3-0.6b-bf16", "qwen3-0.6b-f16", "qwen3-0.6b-sharded")
       for t in OTHER_OUTTYPES]
    # Mistral's Hub layout and Qwen3's resized vocabulary: one rule each, shown in f16 and q8_0.
    + [Run(f"{case}-q8_0", case, ("--outtype", "q8_0")) for case in ("mistral-v0.3-hub-layout", "qwen3-0.6b-resized-vocab")]
    # Llama 3.x (issue 12): every output type from BF16 and from F16 weights, for the 1B (both
    # tokenizers), the 3B shape (head_dim 128 named, tied) and the 8B shape (head_dim 128 derived, untied).
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("llama-3.2-1b-instruct", "llama-3.2-1b-instruct-f16", "llama-3.2-1b-instruct-resaved",
                    "llama-3.2-1b-instruct-resaved-f16", "llama-3.2-3b-shape", "llama-3.2-3b-shape-f16",
                    "llama-3.1-8b-shape", "llama-3.1-8b-shape-f16")
       for t in OTHER_OUTTYPES]
    # Gemma 3 and Gemma 2 (issue 25): every output type from each source dtype (BF16, F16, F32), for the
    # 1B shape, the 4B wrapper and Gemma 2; the 270m shape and Gemma 2's BF16 source in f16 only.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("gemma-3-1b-shape", "gemma-3-1b-shape-f16", "gemma-3-1b-f32", "gemma-3-4b-shape", "gemma-2-2b-f32")
       for t in OTHER_OUTTYPES]
    # Phi-3 (issue 26): every output type from BF16 and F32 weights, for Phi-3.5-mini (LongRoPE) and Phi-3-mini-4k.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("phi-3.5-mini-shape", "phi-3.5-mini-f32", "phi-3-mini-4k-shape", "phi-3-mini-4k-f32")
       for t in OTHER_OUTTYPES]
    # Mixtures of experts (issue 27): every output type from BF16 and F16 experts spanning shards, for
    # Qwen3-MoE (and its transformers 5 stacked layout), Mixtral and Qwen2-MoE.
    + [Run(f"{c.name}-{t}", c.name, ("--outtype", t)) for c in make_models.MOE_CASES for t in OTHER_OUTTYPES]
    # LoRA adapters (issue 28): convert_lora_to_gguf.py --base, in each output type it offers but auto
    # (which crashes there); f32 is its default.
    + [Run(f"lora-{a.name}-{t}", a.base, ("--outtype", t), adapter=a.name, refused=a.name in REFUSED_ADAPTERS)
       for a in make_models.ADAPTERS for t in ("f32", "f16", "bf16", "q8_0")]
    # The embedding's LoRA on an untied base of the same shape: what the tied base refuses, converted.
    + [Run(f"lora-smollm2-lora-embed-bf16-untied-{t}", "untied", ("--outtype", t), adapter="smollm2-lora-embed-bf16")
       for t in ("f32", "f16", "bf16", "q8_0")]
    # The real Gemma tokenizers (fetched: oracle/fetch_gemma_tokenizers.sh): the tokenizer.json-only path
    # and the SentencePiece path with a built tokenizer.model, in q8_0 too.
    + [Run(f"{case}-q8_0", case, ("--outtype", "q8_0"))
       for case in ("gemma-3-1b-tokenizer-json", "gemma-3-4b-tokenizer-json", "gemma-3-1b-real-spm")]
    # SmolLM3, Granite 3.x and OLMo 2 (issue 26): every output type from BF16 and from F32 weights; a
    # SmolLM3 config whose NoPE layers llama.cpp's runtime would not apply, refused.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("smollm3-3b-shape", "smollm3-3b-f32", "granite-3.3-2b-shape", "granite-3.3-2b-f32",
                    "olmo-2-1b-shape", "olmo-2-1b-f32")
       for t in OTHER_OUTTYPES]
    # Qwen3.5 dense (issue 36): every output type for the text model (2 key and 2 value heads), the V
    # reorder (2 and 4) and the multimodal wrapper, MTP weights present; without them, --no-nextn.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("qwen3.5-0.8b-text", "qwen3.5-0.8b-vreorder", "qwen3.5-0.8b-shape")
       for t in OTHER_OUTTYPES]
    + [Run(f"qwen3.5-0.8b-no-mtp-{t}-no-nextn", "qwen3.5-0.8b-no-mtp", ("--outtype", t, "--no-nextn"))
       for t in ("f16", "q8_0")]
    # LFM2 (issue 36): every output type from BF16 and F32 weights.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("lfm2-350m-shape", "lfm2-350m-f32") for t in OTHER_OUTTYPES]
    # Qwen3.5-MoE (issue 36): every output type for the released layout (experts stacked, the wrapper) and
    # one matrix per expert (the text model); without the MTP weights, --no-nextn.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("qwen3.5-35b-a3b-shape", "qwen3.5-moe-text-experts") for t in OTHER_OUTTYPES]
    + [Run(f"qwen3.5-moe-no-mtp-{t}-no-nextn", "qwen3.5-moe-no-mtp", ("--outtype", t, "--no-nextn"))
       for t in ("f16", "q8_0")]
    # ... and the per-expert MTP layer left out with --no-nextn; an intermediate_size beside the experts
    # (feed_forward_length written), the stacked experts across shards.
    + [Run("qwen3.5-moe-text-experts-f16-no-nextn", "qwen3.5-moe-text-experts", ("--outtype", "f16", "--no-nextn"))]
    + [Run("qwen3.5-moe-text-ffn-q8_0", "qwen3.5-moe-text-ffn", ("--outtype", "q8_0"))]
    # Granite 4.0-H (issue 36): every output type from BF16 weights, dense and with routed experts.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("granite-4.0-h-micro-shape", "granite-4.0-h-tiny-shape") for t in OTHER_OUTTYPES]
    # ... and two Mamba2 groups with an untied head, in q8_0 too.
    + [Run("granite-4.0-h-micro-groups-q8_0", "granite-4.0-h-micro-groups", ("--outtype", "q8_0"))]
    # Phi-4-mini (issue 37): every output type from BF16 weights, with one KV head per head and with three
    # heads over one.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("phi-4-mini-shape", "phi-4-mini-gqa") for t in OTHER_OUTTYPES]
    # Split output (issue 39): shards by size in every output type (where a shard ends moves with the
    # tensors' sizes), by tensor count, the first shard left to the metadata; stacked experts, a generated
    # tensor first (Llama 3's rope_freqs) and a hybrid family.  Every shard is compared.
    + [Run(f"example-split-size-{t}", "example", ("--outtype", t, "--split-max-size", "10K"))
       for t in ("f32", "f16", "bf16", "q8_0", "auto")]
    + [Run("example-split-tensors-f16", "example", ("--outtype", "f16", "--split-max-tensors", "7")),
       Run("example-split-tensors-no-first-f16", "example",
           ("--outtype", "f16", "--split-max-tensors", "7", "--no-tensor-first-split")),
       Run("example-split-no-first-q8_0", "example", ("--outtype", "q8_0", "--no-tensor-first-split")),
       Run("mixtral-bf16-split-size-f16", "mixtral-bf16", ("--outtype", "f16", "--split-max-size", "40K")),
       Run("mixtral-bf16-split-tensors-q8_0", "mixtral-bf16", ("--outtype", "q8_0", "--split-max-tensors", "8")),
       Run("llama-3.2-1b-instruct-split-tensors-f16", "llama-3.2-1b-instruct",
           ("--outtype", "f16", "--split-max-tensors", "8")),
       Run("qwen3.5-0.8b-text-split-size-q8_0", "qwen3.5-0.8b-text", ("--outtype", "q8_0", "--split-max-size", "50K")),
       # ... and Qwen3-MoE's experts, Gemma 3's +1 norms, Phi-3's generated rope factors, Granite 4.0-H's mixer
       Run("qwen3-moe-bf16-split-size-f16", "qwen3-moe-bf16", ("--outtype", "f16", "--split-max-size", "20K")),
       Run("gemma-3-1b-shape-split-tensors-f16", "gemma-3-1b-shape",
           ("--outtype", "f16", "--split-max-tensors", "10", "--no-tensor-first-split")),
       Run("phi-3.5-mini-shape-split-size-bf16", "phi-3.5-mini-shape", ("--outtype", "bf16", "--split-max-size", "100K")),
       Run("granite-4.0-h-tiny-shape-split-tensors-q8_0", "granite-4.0-h-tiny-shape",
           ("--outtype", "q8_0", "--split-max-tensors", "20"))]
    # Qwen3.5 with its own tokenizer (fetched: oracle/fetch_qwen35_tokenizer.sh; each case's f16 run is
    # above, as the Hub ships it, as transformers 5.18 saves a fine-tune's, naming TokenizersBackend): the
    # wrapper in q8_0 too.
    + [Run("qwen3.5-0.8b-tokenizer-q8_0", "qwen3.5-0.8b-tokenizer", ("--outtype", "q8_0"))]
    # gpt-oss (issue 37): every output type from the released MXFP4 experts and from a fine-tune's BF16 ones;
    # the 120b's 128 experts in q8_0 too.
    + [Run(f"{case}-{t}", case, ("--outtype", t)) for case in ("gpt-oss-20b-mxfp4", "gpt-oss-20b-bf16")
       for t in OTHER_OUTTYPES]
    + [Run("gpt-oss-120b-mxfp4-q8_0", "gpt-oss-120b-mxfp4", ("--outtype", "q8_0"))]
    # Gemma 4 (issue 37): every output type for the E2B, E4B, 31B and 26B-A4B shapes and E2B's text model (F16, untied).
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("gemma-4-e2b-shape", "gemma-4-e4b-shape", "gemma-4-e2b-text-f16", "gemma-4-31b-shape",
                    "gemma-4-26b-a4b-shape")
       for t in OTHER_OUTTYPES]
    + [Run("gemma-4-e2b-per-layer-config-q8_0", "gemma-4-e2b-per-layer-config", ("--outtype", "q8_0"))]
    # ... and a tokenizer of Gemma 4's structure (GemmaTokenizer; built from Gemma 3's, fetched), in q8_0 too.
    + [Run("gemma-4-e2b-gemma4-tokenizer-q8_0", "gemma-4-e2b-gemma4-tokenizer", ("--outtype", "q8_0"))]
    # SmolVLM / SmolVLM2 (issue 38), the text model: every output type for SmolVLM-256M (Idefics3) and SmolVLM2;
    # SmolVLM-Instruct and the headless SmolVLM2-2.2B text_config in q8_0 too.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("smolvlm-256m-shape", "smolvlm2-256m-shape") for t in OTHER_OUTTYPES]
    + [Run(f"{case}-q8_0", case, ("--outtype", "q8_0")) for case in ("smolvlm-instruct-shape", "smolvlm2-no-heads")]
    # Vision projectors (issue 38, --mmproj): Gemma 3's SigLIP tower and projector in every output type llama.cpp
    # takes there (its text model is the case's f16 run above).
    + [Run(f"gemma-3-4b-vision-mmproj-{t}", "gemma-3-4b-vision", ("--mmproj", "--outtype", t))
       for t in ("f32", "f16", "bf16", "q8_0", "auto")]
    # ... with a pooling factor other than 4 (its key written), in q8_0 too
    + [Run(f"gemma-3-4b-vision-pool-2-mmproj-{t}", "gemma-3-4b-vision-pool-2", ("--mmproj", "--outtype", t))
       for t in ("f16", "q8_0")]
    # ... refused split: llama.cpp writes the shards, and its clip loader cannot load them (oracle.py load)
    + [Run("gemma-3-4b-vision-mmproj-split-tensors-q8_0", "gemma-3-4b-vision",
           ("--mmproj", "--outtype", "q8_0", "--split-max-tensors", "10"), refused=True)]
    # ... and refused where transformers 4.52 and later saved it: llama.cpp writes a projector with no tensors.
    + [Run("gemma-3-4b-vision-new-layout-mmproj-f16", "gemma-3-4b-vision-new-layout", ("--mmproj", "--outtype", "f16"),
           refused=True)]
    # Qwen3.5's projector (issue 38, --mmproj; llama.cpp's qwen3vl class): every output type for the dense
    # and the MoE model's vision tower, the processor's files as Qwen ships them and as transformers 5 saves them.
    + [Run(f"{case}-mmproj-{t}", case, ("--mmproj", "--outtype", t))
       for case in ("qwen3.5-0.8b-vision", "qwen3.5-35b-a3b-vision") for t in ("f32", "f16", "bf16", "q8_0", "auto")]
    # ... and from F16 weights, where auto takes F16 (the frames F16).
    + [Run(f"qwen3.5-0.8b-vision-f16-mmproj-{t}", "qwen3.5-0.8b-vision-f16", ("--mmproj", "--outtype", t))
       for t in ("f32", "f16", "bf16", "q8_0", "auto")]
    # Gemma 4's projector (issue 38, --mmproj): every output type for the 31B's vision tower (standardized, no
    # clipped linears) and E2B's without its audio tower (clipped linears), the 26B-A4B's in f16 and q8_0, the 31B's
    # from F32 weights in f16, q8_0 and auto; E2B's and E4B's with their audio tower, which llama.cpp writes through
    # torch's softplus, refused.
    + [Run(f"{case}-mmproj-{t}", case, ("--mmproj", "--outtype", t))
       for case in ("gemma-4-31b-towers", "gemma-4-e2b-vision-tower") for t in ("f16", *OTHER_OUTTYPES)]
    + [Run(f"gemma-4-26b-a4b-towers-mmproj-{t}", "gemma-4-26b-a4b-towers", ("--mmproj", "--outtype", t))
       for t in ("f16", "q8_0")]
    + [Run(f"gemma-4-31b-towers-f32-mmproj-{t}", "gemma-4-31b-towers-f32", ("--mmproj", "--outtype", t))
       for t in ("f16", "q8_0", "auto")]
    + [Run(f"{case}-mmproj-f16", case, ("--mmproj", "--outtype", "f16"), refused=True)
       for case in ("gemma-4-e2b-towers", "gemma-4-e4b-towers")]
    # SmolVLM's projector (issue 38, --mmproj: idefics3): every output type llama.cpp takes there for SmolVLM-256M and
    # SmolVLM2 (scale factor 4, SigLIP of patch 16 at 512), f16 and q8_0 for SmolVLM-Instruct (3, patch 14 at 384),
    # refused: its vocabulary has no <global-img>, on which llama.cpp's runtime aborts (llama.cpp issue 27190).
    + [Run(f"{case}-mmproj-{t}", case, ("--mmproj", "--outtype", t))
       for case in ("smolvlm-256m-shape", "smolvlm2-256m-shape") for t in ("f32", "f16", "bf16", "q8_0", "auto")]
    + [Run(f"smolvlm-instruct-shape-mmproj-{t}", "smolvlm-instruct-shape", ("--mmproj", "--outtype", t), refused=True)
       for t in ("f16", "q8_0")])
RUNS_BY_NAME = {r.name: r for r in RUNS}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def reference_dir() -> Path:
    p = subprocess.run(["bash", str(HERE / "setup_reference.sh")], capture_output=True, text=True)
    if p.returncode != 0:   # its own message says what is missing (a compiler, a registry), not a traceback
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit("oracle/setup_reference.sh failed")
    return Path(p.stdout.strip().splitlines()[-1])


def reference_python() -> Path:
    return Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref")) / "venv" / "bin" / "python"


def case_dir(run: Run) -> Path:
    case = make_models.CASES_BY_NAME[run.case]
    if run.adapter:
        return make_models.make_base_config_dir(case, WORK / "lora-bases" / case.name)
    d = WORK / "cases" / case.name / case.directory_name
    if not (d / "config.json").is_file():
        make_models.make_case(case, d.parent)
    return d


def adapter_dir(run: Run) -> Path:
    return make_models.LORA_FIXTURES / run.adapter


def reference_command(run: Run, model_dir: Path, out: Path) -> list[str]:
    ref = reference_dir()
    if run.adapter:
        return [str(reference_python()), str(ref / "convert_lora_to_gguf.py"), "--base", str(model_dir),
                str(adapter_dir(run)), "--outfile", str(out), *run.args]
    return [str(reference_python()), str(ref / "convert_hf_to_gguf.py"), str(model_dir),
            "--outfile", str(out), *run.args]


def run_reference(run: Run) -> tuple[Path, float]:
    model_dir = case_dir(run)
    out = WORK / "llama.cpp" / f"{run.name}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    clear_outputs(out)
    start = time.perf_counter()
    # The directory is passed relative to its parent, as a user would, so general.name comes
    # from the directory's own name in both converters.
    cmd = reference_command(run, Path(model_dir.name), out.resolve())
    p = subprocess.run(cmd, cwd=model_dir.parent, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"llama.cpp failed on {run.name}")
    return out, time.perf_counter() - start


def run_bankml(run: Run) -> tuple[subprocess.CompletedProcess, Path]:
    model_dir = case_dir(run)
    out = WORK / "bankml" / f"{run.name}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    clear_outputs(out)
    cmd = [sys.executable, str(ROOT / "bankml_convert.py"), model_dir.name, "-o", str(out.resolve()), *run.args]
    if run.adapter:
        cmd = [sys.executable, str(ROOT / "bankml_convert.py"), "lora", str(adapter_dir(run)),
               "--base", str(model_dir.resolve()), "-o", str(out.resolve()), *run.args]
    return subprocess.run(cmd, cwd=model_dir.parent, capture_output=True, text=True), out


def inputs_digest(model_dir: Path) -> str:
    """One sha256 over every file of a generated case (name and content), to catch generator drift."""
    h = hashlib.sha256()
    for f in sorted(model_dir.iterdir()):
        if f.is_file():
            h.update(f"{f.name}\0{sha256_of(f)}\n".encode())
    return h.hexdigest()


def run_inputs_digest(run: Run) -> str:
    """inputs_digest of the run's case; for a LoRA run, of its base directory and then its adapter's."""
    digest = inputs_digest(case_dir(run))
    return hashlib.sha256(f"{digest}\0{inputs_digest(adapter_dir(run))}".encode()).hexdigest() if run.adapter else digest


def load_golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {"runs": {}}


def record(runs: list[Run]) -> int:
    golden = load_golden()
    golden["reference"] = "llama.cpp convert_hf_to_gguf.py @ 0c1e57098 (llama-cpp-python 0.3.36 sdist)"
    # One line for every run (each run's own command is in its "command"): naming this call's runs made
    # every branch that recorded some conflict on it.
    golden["recorded_with"] = 'python3 oracle/oracle.py record RUN... (each run\'s own command is in its "command")'
    for run in runs:
        out, seconds = run_reference(run)
        files = written_files(out)
        entry = {"case": run.case, "dir": case_dir(run).name, "args": list(run.args),
                 "inputs_sha256": run_inputs_digest(run),
                 "sha256": sha256_of(files[0]), "bytes": files[0].stat().st_size,
                 "command": "convert_hf_to_gguf.py " + shlex.join([case_dir(run).name, "--outfile", "OUT", *run.args]),
                 "refused_by_bankml": run.refused}
        if run.adapter:
            entry["adapter"] = run.adapter
            entry["command"] = "convert_lora_to_gguf.py " + shlex.join(
                ["--base", case_dir(run).name, run.adapter, "--outfile", "OUT", *run.args])
        if run.split:
            # Every shard; sha256 and bytes above are the first's, the file llama.cpp loads the set from.
            entry["shards"] = shard_entries(files, out.stem)
        golden["runs"][run.name] = entry
        shards = f" ({len(files)} shards)" if run.split else ""
        print(f"{run.name:<26} {entry['sha256']}  {entry['bytes']:>12,} B  {seconds:5.1f} s{shards}")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    return 0


def recorded_case_dir(run: Run, recorded_inputs: str, digests: dict[str, str]) -> Path | None:
    """The run's case directory with the inputs the recording was made from: a case left in
    build/ by an older generator is made again; None if even a fresh one differs."""
    d = case_dir(run)
    for attempt in (1, 2):
        key = f"{run.case}+{run.adapter}"
        if key not in digests:
            digests[key] = run_inputs_digest(run)
        if digests[key] == recorded_inputs:
            return d
        if attempt == 1:
            shutil.rmtree(d.parent)
            del digests[key]
            d = case_dir(run)
    return None


def compare(runs: list[Run], use_recorded: bool) -> int:
    golden = load_golden()["runs"]
    failures = 0
    digests: dict[str, str] = {}
    for run in runs:
        if use_recorded and run.name in golden:
            ref_sha = golden[run.name]["sha256"]
            ref_shards = [(f["name"], f["sha256"]) for f in golden[run.name].get("shards", [])]
            ref_out = None
            if recorded_case_dir(run, golden[run.name]["inputs_sha256"], digests) is None:
                print(f"FAIL {run.name:<26} the generated inputs differ from the recorded ones "
                      f"(inputs_sha256): record it again or mend make_models.py")
                failures += 1
                continue
        else:
            ref_out, _ = run_reference(run)
            ref_files = written_files(ref_out)
            ref_sha = sha256_of(ref_files[0])
            ref_shards = [(f["name"], f["sha256"]) for f in shard_entries(ref_files, ref_out.stem)] if run.split else []
            ref_out = ref_files[0]
        p, out = run_bankml(run)
        if run.refused:
            ok = p.returncode == 2 and "refuse:" in p.stderr and not written_files(out)
            print(f"{'ok' if ok else 'FAIL':<4} {run.name:<26} refused: {p.stderr.strip()[:100]}")
            failures += not ok
            continue
        if p.returncode != 0:
            print(f"FAIL {run.name:<26} bankml exit {p.returncode}: {p.stderr.strip()[-300:]}")
            failures += 1
            continue
        if run.split:
            files = written_files(out)
            ours_shards = [(f["name"], f["sha256"]) for f in shard_entries(files, out.stem)]
            if ours_shards == ref_shards:
                print(f"ok   {run.name:<26} {ours_shards[0][1]} and {len(files) - 1} more shards")
                continue
            failures += 1
            print(f"FAIL {run.name:<26} llama.cpp {ref_shards}\n{'':<32}bankml    {ours_shards}")
            continue
        ours = sha256_of(out)
        if ours == ref_sha:
            print(f"ok   {run.name:<26} {ours}")
            continue
        failures += 1
        print(f"FAIL {run.name:<26} llama.cpp {ref_sha}\n{'':<32}bankml    {ours}")
        if ref_out is not None:
            print_diff(ref_out, out)
    print(f"oracle: {len(runs)} runs, {failures} mismatches")
    return 1 if failures else 0


def run_in_reference(command: str, rest: list[str]) -> int:
    """names_oracle.py or cards_oracle.py, in the reference venv with its gguf-py."""
    env = dict(os.environ, PYTHONPATH=str(reference_dir() / "gguf-py"))
    script = {"names": "names_oracle.py", "cards": "cards_oracle.py"}[command]
    return subprocess.run([str(reference_python()), str(HERE / script), *rest], env=env).returncode


def reference_chkhshs(dirs: list[Path]) -> dict[Path, dict]:
    """vocab_oracle.py --chkhsh over the directories in one reference process: path -> its answer."""
    env = dict(os.environ, PYTHONPATH=str(reference_dir() / "gguf-py"))
    p = subprocess.run([str(reference_python()), str(HERE / "vocab_oracle.py"), "--chkhsh", *map(str, dirs)],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit("vocab_oracle.py --chkhsh failed")
    answers = {}
    for line in p.stdout.splitlines():
        path, _, answer = line.partition(" {")
        answers[Path(path)] = json.loads("{" + answer)
    return answers


def bankml_chkhsh(d: Path) -> tuple[str, str]:
    """bankml's chkhsh and pre name for a tokenizer directory, or ("refused", the reason)."""
    import bankml_convert as bc

    def optional(name: str) -> dict:
        return json.loads((d / name).read_text(encoding="utf-8")) if (d / name).is_file() else {}
    tj = optional("tokenizer.json")
    try:
        h = bc.chkhsh(tj, optional("tokenizer_config.json"), optional("config.json"), bc.json_added_tokens(tj))
    except bc.Refusal as e:
        return "refused", str(e)
    return h, str(bc.llama_cpp_pre(h))


def chkhsh_table(dirs: list[str], save: bool) -> int:
    """llama.cpp's chkhsh and pre name beside bankml's for each directory (default: every case of
    vocab_oracle.CHKHSH_CASES, assembled from the fixtures); --record keeps the reference's answers
    for the cases in oracle/recorded/chkhsh.json, where the tests compare bankml's encoder with them."""
    import tempfile
    import vocab_oracle
    with tempfile.TemporaryDirectory() as t:
        cases: list[tuple[str, Path, list]] = []
        if dirs:
            cases = [(Path(d).name, Path(d).resolve(), []) for d in dirs]
        for name in () if dirs else vocab_oracle.CHKHSH_CASES:
            try:
                d, used = vocab_oracle.assemble(name, Path(t))
            except FileNotFoundError as e:
                print(f"skip {name}: {e} is in no fixture folder")
                continue
            cases.append((name, d.resolve(), used))
        answers = reference_chkhshs([d for _, d, _ in cases])
        differ = 0
        print(f"{'tokenizer':<58} {'llama.cpp chkhsh':<16} {'pre':<10} bankml")
        for name, d, used in cases:
            ref = answers[d]
            ours, our_pre = bankml_chkhsh(d)
            ref_hash, ref_pre = ref.get("chkhsh", "error"), str(ref.get("pre", ref.get("error")))
            if ours == "refused":
                verdict = f"refused: {our_pre[:150]}"
            else:
                same = (ours, our_pre) == (ref_hash, ref_pre)
                differ += not same
                verdict = "same chkhsh and pre" if same else f"DIFFERENT: {ours} {our_pre}"
            print(f"{name:<58} {ref_hash[:16]:<16} {ref_pre:<10} {verdict}")
            if save and used:
                record_chkhsh(name, used, ref)
    print(f"chkhsh: {len(cases)} tokenizers, {differ} computed differently from llama.cpp's")
    return 1 if differ else 0


def reference_pre_table() -> list[list[str]]:
    """[chkhsh, pre] of every `if chkhsh == ...: res = ...` in the reference's get_vocab_base_pre, in
    source order, read from its source (never run): what bankml's LLAMA_CPP_PRE_TABLE must copy."""
    import ast
    source = (reference_dir() / "conversion" / "base.py").read_text(encoding="utf-8")
    function = next(n for n in ast.walk(ast.parse(source))
                    if isinstance(n, ast.FunctionDef) and n.name == "get_vocab_base_pre")
    rows = []
    for node in function.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "chkhsh"):
            rows.append([node.test.comparators[0].value, node.body[-1].value.value])
    return rows


def record_chkhsh(name: str, used: list, answer: dict) -> None:
    import vocab_oracle
    path = vocab_oracle.CHKHSH_RECORDED
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    recorded.update(command="python3 oracle/oracle.py chkhsh --record",
                    reference="llama.cpp 0c1e57098 (llama-cpp-python 0.3.36 sdist), transformers 5.18.0",
                    pre_table=reference_pre_table())
    recorded.setdefault("cases", {})[name] = {
        "files": [u[1:] for u in used],
        "files_read_from": sorted({u[0] for u in used}),
        "edit": vocab_oracle.CHKHSH_CASES[name].edit,
        **answer,
    }
    if "ids" in answer:  # as the text get_vocab_base_pre hashes: str() of the list, on one line
        recorded["cases"][name]["ids"] = str(answer["ids"])
    recorded["cases"] = dict(sorted(recorded["cases"].items()))
    path.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def inspect_against_gguf_py(runs: list[Run]) -> int:
    """bankml's own output of each run, read by bankml's inspect and by gguf-py's GGUFReader."""
    outs = []
    for run in runs:
        p, out = run_bankml(run)
        if p.returncode != 0:
            raise SystemExit(f"bankml failed on {run.name}: {p.stderr.strip()}")
        outs.append(str(out))
    env = dict(os.environ, PYTHONPATH=str(reference_dir() / "gguf-py"))
    return subprocess.run([str(reference_python()), str(HERE / "inspect_oracle.py"), *outs], env=env).returncode


def print_diff(a: Path, b: Path) -> None:
    try:
        import bankml_convert
        lines = bankml_convert.diff_gguf(a, b)
    except AttributeError:
        sys.path.insert(0, str(ROOT / "parts"))
        import gguf_read
        lines = gguf_read.diff_gguf(a, b)
    for line in lines[:40]:
        print("     " + line)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("record", "compare", "names", "cards", "chkhsh", "inspect", "load", "list"))
    p.add_argument("runs", nargs="*", help="run names (default: all but the full-size one; 'all' for every "
                   "run); directories for chkhsh")
    p.add_argument("--recorded", action="store_true",
                   help="compare against oracle/recorded/golden.json instead of running llama.cpp")
    p.add_argument("--record", action="store_true",
                   help="chkhsh: save the reference's answers to oracle/recorded/chkhsh.json; "
                   "cards: PyYAML's to oracle/recorded/cards.json")
    if argv[:1] == ["cards"]:       # its own options (--random, --mutants, ...) go to cards_oracle.py
        return run_in_reference("cards", argv[1:])
    if argv[:1] == ["load"]:        # and load's (--tokens, --timeout, --keep) to runtime_oracle.py
        import runtime_oracle
        return runtime_oracle.main(argv[1:])
    args = p.parse_intermixed_args(argv)
    if args.command == "chkhsh":
        return chkhsh_table(args.runs, args.record)
    if args.command == "names":
        return run_in_reference(args.command, args.runs)
    if args.command == "inspect":
        return inspect_against_gguf_py([RUNS_BY_NAME[n] for n in args.runs or ["full-135m-instruct"]])
    if args.command == "list":
        for r in RUNS:
            print(f"{r.name:<26} case={r.case:<26} {' '.join(r.args)}{'  (refused)' if r.refused else ''}")
        return 0
    if args.runs == ["all"]:
        runs = list(RUNS)
    elif args.runs:
        unknown = [n for n in args.runs if n not in RUNS_BY_NAME]
        if unknown:
            p.error(f"unknown runs: {', '.join(unknown)}")
        runs = [RUNS_BY_NAME[n] for n in args.runs]
    else:
        runs = [r for r in RUNS if not make_models.CASES_BY_NAME[r.case].full_size]
    return record(runs) if args.command == "record" else compare(runs, args.recorded)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
