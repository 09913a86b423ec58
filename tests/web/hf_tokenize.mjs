// HuggingFace's tokenizers library (its Rust core, through the official Node
// binding) as the reference for corolla's tokenizer.json support.
//
//   node hf_tokenize.mjs TOKENIZER.json TEXTS.json
//
// TEXTS.json is a JSON array of strings. Prints one JSON object:
//   {"plain":   [[ids of text i, add_special_tokens=false] ...],
//    "special": [[ids of text i, add_special_tokens=true] ...],
//    "decoded": [decode(plain[i], skip_special_tokens=false) ...]}
// Any failure exits non-zero with the reason on stderr.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');

const [tokenizerPath, textsPath] = process.argv.slice(2);
if (!tokenizerPath || !textsPath) {
  console.error('usage: node hf_tokenize.mjs TOKENIZER.json TEXTS.json');
  process.exit(2);
}

const tokenizer = Tokenizer.fromFile(tokenizerPath);
const texts = JSON.parse(readFileSync(textsPath, 'utf8'));
const out = { plain: [], special: [], decoded: [] };
for (const text of texts) {
  const plain = (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
  const special = (await tokenizer.encode(text, null, { addSpecialTokens: true })).getIds();
  out.plain.push(Array.from(plain));
  out.special.push(Array.from(special));
  out.decoded.push(await tokenizer.decode(Array.from(plain), false));
}
process.stdout.write(JSON.stringify(out));
