#!/usr/bin/env python3
"""The benchmark behind `make bench`: bankml_convert against llama.cpp's converter and a copy floor.

    python3 oracle/bench.py [--rounds 3] [--no-reference] [--scale 3] [--json FILE] [--case C] [--outtypes f16 ...]

On the full-size SmolLM2-135M-Instruct directory (generated under build/bench/ when missing), each
round runs, as whole processes one after another: bankml_convert for every --outtype it supports,
llama.cpp's convert_hf_to_gguf.py (the oracle's reference venv) for the same types, and the floor,
`cp` of the safetensors plus `sha256sum` of the copy. Every run's wall time, peak RSS (wait4's
ru_maxrss) and MB/s over the input are measured; the medians, the ratios and the issue's targets are
printed. bankml's output must equal llama.cpp's, sha256 for sha256, in every round (exit 1 if not).
--scale N also converts a model with N times the layers with bankml, to show whether its memory
stays flat as the model grows.

Standard library only. The reference is never installed from here: without oracle/.ref set up
(oracle/setup_reference.sh) bankml runs alone and its output is checked against
oracle/recorded/golden.json instead. Missed targets are reported, not an error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import bankml_convert  # noqa: E402
import make_models  # noqa: E402
import oracle  # noqa: E402

WORK = Path(os.environ.get("BANKML_BENCH_WORK", ROOT / "build" / "bench"))
OUT = WORK / "out"
FULL_CASE = "full-135m-instruct"
REF_ROOT = Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref"))
REF_CONVERTER = REF_ROOT / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"

BANKML, LLAMA_CPP, FLOOR = "bankml", "llama.cpp", "floor"
FLOOR_OUTTYPE = "cp+sha"

# The targets of project issue 3.
TARGET_WALL_VS_LLAMA_CPP = 0.20
TARGET_WALL_VS_FLOOR = 2.0
TARGET_RSS_MIB = 64.0


# ---------------------------------------------------------------------------------------------
# Models: the generated directories the converters read, made once and reused across benches.
# A marker beside the directory says the generator finished, so a half-written model is redone.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    case: str
    dir: Path
    input_bytes: int    # the safetensors files: what MB/s is measured over

    @property
    def weights(self) -> list[Path]:
        return sorted(self.dir.glob("*.safetensors"))


def model_of(case: make_models.Case) -> Model:
    parent = WORK / "cases" / case.name
    done = parent / ".complete"
    if not done.is_file():
        start = time.perf_counter()
        print(f"bench: generating {case.name} under {parent} ...", file=sys.stderr, flush=True)
        make_models.make_case(case, parent)
        done.touch()
        print(f"bench: generated in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    model_dir = parent / case.directory_name
    return Model(case.name, model_dir, sum(p.stat().st_size for p in model_dir.glob("*.safetensors")))


def reference_ready() -> bool:
    return (REF_ROOT / "venv" / ".complete").is_file() and REF_CONVERTER.is_file()


# ---------------------------------------------------------------------------------------------
# One measured run: a child process timed from spawn to reap, its peak RSS from wait4, its output
# hashed (untimed) and deleted, and the disk synced so the next run pays no one else's writeback.
# ---------------------------------------------------------------------------------------------

# Runs its arguments as a child and writes "wall_s max_rss_kib exit_code" to the file named first.
# Why a launcher: Linux starts a process's ru_maxrss at the high-water RSS of the memory it was
# forked from (exec keeps the old mm's peak, and subprocess's vfork shares the parent's), so a child
# spawned by this bench would report the bench's own peak (the generator's buffers, 130+ MiB) when
# its real one is lower. Forked from this small interpreter (about 7 MiB), it reports its own.
LAUNCHER = """\
import os, sys, time
result, argv = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(result, "w") as f:
    f.write(f"{wall!r} {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""

@dataclass(frozen=True)
class Run:
    tool: str
    outtype: str
    model: str          # the directory's name
    round: int
    wall_s: float
    max_rss_kib: int    # ru_maxrss: the largest single process of the child's tree, not their sum;
                        # never below the launcher's RSS (about 7 MiB)
    input_bytes: int
    output_bytes: int
    output_sha256: str

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / self.wall_s


def tool_command(tool: str, outtype: str, model: Model, out: Path) -> list[str]:
    # Both converters get the directory relative to its parent, as a user would type it;
    # general.name comes from the directory's name.
    if tool == BANKML:
        return [sys.executable, str(ROOT / "bankml_convert.py"), model.dir.name,
                "-o", str(out), "--outtype", outtype]
    if tool == LLAMA_CPP:
        return [str(oracle.reference_python()), str(REF_CONVERTER), model.dir.name,
                "--outfile", str(out), "--outtype", outtype]
    if tool == FLOOR:
        (weights,) = model.weights  # the full-size cases are one file
        return ["sh", "-c", f"cp {shlex.quote(str(weights))} {shlex.quote(str(out))} "
                            f"&& sha256sum {shlex.quote(str(out))}"]
    raise ValueError(f"unknown tool {tool}")


def output_path(tool: str, outtype: str, model: Model) -> Path:
    if tool == FLOOR:
        return OUT / model.weights[0].name
    return OUT / f"{tool}-{outtype}.gguf"


def measure(tool: str, outtype: str, model: Model, round_no: int) -> Run:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    out = output_path(tool, outtype, model)
    log = WORK / f"last-{tool}.log"
    cmd = tool_command(tool, outtype, model, out)
    result = WORK / "last-result.txt"
    result.unlink(missing_ok=True)
    with open(log, "wb") as log_file:
        subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, str(result), *cmd],
                       cwd=model.dir.parent, stdin=subprocess.DEVNULL, stdout=log_file,
                       stderr=subprocess.STDOUT, check=True)
    wall, max_rss_kib, exit_code = result.read_text().split()
    if int(exit_code) != 0 or not out.is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"bench: {tool} --outtype {outtype} failed (exit {exit_code}):\n"
                         f"  {shlex.join(cmd)}\n{tail}")
    run = Run(tool, outtype, model.dir.name, round_no, float(wall), int(max_rss_kib),
              model.input_bytes, out.stat().st_size, oracle.sha256_of(out))
    shutil.rmtree(OUT)
    os.sync()
    print(f"  round {round_no}  {tool:<9} {outtype:<7} {model.dir.name:<26} {run.wall_s:7.2f} s "
          f"{mib(run.max_rss_kib):8.1f} MiB", file=sys.stderr, flush=True)
    return run


