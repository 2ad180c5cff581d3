"""PyYAML and gguf-py's model-card reading against bankml_convert's, document by document.

Run in the reference venv (PyYAML 6.0.4) with the reference's gguf-py on the path; oracle.py does:

    python3 oracle/oracle.py cards            # the corpus: oracle/fixtures/cards/*.md, every key
    python3 oracle/oracle.py cards --record   # also PyYAML's answers -> oracle/recorded/cards.json

or by hand:

    REF=oracle/.ref/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=$REF/gguf-py oracle/.ref/venv/bin/python oracle/cards_oracle.py [--record] [--random N] [--mutants N]

Three parts:

- typing: every string of up to 4 characters over YAML 1.1's number alphabet, and the words and
  timestamps its resolvers know, as a mapping value (and the short ones inside a [ ] list), plus
  hand-written documents (block and flow lists, quoting, escapes, block scalars, folding, comments,
  and the YAML bankml refuses); ``--record`` writes what ``yaml.safe_load`` makes of each.
- corpus: every README front matter under oracle/fixtures/cards/ through gguf-py's load_model_card,
  apply_metadata_heuristic and set_gguf_meta_model (the keys, types and values a GGUFWriter holds,
  each packed to catch what llama.cpp fails to write) beside bankml's general_kvs.  Each card is
  "same", "refused" (bankml refuses; the reason printed) or a silent difference.
- ``--random N``: N generated documents read by both; a document both read must give the same value.
- ``--mutants N``: N cards mutated as ``oracle/fuzz.py --model-card`` mutates them, whole card path
  (gguf-py's keys beside bankml's), counted like the corpus.

Exits 1 on any silent difference.  Test inputs and expected values are never typed in by hand:
test_bankml_convert.py reads them from oracle/recorded/cards.json.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import logging
import math
import random
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAIN = HERE.parent
RECORD_FILE = HERE / "recorded" / "cards.json"
CORPUS = HERE / "fixtures" / "cards"
# The parameter count the corpus keys are computed at: SmolLM2-135M's (as names_oracle.py).
TOTAL_PARAMS = 134_515_008
CORPUS_DIR_NAME = "converted-model"

TYPING_ALPHABET = "01_:.-+eE"
TYPING_WORDS = (
    "yes Yes YES yEs no No NO nO true True TRUE tRUE false False FALSE on On ON oN off Off OFF oFF "
    "y Y n N t f ~ null Null NULL nULL none None .inf .Inf .INF .iNF -.inf +.inf -.Inf .nan .NaN .NAN "
    ".nAn nan inf 0x 0x1F -0x1f 0xg 0b 0b101 -0b1_0 0b2 0o17 0o 017 08 09 0_7 -012 1_000 1__0 _1 1_ "
    "190:20:30 1:30 -1:30 1:60 1:5 1:05:07.5 1:30.25 0:30 00:30 1e10 1E10 1e+10 1.e+10 1.0e10 1.5e-3 "
    "1.5E+03 6.02e23 .5 -.5 +.5 ._5 1. -1. 1.2.3 2024-01-02 2024-1-2 2024-13-01 2024-02-30 "
    "2001-12-14t21:59:43.10-05:00 2001-12-14T21:59:43Z 2001-12-15T02:59:43.1234567Z 0000-01-01 "
    "2024-01-02T25:00:00 2024-01-02T10:61:00 2001-12-14T21:59:43+99 = << < ~~ - -- -a :a ?a a: "
    "1,000 1.000,5 v1.0 3.2.1 1.0.0-rc1 apache-2.0 cc-by-4.0 llama3.2 en zh-Hans C# a#b http://x.y/z"
).split()
# Timestamps with a space between date and time, as the resolver also allows.
TYPING_SPACED = ("2001-12-14 21:59:43.10 -5", "2001-12-14 21:59:43", "2001-12-14  21:59:43 Z",
                 "2024-01-02 10:00:00 +05:30", "2024-01-02 1:02:03")

# Documents model cards are made of, and the YAML bankml refuses; each is read as a whole.
DOCUMENTS = (
    "license: apache-2.0\nlanguage:\n- en\n- fr\ntags: [a, b, 'c d']\n",
    "language:\n  - en\n  - \"no\"\n  - de\n",
    "tags: [text-generation, 'llama', \"q: a\",]\n",
    "tags: [a,\n  b, c,\n]\n",
    "tags: []\nlanguage: [en]\n",
    "tags: [a, [b]]\n",
    "tags: [a, {b: c}]\n",
    "tags: [a b, c]\n",
    "tags: [a: b]\n",
    "tags: [a, b] x\n",
    "tags: [a, , b]\n",
    "tags: [a\n  b]\n",
    "tags: [a # c\n  , b]\n",
    "tags: [-a, https://x.y/z, 'x', \"y\"]\n",
    "base_model:\n  - Qwen/Qwen2.5-0.5B\n  - meta-llama/Llama-3.2-1B\ndatasets:\n- a/b\n",
    "base_model: HuggingFaceTB/SmolLM2-135M\nbase_model_relation: finetune\n",
    "model-index:\n- name: foo\n  results:\n  - task:\n      type: text\n    metrics:\n    - type: acc\n      value: 45.3\n",
    "description: |\n  line one\n  line two\n\n  para\nnext: x\n",
    "description: |-\n  strip\n\n\nnext: x\n",
    "description: |+\n  keep\n\n\nnext: x\n",
    "description: >\n  folded one\n  two\n\n  three\n    indented\n  back\n",
    "description: >-\n  a\n  b\n",
    "description: >+\n  a\n\n",
    "description: |2\n   two extra\n  base\n",
    "description: |\n\n  after blank\n",
    "description: |\n     \n  less than blank\n",
    "description: | # comment\n  text # not a comment\n",
    "description: |\nnext: x\n",
    "description: |x\n  a\n",
    "description: |0\n  a\n",
    "a: multi\n  line plain\n\n  with blank\nb: 1\n",
    "a: plain\n  - dash continues\n",
    "a: plain\n# comment ends it\nb: 2\n",
    "a: plain\n# comment\n  continued\n",
    "a: \"multi\n  line\n\n  quoted \\\n  esc\"\n",
    "a: 'single\n  multi '' line'\n",
    "a: \"tab\\tnew\\nline \\\"q\\\" \\\\ \\/ \\0 \\a \\b \\e \\N \\_ \\L \\P \\x41 \\u00e9 \\U0001F600\"\n",
    "a: \"bad \\q\"\n",
    "a: \"surrogate \\ud800\"\n",
    "a: \"x\" y\n",
    "a: \"space before break \n  next\"\n",
    "a: \"escaped space\\ \n  next\"\n",
    "\"quoted key\": 1\n'single key': 2\n\"k\" : 3\n",
    "yes: 1\nno: 2\n1: a\n1.5: b\n~: c\nnull: d\n2024-01-01: e\n",
    "a: 1\na: 2\n",
    "a: &x 1\nb: *x\n",
    "a: !!str 1\n",
    "a: {b: c}\n",
    "? a\n: b\n",
    "a: b: c\n",
    "a:\n- x\n- y\nb: z\n",
    "- a\n- b\n",
    "just a scalar\n",
    "a: 1\n  b: 2\n",
    "a:\n  b: 1\n   c: 2\n",
    "a:\n  b: 1\n c: 2\n",
    "- a\n  - b\n",
    "- a: 1\n  b: 2\n- c: 3\n",
    "-   a: 1\n    b: 2\n",
    "a: -\n",
    "a: - b\n",
    "a: @x\n",
    "a: `x\n",
    "a: %x\n",
    "a: |\n  ok\n b: 1\n",
    "a: ,x\n",
    "a: x, y\n",
    "a: ]x\n",
    "a: [x]]\n",
    "a: -x\nb: :x\nc: ?x\n",
    "a: x:y\nb: http://a.b/c\n",
    "a: x #y\nb: x#y\n",
    "a:b\n",
    "a: 1 # c\n# full\n  # indented comment\nb: 2\n",
    "a:\n\n  b\n",
    "a:\n  # comment\n  b: 1\n",
    "\n\n",
    "# only a comment\n",
    "a: ~\nb:\nc: ''\nd: \"\"\n",
    "a: \"\"\"\n",
    "a: 'it''s'\n",
    "a: C:\\path\n",
    "a: x\n...\n",
    "a: x\n--- \n",
    "%YAML 1.1\na: x\n",
    "a: [x, \"y\n  z\"]\n",
    "a:    spaced    words  \n",
    "a: 00:30\n",
    "a: \"\\u263A\"\n",
    "a: caf\u00e9 \u4e2d\u6587 \U0001F600\n",
    "a: \x7f\n",
    "a: \u0085x\n",
    "a: \ufeffx\n",
    "   a: 1\n   b: 2\n",
    "a:\n    - x\n    - y\n",
    "a:\n- b: 1\n  c:\n  - d\n- e\n",
    "a: 123456789012345678901234567890\n",
    "a: 1" + ":1" * 200 + ".5\n",
    "a: 1" + ":1" * 200 + "\n",
    "a: " + "7" * 5000 + "\n",
    "a: 0x" + "f" * 5000 + "\n",
    "k" * 1000 + ": v\n",
    "k" * 1030 + ": v\n",
)


def typing_values() -> list[str]:
    """The plain scalars whose YAML 1.1 types are checked, in a fixed order."""
    values = ["".join(p) for n in range(1, 5) for p in itertools.product(TYPING_ALPHABET, repeat=n)]
    return values + list(TYPING_WORDS) + list(TYPING_SPACED)


def typing_documents() -> list[str]:
    """Each value as a mapping value, the shorter ones also inside a [ ] list."""
    values = typing_values()
    docs = [f"v: {v}\n" for v in values]
    docs += [f"v: [{v}]\n" for v in values if len(v) <= 3 or v in TYPING_WORDS]
    return docs


def encoded(value) -> list:
    """A value with its Python type, in JSON: what the record and the tests compare."""
    if value is None:
        return ["null"]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        # Python refuses str() of an int past 4,300 digits; hex has no limit.
        return ["int", str(value) if abs(value) < 10 ** 4000 else hex(value)]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, list):
        return ["list", [encoded(v) for v in value]]
    if isinstance(value, dict):
        return ["map", [[encoded(k), encoded(v)] for k, v in value.items()]]
    if isinstance(value, datetime.datetime):
        return ["datetime", value.isoformat()]
    if isinstance(value, datetime.date):
        return ["date", value.isoformat()]
    raise TypeError(f"unexpected {type(value)}")


def pyyaml_answer(doc: str) -> list:
    import yaml
    try:
        return encoded(yaml.safe_load(doc))
    except yaml.YAMLError as e:
        return ["error", type(e).__name__]
    except (ValueError, OverflowError) as e:      # a constructor's int(), datetime(), ...
        return ["error", type(e).__name__]


def load_ours():
    spec = importlib.util.spec_from_file_location("bankml_convert", MAIN / "bankml_convert.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def our_answer(bc, doc: str) -> list:
    try:
        return encoded(bc.read_card_yaml(doc))
    except bc.CardError as e:
        return ["refused", e.reason]


def same(want: list, got: list) -> bool:
    # NaN is not equal to itself; its repr is.
    return json.dumps(want) == json.dumps(got)


def compare_documents(bc, docs: list[str], answers: list[list]) -> tuple[int, int, int, list[str]]:
    """(same, refused, silent differences, lines describing each difference)."""
    n_same = n_refused = 0
    diffs = []
    for doc, want in zip(docs, answers):
        got = our_answer(bc, doc)
        if got[0] == "refused":
            n_refused += 1
        elif same(want, got):
            n_same += 1
        else:
            diffs.append(f"  {doc!r}: PyYAML {want}, bankml {got}")
    return n_same, n_refused, len(diffs), diffs


# The corpus: gguf-py's keys for each card.

def gguf_py_keys(readme: bytes) -> list:
    """The general.* keys gguf-py writes for a directory holding only this README.md, as
    [key, type name, value]; or ["error", what] where llama.cpp fails."""
    import gguf
    from gguf.gguf_writer import GGUFWriter
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / CORPUS_DIR_NAME
        d.mkdir()
        (d / "README.md").write_bytes(readme)
        try:
            card = gguf.Metadata.load_model_card(d)
            meta = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), card, {}, d, TOTAL_PARAMS)
        except Exception as e:      # what llama.cpp's conversion dies of
            return ["error", f"{type(e).__name__} reading the card"]
        if meta.name is None:
            meta.name = d.name
        if meta.size_label is None:
            meta.size_label = gguf.size_label(TOTAL_PARAMS, TOTAL_PARAMS, 0, 0)
        w = GGUFWriter(path=None, arch="llama")
        try:
            meta.set_gguf_meta_model(w)
            out = []
            for key, v in w.kv_data[0].items():
                w._pack_val(v.value, v.type, add_vtype=True, sub_type=v.sub_type)
                if key == "general.architecture":     # the writer's own, not the card's
                    continue
                vtype = v.type.name
                if v.type == gguf.GGUFValueType.ARRAY:
                    vtype = f"ARRAY[{gguf.GGUFValueType.get_type(v.value[0]).name}]"
                out.append([key, vtype, v.value])
        except Exception as e:
            return ["error", f"{type(e).__name__} writing the keys"]
        return out


def bankml_keys(bc, readme: bytes) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / CORPUS_DIR_NAME
        d.mkdir()
        (d / "README.md").write_bytes(readme)
        try:
            card = bc.load_model_card(d)
            kvs = bc.general_kvs(None, d.name, None, TOTAL_PARAMS, TOTAL_PARAMS, 0, 0, card)
        except bc.Refusal as e:
            return ["refused", str(e)]
    return [[k.key, f"ARRAY[{k.vtype.name}]" if k.array else k.vtype.name, k.value] for k in kvs]


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*.md") if p.name != "PROVENANCE.md")


def run_corpus(bc, answers: dict) -> int:
    """Compare every corpus card; gguf-py's keys for each go into answers (file name -> keys)."""
    files = corpus_files()
    n_same = n_refused = n_both_fail = 0
    silent = []
    reasons: dict[str, int] = {}
    for f in files:
        readme = f.read_bytes()
        want = gguf_py_keys(readme)
        answers[f.name] = want
        got = bankml_keys(bc, readme)
        if got[:1] == ["refused"]:
            if want[:1] == ["error"]:
                n_both_fail += 1
            else:
                n_refused += 1
            reason = got[1].split(";")[0]
            reason = reason.split(": ", 1)[1] if reason.startswith("README.md line") else reason
            reasons[reason[:90]] = reasons.get(reason[:90], 0) + 1
            print(f"  refused {f.name}: {got[1][:150]}")
        elif want == got:
            n_same += 1
        else:
            silent.append(f.name)
            print(f"  DIFFERENT {f.name}:\n    gguf-py {json.dumps(want)[:600]}\n    bankml  {json.dumps(got)[:600]}")
    for reason, n in sorted(reasons.items(), key=lambda x: -x[1]):
        print(f"    {n:4d} x {reason}")
    print(f"cards corpus: {len(files)} cards, {n_same} same keys, {n_refused} refused (gguf-py reads them), "
          f"{n_both_fail} refused (llama.cpp fails on them too), {len(silent)} silent differences")
    return len(silent)


