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


class ParallelAndSequentialWriting(Workspace):
    def test_one_process_and_forked_workers_write_the_same_file(self):
        d = self.case("sharded-3")
        for workers in (1, 2, 3):
            with self.subTest(workers=workers):
                r = bc.convert(d, self.tmp / f"w{workers}.gguf", bc.Options(workers=workers))
                self.assertEqual(r.sha256, GOLDEN["sharded-3"]["sha256"])
                self.assertEqual(sha256_file(r.out), GOLDEN["sharded-3"]["sha256"])
                r.out.unlink()

    def test_a_source_that_shrinks_mid_conversion_leaves_nothing(self):
        for workers in (1, 2):
            with self.subTest(workers=workers):
                d = self.case("bf16")
                plan = bc.plan_conversion(d, bc.Options())
                with open(d / "model.safetensors", "r+b") as f:
                    f.truncate(f.seek(0, 2) // 2)
                out = self.tmp / f"shrunk{workers}.gguf"
                with self.assertRaisesRegex(bc.Refusal, "changed while"):
                    bc.write_gguf(out, plan, workers)
                self.assertEqual([p.name for p in self.tmp.glob("shrunk*")], [])

    def test_jobs_cover_every_tensor_byte_once_in_file_order(self):
        d = self.case("shape-360m-instruct")
        plan = bc.plan_conversion(d, bc.Options())
        jobs = bc.data_jobs(plan.tensors, len(plan.header))
        position = len(plan.header)
        for job in jobs:
            self.assertEqual(job.out_pos, position)
            position += job.out_len + job.pad_after
        for t in plan.tensors:
            self.assertEqual(sum(j.rows for j in jobs if j.tensor is t), bc._row_count(t.source))
        self.assertEqual(position, GOLDEN["shape-360m-instruct"]["bytes"])


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

    def test_a_pin_that_cannot_be_written_refuses_before_converting(self):
        d = self.case("bf16")
        out = self.tmp / "unpinned.gguf"
        p = self.run_tool(d, "-o", out, "--fork", self.tmp / "missing" / "x.FORK.json")
        self.assertEqual(p.returncode, 2)
        self.assertIn("does not exist", p.stderr)
        self.assertFalse(out.exists())

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

# ---------------------------------------------------------------------------------------------
# Naming: gguf-py's heuristics, against its answers recorded by oracle/names_oracle.py --record.
# ---------------------------------------------------------------------------------------------

NAMES_RECORD = json.loads((ORACLE / "recorded" / "names.json").read_text(encoding="utf-8"))
BY_ID = {e["id"]: e for e in NAMES_RECORD["ids"]}
NAME_COUNTS = tuple(NAMES_RECORD["key_counts"])
MODEL_NAME = NAMES_RECORD["model_name"]



def components(model_id: str, total: int) -> list:
    return list(bc.model_id_components(model_id, total))


def keys(name_or_path, dir_name, model_name=None) -> list:
    return [[k, v, "STRING"] for k, v in bc.naming_kvs(name_or_path, dir_name, model_name, *NAME_COUNTS)]


def dir_keys(model_id: str) -> list:
    return keys(None, BY_ID[model_id]["dir_name"])


def config_keys(model_id: str, dir_name: str) -> list:
    return keys(model_id, dir_name)


class EveryRecordedAnswer(unittest.TestCase):
    def test_titles_match(self):
        for e in NAMES_RECORD["ids"]:
            with self.subTest(id=e["id"]):
                self.assertEqual(bc.id_to_title(e["id"]), e["title"])

    def test_components_match_at_every_total(self):
        for e in NAMES_RECORD["ids"]:
            for total, want in e["components"].items():
                with self.subTest(id=e["id"], total=total):
                    self.assertEqual(components(e["id"], int(total)), want)

    def test_directory_keys_match(self):
        for e in NAMES_RECORD["ids"]:
            with self.subTest(id=e["id"]):
                self.assertEqual(keys(None, e["dir_name"]), e["keys_dir"])

    def test_directory_keys_with_model_name_match(self):
        for e in NAMES_RECORD["ids"]:
            with self.subTest(id=e["id"]):
                self.assertEqual(keys(None, e["dir_name"], MODEL_NAME), e["keys_dir_model_name"])

    def test_name_or_path_keys_match(self):
        for e in NAMES_RECORD["ids"]:
            for d, want in e["keys_config"].items():
                with self.subTest(id=e["id"], dir=d):
                    self.assertEqual(config_keys(e["id"], d), want)

    def test_size_labels_match(self):
        for *counts, want in NAMES_RECORD["size_labels"]:
            with self.subTest(counts=counts):
                self.assertEqual(bc.size_label(*counts), want)


class DirectoryName(unittest.TestCase):
    def test_merged_is_named_from_the_directory_and_sized_from_the_count(self):
        self.assertEqual(dir_keys("merged"), BY_ID["merged"]["keys_dir"])

    def test_lowercase_directory_gives_title_name_and_raw_components(self):
        self.assertEqual(dir_keys("smollm2-135m-instruct"), BY_ID["smollm2-135m-instruct"]["keys_dir"])

    def test_lone_basename_is_too_ambiguous_to_write(self):
        self.assertEqual(dir_keys("mindx-gen39"), BY_ID["mindx-gen39"]["keys_dir"])

    def test_path_argument_uses_its_last_component(self):
        self.assertEqual(dir_keys("./out/merged"), BY_ID["./out/merged"]["keys_dir"])

    def test_empty_directory_name_writes_no_general_name(self):
        self.assertEqual(dir_keys("."), BY_ID["."]["keys_dir"])

    def test_model_name_replaces_only_general_name(self):
        e = BY_ID["smollm2-135m-instruct"]
        self.assertEqual(keys(None, e["dir_name"], MODEL_NAME), e["keys_dir_model_name"])


class NameOrPath(unittest.TestCase):
    def test_name_or_path_wins_over_the_directory(self):
        x = "HuggingFaceTB/SmolLM2-135M-Instruct"
        self.assertEqual(config_keys(x, "smollm2-135m-instruct"), BY_ID[x]["keys_config"]["smollm2-135m-instruct"])

    def test_directory_fills_what_name_or_path_lacks(self):
        self.assertEqual(config_keys("merged", "smollm2-135m-instruct"),
                         BY_ID["merged"]["keys_config"]["smollm2-135m-instruct"])

    def test_name_or_path_with_two_slashes_is_ignored(self):
        self.assertEqual(config_keys("./out/merged", "merged"), BY_ID["./out/merged"]["keys_config"]["merged"])

    def test_empty_organization_is_not_written(self):
        self.assertEqual(config_keys("/a", "merged"), BY_ID["/a"]["keys_config"]["merged"])

    def test_organization_is_titled(self):
        x = "mistralai/Mistral-7B-Instruct-v0.2"
        self.assertEqual(config_keys(x, "merged"), BY_ID[x]["keys_config"]["merged"])


class Components(unittest.TestCase):
    def assertComponents(self, model_id: str, total: int):
        self.assertEqual(components(model_id, total), BY_ID[model_id]["components"][str(total)])

    def test_dot_prefixed_organization_is_a_path(self):
        self.assertComponents("./merged", 134_515_008)

    def test_trailing_version_leaves_the_basename(self):
        self.assertComponents("mistralai/Mistral-7B-Instruct-v0.2", 134_515_008)

    def test_moe_size_label_is_kept_as_written(self):
        self.assertComponents("mistralai/Mixtral-8x7B-Instruct-v0.1", 134_515_008)

    def test_bloom_digit_after_the_suffix_is_a_decimal(self):
        self.assertComponents("bigscience/bloom-7b1", 0)

    def test_lowercase_size_suffix_is_uppercased(self):
        self.assertComponents("llama-2-7b", 0)

    def test_underscore_in_a_size_is_a_decimal_point(self):
        self.assertComponents("stabilityai/stablelm-2-1_6b", 0)

    def test_size_far_from_the_count_is_a_context_length(self):
        self.assertComponents("someone/model-8k", 134_515_008)

    def test_size_is_kept_when_the_count_is_unknown(self):
        self.assertComponents("someone/model-8k", 0)

    def test_lora_adapter_accepts_a_larger_size_label(self):
        self.assertComponents("someone/model-100T", -134_515_008)

    def test_lora_word_is_dropped_for_a_lora_adapter(self):
        self.assertComponents("someone/my-model-lora", -134_515_008)

    def test_lora_word_is_a_finetune_for_a_model(self):
        self.assertComponents("someone/my-model-lora", 134_515_008)

    def test_quant_type_is_uppercased_and_dropped(self):
        self.assertComponents("someone/qwen2.5-7b-instruct-q4_k_m", 0)

    def test_word_size_is_dropped_beside_a_numeric_size(self):
        self.assertComponents("someone/model-small-7b", 0)

    def test_repeated_size_label_is_written_once(self):
        self.assertComponents("someone/model-135M-135M", 0)

    def test_size_as_first_part_is_not_a_size_label(self):
        self.assertComponents("someone/7b-model", 0)

    def test_id_with_a_space_is_used_whole(self):
        self.assertComponents("Human Readable Name", 134_515_008)

    def test_ignorecase_matches_unicode_case_variants(self):
        self.assertComponents("model-in\u017ftruct", 0)

    def test_kelvin_sign_is_a_thousands_suffix_only_when_lowercased(self):
        self.assertComponents("SmolLM-135\u212a", 134_515_008)

    def test_unicode_digits_count_as_sizes(self):
        self.assertComponents("model-\u0667B", 0)


class Titles(unittest.TestCase):
    def assertTitle(self, model_id: str):
        self.assertEqual(bc.id_to_title(model_id), BY_ID[model_id]["title"])

    def test_versions_and_numbers_keep_their_case(self):
        self.assertTitle("mistral-7b-instruct-v0.2")

    def test_mixed_case_words_are_left_alone(self):
        self.assertTitle("SmolLM2-135M-Instruct")

    def test_title_uses_python_unicode_rules(self):
        self.assertTitle("straße-7b")

    def test_titlecase_letters_are_not_lowercase(self):
        self.assertTitle("ǅemal-chat")

    def test_surrounding_blanks_are_stripped(self):
        self.assertTitle("  padded-name-7b  ")


class SizeLabel(unittest.TestCase):
    def assertSizeLabel(self, *counts):
        want = {tuple(r[:4]): r[4] for r in NAMES_RECORD["size_labels"]}[counts]
        self.assertEqual(bc.size_label(*counts), want)

    def test_smollm2_135m(self):
        self.assertSizeLabel(134_515_008, 134_515_008, 0, 0)

    def test_exactly_a_million_stays_in_thousands(self):
        self.assertSizeLabel(1_000_000, 1_000_000, 0, 0)

    def test_rounding_up_adds_no_decimal(self):
        self.assertSizeLabel(999_500, 999_500, 0, 0)

    def test_zero_gets_two_decimals(self):
        self.assertSizeLabel(0, 0, 0, 0)

    def test_experts_give_count_times_shared_plus_one_expert(self):
        self.assertSizeLabel(46_702_792_704, 1_604_923_392, 5_637_144_576, 8)

    def test_negative_total_uses_its_magnitude(self):
        self.assertSizeLabel(-134_515_008, 134_515_008, 0, 0)


class Record(unittest.TestCase):
    def test_key_counts_are_smollm2_135m_as_the_reference_counts_it(self):
        self.assertEqual(NAMES_RECORD["smollm2_135m_param_count"], NAMES_RECORD["key_counts"])

    def test_every_written_key_is_a_gguf_string(self):
        types = {t for e in NAMES_RECORD["ids"] for _, _, t in e["keys_dir"]}
        self.assertEqual(types, {"STRING"})


# ---------------------------------------------------------------------------------------------
# Vocabulary: llama.cpp's tokenizer.* keys, against its output recorded by oracle/vocab_oracle.py.
# ---------------------------------------------------------------------------------------------

import vocab_oracle  # noqa: E402  (its case definitions; standard library only at import)

VOCAB_RECORD = json.loads((ORACLE / "recorded" / "vocab.json").read_text(encoding="utf-8"))
INSTRUCT = "SmolLM2-135M-Instruct"
RESAVED = "SmolLM2-135M-Instruct-resaved-transformers-5"


def vocab_type_tag(kv) -> str:
    """The type tag vocab_oracle.py records for a key: str, u32, bool, arr_str or arr_i32."""
    if kv.array:
        return {bc.GGUF_STRING: "arr_str", bc.GGUF_INT32: "arr_i32"}[kv.vtype]
    return {bc.GGUF_STRING: "str", bc.GGUF_UINT32: "u32", bc.GGUF_BOOL: "bool"}[kv.vtype]


def value_sha256(value: object) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


class VocabCaseDirs(unittest.TestCase):
    """Builds each oracle case's directory in a temporary folder."""

    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="test_vocab_"))
        self.addCleanup(shutil.rmtree, self.tmp)

    def case_dir(self, name: str) -> Path:
        d, used = vocab_oracle.assemble(name, self.tmp, roots=[ORACLE / "fixtures"])
        recorded = [f[:3] for f in VOCAB_RECORD["cases"][name]["files"]]
        self.assertEqual([u[1:] for u in used], recorded, f"{name}: fixture files changed since recording")
        return d

    def config(self, d: Path) -> dict:
        return json.loads((d / "config.json").read_text(encoding="utf-8")) if (d / "config.json").is_file() else {}

    def vocab(self, d: Path):
        config = self.config(d)
        return bc.bpe_vocab(d, config, bc.llama_params(config).vocab_size if config else 32000)

    def our_kvs(self, d: Path) -> list[tuple[str, str, str]]:
        v = self.vocab(d)
        return [(kv.key, vocab_type_tag(kv), value_sha256(kv.value)) for kv in bc.vocab_kvs(v)]

    def assert_keys_as_llama_cpp(self, name: str) -> None:
        expected = [(e["key"], e["type"], e["sha256"]) for e in VOCAB_RECORD["cases"][name]["kvs"]]
        self.assertEqual(self.our_kvs(self.case_dir(name)), expected)

    def edited(self, name: str, edit) -> Path:
        d = self.case_dir(name)
        edit(d)
        return d

    def assert_refused(self, d: Path, *words: str) -> str:
        with self.assertRaises(bc.Refusal) as cm:
            self.vocab(d)
        for w in words:
            self.assertIn(w, str(cm.exception))
        return str(cm.exception)


