// bench/serve.sh's ONNX Runtime peer: the same exported model (cohort export
// --format onnx) behind Node's HTTP server. With MAX_BATCH 1 (the default)
// one session.run per request; with more, requests wait in a queue and up
// to MAX_BATCH of them run as one batch, waiting at most MAX_DELAY_MS after
// the first for the rest: dynamic batching as a Triton or TorchServe user
// configures it (ONNX Runtime for Node.js has none of its own). One run at
// a time, as cohort's model thread.
//
//   node bench/peers/ort_server.js MODEL.onnx PORT THREADS [MAX_BATCH [MAX_DELAY_MS]]
//
// POST /v1/predict with {"inputs": [image]} (image: [C][H][W] raw pixels
// 0..255), as `cohort serve` takes it; answers the top 5 classes.
"use strict";
const http = require("http");
const path = require("path");
const ort = require(path.join(__dirname, "../../tests/onnxruntime/node_modules/onnxruntime-node"));

// The top 5 classes of each row of `logits` [rows, n], as probabilities.
function top5(logits, rows, n) {
  const predictions = [];
  for (let i = 0; i < rows; ++i) {
    const row = Array.from(logits.subarray(i * n, (i + 1) * n));
    const max = Math.max(...row);
    const e = row.map((v) => Math.exp(v - max));
    const sum = e.reduce((a, b) => a + b, 0);
    const top = e.map((v, j) => [v / sum, j]).sort((a, b) => b[0] - a[0]).slice(0, 5);
    predictions.push({ classes: top.map(([p, j]) => ({ label: j, probability: p })) });
  }
  return predictions;
}

// Requests in a queue, run as batches of up to maxBatch, one batch at a time.
class Batcher {
  constructor(session, maxBatch, maxDelayMs) {
    Object.assign(this, { session, maxBatch, maxDelayMs, queue: [], running: false, timer: null });
  }

  // images: [k][C][H][W]; resolves to k predictions.
  submit(images) {
    return new Promise((resolve, reject) => {
      if (!Array.isArray(images) || images.length === 0) {
        reject(new Error("expected {\"inputs\": [image, ...]}"));
        return;
      }
      this.queue.push({ images, resolve, reject });
      this.schedule();
    });
  }

  schedule() {
    if (this.running || this.queue.length === 0) return;
    const queued = this.queue.reduce((k, r) => k + r.images.length, 0);
    if (queued >= this.maxBatch || this.maxBatch === 1) {
      clearTimeout(this.timer);
      this.timer = null;
      this.runBatch();
    } else if (this.timer === null) {
      this.timer = setTimeout(() => { this.timer = null; this.runBatch(); }, this.maxDelayMs);
    }
  }

  async runBatch() {
    if (this.running || this.queue.length === 0) return;
    const batch = [];
    let rows = 0;
    while (this.queue.length > 0 && (batch.length === 0 || rows + this.queue[0].images.length <= this.maxBatch)) {
      const r = this.queue.shift();
      batch.push(r);
      rows += r.images.length;
    }
    this.running = true;
    try {
      const first = batch[0].images[0];
      const c = first.length, h = first[0].length, w = first[0][0].length;
      const data = new Float32Array(rows * c * h * w);
      let k = 0;
      for (const r of batch) for (const img of r.images) for (const plane of img) for (const row of plane) {
        for (const v of row) data[k++] = v;
      }
      const out = await this.session.run({ pixels: new ort.Tensor("float32", data, [rows, c, h, w]) });
      const predictions = top5(out.logits.data, rows, out.logits.dims[1]);
      let at = 0;
      for (const r of batch) {
        r.resolve(predictions.slice(at, at + r.images.length));
        at += r.images.length;
      }
    } catch (e) {  // every request of the batch hears of it
      for (const r of batch) r.reject(e);
    } finally {
      this.running = false;
      this.schedule();
    }
  }
}

async function main() {
  const [model, port, threads, maxBatch = "1", maxDelayMs = "5"] = process.argv.slice(2);
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: Number(threads), interOpNumThreads: 1, executionMode: "sequential",
  });
  const batcher = new Batcher(session, Math.max(1, Number(maxBatch)), Number(maxDelayMs));
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      try {
        const predictions = await batcher.submit(JSON.parse(Buffer.concat(chunks).toString()).inputs);
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
