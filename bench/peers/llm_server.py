"""bench/serve-llm.sh's peer: the same GPT weights (a cohort run's
model/final.pt, a state dict with nanoGPT's names) in PyTorch (gpt.py's
module) behind Python's threaded HTTP server, with a key/value cache per
request and dynamic batching of the generation steps.

    /usr/bin/python3 bench/peers/llm_server.py WEIGHTS PORT [--max-batch 32] [gpt.py's sizes]

POST /v1/generate takes `cohort serve`'s body ({"prompt", "max_tokens",
"temperature", "top_k", "seed", "stream"}; the prompt's UTF-8 bytes are the
tokens, as cohort's byte tokenizer) and answers in its format: with
"stream": true one line {"token", "text"} per token, then the summary with
"done": true. GET /healthz answers {"status": "ok"}.

The batching, as a continuous-batching server does it: one model thread
owns every generation under way. Each round it takes the prompts that
arrived (up to --max-batch generations in all) and runs them as one forward,
padded to the longest and masked; then one decode step of every generation
under way, each row's new token against its own cache, the caches padded to
the longest with the padding masked out. It samples every row's next token
itself and hands it to the request's thread, which streams it. Nothing
waits for a batch to fill: whatever is pending runs. A cache holds the
request's prompt and max_tokens positions (allocated once). torch runs the
model under inference_mode with the threads of OMP_NUM_THREADS; launch_env
(bench/launch_env.py) checks the allocator and threads it was started with.
"""

import argparse
import json
import math
import os
import queue
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import launch_env  # noqa: E402  (bench/launch_env.py)
from gpt import GPT, sizes  # noqa: E402


class Generation:
    def __init__(self, prompt, max_tokens, temperature, top_k, seed, layers, heads, head_dim):
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.generator = torch.Generator().manual_seed(seed)
        capacity = len(prompt) + max_tokens
        self.keys = [torch.empty(capacity, heads, head_dim) for _ in range(layers)]
        self.values = [torch.empty(capacity, heads, head_dim) for _ in range(layers)]
        self.length = 0  # positions cached
        self.tokens = []  # generated
        self.out = queue.Queue()  # token ids, then None (done) or an exception


