#!/usr/bin/env python3
"""ggml's MNIST converters run with torch on the state dicts in oracle/fixtures/torch; sha256s recorded.

    oracle/.ref/venv/bin/python oracle/ggml_oracle.py [--record]

Two references, each as ggml wrote it:
- convert-h5-to-ggml.py (ggml examples/mnist, 73999158..879dcb84; shared/seeds/ggml-mnist-converter.md),
  reconstructed below line for line except: the output path is an argument (upstream hard-codes
  models/mnist/ggml-model-f32.bin), torch.load gets weights_only=False (these files are this
  repository's own; torch >= 2.6 refuses protocol 4 otherwise), and .detach().float() before
  .numpy() (upstream crashes on Parameters and on bf16, which numpy lacks -- the "obviously fixed"
  script: float() is exact for f16/bf16, and f64 still goes through numpy's astype below).
- mnist-train-fc.py's GGUF: gguf.GGUFWriter(path, "mnist-fc"), add_tensor(name, squeezed float32)
  per state dict entry, with the pinned llama.cpp's gguf-py.

Without --record it prints each sha256; with it, writes oracle/recorded/ggml.json, which the tests read.
"""

import hashlib
import json
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / ".ref" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "gguf-py"))
import gguf  # noqa: E402

FIXTURES = ROOT / "fixtures" / "torch"
RECORD = ROOT / "recorded" / "ggml.json"


def load(path: Path):
    if path.suffix == ".safetensors":
        import safetensors.torch
        return safetensors.torch.load_file(str(path))      # keys() order: sorted by name
    return torch.load(path, map_location=torch.device("cpu"), weights_only=False)


def convert_h5_to_ggml(state_dict_file: Path, fname_out: Path) -> None:
    state_dict = load(state_dict_file)
    fout = open(fname_out, "wb")
    fout.write(struct.pack("i", 0x67676d6c))  # magic: ggml in hex
    for name in state_dict.keys():
        data = state_dict[name].squeeze().detach()
        data = (data.float() if data.dtype in (torch.float16, torch.bfloat16) else data).numpy()
        n_dims = len(data.shape)
        fout.write(struct.pack("i", n_dims))
        data = data.astype(np.float32)
        for i in range(n_dims):
            fout.write(struct.pack("i", data.shape[n_dims - 1 - i]))
        data.tofile(fout)
    fout.close()


def mnist_fc_gguf(state_dict_file: Path, fname_out: Path) -> None:
    state_dict = load(state_dict_file)
    writer = gguf.GGUFWriter(str(fname_out), "mnist-fc")
    for name in state_dict.keys():
        data = state_dict[name].squeeze().detach()
        data = (data.float() if data.dtype in (torch.float16, torch.bfloat16) else data).numpy()
        writer.add_tensor(name, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# (fixture, writer): the cases recorded.  The squeeze case is recorded too: the script writes it,
# bankml_convert refuses it (ggml's loader cannot read it back).
CASES = [(f, "ggml") for f in ("mnist-f32.pt", "mnist-f16.pt", "mnist-h16-bf16.pt", "mnist-h16-f64.pt",
                                 "mnist-h16-parameters.pt", "mnist-h16-protocol4.pt", "mnist-h16-legacy.pt",
                                 "mnist-h1-squeeze.pt", "mnist-f16.safetensors")] + \
        [(f, "mnist-fc") for f in ("mnist-f32.pt", "mnist-f16.pt", "mnist-f16.safetensors")]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fixture, kind in CASES:
            out = Path(tmp) / f"{fixture}.{kind}"
            (convert_h5_to_ggml if kind == "ggml" else mnist_fc_gguf)(FIXTURES / fixture, out)
            runs[f"{fixture}:{kind}"] = {"input": fixture, "input_sha256": sha256(FIXTURES / fixture),
                                         "kind": kind, "bytes": out.stat().st_size, "sha256": sha256(out)}
            print(f"{fixture:28} {kind:9} {runs[f'{fixture}:{kind}']['sha256']}")
    if "--record" in sys.argv:
        RECORD.write_text(json.dumps({
            "command": "oracle/.ref/venv/bin/python oracle/ggml_oracle.py --record",
            "reference": f"convert-h5-to-ggml.py (reconstructed, see its docstring) and gguf-py's GGUFWriter "
                         f"with torch {torch.__version__}, numpy {np.__version__}",
            "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
