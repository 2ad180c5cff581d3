#!/usr/bin/env python3
"""The oracle: run llama.cpp's convert_hf_to_gguf.py and bankml_convert on the same generated
model directories and compare the files sha256 for sha256.

    python3 oracle/oracle.py record [RUN ...]    # llama.cpp's sha256s -> oracle/recorded/golden.json
    python3 oracle/oracle.py compare [RUN ...]   # both converters; exit 1 on any mismatch
    python3 oracle/oracle.py names               # gguf-py's name heuristics vs bankml's, every id
    python3 oracle/oracle.py chkhsh DIR ...      # llama.cpp's pre-tokenizer hash of a tokenizer
    python3 oracle/oracle.py inspect [RUN ...]   # bankml's inspect vs gguf-py's reader (default: full size)
    python3 oracle/oracle.py list

Standard library only; the reference runs in its own venv (oracle/setup_reference.sh, called here
when needed).  The expected sha256s in test_bankml_convert.py come from `record` and nothing else.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import make_models  # noqa: E402

GOLDEN = HERE / "recorded" / "golden.json"
WORK = Path(os.environ.get("BANKML_ORACLE_WORK", ROOT / "build" / "oracle"))


@dataclass(frozen=True)
class Run:
    """One comparison: a generated case, the flags both converters get, and what bankml must do."""
    name: str
    case: str
    args: tuple[str, ...] = ()
    refused: bool = False       # bankml_convert must refuse (llama.cpp converts it another way)

    @property
    def outtype(self) -> str:
        return self.args[self.args.index("--outtype") + 1] if "--outtype" in self.args else "f16"


OTHER_OUTTYPES = ("f32", "bf16", "q8_0", "auto")
RUNS: tuple[Run, ...] = tuple(
    [Run(c.name, c.name, ("--outtype", "f16")) for c in make_models.CASES]
    + [Run("model-name", "bf16", ("--outtype", "f16", "--model-name", "mindx-gen39 merged"))]
    # Every other output type on each source dtype (with special values), on a shape whose rows
    # are not whole Q8_0 blocks (llama.cpp's F16 fallback), on the full-size model, and on every
    # SentencePiece Llama/Mistral case.
    + [Run(f"{case}-{t}", case, ("--outtype", t))
       for case in ("bf16", "f16", "f32", "shape-360m-instruct", "example", "full-135m-instruct",
                    *(c.name for c in make_models.SPM_CASES))
       for t in OTHER_OUTTYPES])
RUNS_BY_NAME = {r.name: r for r in RUNS}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def reference_dir() -> Path:
    out = subprocess.run(["bash", str(HERE / "setup_reference.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()
    return Path(out[-1])


def reference_python() -> Path:
    return Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref")) / "venv" / "bin" / "python"


def case_dir(run: Run) -> Path:
    case = make_models.CASES_BY_NAME[run.case]
    d = WORK / "cases" / case.name / case.directory_name
    if not (d / "config.json").is_file():
        make_models.make_case(case, d.parent)
    return d


def reference_command(run: Run, model_dir: Path, out: Path) -> list[str]:
    ref = reference_dir()
    return [str(reference_python()), str(ref / "convert_hf_to_gguf.py"), str(model_dir),
            "--outfile", str(out), *run.args]


def run_reference(run: Run) -> tuple[Path, float]:
    model_dir = case_dir(run)
    out = WORK / "llama.cpp" / f"{run.name}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # The directory is passed relative to its parent, as a user would, so general.name comes
    # from the directory's own name in both converters.
    cmd = reference_command(run, Path(model_dir.name), out.resolve())
    p = subprocess.run(cmd, cwd=model_dir.parent, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"llama.cpp failed on {run.name}")
    return out, time.perf_counter() - start


def run_bankml(run: Run) -> tuple[subprocess.CompletedProcess, Path]:
    model_dir = case_dir(run)
    out = WORK / "bankml" / f"{run.name}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    cmd = [sys.executable, str(ROOT / "bankml_convert.py"), model_dir.name, "-o", str(out.resolve()), *run.args]
    return subprocess.run(cmd, cwd=model_dir.parent, capture_output=True, text=True), out


def inputs_digest(model_dir: Path) -> str:
    """One sha256 over every file of a generated case (name and content), to catch generator drift."""
    h = hashlib.sha256()
    for f in sorted(model_dir.iterdir()):
        if f.is_file():
            h.update(f"{f.name}\0{sha256_of(f)}\n".encode())
    return h.hexdigest()


def load_golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {"runs": {}}


def record(runs: list[Run]) -> int:
    golden = load_golden()
    golden["reference"] = "llama.cpp convert_hf_to_gguf.py @ 0c1e57098 (llama-cpp-python 0.3.36 sdist)"
    golden["recorded_with"] = "python3 oracle/oracle.py record " + " ".join(r.name for r in runs)
    for run in runs:
        out, seconds = run_reference(run)
        entry = {"case": run.case, "dir": case_dir(run).name, "args": list(run.args),
                 "inputs_sha256": inputs_digest(case_dir(run)),
                 "sha256": sha256_of(out), "bytes": out.stat().st_size,
                 "command": "convert_hf_to_gguf.py " + shlex.join([case_dir(run).name, "--outfile", "OUT", *run.args]),
                 "refused_by_bankml": run.refused}
        golden["runs"][run.name] = entry
        print(f"{run.name:<26} {entry['sha256']}  {entry['bytes']:>12,} B  {seconds:5.1f} s")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    return 0


def compare(runs: list[Run], use_recorded: bool) -> int:
    golden = load_golden()["runs"]
    failures = 0
    for run in runs:
        if use_recorded and run.name in golden:
            ref_sha = golden[run.name]["sha256"]
            ref_out = None
        else:
            ref_out, _ = run_reference(run)
            ref_sha = sha256_of(ref_out)
        p, out = run_bankml(run)
        if run.refused:
            ok = p.returncode == 2 and "refuse:" in p.stderr and not out.exists()
            print(f"{'ok' if ok else 'FAIL':<4} {run.name:<26} refused: {p.stderr.strip()[:100]}")
            failures += not ok
            continue
        if p.returncode != 0:
            print(f"FAIL {run.name:<26} bankml exit {p.returncode}: {p.stderr.strip()[-300:]}")
            failures += 1
            continue
        ours = sha256_of(out)
        if ours == ref_sha:
            print(f"ok   {run.name:<26} {ours}")
            continue
        failures += 1
        print(f"FAIL {run.name:<26} llama.cpp {ref_sha}\n{'':<32}bankml    {ours}")
        if ref_out is not None:
            print_diff(ref_out, out)
    print(f"oracle: {len(runs)} runs, {failures} mismatches")
    return 1 if failures else 0


def run_in_reference(command: str, rest: list[str]) -> int:
    """names_oracle.py or vocab_oracle.py --chkhsh, in the reference venv with its gguf-py."""
    env = dict(os.environ, PYTHONPATH=str(reference_dir() / "gguf-py"))
    script = ["names_oracle.py"] if command == "names" else ["vocab_oracle.py", "--chkhsh"]
    return subprocess.run([str(reference_python()), str(HERE / script[0]), *script[1:], *rest], env=env).returncode


def inspect_against_gguf_py(runs: list[Run]) -> int:
    """bankml's own output of each run, read by bankml's inspect and by gguf-py's GGUFReader."""
    outs = []
    for run in runs:
        p, out = run_bankml(run)
        if p.returncode != 0:
            raise SystemExit(f"bankml failed on {run.name}: {p.stderr.strip()}")
        outs.append(str(out))
    env = dict(os.environ, PYTHONPATH=str(reference_dir() / "gguf-py"))
    return subprocess.run([str(reference_python()), str(HERE / "inspect_oracle.py"), *outs], env=env).returncode


