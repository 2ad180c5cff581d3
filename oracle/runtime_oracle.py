#!/usr/bin/env python3
"""llama.cpp's own runtime loads every recorded output: a file the reference writes but llama.cpp
cannot run (a block count with no tensors behind it, a tensor of the wrong shape, a key the loader
wants and does not find) is found here, so bankml_convert can refuse it instead of reproducing it.

    python3 oracle/runtime_oracle.py [RUN ...|all] [--tokens N] [--timeout S] [--keep] [--reference]
    python3 oracle/oracle.py load [RUN ...|all] [...]    # the same

Each run's output is made again by converting its case with bankml_convert, and its sha256 checked
against oracle/recorded/golden.json before it is loaded, so what is loaded is byte for byte what
llama.cpp's converter wrote when it was recorded; a run bankml must refuse is converted by the
reference itself (and checked the same way).  Then llama-simple (built by oracle/setup_reference.sh
from the same vendored source, on CPU) loads it and generates a few tokens greedily from a fixed
prompt in a small context: the file loads and a forward pass runs.  The weights are random, so the
tokens are garbage; that is not what is checked.  A LoRA run is loaded with its base (the base case's
own f16 output, checked the same way) by llama-completion --lora, as llama-simple takes no adapter.
A projector run (--mmproj) is loaded by llama-mtmd-cli beside the text model of the same case -- the
case's recorded f16 run, made and checked the same way, or when none is recorded the reference's own
f16 conversion of the case (said on the line) -- and encodes an image: a small PNG written here with
the standard library (build/oracle/runtime/image.png), which the projector's preprocessor resizes to
what its tower takes; the image's tokens are then decoded by the text model and a few tokens generated.
What is checked: both files load together (the projector's output width is the text model's), the
image is encoded and its embeddings decoded, and nothing aborts.

One line per run -- `ok`, or `FAIL` with the runtime's error line (an abort's with the function it
died in) -- then the counts; exit 1 when a run failed to load or could not be made as recorded (a run
not recorded yet is one of those, named so).  A run bankml refuses is shown either way and not
counted: that the runtime cannot run it is a reason to refuse.  --reference makes every output with
llama.cpp's converter instead of bankml (still checked against the recording): what the runtime makes
of the reference's files before bankml writes them.  Default runs: every run but the full-size ones,
as oracle.py's.  Outputs are made under build/oracle/runtime and removed once loaded (--keep keeps
them; a file that failed to load is kept).  Not in CI (it needs the runtime build); in make oracle.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import NamedTuple, Optional

import oracle
import make_models

PROMPT = "Hello my name is"


class Made(NamedTuple):
    """A run's output as recorded, or why it could not be made so (then path is None).  A split
    run's path is its first shard, which llama.cpp loads the set from; rest are the others."""
    path: Optional[Path]
    problem: str
    rest: tuple = ()

    def remove(self) -> None:
        for f in (self.path, *self.rest):
            f.unlink()


class Loaded(NamedTuple):
    ok: bool
    line: str           # the generated text when ok, else the runtime's error line


def runtime_bin(name: str) -> Path:
    """A binary of the runtime setup_reference.sh builds under the reference directory."""
    return Path(os.environ.get("BANKML_REF_DIR", oracle.HERE / ".ref")) / "runtime" / "build" / "bin" / name


def made_as_recorded(run: oracle.Run, golden: dict, digests: dict, reference: bool = False) -> Made:
    """The run's output, converted again (bankml, or the reference for a run bankml refuses or when
    asked) from the recorded inputs, with the recorded sha256."""
    entry = golden.get(run.name)
    if entry is None:
        return Made(None, "not recorded in oracle/recorded/golden.json (oracle.py record it first)")
    if oracle.recorded_case_dir(run, entry["inputs_sha256"], digests) is None:
        return Made(None, "the generated inputs differ from the recorded ones (inputs_sha256)")
    if run.refused or reference:
        out, _ = oracle.run_reference(run)
        who = "llama.cpp's converter"
    else:
        p, out = oracle.run_bankml(run)
        who = "bankml_convert"
        if p.returncode != 0:
            return Made(None, f"bankml exit {p.returncode}: {p.stderr.strip()[-200:]}")
    files = oracle.written_files(out)
    if run.split:
        shas = [(f["name"], f["sha256"]) for f in oracle.shard_entries(files, out.stem)]
        if shas != [(f["name"], f["sha256"]) for f in entry["shards"]]:
            return Made(None, f"{who} wrote shards other than the recorded ones")
    sha = oracle.sha256_of(files[0])
    if sha != entry["sha256"]:
        return Made(None, f"{who} wrote {sha[:16]}, the recording says {entry['sha256'][:16]}")
    return moved_to_runtime(files, out)


