#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The fault suite of issue 24: trust at the edges, tried as a hostile user would.

    python3 oracle/faults.py [--tool PATH/TO/bankml_convert.py] [--only CLASS[.NAME]] [--list] [--keep]

Runs the tool as a process (never imported: a broken tool must give FAILs, not an ImportError)
on small generated models (oracle/make_models.py) in a fresh temporary directory per scenario, one
scenario group per class of the issue's "Found" list:

  control   no fault: a plain conversion and a plain refusal pass the common checks (the harness's own test)
  cwd       nothing runs from the current directory, under every way in
  not_out   nothing but OUT (and the pin) is touched: devices, FIFOs, links, -o -, --fork clashes
  atomic    all-or-nothing: a refusal or failure leaves old OUT and old PIN exactly as they were (and
            every old shard of a split; an earlier set is refused by name or replaced through its pin)
  read      the pin names what was read: an input changed while converting is exit 3, nothing replaced
  stale     a dead writer's .part is replaced with one line saying so; a live writer's is refused
  machine   the machine's faults exit 3 in one line, input faults exit 2, never a traceback
  messages  messages name the right problem: symlink loops, missing paths, a file for a directory, an
            input that is a FIFO, a device or never readable

Every scenario checks, besides its own contract: the exit code; no "Traceback" on stderr; one
non-empty stderr line when the exit code is not 0; no new *.part anywhere in its directory; every
entry that existed before (type, inode, size, mtime, sha256, device number, link target, mode)
unchanged unless the run exited 0, and then only OUT and the pin changed; OUT and the pin
consistent (the pin's output sha256 is OUT's, its inputs' are the files'). One line per scenario,
``PASS|FAIL|SKIP class.name: detail``, then ``N passed, N failed[, N skipped]``; exit 1 on a failure.

Root-only scenarios (mounts of small tmpfs, mknod, running the tool as `nobody`) SKIP with the
reason when not root; `make faults` is not run by CI for that reason.  `unprivileged_scenarios()`
returns the scenarios that need neither root nor a mount and take under 2 s, as (name, callable)
pairs for the unit tests: each callable returns its detail, raises AssertionError on a failure and
unittest.SkipTest on a skip; `test_case(per_class=True)` wraps the first of each class as a
unittest.TestCase (``FaultSuite = faults.test_case(per_class=True)`` in test_bankml_convert.py).
Under the unit tests (quick) the read and stale windows use the tiny model and a missed window is a
SKIP, so make test cannot flake on a slow machine.

The contract asserted where the issue leaves a choice:

  -o /dev/null   (a private mknod'd null device, c 1 3, in the scenario's directory; the machine's
                 /dev/null is never named) exit 0, written into as llama.cpp does, or exit 2 refused
                 with the reason; either way it is still a character device 1,3 with the same inode.
  -o FIFO        exit 0 with a reader (held open non-blocking by a thread, so nothing can hang)
                 receiving exactly the bytes a plain conversion to a file gets, or exit 2 with
                 nothing written into it; the FIFO stays a FIFO.  --fork FIFO: exit 2 (a pin is a
                 regular file).
  -o -           exit 0 with stdout exactly a plain conversion's bytes, or exit 2; never a file
                 named - (or -.part).
  a symlink as -o / --fork   the link stays a link to the same target; exit 0 with the target
                 holding the new file (written through, as open() would), or exit 2 with both as
                 they were.  A link planted at OUT.part / PIN.part: its target never changes; the
                 run may refuse or replace the link; the link never becomes a regular file.
  a signal right after a rename   exit 0 with OUT and the pin both new and consistent, or exit
                 130 with both exactly as before; never one of each (after the renames the run has
                 succeeded: a signal then must not turn it into a failure).
  an input deleted / made unreadable late   exit 3 with old OUT and PIN kept, or exit 0 with a pin
                 naming the bytes that were there when the run began (read from open descriptors).
  tokenizer.json swapped once the output's .part exists   the vocabulary may be read after that,
                 so exit 0 is right if the pin names the file read (the new one); else exit 3.
  stdout is /dev/full   exit 3 in one line (a lost sha256 line is not a success); old OUT kept,
                 or, once OUT is in place, the line says it was written and gives its sha256.
  a fork limit   RLIMIT_NPROC 1 for the uid nobody forbids threads as well as forks: the fallback
                 must need neither, and write the same bytes as an unlimited run (exit 0).
  Ctrl-C early   exit 130 in one line for every SIGINT that lands once the tool's code runs, run
                 as a script and as `python3 -m` with cached bytecode; one Python takes during its
                 own startup, while compiling the script or while loading the module (no tool frame
                 past line 0; docs/MANUAL.md gives the measured windows) is not the tool's and is listed
                 apart, per way; a re-exec'd interpreter's window is the tool's.
  a live writer  exit 2 or 3, the message naming it live/running/in progress, with no advice to
                 remove its file; the live run then completes.

`python -m` and the current directory: runpy (Python, before any of the module's code runs) imports
from the current directory on these installed versions -- 3.8: contextlib, types, warnings, weakref;
3.9: types, typing, warnings, weakref; 3.10: contextlib, warnings; 3.11: none; 3.12: types,
warnings; 3.13: types (measured by running an empty module with -m from the same hostile folder).
That is Python's behaviour and a documented limitation; cwd.python3_m asserts on the names the tool
imports beyond those, and reports runpy's.  The shims in the hostile folder leave a marker and then
load the real module in their place, so a run goes on and every name imported from there is seen.

oracle/fuzz.py's helpers (tree_fingerprint, leftovers) are not imported: fuzz.py imports the
converter at import time, and this suite must run a tool that may not even import; its snapshot
also records inodes, modes and device numbers, which fuzz.py's does not need.

Timing (class read and stale): the tool converts a 100 MB model (about 1 s); the suite polls OUT's
directory every millisecond and, the moment a new entry (the .part) appears, stops the tool's
process group with SIGSTOP, so the change to an input (or the SIGKILL, or the second run) lands
while the first run is provably mid-write, whatever the machine's speed; it then waits 30 ms (so
the kernel's coarse clock has moved on and mtime/ctime differ) before changing the input, and
SIGCONTs.  If the run ended before any entry appeared the scenario FAILs saying the window was
missed.  Signals after the rename (atomic.signal_after_*) are timed by busy-polling OUT's (or the
pin's) inode: the invariant (exit 0 and both new, or not 0 and both old) is checked whatever the
timing; whether the window was hit is said in the detail.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

ORACLE = Path(__file__).resolve().parent
ROOT = ORACLE.parent
if str(ORACLE) not in sys.path:
    sys.path.insert(0, str(ORACLE))

import make_models as mm  # noqa: E402

DEFAULT_TOOL = ROOT / "bankml_convert.py"
NOBODY = 65534
OLD_OUT = b"GGUF: the old output, which a failed run must leave as it was\n"
OLD_PIN = b'{"old pin": "a failed run must leave it as it was"}\n'
# The fuzz campaign's tiny dims (oracle/fuzz.py TINY): a conversion takes ~0.1 s of the ~0.7 s run.
TINY = mm.Dims(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
# ~100 MB of bf16 weights: ~1 s to convert, the window for the read and stale classes.
BIG = mm.Dims(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
              num_key_value_heads=4)
BASES = {
    "tiny": mm.Case("faults-tiny", dims=TINY),
    "sharded": mm.Case("faults-sharded", shards=2, dims=TINY),
    "big": mm.Case("faults-big", dims=BIG),
}
# Standard-library names a hostile current directory holds (the tool imports most of them; the
# rest are imported by what it imports). Each file leaves a marker and then loads the real module.
SHADOWED = ("json", "types", "os", "re", "struct", "hashlib", "argparse", "shlex", "fnmatch", "datetime",
            "queue", "threading", "enum", "functools", "typing", "signal", "tempfile", "unicodedata",
            "traceback", "warnings", "contextlib", "copy", "string", "locale", "weakref", "marshal",
            "mmap", "select", "math", "array", "operator", "itertools", "codecs", "collections", "gc")


class Fail(Exception):
    pass


class Skip(Exception):
    pass


class Ran(NamedTuple):
    rc: int              # -N: killed by signal N (subprocess's convention); 999: timed out
    out: bytes
    err: str
    seconds: float


class Scenario(NamedTuple):
    cls: str
    name: str
    fn: Callable
    root: str            # why it needs root (a mount, mknod, another uid); "" if it does not
    fast: bool           # unprivileged, no mount, < 2 s: exported to the unit tests

    @property
    def qualified(self) -> str:
        return f"{self.cls}.{self.name}"


SCENARIOS: list[Scenario] = []


def scenario(cls: str, name: str, root: str = "", fast: bool = False):
    def register(fn):
        SCENARIOS.append(Scenario(cls, name, fn, root, fast))
        return fn
    return register


def scenario_variants(cls: str, check: Callable, variants: dict, fast: bool = False) -> None:
    """One scenario a variant, in the order given: name -> check(ctx, variant), the same contract
    under one changed condition."""
    for name, variant in variants.items():
        scenario(cls, name, fast=fast)(lambda ctx, variant=variant: check(ctx, variant))


def is_root() -> bool:
    return os.geteuid() == 0


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# The environment: the tool under test, the interpreter, the generated base models (built once).
# ---------------------------------------------------------------------------------------------

class Env:
    def __init__(self, tool: Path, python: str = sys.executable, keep: bool = False, quick: bool = False) -> None:
        self.tool = Path(tool).resolve()
        # quick (the unit tests' export): the read and stale classes stop the tiny model's run instead
        # of the 100 MB one's (its .part lives ~0.8 s on the pre-fix code, the vocabulary being read
        # meanwhile), and a missed window is a SKIP, not a FAIL: make test must not be flaky.
        self.window_model = "tiny" if quick else "big"
        self.quick = quick
        self.python = python
        self.keep = keep
        self._cache: Optional[Path] = None
        self._bases: dict[str, Path] = {}
        self._nobody_python: Optional[str] = None

    def base(self, kind: str) -> Path:
        if kind not in self._bases:
            if self._cache is None:
                self._cache = Path(tempfile.mkdtemp(prefix="bankml-faults-bases-"))
            self._bases[kind] = mm.make_case(BASES[kind], self._cache)
        return self._bases[kind]

    def nobody_python(self) -> str:
        """An interpreter (3.10+) the uid nobody can run; Skip if there is none (pyenv lives in /root)."""
        if self._nobody_python is None:
            for candidate in (self.python, "/usr/bin/python3", "/usr/local/bin/python3"):
                try:
                    p = subprocess.run([candidate, "-c", "import sys; print(sys.version_info >= (3, 10))"],
                                       preexec_fn=as_nobody, capture_output=True, timeout=30, cwd="/")
                except OSError:
                    continue
                if p.stdout.strip() == b"True":
                    self._nobody_python = candidate
                    break
            else:
                self._nobody_python = ""
        if not self._nobody_python:
            raise Skip("no Python 3.10+ the uid nobody can run")
        return self._nobody_python

    def close(self) -> None:
        if self._cache is not None and not self.keep:
            shutil.rmtree(self._cache, ignore_errors=True)


def as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def clean_environ(extra: Optional[dict] = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "BANKML"))}
    env["LC_ALL"] = "C.UTF-8"
    env.update(extra or {})
    return env


# ---------------------------------------------------------------------------------------------
# What existed before a run, and what a run may change.
# ---------------------------------------------------------------------------------------------

def entry_state(path: str) -> tuple:
    st = os.lstat(path)
    kind = stat.S_IFMT(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return ("link", st.st_ino, os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir", st.st_ino, stat.S_IMODE(st.st_mode))
    if stat.S_ISREG(st.st_mode):
        return ("file", st.st_ino, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), sha256_file(path))
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return ("device", kind, st.st_ino, st.st_rdev)
    return ("other", kind, st.st_ino)


def snapshot(root: Path) -> dict[str, tuple]:
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                result[os.path.relpath(p, root)] = entry_state(p)
            except OSError as e:
                result[os.path.relpath(p, root)] = ("unreadable", e.errno)
    return result


def describe(state: Optional[tuple]) -> str:
    if state is None:
        return "absent"
    if state[0] == "file":
        return f"file of {state[2]} bytes (inode {state[1]})"
    return " ".join(str(x) for x in state[:3])


class Ctx:
    """One scenario's fresh directory, its runs and their checks; cleans up processes and mounts."""

    def __init__(self, env: Env, tmp: Path) -> None:
        self.env = env
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.mounts: list[Path] = []

    # --- setting up -----------------------------------------------------------------------------
    def model(self, kind: str = "tiny", name: str = "model") -> Path:
        d = self.tmp / name
        shutil.copytree(self.env.base(kind), d)
        return d

    def old_files(self, *paths: Path) -> None:
        for p in paths:
            p.write_bytes(OLD_PIN if p.suffix == ".json" else OLD_OUT)

    def reference(self, model: Path) -> str:
        """The sha256 of a plain conversion of model to a regular file (what a stream must equal)."""
        ref = self.tmp / "reference" / "ref.gguf"
        ref.parent.mkdir(exist_ok=True)
        ran = self.run([model, "-o", ref])
        if ran.rc != 0:
            raise Fail(f"the reference conversion failed: {run_summary(ran)}")
        digest = sha256_file(ref)
        shutil.rmtree(ref.parent)
        return digest

    def mount_tmpfs(self, path: Path, size: str) -> None:
        if not is_root():
            raise Skip("needs root to mount a small tmpfs")
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True,
                       capture_output=True)
        self.mounts.append(path)

    def chown_tree(self) -> None:
        for dirpath, dirnames, filenames in os.walk(self.tmp):
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), NOBODY, NOBODY)
        os.lchown(self.tmp, NOBODY, NOBODY)

    def tool_for_nobody(self) -> Path:
        """A copy of the tool the uid nobody can read (the tool may live under /root)."""
        (self.tmp / "tool").mkdir()
        copy = self.tmp / "tool" / "bankml_convert.py"
        shutil.copyfile(self.env.tool, copy)
        return copy

    # --- running --------------------------------------------------------------------------------
    def start(self, args: list, cwd: Optional[Path] = None, *, python: Optional[str] = None, pyargs=(),
              tool: Optional[Path] = None, command: Optional[list] = None, preexec=None, stdout=subprocess.PIPE,
              env: Optional[dict] = None) -> subprocess.Popen:
        cmd = command if command is not None else [python or self.env.python, *pyargs, str(tool or self.env.tool)]
        p = subprocess.Popen([*cmd, *[a if isinstance(a, bytes) else str(a) for a in args]], cwd=cwd or self.tmp,
                             stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                             start_new_session=True, preexec_fn=preexec, env=env or clean_environ())
        p._started = time.monotonic()  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def finish(self, p: subprocess.Popen, timeout: float = 90) -> Ran:
        try:
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            kill_group(p, signal.SIGKILL)
            out, err = p.communicate()
            rc = 999
        return Ran(rc, out or b"", (err or b"").decode("utf-8", "backslashreplace"),
                   time.monotonic() - p._started)  # type: ignore[attr-defined]

    def run(self, args: list, cwd: Optional[Path] = None, timeout: float = 90, **kw) -> Ran:
        return self.finish(self.start(args, cwd, **kw), timeout)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                kill_group(p, signal.SIGCONT)
                kill_group(p, signal.SIGKILL)
                p.wait()
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(m)], capture_output=True)

    # --- checking -------------------------------------------------------------------------------
    def judge(self, ran: Ran, before: dict, *, codes, out: Optional[Path] = None, pin: Optional[Path] = None,
              may_change=(), ignore=(), planted=(), expect: Optional[str] = None, model: Optional[Path] = None,
              quiet_ok: bool = False) -> list[str]:
        """The problems of a run against the common contract (empty: it held)."""
        problems = []
        codes = (codes,) if isinstance(codes, int) else tuple(codes)
        if ran.rc == 999:
            problems.append(f"no result within the time limit ({ran.seconds:.0f} s)")
        elif ran.rc not in codes:
            problems.append(f"exit {ran.rc}, wanted {' or '.join(map(str, codes))}")
        if "Traceback" in ran.err:
            problems.append("a traceback on stderr")
        lines = [ln for ln in ran.err.splitlines() if ln.strip()]
        if ran.rc != 0 and len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines where one was wanted")
        if expect and not re.search(expect, ran.err, re.I):
            problems.append(f"the message does not match /{expect}/")
        if ran.rc != 0 and (any(ord(c) < 32 and c not in "\n\t" or c == "\ufffd" for c in ran.err)
                            or "\\x00" in ran.err):
            problems.append(f"raw bytes in the message: {ran.err[:200]!r}")
        rel = lambda p: os.path.relpath(p, self.tmp)  # noqa: E731
        allowed = {rel(p) for p in may_change if p is not None}
        for p in (out, pin):
            if p is not None:
                allowed.add(rel(p))
        ignored = {rel(p) for p in ignore} | {rel(p) for p in planted}
        after = snapshot(self.tmp)
        for name in sorted(set(before) | set(after)):
            if "__pycache__" in name.split(os.sep) or (ran.rc == 0 and name in allowed):
                continue
            if any(name == i or name.startswith(i + os.sep) for i in ignored):
                continue
            if name.endswith(".part") and name not in before:
                problems.append(f"a .part left: {name}")
            elif before.get(name) != after.get(name):
                problems.append(f"{name}: {describe(before.get(name))} -> {describe(after.get(name))}")
        for name in planted:
            state = after.get(rel(name))
            if state is not None and state[0] != "link":
                problems.append(f"the planted link {rel(name)} was replaced by {describe(state)}")
        if ran.rc == 0 and out is not None:
            problems += self.consistent(ran, out, pin, model)
        return problems

    def consistent(self, ran: Ran, out: Path, pin: Optional[Path], model: Optional[Path]) -> list[str]:
        problems = []
        st = os.stat(out) if os.path.exists(out) else None     # through a link named by -o
        if st is None or not stat.S_ISREG(st.st_mode):
            return [f"exit 0 but OUT {out.name} is {describe(entry_state(str(out)) if st else None)}"]
        digest = sha256_file(out)
        with open(out, "rb") as f:
            if f.read(4) != b"GGUF" and out.suffix == ".gguf":
                problems.append("OUT is not a GGUF")
        if digest.encode() not in ran.out:
            problems.append("stdout does not name OUT's sha256")
        if pin is not None:
            try:
                doc = json.loads(Path(pin).read_bytes())
            except (OSError, ValueError) as e:
                return problems + [f"the pin is not readable JSON: {e}"]
            if doc.get("output", {}).get("sha256") != digest:
                problems.append("the pin's output sha256 is not OUT's")
            for item in doc.get("inputs", []) if model is not None else []:
                f = model / item.get("name", "?")
                if not f.is_file() or sha256_file(f) != item.get("sha256"):
                    problems.append(f"the pin's sha256 of {item.get('name')} is not the file's")
        return problems


