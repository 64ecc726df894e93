"""Real image tensors for the demo and the OIP conformance test.

Takes the photograph of Grace Hopper that ships in matplotlib's sample data,
cuts 8 different crops (with and without horizontal flip), resizes each to
224x224 and applies the standard ImageNet preprocessing (RGB, scale to [0, 1],
subtract mean (0.485, 0.456, 0.406), divide by std (0.229, 0.224, 0.225), CHW).
Writes OUT/images.f32 (little-endian float32, 8 x 3 x 224 x 224) and
OUT/images.json (what each sample is).
"""
import argparse
import json
import os

import matplotlib
import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/imagenet")
    args = ap.parse_args()
    src = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    img = Image.open(src).convert("RGB")
    w, h = img.size
    samples, notes = [], []
    for i, frac in enumerate([1.0, 0.9, 0.8, 0.7]):
        cw, ch = int(w * frac), int(h * frac)
        left, top = (w - cw) // 2, (h - ch) // 2
        crop = img.crop((left, top, left + cw, top + ch)).resize((224, 224), Image.BILINEAR)
        for flip in (False, True):
            im = crop.transpose(Image.FLIP_LEFT_RIGHT) if flip else crop
            x = (np.asarray(im, dtype=np.float32) / 255.0 - MEAN) / STD
            samples.append(x.transpose(2, 0, 1).copy())
            notes.append(f"grace_hopper.jpg center crop {int(frac * 100)}%{' flipped' if flip else ''}")
    arr = np.stack(samples).astype("<f4")
    os.makedirs(args.out, exist_ok=True)
    arr.tofile(os.path.join(args.out, "images.f32"))
    with open(os.path.join(args.out, "images.json"), "w") as f:
        json.dump({"source": src.split("site-packages/")[-1], "shape": [1, 3, 224, 224], "samples": notes}, f, indent=1)
    print(f"wrote {len(samples)} image tensors to {args.out}/images.f32")


if __name__ == "__main__":
    main()
