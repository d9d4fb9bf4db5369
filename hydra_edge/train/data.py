"""Data: scikit-learn's digits (built in, no download) or an ImageFolder-style directory.

Both give a deterministic train / held-out split from a ``DataSpec``, which checkpoints store so
that later stages (conversion, its accuracy checks) see exactly the same held-out images.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from ..errors import HydraEdgeError
from ..model.config import HydraConfig
from ..runtime.preprocess import IMAGE_SUFFIXES, load_image, normalisation


@dataclass(frozen=True)
class DataSpec:
    """Where the data comes from and how it is split; ``source`` is ``"digits"`` or a folder."""

    source: str = "digits"
    seed: int = 0
    val_fraction: float = 0.2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DataSpec":
        return cls(**d)


@dataclass
class DataSplits:
    train: Dataset
    val: Dataset
    classes: list[str]
    spec: DataSpec


def _stratified_split(labels: np.ndarray, spec: DataSpec) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    train, val = train_test_split(idx, test_size=spec.val_fraction, random_state=spec.seed, stratify=labels)
    return np.sort(train), np.sort(val)


def _fit_channels_and_size(x: torch.Tensor, cfg: HydraConfig) -> torch.Tensor:
    """(N, C, H, W) pixels in [0, 1] -> the model's channels and size."""
    if x.shape[1] != cfg.in_chans:
        x = x.mean(1, keepdim=True).expand(-1, cfg.in_chans, -1, -1)
    if x.shape[-1] != cfg.img_size or x.shape[-2] != cfg.img_size:
        x = torch.nn.functional.interpolate(x, size=(cfg.img_size, cfg.img_size), mode="bilinear", align_corners=False)
    return x.contiguous()


def _digits(cfg: HydraConfig, spec: DataSpec) -> DataSplits:
    from sklearn.datasets import load_digits

    digits = load_digits()
    _check_classes("digits", 10, cfg)
    x = _fit_channels_and_size(torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0, cfg)
    mean, std = normalisation(cfg.in_chans)  # the device's, so a board feeds the pixels training saw
    x = (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]  # (N, C, H, W)
    y = torch.tensor(digits.target, dtype=torch.long)
    train, val = _stratified_split(digits.target, spec)
    classes = [str(c) for c in digits.target_names]
    return DataSplits(TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]), classes, spec)


class ImageFolder(Dataset):
    """Images under ``root/<class>/``, read lazily with the device's preprocessing (the release's evaluation
    transform, ``runtime.preprocess.transform``), so training, checks and boards see the same pixels."""

    def __init__(self, files: list[tuple[Path, int]], cfg: HydraConfig) -> None:
        self.files, self.cfg = files, cfg

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[i]
        return torch.from_numpy(load_image(path, self.cfg.img_size, self.cfg.in_chans)), label


def _scan(root: Path, classes: list[str] | None = None) -> tuple[list[tuple[Path, int]], list[str]]:
    classes = classes or _class_dirs(root)
    files = [
        (f, i)
        for i, c in enumerate(classes)
        if (root / c).is_dir()
        for f in sorted((root / c).rglob("*"))
        if f.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not classes or not files:
        raise HydraEdgeError(f"no images found under {root}: expected one sub-folder of images per class")
    return files, classes


def _image_folder(cfg: HydraConfig, spec: DataSpec) -> DataSplits:
    root = Path(spec.source)
    if not root.is_dir():
        raise HydraEdgeError(f"data {spec.source!r} is neither 'digits' nor a folder; give a class-per-folder directory")
    if _presplit(root):
        train, classes = _scan(root / "train")
        val, _ = _scan(root / "val", classes)
    else:
        files, classes = _scan(root)
        labels = np.array([label for _, label in files])
        try:
            tr, va = _stratified_split(labels, spec)
        except ValueError:  # scikit-learn: a class too small to be in both splits
            fewest = classes[int(np.bincount(labels, minlength=len(classes)).argmin())]
            raise HydraEdgeError(f"{root}: class {fewest!r} has too few images to split off "
                                 f"{spec.val_fraction:.0%} for validation; add images or use train/ and val/ folders") from None
        train, val = [files[i] for i in tr], [files[i] for i in va]
    _check_classes(root, len(classes), cfg)
    return DataSplits(ImageFolder(train, cfg), ImageFolder(val, cfg), classes, spec)


def load_data(spec: DataSpec | str, cfg: HydraConfig) -> DataSplits:
    """The train and held-out splits of ``spec``, preprocessed for ``cfg``'s input size and channels."""
    spec = DataSpec(spec) if isinstance(spec, str) else spec
    return _digits(cfg, spec) if spec.source == "digits" else _image_folder(cfg, spec)


def as_arrays(dataset: Dataset, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``limit`` samples as numpy arrays: images (N, C, H, W) float32 and labels int64."""
    n = len(dataset) if limit is None else min(limit, len(dataset))
    xs, ys = zip(*(dataset[i] for i in range(n)))
    return torch.stack(xs).numpy().astype(np.float32), np.array([int(y) for y in ys], dtype=np.int64)


def data_classes(source: str) -> list[str]:
    """Class names of a data source, known before the model is built (sizes its classifier)."""
    if source == "digits":
        return [str(d) for d in range(10)]
    root = Path(source)
    if not root.is_dir():
        raise HydraEdgeError(f"data {source!r} is neither 'digits' nor a folder; give a class-per-folder directory")
    scan = root / "train" if _presplit(root) else root
    classes = _class_dirs(scan)
    if not classes:
        raise HydraEdgeError(f"no class folders under {scan}: expected one sub-folder of images per class")
    return classes


def _presplit(root: Path) -> bool:
    """The folder holds its own split: ``train/<class>/`` and ``val/<class>/``."""
    return (root / "train").is_dir() and (root / "val").is_dir()


def _check_classes(source: object, found: int, cfg: HydraConfig) -> None:
    if found != cfg.num_classes:
        raise HydraEdgeError(f"{source} has {found} classes but the model has {cfg.num_classes}; "
                             "use data with the model's classes, or train a new model on this data")


def _class_dirs(root: Path) -> list[str]:
    return sorted(d.name for d in root.iterdir() if d.is_dir())
