"""A bundle's layout after conversion: ``full`` (one file per artefact) or ``compact`` (one weight set).

In a compact bundle each variant's largest head count keeps its artefact whole and every other
head count keeps a skeleton and a recipe (``convert.compact``) that rebuild its verified bytes.
A format without a tensor map keeps full files, and the manifest's notes say why. Each artefact
is switched on its own: new files are written, then the manifest, then the old files removed, so
an interrupted run leaves a bundle that reads (at worst with one file too many). A compact bundle
also stores the golden inputs once (``convert.golden``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List

import msgspec
import numpy as np

from ..atomic import sha256_file, write_bytes
from ..errors import HydraEdgeError
from ..records.codec import read_bytes
from ..records.manifest import ArtefactRecord, Compact, Manifest
from ..records.recipe import read_recipe
from ..runtime.bundle_files import ARTEFACT_MAX_BYTES
from ..runtime.rebuild import rebuild
from .compact import Largest, Tensor, compact, largest
from .formats import exporter
from .golden import share_inputs, unshare_inputs

LAYOUTS = ("full", "compact")
Report = Callable[[str, str, "int | None"], None]


def skeleton_name(file: str) -> str:
    return f"{Path(file).stem}.skeleton"


def recipe_name(file: str) -> str:
    return f"{Path(file).stem}.recipe.json"


def _variant(record: ArtefactRecord) -> str:
    return record.id.split("_", 1)[1]  # "h6_onnx_fp16" -> "onnx_fp16"


def _replace(manifest: Manifest, out: Path, record: ArtefactRecord, layout: str | None, **changes: Any) -> None:
    notes = {k: v for k, v in record.notes.items() if k != "layout"}
    manifest.put(msgspec.structs.replace(record, notes={**notes, **({"layout": layout} if layout else {})}, **changes))
    manifest.write(out)


def _artefact(out: Path, record: ArtefactRecord) -> bytes:
    """A whole artefact of the bundle, read as every bundle file is (without blocking, at most its size)."""
    return read_bytes(out / record.file, "artefact", "re-run hydra-edge convert into a new folder",
                      max_bytes=min(record.bytes, ARTEFACT_MAX_BYTES))


def _expand(out: Path, manifest: Manifest, record: ArtefactRecord) -> None:
    """A compact artefact back to its full file (verified by ``rebuild``)."""
    write_bytes(out / record.file, rebuild(out, record))
    recipe = read_recipe(out / record.compact.recipe)
    _replace(manifest, out, record, None, compact=None)
    for name in (recipe.skeleton.file, record.compact.recipe):
        (out / name).unlink(missing_ok=True)


def _compact(out: Path, manifest: Manifest, record: ArtefactRecord, source: Callable[[], Largest],
             tensor_map: Callable[[bytes], List[Tensor]], index: Any) -> None:
    data = _artefact(out, record)
    try:
        # the largest artefact is read on first use, inside the try: a map it cannot give is a note too
        done = compact(record.heads, record.file, data, tensor_map(data), source(), index, skeleton_name(record.file))
    except ValueError as e:
        _replace(manifest, out, record, f"full: {e}")
        return
    write_bytes(out / done.recipe.skeleton.file, done.skeleton)
    recipe = out / recipe_name(record.file)
    write_bytes(recipe, done.recipe.encode(str(recipe)))
    stored = len(done.skeleton)
    _replace(manifest, out, record, f"compact: {stored} of {record.bytes} bytes in {done.recipe.skeleton.file}, "
                                    f"{len(done.recipe.ranges)} weight ranges from {done.recipe.source.file}",
             compact=Compact(recipe=recipe.name, sha256=sha256_file(recipe)))
    (out / record.file).unlink()


def _model_params(checkpoint: str, ema: bool) -> tuple[Dict[str, np.ndarray], Any]:
    from ..model.checkpoint import load_checkpoint
    from ..model.slicing import weight_index

    model = load_checkpoint(checkpoint, ema=ema)
    params = {name: p.detach().float().numpy() for name, p in model.named_parameters()}
    return params, lambda name, k: weight_index(name, model.config, k)


def apply_layout(out: Path, manifest: Manifest, layout: str, checkpoint: str, report: Report,
                 ema: bool = True) -> None:
    """Bring every artefact of ``manifest`` to ``layout``; rewrites the manifest after each change."""
    if layout not in LAYOUTS:
        raise HydraEdgeError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    groups: Dict[str, List[ArtefactRecord]] = {}
    for record in manifest.artefacts:
        groups.setdefault(_variant(record), []).append(record)
    sources = {variant: max(records, key=lambda r: r.heads) for variant, records in groups.items()}
    for record in list(manifest.artefacts):  # every expansion first: a recipe may read a file about to go
        source = sources[_variant(record)]
        if record.compact is not None and (layout == "full" or record is source
                                           or read_recipe(out / record.compact.recipe).source.file != source.file):
            report(record.file, "expand", None)
            _expand(out, manifest, record)
    if layout == "full":
        unshare_inputs(out, manifest)
        return
    model: tuple[Dict[str, np.ndarray], Any] | None = None
    read: Dict[str, Largest] = {}  # each variant's largest artefact, read and identified once

    def largest_of(source: ArtefactRecord, tensor_map: Callable[[bytes], List[Tensor]]) -> Largest:
        if source.id not in read:
            data = _artefact(out, source)
            read[source.id] = largest(source.file, data, tensor_map(data), source.heads, *model)
        return read[source.id]

    for record in list(manifest.artefacts):
        source = manifest.by_id()[sources[_variant(record)].id]
        if record.compact is not None or record.heads == source.heads:
            continue
        tensor_map = getattr(exporter(record.format), "tensor_map", None)
        if tensor_map is None:
            _replace(manifest, out, record, f"full: hydra-edge cannot compact {record.format} artefacts yet")
            continue
        report(record.file, "compact", None)
        model = model or _model_params(checkpoint, ema)
        _, index = model
        _compact(out, manifest, record, lambda: largest_of(source, tensor_map), tensor_map, index)
        report(record.file, "done", manifest.by_id()[record.id].bytes)
    share_inputs(out, manifest)