def mib(kib: float) -> float:
    return kib / 1024


# ---------------------------------------------------------------------------------------------
# Rounds and checks: the tools alternate inside each round, so drift in the machine's speed
# (the shared second vCPU, writeback) falls on all of them alike.
# ---------------------------------------------------------------------------------------------

def bench_rounds(model: Model, outtypes: Sequence[str], rounds: int, tools: Sequence[str]) -> list[Run]:
    runs = []
    for r in range(1, rounds + 1):
        for tool in tools:
            for outtype in ([FLOOR_OUTTYPE] if tool == FLOOR else outtypes):
                runs.append(measure(tool, outtype, model, r))
    return runs


def recorded_sha256(model: Model, outtype: str) -> Optional[str]:
    """llama.cpp's sha256 for this model and outtype from golden.json, if recorded for these inputs."""
    digest = oracle.inputs_digest(model.dir)
    for entry in oracle.load_golden()["runs"].values():
        if (entry["case"] == model.case and entry["args"] == ["--outtype", outtype]
                and entry["inputs_sha256"] == digest):
            return entry["sha256"]
    return None


def mismatches(runs: Sequence[Run], model: Model, outtypes: Sequence[str], reference_ran: bool) -> list[str]:
    """Every bankml output that is not llama.cpp's; the sources compared are printed on stderr."""
    found = []
    for outtype in outtypes:
        ours = [r for r in runs if r.tool == BANKML and r.outtype == outtype and r.model == model.dir.name]
        if reference_ran:
            theirs = {r.round: r.output_sha256 for r in runs if r.tool == LLAMA_CPP and r.outtype == outtype}
            source = "llama.cpp's output in the same round"
        else:
            recorded = recorded_sha256(model, outtype)
            if recorded is None:
                print(f"bench: {model.dir.name} {outtype}: no reference run and nothing recorded; "
                      "bankml's output is NOT verified", file=sys.stderr)
                continue
            theirs = {r.round: recorded for r in ours}
            source = "oracle/recorded/golden.json"
        print(f"bench: {model.dir.name} {outtype}: bankml checked against {source}", file=sys.stderr)
        for r in ours:
            if r.output_sha256 != theirs[r.round]:
                found.append(f"{r.model} --outtype {outtype} round {r.round}: "
                             f"bankml {r.output_sha256} != llama.cpp {theirs[r.round]}")
    return found


