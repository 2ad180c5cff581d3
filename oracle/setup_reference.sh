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
# gpt-oss's tokenizer (Apache-2.0, fetched for its 28 MB) and the harmony template from the source above.
BANKML_REF_DIR=$ref bash "$here/fetch_gptoss_tokenizer.sh" >/dev/null \
  || echo "setup_reference.sh: the gpt-oss tokenizer was not fetched (oracle/fetch_gptoss_tokenizer.sh)" >&2
# llama.cpp's own runtime from the same vendored source (oracle/runtime_oracle.py loads every recorded
# output with it): llama-simple for a model, llama-completion for a model with a LoRA adapter (llama-simple
# takes no --lora), llama-mtmd-cli for a model with its projector. GGML_NATIVE=OFF: a native build died
# with "Illegal instruction" in Q8_0 matmuls on the shared 2-core machines (the compiler's -march=native
# is not what the CPU the job lands on runs). Static, so the binaries need nothing from the build tree.
# About six minutes on two idle cores. Needs a C++17 compiler (g++: `apt-get install g++`, the only piece
# PyPI cannot give); cmake and ninja are taken from PATH, else pip-installed into the reference's venv.
# Skipped when the stamp names this source, these flags and the sha256 of the binaries on disk.
src=$ref/llama_cpp_python-0.3.36/vendor/llama.cpp
rt=$ref/runtime
rt_targets="llama-simple llama-completion llama-mtmd-cli"
rt_flags="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF"
rt_config="sdist $sdist_sha targets $rt_targets flags $rt_flags"
runtime_current() {
  [ -f "$rt/stamp" ] && [ "$(head -n 1 "$rt/stamp")" = "$rt_config" ] \
    && tail -n +2 "$rt/stamp" | (cd "$rt/build/bin" && sha256sum -c --quiet - >/dev/null 2>&1)
}
if ! runtime_current; then
  if ! command -v c++ >/dev/null 2>&1; then
    echo "setup_reference.sh: no C++ compiler to build llama.cpp's runtime; install one: apt-get install g++" >&2
    exit 1
  fi
  export PATH="$PATH:$ref/venv/bin"
  if ! command -v cmake >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1; then
    "$ref/venv/bin/pip" install -q 'cmake>=3.14,<4' ninja
  fi
  rm -rf "$rt"
  mkdir -p "$rt"
  # shellcheck disable=SC2086  # the flags are words on purpose
  nice -n 10 cmake -S "$src" -B "$rt/build" $rt_flags >"$rt/configure.log" 2>&1 \
    || { echo "setup_reference.sh: configuring llama.cpp's runtime failed; see $rt/configure.log" >&2; exit 1; }
  # shellcheck disable=SC2086
  nice -n 10 cmake --build "$rt/build" --target $rt_targets >"$rt/build.log" 2>&1 \
    || { echo "setup_reference.sh: building llama.cpp's runtime failed; see $rt/build.log" >&2; exit 1; }
  { echo "$rt_config"; (cd "$rt/build/bin" && sha256sum $rt_targets); } >"$rt/stamp.part"
  mv "$rt/stamp.part" "$rt/stamp"
fi
echo "$ref/llama_cpp_python-0.3.36/vendor/llama.cpp"
