// Runs an ONNX model in ONNX Runtime for Node.js on one input read from a
// raw file, for tests/serve/export_test.cc:
//   node ort_run.js MODEL.onnx INPUT_NAME float32|int64 D0,D1,... IN.bin OUT.bin
// Writes the first output's values (float32, little-endian) to OUT.bin and
// prints {"dims": [...], "inputs": [...], "outputs": [...]} on stdout.
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require(path.join(__dirname, '..', 'onnxruntime', 'node_modules', 'onnxruntime-node'));

async function main() {
  const [model, inputName, dtype, dimsText, inFile, outFile] = process.argv.slice(2);
  const dims = dimsText.split(',').map(Number);
  const bytes = fs.readFileSync(inFile);
  const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  const data = dtype === 'int64' ? new BigInt64Array(buffer) : new Float32Array(buffer);
  const session = await ort.InferenceSession.create(model, { graphOptimizationLevel: 'all' });
  const results = await session.run({ [inputName]: new ort.Tensor(dtype, data, dims) });
  const out = results[session.outputNames[0]];
  fs.writeFileSync(outFile, Buffer.from(out.data.buffer, out.data.byteOffset, out.data.byteLength));
  console.log(JSON.stringify({ dims: out.dims, inputs: session.inputNames, outputs: session.outputNames }));
}

main().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
