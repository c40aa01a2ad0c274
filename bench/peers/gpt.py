"""cohort's GPT (include/cohort/models/gpt.h) as a PyTorch module: the same
architecture, parameter names and initialization, for side-by-side runs and
for checking that cohort's weights load here and give the same logits.

  gpt.py check DIR [sizes] [--weights FILE]
      loads cohort's state dict (DIR/cohort_gpt.pt, or FILE: a run's
      model/final.pt) into GPT(sizes) strictly, runs DIR/cohort_gpt_io.pt's
      "tokens" and compares the logits with its "logits"; exit 1 when they
      differ by more than --tolerance

  gpt.py ddp [sizes] --batch B --world N --steps S --warmup W --threads T
             --precision fp32|bf16 --port P
      PyTorch's own DDP training GPT(sizes), the baseline bench/gpt.cc runs
      side by side with cohort: N ranks (spawned), gloo on 127.0.0.1, T
      intra-op threads each, AdamW as examples/gpt-kjv.yaml, a fixed random
      batch of B windows (no data loading), the forward under CPU autocast
      to bfloat16 with bf16 and the loss in float32 (as cohort computes
      it); timed over S steps after W. Prints one JSON line: tokens/s over
      all ranks and per-phase means (forward incl. the loss, backward incl.
      the allreduce, optimizer) of rank 0.

The state dict of this module, like nanoGPT's, lists the tied output head
twice: transformer.wte.weight and lm_head.weight, one tensor.
"""
import argparse
import math
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ddp_harness import add_launch_arguments, init_rank, spawn, timed_steps


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


def check(a):
    model = GPT(a)
    # cohort's model/final.pt names the tied head twice, as this module does.
    state = torch.load(a.weights or f"{a.dir}/cohort_gpt.pt")
    model.load_state_dict(state)  # strict: every name and shape must match
    model.eval()
    io = torch.load(f"{a.dir}/cohort_gpt_io.pt")
    with torch.no_grad():
        logits = model(io["tokens"])
    diff = (logits - io["logits"]).abs().max().item()
    print(f"max logit difference {diff:.3g} (tolerance {a.tolerance:g})")
    return 0 if diff <= a.tolerance else 1


def ddp_rank(rank, a, out):
    launch = init_rank(rank, a, out)
    if launch is None:
        return
    model = GPT(a)
    # The causal masks are constant buffers, the same on every rank, and bool:
    # gloo cannot broadcast them (DDP's sync at wrap time fails "Invalid
    # scalar type"). With them ignored DDP has no buffer to broadcast before
    # each forward, as cohort sends none.
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [name for name, _ in model.named_buffers()])
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.AdamW(net.parameters(), lr=0.003, betas=(0.9, 0.99), weight_decay=0.1)
    x = torch.randint(0, a.vocab_size, (a.batch, a.block_size))
    y = torch.randint(0, a.vocab_size, (a.batch, a.block_size))
    bf16 = a.precision == "bf16"

    def loss_fn():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = net(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    elapsed, phase_ms = timed_steps(loss_fn, opt, a.warmup, a.steps)
    if rank == 0:
        out.put({
            "peer": "pytorch_ddp_gpt", "n_layer": a.n_layer, "n_head": a.n_head,
            "n_embd": a.n_embd, "block_size": a.block_size, "vocab_size": a.vocab_size,
            "batch": a.batch, "world": a.world, "threads": a.threads, "steps": a.steps,
            "tokens_per_s": a.batch * a.block_size * a.world * a.steps / elapsed,
            "step_ms": 1000 * elapsed / a.steps,
            "phase_ms": phase_ms,
            "precision": a.precision, "torch": torch.__version__,
            "launch": launch,
        })
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    c = modes.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--tolerance", type=float, default=1e-4)
    c.add_argument("--weights", default=None)
    sizes(c)
    d = modes.add_parser("ddp")
    d.add_argument("--batch", type=int, default=16)
    d.add_argument("--world", type=int, default=1)
    add_launch_arguments(d)
    d.add_argument("--steps", type=int, default=30)
    d.add_argument("--warmup", type=int, default=5)
    d.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    d.add_argument("--bucket-mb", type=float, default=25)
    d.add_argument("--port", type=int, default=29555)
    sizes(d)
    a = parser.parse_args()
    a.bias = bool(a.bias)
    return check(a) if a.mode == "check" else spawn(ddp_rank, a)


if __name__ == "__main__":
    sys.exit(main())