def kill_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def verdict(problems: list[str], ok: str, ran: Optional[Ran] = None) -> str:
    """ok when there is no problem; else Fail naming them, then what the run said."""
    if problems:
        raise Fail("; ".join(problems) + (f" [{run_summary(ran)}]" if ran is not None else f" [{ok}]"))
    return ok


def first_line(ran: Ran) -> str:
    lines = [ln for ln in ran.err.splitlines() if ln.strip()]
    return (lines[0] if lines else "")[:150]


def run_summary(ran: Ran) -> str:
    return f"exit {ran.rc}: {first_line(ran)!r}"


def wait_for_new_entry(p: subprocess.Popen, directory: Path, known: set, limit: float = 60) -> Optional[set]:
    """Poll directory every millisecond until an entry not in known appears (then its names), or
    the process ends (None)."""
    deadline = time.monotonic() + limit
    while p.poll() is None and time.monotonic() < deadline:
        try:
            new = set(os.listdir(directory)) - known
        except OSError:
            new = set()
        if new:
            return new
        time.sleep(0.001)
    return None


def stop_mid_write(ctx: Ctx, p: subprocess.Popen, directory: Path, known: set) -> set:
    new = wait_for_new_entry(p, directory, known)
    missed = Skip if ctx.env.quick else Fail
    if new is None:
        ran = ctx.finish(p)
        raise missed(f"window missed: the run ended ({run_summary(ran)}) before anything appeared in {directory.name}")
    kill_group(p, signal.SIGSTOP)
    if p.poll() is not None:
        raise missed("window missed: the run ended as it was stopped")
    return new


