#!/usr/bin/env python3
"""Checks every way a user brings bankml_convert in, from the files a fresh clone has.

    python3 oracle/check_install.py [--keep]        (make check-install; .ci/run runs it first)

In a throwaway directory (never the checkout, whose build/ and *.egg-info stay as they are) it
copies the tracked and not-ignored files twice, as `git clone` would give them, and checks:

  pip install .   into a new venv (default build isolation, so the build backend, hatchling, comes
                  from the package registry as it does for a user); then `bankml-convert --version`, a conversion of
                  example/smollm2-tiny giving llama.cpp's sha256 (oracle/recorded/golden.json, run
                  `example`, the value README shows), and `python -m bankml_convert` doing the same;
  the wheel       `pip wheel . --no-deps` (built at the same time as the install, from the other
                  copy): exactly bankml_convert.py and LICENSE besides the dist-info metadata, whose
                  METADATA must say the module's version, Apache-2.0, requires-python, no
                  dependencies and README.md as the markdown description; installed with
                  --no-index into a second venv it leaves nothing but the module and its metadata;
  Python 3.8       pip install . again with Python 3.8's own pip into a 3.8 venv, when one is found
                  (requires-python's lower bound: the backend pip picks there must build it too),
                  and the installed bankml-convert converting the example to the same sha256;
  vendoring       bankml_convert.py copied alone into an empty directory, run with
                  `python3 -S -I` (and with Python 3.8, the lowest requires-python allows, when one
                  is found): the same bytes;
  -m              `python3 -m bankml_convert` against `python3 bankml_convert.py` there: the same
                  stdout, stderr and exit code for a conversion, --help and a refusal.

The venvs are made --without-pip and pip is the running Python's (3.8's for the 3.8 venv), pointed
at them with --python (pip >= 22.3): ensurepip would install the same pip into each venv again.
Every build keeps pip's build isolation, the path a user takes and the one that reads
[build-system] requires. Quiet on success (one line); on a failure it prints what failed,
the command and its output, and exits 1.
"""

from __future__ import annotations

import ast
import email.parser
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE = "bankml_convert"
DIST = "bankml-convert"
EXAMPLE = Path("example") / "smollm2-tiny"
OUT = "smollm2-tiny-F16.gguf"
TIMEOUT = 600
REQUIRES_PYTHON = ">=3.8"  # pyproject.toml's; README says "3.8 or newer"; oldest_python() runs it


class Failed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def shown(p: subprocess.CompletedProcess) -> str:
    cmd = " ".join(str(a) for a in p.args)
    out = "\n".join(f"  | {line}" for line in (p.stdout + p.stderr).splitlines()[-40:])
    return f"command: {cmd}\nexit {p.returncode}, output (last 40 lines):\n{out}"


def run(args, what: str, cwd=None, code: int = 0) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
                       stdin=subprocess.DEVNULL)
    if p.returncode != code:
        raise Failed(f"{what}: expected exit {code}\n{shown(p)}")
    return p


