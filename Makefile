# bankml_convert: the converter needs only python3; `make oracle` also sets up llama.cpp's reference.
PYTHON ?= python3

.PHONY: test example oracle clean

test:
	$(PYTHON) -S test_bankml_convert.py

example:
	mkdir -p build
	$(PYTHON) bankml_convert.py example/smollm2-tiny -o build/smollm2-tiny-F16.gguf

# Runs llama.cpp's converter (its own venv under oracle/.ref, set up on first use) and
# bankml_convert on every generated case and compares sha256s, showing the first difference on a
# mismatch; then gguf-py's name heuristics against bankml's over every id in oracle/names_ids.txt.
oracle:
	$(PYTHON) oracle/oracle.py compare all
	$(PYTHON) oracle/oracle.py names

clean:
	rm -rf build
