#!/usr/bin/env python3
"""Small torch.save files and what torch itself reads from them: the checkpoint reader's fixtures.

    oracle/.ref/venv/bin/python oracle/torch_fixtures.py oracle/fixtures/torch

writes each NAME.pt (real torch.save output, fixed seeds) and expected.json: per file its format,
and per tensor what torch.load(weights_only=False ... only on these files this script made) gives --
dtype, shape, stride, storage offset, whether contiguous, and the sha256 of t.contiguous()'s
bytes -- so the tests compare bankml_convert's reader with torch on files torch wrote.
"""

import collections
import hashlib
import json
import sys
from pathlib import Path

import torch

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
          torch.uint16: "U16"}


def mnist(dtype=torch.float32, hidden=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(collections.OrderedDict([
        ("fc1", torch.nn.Linear(784, hidden)), ("fc2", torch.nn.Linear(hidden, 10))]))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return collections.OrderedDict((k, v.to(dtype)) for k, v in net.state_dict().items())


def small(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return collections.OrderedDict([("fc1.weight", torch.randn(6, 5, generator=g).to(dtype)),
                                    ("fc1.bias", torch.randn(6, generator=g).to(dtype))])


def views():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(4, 6, generator=g)
    return {"base": base, "same": base, "rows": base[1:3], "column": base[:, 2],
            "transposed": base.t(), "strided": base[:, ::2], "expanded": torch.randn(3, generator=g).expand(2, 3),
            "scalar": torch.tensor(1.5), "empty": torch.zeros(0, 3), "i64": torch.arange(5),
            "flags": torch.tensor([True, False, True]), "i8": torch.arange(-3, 3, dtype=torch.int8),
            "u16": torch.arange(4, dtype=torch.int32).to(torch.uint16)}


def f64_edges():
    # Doubles whose float32 rounding is delicate: ties, the overflow boundary, subnormals, NaN payloads.
    bits = [0x3FF0000010000000, 0x3FF0000030000000, 0x3FF000000FFFFFFF, 0x47EFFFFFEFFFFFFF,
            0x47EFFFFFF0000000, 0x47F0000000000000, 0xC7EFFFFFF0000000, 0x36A0000000000000,
            0x3690000000000000, 0x3690000000000001, 0x3680000000000000, 0x0000000000000001,
            0x7FF8000000000001, 0x7FF0000000000001, 0xFFF4000000000000, 0x7FF0000000000000,
            0x8000000000000000, 0x7FEFFFFFFFFFFFFF, 0x3E70000000000000, 0x380FFFFFFFFFFFFF]
    return torch.tensor([b - (1 << 64) if b >> 63 else b for b in bits], dtype=torch.int64).view(torch.float64)


def mnist_f64():
    sd = mnist(torch.float64, hidden=16, seed=5)
    edges = f64_edges()
    sd["fc1.bias"][:len(edges)] = edges[:16]
    sd["fc2.bias"][:4] = edges[16:]
    return sd


def cases():
    # MNIST state dicts as ggml's example saved them (fc1/fc2 Linear layers), for the ggml job.
    yield "mnist-f32", mnist(), {}
    yield "mnist-f16", mnist(torch.float16, seed=3), {}
    yield "mnist-h16-bf16", mnist(torch.bfloat16, hidden=16, seed=4), {}
    yield "mnist-h16-f64", mnist_f64(), {}
    yield "mnist-h16-parameters", collections.OrderedDict(
        (k, torch.nn.Parameter(v)) for k, v in mnist(hidden=16, seed=6).items()), {}
    yield "mnist-h16-protocol4", mnist(hidden=16, seed=7), {"pickle_protocol": 4}
    yield "mnist-h16-legacy", mnist(hidden=16, seed=8), {"_use_new_zipfile_serialization": False}
    yield "mnist-h1-squeeze", mnist(hidden=1, seed=9), {}
    # Checkpoint shapes for the reader itself.
    yield "small-f16", small(torch.float16), {}
    yield "small-bf16", small(torch.bfloat16), {}
    yield "small-f64", small(torch.float64), {}
    yield "small-legacy", small(), {"_use_new_zipfile_serialization": False}
    yield "small-protocol4", small(), {"pickle_protocol": 4}
    yield "small-dict", dict(small()), {}
    params = collections.OrderedDict((k, torch.nn.Parameter(v)) for k, v in small().items())
    yield "small-parameters", params, {}
    torch.manual_seed(11)
    module = torch.nn.Linear(5, 6)
    yield "module-state-dict", module.state_dict(), {}
    yield "views", views(), {}
    yield "views-legacy", {k: v for k, v in views().items() if k != "u16"}, {"_use_new_zipfile_serialization": False}


def described(sd):
    rows = []
    for name, t in sd.items():
        data = t.detach().contiguous()
        raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
        rows.append({"name": name, "dtype": DTYPES[t.dtype], "shape": list(t.shape), "stride": list(t.stride()),
                     "storage_offset": t.storage_offset(), "contiguous": t.is_contiguous(),
                     "sha256": hashlib.sha256(raw).hexdigest()})
    return rows


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    expected = {"command": "oracle/.ref/venv/bin/python oracle/torch_fixtures.py oracle/fixtures/torch",
                "torch": torch.__version__, "files": {}}
    for name, sd, kwargs in cases():
        path = out / f"{name}.pt"
        torch.save(sd, path, **kwargs)
        back = torch.load(path, weights_only=False)     # files this script just wrote
        expected["files"][path.name] = {
            "format": "legacy" if kwargs.get("_use_new_zipfile_serialization") is False else "zip",
            "tensors": described(back)}
    # The ggml job's safetensors input: the F16 MNIST state dict as safetensors writes it.
    import safetensors.torch
    safetensors.torch.save_file(torch.load(out / "mnist-f16.pt", weights_only=True), str(out / "mnist-f16.safetensors"))
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