def moved_to_runtime(files: list[Path], out: Path) -> Made:
    """A conversion's files, moved under build/oracle/runtime (where they are loaded, and kept on --keep)."""
    moved = [oracle.WORK / "runtime" / f.name for f in files]
    moved[0].parent.mkdir(parents=True, exist_ok=True)
    oracle.clear_outputs(oracle.WORK / "runtime" / out.name)
    for f, to in zip(files, moved):
        os.replace(f, to)
    return Made(moved[0], "", tuple(moved[1:]))


# ---------------------------------------------------------------------------------------------
# Projectors (--mmproj): loaded by llama-mtmd-cli beside the text model of the same case, encoding
# an image written here.
# ---------------------------------------------------------------------------------------------

# What llama-mtmd-cli is asked.  The context holds the image's tokens with the prompt and the
# generated ones (with 256 image tokens a context of 256 fails: "failed to find a memory slot for
# batch of size 256"); Gemma 4's preprocessor makes up to 1120, SmolVLM's slices more than 800 for a
# wide image.  chatml: the prompt is wrapped in a template built into the runtime, not the case's own
# (a case's tokenizer may carry none, or one its template engine does not run): what is checked is
# the projector, the text model being loaded by llama-simple in its own run.
MTMD_PROMPT = "Describe the image."
MTMD_CONTEXT = 4096
# A wide image, neither a multiple of a patch nor square, so every preprocessor resizes it.
IMAGE_WIDTH, IMAGE_HEIGHT = 96, 64


def is_projector(run: oracle.Run) -> bool:
    return "--mmproj" in run.args


def text_run_of(run: oracle.Run, golden: dict, runs: Optional[tuple] = None) -> Optional[oracle.Run]:
    """The recorded text conversion a projector run is loaded beside: an f16 run of the same case
    (not a projector, adapter, split or refused run) among oracle.RUNS, the case's plain one
    (--outtype f16 alone) before any other (--no-nextn, ...); None when none is recorded."""
    candidates = [r for r in (oracle.RUNS if runs is None else runs)
                  if r.case == run.case and not is_projector(r) and not r.adapter and not r.split and not r.refused
                  and r.outtype == "f16" and r.name in golden]
    return min(candidates, key=lambda r: r.args != ("--outtype", "f16"), default=None)


def reference_text_run(run: oracle.Run) -> oracle.Run:
    """The run that stands for a projector's text model when no f16 run of its case is recorded:
    the case in f16, converted by the reference (nothing to check it against)."""
    return oracle.Run(f"{run.case}-text-f16-reference", run.case, ("--outtype", "f16"))


def text_model(run: oracle.Run, golden: dict, digests: dict, reference: bool,
               texts: dict[str, tuple[Made, str]]) -> tuple[Made, str]:
    """The text model a projector run is loaded beside, and what it is (a run's name, or the
    reference's conversion); made once a case, and again when a text run of the case, loaded in
    between, has removed it."""
    made = texts[run.case][0] if run.case in texts else None
    if made is None or (made.path is not None and not made.path.exists()):
        text_run = text_run_of(run, golden)
        texts[run.case] = ((made_as_recorded(text_run, golden, digests, reference), text_run.name) if text_run
                           else (made_by_reference(reference_text_run(run)),
                                 "the reference's f16 conversion of its case (no f16 run of it recorded)"))
    return texts[run.case]


def made_by_reference(run: oracle.Run) -> Made:
    out, _ = oracle.run_reference(run)
    return moved_to_runtime(oracle.written_files(out), out)


