"""Images are preprocessed as the official evaluation does, identically on the host and on a device.

The transform (shorter side to floor(224 / 0.9) = 248 with bicubic, centre crop 224, ImageNet
normalisation) is checked against an independent rendering with torch's antialiased bicubic
interpolation, on real JPEG and PNG files of odd sizes and modes written here with Pillow.
Stated tolerance, in 8-bit levels of the image before normalisation: at most 6 levels at any
pixel and 0.3 on average (Pillow resizes in two 8-bit passes, torch in one float pass).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader

from hydra_edge.model.config import HydraConfig
from hydra_edge.runtime.preprocess import IMAGENET_MEAN, IMAGENET_STD, normalise
from hydra_edge.train.data import ImageFolder

MAX_LEVELS, MEAN_LEVELS = 6.0, 0.3

# name: (height, width, Pillow mode, format): portrait, landscape, grey, with alpha, tiny, already 248 short
IMAGES = {"portrait.jpg": (517, 333, "RGB", "JPEG"), "landscape.png": (333, 517, "RGB", "PNG"),
          "grey.png": (517, 333, "L", "PNG"), "alpha.png": (401, 300, "RGBA", "PNG"),
          "tiny.png": (7, 10, "RGB", "PNG"), "exact.jpg": (248, 300, "RGB", "JPEG")}


def _write_images(folder: Path) -> list[Path]:
    """Smooth patterns plus noise: resampling and a crop shifted by one pixel both show."""
    rng = np.random.default_rng(0)
    paths = []
    for name, (h, w, mode, fmt) in IMAGES.items():
        channels = len(mode)
        yy, xx = np.mgrid[0:h, 0:w]
        base = (127 + 100 * np.sin(xx / 7.0) * np.cos(yy / 11.0))[..., None] + rng.normal(0, 20, (h, w, channels))
        pixels = np.clip(base, 0, 255).astype(np.uint8)
        path = folder / name
        Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode).save(path, fmt)
        paths.append(path)
    return paths


def _official(path: Path, img_size: int, in_chans: int) -> np.ndarray:
    """The release's evaluation written with torch: resize the shorter side to 248 (aspect kept, longer
    side truncated), antialiased bicubic, crop the centre, scale to [0, 1], normalise."""
    mode = "L" if in_chans == 1 else "RGB"
    pixels = np.array(Image.open(path).convert(mode)).reshape(*Image.open(path).size[::-1], in_chans)
    x = torch.from_numpy(pixels).permute(2, 0, 1).float()[None]
    h, w = x.shape[-2:]
    short = int(img_size / 0.9)
    if min(h, w) != short:
        size = (int(short * h / w), short) if w <= h else (short, int(short * w / h))
        x = F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False).round().clamp(0, 255)
    h, w = x.shape[-2:]
    top, left = int(round((h - img_size) / 2)), int(round((w - img_size) / 2))
    x = x[0, :, top:top + img_size, left:left + img_size] / 255
    mean, std = ((0.5,), (0.5,)) if in_chans == 1 else (IMAGENET_MEAN, IMAGENET_STD)
    return ((x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]).numpy()


def _device(paths: list[Path], img_size: int, in_chans: int, out: Path) -> np.ndarray:
    """What a board computes: a process that imports only the runtime (numpy + Pillow, no torch)."""
    code = ("import sys, json, numpy as np\n"
            "from hydra_edge.runtime.preprocess import load_image\n"
            "paths, size, chans, out = json.loads(sys.argv[1])\n"
            "np.save(out, np.stack([load_image(p, size, chans) for p in paths]))\n"
            "assert 'torch' not in sys.modules\n")
    args = json.dumps([[str(p) for p in paths], img_size, in_chans, str(out)])
    proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


@pytest.mark.parametrize("in_chans", [3, 1])
def test_host_and_device_give_the_same_tensor_and_it_is_the_official_evaluation_transform(tmp_path, in_chans):
    paths = _write_images(tmp_path)
    cfg = HydraConfig(img_size=224, in_chans=in_chans, depth=1, num_classes=2)
    host = next(iter(DataLoader(ImageFolder([(p, 0) for p in paths], cfg), batch_size=len(paths))))[0].numpy()
    device = _device(paths, 224, in_chans, tmp_path / "device.npy")
    assert host.shape == device.shape == (len(paths), in_chans, 224, 224) and host.dtype == device.dtype == np.float32
    assert np.array_equal(host, device)  # one transform: training, checks and boards see the same numbers

    std = np.array((0.5,) if in_chans == 1 else IMAGENET_STD, np.float32)[:, None, None]
    for path, got in zip(paths, device):
        official = _official(path, 224, in_chans)
        levels = np.abs(got - official) * std * 255
        assert levels.max() <= MAX_LEVELS and levels.mean() <= MEAN_LEVELS, (path.name, levels.max(), levels.mean())
        squashed = normalise(np.asarray(Image.open(path).convert("L" if in_chans == 1 else "RGB")
                                        .resize((224, 224), Image.BILINEAR)), in_chans)  # what hydra-edge did before
        assert (np.abs(squashed - official) * std * 255).mean() > 10 * MEAN_LEVELS, path.name  # far outside it