# Random documents: fragments model cards are made of, recombined.

FRAGMENT_SCALARS = ("a", "x y", "yes", "no", "1", "0x1f", "1:30", "1.5", ".inf", "~", "2024-01-02", "'q'",
                    "\"d\\t\"", "'it''s'", "a #c", "a:b", "a: b", "-x", "[a, b]", "[]", "[a,", "{a: 1}",
                    "&x a", "*x", "!t a", "|", ">-", "\"", "'", "C#", "http://h/p", "", "- a", "?", ":",
                    "\"a\n  b\"", "1e5", "0o7", "012", "-", "--- a", "%x", "@x", "x  ", "é中")
FRAGMENT_KEYS = ("a", "b", "license", "tags", "yes", "1", "\"k\"", "'k'", "a b", "-k", "k#", "")


def random_document(rng: random.Random, depth: int = 0, indent: int = 0) -> str:
    lines = []
    for _ in range(rng.randint(1, 4)):
        pad = " " * indent
        kind = rng.random()
        if kind < 0.5 or depth > 2:
            lines.append(f"{pad}{rng.choice(FRAGMENT_KEYS)}: {rng.choice(FRAGMENT_SCALARS)}")
        elif kind < 0.7:
            lines.append(f"{pad}{rng.choice(FRAGMENT_KEYS)}:")
            step = rng.choice((0, 1, 2, 4))
            for _ in range(rng.randint(0, 3)):
                lines.append(f"{pad}{' ' * step}- {rng.choice(FRAGMENT_SCALARS)}")
        elif kind < 0.85:
            lines.append(f"{pad}{rng.choice(FRAGMENT_KEYS)}:")
            lines.append(random_document(rng, depth + 1, indent + rng.choice((1, 2, 4))).rstrip("\n"))
        elif kind < 0.95:
            lines.append(f"{pad}{rng.choice(FRAGMENT_KEYS)}: {rng.choice(('|', '>', '|-', '>+', '|2'))}")
            for _ in range(rng.randint(0, 3)):
                lines.append(" " * rng.choice((0, indent + 1, indent + 2, indent + 4)) + rng.choice(FRAGMENT_SCALARS))
        else:
            lines.append(rng.choice(("# c", "", "  ", "  # c")))
    return "\n".join(lines) + "\n"


