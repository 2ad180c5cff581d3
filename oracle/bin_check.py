#!/usr/bin/env python3
"""torch reads the pytorch_model*.bin files make_models.py writes as bankml_convert's reader does.

    oracle/.ref/venv/bin/python oracle/bin_check.py [CASE ...]    # default: every bin case

make_models.py writes the .bin cases with the standard library (so the tests can make them);
this checks, for each file, that torch.load(map_location="cpu", mmap=True, weights_only=True) --
llama.cpp's call -- gives the same names in the same order and the same bytes for every tensor as
bankml_convert.read_checkpoint's byte ranges.  Prints one line per file; exit 1 on a difference.
"""

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "oracle"))
import bankml_convert as bc  # noqa: E402
import make_models as mm  # noqa: E402


def check(path: Path) -> str:
    sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    ck = bc.read_checkpoint(path)
    if list(sd) != [t.name for t in ck.tensors]:
        return "names or order differ"
    with open(path, "rb") as f:
        for t in ck.tensors:
            f.seek(t.start)
            if sd[t.name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() != f.read(t.nbytes):
                return f"{t.name}: bytes differ"
    return ""


def main() -> int:
    names = sys.argv[1:] or [c.name for c in mm.CASES if c.weights != "safetensors" and not c.full_size]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = mm.make_case(mm.CASES_BY_NAME[name], Path(tmp))
            for path in sorted(out.glob("*.bin")):
                problem = check(path)
                bad += bool(problem)
                print(f"{'FAIL' if problem else 'ok  '} {name}/{path.name} {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
