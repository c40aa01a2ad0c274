"""bench/serve.sh's TorchScript peer: the same exported model (cohort export
--format torchscript) in PyTorch behind Python's threaded HTTP server, one
forward per request, no batching.

    /usr/bin/python3 bench/peers/ts_server.py MODEL.ts.pt PORT THREADS

POST /v1/predict with {"inputs": [image]} (image: [C][H][W] raw pixels
0..255), as `cohort serve` takes it; answers the top 5 classes.
"""

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

model_path, port, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
model = torch.jit.load(model_path).eval()
lock = threading.Lock()  # one forward at a time, as cohort's model thread


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            x = torch.tensor(json.loads(body)["inputs"], dtype=torch.float32)
            with lock, torch.inference_mode():
                probs = torch.softmax(model(x), dim=1)
            p, idx = probs.topk(5, dim=1)
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


server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
server.daemon_threads = True
signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=server.shutdown).start())
print("listening on %d" % port, flush=True)
server.serve_forever()
