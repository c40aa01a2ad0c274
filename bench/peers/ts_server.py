"""bench/serve.sh's TorchScript peer: the same exported model (cohort export
--format torchscript) in PyTorch behind Python's threaded HTTP server. With
MAX_BATCH 1 (the default) one forward per request; with more, requests wait
in a queue and one model thread runs up to MAX_BATCH of them as one batch,
waiting at most MAX_DELAY_MS after the first for the rest: dynamic batching
as a TorchServe or Triton user configures it (batch_size, max_batch_delay).

    /usr/bin/python3 bench/peers/ts_server.py MODEL.ts.pt PORT THREADS [MAX_BATCH [MAX_DELAY_MS]]

POST /v1/predict with {"inputs": [image]} (image: [C][H][W] raw pixels
0..255), as `cohort serve` takes it; answers the top 5 classes.
"""

import json
import queue
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

model_path, port, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
max_batch = int(sys.argv[4]) if len(sys.argv) > 4 else 1
max_delay = (float(sys.argv[5]) if len(sys.argv) > 5 else 5.0) / 1000.0
torch.set_num_threads(threads)
model = torch.jit.load(model_path).eval()
pending = queue.Queue()  # requests for the model thread: one forward at a time, as cohort's


def run_model():
    while True:
        batch = [pending.get()]
        deadline = time.monotonic() + max_delay
        while len(batch) < max_batch:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(pending.get(timeout=left))
            except queue.Empty:
                break
        try:
            with torch.inference_mode():
                probs = torch.softmax(model(torch.cat([r["x"] for r in batch])), dim=1)
            for r, p in zip(batch, probs.split([r["x"].shape[0] for r in batch])):
                r["probs"] = p
        except Exception as e:  # every request of the batch hears of it
            for r in batch:
                r["error"] = str(e)
        for r in batch:
            r["done"].set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            request = {"x": torch.tensor(json.loads(body)["inputs"], dtype=torch.float32),
                       "done": threading.Event()}
            pending.put(request)
            request["done"].wait()
            if "error" in request:
                raise RuntimeError(request["error"])
            p, idx = request["probs"].topk(5, dim=1)
            out = {"predictions": [{"classes": [{"label": int(j), "probability": float(q)}
                                                for q, j in zip(pr, ix)]} for pr, ix in zip(p, idx)]}
            data, code = json.dumps(out).encode(), 200
        except Exception as e:  # a bench peer: any failure is the client's 400
            data, code = json.dumps({"error": str(e)}).encode(), 400
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


threading.Thread(target=run_model, daemon=True).start()
server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
server.daemon_threads = True
signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=server.shutdown).start())
print("listening on %d" % port, flush=True)
server.serve_forever()
