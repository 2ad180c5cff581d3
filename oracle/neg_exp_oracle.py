#!/usr/bin/env python3
"""What llama.cpp's -torch.exp(A_log) gives for every BF16 value, on every CPU capability torch
dispatches to (issue 36: Qwen3.5's ssm_a).

prepare_tensors widens a BF16 tensor to float32 before modify_tensors, so Qwen3NextModel's
-torch.exp(data) is float32 exp of the widened value, which torch does not round correctly
everywhere.  bankml_convert computes minus the correctly rounded float32 exp (neg_exp_bf16_bits,
its exceptions table left out) and embeds the patterns where torch differs; this records, for all
65,536 BF16 patterns, torch's result on a 65,536-value tensor (the vector path) and on 1-value
tensors (the tail), under ATEN_CPU_CAPABILITY avx512, avx2 and default: the exceptions to the
rule and the sha256 of the whole table (65,536 float32 results, little-endian, in pattern order).

    python3 oracle/neg_exp_oracle.py --record     # runs the reference venv's torch three times
    python3 oracle/neg_exp_oracle.py              # prints the summary, records nothing

Standard library here; the measuring runs in the reference venv (oracle/.ref, or $BANKML_REF_DIR).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import bankml_convert as bc  # noqa: E402

RECORDED = HERE / "recorded" / "neg_exp.json"
CAPABILITIES = ("avx512", "avx2", "default")

# Run in the reference venv: -exp of every BF16 pattern widened to float32, as llama.cpp computes it,
# once as one tensor and once one value at a time; the results' bits, as hex of little-endian bytes.
MEASURE = r"""
import json, torch
torch.set_num_threads(1)
bits = torch.arange(65536, dtype=torch.int32)
wide = (bits << 16).view(torch.float32)
vector = (-torch.exp(wide)).numpy().tobytes().hex()
scalar = b"".join((-torch.exp(wide[i:i + 1])).numpy().tobytes() for i in range(65536)).hex()
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                  "vector": vector, "scalar": scalar}))
"""


def rule_bits(pattern: int) -> int:
    """bankml_convert's rule without its exceptions table."""
    saved = dict(bc._NEG_EXP_BF16_EXCEPTIONS)
    bc._NEG_EXP_BF16_EXCEPTIONS.clear()
    try:
        return bc.neg_exp_bf16_bits(pattern)
    finally:
        bc._NEG_EXP_BF16_EXCEPTIONS.update(saved)


def main(argv: list[str]) -> int:
    python = Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref")) / "venv" / "bin" / "python"
    tables = {}
    for cap in CAPABILITIES:
        p = subprocess.run([str(python), "-c", MEASURE], capture_output=True, text=True,
                           env=dict(os.environ, ATEN_CPU_CAPABILITY=cap), check=True)
        run = json.loads(p.stdout)
        for path in ("vector", "scalar"):
            tables[f"{run['capability']}/{path}"] = bytes.fromhex(run[path])
    distinct = {hashlib.sha256(t).hexdigest() for t in tables.values()}
    table = next(iter(tables.values()))
    results = struct.unpack("<65536I", table)
    rules = [rule_bits(i) for i in range(65536)]
    exceptions = {i: r for i, r in enumerate(results) if r != rules[i]}
    print(f"torch {run['torch']}: {len(distinct)} distinct table(s) over {', '.join(tables)}; "
          f"{len(exceptions)} exceptions to the correctly rounded rule")
    for i, r in sorted(exceptions.items()):
        print(f"  bf16 {i:04x}: torch {r:08x}, rule {rules[i]:08x}")
    if len(distinct) != 1:
        print("torch differs between capabilities or paths: the table is not one table")
        return 1
    if "--record" in argv:
        RECORDED.write_text(json.dumps({
            "command": "python3 oracle/neg_exp_oracle.py --record",
            "reference": f"torch {run['torch']}, capabilities {', '.join(tables)}",
            "table_sha256": distinct.pop(),
            "exceptions": {f"{i:04x}": f"{r:08x}" for i, r in sorted(exceptions.items())}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
