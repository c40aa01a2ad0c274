"""The other side of weights_interop_test.cc, written from the published
formats alone (no safetensors or transformers package):

  safetensors: u64 little-endian header length, a JSON header of
    {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, the bytes;
  GPT-2 in Hugging Face's layout: GPT2LMHeadModel's modules and names,
    Conv1D weights stored [in, out], each block's causal mask as the buffer
    attn.bias (and attn.masked_bias in older files), gelu_new, the head tied.

  hf_interop.py write-st DIR    py.safetensors (this writer) + py_ref.pt
  hf_interop.py read-st DIR     cohort.safetensors against cohort_ref.pt
  hf_interop.py hf-make DIR     GPT-2 checkpoints in DIR/hf (pytorch_model.bin,
                                GPT2LMHeadModel names) and DIR/hf2
                                (model.safetensors, GPT2Model names), with
                                the logits of DIR/hf_io.pt's tokens
  hf_interop.py hf-check DIR    DIR/export (config.json, model.safetensors)
                                into the module, strictly but for what
                                transformers lets be missing (the tied head,
                                attn.masked_bias), against DIR/cohort_io.pt's
                                logits

Exit 0 when everything agrees, 1 with the difference otherwise.
"""

import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        flat = t.detach().contiguous().reshape(-1)
        raw = (flat.to(torch.uint8) if t.dtype == torch.bool else flat.view(torch.uint8)).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    at = 0
    for begin, end, name in spans:
        if begin != at:
            raise SystemExit(f"{path}: tensor {name} starts at {begin}, expected {at}")
        at = end
    if at != len(body):
        raise SystemExit(f"{path}: {len(body) - at} bytes after the last tensor")
    out = {}
    for name, v in header.items():
        begin, end = v["data_offsets"]
        dtype = DTYPES[v["dtype"]]
        raw = bytearray(body[begin:end])
        if dtype == torch.bool:
            t = torch.frombuffer(raw, dtype=torch.uint8).to(torch.bool) if raw else torch.empty(0, dtype=torch.bool)
        else:
            t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(v["shape"])
    return out, meta


def sample_tensors():
    g = torch.Generator().manual_seed(11)
    return {
        "f32": torch.randn(3, 5, generator=g),
        "f64": torch.randn(4, generator=g, dtype=torch.float64),
        "f16": torch.randn(2, 3, generator=g).half(),
        "bf16": torch.randn(7, generator=g).bfloat16(),
        "i64": torch.randint(-2**40, 2**40, (3,), generator=g),
        "i32": torch.randint(-2**30, 2**30, (2, 2), generator=g, dtype=torch.int32),
        "i16": torch.randint(-2**14, 2**14, (5,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-100, 100, (6,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (2, 4), generator=g, dtype=torch.uint8),
        "bool": torch.rand(9, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


# --- GPT-2 in Hugging Face's layout -------------------------------------


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(std=0.1))  # large enough that GELU's form shows
        self.bias = nn.Parameter(torch.empty(nf).normal_(std=0.02))

    def forward(self, x):
        y = torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight)
        return y.view(x.shape[:-1] + (self.nf,))


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        n, p = c["n_embd"], c["n_positions"]
        self.heads = c["n_head"]
        self.register_buffer("bias", torch.tril(torch.ones(p, p, dtype=torch.bool)).view(1, 1, p, p))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.c_attn = Conv1D(3 * n, n)
        self.c_proj = Conv1D(n, n)

    def forward(self, x):
        b, t, n = x.shape
        q, k, v = self.c_attn(x).split(n, dim=2)
        heads = lambda m: m.view(b, t, self.heads, n // self.heads).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        w = q @ k.transpose(-1, -2) / math.sqrt(n // self.heads)
        w = torch.where(self.bias[:, :, :t, :t], w, torch.tensor(torch.finfo(w.dtype).min))
        y = (w.softmax(-1) @ v).transpose(1, 2).reshape(b, t, n)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(4 * c["n_embd"], c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], 4 * c["n_embd"])

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList([Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        for ln in [self.ln_f] + [m for b in self.h for m in (b.ln_1, b.ln_2)]:
            nn.init.normal_(ln.weight, 1.0, 0.1)
            nn.init.normal_(ln.bias, 0.0, 0.1)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.size(1)))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, tokens):
        return self.lm_head(self.transformer(tokens))


CONFIG = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 96, "n_positions": 24,
          "n_ctx": 24, "n_embd": 48, "n_layer": 2, "n_head": 4, "n_inner": None,
          "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}


def hf_make(d):
    torch.manual_seed(3)
    model = GPT2LMHeadModel(CONFIG).eval()
    tokens = torch.randint(0, CONFIG["vocab_size"], (2, CONFIG["n_positions"]))
    with torch.no_grad():
        logits = model(tokens)
    for sub in ("hf", "hf2"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, sub, "config.json"), "w") as f:
            json.dump(CONFIG, f)
    torch.save(model.state_dict(), os.path.join(d, "hf", "pytorch_model.bin"))
    write_safetensors(os.path.join(d, "hf2", "model.safetensors"),
                      {k: v for k, v in model.transformer.state_dict().items()}, {"format": "pt"})
    torch.save({"tokens": tokens, "logits": logits}, os.path.join(d, "hf_io.pt"))


def hf_check(d):
    with open(os.path.join(d, "export", "config.json")) as f:
        config = json.load(f)
    for key in ("model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "activation_function"):
        if config.get(key) != CONFIG[key]:
            raise SystemExit(f"config.json: {key} is {config.get(key)!r}, expected {CONFIG[key]!r}")
    model = GPT2LMHeadModel(config).eval()
    weights, _ = read_safetensors(os.path.join(d, "export", "model.safetensors"))
    result = model.load_state_dict(weights, strict=False)
    # What transformers itself lets be missing: the tied head, and the
    # masked_bias constant older versions kept (_keys_to_ignore_on_load_missing).
    missing = [k for k in result.missing_keys if k != "lm_head.weight" and not k.endswith(".attn.masked_bias")]
    if result.unexpected_keys or missing or "lm_head.weight" not in result.missing_keys:
        raise SystemExit(f"missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    io = torch.load(os.path.join(d, "cohort_io.pt"))
    with torch.no_grad():
        logits = model(io["tokens"])
    diff = (logits - io["logits"]).abs().max().item()
    print(f"max logit difference {diff:.3g}")
    if diff > 1e-4:
        sys.exit(1)


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "write-st":
        tensors = sample_tensors()
        write_safetensors(os.path.join(d, "py.safetensors"), tensors, {"written_by": "hf_interop.py"})
        torch.save(tensors, os.path.join(d, "py_ref.pt"))
    elif mode == "read-st":
        got, meta = read_safetensors(os.path.join(d, "cohort.safetensors"))
        want = torch.load(os.path.join(d, "cohort_ref.pt"))
        if set(got) != set(want):
            raise SystemExit(f"names {sorted(got)} != {sorted(want)}")
        for k in want:
            if got[k].dtype != want[k].dtype or got[k].shape != want[k].shape or not torch.equal(got[k], want[k]):
                raise SystemExit(f"tensor {k} differs")
        print(json.dumps(meta))
    elif mode == "hf-make":
        hf_make(d)
    elif mode == "hf-check":
        hf_check(d)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
