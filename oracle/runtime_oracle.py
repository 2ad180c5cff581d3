#!/usr/bin/env python3
"""llama.cpp's own runtime loads every recorded output: a file the reference writes but llama.cpp
cannot run (a block count with no tensors behind it, a tensor of the wrong shape, a key the loader
wants and does not find) is found here, so bankml_convert can refuse it instead of reproducing it.

    python3 oracle/runtime_oracle.py [RUN ...|all] [--tokens N] [--timeout S] [--keep]
    python3 oracle/oracle.py load [RUN ...|all]          # the same

Each run's output is made again by converting its case with bankml_convert, and its sha256 checked
against oracle/recorded/golden.json before it is loaded, so what is loaded is byte for byte what
llama.cpp's converter wrote when it was recorded; a run bankml must refuse is converted by the
reference itself (and checked the same way).  Then llama-simple (built by oracle/setup_reference.sh
from the same vendored source, on CPU) loads it and generates a few tokens greedily from a fixed
prompt in a small context: the file loads and a forward pass runs.  The weights are random, so the
tokens are garbage; that is not what is checked.  A LoRA run is loaded with its base (the base case's
own f16 output, checked the same way) by llama-completion --lora, as llama-simple takes no adapter.

One line per run -- `ok`, or `FAIL` with the runtime's error line (an abort's with the function it
died in) -- then the counts; exit 1 when a run failed to load or could not be made as recorded.  A run
bankml refuses is shown either way and not counted: that the runtime cannot run it is a reason to refuse.  Default runs: every run but the full-size ones,
as oracle.py's.  Outputs are made under build/oracle/runtime and removed once loaded (--keep keeps
them; a file that failed to load is kept).  Not in CI (it needs the runtime build); in make oracle.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
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


def made_as_recorded(run: oracle.Run, golden: dict, digests: dict) -> Made:
    """The run's output, converted again (bankml, or the reference for a run bankml refuses) from
    the recorded inputs, with the recorded sha256."""
    entry = golden.get(run.name)
    if entry is None:
        return Made(None, "not recorded in oracle/recorded/golden.json (oracle.py record it first)")
    if oracle.recorded_case_dir(run, entry["inputs_sha256"], digests) is None:
        return Made(None, "the generated inputs differ from the recorded ones (inputs_sha256)")
    if run.refused:
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
    moved = [oracle.WORK / "runtime" / f.name for f in files]
    moved[0].parent.mkdir(parents=True, exist_ok=True)
    oracle.clear_outputs(oracle.WORK / "runtime" / out.name)
    for f, to in zip(files, moved):
        os.replace(f, to)
    return Made(moved[0], "", tuple(moved[1:]))


def error_line(stderr: str, stdout: str, returncode: int) -> str:
    """The line of the runtime's log that says why: the loader's own error if there is one, else an
    assertion, else the first line logged at error level (llama-completion's `E`: the first is the
    cause, the later ones its consequences), else the first line naming an error, else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    tests = [lambda ln: "error loading model" in ln, lambda ln: "GGML_ASSERT" in ln,
             lambda ln: "terminate called" in ln, lambda ln: re.match(r"\S+ E ", ln) is not None,
             lambda ln: "error" in ln.lower(), lambda ln: "failed" in ln.lower()]
    hit = next((ln for test in tests for ln in lines if test(ln)), lines[-1] if lines else "(no output)")
    hit = re.sub(r"\S*/vendor/llama\.cpp/", "", hit)     # the source path, from the vendored tree's root
    assertion = re.search(r"\S+:\d+: GGML_ASSERT.*", hit)   # without a log prefix it may land after
    hit = assertion.group(0) if assertion else hit
    # An abort's backtrace (ggml's, through gdb, on stdout): the first frame of llama.cpp's own, where it failed.
    frame = next((m.group(1) for m in map(re.compile(r"#\d+\s+0x[0-9a-f]+ in (\S+?)\(").match, stdout.splitlines())
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


def check_runs(runs: list[oracle.Run], tokens: int, timeout: float, keep: bool) -> int:
    oracle.reference_dir()      # sets the reference and its runtime up when they are not yet
    missing = [b for b in ("llama-simple", "llama-completion") if not runtime_bin(b).is_file()]
    if missing:
        raise SystemExit(f"runtime_oracle: {', '.join(map(str, map(runtime_bin, missing)))} missing: "
                         "run oracle/setup_reference.sh")
    golden = oracle.load_golden()["runs"]
    digests: dict[str, str] = {}
    bases: dict[str, Made] = {}     # a LoRA base case -> its f16 output, made once
    loaded = failed = unmade = refused = 0
    for run in runs:
        made = made_as_recorded(run, golden, digests)
        if made.path is None:
            unmade += 1
            print(f"FAIL {run.name:<34} not loaded: {made.problem}")
            continue
        base = None
        if run.adapter:
            if run.case not in bases:
                bases[run.case] = made_as_recorded(oracle.RUNS_BY_NAME[run.case], golden, digests)
            base = bases[run.case]
            if base.path is None:
                unmade += 1
                print(f"FAIL {run.name:<34} not loaded: its base {run.case}: {base.problem}")
                continue
        result = load(base.path if base else made.path, made.path if base else None, tokens, timeout)
        if run.refused:     # what the runtime makes of the file bankml refuses: shown, either way right
            refused += 1
            said = f"loaded, generated {result.line}" if result.ok else result.line
            print(f"ok   {run.name:<34} refused by bankml; llama.cpp's own file: {said}")
            if not keep:
                made.remove()
        elif result.ok:
            loaded += 1
            print(f"ok   {run.name:<34} loaded, generated {result.line}")
            if not keep:
                made.remove()
        else:
            failed += 1
            print(f"FAIL {run.name:<34} {result.line}  (kept: {made.path})")
        sys.stdout.flush()
    for base in bases.values():
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
    args = p.parse_args(argv)
    return check_runs(selected_runs(args.runs, p), args.tokens, args.timeout, args.keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
