// bench/serve.sh's ONNX Runtime peer: the same exported model (cohort export
// --format onnx) behind Node's HTTP server, one session.run per request
// (ONNX Runtime for Node.js has no request batching of its own).
//
//   node bench/peers/ort_server.js MODEL.onnx PORT THREADS
//
// POST /v1/predict with {"inputs": [image]} (image: [C][H][W] raw pixels
// 0..255), as `cohort serve` takes it; answers the top 5 classes.
"use strict";
const http = require("http");
const path = require("path");
const ort = require(path.join(__dirname, "../../tests/onnxruntime/node_modules/onnxruntime-node"));

async function main() {
  const [model, port, threads] = process.argv.slice(2);
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: Number(threads), interOpNumThreads: 1, executionMode: "sequential",
  });
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      try {
        const body = JSON.parse(Buffer.concat(chunks).toString());
        const images = body.inputs;
        const c = images[0].length, h = images[0][0].length, w = images[0][0][0].length;
        const data = new Float32Array(images.length * c * h * w);
        let k = 0;
        for (const img of images) for (const plane of img) for (const row of plane) for (const v of row) data[k++] = v;
        const out = await session.run({ pixels: new ort.Tensor("float32", data, [images.length, c, h, w]) });
        const logits = out.logits.data, n = out.logits.dims[1];
        const predictions = [];
        for (let i = 0; i < images.length; ++i) {
          const row = Array.from(logits.subarray(i * n, (i + 1) * n));
          const max = Math.max(...row);
          const e = row.map((v) => Math.exp(v - max));
          const sum = e.reduce((a, b) => a + b, 0);
          const top = e.map((v, j) => [v / sum, j]).sort((a, b) => b[0] - a[0]).slice(0, 5);
          predictions.push({ classes: top.map(([p, j]) => ({ label: j, probability: p })) });
        }
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ predictions }));
      } catch (e) {
        res.writeHead(400, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ error: String(e) }));
      }
    });
  });
  server.listen(Number(port), "127.0.0.1", () => console.log("listening on " + port));
  process.on("SIGTERM", () => server.close(() => process.exit(0)));
}
main().catch((e) => { console.error(e); process.exit(1); });
