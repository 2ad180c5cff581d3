#!/usr/bin/env python3
"""What torch's float32 pow gives for the powers of Llama 3 rope_freqs that lie near a float32
rounding midpoint, on every CPU capability torch dispatches to (issue 12).

llama.cpp computes rope_freqs.weight as 1 / base ** (arange(0, dim, 2) / dim) in torch float32.
torch's float32 pow (Sleef's powf_u10 on vector chunks, glibc's powf on the tail) is not correctly
rounded and differs by CPU; bankml_convert computes the correctly rounded power and refuses a
config where a power that changes the output lies within 0.1 ulp of a midpoint -- unless this
record shows that torch rounds that power the same way on every capability and both paths.

    python3 oracle/rope_pow_oracle.py --record     # runs the reference venv's torch three times
    python3 oracle/rope_pow_oracle.py              # prints the table, records nothing

Standard library here; the measuring runs in the reference venv (oracle/.ref, or $BANKML_REF_DIR).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import bankml_convert as bc  # noqa: E402

RECORDED = HERE / "recorded" / "rope_pow.json"
CAPABILITIES = ("avx512", "avx2", "default")
# (rope_theta, head_dim, factor, low, high, original context): the real Llama 3.1/3.2 configs, and
# shapes around them.
CONFIGS = [(500000.0, dim, factor, 1.0, 4.0, 8192) for dim in (64, 96, 112, 128) for factor in (32.0, 8.0)]

# Run in the reference venv: base ** exponents as llama.cpp writes it, once on a 64-element tensor
# (vector chunks on every capability) and once on a 1-element one (the scalar tail).
MEASURE = r"""
import json, struct, sys, torch
pairs = json.loads(sys.argv[1])
def bits(x): return struct.unpack('<I', struct.pack('<f', x))[0]
out = {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__, "pows": []}
for base, e in pairs:
    vector = base ** torch.full((64,), e, dtype=torch.float32)
    scalar = base ** torch.full((1,), e, dtype=torch.float32)
    out["pows"].append({"vector": sorted({bits(v) for v in vector.tolist()}), "scalar": bits(scalar.item())})
print(json.dumps(out))
"""


def near_pows() -> list[tuple[float, float, float]]:
    """(float32 base, float32 exponent, ulps to midpoint) of every power in CONFIGS that lies within
    bc._POW_NEAR_MIDPOINT of a midpoint and whose rounding changes a rope factor."""
    found = {}
    for base, dim, factor, low, high, context in CONFIGS:
        rope = bc.Llama3Rope(factor, low, high, context)
        b = bc.rounded_to_f32(base)
        for i in range(0, dim, 2):
            e = bc.rounded_to_f32(i / dim)
            power = bc.f32_pow(b, e)
            if power.ulps_to_midpoint < bc._POW_NEAR_MIDPOINT and (
                    bc.llama3_rope_factor(bc.rounded_to_f32(1 / power.value), rope)
                    != bc.llama3_rope_factor(bc.rounded_to_f32(1 / power.other), rope)):
                found[(b, e)] = power.ulps_to_midpoint
    return [(b, e, d) for (b, e), d in sorted(found.items())]


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def main(argv: list[str]) -> int:
    pows = near_pows()
    python = Path(os.environ.get("BANKML_REF_DIR", HERE / ".ref")) / "venv" / "bin" / "python"
    arg = json.dumps([[b, e] for b, e, _ in pows])
    runs = {}
    for cap in CAPABILITIES:
        p = subprocess.run([str(python), "-c", MEASURE, arg], capture_output=True, text=True,
                           env=dict(os.environ, ATEN_CPU_CAPABILITY=cap), check=True)
        runs[cap] = json.loads(p.stdout)
    entries = []
    for k, (b, e, d) in enumerate(pows):
        correct = f32_bits(bc.f32_pow(b, e).value)
        seen = {f"{cap}/{path}": v for cap in CAPABILITIES
                for path, v in (("vector", runs[cap]["pows"][k]["vector"]), ("scalar", [runs[cap]["pows"][k]["scalar"]]))}
        same = all(v == [correct] for v in seen.values())
        entries.append({"base": b, "exponent": e, "ulps_to_midpoint": round(d, 6),
                        "correctly_rounded": f"{correct:08x}",
                        "torch": {k2: [f"{x:08x}" for x in v] for k2, v in seen.items()},
                        "every_cpu_rounds_correctly": same})
        print(f"{b:>10} ** {e:<20} {d:.4f} ulp  {'same everywhere' if same else 'DIFFERS by CPU'}")
    if "--record" in argv:
        RECORDED.write_text(json.dumps({
            "command": "python3 oracle/rope_pow_oracle.py --record",
            "reference": f"torch {runs['avx512']['torch']}, capabilities "
                         + ", ".join(runs[c]["capability"] for c in CAPABILITIES),
            "configs": CONFIGS, "pows": entries}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
