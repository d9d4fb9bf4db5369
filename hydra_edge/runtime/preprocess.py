"""Image preprocessing, numpy and Pillow only: the same pixels on the host (training, checks) and the device.

Images go through the evaluation transform of DeiT and the official HydraViT release (timm's
``transforms_imagenet_eval`` with the models' crop_pct 0.9 and bicubic interpolation): the
shorter side is resized to ``floor(img_size / 0.9)`` (248 for 224) keeping the aspect ratio,
the centre ``img_size`` square is cropped, and the pixels are normalised. Grayscale models are
normalised with mean = std = 0.5, colour models with ImageNet's statistics, as both were trained.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Tuple, Union

import numpy as np

from ..errors import HydraEdgeError

if TYPE_CHECKING:
    from PIL import Image

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".ppm", ".gif", ".tif", ".tiff"}
CROP_PCT = 0.9  # the crop is this fraction of the resized image's shorter side


def normalisation(in_chans: int) -> Tuple[Sequence[float], Sequence[float]]:
    return ((0.5,), (0.5,)) if in_chans == 1 else (IMAGENET_MEAN, IMAGENET_STD)


def normalise(pixels: np.ndarray, in_chans: int) -> np.ndarray:
    """(H, W[, C]) uint8 pixels -> (C, H, W) float32, normalised for the model."""
    a = pixels.astype(np.float32).reshape(pixels.shape[0], pixels.shape[1], -1) / 255.0
    mean, std = normalisation(in_chans)
    a = (a - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def resize_size(img_size: int) -> int:
    """The shorter side before the centre crop: ``floor(224 / 0.9) = 248``, as timm computes it."""
    return math.floor(img_size / CROP_PCT)


def transform(im: "Image.Image", img_size: int, in_chans: int) -> np.ndarray:
    """The evaluation transform on a decoded image: (C, H, W) float32, ready for the model.

    Colour modes become RGB (alpha dropped, as PIL's ``convert`` does for timm's loader) or L.
    Sizes and the crop's corner are computed as torchvision's ``Resize(int)`` and ``CenterCrop``
    do, so the pixels are those of the official evaluation.
    """
    from PIL import Image

    im = im.convert("L" if in_chans == 1 else "RGB")
    size, (w, h) = resize_size(img_size), im.size
    if min(w, h) != size:  # the longer side scaled by the same factor, truncated
        im = im.resize((size, int(size * h / w)) if w <= h else (int(size * w / h), size), Image.BICUBIC)
    w, h = im.size
    left, top = int(round((w - img_size) / 2.0)), int(round((h - img_size) / 2.0))
    return normalise(np.asarray(im.crop((left, top, left + img_size, top + img_size))), in_chans)


def load_image(path: Union[str, Path], img_size: int, in_chans: int) -> np.ndarray:
    """Read an image file with Pillow and apply ``transform``: (C, H, W) float32."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return transform(im, img_size, in_chans)
    except OSError as e:
        raise HydraEdgeError(f"cannot read image {path}: {e}; remove or replace it") from None
