"""What the board demo app runs on: a real bundle whose held-out accuracy rises with heads, a table
for it, and images to classify.

``trained_accuracy`` gives an untrained bundle's artefacts a trained model's accuracies, ``table_for``
calibrates it with latencies that rise with heads and builds its table, and ``digit_images`` writes
images the digits models classify. Offers the ``board`` fixture (one per test module): all three for a
compact bundle converted for ``BOARD_TARGET``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hydra_edge.lut.make import make_lut
from hydra_edge.measure.session import bundle_record
from hydra_edge.records.calibration import Calibration, HeadResult
from hydra_edge.records.manifest import read_manifest

from .bundles import make_bundle
from .targets import BOARD_TARGET


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A converted bundle whose held-out accuracy rises with heads, its calibration and table, and images."""
    root = tmp_path_factory.mktemp("board")
    bundle = make_bundle(root, BOARD_TARGET, "3,6,12", layout="compact")  # 3 and 6 heads rebuilt on the board
    trained_accuracy(bundle)
    lut = table_for(bundle, root)
    return {"bundle": bundle, "lut": lut, "images": digit_images(root / "images"), "root": root}


def digit_images(images: Path) -> Path:
    """Twelve random 8x8 grey images in class folders 0, 1 and 2: what the digits models classify."""
    rng = np.random.default_rng(0)
    for label in range(3):
        (images / str(label)).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(images / str(label) / f"{i}.png")
    return images


def trained_accuracy(bundle: Path) -> None:
    """Give an untrained model's artefacts the held-out accuracy a trained one has: it rises with heads."""
    manifest_file = bundle / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    for a in manifest["artefacts"]:
        a["accuracy"]["top1"] = 80.0 + a["heads"]
    manifest_file.write_text(json.dumps(manifest))


def table_for(bundle: Path, root: Path) -> Path:
    """A calibration of ``bundle`` whose latencies rise with heads, and its lookup table; returns lut.json."""
    records = read_manifest(bundle)
    ms = {3: 1.0, 6: 6.0, 12: 9.0}  # budget 10: 12 heads when cool on mains, 3 when very hot or nearly empty
    calibration = Calibration("local:test", {}, bundle_record(bundle, records), {"runs": 5}, results=[
        HeadResult(a.heads, a.id, a.sha256, "ok", "python", latency={"count": 5, "mean_ms": ms[a.heads], "p50_ms": ms[a.heads]})
        for a in records.artefacts])
    calibration.write(root / "calibration.json")
    make_lut(bundle, root / "calibration.json", root / "lut", budget_ms=10.0)
    return root / "lut" / "lut.json"