# ---------------------------------------------------------------------------------------------
# Report: medians per tool and outtype, the ratios between tools, and the targets met or missed.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    tool: str
    outtype: str
    wall_median: float
    wall_min: float
    wall_max: float
    rss_median_mib: float
    rss_max_mib: float
    mb_per_s: float     # over the median wall


@dataclass(frozen=True)
class Target:
    outtype: str
    label: str
    value: Optional[float]  # None: not measurable in this bench (no reference run)
    limit: float

    @property
    def verdict(self) -> str:
        return "n/a" if self.value is None else ("PASS" if self.value <= self.limit else "FAIL")


def summaries(runs: Sequence[Run]) -> list[Summary]:
    keys = list(dict.fromkeys((r.tool, r.outtype) for r in runs))
    out = []
    for tool, outtype in keys:
        mine = [r for r in runs if (r.tool, r.outtype) == (tool, outtype)]
        walls = [r.wall_s for r in mine]
        rss = [mib(r.max_rss_kib) for r in mine]
        wall = statistics.median(walls)
        out.append(Summary(tool, outtype, wall, min(walls), max(walls), statistics.median(rss), max(rss),
                           mine[0].input_bytes / 1e6 / wall))
    return out


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else a / b


def targets(by_key: dict[tuple[str, str], Summary], outtype: str) -> list[Target]:
    ours = by_key[(BANKML, outtype)]
    theirs = by_key.get((LLAMA_CPP, outtype))
    floor = by_key[(FLOOR, FLOOR_OUTTYPE)]
    return [
        Target(outtype, f"wall <= {TARGET_WALL_VS_LLAMA_CPP:.2f} x llama.cpp",
               ratio(ours.wall_median, theirs and theirs.wall_median), TARGET_WALL_VS_LLAMA_CPP),
        Target(outtype, f"wall <= {TARGET_WALL_VS_FLOOR:.0f} x floor",
               ours.wall_median / floor.wall_median, TARGET_WALL_VS_FLOOR),
        Target(outtype, f"peak RSS <= {TARGET_RSS_MIB:.0f} MiB (max of rounds)",
               ours.rss_max_mib, TARGET_RSS_MIB),
    ]


