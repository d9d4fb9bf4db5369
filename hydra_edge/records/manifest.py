"""The bundle manifest (``manifest.json``, schema ``hydra-edge/bundle`` v1): every artefact of a bundle.

``convert`` writes it whole after each artefact; the calibrator, the lookup table, the switcher
and the board app read it. Nested tables that readers index like dicts (``golden``,
``accuracy``, ``model``, ``target``) stay dicts and are checked against their schema here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Dict, Iterable, List, Literal, Optional, Tuple, Union

import msgspec
from msgspec import Meta

from ..atomic import sha256_file, write_bytes
from ..errors import HydraEdgeError
from . import codec
from .config import ModelConfig
from .fields import (Format, Heads, Name, NonNegative, NonNegFloat, Percent, Positive, Ratio, Sha256, Threads, check,
                     relative_path)
from .recipe import decode_recipe
from .target import TargetRecord

SCHEMA = "hydra-edge/bundle"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
LOCK = ".lock"  # in the bundle folder: one writer at a time (convert, or expand writing its --out)
HINT = "re-run hydra-edge convert into a new folder"


PointsPP = Annotated[float, Meta(ge=-100.0, le=100.0)]  # a difference of two percentages
ClassNames = Annotated[List[Name], Meta(min_length=1, max_length=1 << 24)]  # in logit order
Decibels = Annotated[float, Meta(ge=-1000.0, le=1000.0)]


class Tolerance(msgspec.Struct, forbid_unknown_fields=True):
    """How close a device's outputs on the golden inputs must be to the fp32 reference."""

    max_abs_diff: NonNegFloat
    min_top1_agreement: Ratio
    host_max_abs_diff: NonNegFloat
    host_top1_agreement: Ratio


class Golden(msgspec.Struct, forbid_unknown_fields=True):
    """The golden pair: ``file`` holds the reference and host outputs, and the inputs unless ``inputs_file``
    names a file the bundle shares between head counts (their inputs are the same; b16: 4.6 MiB each)."""

    file: str  # relative to the bundle
    sha256: Sha256
    inputs: Positive
    reference: str
    tolerance: Tolerance
    inputs_file: Optional[str] = None  # relative to the bundle; None: the inputs are in ``file``
    inputs_sha256: Optional[Sha256] = None

    def __post_init__(self) -> None:
        if (self.inputs_file is None) != (self.inputs_sha256 is None):
            pair = ("inputs_file", "inputs_sha256")
            given, missing = pair if self.inputs_sha256 is None else pair[::-1]
            raise ValueError(f"`.{missing}`: missing, and `.{given}` needs it")
        if self.inputs_file is not None:
            relative_path(self.inputs_file, ".inputs_file")


class Evidence(msgspec.Struct, forbid_unknown_fields=True):
    """A gate's decision on paired outcomes: the same images judged under a reference choice and a
    candidate (fp32 against the artefact; own weight scales against nested ones).

    ``worse``: images right under the reference and wrong under the candidate; ``better``: the other
    way round (right = the label's class, or the fp32 top-1 where there are no labels). ``cost_pp``
    is their difference over ``images``, ``low_pp``..``high_pp`` its 95 % interval (Newcombe's hybrid
    score interval for paired proportions). ``logit_cost_pp`` is the cost the outputs' error predicts
    (``convert/evidence.py``). ``decided_by``: "images" where the interval lies wholly on one side of
    ``bound_pp``, else "logits": the images cannot tell, and the predicted cost is held to the bound.
    """

    images: NonNegative
    reference_right: NonNegative
    worse: NonNegative
    better: NonNegative
    cost_pp: PointsPP
    low_pp: PointsPP
    high_pp: PointsPP
    logit_cost_pp: PointsPP
    bound_pp: PointsPP
    decided_by: Literal["images", "logits"]
    passed: bool

    def __post_init__(self) -> None:
        if self.worse > self.reference_right or self.reference_right + self.better > self.images:
            raise ValueError("`.worse`, `.better` and `.reference_right` count more images than `.images`")


