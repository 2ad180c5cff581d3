#!/usr/bin/env python3
"""The specification of bankml_convert, as tests.  Run: python3 test_bankml_convert.py (make test).

Every expected sha256 and every value that stands for llama.cpp's behaviour is read from
oracle/recorded/*.json, which the oracle commands wrote by running the reference (each file names
the command that produced it); nothing here needs more than the standard library.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent
ORACLE = ROOT / "oracle"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ORACLE))

import bankml_convert as bc  # noqa: E402
import make_models  # noqa: E402

GOLDEN = json.loads((ORACLE / "recorded" / "golden.json").read_text(encoding="utf-8"))["runs"]
TOOL = [sys.executable, str(ROOT / "bankml_convert.py")]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def inputs_digest(model_dir: Path) -> str:
    """The same digest oracle.py records for a generated case: every file's name and sha256."""
    h = hashlib.sha256()
    for f in sorted(model_dir.iterdir()):
        if f.is_file():
            h.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


class Workspace(unittest.TestCase):
    """A temporary folder per test class, with generated model directories made on demand."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="bankml-test-")
        cls.tmp = Path(cls._tmp.name)
        cls._cases: dict[str, Path] = {}

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @classmethod
    def case(cls, name: str) -> Path:
        """A fresh, unmodified copy of a generated case's directory."""
        if name not in cls._cases:
            cls._cases[name] = make_models.make_case(make_models.CASES_BY_NAME[name], cls.tmp / "pristine" / name)
        src = cls._cases[name]
        return Path(shutil.copytree(src, Path(tempfile.mkdtemp(dir=cls.tmp)) / src.name))

    def run_tool(self, *args, cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run([*TOOL, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)

    def assertRefuses(self, model_dir: Path, fragment: str, *extra):
        """The CLI exits 2 with one 'refuse:' line naming the reason, and leaves nothing behind."""
        out = self.tmp / "refused.gguf"
        before = sorted(p.name for p in self.tmp.iterdir())
        p = self.run_tool(model_dir, "-o", out, *extra)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("bankml convert: refuse: ", p.stderr)
        self.assertIn(fragment, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(p.stdout, "")
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), before)
        return p.stderr


# ---------------------------------------------------------------------------------------------
# Golden files: the sha256 llama.cpp wrote for each generated case, from oracle/recorded/golden.json.
# ---------------------------------------------------------------------------------------------

class OutputIsLlamaCppsBytes(Workspace):
    """For every recorded oracle run, bankml_convert writes llama.cpp's exact file."""

    def check_run(self, run_name: str):
        run = GOLDEN[run_name]
        model_dir = self.case(run["case"])
        self.assertEqual(inputs_digest(model_dir), run["inputs_sha256"],
                         "the generator no longer makes the inputs the oracle recorded; "
                         "re-run `python3 oracle/oracle.py record`")
        args = run["args"]
        options = bc.Options(outtype=args[args.index("--outtype") + 1] if "--outtype" in args else "f16",
                             model_name=args[args.index("--model-name") + 1] if "--model-name" in args else None)
        out = self.tmp / f"{run_name}.gguf"
        if run["refused_by_bankml"]:
            with self.assertRaises(bc.Refusal):
                bc.convert(model_dir, out, options)
            self.assertFalse(out.exists())
            return
        report = bc.convert(model_dir, out, options)
        try:
            self.assertEqual(report.sha256, run["sha256"])
            self.assertEqual(sha256_file(out), run["sha256"])
            self.assertEqual(report.bytes, run["bytes"])
        finally:
            out.unlink()


def _add_golden_tests():
    for name in GOLDEN:
        def test(self, name=name):
            self.check_run(name)
        test.__doc__ = f"oracle run {name!r}: {GOLDEN[name]['command']}"
        setattr(OutputIsLlamaCppsBytes, f"test_{name.replace('-', '_')}_is_llama_cpps_file", test)


_add_golden_tests()


class ExampleModel(Workspace):
    def test_bundled_example_is_the_generated_example_case(self):
        shipped = ROOT / "example" / "smollm2-tiny"
        self.assertEqual(inputs_digest(shipped), GOLDEN["example"]["inputs_sha256"])

    def test_readme_command_prints_llama_cpps_sha256(self):
        out = self.tmp / "smollm2-tiny-F16.gguf"
        p = self.run_tool(ROOT / "example" / "smollm2-tiny", "-o", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, f"{GOLDEN['example']['sha256']}  {out}\n")
        self.assertIn("smollm2-tiny", (ROOT / "README.md").read_text(encoding="utf-8"))
        self.assertIn(GOLDEN["example"]["sha256"], (ROOT / "README.md").read_text(encoding="utf-8"))



# ---------------------------------------------------------------------------------------------
# Refusals: each names its reason, exits 2 and leaves nothing behind.
# ---------------------------------------------------------------------------------------------

def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8")


def patch_bytes(path: Path, old: bytes, new: bytes) -> None:
    """Replace bytes of the same length, so a safetensors header keeps its size."""
    assert len(old) == len(new)
    data = path.read_bytes()
    assert data.count(old) >= 1, old
    path.write_bytes(data.replace(old, new, 1))


class RefusesWhatItWouldNotReproduce(Workspace):
    def config_edit(self, change, fragment):
        d = self.case("bf16")
        edit_json(d / "config.json", change)
        return self.assertRefuses(d, fragment)

    def test_other_architectures_are_refused(self):
        self.config_edit(lambda c: c.update(architectures=["MistralForCausalLM"]), "not LlamaForCausalLM")

    def test_text_config_is_refused(self):
        self.config_edit(lambda c: c.update(text_config={"hidden_size": 64}), "text_config")

    def test_quantization_config_is_refused(self):
        self.config_edit(lambda c: c.update(quantization_config={"quant_method": "gptq"}), "quantization_config")

    def test_mixture_of_experts_is_refused(self):
        self.config_edit(lambda c: c.update(num_local_experts=8), "num_local_experts")

    def test_eagle3_draft_is_refused(self):
        self.config_edit(lambda c: c.update(draft_vocab_size=32000), "draft_vocab_size")

    def test_non_causal_is_refused(self):
        self.config_edit(lambda c: c.update(is_causal=False), "is_causal")

    def test_rope_scaling_is_refused(self):
        self.config_edit(lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope scaling")

    def test_attention_bias_is_refused(self):
        self.config_edit(lambda c: c.update(attention_bias=True), "attention_bias")

    def test_mlp_bias_is_refused(self):
        self.config_edit(lambda c: c.update(mlp_bias=True), "mlp_bias")

    def test_hidden_size_not_divisible_by_heads_is_refused(self):
        self.config_edit(lambda c: c.update(num_attention_heads=5), "not a multiple")

    def test_absurd_sizes_are_refused(self):
        self.config_edit(lambda c: c.update(num_hidden_layers=-1), "num_hidden_layers")

    def test_shapes_that_disagree_with_the_config_are_refused(self):
        self.config_edit(lambda c: c.update(intermediate_size=256), "implies")

    def test_model_card_is_refused_without_ignore_flag(self):
        d = self.case("bf16")
        (d / "README.md").write_text("---\nlicense: apache-2.0\n---\n# A model\n", encoding="utf-8")
        self.assertRefuses(d, "--ignore-model-card")

    def test_model_card_is_converted_with_ignore_flag(self):
        d = self.case("bf16")
        (d / "README.md").write_text("---\nlicense: apache-2.0\n---\n# A model\n", encoding="utf-8")
        out = self.tmp / "card.gguf"
        p = self.run_tool(d, "-o", out, "--ignore-model-card")
        self.assertEqual(p.returncode, 0, p.stderr)
        out.unlink()

    def test_readme_without_front_matter_changes_nothing(self):
        # llama.cpp reads a model card only from YAML front matter; plain prose adds no key.
        d = self.case("bf16")
        (d / "README.md").write_text("# A model\nTrained on things.\n", encoding="utf-8")
        r = bc.convert(d, self.tmp / "prose.gguf")
        self.assertEqual(r.sha256, GOLDEN["bf16"]["sha256"])
        r.out.unlink()

    def test_sentencepiece_tokenizer_is_refused(self):
        self.assertRefuses(self.case("sentencepiece-tinyllama"), "SentencePiece")

    def test_non_bpe_tokenizer_is_refused(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer.json", lambda t: t["model"].update(type="WordPiece"))
        self.assertRefuses(d, "not BPE")

    def test_normalizer_is_refused(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer.json", lambda t: t.update(normalizer={"type": "NFC"}))
        self.assertRefuses(d, "normalizer")

    def test_unknown_tokenizer_is_refused_with_the_hash_to_add(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer.json", lambda t: t["model"].update(merges=t["model"]["merges"][:-1]))
        err = self.assertRefuses(d, "unknown tokenizer")
        self.assertIn("vocab_merges_sha256=", err)
        self.assertIn("--chkhsh", err)

    def test_non_special_added_tokens_are_refused(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"][3].update(special=False))
        edit_json(d / "tokenizer_config.json", lambda t: t["added_tokens_decoder"]["3"].update(special=False))
        self.assertRefuses(d, "non-special added token")

    def test_named_chat_template_lists_are_refused(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer_config.json",
                  lambda t: t.update(chat_template=[{"name": "default", "template": "x"}]))
        self.assertRefuses(d, "list of chat templates")

    def test_other_tensor_dtypes_are_refused(self):
        d = self.case("f32")
        patch_bytes(d / "model.safetensors", b'"dtype":"F32"', b'"dtype":"I32"')
        self.assertRefuses(d, "'I32'")

    def test_tensors_it_cannot_map_are_refused(self):
        d = self.case("bf16")
        patch_bytes(d / "model.safetensors", b"model.norm.weight", b"model.nurm.weight")
        self.assertRefuses(d, "'model.nurm.weight'")

    def test_output_types_not_reproduced_are_refused(self):
        self.assertRefuses(self.case("bf16"), "--outtype q8_0", "--outtype", "q8_0")

    def test_unknown_output_types_are_refused(self):
        self.assertRefuses(self.case("bf16"), "unknown", "--outtype", "q4_k")

    def test_a_file_instead_of_a_directory_is_refused(self):
        self.assertRefuses(self.case("bf16") / "config.json", "not a directory")

    def test_missing_config_is_refused(self):
        d = self.case("bf16")
        (d / "config.json").unlink()
        self.assertRefuses(d, "no config.json")

    def test_invalid_json_names_the_file_and_position(self):
        d = self.case("bf16")
        (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n  oops}', encoding="utf-8")
        self.assertRefuses(d, "config.json is not valid JSON")

    def test_no_safetensors_is_refused(self):
        d = self.case("bf16")
        (d / "model.safetensors").rename(d / "pytorch_model.bin")
        self.assertRefuses(d, "safetensors")

    def test_missing_shard_is_refused(self):
        d = self.case("sharded-3")
        (d / "model-00002-of-00003.safetensors").unlink()
        self.assertRefuses(d, "missing")

    def test_truncated_safetensors_is_refused(self):
        d = self.case("bf16")
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[:-100])
        self.assertRefuses(d, "truncated")

    def test_output_into_a_missing_directory_is_refused(self):
        d = self.case("bf16")
        p = self.run_tool(d, "-o", self.tmp / "no" / "such" / "dir" / "x.gguf")
        self.assertEqual(p.returncode, 2)
        self.assertIn("does not exist", p.stderr)

    def test_output_onto_an_input_is_refused(self):
        d = self.case("bf16")
        before = sha256_file(d / "model.safetensors")
        p = self.run_tool(d, "-o", d / "model.safetensors")
        self.assertEqual(p.returncode, 2)
        self.assertIn("is one of the inputs", p.stderr)
        self.assertEqual(sha256_file(d / "model.safetensors"), before)


# ---------------------------------------------------------------------------------------------
# The command line and the pin.
# ---------------------------------------------------------------------------------------------

class CommandLine(Workspace):
    def test_success_prints_sha256_and_path_on_stdout_and_a_summary_on_stderr(self):
        d = self.case("bf16")
        out = self.tmp / "cli.gguf"
        p = self.run_tool(d, "-o", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, f"{GOLDEN['bf16']['sha256']}  {out}\n")
        for word in ("'Bf16'", "20 tensors", "30 metadata keys", "parameters", "bytes"):
            self.assertIn(word, p.stderr)
        out.unlink()

    def test_fork_pins_output_and_every_input(self):
        d = self.case("bf16")
        out, fork = self.tmp / "pinned.gguf", self.tmp / "pinned.gguf.FORK.json"
        p = self.run_tool(d, "-o", out, "--fork", fork, "--source", "hub:HuggingFaceTB/SmolLM2-135M-Instruct")
        self.assertEqual(p.returncode, 0, p.stderr)
        pin = json.loads(fork.read_text(encoding="utf-8"))
        self.assertEqual(pin["output"], {"name": "pinned.gguf", "bytes": out.stat().st_size,
                                         "sha256": GOLDEN["bf16"]["sha256"]})
        self.assertEqual(pin["source"], "hub:HuggingFaceTB/SmolLM2-135M-Instruct")
        pinned = {i["name"]: i for i in pin["inputs"]}
        for f in d.iterdir():
            self.assertEqual(pinned[f.name]["sha256"], sha256_file(f), f.name)
            self.assertEqual(pinned[f.name]["bytes"], f.stat().st_size)
        out.unlink()
        fork.unlink()

    def test_fork_source_defaults_to_the_canonical_directory(self):
        d = self.case("bf16")
        out, fork = self.tmp / "src.gguf", self.tmp / "src.FORK.json"
        self.assertEqual(self.run_tool(d, "-o", out, "--fork", fork).returncode, 0)
        self.assertEqual(json.loads(fork.read_text())["source"], str(d.resolve()))
        out.unlink()
        fork.unlink()

    def test_ftype_template_in_the_output_name_is_filled(self):
        d = self.case("bf16")
        p = self.run_tool(d, "-o", self.tmp / "model-{ftype}.gguf")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue((self.tmp / "model-f16.gguf").is_file())
        (self.tmp / "model-f16.gguf").unlink()

    def test_existing_output_is_replaced_only_when_complete(self):
        d = self.case("bf16")
        out = self.tmp / "existing.gguf"
        out.write_bytes(b"old")
        edit_json(d / "config.json", lambda c: c.update(mlp_bias=True))
        self.assertEqual(self.run_tool(d, "-o", out).returncode, 2)
        self.assertEqual(out.read_bytes(), b"old")
        edit_json(d / "config.json", lambda c: c.update(mlp_bias=False))
        self.assertEqual(self.run_tool(d, "-o", out).returncode, 0)
        self.assertEqual(sha256_file(out), GOLDEN["bf16"]["sha256"])
        out.unlink()

    def test_a_leftover_part_file_blocks_a_second_writer(self):
        d = self.case("bf16")
        out = self.tmp / "busy.gguf"
        part = self.tmp / "busy.gguf.part"
        part.write_bytes(b"someone else's")
        p = self.run_tool(d, "-o", out)
        self.assertEqual(p.returncode, 2)
        self.assertIn("another conversion", p.stderr)
        self.assertEqual(part.read_bytes(), b"someone else's")
        self.assertFalse(out.exists())
        part.unlink()

    def test_import_has_no_side_effects(self):
        code = ("import os, signal, sys; before = set(sys.modules); handlers = signal.getsignal(signal.SIGINT), "
                "signal.getsignal(signal.SIGTERM); files = sorted(os.listdir('.')); import bankml_convert; "
                "new = {m.split('.')[0] for m in set(sys.modules) - before} - {'bankml_convert'}; "
                "assert new <= set(sys.stdlib_module_names), new; "
                "assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers; "
                "assert sorted(os.listdir('.')) == files; print('ok')")
        p = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, cwd=ROOT)
        self.assertEqual((p.stdout, p.stderr), ("ok\n", ""))

    def test_only_the_standard_library_is_imported(self):
        import ast
        tree = ast.parse((ROOT / "bankml_convert.py").read_text(encoding="utf-8"))
        modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        self.assertEqual(modules - set(sys.stdlib_module_names) - {"__future__"}, set())


# ---------------------------------------------------------------------------------------------
# Rules, one at a time.
# ---------------------------------------------------------------------------------------------

class Rules(unittest.TestCase):
    def test_permutation_zips_the_two_halves_of_each_head(self):
        # llama.cpp: w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(w.shape)
        # puts input row (h, i, j) at output row (h, j, i).
        self.assertEqual(bc.permuted_rows(8, 2), [0, 2, 1, 3, 4, 6, 5, 7])
        self.assertEqual(bc.permuted_rows(6, 1), [0, 3, 1, 4, 2, 5])

    def test_a_key_set_twice_keeps_its_first_position_and_the_last_value(self):
        kv = bc.KvList()
        kv.bool("a", True)
        kv.uint32("b", 1)
        kv.bool("a", False)
        self.assertEqual([(k.key, k.value) for k in kv.items()], [("a", False), ("b", 1)])

    def test_empty_strings_and_arrays_are_not_written(self):
        kv = bc.KvList()
        kv.string("s", "")
        kv.array("a", bc.GGUF_STRING, [])
        self.assertEqual(len(kv), 0)

    def test_norms_and_vectors_stay_f32_matrices_take_the_output_type(self):
        f16 = bc.OUT_TYPES["f16"]
        self.assertEqual(bc.tensor_type("blk.0.attn_norm.weight", 1, f16), bc.GGML_F32)
        self.assertEqual(bc.tensor_type("output_norm.weight", 1, f16), bc.GGML_F32)
        self.assertEqual(bc.tensor_type("blk.0.attn_q.weight", 2, f16), bc.GGML_F16)

    def test_hf_names_map_to_gguf_names_below_the_block_count(self):
        self.assertEqual(bc.gguf_tensor_name("model.layers.1.mlp.down_proj.weight", 2), "blk.1.ffn_down.weight")
        self.assertEqual(bc.gguf_tensor_name("lm_head.weight", 2), "output.weight")
        self.assertIsNone(bc.gguf_tensor_name("model.layers.2.mlp.down_proj.weight", 2))
        self.assertIsNone(bc.gguf_tensor_name("model.layers.01.mlp.down_proj.weight", 2))

    def test_missing_config_values_take_llama_config_defaults(self):
        config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
                  "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 49152}
        p = bc.llama_params(config)
        self.assertEqual((p.head_count_kv, p.head_dim, p.rms_norm_eps, p.rope_freq_base, p.context_length),
                         (4, 16, 1e-6, 10000.0, 2048))

    def test_invalid_generation_config_is_ignored_as_gguf_py_does(self):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "generation_config.json").write_text("{not json", encoding="utf-8")
            self.assertEqual(bc.load_generation_config(Path(d)), {})

    def test_sampling_keys_follow_gguf_py_order_and_types(self):
        kvs = bc.sampling_kvs({"temperature": 0.6, "top_k": 50, "repetition_penalty": 1.1, "top_p": 0.9})
        self.assertEqual([(k.key, k.vtype) for k in kvs], [
            ("general.sampling.top_k", bc.GGUF_INT32), ("general.sampling.top_p", bc.GGUF_FLOAT32),
            ("general.sampling.temp", bc.GGUF_FLOAT32), ("general.sampling.penalty_repeat", bc.GGUF_FLOAT32)])

    def test_sampling_values_llama_cpp_cannot_write_are_refused(self):
        with self.assertRaises(bc.Refusal):
            bc.sampling_kvs({"top_k": "fifty"})


class SafetensorsHeaders(unittest.TestCase):
    def write(self, header: bytes, data: bytes = b"") -> Path:
        d = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, d)
        path = d / "model.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + data)
        return path

    def test_tensors_are_read_with_absolute_offsets(self):
        header = json.dumps({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
                             "__metadata__": {"format": "pt"}}).encode()
        (t,) = bc.read_safetensors_header(self.write(header, b"\0" * 4))
        self.assertEqual((t.name, t.dtype, t.shape, t.start, t.nbytes), ("a", "F16", (2,), 8 + len(header), 4))

    def test_a_file_shorter_than_eight_bytes_is_refused(self):
        d = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, d)
        (d / "m.safetensors").write_bytes(b"\1\2")
        with self.assertRaisesRegex(bc.Refusal, "too short"):
            bc.read_safetensors_header(d / "m.safetensors")

    def test_a_header_longer_than_the_file_is_refused(self):
        path = self.write(b"{}")
        path.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
        with self.assertRaisesRegex(bc.Refusal, "does not fit"):
            bc.read_safetensors_header(path)

    def test_duplicate_keys_are_refused(self):
        header = (b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},'
                  b'"a":{"dtype":"F16","shape":[1],"data_offsets":[2,4]}}')
        with self.assertRaisesRegex(bc.Refusal, "twice"):
            bc.read_safetensors_header(self.write(header, b"\0" * 4))

    def test_shape_and_byte_length_must_agree(self):
        header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}'
        with self.assertRaisesRegex(bc.Refusal, "bytes of data"):
            bc.read_safetensors_header(self.write(header, b"\0" * 4))

    def test_overlapping_tensors_are_refused(self):
        header = (b'{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},'
                  b'"b":{"dtype":"F16","shape":[2],"data_offsets":[2,6]}}')
        with self.assertRaisesRegex(bc.Refusal, "overlaps"):
            bc.read_safetensors_header(self.write(header, b"\0" * 6))

    def test_gaps_and_trailing_bytes_are_refused(self):
        header = b'{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}'
        with self.assertRaisesRegex(bc.Refusal, "after the last tensor"):
            bc.read_safetensors_header(self.write(header, b"\0" * 6))

    def test_zero_element_tensors_are_read(self):
        header = b'{"a":{"dtype":"F16","shape":[0,4],"data_offsets":[0,0]}}'
        (t,) = bc.read_safetensors_header(self.write(header))
        self.assertEqual(t.nbytes, 0)

def main() -> int:
    """Run these tests and the oracle tooling's own (oracle/test_*.py); end on a plain count line."""
    loader = unittest.TestLoader()
    suite = unittest.TestSuite([loader.loadTestsFromModule(sys.modules[__name__]),
                                loader.discover(str(ORACLE), pattern="test_*.py", top_level_dir=str(ORACLE))])
    result = unittest.TextTestRunner(verbosity=1 if "-q" in sys.argv else 2).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed, {len(result.skipped)} skipped")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