def print_diff(a: Path, b: Path) -> None:
    try:
        import bankml_convert
        lines = bankml_convert.diff_gguf(a, b)
    except AttributeError:
        sys.path.insert(0, str(ROOT / "parts"))
        import gguf_read
        lines = gguf_read.diff_gguf(a, b)
    for line in lines[:40]:
        print("     " + line)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("record", "compare", "names", "chkhsh", "inspect", "list"))
    p.add_argument("runs", nargs="*", help="run names (default: all but the full-size one; 'all' for every "
                   "run); directories for chkhsh")
    p.add_argument("--recorded", action="store_true",
                   help="compare against oracle/recorded/golden.json instead of running llama.cpp")
    args = p.parse_intermixed_args(argv)
    if args.command in ("names", "chkhsh"):
        return run_in_reference(args.command, args.runs)
    if args.command == "inspect":
        return inspect_against_gguf_py([RUNS_BY_NAME[n] for n in args.runs or ["full-135m-instruct"]])
    if args.command == "list":
        for r in RUNS:
            print(f"{r.name:<26} case={r.case:<26} {' '.join(r.args)}{'  (refused)' if r.refused else ''}")
        return 0
    if args.runs == ["all"]:
        runs = list(RUNS)
    elif args.runs:
        unknown = [n for n in args.runs if n not in RUNS_BY_NAME]
        if unknown:
            p.error(f"unknown runs: {', '.join(unknown)}")
        runs = [RUNS_BY_NAME[n] for n in args.runs]
    else:
        runs = [r for r in RUNS if not make_models.CASES_BY_NAME[r.case].full_size]
    return record(runs) if args.command == "record" else compare(runs, args.recorded)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