# ---------------------------------------------------------------------------------------------
# 0. Controls: the suite's own checks on runs with no fault; they pass on any sound tool, so a FAIL
#    here is the harness's (or the machine's) problem, not a finding.
# ---------------------------------------------------------------------------------------------

@scenario("control", "plain_conversion_replaces_old_out_and_pin", fast=True)
def control_plain(ctx: Ctx) -> str:
    model = ctx.model()
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--fork", pin])
    return verdict(ctx.judge(ran, before, codes=0, out=out, pin=pin, model=model), run_summary(ran), ran)


@scenario("control", "plain_refusal_keeps_everything", fast=True)
def control_refusal(ctx: Ctx) -> str:
    model = ctx.model()
    os.unlink(model / "config.json")
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--fork", pin])
    return verdict(ctx.judge(ran, before, codes=2, out=out, pin=pin, expect=r"config\.json"), run_summary(ran), ran)


# ---------------------------------------------------------------------------------------------
# 1. A hostile current directory: nothing is ever imported from it.
# ---------------------------------------------------------------------------------------------

SHIM = '''import sys
open({marks!r} + "/" + __name__, "w").close()
_saved = sys.path[:]
sys.path[:] = [p for p in sys.path if p not in ("", ".", {here!r}, {real!r})]
del sys.modules[__name__]
try:
    __import__(__name__)
finally:
    sys.path[:] = _saved
'''


def hostile_dir(ctx: Ctx) -> tuple[Path, Path]:
    """A folder holding SHADOWED as .py files; each leaves a marker in marks/ when imported, then
    loads the real module in its place (so a run goes on and every name imported is seen)."""
    here, marks = ctx.tmp / "hostile", ctx.tmp / "marks"
    here.mkdir()
    marks.mkdir()
    for name in SHADOWED:
        (here / f"{name}.py").write_text(SHIM.format(marks=str(marks), here=str(here), real=os.path.realpath(here)))
    return here, marks


def take_marks(marks: Path) -> set:
    names = set(os.listdir(marks))
    for n in names:
        os.unlink(marks / n)
    return names


def runpy_marks(ctx: Ctx, python: str, here: Path, marks: Path) -> set:
    """What `python -m` imports from the current directory before any of the module's code runs:
    a module that imports nothing, run the same way."""
    probe = ctx.tmp / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "faults_probe.py").write_text("")
    take_marks(marks)
    subprocess.run([python, "-m", "faults_probe"], cwd=here, env=clean_environ({"PYTHONPATH": str(probe)}),
                   capture_output=True, timeout=60)
    return take_marks(marks)


def cwd_run(ctx: Ctx, way: str, python: Optional[str] = None) -> tuple[list[str], str]:
    python = python or ctx.env.python
    model = ctx.model()
    here, marks = hostile_dir(ctx)
    out = ctx.tmp / "out.gguf"
    expected = set()
    if way == "file":
        kw = dict(python=python)
    elif way == "module":
        expected = runpy_marks(ctx, python, here, marks)
        kw = dict(command=[python, "-m", "bankml_convert"], env=clean_environ({"PYTHONPATH": str(ctx.env.tool.parent)}))
    elif way == "command":
        # What pip writes for [project.scripts] bankml-convert = "bankml_convert:main", in a bin/ of its own.
        bindir = ctx.tmp / "bin"
        bindir.mkdir()
        script = bindir / "bankml-convert"
        script.write_text(f"#!{python}\nimport re\nimport sys\nfrom bankml_convert import main\n"
                          "if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                          "    sys.exit(main())\n")
        script.chmod(0o755)
        kw = dict(command=[str(script)], env=clean_environ({"PYTHONPATH": str(ctx.env.tool.parent)}))
    elif way == "vendored":
        vendor = ctx.tmp / "vendor"
        vendor.mkdir()
        shutil.copyfile(ctx.env.tool, vendor / "bankml_convert.py")
        kw = dict(python=python, pyargs=("-S", "-I"), tool=vendor / "bankml_convert.py")
    else:
        raise ValueError(way)
    take_marks(marks)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out], cwd=here, **kw)
    found = take_marks(marks)
    problems = ctx.judge(ran, before, codes=0, out=out)
    own = sorted(found - expected)
    if own:
        problems.insert(0, f"imported from the current directory: {', '.join(own)}")
    note = f"; runpy's own (expected, Python's behaviour): {', '.join(sorted(expected))}" if expected else ""
    return problems, f"{len(SHADOWED)} names shadowed, none imported by the tool{note}"


scenario_variants("cwd", lambda ctx, how: verdict(*cwd_run(ctx, how)),
                  {"python3_file": "file", "python3_m": "module", "installed_command": "command",
                   "vendored_S_I": "vendored"}, fast=True)


def installed_pythons() -> list[str]:
    found = []
    versions = Path(os.path.expanduser("~/.pyenv/versions"))
    for d in sorted(versions.iterdir()) if versions.is_dir() else []:
        m = re.fullmatch(r"3\.(\d+)\.\d+", d.name)
        if m and int(m.group(1)) >= 10 and (d / "bin" / "python3").exists():
            found.append(str(d / "bin" / "python3"))
    return found


def _cwd_versions(ctx: Ctx) -> str:
    pythons = installed_pythons()
    if not pythons:
        raise Skip("no pyenv versions 3.10+ installed")
    problems, notes = [], []
    for python in pythons:
        version = Path(python).parent.parent.name
        for way in ("file", "module"):
            sub = ctx.tmp / f"{version}-{way}"
            sub.mkdir()
            got, detail = cwd_run(Ctx(ctx.env, sub), way, python)
            problems += [f"{version} {way}: {p}" for p in got]
            if "runpy" in detail:
                notes.append(f"{version}: {detail.split(': ', 1)[1]}")
    return verdict(problems, f"{len(pythons)} versions x (FILE, -m), nothing imported by the tool; runpy's own per "
                             f"version: {' | '.join(notes) or 'none'}")


SCENARIOS.append(Scenario("cwd", "every_python_version", _cwd_versions, "", False))


# ---------------------------------------------------------------------------------------------
# 2. Files that are not OUT are never replaced.
# ---------------------------------------------------------------------------------------------

@scenario("not_out", "dev_null", root="mknod of a private null device (the machine's /dev/null is never used)")
def dev_null(ctx: Ctx) -> str:
    """-o a private null device (mknod TMP/null c 1 3; never the machine's /dev/null): it stays a
    character device, same inode and device number; written into (exit 0) or refused (exit 2)."""
    if not is_root():
        raise Skip("needs root for mknod (the machine's /dev/null is never used)")
    model = ctx.model()
    null = ctx.tmp / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", null])
    problems = ctx.judge(ran, before, codes=(0, 2), ignore=[null])
    if entry_state(str(null)) != before["null"]:
        problems.insert(0, f"the null device became {describe(entry_state(str(null)))}")
    return verdict(problems, f"stayed a character device 1,3; {run_summary(ran)}", ran)


class FifoReader(threading.Thread):
    """Holds a FIFO open for reading (non-blocking, so neither side can hang) and counts what arrives."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.data = hashlib.sha256()
        self.size = 0
        self.head = b""
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                chunk = b""
            if chunk:
                self.data.update(chunk)
                self.head = (self.head + chunk)[:4] if len(self.head) < 4 else self.head
                self.size += len(chunk)
            else:
                time.sleep(0.005)
        os.close(self.fd)

    def drain(self) -> None:
        time.sleep(0.05)
        self.done.set()
        self.join()


def run_with_fifo(ctx: Ctx, fifo: Path, args: list, codes) -> tuple[list[str], Ran, FifoReader]:
    """A FIFO made at fifo (in ctx.tmp) with a reader draining it, then the tool run with args: the
    judge's problems (first among them the FIFO no longer one), the run and the reader."""
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    reader.start()
    before = snapshot(ctx.tmp)
    ran = ctx.run(args, timeout=60)
    reader.drain()
    problems = ctx.judge(ran, before, codes=codes, ignore=[fifo])
    if entry_state(str(fifo)) != before[fifo.name]:
        problems.insert(0, f"the FIFO became {describe(entry_state(str(fifo)))}")
    return problems, ran, reader


@scenario("not_out", "fifo_out", fast=True)
def fifo_out(ctx: Ctx) -> str:
    """-o a FIFO: written through as llama.cpp would (exit 0, a reader gets exactly the bytes a file
    would get) or refused (exit 2, nothing written into it); never replaced by a regular file."""
    model = ctx.model()
    fifo = ctx.tmp / "fifo.gguf"
    problems, ran, reader = run_with_fifo(ctx, fifo, [model, "-o", fifo], codes=(0, 2))
    if ran.rc == 0 and (reader.head != b"GGUF" or reader.data.hexdigest() != ctx.reference(model)):
        problems.append(f"exit 0 but the reader got {reader.size} bytes that are not the GGUF")
    if ran.rc == 2 and reader.size:
        problems.append(f"refused after writing {reader.size} bytes into the FIFO")
    how = f"written through ({reader.size} bytes)" if ran.rc == 0 else "refused"
    return verdict(problems, f"stayed a FIFO, {how}; {run_summary(ran)}", ran)


@scenario("not_out", "fifo_fork", fast=True)
def fifo_fork(ctx: Ctx) -> str:
    """--fork a FIFO: refused (a pin is a regular file), nothing written, the FIFO stays."""
    model = ctx.model()
    fifo, out = ctx.tmp / "pin.json", ctx.tmp / "out.gguf"
    problems, ran, _ = run_with_fifo(ctx, fifo, [model, "-o", out, "--fork", fifo], codes=2)
    return verdict(problems, f"refused, the FIFO stayed; {run_summary(ran)}", ran)


