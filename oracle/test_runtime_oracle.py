"""Tests of oracle/runtime_oracle.py's own logic, without the runtime (stdlib only): the image it
writes, the text model a projector is loaded beside, and what it reads from llama-mtmd-cli's log.

Run: python3 -S -m unittest discover -s oracle -t oracle -p test_runtime_oracle.py   (from the repository
root; make test runs it too)
"""

import contextlib
import io
import struct
import sys
import tempfile
import unittest
import zlib
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "oracle"))

import oracle  # noqa: E402
import runtime_oracle as ro  # noqa: E402

PROJECTOR = oracle.Run("g-mmproj-f16", "g", ("--mmproj", "--outtype", "f16"))
PLAIN = oracle.Run("g", "g", ("--outtype", "f16"))


def png_chunks(data: bytes) -> list:
    """(kind, payload, crc) of each chunk after the signature; a reader of its own, not the writer's."""
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, payload = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        chunks.append((kind, payload, crc))
        at += 12 + length
    return chunks


class Image(unittest.TestCase):
    def test_png_opens_with_the_png_signature(self):
        self.assertEqual(ro.png(5, 3)[:8], b"\x89PNG\r\n\x1a\n")

    def test_png_header_is_8_bit_rgb_of_the_asked_size(self):
        kind, payload, _ = png_chunks(ro.png(5, 3))[0]
        self.assertEqual((kind, struct.unpack(">IIBBBBB", payload)), (b"IHDR", (5, 3, 8, 2, 0, 0, 0)))

    def test_png_chunks_are_header_data_end_each_with_its_crc(self):
        chunks = png_chunks(ro.png(5, 3))
        self.assertEqual([k for k, _, _ in chunks], [b"IHDR", b"IDAT", b"IEND"])
        for kind, payload, crc in chunks:
            self.assertEqual(crc, zlib.crc32(kind + payload), kind)

    def test_png_data_inflates_to_unfiltered_rows_of_three_bytes_a_pixel(self):
        rows = zlib.decompress(png_chunks(ro.png(5, 3))[1][1])
        self.assertEqual(len(rows), 3 * (1 + 5 * 3))
        self.assertEqual(rows[::1 + 5 * 3], b"\0\0\0")

    def test_png_is_the_same_bytes_every_time(self):
        self.assertEqual(ro.png(ro.IMAGE_WIDTH, ro.IMAGE_HEIGHT), ro.png(ro.IMAGE_WIDTH, ro.IMAGE_HEIGHT))

    def test_image_file_is_written_under_the_runtime_work_directory(self):
        with tempfile.TemporaryDirectory() as t, mock.patch.object(oracle, "WORK", Path(t)):
            path = ro.image_file()
            self.assertEqual((path, path.read_bytes()), (Path(t) / "runtime" / "image.png",
                                                          ro.png(ro.IMAGE_WIDTH, ro.IMAGE_HEIGHT)))


class TextModelOfAProjector(unittest.TestCase):
    def test_a_run_with_mmproj_is_a_projector(self):
        self.assertEqual((ro.is_projector(PROJECTOR), ro.is_projector(PLAIN)), (True, False))

    def test_the_cases_plain_f16_run_is_chosen(self):
        runs = (oracle.Run("g-q8_0", "g", ("--outtype", "q8_0")), PLAIN, oracle.Run("h", "h", ("--outtype", "f16")))
        self.assertEqual(ro.text_run_of(PROJECTOR, {r.name: {} for r in runs}, runs), PLAIN)

    def test_the_plain_run_comes_before_another_f16_run_of_the_case(self):
        other = oracle.Run("g-f16-no-nextn", "g", ("--outtype", "f16", "--no-nextn"))
        self.assertEqual(ro.text_run_of(PROJECTOR, {"g": {}, other.name: {}}, (other, PLAIN)), PLAIN)

    def test_another_f16_run_of_the_case_serves_when_the_plain_one_is_refused(self):
        other = oracle.Run("g-f16-no-nextn", "g", ("--outtype", "f16", "--no-nextn"))
        refused = oracle.Run("g", "g", ("--outtype", "f16"), refused=True)
        self.assertEqual(ro.text_run_of(PROJECTOR, {"g": {}, other.name: {}}, (refused, other)), other)

    def test_projector_adapter_and_split_runs_are_not_text_models(self):
        runs = (PROJECTOR, oracle.Run("lora", "g", ("--outtype", "f16"), adapter="a"),
                oracle.Run("g-split", "g", ("--outtype", "f16", "--split-max-tensors", "7")))
        self.assertIsNone(ro.text_run_of(PROJECTOR, {r.name: {} for r in runs}, runs))

    def test_a_run_not_recorded_is_not_chosen(self):
        self.assertIsNone(ro.text_run_of(PROJECTOR, {}, (PLAIN,)))

    def test_without_a_recorded_run_the_reference_converts_the_case_in_f16(self):
        run = ro.reference_text_run(PROJECTOR)
        self.assertEqual((run.case, run.args, run.refused, ro.is_projector(run)),
                         ("g", ("--outtype", "f16"), False, False))


# llama-mtmd-cli -v's lines that runtime_oracle reads (as logged on the reference's gemma-3-4b projector).
ENCODED = """\
0.00.428.964 I encoding mtmd batch, n_chunks = 1 (done = 1, total = 3)
0.00.441.850 D clip_encode: copying image 1/1 to input buffer (nx=896, ny=896)
0.00.678.650 D clip_encode: output embedding shape [32, 256, 1]
0.00.678.676 I mtmd batch encoding done in 249 ms
0.00.678.684 I decoding image batch 1/1, n_tokens_batch = 256
0.00.768.934 I image decoded (batch 1/1) in 91 ms
"""