class Engine:
    def __init__(self, model, max_batch):
        self.m = model
        self.max_batch = max_batch
        t = model.transformer
        self.heads = t.h[0].attn.n_head
        self.embd = t.wte.weight.shape[1]
        self.head_dim = self.embd // self.heads
        self.layers = len(t.h)
        self.pending, self.active = [], []
        self.cv = threading.Condition()
        threading.Thread(target=self.loop, daemon=True).start()

    def submit(self, g):
        with self.cv:
            self.pending.append(g)
            self.cv.notify()

    def loop(self):
        torch.set_grad_enabled(False)
        while True:
            with self.cv:
                while not self.pending and not self.active:
                    self.cv.wait()
                room = self.max_batch - len(self.active)
                new, self.pending = self.pending[:room], self.pending[room:]
            try:
                with torch.inference_mode():
                    if new:
                        self.emit(new, self.prefill(new))
                    if self.active:
                        self.emit(self.active, self.decode(self.active))
            except Exception as e:  # every generation of the round hears of it
                for g in new + self.active:
                    g.out.put(e)
                self.active = []
                continue
            self.active = [g for g in self.active + new if len(g.tokens) < g.max_tokens]

    def emit(self, gens, logits):
        for g, row in zip(gens, logits):
            if g.temperature < 1e-4:
                token = int(row.argmax())
            else:
                row = row / g.temperature
                if g.top_k > 0:
                    kth = row.topk(min(g.top_k, row.numel())).values[-1]
                    row = row.masked_fill(row < kth, float("-inf"))
                token = int(torch.multinomial(F.softmax(row, -1), 1, generator=g.generator))
            g.tokens.append(token)
            g.out.put(token)
            if len(g.tokens) >= g.max_tokens:
                g.out.put(None)

    def attend(self, attn, x, keys, values, mask):
        """x [B, T, C] against keys/values [B, L, H, D] (mask [B, 1|T, L]: True = may attend)."""
        b, t, c = x.shape
        q = x.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        att = (q @ keys.permute(0, 2, 3, 1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(~mask[:, None], float("-inf"))
        y = (F.softmax(att, dim=-1) @ values.transpose(1, 2)).transpose(1, 2).reshape(b, t, c)
        return attn.c_proj(y)

    def prefill(self, gens):
        """The prompts as one forward, right-padded; fills the caches; logits of each last token."""
        t = self.m.transformer
        lens = torch.tensor([len(g.prompt) for g in gens])
        tokens = pad_sequence([torch.tensor(g.prompt) for g in gens], batch_first=True)
        n = tokens.shape[1]
        x = t.wte(tokens) + t.wpe(torch.arange(n))
        pos = torch.arange(n)
        mask = (pos[None, :] <= pos[:, None])[None] & (pos[None, None, :] < lens[:, None, None])
        for i, block in enumerate(t.h):
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(self.embd, dim=2)
            k = k.view(len(gens), n, self.heads, self.head_dim)
            v = v.view(len(gens), n, self.heads, self.head_dim)
            for r, g in enumerate(gens):
                g.keys[i][:len(g.prompt)] = k[r, :len(g.prompt)]
                g.values[i][:len(g.prompt)] = v[r, :len(g.prompt)]
            x = x + self.attend(block.attn, q, k, v, mask)
            x = x + block.mlp(block.ln_2(x))
        for g in gens:
            g.length = len(g.prompt)
        last = self.m.lm_head(t.ln_f(x[torch.arange(len(gens)), lens - 1]))
        return last

    def decode(self, gens):
        """One new token per generation against its cache, the caches padded to the longest."""
        t = self.m.transformer
        b = len(gens)
        lens = torch.tensor([g.length + 1 for g in gens])
        x = t.wte(torch.tensor([[g.tokens[-1]] for g in gens])) + t.wpe(lens.view(b, 1) - 1)
        mask = (torch.arange(int(lens.max()))[None, :] < lens[:, None])[:, None]  # [B, 1, L]
        for i, block in enumerate(t.h):
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(self.embd, dim=2)
            k = k.view(b, self.heads, self.head_dim)
            v = v.view(b, self.heads, self.head_dim)
            for r, g in enumerate(gens):
                g.keys[i][g.length] = k[r]
                g.values[i][g.length] = v[r]
            keys = pad_sequence([g.keys[i][:g.length + 1] for g in gens], batch_first=True)
            values = pad_sequence([g.values[i][:g.length + 1] for g in gens], batch_first=True)
            x = x + self.attend(block.attn, q, keys, values, mask)
            x = x + block.mlp(block.ln_2(x))
        for g in gens:
            g.length += 1
        return self.m.lm_head(t.ln_f(x[:, -1]))


def text_of(tokens):
    return bytes(tokens).decode("utf-8", errors="replace")


def make_handler(engine, block_size):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, body):
            data = (json.dumps(body) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/healthz":
                self.answer(200, {"status": "ok"})
            else:
                self.answer(404, {"error": "no such endpoint"})

        def chunk(self, line):
            data = (json.dumps(line) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/generate":
                return self.answer(404, {"error": "no such endpoint"})
            try:
                r = json.loads(body)
                prompt = list((r["prompt"] or "\n").encode())
                max_tokens = int(r.get("max_tokens", 16))
                if len(prompt) + max_tokens > block_size or max_tokens < 1:
                    raise ValueError(f"prompt and max_tokens beyond block_size {block_size}")
                g = Generation(prompt, max_tokens, float(r.get("temperature", 1.0)), int(r.get("top_k", 0)),
                               int(r.get("seed", 0)), engine.layers, engine.heads, engine.head_dim)
            except (ValueError, KeyError, TypeError) as e:
                return self.answer(400, {"error": str(e)})
            engine.submit(g)
            stream = bool(r.get("stream", False))
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
            tokens = []
            while True:
                item = g.out.get(timeout=300)
                if item is None:
                    break
                if isinstance(item, Exception):
                    if stream:
                        self.chunk({"error": str(item)})
                        self.wfile.write(b"0\r\n\r\n")
                        return
                    return self.answer(500, {"error": str(item)})
                tokens.append(item)
                if stream:
                    self.chunk({"token": item, "text": text_of([item])})
            summary = {"text": text_of(tokens), "tokens": tokens, "prompt_tokens": len(prompt),
                       "finish_reason": "length"}
            if stream:
                self.chunk(dict(summary, done=True))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.answer(200, summary)

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("weights")
    ap.add_argument("port", type=int)
    ap.add_argument("--max-batch", type=int, default=32, help="generations under way at once")
    sizes(ap)
    a = ap.parse_args()
    a.bias = bool(a.bias)
    report = launch_env.verify(torch)
    model = GPT(a)
    model.load_state_dict(torch.load(a.weights))  # strict: every name and shape must match
    model.eval()
    engine = Engine(model, a.max_batch)
    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the listen backlog; socketserver's 5 resets clients arriving together
        daemon_threads = True

    server = Server(("127.0.0.1", a.port), make_handler(engine, a.block_size))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(json.dumps({"listening": a.port, "torch": torch.__version__, **report}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