def link_scenario(ctx: Ctx, which: str) -> str:
    """A symlink as -o or --fork: the link stays a link to the same target; either the target holds
    the new file (exit 0, written through as llama.cpp's open() would) or everything is as before."""
    model = ctx.model()
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    target = ctx.tmp / "elsewhere" / ("target.gguf" if which == "out" else "target.json")
    target.parent.mkdir()
    ctx.old_files(target)
    link = out if which == "out" else pin
    if which == "fork":
        ctx.old_files(out)
    os.symlink(target, link)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--fork", pin])
    # exit 0: the target is the written file; OUT/pin are checked through the link.
    problems = ctx.judge(ran, before, codes=(0, 2), out=out, pin=pin, may_change=[target], planted=[link],
                         model=model)
    state = entry_state(str(link)) if os.path.lexists(link) else None
    if state is None or state[0] != "link" or state[2] != str(target):
        problems.insert(0, f"the link became {describe(state)}")
    return verdict(problems, f"the link stayed a link; {run_summary(ran)}", ran)


scenario_variants("not_out", link_scenario, {"symlink_out": "out", "symlink_fork": "fork"}, fast=True)


def fork_clash(ctx: Ctx, pin_of: Callable[[Path, Path], Path], expect: Optional[str] = None) -> str:
    model = ctx.model()
    out = ctx.tmp / "out.gguf"
    ctx.old_files(out)
    pin = pin_of(model, out)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--fork", pin])
    return verdict(ctx.judge(ran, before, codes=2, expect=expect), f"refused, nothing touched; {run_summary(ran)}", ran)


scenario_variants("not_out", fork_clash, {
    "fork_is_config_json": lambda model, out: model / "config.json",
    "fork_is_a_shard": lambda model, out: model / "model.safetensors",
    "fork_equals_out": lambda model, out: out,
    "fork_is_out_by_another_path": lambda model, out: model / ".." / out.name,
}, fast=True)


@scenario("not_out", "fork_is_a_directory", fast=True)
def fork_dir(ctx: Ctx) -> str:
    def pin(model, out):
        (ctx.tmp / "pindir").mkdir()
        return ctx.tmp / "pindir"
    return fork_clash(ctx, pin)


def run_past_planted_link(ctx: Ctx, part: Path, args: list, **judged) -> tuple[list[str], Ran]:
    """A symlink planted at part pointing at a victim file in ctx.tmp, then the tool run with args:
    the judge's problems (first among them the victim changed) and the run."""
    victim = ctx.tmp / "victim.txt"
    victim.write_bytes(b"the victim: nothing may write here\n")
    os.symlink(victim, part)
    before = snapshot(ctx.tmp)
    ran = ctx.run(args)
    problems = ctx.judge(ran, before, codes=(0, 2), planted=[part], **judged)
    if entry_state(str(victim)) != before["victim.txt"]:
        problems.insert(0, "the victim was changed")
    return problems, ran


def planted_part(ctx: Ctx, which: str) -> str:
    """A symlink planted at PIN.part / OUT.part pointing at a victim: the victim is never changed."""
    model = ctx.model()
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    part = (out if which == "out" else pin).with_name((out if which == "out" else pin).name + ".part")
    problems, ran = run_past_planted_link(ctx, part, [model, "-o", out, "--fork", pin], out=out, pin=pin, model=model)
    left = "kept" if os.path.lexists(part) else "removed"
    return verdict(problems, f"the victim unchanged, the planted link {left}; {run_summary(ran)}", ran)


scenario_variants("not_out", planted_part, {"symlink_at_pin_part": "pin", "symlink_at_out_part": "out"}, fast=True)


STATE_DICT = ORACLE / "fixtures" / "torch" / "mnist-f32.pt"


@scenario("not_out", "ggml_fork_equals_out", fast=True)
def ggml_fork_out(ctx: Ctx) -> str:
    """The ggml command's pin is checked as convert's: --fork equal to -o is refused, OUT kept."""
    out = ctx.tmp / "out.bin"
    ctx.old_files(out)
    state = ctx.tmp / "mnist.pt"
    shutil.copyfile(STATE_DICT, state)
    before = snapshot(ctx.tmp)
    ran = ctx.run(["ggml", state, "-o", out, "--fork", out])
    return verdict(ctx.judge(ran, before, codes=2), run_summary(ran), ran)


@scenario("not_out", "ggml_symlink_at_pin_part", fast=True)
def ggml_pin_part(ctx: Ctx) -> str:
    """The ggml command's pin goes through the same commit: a link planted at PIN.part is not followed."""
    out, pin = ctx.tmp / "out.bin", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    state = ctx.tmp / "mnist.pt"
    shutil.copyfile(STATE_DICT, state)
    problems, ran = run_past_planted_link(ctx, ctx.tmp / "pin.json.part", ["ggml", state, "-o", out, "--fork", pin],
                                          out=out, pin=pin)
    return verdict(problems, f"the victim unchanged; {run_summary(ran)}", ran)


@scenario("not_out", "sllm_fork_is_the_tokenizer_output", fast=True)
def sllm_fork_tok(ctx: Ctx) -> str:
    """--format sllm writes OUT.sllm and OUT.tok.txt: --fork naming the second is refused."""
    model = ctx.model()
    out, tok = ctx.tmp / "out.sllm", ctx.tmp / "out.tok.txt"
    ctx.old_files(out, tok)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--format", "sllm", "--fork", tok])
    return verdict(ctx.judge(ran, before, codes=2), run_summary(ran), ran)


@scenario("not_out", "dash_out", fast=True)
def dash_out(ctx: Ctx) -> str:
    """-o -: streams the GGUF to stdout (exit 0, stdout exactly the bytes a file would get) or is refused (exit 2);
    never a file named - (or -.part)."""
    model = ctx.model()
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", "-"])
    problems = ctx.judge(ran, before, codes=(0, 2))
    if ran.rc == 0 and hashlib.sha256(ran.out).hexdigest() != ctx.reference(model):
        problems.append("exit 0 but stdout is not exactly the GGUF a file would hold")
    how = f"streamed {len(ran.out)} bytes" if ran.rc == 0 else "refused"
    return verdict(problems, f"no file named -, {how}; {run_summary(ran)}", ran)


# ---------------------------------------------------------------------------------------------
# 3. All or nothing: old OUT and old PIN exactly as before unless the run exited 0.
# ---------------------------------------------------------------------------------------------

@scenario("atomic", "pin_directory_unwritable", fast=True)
def pin_dir_unwritable(ctx: Ctx) -> str:
    """The pin's directory not writable (a read-only tmpfs as root, mode 0555 otherwise)."""
    model = ctx.model()
    out, pins = ctx.tmp / "out.gguf", ctx.tmp / "pins"
    pin = pins / "pin.json"
    ctx.old_files(out)
    if is_root():
        ctx.mount_tmpfs(pins, "1m")
        ctx.old_files(pin)
        subprocess.run(["mount", "-o", "remount,ro", str(pins)], check=True, capture_output=True)
    else:
        pins.mkdir()
        ctx.old_files(pin)
        pins.chmod(0o555)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--fork", pin])
    problems = ctx.judge(ran, before, codes=(2, 3), out=out, pin=pin, model=model)
    if not is_root():
        pins.chmod(0o755)
    return verdict(problems, f"old OUT and PIN kept; {run_summary(ran)}", ran)


# As root that scenario mounts; it is fast and unprivileged only when not root.
SCENARIOS[-1] = SCENARIOS[-1]._replace(fast=not is_root())


@scenario("atomic", "replaced_files_keep_their_mode_and_owner", fast=True)
def kept_mode(ctx: Ctx) -> str:
    """OUT mode 0600 and the pin mode 0640 (owned by nobody when root): replaced by a plain run, each
    new file has its old permission bits, and its old owner where the user may set it (root)."""
    model = ctx.model()
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    out.chmod(0o600)
    pin.chmod(0o640)
    owner = (NOBODY, NOBODY) if is_root() else (os.getuid(), os.getgid())
    for p in (out, pin):
        os.chown(p, *owner)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--fork", pin])
    problems = ctx.judge(ran, before, codes=0, out=out, pin=pin, model=model)
    for p, mode in ((out, 0o600), (pin, 0o640)):
        st = os.stat(p)
        if stat.S_IMODE(st.st_mode) != mode:
            problems.append(f"{p.name}: mode {stat.S_IMODE(st.st_mode):o}, was {mode:o}")
        if (st.st_uid, st.st_gid) != owner:
            problems.append(f"{p.name}: owner {st.st_uid}:{st.st_gid}, was {owner[0]}:{owner[1]}")
    return verdict(problems, f"modes 600 and 640, owner {owner[0]}:{owner[1]} kept; {run_summary(ran)}", ran)


@scenario("atomic", "longest_output_name", fast=True)
def longest_name(ctx: Ctx) -> str:
    """OUT named with the most bytes a name may have (NAME_MAX, 255 here), an old file there: replaced
    (its .part needs a shortened name), no .part left."""
    model = ctx.model()
    limit = os.pathconf(ctx.tmp, "PC_NAME_MAX")
    out = ctx.tmp / ("o" * (limit - len(".gguf")) + ".gguf")
    ctx.old_files(out)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out])
    return verdict(ctx.judge(ran, before, codes=0, out=out, model=model), f"{limit}-byte name; {run_summary(ran)}", ran)


@scenario("atomic", "pin_directory_removed_late", fast=True)
def pin_dir_removed(ctx: Ctx) -> str:
    """The pin's directory removed while the output is being written (the run stopped the moment its
    .part appears): the pin cannot be written, so old OUT stays exactly as it was."""
    model = ctx.model(ctx.env.window_model)
    out, pins = ctx.tmp / "out.gguf", ctx.tmp / "pins"
    pins.mkdir()
    pin = pins / "pin.json"
    ctx.old_files(out)
    before = snapshot(ctx.tmp)
    p = ctx.start([model, "-o", out, "--fork", pin])
    stop_mid_write(ctx, p, ctx.tmp, set(os.listdir(ctx.tmp)))
    shutil.rmtree(pins)
    kill_group(p, signal.SIGCONT)
    ran = ctx.finish(p)
    return verdict(ctx.judge(ran, before, codes=(2, 3), ignore=[pins]), f"old OUT kept; {run_summary(ran)}", ran)


def fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@scenario("atomic", "pin_directory_full", root="mounting a 256 KiB tmpfs")
def pin_dir_full(ctx: Ctx) -> str:
    model = ctx.model()
    out, pins = ctx.tmp / "out.gguf", ctx.tmp / "pins"
    pin = pins / "pin.json"
    ctx.old_files(out)
    ctx.mount_tmpfs(pins, "256k")
    ctx.old_files(pin)
    fill(pins)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, "--fork", pin])
    return verdict(ctx.judge(ran, before, codes=3, out=out, pin=pin, model=model, expect="space"),
                   f"old OUT and PIN kept; {run_summary(ran)}", ran)


def late_input_change(ctx: Ctx, change: Callable[[Path], None], codes, what: str,
                      preexec=None, python=None, tool=None, check_read: bool = True) -> tuple[Ran, list[str]]:
    """Run on a model, stop the run once model.safetensors is open or mapped by it (its data being
    read), change an input, go on."""
    model = ctx.model(ctx.env.window_model)
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    if preexec is not None:
        ctx.chown_tree()
    before = snapshot(ctx.tmp)
    p = ctx.start([model, "-o", out, "--fork", pin], preexec=preexec, python=python, tool=tool)
    stop_when_open(ctx, p, model / "model.safetensors")
    time.sleep(0.03)
    change(model)
    kill_group(p, signal.SIGCONT)
    ran = ctx.finish(p)
    problems = ctx.judge(ran, before, codes=codes, out=out, pin=pin, ignore=[model])
    if ran.rc == 0:
        problems += consistent_read(ctx, ran, out, pin, before if check_read else {})
    return ran, problems


def consistent_read(ctx: Ctx, ran: Ran, out: Path, pin: Path, before: dict) -> list[str]:
    """Exit 0 after an input changed: the pin must name what was read, i.e. the inputs as they were."""
    problems = ctx.consistent(ran, out, pin, None)
    try:
        doc = json.loads(pin.read_bytes())
    except (OSError, ValueError):
        return problems
    for item in doc.get("inputs", []) if before else []:
        old = before.get(f"model/{item.get('name')}")
        if old is None or old[0] != "file" or old[5] != item.get("sha256"):
            problems.append(f"the pin's sha256 of {item.get('name')} is not what was there when the run began")
    return problems


@scenario("atomic", "input_deleted_late", fast=True)
def input_deleted_late(ctx: Ctx) -> str:
    """model.safetensors (open: its tensors are being converted) deleted while the output is being
    written: exit 3 with old OUT and PIN kept, or exit 0 with a pin naming the bytes read."""
    ran, problems = late_input_change(ctx, lambda m: os.unlink(m / "model.safetensors"), (0, 3), "deleted")
    return verdict(problems, f"consistent; {run_summary(ran)}", ran)


def unprivileged_run(ctx: Ctx) -> dict:
    """How to run the tool so that mode 000 means something: as nobody when root (root reads and
    enters anything), as it is otherwise."""
    if not is_root():
        return {}
    return dict(python=ctx.env.nobody_python(), tool=ctx.tool_for_nobody(), preexec=as_nobody)


@scenario("atomic", "input_unreadable_late")
def input_unreadable_late(ctx: Ctx) -> str:
    """model.safetensors made unreadable (chmod 000) while its data is being read (the tool run as
    nobody when root): exit 3 with old OUT and PIN kept, or exit 0 with a pin naming what was read."""
    ran, problems = late_input_change(ctx, lambda m: (m / "model.safetensors").chmod(0), (0, 3), "unreadable",
                                      **unprivileged_run(ctx))
    return verdict(problems, f"consistent; {run_summary(ran)}", ran)


def signal_after_rename(ctx: Ctx, watch_pin: bool, rounds: int = 3) -> str:
    """SIGINT the moment OUT's (or the pin's) inode changes; the window is a few milliseconds wide,
    so up to `rounds` runs, stopping at the first that breaks the invariant."""
    details = []
    for i in range(rounds):
        sub = ctx.tmp / f"round{i}"
        sub.mkdir()
        details.append(_signal_after_rename(Ctx(ctx.env, sub), watch_pin, ctx))
    return "; ".join(details[:1]) + (f" (x{rounds})" if rounds > 1 else "")


def _signal_after_rename(ctx: Ctx, watch_pin: bool, owner: Ctx) -> str:
    ctx.procs = owner.procs
    model = ctx.model()
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    watched = pin if watch_pin else out
    inode = os.stat(watched).st_ino
    before = snapshot(ctx.tmp)
    p = ctx.start([model, "-o", out, "--fork", pin])
    hit = False
    while p.poll() is None:
        try:
            if os.stat(watched).st_ino != inode:
                kill_group(p, signal.SIGINT)
                hit = True
                break
        except FileNotFoundError:
            pass
    ran = ctx.finish(p)
    problems = ctx.judge(ran, before, codes=(0, 130), out=out, pin=pin, model=model)
    window = "SIGINT sent right after the rename" if hit else "the run ended before the rename was seen"
    state = ", ".join(f"{p.name} {'kept' if entry_state(str(p)) == before[p.name] else 'replaced'}" for p in (out, pin))
    return verdict(problems, f"{window}; {state}; {run_summary(ran)}", ran)


@scenario("atomic", "signal_after_out_rename")
def signal_out(ctx: Ctx) -> str:
    return signal_after_rename(ctx, False)


@scenario("atomic", "signal_after_pin_rename", fast=True)
def signal_pin(ctx: Ctx) -> str:
    return signal_after_rename(ctx, True, rounds=1 if ctx.env.quick else 3)


# Split output (issue 39): a set of shards is one commit, and an earlier set is never left or removed silently.
SPLIT = ["--split-max-tensors", "5"]


def shard_names(directory: Path, stem: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if re.fullmatch(re.escape(stem) + r"-\d{5}-of-\d{5}\.gguf", n))


@scenario("atomic", "split_set_kept_when_an_input_changes_late")
def split_set_kept(ctx: Ctx) -> str:
    """An old set of shards and its pin; the same split run again, model.safetensors written to while
    its data is being read: exit 3 with every old shard and the pin exactly as they were."""
    model = ctx.model(ctx.env.window_model)
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    first = ctx.run([model, "-o", out, "--fork", pin, *SPLIT])
    if first.rc != 0 or len(shard_names(ctx.tmp, "out")) < 3:
        raise Fail(f"the first split run did not write 3 or more shards: {run_summary(first)}")
    before = snapshot(ctx.tmp)
    p = ctx.start([model, "-o", out, "--fork", pin, *SPLIT])
    stop_when_open(ctx, p, model / "model.safetensors")
    time.sleep(0.03)
    with open(model / "model.safetensors", "ab") as f:
        f.write(b"\0")
    kill_group(p, signal.SIGCONT)
    ran = ctx.finish(p)
    return verdict(ctx.judge(ran, before, codes=3, pin=pin, ignore=[model]),
                   f"{len(shard_names(ctx.tmp, 'out'))} old shards kept; {run_summary(ran)}", ran)


@scenario("atomic", "split_earlier_set_refused_or_replaced_by_its_pin")
def split_earlier_set(ctx: Ctx) -> str:
    """An old set of shards; a run splitting into fewer refuses (exit 2) naming them, all kept; the same
    run given the old set's pin replaces it: exit 0, only the new set and the pin left, the pin's shards
    the files."""
    model = ctx.model()
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    first = ctx.run([model, "-o", out, "--fork", pin, *SPLIT])
    old = shard_names(ctx.tmp, "out")
    if first.rc != 0 or len(old) < 3:
        raise Fail(f"the first split run did not write 3 or more shards: {run_summary(first)}")
    before = snapshot(ctx.tmp)
    refused = ctx.run([model, "-o", out, "--fork", ctx.tmp / "other.json", "--split-max-tensors", "100"])
    problems = ctx.judge(refused, before, codes=2, expect=re.escape(old[0]))
    ran = ctx.run([model, "-o", out, "--fork", pin, "--split-max-tensors", "100"])
    problems += ctx.judge(ran, before, codes=0, out=out, pin=pin, model=model,
                          may_change=[ctx.tmp / n for n in old])
    left = shard_names(ctx.tmp, "out")
    if left:
        problems.append(f"shards of the earlier set left: {', '.join(left)}")
    return verdict(problems, f"refused naming {old[0]}, then replaced {len(old)} shards by one file", ran)


# ---------------------------------------------------------------------------------------------
# 4. The pin names what was read: an input changed while converting is exit 3, nothing replaced.
# ---------------------------------------------------------------------------------------------

def rewrite_tail(path: Path) -> None:
    """Same size, in place: the last 64 KiB (tensor data) with every byte flipped."""
    with open(path, "r+b") as f:
        f.seek(-(1 << 16), os.SEEK_END)
        data = f.read()
        f.seek(-(1 << 16), os.SEEK_END)
        f.write(bytes(b ^ 0xFF for b in data))


def swap_by_rename(path: Path) -> None:
    """A same-size file renamed over path: one byte changed (tokenizer_config.json: one letter of
    the chat template, which the GGUF carries, so the file stays valid and converts differently;
    elsewhere the last byte flipped)."""
    data = bytearray(path.read_bytes())
    if path.name == "tokenizer_config.json":
        assert b"helpful AI assistant" in data
        data = bytearray(bytes(data).replace(b"helpful AI assistant", b"helpful AI Assistant"))
    else:
        data[-1] ^= 0xFF
    tmp = path.with_name(".swap")
    tmp.write_bytes(bytes(data))
    os.rename(tmp, path)


def rewrite_config(path: Path) -> None:
    """Same size, in place: rope_theta 100000 -> 200000 (valid JSON, a different GGUF)."""
    data = path.read_bytes()
    assert b'"rope_theta": 100000,' in data
    path.write_bytes(data.replace(b'"rope_theta": 100000,', b'"rope_theta": 200000,'))


