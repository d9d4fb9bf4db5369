"""The bundle's manifest: a versioned JSON record of every artefact, rewritten atomically after each.

Readers (the calibrator, the lookup table, the switcher) take ``read_manifest`` and get
``Manifest`` / ``ArtefactRecord`` dataclasses; they never parse the JSON themselves. The file is
always a complete, valid manifest: it is replaced whole, never appended to.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import read_json, sha256_file, write_json
from ..errors import HydraEdgeError

SCHEMA = "hydra-edge/bundle"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"




@dataclass
class ArtefactRecord:
    """One converted, verified subnetwork. ``file`` and ``golden['file']`` are relative to the bundle."""

    id: str  # "h6_executorch_int8-dynamic"
    heads: int
    format: str  # a key of hydra_edge.runtime.engines.FORMATS
    quant: str
    file: str
    bytes: int
    sha256: str
    params: int
    gmacs: float
    runtime: str  # what runs it on the device, e.g. "ai-edge-litert", "tensorrt"
    runtime_min_version: str
    threads: int  # the target's thread count
    host_runtime: str  # what verified it on the host, e.g. "onnxruntime 1.31.1"
    convert_seconds: float
    accuracy: dict[str, Any]  # basis, images, top1, fp32_top1, drop_pp, agreement, max_abs_diff
    golden: dict[str, Any]  # file, sha256, inputs, tolerance{max_abs_diff, min_top1_agreement, ...}
    fingerprint: str  # hash of everything that decides the file; equal -> skip on re-run
    device_build: str | None = None  # e.g. the trtexec command that builds the device engine
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Manifest:
    checkpoint: dict[str, Any]  # path, sha256
    model: dict[str, Any]  # HydraConfig.to_dict()
    data: dict[str, Any] | None  # the DataSpec verified on, None for random inputs
    target: dict[str, Any]  # Target.to_dict() + sha256
    tools: dict[str, str | None]  # pip package -> version
    max_drop: float
    artefacts: list[ArtefactRecord] = field(default_factory=list)
    created_by: str = ""
    classes: list[str] | None = None  # class names in logit order (from the training data), None if unknown
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        head = {"schema": d.pop("schema"), "schema_version": d.pop("schema_version")}
        return {**head, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = MANIFEST) -> "Manifest":
        if d.get("schema") != SCHEMA:
            raise HydraEdgeError(f"{where} is not a hydra-edge bundle manifest (schema {d.get('schema')!r})")
        if d.get("schema_version") != SCHEMA_VERSION:
            raise HydraEdgeError(
                f"{where} has schema version {d.get('schema_version')}, this hydra-edge reads {SCHEMA_VERSION}; "
                "re-run hydra-edge convert into a new folder"
            )
        d = dict(d)
        try:
            arts = [ArtefactRecord(**a) for a in d.pop("artefacts")]
            return cls(**d, artefacts=arts)
        except (TypeError, KeyError) as e:
            raise HydraEdgeError(f"{where} is damaged or from another hydra-edge ({e})") from None

    def by_id(self) -> dict[str, ArtefactRecord]:
        return {a.id: a for a in self.artefacts}

    def put(self, record: ArtefactRecord) -> None:
        """Add or replace a record, keeping artefacts ordered by heads, format, quant."""
        records = {**self.by_id(), record.id: record}
        self.artefacts = sorted(records.values(), key=lambda a: (a.heads, a.format, a.quant))

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / MANIFEST
        write_json(path, self.to_dict())
        return path


def read_manifest(folder_or_file: str | Path) -> Manifest:
    """Read ``bundle/manifest.json`` (or the file itself), checking schema and version."""
    path = Path(folder_or_file)
    path = path / MANIFEST if path.is_dir() else path
    return Manifest.from_dict(read_json(path, "manifest", "run hydra-edge convert first"), str(path))


def intact(folder: str | Path, record: ArtefactRecord) -> bool:
    """The artefact and its golden pair exist and still have the recorded sha256."""
    folder = Path(folder)
    files = [(folder / record.file, record.sha256), (folder / record.golden["file"], record.golden["sha256"])]
    return all(p.is_file() and sha256_file(p) == sha for p, sha in files)
