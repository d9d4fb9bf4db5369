"""A bundle of random weights in both layouts, for the benches that compare them."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from hydra_edge.convert.options import ConvertOptions
from hydra_edge.convert.pipeline import convert
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT


def full_and_compact(work: Path, preset_name: str, heads: tuple[int, ...], target: str, quant: str,
                     eval_images: int) -> tuple[Path, Path]:
    """The full bundle and its compacted copy of ``preset_name`` with random weights, under ``work``
    (conversion reused when unchanged); each artefact verified on ``eval_images`` random inputs."""
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / f"{preset_name}_random.pt"
    if not ckpt.is_file():
        torch.manual_seed(0)
        HydraViT(preset(preset_name)).save(ckpt)  # no data spec: verified on random inputs
    folder = work / f"{preset_name}_{target}_{quant}_h{'-'.join(map(str, heads))}"
    full, compact = folder / "full", folder / "compact"  # one pair per setting: a bundle keeps other heads
    options = dict(checkpoint=ckpt, target=target, quant=quant, heads=",".join(map(str, heads)), eval_limit=eval_images)

    def say(file: str, stage: str, size: int | None) -> None:
        print(f"  {file}: {stage}", flush=True)

    for out, layout in ((full, "full"), (compact, "compact")):
        if out is compact:
            shutil.rmtree(compact, ignore_errors=True)
            shutil.copytree(full, compact)  # the same verified artefacts: nothing is converted twice
        result = convert(ConvertOptions(out=out, layout=layout, **options), say)
        if result.failed:
            raise SystemExit(f"conversion failed: {result.failed[0]}")
    return full, compact
