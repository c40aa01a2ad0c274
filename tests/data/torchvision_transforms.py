"""torchvision's ImageNet transforms on one image, for tests/data/image_test.cc.
Writes the ToTensor output of each SPEC (channel-major float32, raw),
one after the other, to OUT:

    python3 torchvision_transforms.py IMG OUT SPEC...
    SPEC: eval:RESIZE:CROP                   Resize(RESIZE), CenterCrop(CROP)
          crop:TOP:LEFT:HEIGHT:WIDTH:SIZE    resized_crop to SIZE x SIZE
"""
import sys

import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image


def main():
    path, out, *specs = sys.argv[1:]
    with open(path, "rb") as f:
        img = Image.open(f).convert("RGB")  # as ImageFolder's loader
    xs = []
    for spec in specs:
        mode, *args = spec.split(":")
        if mode == "eval":
            xs.append(T.Compose([T.Resize(int(args[0])), T.CenterCrop(int(args[1])),
                                 T.ToTensor()])(img))
        elif mode == "crop":
            top, left, height, width, size = map(int, args)
            xs.append(T.ToTensor()(F.resized_crop(img, top, left, height, width, [size, size])))
        else:
            sys.exit(f"unknown spec {spec}")
    torch.cat([x.to(torch.float32).flatten() for x in xs]).numpy().tofile(out)


if __name__ == "__main__":
    main()