def run_random(bc, n: int, seed: int) -> int:
    rng = random.Random(seed)
    docs = [random_document(rng) for _ in range(n)]
    n_same, n_refused, n_diff, diffs = compare_documents(bc, docs, [pyyaml_answer(d) for d in docs])
    for line in diffs[:20]:
        print(line)
    print(f"cards random: {n} documents (seed {seed}), {n_same} same, {n_refused} refused, {n_diff} silent differences")
    return n_diff


def run_mutants(bc, n: int, seed: str) -> int:
    """n mutated corpus cards (oracle/fuzz.py --model-card's mutants), gguf-py's keys beside bankml's."""
    sys.path.insert(0, str(HERE))
    import fuzz
    bases = fuzz.card_bases()
    counts = {"same": 0, "refused": 0, "both fail": 0}
    silent = []
    for index in range(n):
        base, data, mutations = fuzz.card_mutant(seed, index, bases)
        want, got = gguf_py_keys(data), bankml_keys(bc, data)
        if got[:1] == ["refused"]:
            counts["both fail" if want[:1] == ["error"] else "refused"] += 1
        elif want == got:
            counts["same"] += 1
        else:
            silent.append(index)
            print(f"  DIFFERENT mutant {index} of {base} ({mutations}):\n    gguf-py {json.dumps(want)[:400]}\n"
                  f"    bankml  {json.dumps(got)[:400]}")
    print(f"cards mutants: {n} mutated cards (seed {seed}), {counts['same']} same keys, {counts['refused']} refused "
          f"(gguf-py reads them), {counts['both fail']} refused (llama.cpp fails on them too), "
          f"{len(silent)} silent differences")
    return len(silent)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true", help="write PyYAML's answers to oracle/recorded/cards.json")
    ap.add_argument("--random", type=int, default=0, metavar="N", help="also N random documents")
    ap.add_argument("--mutants", type=int, default=0, metavar="N", help="also N mutated corpus cards (fuzz.py's)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    import yaml
    logging.disable(logging.CRITICAL)      # gguf-py logs each card it cannot use; the counts say it
    bc = load_ours()
    failures = 0
    typing = typing_documents()
    typing_answers = [pyyaml_answer(d) for d in typing]
    doc_answers = [pyyaml_answer(d) for d in DOCUMENTS]
    for label, docs, answers in (("typing", typing, typing_answers), ("documents", list(DOCUMENTS), doc_answers)):
        n_same, n_refused, n_diff, diffs = compare_documents(bc, docs, answers)
        for line in diffs:
            print(line)
        print(f"cards {label}: {len(docs)} documents, {n_same} same, {n_refused} refused, {n_diff} silent differences")
        failures += n_diff
    if args.random:
        failures += run_random(bc, args.random, args.seed)
    if args.mutants:
        failures += run_mutants(bc, args.mutants, str(args.seed))
    corpus_answers: dict = {}
    failures += run_corpus(bc, corpus_answers)
    if args.record:
        RECORD_FILE.write_text(json.dumps({
            "command": "python3 oracle/oracle.py cards --record",
            "pyyaml": yaml.__version__,
            "typing": {"alphabet": TYPING_ALPHABET, "answers": typing_answers},
            "documents": [[d, a] for d, a in zip(DOCUMENTS, doc_answers)],
            "corpus": {"dir_name": CORPUS_DIR_NAME, "total_params": TOTAL_PARAMS, "keys": corpus_answers},
        }, ensure_ascii=True, indent=0) + "\n", encoding="utf-8")
        print(f"recorded {RECORD_FILE.relative_to(MAIN)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
