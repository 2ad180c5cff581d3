"""Tests of oracle/make_models.py, the generator of test model directories (stdlib only).

Run: python3 -m unittest oracle/test_make_models.py   (from the repository root; make test runs it too)
"""

import hashlib
import json
import re
import struct
import sys
import tempfile
import unittest
from unittest import mock
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "oracle"))

import make_models as mm  # noqa: E402


# ---------------------------------------------------------------------------------------------
# A tiny safetensors reader, independent of the writer under test.
# It returns the raw header too, so padding and key order can be checked.
# ---------------------------------------------------------------------------------------------

def read_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        raw = f.read(length)
    return length, raw, json.loads(raw)


def tensor_items(header):
    return [(k, v) for k, v in header.items() if k != "__metadata__"]


def file_sha256s(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).iterdir())}


def element_bytes(path, name, index):
    _, raw, header = read_header(path)
    info = header[name]
    size = mm.DTYPE_SIZE[info["dtype"]]
    with open(path, "rb") as f:
        f.seek(8 + len(raw) + info["data_offsets"][0] + index * size)
        return f.read(size)


class GeneratedCases(unittest.TestCase):
    CASE_NAMES = ("bf16", "f16", "sharded-3", "shuffled", "untied", "head-dim",
                  "no-generation-config", "resaved-transformers-5", "sentencepiece-tinyllama")

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls.tmp.name)
        cls.dirs = {n: mm.make_case(mm.CASES_BY_NAME[n], cls.root / "a") for n in cls.CASE_NAMES}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    # -- determinism ----------------------------------------------------------------------

    def test_same_case_written_twice_has_the_same_bytes(self):
        for name in ("bf16", "sharded-3", "shuffled"):
            again = mm.make_case(mm.CASES_BY_NAME[name], self.root / "b")
            self.assertEqual(file_sha256s(self.dirs[name]), file_sha256s(again), name)

    def test_rewriting_a_case_removes_stale_files(self):
        out = mm.make_case(mm.CASES_BY_NAME["sharded-3"], self.root / "c")
        (out / "stale.safetensors").write_bytes(b"x")
        mm.make_case(mm.CASES_BY_NAME["sharded-3"], self.root / "c")
        self.assertFalse((out / "stale.safetensors").exists())

    # -- safetensors layout ---------------------------------------------------------------

    def test_header_length_is_a_multiple_of_eight(self):
        length, _, _ = read_header(self.dirs["bf16"] / "model.safetensors")
        self.assertEqual(length % 8, 0)

    def test_header_is_compact_json_padded_with_spaces(self):
        _, raw, header = read_header(self.dirs["bf16"] / "model.safetensors")
        compact = json.dumps(header, separators=(",", ":")).encode()
        self.assertEqual(raw.rstrip(b" "), compact)
        self.assertLess(len(raw) - len(compact), 8)

    def test_header_opens_with_metadata_format_pt(self):
        _, _, header = read_header(self.dirs["bf16"] / "model.safetensors")
        self.assertEqual(next(iter(header.items())), ("__metadata__", {"format": "pt"}))

    def test_data_offsets_are_contiguous_and_end_at_the_file_end(self):
        path = self.dirs["shuffled"] / "model.safetensors"
        _, raw, header = read_header(path)
        end = 0
        for _, info in tensor_items(header):
            self.assertEqual(info["data_offsets"][0], end)
            end = info["data_offsets"][1]
        self.assertEqual(8 + len(raw) + end, path.stat().st_size)

    def test_each_tensor_spans_its_shape_times_its_dtype_size(self):
        _, _, header = read_header(self.dirs["f16"] / "model.safetensors")
        for name, info in tensor_items(header):
            start, stop = info["data_offsets"]
            count = 1
            for d in info["shape"]:
                count *= d
            self.assertEqual(stop - start, count * mm.DTYPE_SIZE[info["dtype"]], name)

    def test_tensors_are_written_in_name_order_by_default(self):
        _, _, header = read_header(self.dirs["bf16"] / "model.safetensors")
        names = [n for n, _ in tensor_items(header)]
        self.assertEqual(names, sorted(names))

    def test_shuffled_case_holds_the_same_tensors_in_another_order(self):
        _, _, plain = read_header(self.dirs["bf16"] / "model.safetensors")
        _, _, shuffled = read_header(self.dirs["shuffled"] / "model.safetensors")
        plain_names = [n for n, _ in tensor_items(plain)]
        shuffled_names = [n for n, _ in tensor_items(shuffled)]
        self.assertNotEqual(plain_names, shuffled_names)
        self.assertEqual(sorted(plain_names), sorted(shuffled_names))

    def test_dtype_is_the_cases(self):
        _, _, header = read_header(self.dirs["f16"] / "model.safetensors")
        self.assertEqual({info["dtype"] for _, info in tensor_items(header)}, {"F16"})

    # -- tensor names and shapes ----------------------------------------------------------

    def test_small_model_has_llamas_tensor_names(self):
        _, _, header = read_header(self.dirs["bf16"] / "model.safetensors")
        layer = ["input_layernorm", "mlp.down_proj", "mlp.gate_proj", "mlp.up_proj",
                 "post_attention_layernorm", "self_attn.k_proj", "self_attn.o_proj",
                 "self_attn.q_proj", "self_attn.v_proj"]
        expected = {"model.embed_tokens.weight", "model.norm.weight"}
        expected |= {f"model.layers.{i}.{t}.weight" for i in range(2) for t in layer}
        self.assertEqual({n for n, _ in tensor_items(header)}, expected)

    def test_tied_case_saves_no_lm_head(self):
        _, _, header = read_header(self.dirs["bf16"] / "model.safetensors")
        self.assertNotIn("lm_head.weight", header)

    def test_untied_case_saves_lm_head_shaped_like_the_embedding(self):
        _, _, header = read_header(self.dirs["untied"] / "model.safetensors")
        self.assertEqual(header["lm_head.weight"]["shape"], header["model.embed_tokens.weight"]["shape"])
        self.assertFalse(json.loads((self.dirs["untied"] / "config.json").read_text())["tie_word_embeddings"])

    def test_explicit_head_dim_shapes_the_attention_projections(self):
        config = json.loads((self.dirs["head-dim"] / "config.json").read_text())
        _, _, header = read_header(self.dirs["head-dim"] / "model.safetensors")
        hd, h = config["head_dim"], config["hidden_size"]
        self.assertNotEqual(hd, h // config["num_attention_heads"])
        p = "model.layers.0.self_attn."
        self.assertEqual(header[p + "q_proj.weight"]["shape"], [config["num_attention_heads"] * hd, h])
        self.assertEqual(header[p + "k_proj.weight"]["shape"], [config["num_key_value_heads"] * hd, h])
        self.assertEqual(header[p + "o_proj.weight"]["shape"], [h, config["num_attention_heads"] * hd])

    def test_embedding_rows_equal_the_config_vocab_size(self):
        for name in ("bf16", "sentencepiece-tinyllama"):
            config = json.loads((self.dirs[name] / "config.json").read_text())
            _, _, header = read_header(self.dirs[name] / "model.safetensors")
            self.assertEqual(header["model.embed_tokens.weight"]["shape"][0], config["vocab_size"], name)

    def test_config_vocab_size_equals_the_tokenizers(self):
        for name in ("bf16", "resaved-transformers-5", "sentencepiece-tinyllama"):
            tok = json.loads((self.dirs[name] / "tokenizer.json").read_text(encoding="utf-8"))
            ids = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
            config = json.loads((self.dirs[name] / "config.json").read_text())
            self.assertEqual(config["vocab_size"], len(ids), name)

    # -- shards ---------------------------------------------------------------------------

    def test_sharded_case_writes_hf_shard_names(self):
        names = sorted(p.name for p in self.dirs["sharded-3"].glob("*.safetensors"))
        self.assertEqual(names, [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)])

    def test_shard_index_weight_map_matches_the_shard_headers(self):
        d = self.dirs["sharded-3"]
        index = json.loads((d / "model.safetensors.index.json").read_text())
        found = {}
        for shard in d.glob("model-*.safetensors"):
            _, _, header = read_header(shard)
            found.update({n: shard.name for n, _ in tensor_items(header)})
        self.assertEqual(index["weight_map"], found)

    def test_shard_index_total_size_is_the_sum_of_tensor_bytes(self):
        d = self.dirs["sharded-3"]
        index = json.loads((d / "model.safetensors.index.json").read_text())
        total = 0
        for shard in d.glob("model-*.safetensors"):
            _, _, header = read_header(shard)
            total += sum(i["data_offsets"][1] - i["data_offsets"][0] for _, i in tensor_items(header))
        self.assertEqual(index["metadata"]["total_size"], total)

    def test_sharded_case_has_no_single_model_file(self):
        self.assertFalse((self.dirs["sharded-3"] / "model.safetensors").exists())

    # -- special values -------------------------------------------------------------------

    def test_special_values_sit_at_their_positions(self):
        name = "model.layers.0.self_attn.q_proj.weight"
        path = self.dirs["bf16"] / "model.safetensors"
        _, _, header = read_header(path)
        count = header[name]["shape"][0] * header[name]["shape"][1]
        positions = mm.special_positions(count, len(mm.SPECIAL_F32_BITS))
        got = [element_bytes(path, name, p) for p in positions]
        self.assertEqual(got, mm.special_element_bytes("BF16"))

    def test_f16_special_values_include_overflow_to_infinity(self):
        self.assertEqual(mm.f16_bits_from_f32_bits(mm.f32_bits(65520.0)), 0x7C00)

    def test_bf16_special_nan_stays_nan(self):
        bits = mm.bf16_bits_from_f32_bits(0x7F800001)
        self.assertEqual(bits & 0x7F80, 0x7F80)
        self.assertNotEqual(bits & 0x007F, 0)

    # -- directory contents ---------------------------------------------------------------

    def test_directory_holds_exactly_the_files_of_a_saved_model(self):
        self.assertEqual(sorted(p.name for p in self.dirs["bf16"].iterdir()), [
            "config.json", "generation_config.json", "merges.txt", "model.safetensors",
            "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.json"])

    def test_no_generation_config_case_omits_the_file(self):
        self.assertFalse((self.dirs["no-generation-config"] / "generation_config.json").exists())

    def test_resaved_case_carries_chat_template_jinja(self):
        self.assertTrue((self.dirs["resaved-transformers-5"] / "chat_template.jinja").is_file())

    def test_sentencepiece_case_carries_tokenizer_model(self):
        self.assertTrue((self.dirs["sentencepiece-tinyllama"] / "tokenizer.model").is_file())

    def test_tokenizer_files_are_copied_verbatim(self):
        for folder, file_name in mm.TOKENIZERS["smollm2-135m-instruct"].files:
            self.assertEqual((self.dirs["bf16"] / file_name).read_bytes(),
                             (mm.FIXTURES / folder / file_name).read_bytes(), file_name)


