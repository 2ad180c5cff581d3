# bankml_convert: the converter needs only python3; `make oracle` also sets up llama.cpp's reference.
PYTHON ?= python3

.PHONY: test test-fast check-install example oracle bench fuzz faults clean

test:
	$(PYTHON) -S test_bankml_convert.py

# The edit loop: the tests that convert no model directory, start no process and sweep no recorded
# data (test_bankml_convert.py's in_fast_tier); make test is the full run CI does.
test-fast:
	$(PYTHON) -S test_bankml_convert.py --fast -q

# Every way in, from the files a fresh clone has, in a throwaway directory: pip install . into a new
# venv, the wheel (contents and metadata), the file vendored alone under python3 -S -I, and
# python3 -m bankml_convert; each converts the example to llama.cpp's sha256; pip install . again
# under Python 3.8 when the machine has one. Needs the package registry (hatchling for the build);
# one line on success. CI runs it before the tests.
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
# inspect against gguf-py's GGUFReader on the full-size output; then llama.cpp's own runtime (built
# from the same source by setup_reference.sh, about six minutes the first time) loads every recorded
# output and generates a few tokens, so a file the reference writes but llama.cpp cannot run is found.
oracle:
	$(PYTHON) oracle/oracle.py compare all
	$(PYTHON) oracle/oracle.py names
	$(PYTHON) oracle/oracle.py cards
	$(PYTHON) oracle/oracle.py chkhsh
	$(PYTHON) oracle/oracle.py inspect
	$(PYTHON) oracle/oracle.py load all

# Times bankml_convert against llama.cpp's converter (when oracle/.ref is set up) and a cp+sha256sum
# floor on every issue's full-size case (oracle/bench.py's SUITE: SmolLM2-135M-Instruct in every type,
# Llama-3.2-1B-Instruct, TinyLlama-1.1B and Qwen2.5-0.5B in f16, Llama-3.2-3B sharded as the Hub ships
# it in f16 and q8_0, and in f16 split into 1 GB shards), then the 135M model with 3x the layers for flat memory. The cases are generated
# under build/bench on first use (~13 GB, about 2 minutes; the 3B outputs need ~13 GB more while it
# runs). Prints per case the medians, ratios, s/GB and where bankml's time goes, then PASS/FAIL per
# issue target. About 40 minutes on the 2-core machine, 28 of them the 3B case (llama.cpp's q8_0 there
# alone is 2.5 min a round); one case: python3 oracle/bench.py --case C [--outtypes ...].
# Raw numbers: build/bench/bench.json.
BENCH_ARGS ?= --suite --rounds 3 --scale 3 --json build/bench/bench.json
bench:
	$(PYTHON) oracle/bench.py $(BENCH_ARGS)

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
	$(PYTHON) oracle/fuzz.py --lora --inputs 5000 --seed 1 --report build/fuzz/lora-report.json

# The fault suite of issue 24 (oracle/faults.py): hostile current directories, files that are not
# OUT (devices, FIFOs, planted links, --fork clashes), all-or-nothing commits, inputs changed while
# converting, stale .part files, the machine's faults (full disk, ulimit -f, fork limit, memory
# limit, signals, /dev/full) and messages; one line per scenario, then `N passed, N failed`. About
# 2 minutes; run as root for every scenario (small tmpfs mounts, a private mknod'd null device, the
# tool run as nobody), else the root-only ones SKIP -- so CI does not run it. The unprivileged, fast
# ones are also in make test. FAULTS_ARGS="--only CLASS" for one class, "--tool PATH" for another copy.
FAULTS_ARGS ?=
faults:
	$(PYTHON) oracle/faults.py $(FAULTS_ARGS)

clean:
	rm -rf build *.egg-info
