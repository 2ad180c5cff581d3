# bankml_convert: the converter needs only python3; `make oracle` also sets up llama.cpp's reference.
PYTHON ?= python3
REF_DIR ?= oracle/.ref

.PHONY: test example oracle oracle-names clean

test:
	$(PYTHON) test_bankml_convert.py

example:
	$(PYTHON) bankml_convert.py example/smollm2-tiny -o build/smollm2-tiny-F16.gguf

# Runs llama.cpp's converter (its own venv under oracle/.ref, set up on first use) and
# bankml_convert on every generated case and compares sha256s; prints a diff on a mismatch.
oracle:
	bash oracle/setup_reference.sh >/dev/null
	$(PYTHON) oracle/oracle.py compare all
	$(MAKE) oracle-names

oracle-names:
	bash oracle/setup_reference.sh >/dev/null
	PYTHONPATH=$$(bash oracle/setup_reference.sh)/gguf-py $(REF_DIR)/venv/bin/python oracle/names_oracle.py

clean:
	rm -rf build