class Registry(unittest.TestCase):
    def test_case_names_and_directory_names_are_unique(self):
        self.assertEqual(len({c.name for c in mm.CASES}), len(mm.CASES))
        self.assertEqual(len({c.directory_name for c in mm.CASES}), len(mm.CASES))

    def test_every_case_names_a_known_tokenizer_fixture(self):
        for case in mm.CASES:
            self.assertIn(case.tokenizer, mm.TOKENIZERS, case.name)

    def test_full_case_keeps_the_real_config_bytes(self):
        case = mm.CASES_BY_NAME["full-135m-instruct"]
        self.assertEqual(mm.config_json_bytes(case),
                         (mm.FIXTURES / "SmolLM2-135M-Instruct" / "config.json").read_bytes())

    def test_full_case_plans_272_tensors(self):
        self.assertEqual(len(mm.case_entries(mm.CASES_BY_NAME["full-135m-instruct"])), 272)

    def test_full_case_file_size_is_the_measured_one(self):
        # 269,060,552 B: the real-config random-BF16 model.safetensors measured in
        # /work/shared/REFERENCE.md ("Facts measured"), written by the safetensors library.
        case = mm.CASES_BY_NAME["full-135m-instruct"]
        planned = mm.safetensors_size(mm.library_order(mm.case_entries(case)))
        self.assertEqual(planned, 269_060_552)