class MtmdLog(unittest.TestCase):
    def test_the_command_loads_the_text_model_with_the_projector_and_the_image(self):
        cmd = ro.mtmd_command(Path("T.gguf"), Path("P.gguf"), Path("I.png"), 4)
        self.assertEqual(Path(cmd[0]).name, "llama-mtmd-cli")
        self.assertEqual([cmd[cmd.index(f) + 1] for f in ("-m", "--mmproj", "--image", "-n")],
                         ["T.gguf", "P.gguf", "I.png", "4"])

    def test_the_context_holds_gemma_4s_largest_image_with_its_prompt(self):
        # clip.cpp: Gemma 4's preprocessor makes up to 1120 image tokens (set_limit_image_tokens(70, 1120))
        self.assertGreater(ro.MTMD_CONTEXT, 1120 + 64)

    def test_an_encoded_and_decoded_image_is_ok_with_its_tokens_and_width(self):
        result = ro.encoded_image(ENCODED, "\n abc def\n")
        self.assertEqual(result, ro.Loaded(True, "image encoded (256 tokens of width 32), decoded, "
                                                 "generated 'abc def'"))

    def test_the_tokens_of_every_slice_are_counted(self):
        sliced = ENCODED.replace("[32, 256, 1]\n", "[32, 256, 1]\nD clip_encode: output embedding shape [32, 64, 1]\n")
        self.assertIn("320 tokens of width 32 in 2 slices", ro.encoded_image(sliced, "").line)

    def test_an_exit_0_without_the_encoding_is_a_failure(self):
        log = "".join(ln for ln in ENCODED.splitlines(True) if "encoding done" not in ln)
        self.assertFalse(ro.encoded_image(log, "").ok)

    def test_an_exit_0_without_the_decoding_is_a_failure(self):
        log = "".join(ln for ln in ENCODED.splitlines(True) if "image decoded" not in ln)
        self.assertFalse(ro.encoded_image(log, "").ok)

    def test_the_error_line_is_the_first_error_without_its_timestamp(self):
        stderr = ("0.00.078.770 I load_hparams: n_merge:            4\n"
                  "0.00.091.159 E mtmd_init_from_file: error: mismatch between text model (n_embd = 32) and "
                  "mmproj (n_embd = 64)\nhint: you may be using wrong mmproj\n"
                  "0.00.091.177 E Failed to load vision model from P.gguf\n")
        self.assertEqual(ro.error_line(stderr, "", 1), "E mtmd_init_from_file: error: mismatch between text model "
                         "(n_embd = 32) and mmproj (n_embd = 64)")

    def test_an_abort_names_the_first_frame_of_llama_cpps_own_even_without_argument_types(self):
        stderr = "tools/mtmd/mtmd-helper.cpp:226: GGML_ASSERT(idx >= 0) failed\n"
        stdout = ("#2  0x00005651abcc5868 in ggml_abort ()\n"
                  "#3  0x00005651ab8a85f3 in mtmd_helper_eval_chunk_single ()\n"
                  "#4  0x00005651ab5e2627 in eval_message(mtmd_cli_context&, common_chat_msg&) ()\n")
        self.assertEqual(ro.error_line(stderr, stdout, -6), "killed by SIGABRT: tools/mtmd/mtmd-helper.cpp:226: "
                         "GGML_ASSERT(idx >= 0) failed (in mtmd_helper_eval_chunk_single)")


class CheckRuns(unittest.TestCase):
    """check_runs with the conversions and the runtime replaced: what it asks for and says."""

    def check(self, golden: dict, made=None, loaded=None) -> tuple:
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as t, contextlib.ExitStack() as stack:
            binary = Path(t) / "bin"
            binary.touch()
            stack.enter_context(mock.patch.object(oracle, "WORK", Path(t)))
            stack.enter_context(mock.patch.object(oracle, "reference_dir"))
            stack.enter_context(mock.patch.object(oracle, "load_golden", return_value={"runs": golden}))
            stack.enter_context(mock.patch.object(ro, "runtime_bin", return_value=binary))
            stack.enter_context(mock.patch.object(oracle, "RUNS", (PLAIN, PROJECTOR)))
            if made:
                stack.enter_context(mock.patch.object(ro, "made_as_recorded", side_effect=made))
            loads = stack.enter_context(mock.patch.object(ro, "load_with_projector", return_value=loaded))
            stack.enter_context(contextlib.redirect_stdout(out))
            code = ro.check_runs([PROJECTOR], 4, 10, keep=True)
        return code, out.getvalue(), loads

    def test_a_projector_not_recorded_is_reported_so_not_raised(self):
        code, said, loads = self.check({})
        self.assertEqual(code, 1)
        self.assertIn("not recorded in oracle/recorded/golden.json", said)
        loads.assert_not_called()

    def test_the_projector_is_loaded_beside_its_cases_text_model(self):
        def made(run, *args):
            return ro.Made(Path(f"/made/{run.name}.gguf"), "")
        code, said, loads = self.check({"g": {}, PROJECTOR.name: {}}, made, ro.Loaded(True, "image encoded"))
        self.assertEqual(code, 0)
        self.assertEqual(loads.call_args[0][:2], (Path("/made/g.gguf"), Path(f"/made/{PROJECTOR.name}.gguf")))
        self.assertIn("image encoded; beside g", said)


if __name__ == "__main__":
    unittest.main()
