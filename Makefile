# bankml_convert: the converter needs only python3; `make oracle` also sets up llama.cpp's reference.
PYTHON ?= python3

.PHONY: test check-install example oracle bench fuzz clean

test:
	$(PYTHON) -S test_bankml_convert.py

# Every way in, from the files a fresh clone has, in a throwaway directory: pip install . into a new
# venv, the wheel (contents and metadata), the file vendored alone under python3 -S -I, and
# python3 -m bankml_convert; each converts the example to llama.cpp's sha256. Needs the package
# registry (setuptools for the build); one line on success. CI runs it before the tests.
check-install:
	@$(PYTHON) oracle/check_install.py

example:
	mkdir -p build
	$(PYTHON) bankml_convert.py example/smollm2-tiny -o build/smollm2-tiny-F16.gguf

# Runs llama.cpp's converter (its own venv under oracle/.ref, set up on first use) and
# bankml_convert on every generated case and compares sha256s, showing the first difference on a
# mismatch; then gguf-py's name heuristics against bankml's over every id in oracle/names_ids.txt,
# PyYAML's and gguf-py's model-card reading against bankml's (oracle/fixtures/cards/, 0 silent differences),
# llama.cpp's pre-tokenizer hash (chkhsh) of every tokenizer fixture against bankml's, and bankml's
# inspect against gguf-py's GGUFReader on the full-size output.
oracle:
	$(PYTHON) oracle/oracle.py compare all
	$(PYTHON) oracle/oracle.py names
	$(PYTHON) oracle/oracle.py cards
	$(PYTHON) oracle/oracle.py chkhsh
	$(PYTHON) oracle/oracle.py inspect

# Times bankml_convert against llama.cpp's converter (when oracle/.ref is set up) and a cp+sha256sum
# floor on the full-size SmolLM2-135M-Instruct (generated under build/bench on first use, ~1 GB with
# the 3x model); prints medians, ratios and the issue's targets. Raw numbers: build/bench/bench.json.
BENCH_ARGS ?= --rounds 3 --scale 3 --json build/bench/bench.json
# Then the full-size TinyLlama-1.1B-Chat-v1.0 shape (SentencePiece, 2.2 GB of BF16, generated) in f16.
BENCH_TINYLLAMA_ARGS ?= --case full-tinyllama --outtypes f16 --rounds 3 --json build/bench/tinyllama.json
bench:
	$(PYTHON) oracle/bench.py $(BENCH_ARGS)
	$(PYTHON) oracle/bench.py $(BENCH_TINYLLAMA_ARGS)

# The fuzz campaign of issue 5: 100,000 mutated model directories (fixed seed), each must convert
# or refuse in one line, never crash, never leave a .part or write elsewhere. About 45 minutes on
# two cores; FUZZ_ARGS="--inputs 2000" for a quick run. Then 100,000 mutated GGUF files through the
# reader, inspect, diff and verify (about 10 minutes): each returns or raises GGUFError/Refusal.
# Then 50,000 mutated torch.save checkpoints through the checkpoint reader and the ggml job: 0
# crashes and 0 executions of a spliced-in payload.
FUZZ_ARGS ?= --inputs 100000 --seed 1 --workers 2
fuzz:
	mkdir -p build/fuzz
	$(PYTHON) oracle/fuzz.py $(FUZZ_ARGS) --report build/fuzz/report.json --progress build/fuzz/progress
	$(PYTHON) oracle/fuzz.py --gguf --inputs 100000 --seed 1 --report build/fuzz/gguf-report.json
	$(PYTHON) oracle/fuzz.py --checkpoint --inputs 50000 --seed 1 --convert-every 100 --report build/fuzz/checkpoint-report.json

clean:
	rm -rf build *.egg-info
