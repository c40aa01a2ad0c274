"""Modules a user might script for cohort's `model.arch: torchscript`, made
at test time with Debian's python3-torch, and the check that cohort's trained
weights load back into the Python module.

  scripted_models.py make DIR KIND...   scripts each KIND to DIR/KIND.pt (torch.jit.save)
                                        and saves its initial state dict to DIR/KIND.pt.init.pt
  scripted_models.py check KIND WEIGHTS IO
                                        loads WEIGHTS (cohort's model/final.pt)
                                        strictly into KIND and compares its
                                        outputs on IO's "inputs" with IO's "logits"

KIND: cnn (images [B, 1, 8, 8] -> [B, 4], with BatchNorm and dropout),
bigram (tokens [B, T] -> [B, T, 256]), two_inputs and returns_tuple (forwards
cohort must refuse), wrong_classes (images -> [B, 3]).
"""

import sys
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cnn(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(8 * 4 * 4, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2))


class Bigram(nn.Module):
    def __init__(self, vocab: int = 256):
        super().__init__()
        self.table = nn.Embedding(vocab, 64)
        self.out = nn.Linear(64, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.table(tokens)))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1)) + bias


class ReturnsTuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x.flatten(1))
        return y, y


KINDS = {"cnn": Cnn, "bigram": Bigram, "two_inputs": TwoInputs, "returns_tuple": ReturnsTuple,
         "wrong_classes": lambda: Cnn(3)}


def main(argv):
    torch.manual_seed(0)
    if argv[1] == "make":
        for kind in argv[3:]:
            torch.manual_seed(0)
            module = KINDS[kind]()
            out = f"{argv[2]}/{kind}.pt"
            torch.jit.save(torch.jit.script(module), out)
            torch.save(module.state_dict(), out + ".init.pt")
        return 0
    if argv[1] == "check":
        module = KINDS[argv[2]]()
        module.load_state_dict(torch.load(argv[3]), strict=True)
        module.eval()
        io = torch.load(argv[4])
        with torch.no_grad():
            got = module(io["inputs"])
        diff = (got - io["logits"]).abs().max().item()
        print(f"max difference {diff:.3g}")
        return 0 if diff <= 1e-5 else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