def group_has_open(pgid: int, st: os.stat_result) -> bool:
    """Whether a process of the group has the file (st) open or mapped (/proc; Linux)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    t = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if (t.st_dev, t.st_ino) == (st.st_dev, st.st_ino):
                    return True
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6 and parts[4] == str(st.st_ino):
                        return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def stop_when_open(ctx: Ctx, p: subprocess.Popen, path: Path) -> None:
    """Poll (/proc, every ~2 ms) until a process of the run's group has path open or mapped, then
    SIGSTOP the group; Fail (Skip under --quick) if the run ends first."""
    st = os.stat(path)
    while p.poll() is None:
        if group_has_open(p.pid, st):
            kill_group(p, signal.SIGSTOP)
            if p.poll() is None:
                return
        time.sleep(0.002)
    ran = ctx.finish(p)
    missed = Skip if ctx.env.quick else Fail
    raise missed(f"window missed: the run ended ({run_summary(ran)}) without {path.name} seen open")


def input_changed(ctx: Ctx, name: str, change: Callable[[Path], None], when: str = "part") -> str:
    """Stop the run (when="part": the moment its output's .part appears; when="open": once the
    input is open or mapped by the tool, i.e. while its data is being read), change the input
    `name`, resume.

    If the tool had the file open (or mapped) at the change, the change is one of an input it
    read: exit 3, nothing replaced.  If not (it may read it later, or have read and closed it):
    exit 3, or exit 0 with OUT exactly a plain conversion of the files as they now are and a pin
    naming them -- a pin naming bytes other than those converted is the finding."""
    model = ctx.model(ctx.env.window_model)
    out, pin = ctx.tmp / "out.gguf", ctx.tmp / "pin.json"
    ctx.old_files(out, pin)
    before = snapshot(ctx.tmp)
    p = ctx.start([model, "-o", out, "--fork", pin])
    if when == "open":
        stop_when_open(ctx, p, model / name)
    else:
        stop_mid_write(ctx, p, ctx.tmp, set(os.listdir(ctx.tmp)))
    was_open = group_has_open(p.pid, os.stat(model / name))
    time.sleep(0.03)            # past the kernel's coarse clock tick: mtime and ctime differ
    change(model / name)
    kill_group(p, signal.SIGCONT)
    ran = ctx.finish(p)
    problems = ctx.judge(ran, before, codes=3 if was_open else (0, 3), out=out, pin=pin, ignore=[model])
    if ran.rc == 0 and not was_open:
        problems += ctx.consistent(ran, out, pin, model)        # the pin names the files as they are now
        if not problems and sha256_file(out) != ctx.reference(model):
            problems.append(f"exit 0, but OUT is not what {name} as it now is converts to: the change "
                            "came after the read and went unseen")
    state = "open" if was_open else "not open"
    how = "refused, nothing replaced" if ran.rc else "converted and pinned as read"
    return verdict(problems, f"{name} {state} at the change; {how}; {run_summary(ran)}", ran)


@scenario("read", "shard_rewritten_in_place", fast=True)
def shard_in_place(ctx: Ctx) -> str:
    return input_changed(ctx, "model.safetensors", rewrite_tail, when="open")


@scenario("read", "shard_swapped_by_rename")
def shard_swapped(ctx: Ctx) -> str:
    return input_changed(ctx, "model.safetensors", swap_by_rename, when="open")


@scenario("read", "config_rewritten_in_place", fast=True)
def config_in_place(ctx: Ctx) -> str:
    return input_changed(ctx, "config.json", rewrite_config)


@scenario("read", "tokenizer_config_swapped_by_rename")
def tokenizer_swapped(ctx: Ctx) -> str:
    return input_changed(ctx, "tokenizer_config.json", swap_by_rename)


# ---------------------------------------------------------------------------------------------
# 5. A dead writer's .part is replaced (one line saying so); a live writer's is named and refused.
# ---------------------------------------------------------------------------------------------

STALE_LINE = r"\.part"


def killed_then_rerun(ctx: Ctx, sllm: bool) -> str:
    model = ctx.model(ctx.env.window_model)
    out = ctx.tmp / ("out.sllm" if sllm else "out.gguf")
    outs = [out, ctx.tmp / "out.tok.txt"] if sllm else [out]
    ctx.old_files(*outs)
    extra = ["--format", "sllm"] if sllm else []
    known = set(os.listdir(ctx.tmp))
    before = snapshot(ctx.tmp)
    p = ctx.start([model, "-o", out, *extra])
    stop_mid_write(ctx, p, ctx.tmp, known)
    if sllm:                # both .parts: wait (stopped run resumed briefly) until the second appears
        kill_group(p, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while p.poll() is None and len(set(os.listdir(ctx.tmp)) - known) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    kill_group(p, signal.SIGKILL)
    ctx.finish(p)
    parts = sorted(set(os.listdir(ctx.tmp)) - known)
    problems = [f"{n}: changed by the killed run" for n in ("out.gguf", "out.sllm", "out.tok.txt")
                if n in before and entry_state(str(ctx.tmp / n)) != before[n]]
    stale = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out, *extra])
    problems += ctx.judge(ran, stale, codes=0, out=out, may_change=outs + [ctx.tmp / n for n in parts])
    problems += [f"a .part left: {n}" for n in os.listdir(ctx.tmp) if n.endswith(".part") and ran.rc == 0]
    said = [ln for ln in ran.err.splitlines() if re.search(STALE_LINE, ln)]
    if ran.rc == 0 and not said:
        problems.append("no line says the stale .part was replaced")
    if len(said) > len(parts):
        problems.append(f"{len(said)} lines about {len(parts)} stale files")
    return verdict(problems, f"the killed run left {', '.join(parts) or 'nothing'}; rerun {run_summary(ran)}", ran)


@scenario("stale", "gguf_part_of_a_killed_run", fast=True)
def stale_gguf(ctx: Ctx) -> str:
    return killed_then_rerun(ctx, False)


@scenario("stale", "sllm_parts_of_a_killed_run")
def stale_sllm(ctx: Ctx) -> str:
    return killed_then_rerun(ctx, True)


LIVE = r"\b(live|running|in progress|still|is writing|in use|held|locked)\b"


@scenario("stale", "live_writer_refused", fast=True)
def live_writer(ctx: Ctx) -> str:
    """A second run while the first (stopped mid-write, so provably alive) holds OUT.part: refused,
    the first named as live and no advice to remove its file; the first then completes."""
    return live_writer_case(ctx, False)


@scenario("stale", "sllm_live_writer_refused")
def live_writer_sllm(ctx: Ctx) -> str:
    return live_writer_case(ctx, True)


def live_writer_case(ctx: Ctx, sllm: bool) -> str:
    big, tiny = ctx.model(ctx.env.window_model), ctx.model("tiny", "model2")
    out = ctx.tmp / ("out.sllm" if sllm else "out.gguf")
    extra = ["--format", "sllm"] if sllm else []
    ctx.old_files(out)
    known = set(os.listdir(ctx.tmp))
    a = ctx.start([big, "-o", out, *extra])
    stop_mid_write(ctx, a, ctx.tmp, known)
    before = snapshot(ctx.tmp)
    ran = ctx.run([tiny, "-o", out, *extra])
    problems = ctx.judge(ran, before, codes=(2, 3), expect=LIVE)
    if re.search(r"\b(remove|delete)\b", ran.err, re.I) or "killed" in ran.err:
        problems.append("the message suggests the live writer's file is a leftover")
    kill_group(a, signal.SIGCONT)
    first = ctx.finish(a)
    if first.rc != 0:
        problems.append(f"the first run then failed: {run_summary(first)}")
    else:
        problems += ctx.consistent(first, out, None, None)
    return verdict(problems, f"second run {run_summary(ran)}; first run exit {first.rc}", ran)


@scenario("stale", "live_writer_part_removed_by_hand")
def part_removed(ctx: Ctx) -> str:
    """The issue's race: the stale-.part advice followed while the writer A lives (its OUT.part
    removed by hand), a second run B creates its own OUT.part and is stopped mid-write, A is resumed
    and ends, then B.  A must not rename B's half-written file into place: OUT is whole and is the
    output named by a run that exited 0 (B's if both did), and no .part is left."""
    big = ctx.model("big")
    out = ctx.tmp / "out.gguf"
    known = set(os.listdir(ctx.tmp))
    a = ctx.start([big, "-o", out])
    for name in stop_mid_write(ctx, a, ctx.tmp, known):
        if name.endswith(".part"):
            os.unlink(ctx.tmp / name)
    b = ctx.start([big, "-o", out, "--outtype", "f32"])
    stop_mid_write(ctx, b, ctx.tmp, known)
    kill_group(a, signal.SIGCONT)
    first = ctx.finish(a)
    kill_group(b, signal.SIGCONT)
    second = ctx.finish(b)
    problems = []
    for label, r in (("A", first), ("B", second)):
        if "Traceback" in r.err:
            problems.append(f"a traceback from {label}")
        if r.rc != 0 and len([ln for ln in r.err.splitlines() if ln.strip()]) != 1:
            problems.append(f"{label}: not one stderr line")
    digest = sha256_file(out).encode() if out.is_file() else b"absent"
    if second.rc == 0 and digest not in second.out:
        problems.append("B exited 0 and renamed last, but OUT is not B's output")
    elif second.rc != 0 and not (first.rc == 0 and digest in first.out):
        problems.append("OUT is not the output of a run that exited 0")
    leftover = [n for n in os.listdir(ctx.tmp) if n.endswith(".part")]
    if leftover:
        problems.append(f"a .part left: {leftover}")
    return verdict(problems, f"A {run_summary(first)}; B {run_summary(second)}")


# ---------------------------------------------------------------------------------------------
# 6. The machine's faults: exit 3 in one line, old OUT intact; input faults exit 2.
# ---------------------------------------------------------------------------------------------

@scenario("machine", "disk_full", root="mounting a 1 MiB tmpfs")
def disk_full(ctx: Ctx) -> str:
    model = ctx.model()
    outs = ctx.tmp / "outs"
    ctx.mount_tmpfs(outs, "1m")
    out = outs / "out.gguf"
    ctx.old_files(out)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out])
    return verdict(ctx.judge(ran, before, codes=3, out=out, expect="space"), f"old OUT kept; {run_summary(ran)}", ran)


