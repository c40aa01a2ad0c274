"""cohort's GPT (include/cohort/models/gpt.h) as a PyTorch module: the same
architecture, parameter names and initialization, for side-by-side runs and
for checking that cohort's weights load here and give the same logits.

  gpt.py check DIR [sizes]
      loads cohort's state dict DIR/cohort_gpt.pt into GPT(sizes) strictly,
      runs DIR/cohort_gpt_io.pt's "tokens" and compares the logits with its
      "logits"; exit 1 when they differ by more than --tolerance

The state dict of this module, like nanoGPT's, lists the tied output head
twice: transformer.wte.weight and lm_head.weight, one tensor.
"""
import argparse
import math
import sys

import torch
from torch import nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias."""

    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        assert c.n_embd % c.n_head == 0
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.attn_dropout = nn.Dropout(c.dropout)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.n_head = c.n_head
        future = torch.ones(c.block_size, c.block_size, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (m.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for m in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.future[:t, :t], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c.n_embd, c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c.n_embd, c.bias)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.block_size = c.block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),
            wpe=nn.Embedding(c.block_size, c.n_embd),
            drop=nn.Dropout(c.dropout),
            h=nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
            ln_f=LayerNorm(c.n_embd, c.bias),
        ))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        for name, p in self.named_parameters():
            if ".ln_" in name:
                continue
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.n_layer))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens):
        t = tokens.size(1)
        assert t <= self.block_size, f"{t} tokens > block_size {self.block_size}"
        pos = torch.arange(t, dtype=torch.long, device=tokens.device)
        x = self.transformer.drop(self.transformer.wte(tokens) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def sizes(parser):
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--bias", type=int, default=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["check"])
    parser.add_argument("dir")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    sizes(parser)
    a = parser.parse_args()
    a.bias = bool(a.bias)
    model = GPT(a)
    state = torch.load(f"{a.dir}/cohort_gpt.pt")
    # cohort registers the tied head once; this module's state dict names it twice.
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state)  # strict: every name and shape must match
    model.eval()
    io = torch.load(f"{a.dir}/cohort_gpt_io.pt")
    with torch.no_grad():
        logits = model(io["tokens"])
    diff = (logits - io["logits"]).abs().max().item()
    print(f"max logit difference {diff:.3g} (tolerance {a.tolerance:g})")
    return 0 if diff <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