class VocabKeysAsLlamaCpp(VocabCaseDirs):
    def test_smollm2_135m_instruct(self):
        self.assert_keys_as_llama_cpp("SmolLM2-135M-Instruct")

    def test_smollm2_135m_base_without_template_or_pad(self):
        self.assert_keys_as_llama_cpp("SmolLM2-135M")

    def test_smollm2_360m_instruct(self):
        self.assert_keys_as_llama_cpp("SmolLM2-360M-Instruct")

    def test_smollm2_360m_base(self):
        self.assert_keys_as_llama_cpp("SmolLM2-360M")

    def test_smollm_v1_135m(self):
        self.assert_keys_as_llama_cpp("SmolLM-135M")

    def test_transformers_5_resaved_shape(self):
        self.assert_keys_as_llama_cpp(RESAVED)

    def test_add_token_flags_follow_ids_and_llama_overwrites_add_bos_in_place(self):
        self.assert_keys_as_llama_cpp(INSTRUCT + "+add_bos_eos_token")

    def test_padded_vocab_size_adds_pad_tokens_and_no_add_bos(self):
        self.assert_keys_as_llama_cpp(INSTRUCT + "+vocab_size_49280")

    def test_chat_template_json_is_read_without_jinja(self):
        self.assert_keys_as_llama_cpp(RESAVED + "+chat_template_json")