def limit_fsize() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


@scenario("machine", "ulimit_f", fast=True)
def ulimit_f(ctx: Ctx) -> str:
    model = ctx.model()
    out = ctx.tmp / "out.gguf"
    ctx.old_files(out)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out], preexec=limit_fsize)
    return verdict(ctx.judge(ran, before, codes=3, out=out), f"old OUT kept; {run_summary(ran)}", ran)


@scenario("machine", "fork_limit", root="RLIMIT_NPROC for a uid whose process count is known (nobody)")
def fork_limit(ctx: Ctx) -> str:
    """RLIMIT_NPROC 1 for the uid nobody (no fork, no thread): falls back to one process and writes
    the same bytes as an unlimited run."""
    if not is_root():
        raise Skip("needs root to run as a uid whose process count is known (nobody)")
    python, tool = ctx.env.nobody_python(), ctx.tool_for_nobody()
    model = ctx.model()
    out, ref = ctx.tmp / "out.gguf", ctx.tmp / "ref.gguf"
    ctx.old_files(out)
    ctx.chown_tree()
    reference = ctx.run([model, "-o", ref], python=python, tool=tool, preexec=as_nobody)
    if reference.rc != 0:
        raise Fail(f"the unlimited run failed: {run_summary(reference)}")
    busy = subprocess.run(["pgrep", "-u", str(NOBODY)], capture_output=True).stdout.split()
    if busy:
        raise Skip(f"nobody already runs {len(busy)} processes; the limit would not be this run's")

    def limited():
        as_nobody()
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out], python=python, tool=tool, preexec=limited)
    problems = ctx.judge(ran, before, codes=0, out=out)
    if ran.rc == 0 and sha256_file(out) != sha256_file(ref):
        problems.append("not the bytes of the unlimited run")
    return verdict(problems, f"one process, same bytes; {run_summary(ran)}", ran)


@scenario("machine", "unenterable_model_dir", fast=not is_root())
def unenterable(ctx: Ctx) -> str:
    """The model directory mode 000 (the tool run as nobody when root): exit 2, one line, permission named."""
    how = unprivileged_run(ctx)
    model = ctx.model()
    out = ctx.tmp / "out.gguf"
    ctx.old_files(out)
    if how:
        ctx.chown_tree()
    model.chmod(0)
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out], **how)
    problems = ctx.judge(ran, before, codes=2, out=out, expect="permission")
    model.chmod(0o755)
    return verdict(problems, run_summary(ran), ran)


HUGE_CONFIG = 384 << 20
AS_LIMIT = 640 << 20


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


@scenario("machine", "huge_config_json")
def huge_config(ctx: Ctx) -> str:
    """A 384 MiB config.json (valid JSON) under RLIMIT_AS 640 MiB: refused before parsing, naming the size."""
    model = ctx.model()
    out = ctx.tmp / "out.gguf"
    ctx.old_files(out)
    config = json.loads((model / "config.json").read_bytes())
    head = json.dumps(config)[:-1].encode() + b', "padding": "'
    before = snapshot(ctx.tmp)
    with open(model / "config.json", "wb") as f:
        f.write(head)
        chunk = b"x" * (8 << 20)
        left = HUGE_CONFIG - len(head) - 2
        while left > 0:
            f.write(chunk[:left])
            left -= len(chunk)
        f.write(b'"}')
    ran = ctx.run([model, "-o", out], preexec=limit_memory)
    os.unlink(model / "config.json")
    size = r"(384|402,?653,?184|403|402)"
    return verdict(ctx.judge(ran, before, codes=2, out=out, expect=size, ignore=[model / "config.json"]),
                   run_summary(ran), ran)


CTRL_C_DELAYS = (0.05, 0.1, 0.2, 0.3, 0.35, 0.4, 0.5, 0.8)


# Frames of Python itself, before a module's own code: site and its .pth files, and runpy and the
# import system loading the module run by -m.
PYTHON_OWN_FRAMES = ("<frozen site>", "<frozen runpy>", "<frozen importlib._bootstrap>",
                     "<frozen importlib._bootstrap_external>")


def interrupted_before_the_tool(ran: Ran, tool: Path) -> bool:
    """A SIGINT that Python itself took before any of the tool's code ran: exit 1 or killed by
    SIGINT, KeyboardInterrupt, and either no frame at all (Python parsing the 13,500-line script),
    only frames of Python's own start (site and its .pth files, ~0.15 s on the bench machine; runpy
    and the import system loading the module for -m), or only the script's own "line 0" (compiled,
    before its first instruction) -- never a frame of the tool's code past line 0 nor of a "-c"
    string the tool handed a new interpreter.  The tool cannot act there; it is recorded, not failed
    (docs/MANUAL.md, "What it guarantees", gives the window)."""
    if ran.rc not in (1, -signal.SIGINT) or "KeyboardInterrupt" not in ran.err:
        return False
    frames = re.findall(r'File "([^"]*)", line (\d+)', ran.err)
    if any(f == "<frozen site>" for f, _ in frames):
        return True     # site and whatever its .pth files import
    return all(f in PYTHON_OWN_FRAMES or (Path(f).name == tool.name and n == "0") for f, n in frames)


def module_with_bytecode(ctx: Ctx) -> Path:
    """A folder holding a copy of the tool and its cached bytecode, for `python3 -m bankml_convert`
    run from it: what the installed command and -m load instead of compiling the file."""
    folder = ctx.tmp / "module"
    folder.mkdir()
    copy = folder / "bankml_convert.py"
    shutil.copyfile(ctx.env.tool, copy)
    subprocess.run([ctx.env.python, "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True)",
                    str(copy)], check=True, capture_output=True, env=clean_environ())
    return folder


@scenario("machine", "ctrl_c_early")
def ctrl_c(ctx: Ctx) -> str:
    """SIGINT to the process group at 0.05 ... 0.8 s after start, on the 100 MB model (so the run is
    still going at the last), for `python3 bankml_convert.py` and for `python3 -m bankml_convert`
    with cached bytecode: exit 130, one line, no traceback, old OUT kept -- for every SIGINT that
    lands once the tool's code runs.  One that Python took before the tool's first line is listed
    apart (interrupted_before_the_tool); in each way at least one must land in the tool, or the
    scenario fails as untested.  The detail gives the delays Python took, each way: the script's
    window (Python's start and the file's compilation) against -m's (Python's start alone)."""
    model = ctx.model("big")
    out = ctx.tmp / "out.gguf"
    ctx.old_files(out)
    module = module_with_bytecode(ctx)
    ways = {"script": dict(), "-m": dict(command=[ctx.env.python, "-m", "bankml_convert"], cwd=module)}
    problems, said = [], []
    for way, how in ways.items():
        seen, python_own = [], []
        for delay in CTRL_C_DELAYS:
            before = snapshot(ctx.tmp)
            p = ctx.start([model, "-o", out], **how)
            time.sleep(delay)
            kill_group(p, signal.SIGINT)
            ran = ctx.finish(p)
            if interrupted_before_the_tool(ran, ctx.env.tool):
                python_own.append(f"{delay}s")
                problems += [f"{way} at {delay} s: {x}" for x in ctx.judge(ran, before, codes=ran.rc, out=out)
                             if "traceback" not in x and "stderr lines" not in x]
                continue
            # A run that finished before the signal came has succeeded (exit 0, the new OUT whole): on a
            # quiet machine -m converts the big model in under the last delay.
            finished = ran.rc == 0
            problems += [f"{way} at {delay} s: {x}" for x in ctx.judge(ran, before, codes=0 if finished else 130, out=out)]
            seen.append(f"{delay}s->{ran.rc}" + (" (finished first)" if finished else ""))
        if not seen:
            problems.append(f"{way}: every SIGINT landed in Python's startup, none in the tool: untested")
        said.append(f"{way}: {', '.join(seen)}" + (f" (Python's own, before the tool's code: {', '.join(python_own)})"
                                                   if python_own else ""))
    return verdict(problems, f"{'; '.join(said)}; one line each, old OUT kept where interrupted")


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@scenario("machine", "sigint_ignored_on_entry", fast=True)
def sigint_ignored(ctx: Ctx) -> str:
    """SIGINT ignored on entry (nohup-like) stays ignored: SIGINT every 20 ms, the run still exits 0."""
    model = ctx.model()
    out = ctx.tmp / "out.gguf"
    ctx.old_files(out)
    before = snapshot(ctx.tmp)
    p = ctx.start([model, "-o", out], preexec=ignore_sigint)
    sent = 0
    while p.poll() is None and sent < 400:      # every 20 ms from start to end: every stage sees one
        time.sleep(0.02)
        kill_group(p, signal.SIGINT)
        sent += 1
    ran = ctx.finish(p)
    return verdict(ctx.judge(ran, before, codes=0, out=out), run_summary(ran), ran)


@scenario("machine", "stdout_dev_full", fast=True)
def stdout_full(ctx: Ctx) -> str:
    """stdout is /dev/full: exit 3 in one line, no traceback (a lost sha256 line is not a success);
    old OUT kept -- or, if OUT was already committed, a message saying it was written, with its sha256."""
    model = ctx.model()
    out = ctx.tmp / "out.gguf"
    ctx.old_files(out)
    before = snapshot(ctx.tmp)
    with open("/dev/full", "wb") as full:
        p = ctx.start([model, "-o", out], stdout=full)
        ran = ctx.finish(p)
    problems = ctx.judge(ran, before, codes=3, ignore=[out])
    replaced = entry_state(str(out)) != before["out.gguf"]
    if ran.rc != 0 and replaced and re.search(r"nothing|refuse|unchanged|kept|failed", ran.err, re.I):
        problems.append("OUT was replaced but the message says otherwise")
    if ran.rc != 0 and replaced and not (re.search(r"\bwas written\b", ran.err) and sha256_file(out) in ran.err):
        problems.append("OUT was replaced but the message does not say so with its sha256")
    return verdict(problems, f"OUT {'replaced' if replaced else 'kept'}; {run_summary(ran)}", ran)