class Accuracy(msgspec.Struct, forbid_unknown_fields=True):
    """Top-1 of the artefact and its fp32 subnetwork (None without labels), on ``images`` held-out inputs;
    ``evidence``: how the conversion gate judged the drop (None without labels: nothing to lose)."""

    basis: str
    images: NonNegative
    top1: Optional[Percent]
    fp32_top1: Optional[Percent]
    drop_pp: Optional[PointsPP]
    agreement: Percent
    max_abs_diff: NonNegFloat
    evidence: Optional[Evidence] = None


class Checkpoint(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    sha256: Sha256
    weights: str = "state_dict"  # the file's entry converted: "state_dict_ema" / "model_ema" are EMA weights


class Compact(msgspec.Struct, forbid_unknown_fields=True):
    """Where a compact bundle keeps an artefact: the recipe that rebuilds it (``records.recipe``)."""

    recipe: str  # relative to the bundle
    sha256: Sha256

    def __post_init__(self) -> None:
        relative_path(self.recipe, ".recipe")


class Nesting(msgspec.Struct, forbid_unknown_fields=True):
    """How an int8 artefact's weights were quantised, and the measurement that chose it.

    ``nested``: its int8 weights and scales are slices of the largest head count's (a compact
    bundle can rebuild it from those bytes); otherwise quantised on its own, because nesting
    cost more than ``max_cost_pp`` of top-1 (``cost_pp``: per-subnetwork minus nested, in top-1,
    or in agreement with fp32 without labels). Measured on the held-out images as ``basis`` says.
    """

    nested: bool
    basis: str
    images: NonNegative
    top1_nested: Optional[Percent]
    top1_per_subnetwork: Optional[Percent]
    agreement_nested: Percent  # top-1 agreement with the fp32 subnetwork
    agreement_per_subnetwork: Percent
    cost_pp: PointsPP
    max_cost_pp: PointsPP  # the target's ``nest_max_cost_pp`` (default 0.3); below 0, nesting must gain
    sqnr_db_nested: Optional[Decibels] = None  # logits against fp32, both choices of scales
    sqnr_db_per_subnetwork: Optional[Decibels] = None
    evidence: Optional[Evidence] = None  # how ``nested`` was decided (own scales the reference, nested the candidate)


class ArtefactRecord(msgspec.Struct, forbid_unknown_fields=True):
    """One converted, verified subnetwork. ``file`` and the golden pair's files are relative to the bundle.

    ``file``, ``bytes`` and ``sha256`` always describe the full artefact verified at convert time;
    with ``compact`` the bundle holds no such file but a recipe that rebuilds exactly those bytes.
    """

    id: Name  # "h6_executorch_int8-dynamic"
    heads: Heads
    format: Format
    quant: Name
    file: str
    bytes: NonNegative
    sha256: Sha256
    params: NonNegative
    gmacs: NonNegFloat
    runtime: Name  # what runs it on the device, e.g. "ai-edge-litert", "tensorrt"
    runtime_min_version: Name
    threads: Threads  # the target's thread count
    host_runtime: str  # what verified it on the host, e.g. "onnxruntime 1.31.1"
    convert_seconds: NonNegFloat
    accuracy: Dict[str, Any]  # Accuracy
    golden: Dict[str, Any]  # Golden
    fingerprint: Name  # hash of everything that decides the file; equal -> skip on re-run
    device_build: Optional[str] = None  # e.g. the trtexec command that builds the device engine
    notes: Dict[str, Any] = msgspec.field(default_factory=dict)
    compact: Optional[Compact] = None  # None: ``file`` is in the bundle as it is
    # None: not measured: float weights (nested as they are), a quantisation that is never nested
    # (onnx int8-dynamic, see ``notes``), or a bundle written before nesting
    nesting: Optional[Nesting] = None
    # loading and running the evaluation set in the host runtime; None: a bundle written before it was timed
    verify_seconds: Optional[NonNegFloat] = None

    def __post_init__(self) -> None:
        relative_path(self.file, ".file")
        check(self.accuracy, Accuracy, ".accuracy")
        check(self.golden, Golden, ".golden")
        relative_path(self.golden["file"], ".golden.file")


class Manifest(msgspec.Struct, forbid_unknown_fields=True):
    checkpoint: Dict[str, Any]  # Checkpoint: path, sha256
    model: Dict[str, Any]  # HydraConfig.to_dict()
    data: Optional[Dict[str, Any]]  # the DataSpec verified on, None for random inputs
    target: Dict[str, Any]  # Target.to_dict() + sha256
    tools: Dict[str, Optional[str]]  # pip package -> version
    max_drop: Annotated[float, Meta(ge=0.0, le=100.0)]
    artefacts: List[ArtefactRecord] = msgspec.field(default_factory=list)
    created_by: str = ""
    classes: Optional[ClassNames] = None  # class names in logit order (from the checkpoint or data), None if unknown
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        check(self.checkpoint, Checkpoint, ".checkpoint")
        check(self.model, ModelConfig, ".model")
        check(self.target, TargetRecord, ".target")
        num_heads = self.model.get("num_heads", ModelConfig().num_heads)
        for i, a in enumerate(self.artefacts):
            if a.heads > num_heads:
                raise ValueError(f"`.artefacts[{i}].heads`: {a.heads} heads, but the model has {num_heads}")
        if len(self.by_id()) != len(self.artefacts):
            raise ValueError("`.artefacts`: two artefacts have the same id")
        problem = None if self.classes is None else class_names_problem(
            self.classes, self.model.get("num_classes", ModelConfig().num_classes))
        if problem:
            raise ValueError(f"`.classes`: {problem}")

    def to_dict(self) -> Dict[str, Any]:
        d = msgspec.to_builtins(self)
        return {"schema": d.pop("schema"), "schema_version": d.pop("schema_version"), **d}

    @classmethod
    def from_dict(cls, d: Dict[str, Any], where: str = MANIFEST) -> "Manifest":
        return codec.decode(msgspec.json.encode(d), cls, where, "manifest", HINT, (SCHEMA, SCHEMA_VERSION))

    def by_id(self) -> Dict[str, ArtefactRecord]:
        return {a.id: a for a in self.artefacts}

    def put(self, record: ArtefactRecord) -> None:
        """Add or replace a record, keeping artefacts ordered by heads, format, quant."""
        records = {**self.by_id(), record.id: record}
        self.artefacts = sorted(records.values(), key=lambda a: (a.heads, a.format, a.quant))

    def encode(self, where: str = MANIFEST) -> bytes:
        """The file's bytes: schema and version first, checked as a reader will check them."""
        return codec.encode(self.to_dict(), Manifest, where, HINT)

    def write(self, folder: Union[str, Path]) -> Path:
        path = Path(folder) / MANIFEST
        write_bytes(path, self.encode(str(path)))
        return path


def class_names_problem(names: List[str], count: Optional[int] = None) -> Optional[str]:
    """What is wrong with class names a device prints for its predictions, or None: each must appear
    once and (``count``) there must be one per logit (``ClassNames`` has refused an empty name)."""
    if count is not None and len(names) != count:
        return f"{len(names)} class names for a classifier of {count} classes"
    first: Dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            return f"class name {name!r} appears twice (classes {first[name]} and {i})"
        first[name] = i
    return None


def read_manifest(folder_or_file: Union[str, Path]) -> Manifest:
    """Read ``bundle/manifest.json`` (or the file itself), checking schema, version and every field."""
    path = Path(folder_or_file)
    path = path / MANIFEST if path.is_dir() else path
    return codec.read(path, Manifest, "manifest", "run hydra-edge convert first" if not path.exists() else HINT,
                      (SCHEMA, SCHEMA_VERSION))


def golden_files(golden: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    """``(name in the bundle, sha256, what it is)`` of the files of a record's golden pair."""
    files = [(golden["file"], golden["sha256"], "golden.file")]
    if golden.get("inputs_file") is not None:
        files.append((golden["inputs_file"], golden["inputs_sha256"], "golden.inputs_file"))
    return files


def stored_files(folder: Union[str, Path], record: ArtefactRecord) -> List[Tuple[str, str, str]]:
    """``(name in the bundle, sha256, what it is)`` of every file the bundle keeps for ``record``'s artefact.

    A full artefact is its file; a compact one is its recipe, skeleton and the source artefact
    the recipe names (read from the recipe, which must itself be intact).
    """
    if record.compact is None:
        return [(record.file, record.sha256, "file")]
    recipe_path = Path(folder) / record.compact.recipe
    data = codec.read_bytes(recipe_path, "recipe", HINT)  # read once: the bytes hashed are the bytes decoded
    if hashlib.sha256(data).hexdigest() != record.compact.sha256:
        raise HydraEdgeError(f"{recipe_path}: sha256 differs from the manifest's (artefact {record.id}); "
                             "re-run hydra-edge convert to restore the bundle")
    recipe = decode_recipe(data, str(recipe_path))
    return [(record.compact.recipe, record.compact.sha256, "compact.recipe"),
            (recipe.skeleton.file, recipe.skeleton.sha256, "recipe skeleton"),
            (recipe.source.file, recipe.source.sha256, "recipe source")]


def refuse_link_out(folder: Path, path: Path, where: str) -> None:
    """``path``, a file of bundle ``folder``, may be a link inside the bundle but not one leading out (to
    ``/etc/hostname``, or through a folder link ``sub -> /etc``): a bundle holds its own files, and nothing
    that reads or copies a bundle may reach a file beside it. One line naming ``where`` otherwise."""
    resolved = path.resolve()
    if not resolved.is_relative_to(folder.resolve()):
        raise HydraEdgeError(f"{path} is a link to {resolved}, outside the bundle ({where}); a bundle holds its "
                             "own files: replace the link with the file or re-run hydra-edge convert")


def bundle_files(folder: Union[str, Path], records: Iterable[ArtefactRecord], golden: bool = True,
                 digests: Optional[Dict[str, str]] = None) -> Dict[str, Path]:
    """``{name in the bundle: local file}`` of each record's artefact (and golden pair), for pushing.

    The manifest's names stay inside the bundle as text; here each file must also be one: a link
    leading out of the bundle (to ``/etc/hostname``, or a folder link ``sub -> /etc``) is refused,
    and so is a file whose sha256 is not the manifest's, so only what convert wrote reaches a
    device. One line for the first file that fails. Each file is hashed once, however many records
    share it (a compact bundle's source and golden inputs); ``digests`` receives every sha256, so the
    push need not hash the files again.
    """
    folder = Path(folder)
    files: Dict[str, Path] = {}
    checked: Dict[str, str] = {} if digests is None else digests
    for r in records:
        if r.compact is not None and not (folder / r.compact.recipe).is_file():
            stored = [(r.compact.recipe, r.compact.sha256, "compact.recipe")]  # reported missing below
        else:
            stored = stored_files(folder, r)
        wanted = [*stored, *(golden_files(r.golden) if golden else [])]
        for name, sha256, field in wanted:
            if checked.get(name) == sha256:
                continue
            path, where = folder / name, f"artefact {r.id} {field} in {folder / MANIFEST}"
            if not path.is_file():
                raise HydraEdgeError(f"{path} is missing ({where}); re-run hydra-edge convert to restore the bundle")
            refuse_link_out(folder, path, where)
            if sha256_file(path) != sha256:
                raise HydraEdgeError(f"{path} is not the file the manifest names (its sha256 differs; {where}); "
                                     "re-run hydra-edge convert to restore the bundle")
            files[name], checked[name] = path, sha256
    return files


def intact(folder: Union[str, Path], record: ArtefactRecord) -> bool:
    """Every file the bundle keeps for the artefact, and its golden pair, exist with the recorded sha256."""
    folder = Path(folder)
    try:
        stored = [(name, sha) for name, sha, _ in stored_files(folder, record)]
    except HydraEdgeError:
        return False
    files = [*stored, *((name, sha) for name, sha, _ in golden_files(record.golden))]
    return all((folder / name).is_file() and sha256_file(folder / name) == sha for name, sha in files)