class PreTokenizerIdentification(VocabCaseDirs):
    def test_every_recorded_bpe_case_matches_a_known_tokenizer_with_the_measured_chkhsh(self):
        checked = 0
        for name, case in VOCAB_RECORD["cases"].items():
            if "chkhsh" not in case:
                continue
            with self.subTest(name):
                d = self.case_dir(name)
                tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
                tc = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
                words = bc.base_vocab(tj)
                added = bc.added_vocab(tj, tc, words, None)
                key = (bc.vocab_merges_sha256(words, bc.merges_as_written(tj)),
                       bc.tokenizer_shape(tj, tc, added))
                known = [k for k in bc.KNOWN_TOKENIZERS if (k.vocab_merges_sha256, k.shape) == key]
                self.assertEqual(len(known), 1)
                self.assertEqual((known[0].pre, known[0].chkhsh), (case["chkhsh"]["pre"], case["chkhsh"]["chkhsh"]))
                checked += 1
        self.assertGreater(checked, 0)

    def test_both_smollm_shapes_are_known(self):
        shapes = {k.shape.pre_tokenizer for k in bc.KNOWN_TOKENIZERS if k.pre == "smollm"}
        self.assertEqual(len(shapes), 2)
        self.assertTrue(any(s.startswith("Sequence[Digits") for s in shapes))
        self.assertTrue(any(s.startswith("ByteLevel(") for s in shapes))

    def test_vocab_merges_sha256_is_tokens_blank_line_merges(self):
        expected = hashlib.sha256("a\nĠb\n\na Ġb\n".encode("utf-8")).hexdigest()
        self.assertEqual(bc.vocab_merges_sha256(["a", "Ġb"], ["a Ġb"]), expected)

    def test_pair_merges_are_joined_with_spaces_inside_parts_as_u0120(self):
        tj = {"model": {"merges": [["a", "b c"], ["Ġ", "t"]]}}
        self.assertEqual(bc.merges_as_written(tj), ["a bĠc", "Ġ t"])