def png(width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of two gradients and a checkerboard, the same bytes every time (zlib's
    level 9 deflate of the same rows).  mtmd reads images with stb_image, which takes PNG, JPEG,
    BMP, PPM and GIF; PNG is what users give it."""
    def pixel(x: int, y: int) -> bytes:
        check = 255 if (x // 8 + y // 8) % 2 else 0
        return bytes((x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), check))
    # Each row after its filter byte (0: none).
    rows = b"".join(b"\0" + b"".join(pixel(x, y) for x in range(width)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # depth 8, RGB, deflate, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9))
            + chunk(b"IEND", b""))


def image_file() -> Path:
    """The image every projector encodes, written under build/oracle/runtime."""
    path = oracle.WORK / "runtime" / "image.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(IMAGE_WIDTH, IMAGE_HEIGHT))
    return path


def mtmd_command(text: Path, projector: Path, image: Path, tokens: int) -> list[str]:
    # -v: the encoder's output shape (clip_encode) is logged at debug level only
    return [str(runtime_bin("llama-mtmd-cli")), "-m", str(text), "--mmproj", str(projector), "--image", str(image),
            "-p", MTMD_PROMPT, "-n", str(tokens), "-c", str(MTMD_CONTEXT), "-t", "2", "--temp", "0", "-s", "1",
            "--chat-template", "chatml", "--no-warmup", "-v"]


def encoded_image(stderr: str, stdout: str) -> Loaded:
    """What llama-mtmd-cli's log (exit 0) says of the image: encoded (each slice's output shape, the
    projector's width by its tokens) and decoded into the text model, then what was generated."""
    if "mtmd batch encoding done" not in stderr:
        return Loaded(False, "llama-mtmd-cli exited 0 but never said it encoded the image")
    if not re.search(r"\bimage decoded \(batch", stderr):
        return Loaded(False, "llama-mtmd-cli encoded the image but never said it decoded it")
    shapes = [(int(m.group(1)), int(m.group(2)))
              for m in re.finditer(r"clip_encode: output embedding shape \[(\d+), (\d+), \d+\]", stderr)]
    widths = sorted({w for w, _ in shapes})
    slices = f" in {len(shapes)} slices" if len(shapes) > 1 else ""
    said = (f"{sum(n for _, n in shapes)} tokens of width {'/'.join(map(str, widths))}{slices}"
            if shapes else "its output shape not logged")
    return Loaded(True, f"image encoded ({said}), decoded, generated {repr(stdout.strip()[-60:])}")


def load_with_projector(text: Path, projector: Path, image: Path, tokens: int, timeout: float) -> Loaded:
    """llama-mtmd-cli on the text model and its projector: both load, the image is encoded and decoded."""
    try:
        p = subprocess.run(["nice", "-n", "10", *mtmd_command(text, projector, image, tokens)],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return Loaded(False, f"timed out after {timeout:g} s")
    if p.returncode != 0:
        return Loaded(False, error_line(p.stderr, p.stdout, p.returncode))
    return encoded_image(p.stderr, p.stdout)


def error_line(stderr: str, stdout: str, returncode: int) -> str:
    """The line of the runtime's log that says why: the loader's own error if there is one, else an
    assertion, else the first line logged at error level (llama-completion's `E`: the first is the
    cause, the later ones its consequences), else the first line naming an error, else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    tests = [lambda ln: "error loading model" in ln, lambda ln: "GGML_ASSERT" in ln,
             lambda ln: "terminate called" in ln, lambda ln: re.match(r"\S+ E ", ln) is not None,
             lambda ln: "error" in ln.lower(), lambda ln: "failed" in ln.lower()]
    hit = next((ln for test in tests for ln in lines if test(ln)), lines[-1] if lines else "(no output)")
    hit = re.sub(r"^\d+\.\d+\.\d+\.\d+ ", "", hit)       # the log's timestamp: the same failure, the same line
    hit = re.sub(r"\S*/vendor/llama\.cpp/", "", hit)     # the source path, from the vendored tree's root
    assertion = re.search(r"\S+:\d+: GGML_ASSERT.*", hit)   # without a log prefix it may land after
    hit = assertion.group(0) if assertion else hit
    # An abort's backtrace (ggml's, through gdb, on stdout): the first frame of llama.cpp's own, where it failed
    # (a frame without its argument types, as a static binary gives some, reads "name ()").
    frame = next((m.group(1) for m in map(re.compile(r"#\d+\s+0x[0-9a-f]+ in (\S+?) ?\(").match, stdout.splitlines())
                  if m and not m.group(1).startswith(("ggml_", "_", "std::"))), None)
    if frame:
        hit += f" (in {frame})"
    if returncode < 0:
        hit = f"killed by {signal.Signals(-returncode).name}: {hit}"
    return hit[:300]


def load(model: Path, adapter: Optional[Path], tokens: int, timeout: float) -> Loaded:
    """llama-simple on the model (llama-completion with --lora for an adapter): loads and generates."""
    if adapter is None:
        cmd = [str(runtime_bin("llama-simple")), "-m", str(model), "-n", str(tokens), PROMPT]
    else:
        # -v: the adapter's "loaded N tensors from lora file" is logged at info level only
        cmd = [str(runtime_bin("llama-completion")), "-m", str(model), "--lora", str(adapter),
               "-p", PROMPT, "-n", str(tokens), "-c", "64", "-t", "2", "--temp", "0", "-s", "1",
               "-no-cnv", "--no-warmup", "-v"]
    try:
        p = subprocess.run(["nice", "-n", "10", *cmd], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return Loaded(False, f"timed out after {timeout:g} s")
    if p.returncode != 0:
        return Loaded(False, error_line(p.stderr, p.stdout, p.returncode))
    if adapter is not None:
        applied = re.search(r"loaded (\d+) tensors from lora file", p.stderr)
        if not applied:
            return Loaded(False, "llama-completion exited 0 but never said it loaded the adapter's tensors")
        return Loaded(True, f"{repr(p.stdout.strip()[-60:])} with {applied.group(1)} adapter tensors")
    return Loaded(True, repr(p.stdout.strip()[-60:]))


def check_runs(runs: list[oracle.Run], tokens: int, timeout: float, keep: bool, reference: bool = False) -> int:
    oracle.reference_dir()      # sets the reference and its runtime up when they are not yet
    needed = ["llama-simple", "llama-completion"] + (["llama-mtmd-cli"] if any(map(is_projector, runs)) else [])
    missing = [b for b in needed if not runtime_bin(b).is_file()]
    if missing:
        raise SystemExit(f"runtime_oracle: {', '.join(map(str, map(runtime_bin, missing)))} missing: "
                         "run oracle/setup_reference.sh")
    golden = oracle.load_golden()["runs"]
    digests: dict[str, str] = {}
    bases: dict[str, Made] = {}     # a LoRA base case -> its f16 output, made once
    texts: dict[str, tuple[Made, str]] = {}     # a projector's case -> its text model and what it is, made once
    kept_texts: set[str] = set()                # ... kept beside a projector that failed to load
    image = image_file() if any(map(is_projector, runs)) else None
    loaded = failed = unmade = refused = 0
    for run in runs:
        made = made_as_recorded(run, golden, digests, reference)
        if made.path is None:
            unmade += 1
            print(f"FAIL {run.name:<34} not loaded: {made.problem}")
            continue
        base = None
        if run.adapter:
            if run.case not in bases:
                bases[run.case] = made_as_recorded(oracle.RUNS_BY_NAME[run.case], golden, digests, reference)
            base = bases[run.case]
            if base.path is None:
                unmade += 1
                print(f"FAIL {run.name:<34} not loaded: its base {run.case}: {base.problem}")
                continue
        if is_projector(run):
            text, text_said = text_model(run, golden, digests, reference, texts)
            if text.path is None:
                unmade += 1
                print(f"FAIL {run.name:<34} not loaded: its text model {text_said}: {text.problem}")
                continue
            result = load_with_projector(text.path, made.path, image, tokens, timeout)
            result = result._replace(line=f"{result.line}; beside {text_said}") if result.ok else result
        else:
            result = load(base.path if base else made.path, made.path if base else None, tokens, timeout)
        # A projector's line says what became of the image; a model's, what it generated.
        done = f"loaded, {result.line if is_projector(run) else 'generated ' + result.line}"
        if run.refused:     # what the runtime makes of the file bankml refuses: shown, either way right
            refused += 1
            print(f"ok   {run.name:<34} refused by bankml; llama.cpp's own file: {done if result.ok else result.line}")
            if not keep:
                made.remove()
        elif result.ok:
            loaded += 1
            print(f"ok   {run.name:<34} {done}")
            if not keep:
                made.remove()
        else:
            failed += 1
            if is_projector(run):   # the pair is what reproduces it
                kept_texts.add(run.case)
            print(f"FAIL {run.name:<34} {result.line}  (kept: {made.path}"
                  f"{f', beside {text.path}' if is_projector(run) else ''})")
        sys.stdout.flush()
    for base in [*bases.values(), *(text for case, (text, _) in texts.items() if case not in kept_texts)]:
        if base.path is not None and base.path.exists() and not keep:
            base.remove()
    print(f"runtime: {len(runs)} runs, {loaded} loaded and generated, {failed} failed to load, "
          f"{unmade} not made as recorded, {refused} refused by bankml (shown, not counted)")
    return 1 if failed or unmade else 0


def selected_runs(names: list[str], parser: argparse.ArgumentParser) -> list[oracle.Run]:
    """As oracle.py selects them: the named runs, 'all', or every run but the full-size ones."""
    if names == ["all"]:
        return list(oracle.RUNS)
    if names:
        unknown = [n for n in names if n not in oracle.RUNS_BY_NAME]
        if unknown:
            parser.error(f"unknown runs: {', '.join(unknown)}")
        return [oracle.RUNS_BY_NAME[n] for n in names]
    return [r for r in oracle.RUNS if not make_models.CASES_BY_NAME[r.case].full_size]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="run names (oracle.py list); 'all' for every run")
    p.add_argument("--tokens", type=int, default=4, help="tokens to generate (default 4)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per load (default 300)")
    p.add_argument("--keep", action="store_true", help="keep every output under build/oracle/runtime")
    p.add_argument("--reference", action="store_true",
                   help="make every output with llama.cpp's converter instead of bankml (still checked "
                   "against the recording)")
    args = p.parse_args(argv)
    return check_runs(selected_runs(args.runs, p), args.tokens, args.timeout, args.keep, args.reference)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
