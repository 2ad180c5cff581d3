"""Oracle: `inspect --json --full` reads a GGUF exactly as gguf-py's GGUFReader does.

Runs in the reference venv with the pinned llama.cpp's gguf-py on the path:

    REF=oracle/.ref/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=$REF/gguf-py oracle/.ref/venv/bin/python oracle/inspect_oracle.py FILE.gguf [...]

For every file: the header (version, counts, alignment, where the data starts), then every key in
order (name, GGUF value type and element type, value) and every tensor in order (name, ggml type,
shape in ggml order, offset from the data and in the file, byte size) of GGUFReader against
bankml_convert's inspect_gguf_json(path, full=True). Prints one line per file and every
disagreement; exits 0 when all agree, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "parts")]

from gguf import GGUFReader, GGUFValueType  # noqa: E402  (the reference's gguf-py, via PYTHONPATH)

try:
    from bankml_convert import inspect_gguf_json  # noqa: E402  (once integrated)
except ImportError:
    from around import inspect_gguf_json  # noqa: E402

# GGUFReader adds the header as fields of its own before the file's keys.
HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


def reader_kv(field) -> dict:
    """A GGUFReader field in the shape inspect_gguf_json gives a key."""
    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        values = field.contents()
        return {"key": field.name, "type": "ARRAY", "element_type": field.types[-1].name,
                "length": len(values), "value": values}
    return {"key": field.name, "type": main.name, "value": field.contents()}


def ours_kv(kv: dict) -> dict:
    keep = ("key", "type", "element_type", "length", "value") if kv["type"] == "ARRAY" else ("key", "type", "value")
    return {k: kv[k] for k in keep}


def reader_tensor(t, data_offset: int) -> dict:
    return {"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in t.shape],
            "offset": int(t.data_offset) - data_offset, "file_offset": int(t.data_offset),
            "bytes": int(t.n_bytes)}


def ours_tensor(t: dict) -> dict:
    return {k: t[k] for k in ("name", "type", "shape", "offset", "file_offset", "bytes")}


def first_difference(a, b) -> str:
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"lengths {len(a)} (gguf-py) and {len(b)} (inspect)"
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y or type(x) is not type(y))
        return f"element {i}: gguf-py {a[i]!r}, inspect {b[i]!r}"
    return f"gguf-py {a!r}, inspect {b!r}"


def compare(path: str) -> list[str]:
    reader = GGUFReader(path)
    ours = inspect_gguf_json(path, full=True)
    problems = []
    header = {
        "version": reader.fields["GGUF.version"].contents(),
        "tensor_count": reader.fields["GGUF.tensor_count"].contents(),
        "kv_count": reader.fields["GGUF.kv_count"].contents(),
        "alignment": int(reader.alignment),
        "data_start": int(reader.data_offset),
    }
    for key, value in header.items():
        if ours[key] != value:
            problems.append(f"header {key}: gguf-py {value!r}, inspect {ours[key]!r}")

    theirs_kvs = [reader_kv(f) for name, f in reader.fields.items() if name not in HEADER_FIELDS]
    our_kvs = [ours_kv(kv) for kv in ours["kvs"]]
    if [k["key"] for k in theirs_kvs] != [k["key"] for k in our_kvs]:
        problems.append(f"keys differ in name or order: gguf-py {[k['key'] for k in theirs_kvs]}, "
                        f"inspect {[k['key'] for k in our_kvs]}")
    for a, b in zip(theirs_kvs, our_kvs):
        for field in a.keys() | b.keys():
            # type() too: gguf-py gives True/False for BOOL and int for the integer types
            if a.get(field) != b.get(field) or type(a.get(field)) is not type(b.get(field)):
                problems.append(f"key {a['key']!r} {field}: {first_difference(a.get(field), b.get(field))}")

    theirs_tensors = [reader_tensor(t, int(reader.data_offset)) for t in reader.tensors]
    our_tensors = [ours_tensor(t) for t in ours["tensors"]]
    if len(theirs_tensors) != len(our_tensors):
        problems.append(f"tensor count: gguf-py {len(theirs_tensors)}, inspect {len(our_tensors)}")
    for a, b in zip(theirs_tensors, our_tensors):
        if a != b:
            problems.append(f"tensor {a['name']!r}: gguf-py {a}, inspect {b}")
    if not problems:
        print(f"{path}: {len(our_kvs)} keys and {len(our_tensors)} tensors agree with gguf-py's GGUFReader "
              f"(header, names, types, values, shapes, offsets, sizes)")
    return problems


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for path in argv:
        problems = compare(path)
        for p in problems:
            print(f"{path}: DIFFERENT {p}")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
