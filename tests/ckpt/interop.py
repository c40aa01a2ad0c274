"""Side of the state-dict interoperability test that runs in PyTorch.

  interop.py export DIR   torchvision ResNet-18 weights as torch.save writes
                          them, plus an input and PyTorch's logits for it
  interop.py streamed DIR  loads DIR/streamed.pt (ckpt::StateDictWriter) and
                          compares it with DIR/streamed_ref.pt
  interop.py check DIR ARCH
                          loads cohort's weights (DIR/cohort_ARCH.pt) into
                          torchvision's model ARCH and compares logits with
                          cohort's (DIR/cohort_ARCH_io.pt)
"""
import sys

import torch
import torchvision


def main():
    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    if mode == "export":
        model = torchvision.models.resnet18(num_classes=10)
        # Non-trivial BatchNorm statistics, so buffers are checked too.
        model.train()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(4, 3, 64, 64))
        model.eval()
        x = torch.randn(2, 3, 64, 64)
        with torch.no_grad():
            y = model(x)
        torch.save(model.state_dict(), f"{out}/tv_resnet18.pt")
        torch.save({"input": x, "logits": y}, f"{out}/tv_io.pt")
        torch.save({"epoch": 3, "state_dict": model.state_dict(), "note": "checkpoint"},
                   f"{out}/tv_checkpoint.pt")
        return 0
    if mode == "check":
        arch = sys.argv[3]
        state = torch.load(f"{out}/cohort_{arch}.pt")
        assert isinstance(state, dict), type(state)
        model = getattr(torchvision.models, arch)(num_classes=10)
        model.load_state_dict(state)  # strict: every name and shape must match
        model.eval()
        io = torch.load(f"{out}/cohort_{arch}_io.pt")
        with torch.no_grad():
            y = model(io["input"])
        diff = (y - io["logits"]).abs().max().item()
        print(f"max |logits difference| = {diff:.3g}")
        return 0 if diff < 1e-4 else 1
    if mode == "streamed":
        # A state dict StateDictWriter wrote: every tensor as
        # DIR/streamed_ref.pt (saveStateDict) holds it, the tied names one storage.
        state = torch.load(f"{out}/streamed.pt")
        ref = torch.load(f"{out}/streamed_ref.pt")
        assert list(state) == list(ref), (list(state), list(ref))
        for name, t in ref.items():
            assert state[name].dtype == t.dtype and torch.equal(state[name], t), name
        assert state["w"].data_ptr() == state["w2"].data_ptr(), "aliases do not share storage"
        print("ok")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