@scenario("machine", "non_utf8_output_name", fast=True)
def non_utf8(ctx: Ctx) -> str:
    """-o b"out-\\xff.gguf" with --fork, under C.UTF-8 (stdout's errors: surrogateescape) and with a
    strict UTF-8 stdout (as under en_US.UTF-8; PYTHONIOENCODING=utf-8 here, where that locale is
    absent): exit 0 and the file at that exact name, both times."""
    model = ctx.model()
    problems, said = [], []
    for label, extra in (("C.UTF-8", {}), ("strict", {"PYTHONIOENCODING": "utf-8"})):
        out = Path(os.fsdecode(os.fsencode(str(ctx.tmp)) + f"/out-{label}-\xff.gguf".encode("latin-1")))
        pin = ctx.tmp / f"pin-{label}.json"
        before = snapshot(ctx.tmp)
        ran = ctx.run([os.fsencode(str(model)), b"-o", os.fsencode(str(out)), b"--fork", os.fsencode(str(pin))],
                      env=clean_environ(extra))
        problems += [f"{label}: {x}" for x in ctx.judge(ran, before, codes=0, out=out, pin=pin, model=model)]
        said.append(f"{label} {run_summary(ran)}")
    return verdict(problems, "; ".join(said))


# ---------------------------------------------------------------------------------------------
# 7. Messages that name the right problem.
# ---------------------------------------------------------------------------------------------

LOOP = r"(loop|too many levels of symbolic links)"


def message_case(ctx: Ctx, model: Path, expect: str, must_not: Optional[str] = None, **run) -> str:
    out = ctx.tmp / "out.gguf"
    before = snapshot(ctx.tmp)
    ran = ctx.run([model, "-o", out], **run)
    problems = ctx.judge(ran, before, codes=2, expect=expect)
    if must_not and re.search(must_not, ran.err, re.I):
        problems.append(f"the message says /{must_not}/")
    return verdict(problems, run_summary(ran), ran)


@scenario("messages", "dir_symlink_loop", fast=True)
def dir_loop(ctx: Ctx) -> str:
    os.symlink("loop", ctx.tmp / "loop")
    return message_case(ctx, ctx.tmp / "loop", LOOP, r"no config\.json|not a directory")


@scenario("messages", "config_symlink_loop", fast=True)
def config_loop(ctx: Ctx) -> str:
    model = ctx.model()
    os.unlink(model / "config.json")
    os.symlink("config.json", model / "config.json")
    return message_case(ctx, model, LOOP + r".*config\.json|config\.json.*" + LOOP, r"no config\.json")


@scenario("messages", "shard_symlink_loop", fast=True)
def shard_loop(ctx: Ctx) -> str:
    model = ctx.model("sharded")
    shard = sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))[0]
    os.unlink(model / shard)
    os.symlink(shard, model / shard)
    return message_case(ctx, model, LOOP, r"missing")


@scenario("messages", "single_file_symlink_loop", fast=True)
def single_loop(ctx: Ctx) -> str:
    model = ctx.model()
    os.unlink(model / "model.safetensors")
    os.symlink("model.safetensors", model / "model.safetensors")
    return message_case(ctx, model, LOOP, r"missing|index")


@scenario("messages", "tokenizer_json_symlink_loop", fast=True)
def tokenizer_loop(ctx: Ctx) -> str:
    model = ctx.model()
    os.unlink(model / "tokenizer.json")
    os.symlink("tokenizer.json", model / "tokenizer.json")
    return message_case(ctx, model, r"tokenizer\.json.*" + LOOP, r"no tokenizer\.json")


@scenario("messages", "tokenizer_config_fifo", fast=True)
def tokenizer_config_fifo(ctx: Ctx) -> str:
    model = ctx.model()
    os.unlink(model / "tokenizer_config.json")
    os.mkfifo(model / "tokenizer_config.json")
    return message_case(ctx, model, r"tokenizer_config\.json is a FIFO", r"tokenizer_class")


@scenario("messages", "tokenizer_config_dev_zero", fast=True)
def tokenizer_config_zero(ctx: Ctx) -> str:
    model = ctx.model()
    os.unlink(model / "tokenizer_config.json")
    os.symlink("/dev/zero", model / "tokenizer_config.json")
    return message_case(ctx, model, r"tokenizer_config\.json is a character device", r"tokenizer_class")


@scenario("messages", "input_never_readable")
def never_readable(ctx: Ctx) -> str:
    """generation_config.json mode 000 from the start (the tool run as nobody when root): the input's
    problem, exit 2 naming the file and the reason -- not exit 3 "could no longer be read"."""
    model = ctx.model()
    run = unprivileged_run(ctx)
    if run:
        ctx.chown_tree()
    (model / "generation_config.json").chmod(0)
    return message_case(ctx, model, r"generation_config\.json cannot be read \(Permission denied\)",
                        r"no longer|fault of this machine", **run)


@scenario("messages", "missing_path", fast=True)
def missing(ctx: Ctx) -> str:
    return message_case(ctx, ctx.tmp / "no-such-model", r"does not exist", r"not a directory")


@scenario("messages", "file_instead_of_directory", fast=True)
def file_not_dir(ctx: Ctx) -> str:
    model = ctx.model()
    return message_case(ctx, model / "config.json", r"not a directory|directory")


# ---------------------------------------------------------------------------------------------
# Running.
# ---------------------------------------------------------------------------------------------

def run_scenario(env: Env, s: Scenario) -> tuple[str, str]:
    if s.root and not is_root():
        return "SKIP", f"needs root: {s.root}"
    tmp = Path(tempfile.mkdtemp(prefix=f"bankml-faults-{s.cls}-"))
    ctx = Ctx(env, tmp)
    try:
        return "PASS", s.fn(ctx)
    except Fail as e:
        return "FAIL", str(e)
    except Skip as e:
        return "SKIP", str(e)
    except Exception as e:      # the suite's own error: a FAIL with its cause, never a silent pass
        return "FAIL", f"the scenario itself raised {type(e).__name__}: {e}"
    finally:
        ctx.cleanup()
        if env.keep:
            print(f"  kept {tmp}", file=sys.stderr)
        else:
            subprocess.run(["chmod", "-R", "u+rwx", str(tmp)], capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)


_UNIT_ENV: Optional[Env] = None


def unprivileged_scenarios(tool=None) -> list[tuple[str, Callable[[], str]]]:
    """The scenarios that need no root and no mount and take under 2 s, for make test: (name,
    callable); the callable returns its detail, raises AssertionError on a failure and
    unittest.SkipTest on a skip.  The base models are built once, on first call of any of them."""
    import unittest
    global _UNIT_ENV
    if _UNIT_ENV is None or (tool is not None and Path(tool).resolve() != _UNIT_ENV.tool):
        if _UNIT_ENV is not None:
            _UNIT_ENV.close()
        else:
            import atexit
            atexit.register(lambda: _UNIT_ENV is not None and _UNIT_ENV.close())    # the base models
        _UNIT_ENV = Env(Path(tool) if tool else DEFAULT_TOOL, quick=True)
    env = _UNIT_ENV

    def bind(s: Scenario):
        def call() -> str:
            status, detail = run_scenario(env, s)
            if status == "FAIL":
                raise AssertionError(f"{s.qualified}: {detail}")
            if status == "SKIP":
                raise unittest.SkipTest(detail)
            return detail
        call.__name__ = s.qualified
        return call
    return [(s.qualified, bind(s)) for s in SCENARIOS if s.fast and not s.root]


def test_case(tool=None, per_class: bool = False):
    """A unittest.TestCase class with one test per unprivileged fast scenario (per_class: only the
    first of each class), named test_<class>_<name>; for test_bankml_convert.py:
    ``FaultSuite = faults.test_case()``."""
    import unittest
    chosen, seen = [], set()
    for name, call in unprivileged_scenarios(tool):
        cls = name.split(".")[0]
        if cls == "control" or (per_class and cls in seen):
            continue
        seen.add(cls)
        chosen.append((name, call))
    methods = {f"test_{name.replace('.', '_')}": (lambda call: lambda self: call())(call) for name, call in chosen}
    return type("FaultSuite", (unittest.TestCase,), methods)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the fault suite of issue 24")
    ap.add_argument("--tool", default=str(DEFAULT_TOOL), help="the bankml_convert.py to try (default: the repo's)")
    ap.add_argument("--only", action="append", metavar="CLASS[.NAME]", help="only these (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--keep", action="store_true", help="keep each scenario's directory")
    ap.add_argument("--quick", action="store_true",
                    help="as the unit tests run them: the tiny model for the read and stale windows")
    args = ap.parse_args(argv)
    chosen = [s for s in SCENARIOS if not args.only or any(s.qualified == o or s.cls == o for o in args.only)]
    if args.list:
        for s in chosen:
            tags = ", ".join(t for t, on in (("root", s.root), ("unprivileged-fast", s.fast and not s.root)) if on)
            print(f"{s.qualified}" + (f"  [{tags}]" if tags else ""))
        return 0
    if not chosen:
        print(f"no scenario matches {args.only}", file=sys.stderr)
        return 2
    env = Env(Path(args.tool), keep=args.keep, quick=args.quick)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    start = time.monotonic()
    try:
        for s in chosen:
            t = time.monotonic()
            status, detail = run_scenario(env, s)
            counts[status] += 1
            print(f"{status} {s.qualified}: {detail} ({time.monotonic() - t:.1f} s)", flush=True)
    finally:
        env.close()
    line = f"{counts['PASS']} passed, {counts['FAIL']} failed"
    if counts["SKIP"]:
        line += f", {counts['SKIP']} skipped"
    print(f"{line}")
    print(f"({time.monotonic() - start:.0f} s, tool {env.tool})", file=sys.stderr)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