def fmt(x: Optional[float], spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def report(model: Model, runs: Sequence[Run], outtypes: Sequence[str]) -> list[Target]:
    rows = summaries(runs)
    by_key = {(s.tool, s.outtype): s for s in rows}
    rounds = max(r.round for r in runs)
    print(f"\n{model.dir.name}: {model.input_bytes:,} B of safetensors, {rounds} rounds, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(f"{'tool':<10} {'outtype':<8} {'wall med':>9} {'min':>7} {'max':>7} {'RSS med':>9} {'MB/s':>7}")
    for s in rows:
        print(f"{s.tool:<10} {s.outtype:<8} {s.wall_median:8.2f}s {s.wall_min:6.2f}s {s.wall_max:6.2f}s "
              f"{s.rss_median_mib:5.0f} MiB {s.mb_per_s:7.0f}")
    all_targets = []
    for outtype in outtypes:
        ours, theirs = by_key[(BANKML, outtype)], by_key.get((LLAMA_CPP, outtype))
        floor = by_key[(FLOOR, FLOOR_OUTTYPE)]
        print(f"\nbankml {outtype} (medians): wall / llama.cpp "
              f"{fmt(ratio(ours.wall_median, theirs and theirs.wall_median))}, "
              f"RSS / llama.cpp {fmt(ratio(ours.rss_median_mib, theirs and theirs.rss_median_mib))}, "
              f"wall / floor {fmt(ours.wall_median / floor.wall_median)}")
        for t in targets(by_key, outtype):
            print(f"  target {t.label:<36} {fmt(t.value):>8}  {t.verdict}")
            all_targets.append(t)
    return all_targets


@dataclass(frozen=True)
class Flatness:
    outtype: str
    small_model: str
    small_bytes: int
    small_rss_mib: float
    large_model: str
    large_bytes: int
    large_rss_mib: float

    @property
    def growth_mib(self) -> float:
        return self.large_rss_mib - self.small_rss_mib


def flatness(small: Model, large: Model, runs: Sequence[Run], outtypes: Sequence[str]) -> list[Flatness]:
    def rss(model: Model, outtype: str) -> float:
        return statistics.median(mib(r.max_rss_kib) for r in runs
                                 if (r.tool, r.outtype, r.model) == (BANKML, outtype, model.dir.name))
    return [Flatness(t, small.dir.name, small.input_bytes, rss(small, t),
                     large.dir.name, large.input_bytes, rss(large, t)) for t in outtypes]


def report_flatness(rows: Sequence[Flatness]) -> None:
    for f in rows:
        print(f"\nflatness, bankml {f.outtype} peak RSS (median): {f.small_rss_mib:.0f} MiB for "
              f"{f.small_bytes / 1e6:.0f} MB ({f.small_model}), {f.large_rss_mib:.0f} MiB for "
              f"{f.large_bytes / 1e6:.0f} MB ({f.large_model}): {f.growth_mib:+.0f} MiB for "
              f"{(f.large_bytes - f.small_bytes) / 1e6:+.0f} MB more input")


def write_json(path: Path, argv: Sequence[str], reference_ran: bool, runs: Sequence[Run],
               found: Sequence[str], target_rows: Sequence[Target], flat: Sequence[Flatness]) -> None:
    doc = {
        "command": shlex.join(["python3", "oracle/bench.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "bankml_version": bankml_convert.__version__,
        "reference": str(REF_CONVERTER) if reference_ran else None,
        "runs": [{**asdict(r), "mb_per_s": r.mb_per_s} for r in runs],
        "mismatches": list(found),
        "targets": [{**asdict(t), "verdict": t.verdict} for t in target_rows],
        "flatness": [{**asdict(f), "growth_mib": f.growth_mib} for f in flat],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds of every run (default 3)")
    p.add_argument("--no-reference", action="store_true", help="do not run llama.cpp's converter")
    p.add_argument("--scale", type=int, metavar="N",
                   help="also run bankml on a model with N times the layers and compare its peak RSS")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the raw measurements here")
    p.add_argument("--case", default=FULL_CASE, choices=sorted(make_models.CASES_BY_NAME), metavar="CASE",
                   help=f"the generated model to convert (default {FULL_CASE}; issue 12's is "
                        "full-llama-3.2-1b-instruct, 2.5 GB; issue 13's full-tinyllama, 2.2 GB)")
    p.add_argument("--outtypes", nargs="+", choices=list(bankml_convert.OUT_TYPES), metavar="TYPE",
                   help="output types to convert to (default: every one bankml supports)")
    args = p.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # the table and stderr's progress stay in order
    if args.rounds < 1 or (args.scale is not None and args.scale < 2):
        p.error("--rounds must be >= 1 and --scale >= 2")

    outtypes = args.outtypes or list(bankml_convert.OUT_TYPES)
    reference_ran = not args.no_reference and reference_ready()
    if not args.no_reference and not reference_ran:
        print(f"bench: llama.cpp's reference is not set up ({REF_ROOT}; run oracle/setup_reference.sh); "
              "running bankml and the floor alone", file=sys.stderr)
    tools = [BANKML, LLAMA_CPP, FLOOR] if reference_ran else [BANKML, FLOOR]

    model = model_of(make_models.CASES_BY_NAME[args.case])
    oracle.sha256_of(model.weights[0])  # reads the input once, so round 1 also finds it in the page cache
    runs = bench_rounds(model, outtypes, args.rounds, tools)
    found = mismatches(runs, model, outtypes, reference_ran)
    target_rows = report(model, runs, outtypes)

    flat: list[Flatness] = []
    if args.scale:
        large = model_of(make_models.scaled_full_case(args.scale))
        large_runs = bench_rounds(large, outtypes, args.rounds, [BANKML])
        found += mismatches(large_runs, large, outtypes, reference_ran=False)
        runs += large_runs
        flat = flatness(model, large, runs, outtypes)
        report_flatness(flat)

    if args.json:
        write_json(args.json, argv, reference_ran, runs, found, target_rows, flat)
    if not reference_ran:
        print("\nllama.cpp was not run: the ratios to it are n/a")
    if found:
        print("\nMISMATCH: bankml's output differs from llama.cpp's:", *found, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
