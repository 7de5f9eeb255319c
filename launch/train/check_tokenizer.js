// Encodes lines with @lenml/tokenizers (the JS port of Hugging Face tokenizers that the
// tokenizer tests install under build/tests/tokenizer/npm) from a model folder's
// tokenizer.json + tokenizer_config.json, for check_tokenizer.py to compare with bpe.py.
//   NODE_PATH=build/tests/tokenizer/npm/node_modules node check_tokenizer.js MODEL_DIR < lines.json
// stdin: a JSON array of strings; stdout: a JSON array of {ids, decoded}.
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

const dir = process.argv[2];
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const lines = JSON.parse(fs.readFileSync(0, "utf8"));
const out = lines.map((text) => {
  const ids = tok.encode(text, { add_special_tokens: true });
  return { ids, decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "" };
});
process.stdout.write(JSON.stringify(out));
