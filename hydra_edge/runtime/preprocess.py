"""Image preprocessing, numpy only: the same pixels on the host (training, checks) and the device.

Grayscale models are normalised with mean = std = 0.5, colour models with ImageNet's statistics,
as DeiT and the official HydraViT release were trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, Tuple, Union

import numpy as np

from ..errors import HydraEdgeError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".ppm", ".gif", ".tif", ".tiff"}


def normalisation(in_chans: int) -> Tuple[Sequence[float], Sequence[float]]:
    return ((0.5,), (0.5,)) if in_chans == 1 else (IMAGENET_MEAN, IMAGENET_STD)


def normalise(pixels: np.ndarray, in_chans: int) -> np.ndarray:
    """(H, W[, C]) uint8 pixels -> (C, H, W) float32, normalised for the model."""
    a = pixels.astype(np.float32).reshape(pixels.shape[0], pixels.shape[1], -1) / 255.0
    mean, std = normalisation(in_chans)
    a = (a - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def load_image(path: Union[str, Path], img_size: int, in_chans: int) -> np.ndarray:
    """Read an image file with PIL, resize it to the model's input and normalise: (C, H, W) float32."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("L" if in_chans == 1 else "RGB").resize((img_size, img_size), Image.BILINEAR)
            return normalise(np.asarray(im), in_chans)
    except OSError as e:
        raise HydraEdgeError(f"cannot read image {path}: {e}; remove or replace it") from None
