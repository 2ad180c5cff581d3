#!/usr/bin/env python3
"""A LoRA adapter as bankml_convert writes it runs as PEFT's merge of it: llama.cpp's runtime samples
the same text from the base with the adapter (`llama-completion --lora`) as from the model PEFT merged.

    python3 oracle/lora_merge_oracle.py RUN...      # LoRA runs (oracle.py list), e.g. lora-qwen3.5-0.8b-lora-r8-f32

`oracle.py load` shows that an adapter loads and a forward pass runs; this shows it does what PEFT
does.  For each run: PEFT (in the reference venv) loads the run's base case with its random weights in
float32, applies the adapter and merges it (merge_and_unload, save_pretrained); llama.cpp's converter
writes the base and the merged model in f32 (--no-mtp where the config declares an MTP layer:
transformers' save drops it, and the main pass never runs it); bankml_convert writes the adapter in the run's output type.  Then
llama-completion samples 32 tokens at temperature 1 with one seed from the merged model and from the
base with the adapter: every logit takes part in each draw, so a wrongly ordered pair (a V head or a Q/K
row in the wrong place) changes the text within a few tokens, while equal sums in another order do not.
The base alone is sampled too, to show the adapter changes the text at all.  Not in CI; in the oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import oracle
import make_models
import runtime_oracle

MERGE = r"""
import shutil, sys, torch
from pathlib import Path
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
base, adapter, out = map(Path, sys.argv[1:])
auto = AutoModelForImageTextToText if hasattr(AutoConfig.from_pretrained(base), "vision_config") else AutoModelForCausalLM
# ignore_mismatched_sizes: a wrapper case's vision tower is generated in no real shape; llama.cpp drops it.
model = PeftModel.from_pretrained(auto.from_pretrained(base, dtype=torch.float32, ignore_mismatched_sizes=True),
                                  adapter).merge_and_unload()
model.save_pretrained(out)
for f in base.iterdir():
    if f.name.startswith("tokenizer") or f.name == "generation_config.json":
        shutil.copy(f, out / f.name)
"""


def sample(model: Path, adapter: Path | None) -> str:
    cmd = [str(runtime_oracle.runtime_bin("llama-completion")), "-m", str(model), "-p", runtime_oracle.PROMPT,
           "-n", "32", "-c", "64", "-t", "2", "--temp", "1.0", "--top-k", "0", "--top-p", "1.0", "--min-p", "0",
           "-s", "42", "-no-cnv", "--no-warmup"] + (["--lora", str(adapter)] if adapter else [])
    p = subprocess.run(["nice", "-n", "10", *cmd], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       errors="replace", timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"llama-completion failed: {runtime_oracle.error_line(p.stderr, p.stdout, p.returncode)}")
    return p.stdout


def reference_f32(model_dir: Path, out: Path, no_mtp: bool) -> Path:
    cmd = [str(oracle.reference_python()), str(oracle.reference_dir() / "convert_hf_to_gguf.py"), str(model_dir),
           "--outfile", str(out), "--outtype", "f32"] + (["--no-mtp"] if no_mtp else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-2000:])
        raise SystemExit(f"llama.cpp's converter failed on {model_dir}")
    return out


def check(run: oracle.Run) -> bool:
    work = oracle.WORK / "lora-merge" / run.name
    work.mkdir(parents=True, exist_ok=True)
    base_dir = oracle.case_dir(oracle.RUNS_BY_NAME[run.case])     # the base case with its weights
    merged_dir = work / "merged"
    p = subprocess.run([str(oracle.reference_python()), "-c", MERGE, str(base_dir), str(oracle.adapter_dir(run)),
                        str(merged_dir)], capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-2000:])
        raise SystemExit(f"PEFT's merge failed on {run.name}")
    config = json.loads((base_dir / "config.json").read_text(encoding="utf-8"))
    no_mtp = "mtp_num_hidden_layers" in {**config, **config.get("text_config", {})}   # llama.cpp's flag elsewhere stops
    base = reference_f32(base_dir, work / "base-f32.gguf", no_mtp)
    merged = reference_f32(merged_dir, work / "merged-f32.gguf", no_mtp)
    made, adapter = oracle.run_bankml(run)
    if made.returncode != 0:
        raise SystemExit(f"bankml refused {run.name}: {made.stderr.strip()}")
    with_adapter, from_merged, alone = sample(base, adapter), sample(merged, None), sample(base, None)
    same, changed = with_adapter == from_merged, alone != from_merged
    print(f"{'ok' if same and changed else 'FAIL':<4} {run.name:<40} base+adapter {'=' if same else '!='} merged"
          f"{'' if changed else ' (but the merge samples what the base does: nothing shown)'}")
    if not same:
        print(f"     base+adapter: {with_adapter[-120:]!r}\n     merged:       {from_merged[-120:]!r}")
    return same and changed


def main(argv: list[str]) -> int:
    runs = [oracle.RUNS_BY_NAME[n] for n in argv]
    bad = [r.name for r in runs if not r.adapter or r.refused]
    if not runs or bad:
        raise SystemExit(f"usage: lora_merge_oracle.py LORA_RUN...  (not LoRA runs bankml converts: {bad})")
    failed = sum(not check(r) for r in runs)
    print(f"lora-merge: {len(runs)} runs, {failed} not as PEFT's merge")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main(sys.argv[1:]))