class VocabRefusals(VocabCaseDirs):
    def test_sentencepiece_is_refused_where_llama_cpp_writes_model_llama(self):
        name = "TinyLlama-1.1B-Chat-v1.0"
        models = [e["value"] for e in VOCAB_RECORD["cases"][name]["kvs"] if e["key"] == "tokenizer.ggml.model"]
        self.assertEqual(models, ["llama"])
        self.assert_refused(self.case_dir(name), "SentencePiece")

    def test_byte_fallback_bpe_without_tokenizer_model_is_refused_where_llama_cpp_writes_model_llama(self):
        name = "TinyLlama-1.1B-Chat-v1.0-without-tokenizer.model"
        models = [e["value"] for e in VOCAB_RECORD["cases"][name]["kvs"] if e["key"] == "tokenizer.ggml.model"]
        self.assertEqual(models, ["llama"])
        self.assert_refused(self.case_dir(name), "LlamaHfVocab")

    def test_missing_tokenizer_json_is_refused(self):
        d = self.case_dir(INSTRUCT)
        (d / "tokenizer.json").unlink()
        self.assert_refused(d, "tokenizer.json")

    def test_non_bpe_model_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer.json", lambda t: t["model"].update(type="WordPiece"))
        self.assert_refused(d, "WordPiece")

    def test_unknown_vocabulary_is_refused_with_its_sha256_and_how_to_measure(self):
        d = self.case_dir(INSTRUCT)

        def swap_two_tokens(t):
            v = t["model"]["vocab"]
            v["Ġthe"], v["Ġa"] = v["Ġa"], v["Ġthe"]
        edit_json(d / "tokenizer.json", swap_two_tokens)
        message = self.assert_refused(d, "unknown tokenizer", "vocab_merges_sha256=", "vocab_oracle.py --chkhsh")
        self.assertNotIn(bc.KNOWN_TOKENIZERS[0].vocab_merges_sha256, message)

    def test_other_tokenizer_class_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
        self.assert_refused(d, "PreTrainedTokenizerFast")

    def test_normalizer_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer.json", lambda t: t.update(normalizer={"type": "Lowercase"}))
        self.assert_refused(d, "normalizer")

    def test_post_processor_adding_bos_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer.json", lambda t: t.update(post_processor={
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}))
        self.assert_refused(d, "post_processor")

    def test_non_special_added_token_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"][5].update(special=False))
        edit_json(d / "tokenizer_config.json", lambda c: c["added_tokens_decoder"]["5"].update(special=False))
        self.assert_refused(d, "non-special added token")

    def test_special_token_missing_from_added_tokens_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(pad_token="Ġthe"))
        self.assert_refused(d, "'Ġthe'", "not an added token")

    def test_listed_chat_templates_are_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(
            chat_template=[{"name": "default", "template": "x"}, {"name": "tool_use", "template": "y"}]))
        self.assert_refused(d, "named chat templates")

    def test_additional_chat_templates_are_refused(self):
        d = self.case_dir(RESAVED)
        (d / "additional_chat_templates").mkdir()
        (d / "additional_chat_templates" / "tool_use.jinja").write_text("y", encoding="utf-8")
        self.assert_refused(d, "named chat templates")


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