class SharedFixtures(unittest.TestCase):
    """Llama 3.2 cases read Meta-licensed files from ../shared/fixtures and say so when they are absent."""

    def test_a_case_whose_shared_fixture_is_absent_raises_naming_the_path(self):
        with tempfile.TemporaryDirectory() as t, mock.patch.object(mm, "SHARED_FIXTURES", Path(t) / "absent"):
            with self.assertRaisesRegex(mm.FixtureAbsent, re.escape(str(Path(t) / "absent" / "Llama-3.2-1B-Instruct"))):
                mm.make_case(mm.CASES_BY_NAME["llama-3.2-1b-instruct"], Path(t) / "out")

    def test_resaved_llama_tokenizer_has_pair_merges_a_jinja_template_and_tokenizers_backend(self):
        if not (mm.SHARED_FIXTURES / mm.LLAMA_32_1B_INSTRUCT).is_dir():
            self.skipTest(f"{mm.SHARED_FIXTURES / mm.LLAMA_32_1B_INSTRUCT} is absent")
        with tempfile.TemporaryDirectory() as t:
            d = mm.make_case(mm.CASES_BY_NAME["llama-3.2-1b-instruct-resaved"], Path(t))
            self.assertEqual(sorted(p.name for p in d.iterdir()), [
                "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                "tokenizer.json", "tokenizer_config.json"])
            merges = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
            self.assertEqual(merges[0], ["Ġ", "Ġ"])
            self.assertEqual(json.loads((d / "tokenizer_config.json").read_text())["tokenizer_class"], "TokenizersBackend")


class ProjectorCases(unittest.TestCase):
    """A projector case (--mmproj) carries the image processor's files and its whole vision tower."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = mm.make_case(mm.CASES_BY_NAME["qwen3.5-0.8b-vision"], Path(cls.tmp.name))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_writes_the_processor_files_of_its_key(self):
        self.assertEqual({p.name for p in self.dir.iterdir() if "processor" in p.name},
                         set(mm.PROCESSORS["qwen3.5"]))
        read = json.loads((self.dir / "preprocessor_config.json").read_text(encoding="utf-8"))
        self.assertEqual(read, mm.PROCESSORS["qwen3.5"]["preprocessor_config.json"])

    def test_saves_every_tensor_of_the_shrunk_vision_tower(self):
        vision = json.loads((self.dir / "config.json").read_text(encoding="utf-8"))["vision_config"]
        _, _, header = read_header(self.dir / "model.safetensors")
        tower = {k: v["shape"] for k, v in tensor_items(header) if k.startswith("model.visual.")}
        # patch embedding (weight, bias) and positions; 12 a block; the merger's norm and two linears
        self.assertEqual(len(tower), 3 + 12 * vision["depth"] + 6)
        self.assertEqual(tower["model.visual.patch_embed.proj.weight"], [vision["hidden_size"], 3, 2, 16, 16])
        self.assertEqual(tower["model.visual.merger.linear_fc2.weight"],
                         [vision["out_hidden_size"], 4 * vision["hidden_size"]])


if __name__ == "__main__":
    unittest.main()
