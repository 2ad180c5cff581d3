#!/usr/bin/env python3
"""Make the LoRA adapter fixtures (make_models.ADAPTERS) as PEFT's save_pretrained writes them.

    oracle/.ref/venv/bin/python oracle/make_adapters.py [NAME ...]    # -> oracle/fixtures/lora/NAME/

Runs in the reference venv with peft 0.21.2 (`oracle/.ref/venv/bin/pip install peft==0.21.2`).  The
base model is built from the case's config.json with random weights (an adapter holds none of them);
the LoRA weights are drawn from a seeded generator, B included, so that every row of lora_B differs
(PEFT's default B of zeros would hide a wrong Q/K permutation).  The files are committed: the tests and
the oracle's `lora` runs read them, and torch.save's .bin is not reproducible (a random serialization id).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_models  # noqa: E402

# What PEFT records as base_model_name_or_path (and its card as base_model) for each base case.
HUB_IDS = {
    "bf16": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "llama-3.2-1b-instruct": "meta-llama/Llama-3.2-1B-Instruct",
    "qwen2.5-0.5b-bf16": "Qwen/Qwen2.5-0.5B-Instruct",
    "gemma-3-1b-shape": "google/gemma-3-1b-it",
    "phi-4-mini-gqa": "microsoft/Phi-4-mini-instruct",
    "qwen3.5-0.8b-vreorder": "Qwen/Qwen3.5-0.8B",
    "qwen3.5-0.8b-shape": "Qwen/Qwen3.5-0.8B",
    "qwen3.5-0.8b-untied": "Qwen/Qwen3.5-9B",
    "qwen3.5-moe-text-experts": "Qwen/Qwen3.5-35B-A3B",
    "gemma-4-e2b-shape": "google/gemma-4-E2B-it",
}


def make_adapter(adapter: make_models.Adapter, root: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    case = make_models.CASES_BY_NAME[adapter.base]
    with tempfile.TemporaryDirectory() as t:
        base_dir = make_models.make_base_config_dir(case, Path(t))
        config = AutoConfig.from_pretrained(base_dir)
    torch.manual_seed(adapter.seed)
    dtype = getattr(torch, adapter.dtype)
    # A multimodal wrapper's config (Qwen3.5's) makes the wrapper, whose text model PEFT names
    # model.language_model.layers.N, as a fine-tune of the released checkpoint has it.
    auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    model = auto.from_config(config, dtype=dtype)
    model.name_or_path = HUB_IDS[adapter.base]
    model.config._name_or_path = HUB_IDS[adapter.base]
    lora = LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, target_modules=adapter.target_regex or list(adapter.targets),
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      alora_invocation_tokens=list(adapter.alora_tokens) or None)
    model = get_peft_model(model, lora, autocast_adapter_dtype=adapter.dtype == "float32")
    g = torch.Generator().manual_seed(adapter.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_((torch.randn(p.shape, generator=g) * 0.05).to(p.dtype))
    out = root / adapter.name
    if out.exists():
        shutil.rmtree(out)
    # save_embedding_layers=False: PEFT otherwise saves the whole embedding beside an embed_tokens LoRA,
    # which llama.cpp refuses ("Embeddings is present in the adapter").
    model.save_pretrained(out, safe_serialization=adapter.weights == "safetensors", save_embedding_layers=False)
    if not adapter.card:
        (out / "README.md").unlink()
    if adapter.norms:
        add_mergekit_norms(out / "adapter_model.safetensors", model, g)
    if adapter.mtp:
        add_mtp_pairs(out / "adapter_model.safetensors", config, adapter.r, g)
    return out


def add_mergekit_norms(path: Path, model, g) -> None:
    """The layer norms mergekit-extract-lora saves beside the pairs (convert_lora_to_gguf.py keeps
    names with _layernorm or .norm as plain tensors), under PEFT's prefix."""
    import torch
    from safetensors.torch import load_file, save_file
    tensors = load_file(path)
    for name, p in model.named_parameters():
        if "lora_" not in name and (name.endswith("_layernorm.weight") or name.endswith(".norm.weight")):
            tensors[name.replace(".base_layer", "")] = (torch.randn(p.shape, generator=g) * 0.05 + 1).to(torch.float32)
    save_file(tensors, path, metadata={"format": "pt"})


def add_mtp_pairs(path: Path, config, r: int, g) -> None:
    """Pairs on Qwen3.5's MTP layer (mtp.fc, its q_proj and up_proj) under PEFT's prefix, as a trainer
    that keeps the layer saves them (transformers' Qwen3_5ForCausalLM drops it, so PEFT alone cannot)."""
    import torch
    from safetensors.torch import load_file, save_file
    text = config.get_text_config()
    h, heads, head_dim = text.hidden_size, text.num_attention_heads, text.head_dim
    shapes = {"mtp.fc": (h, 2 * h), "mtp.layers.0.self_attn.q_proj": (2 * heads * head_dim, h),
              "mtp.layers.0.mlp.up_proj": (text.intermediate_size, h)}
    tensors = load_file(path)
    for module, (rows, cols) in shapes.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn((r, cols), generator=g) * 0.05
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn((rows, r), generator=g) * 0.05
    save_file(tensors, path, metadata={"format": "pt"})


def main(argv: list[str]) -> int:
    names = argv or [a.name for a in make_models.ADAPTERS]
    for name in names:
        out = make_adapter(make_models.ADAPTERS_BY_NAME[name], make_models.LORA_FIXTURES)
        files = sorted(p.name for p in out.iterdir())
        size = sum(p.stat().st_size for p in out.iterdir())
        print(f"{name:<36} {size:>9,} B  {', '.join(files)}")
        json.loads((out / "adapter_config.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
