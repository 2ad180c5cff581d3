"""gguf-py's model-naming heuristics against ours, id by id.

Run in the reference venv with the reference's gguf-py on the path:

    REF=/work/main/oracle/.ref/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=$REF/gguf-py /work/main/oracle/.ref/venv/bin/python /work/main/oracle/names_oracle.py [--record]

For every id in oracle/names_ids.txt it asks gguf-py for ``Metadata.id_to_title``,
``Metadata.get_model_id_components`` (at several parameter totals) and the general.* naming keys a
conversion would write, and compares them with ours. "Ours" is ``bankml_convert`` from the
repository root.
Prints every disagreement and ``names: N ids, D disagreements``; exits 1 if D > 0.
``--record`` also writes oracle/recorded/names.json (gguf-py's answers only) for test_bankml_convert.py.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf.gguf_writer import GGUFWriter

HERE = Path(__file__).resolve().parent
MAIN = HERE.parent
IDS_FILE = HERE / "names_ids.txt"
RECORD_FILE = HERE / "recorded" / "names.json"

# Totals at which components are compared: unknown (0), SmolLM2-135M, TinyLlama-1.1B, and a
# SmolLM2-sized LoRA adapter (gguf-py signals adapters with a negative total).
COMPONENT_TOTALS = (0, 134_515_008, 1_100_048_384, -134_515_008)
# The count the key scenarios use: SmolLM2-135M's, no experts (measured below, see param_count).
KEY_COUNTS = (134_515_008, 134_515_008, 0, 0)
# Directories a config.json with _name_or_path = X sits in: one that contributes only a name and
# one that contributes every component, to show which source wins.
CONFIG_DIRS = ("merged", "smollm2-135m-instruct")
MODEL_NAME = "mindx gen39 persona"


# ---------------------------------------------------------------------------------------------
# Inputs: the ids file and the module under test.
# ---------------------------------------------------------------------------------------------

def read_ids(path: Path) -> list[str]:
    ids = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("# ") or line == "":
            continue
        ids.append(json.loads(line) if line.startswith('"') else line)
    return ids


def our_module():
    """bankml_convert itself, from the repository root."""
    sys.path.insert(0, str(MAIN))
    try:
        return importlib.import_module("bankml_convert")
    finally:
        sys.path.remove(str(MAIN))


# ---------------------------------------------------------------------------------------------
# gguf-py's answers, obtained the way conversion/base.py's prepare_metadata obtains them.
# ---------------------------------------------------------------------------------------------

def written_naming_keys(dir_model: Path, model_name: str | None, counts: tuple[int, int, int, int]) -> list[list]:
    # base.py: Metadata.load(override=None, dir_model, model_name, total), the dir-name fallback,
    # the size label from the counts, then set_gguf_meta_model into the writer's kv_data.
    total, shared, expert, n_expert = counts
    metadata = gguf.Metadata.load(None, dir_model, model_name, total)
    if metadata.name is None:
        metadata.name = dir_model.name
    if metadata.size_label is None and total > 0:
        metadata.size_label = gguf.size_label(total, shared, expert, n_expert)
    writer = GGUFWriter(path=None, arch="llama")
    before = set(writer.kv_data[0])
    metadata.set_gguf_meta_model(writer)
    return [[k, v.value, v.type.name] for k, v in writer.kv_data[0].items() if k not in before]


def reference_entry(model_id: str, sandbox: Path) -> dict:
    entry = {
        "id": model_id,
        "title": gguf.Metadata.id_to_title(model_id),
        "components": {str(t): list(gguf.Metadata.get_model_id_components(model_id, t)) for t in COMPONENT_TOTALS},
    }
    # The CLI argument is X; base.py uses Path(X) unresolved. A relative X is created (no config.json,
    # no README.md) under the sandbox, which is the working directory.
    dir_arg = Path(model_id)
    if not dir_arg.is_absolute():
        os.makedirs(sandbox / "dirs" / model_id, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(sandbox / "dirs")
    try:
        entry["dir_name"] = dir_arg.name
        entry["keys_dir"] = written_naming_keys(dir_arg, None, KEY_COUNTS)
        entry["keys_dir_model_name"] = written_naming_keys(dir_arg, MODEL_NAME, KEY_COUNTS)
    finally:
        os.chdir(cwd)
    entry["keys_config"] = {}
    for d in CONFIG_DIRS:
        config_dir = sandbox / "configs" / d
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "config.json").write_text(json.dumps({"_name_or_path": model_id}), encoding="utf-8")
        entry["keys_config"][d] = written_naming_keys(config_dir, None, KEY_COUNTS)
    return entry


def size_label_cases() -> list[tuple[int, int, int, int]]:
    # Boundaries of each scale and of rounding, the real models, MoE shapes, and a seeded spread.
    fixed = [0, 1, 499, 500, 999, 1000, 1001, 9_995, 99_950, 999_499, 999_500, 999_999, 1_000_000, 1_000_001,
             1_004_999, 1_005_000, 9_950_000, 9_949_999, 99_500_000, 99_499_999, 134_515_008, 135_000_000,
             361_821_120, 999_500_000, 1_000_000_000, 1_000_000_001, 1_100_048_384, 1_235_814_400,
             1_500_000_000, 6_738_415_616, 7_241_732_096, 9_995_000_000, 70_553_706_496, 999_999_999_999,
             1_000_000_000_000, 1_000_000_000_001, 1_500_000_000_000, 123_456_789_012_345]
    cases = [(n, n, 0, 0) for n in fixed]
    cases += [(-n, n, 0, 0) for n in (134_515_008, 4_194_304, 1_000)]
    cases += [(46_702_792_704, 1_604_923_392, 5_637_144_576, 8), (2_000, 1_000, 500, 2),
              (30_532_122_624, 1_100_000_000, 100_000_000, 128), (10, -5, -5, 1)]
    rng = random.Random(20261201)
    for _ in range(400):
        n = int(10 ** rng.uniform(2, 13.5))
        cases.append((n, n, 0, 0))
    return cases


def param_count(config_path: Path) -> list[int]:
    # What GGUFWriter.get_total_parameter_count gives for a tied-embedding Llama (no output.weight),
    # from the shapes llama.cpp would add (F16 matrices, F32 vectors).
    c = json.loads(config_path.read_text(encoding="utf-8"))
    h, f, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim", h // c["num_attention_heads"])
    kv = c["num_key_value_heads"] * hd
    w = GGUFWriter(path=None, arch="llama")
    shapes = {"token_embd.weight": (c["vocab_size"], h), "output_norm.weight": (h,)}
    for b in range(n):
        shapes.update({f"blk.{b}.attn_norm.weight": (h,), f"blk.{b}.ffn_norm.weight": (h,),
                       f"blk.{b}.attn_q.weight": (h, h), f"blk.{b}.attn_k.weight": (kv, h),
                       f"blk.{b}.attn_v.weight": (kv, h), f"blk.{b}.attn_output.weight": (h, h),
                       f"blk.{b}.ffn_gate.weight": (f, h), f"blk.{b}.ffn_up.weight": (f, h),
                       f"blk.{b}.ffn_down.weight": (h, f)})
    for name, shape in shapes.items():
        dt = np.float32 if len(shape) == 1 else np.float16
        w.add_tensor_info(name, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    return list(w.get_total_parameter_count())


# ---------------------------------------------------------------------------------------------
# Comparison.
# ---------------------------------------------------------------------------------------------

def our_keys(ours, name_or_path, dir_name, model_name) -> list[list]:
    return [[k, v, "STRING"] for k, v in ours.naming_kvs(name_or_path, dir_name, model_name, *KEY_COUNTS)]


def disagreements(ours, ref: dict) -> list[str]:
    x = ref["id"]
    out = []

    def check(what, got, want):
        if got != want:
            out.append(f"{x!r} {what}: ours {got!r} gguf-py {want!r}")

    check("id_to_title", ours.id_to_title(x), ref["title"])
    for t, want in ref["components"].items():
        check(f"components@{t}", list(ours.model_id_components(x, int(t))), want)
    check("keys dir", our_keys(ours, None, ref["dir_name"], None), ref["keys_dir"])
    check("keys dir+model_name", our_keys(ours, None, ref["dir_name"], MODEL_NAME), ref["keys_dir_model_name"])
    for d, want in ref["keys_config"].items():
        check(f"keys _name_or_path in {d}", our_keys(ours, x, d, None), want)
    return out


def one_entry_per_line(record: dict) -> str:
    # Lists of entries get one line per entry, so a change in gguf-py's answers diffs by id.
    def dump(v):
        return json.dumps(v, ensure_ascii=False)
    lines = ["{"]
    for i, (k, v) in enumerate(record.items()):
        comma = "," if i < len(record) - 1 else ""
        if k in ("ids", "size_labels"):
            lines.append(f" {dump(k)}: [")
            lines += [f"  {dump(e)}" + ("," if j < len(v) - 1 else "") for j, e in enumerate(v)]
            lines.append(f" ]{comma}")
        else:
            lines.append(f" {dump(k)}: {dump(v)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", action="store_true", help="write oracle/recorded/names.json")
    args = ap.parse_args()

    ours = our_module()
    print(f"ours: {ours.__file__}")
    ids = read_ids(IDS_FILE)
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp) / "a" / "b"
        (sandbox / "dirs").mkdir(parents=True)
        entries = [reference_entry(x, sandbox) for x in ids]

    problems = [p for e in entries for p in disagreements(ours, e)]
    sizes = [list(c) + [gguf.size_label(*c)] for c in size_label_cases()]
    for *c, want in sizes:
        got = ours.size_label(*c)
        if got != want:
            problems.append(f"size_label{tuple(c)}: ours {got!r} gguf-py {want!r}")
    counts = param_count(Path("/work/shared/fixtures/SmolLM2-135M-Instruct/config.json"))
    if tuple(counts) != KEY_COUNTS:
        problems.append(f"SmolLM2-135M parameter count {counts} is not the {KEY_COUNTS} the key scenarios assume")

    for p in problems:
        print(p)
    print(f"names: {len(ids)} ids, {len(sizes)} size labels, {len(problems)} disagreements")

    if args.record:
        RECORD_FILE.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "command": "PYTHONPATH=$REF/gguf-py /work/main/oracle/.ref/venv/bin/python oracle/names_oracle.py --record"
                       "  (REF=oracle/.ref/llama_cpp_python-0.3.36/vendor/llama.cpp, llama.cpp 0c1e57098)",
            "python": sys.version.split()[0],
            "what": {
                "title": "Metadata.id_to_title(id)",
                "components": "Metadata.get_model_id_components(id, total) for each total",
                "dir_name": "Path(id).name, the directory name when the CLI argument is id",
                "keys_dir": "general.* keys written for directory id (no config.json, no README.md), counts below",
                "keys_dir_model_name": "the same with --model-name model_name",
                "keys_config": "keys for a directory <name> whose config.json has _name_or_path = id",
                "size_labels": "[total, shared, expert, expert_count, gguf.size_label(...)]",
            },
            "key_counts": list(KEY_COUNTS),
            "model_name": MODEL_NAME,
            "smollm2_135m_param_count": counts,
            "ids": entries,
            "size_labels": sizes,
        }
        RECORD_FILE.write_text(one_entry_per_line(record), encoding="utf-8")
        print(f"recorded {RECORD_FILE}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