def finish(p: subprocess.Popen, what: str) -> None:
    out, err = p.communicate(timeout=TIMEOUT)
    done = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if p.returncode != 0:
        raise Failed(f"{what}\n{shown(done)}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_sha256() -> str:
    """llama.cpp's sha256 for the example at f16, as recorded by the oracle; README must show it."""
    run_ = json.loads((ROOT / "oracle" / "recorded" / "golden.json").read_text())["runs"]["example"]
    check(run_["args"] == ["--outtype", "f16"], f"golden.json's run 'example' is not f16: {run_['args']}")
    check(run_["sha256"] in (ROOT / "README.md").read_text(),
          f"README.md does not show the example's sha256 {run_['sha256']} (oracle/recorded/golden.json)")
    return run_["sha256"]


def module_version() -> str:
    tree = ast.parse((ROOT / f"{MODULE}.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise Failed(f"{MODULE}.py has no __version__")


def copy_as_cloned(dest: Path) -> None:
    """The files a clone would have: tracked and new not-ignored ones, as they are in the work tree."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        names = [n for n in listed.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = None
    if names is None:  # not a git work tree (an unpacked archive): everything but what git ignores
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
            ".git", "build", "__pycache__", "*.pyc", "*.egg-info", ".ref", "*.part"))
        return
    for name in names:
        src = ROOT / name
        if src.is_file():  # a deleted but still tracked file is not in a clone of the work tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def new_venv(path: Path) -> Path:
    run([sys.executable, "-m", "venv", "--without-pip", path], f"python3 -m venv {path.name}")
    return path / "bin"


def pip(python: Path | None, command: str, *args) -> list:
    target = ["--python", python] if python else []
    quiet_root = ["--root-user-action=ignore"] if command == "install" else []  # CI runs as root
    return [sys.executable, "-m", "pip", *target, "--disable-pip-version-check", "--no-input", command,
            *quiet_root, *args]


def site_packages(venv_bin: Path) -> Path:
    p = run([venv_bin / "python", "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            "finding the venv's site-packages")
    return Path(p.stdout.strip())


def only_the_module(venv_bin: Path, version: str, how: str) -> None:
    site = site_packages(venv_bin)
    dist_info = f"{MODULE}-{version}.dist-info"
    left = sorted(p.name for p in site.iterdir() if p.name not in ("__pycache__", f"{MODULE}.py", dist_info))
    check(not left, f"{how}: the venv has more than the module and its metadata: {left}")
    check((site / dist_info).is_dir(), f"{how}: no {dist_info} in {site}")
    check((site / f"{MODULE}.py").read_bytes() == (ROOT / f"{MODULE}.py").read_bytes(),
          f"{how}: the installed {MODULE}.py differs from the checkout's")


def convert_in(cwd: Path, command: list, expected: str, what: str) -> subprocess.CompletedProcess:
    """Runs a conversion of the example into cwd/OUT; checks the printed and the actual sha256."""
    out = cwd / OUT
    if out.exists():
        out.unlink()
    p = run(command, what, cwd=cwd)
    check(p.stdout == f"{expected}  {OUT}\n",
          f"{what}: printed {p.stdout!r}, expected llama.cpp's sha256 {expected}\n{shown(p)}")
    check(out.is_file() and sha256(out) == expected, f"{what}: {out} is not llama.cpp's bytes ({expected})")
    check(not list(cwd.glob("*.part")), f"{what}: a .part was left in {cwd}")
    return p


def check_metadata(wheel: Path, src: Path, version: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = sorted(z.namelist())
        dist_info = f"{MODULE}-{version}.dist-info/"
        payload = [n for n in names if not n.startswith(dist_info)]
        check(payload == [f"{MODULE}.py"],
              f"the wheel holds more than {MODULE}.py outside its dist-info: {payload}")
        licences = [n for n in names if n.startswith(dist_info + "licenses/")]
        check(licences == [dist_info + "licenses/LICENSE"], f"the wheel's licence files are {licences}")
        extra = sorted(set(names) - set(payload) - set(licences) - {
            dist_info + n for n in ("METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt")})
        check(not extra, f"unexpected files in the wheel: {extra}")
        check(z.read(f"{MODULE}.py") == (src / f"{MODULE}.py").read_bytes(), f"the wheel's {MODULE}.py differs")
        check(z.read(licences[0]) == (src / "LICENSE").read_bytes(), "the wheel's LICENSE differs from LICENSE")
        meta = email.parser.Parser().parsestr(z.read(dist_info + "METADATA").decode("utf-8"))
        wheel_info = z.read(dist_info + "WHEEL").decode()
        entry_points = z.read(dist_info + "entry_points.txt").decode()
    licence_text = (src / "LICENSE").read_text()
    check(licence_text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in licence_text,
          "LICENSE is not the Apache License 2.0 the metadata declares")
    want = {"Name": DIST, "Version": version, "License-Expression": "Apache-2.0",
            "Requires-Python": REQUIRES_PYTHON, "Description-Content-Type": "text/markdown",
            "License-File": "LICENSE"}
    for key, value in want.items():
        check(meta.get_all(key) == [value], f"METADATA {key}: {meta.get_all(key)}, expected [{value!r}]")
    check(not meta.get_all("Requires-Dist"), f"METADATA declares dependencies: {meta.get_all('Requires-Dist')}")
    check(not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")],
          "METADATA has a License classifier besides License-Expression")
    check(meta.get_payload() == (src / "README.md").read_text(encoding="utf-8"),
          "METADATA's description is not README.md as it is")
    check("Root-Is-Purelib: true" in wheel_info and "Tag: py3-none-any" in wheel_info,
          f"the wheel is not pure Python for any platform:\n{wheel_info}")
    check(f"{DIST} = {MODULE}:main" in entry_points, f"no {DIST} console script:\n{entry_points}")
    check(wheel.name == f"{MODULE}-{version}-py3-none-any.whl", f"the wheel is named {wheel.name}")


def oldest_python() -> Path | None:
    """A Python 3.8 to run the vendored file with (requires-python's lower bound), if there is one."""
    roots = [os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv")]
    candidates = sorted(g for r in roots if r
                        for g in glob.glob(os.path.join(r, "versions", "3.8*", "bin", "python3.8")))
    candidates += [c for c in (shutil.which("python3.8"), "/usr/bin/python3.8") if c]  # a pyenv shim may refuse
    for c in candidates:
        try:
            p = subprocess.run([c, "-S", "-I", "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if p.returncode == 0 and p.stdout.strip() == "(3, 8)":
            return Path(c)
    return None


def same_as_script(ran: dict, what: str) -> None:
    script, dash_m = ran["script"], ran["-m"]
    check((script.stdout, script.stderr, script.returncode) == (dash_m.stdout, dash_m.stderr, dash_m.returncode),
          f"python3 -m {MODULE} {what} differs from python3 {MODULE}.py:\n"
          f"script: exit {script.returncode} {script.stdout!r} {script.stderr!r}\n"
          f"-m:     exit {dash_m.returncode} {dash_m.stdout!r} {dash_m.stderr!r}")


def vendored_and_dash_m(tmp: Path, src: Path, example: Path, expected: str, old: Path | None) -> str:
    vend = tmp / "vendored"
    vend.mkdir()
    shutil.copy2(src / f"{MODULE}.py", vend)
    script = [sys.executable, "-S", "-I", f"{MODULE}.py"]
    # -I would drop the current directory from sys.path, which is what -m imports the copy from.
    dash_m = [sys.executable, "-S", "-E", "-s", "-m", MODULE]
    ran = {"script": convert_in(vend, [*script, example, "-o", OUT], expected,
                                "vendored: python3 -S -I bankml_convert.py")}
    left = sorted(p.name for p in vend.iterdir())
    check(left == sorted([f"{MODULE}.py", OUT]), f"vendored: the directory ends with {left}")
    note = ""
    if old is not None:
        convert_in(vend, [old, "-S", "-I", f"{MODULE}.py", example, "-o", OUT], expected,
                   f"vendored with {old} (requires-python >=3.8)")
    else:
        note = " (no Python 3.8 here: requires-python's lower bound neither installed nor run)"
    ran["-m"] = convert_in(vend, [*dash_m, example, "-o", OUT], expected, f"python3 -m {MODULE}")
    same_as_script(ran, "DIR -o OUT.gguf")
    # The usage (which names the program) and a refusal the same way too.
    for args, code in ((["--help"], 0), ([example, "-o", "refused.gguf", "--outtype", "q4_k"], 2)):
        for command, how in ((script, "script"), (dash_m, "-m")):
            ran[how] = run([*command, *args], f"{how}: {' '.join(map(str, args))}", cwd=vend, code=code)
        same_as_script(ran, " ".join(map(str, args)))
    return note


def main() -> int:
    keep = "--keep" in sys.argv[1:]
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="bankml-check-install-"))
    try:
        expected = expected_sha256()
        version = module_version()
        a, b = tmp / "clone-install", tmp / "clone-wheel"
        copy_as_cloned(a)
        copy_as_cloned(b)
        venv_install = new_venv(tmp / "venv-install")
        # The two builds each set up an isolated build environment and wait on the registry: together.
        installing = subprocess.Popen([str(x) for x in pip(venv_install / "python", "install", "-q", a)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      stdin=subprocess.DEVNULL, cwd=tmp)
        dist = tmp / "dist"
        building = subprocess.Popen([str(x) for x in pip(None, "wheel", "-q", "--no-deps",
                                                         "-w", dist, b)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    stdin=subprocess.DEVNULL, cwd=tmp)
        old = oldest_python()
        installing_old = None
        if old is not None:
            c = tmp / "clone-install-3.8"
            copy_as_cloned(c)
            venv_old = tmp / "venv-3.8"
            run([old, "-m", "venv", "--without-pip", venv_old], "python3.8 -m venv")
            # 3.8's own pip: a newer pip than 3.8 runs cannot be pointed at a 3.8 venv.
            installing_old = subprocess.Popen(
                [str(x) for x in (old, "-m", "pip", "--python", venv_old / "bin" / "python",
                                  "--disable-pip-version-check", "--no-input", "install", "-q",
                                  "--root-user-action=ignore", c)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, cwd=tmp)
        started_builds = [p for p in (installing, building, installing_old) if p is not None]
        try:
            note = vendored_and_dash_m(tmp, a, a / EXAMPLE, expected, old)
        except BaseException:
            for p in started_builds:
                p.kill()
                p.communicate()
            raise
        finish(installing, "pip install . into a new venv failed")
        finish(building, "pip wheel . --no-deps failed")

        # the wheel: its contents now; installing it alone goes on while the installed tool runs
        wheels = sorted(dist.glob("*.whl"))
        check(len(wheels) == 1, f"pip wheel made {[w.name for w in wheels]}")
        check_metadata(wheels[0], b, version)
        venv_wheel = new_venv(tmp / "venv-wheel")
        installing_wheel = subprocess.Popen(
            [str(x) for x in pip(venv_wheel / "python", "install", "-q", "--no-index", wheels[0])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, cwd=tmp)

        # pip install .
        work = tmp / "run-install"
        work.mkdir()
        p = run([venv_install / "bankml-convert", "--version"], "bankml-convert --version", cwd=work)
        check(p.stdout.startswith(f"{MODULE} {version} "), f"bankml-convert --version says {p.stdout!r}")
        installed = convert_in(work, [venv_install / "bankml-convert", a / EXAMPLE, "-o", OUT], expected,
                               "pip install . then bankml-convert")
        by_m = convert_in(work, [venv_install / "python", "-I", "-m", MODULE, a / EXAMPLE, "-o", OUT],
                          expected, "pip install . then python -m bankml_convert")
        check((installed.stdout, installed.stderr) == (by_m.stdout, by_m.stderr),
              "the installed bankml-convert and python -m bankml_convert print differently")
        p = run([venv_install / "python", "-I", "-c", "import importlib.metadata as m, bankml_convert as b; "
                 "print(m.version('bankml-convert')); print(b.__file__)"], "the installed metadata", cwd=work)
        got_version, where = p.stdout.split()
        check(got_version == version, f"installed version {got_version}, the module says {version}")
        check(Path(where).is_relative_to(tmp / "venv-install"), f"python -I imports {MODULE} from {where}")
        only_the_module(venv_install, version, "pip install .")

        finish(installing_wheel, "installing the wheel with --no-index (no dependencies) failed")
        p = run([venv_wheel / "bankml-convert", "--version"], "the wheel's bankml-convert --version", cwd=work)
        check(p.stdout.startswith(f"{MODULE} {version} "), f"the wheel's bankml-convert --version: {p.stdout!r}")
        only_the_module(venv_wheel, version, "the wheel")

        if installing_old is not None:
            finish(installing_old, f"pip install . with {old} (requires-python >=3.8) failed")
            convert_in(work, [tmp / "venv-3.8" / "bin" / "bankml-convert", a / EXAMPLE, "-o", OUT], expected,
                       f"pip install . with {old}, then bankml-convert")
            only_the_module(tmp / "venv-3.8" / "bin", version, f"pip install . with {old}")
            note += ", pip install . under Python 3.8 too"
    except Exception as e:  # noqa: BLE001 - every failure ends in the two FAILED lines and exit 1
        if not isinstance(e, (Failed, subprocess.TimeoutExpired, OSError)):
            traceback.print_exc()
        print(f"check-install: FAILED: {e}", file=sys.stderr)
        print(f"check-install: FAILED (work directory {tmp}{'' if keep else ', removed'})", file=sys.stderr)
        return 1
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"check-install: ok: pip install ., wheel ({wheels[0].name}), vendored with -S -I, python -m; "
          f"example sha256 {expected[:8]}... as llama.cpp's; {time.monotonic() - started:.1f} s{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
