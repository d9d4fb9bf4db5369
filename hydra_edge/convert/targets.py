"""Target profiles: one TOML file per device family in ``targets/``, read into frozen dataclasses.

The converter, the calibrator and the switcher all read the same profile, so a user adds a device
by adding a file. ``--target rpi`` finds ``targets/rpi.toml``; ``--target path/to/x.toml`` reads
that file. Imports no torch: the device side reads profiles too.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..atomic import read_json
from ..errors import HydraEdgeError
from ..runtime.engines import FORMATS
from .formats import quants
TARGETS_ENV = "HYDRA_EDGE_TARGETS"  # a folder of extra profiles, searched before the shipped ones
SHIPPED = Path(__file__).resolve().parents[2] / "targets"


@dataclass(frozen=True)
class Variant:
    """One artefact kind a target wants per head count: format, quantisation, device runtime."""

    format: str
    quant: str
    runtime: str
    runtime_min_version: str
    optional: bool = False  # converted only when asked for (``--optional``)
    device_build: str | None = None  # command that turns the artefact into a device engine
    options: dict[str, Any] = field(default_factory=dict)  # exporter settings (calibration, exclusions)

    @property
    def key(self) -> str:
        return f"{self.format}_{self.quant}"

    def conversion_dict(self) -> dict[str, Any]:
        """What decides the artefact's bytes; hashed into its fingerprint (runtime names are not)."""
        return {"format": self.format, "quant": self.quant, "options": self.options}


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    threads: int
    golden_inputs: int
    artefacts: tuple[Variant, ...]
    signals: dict[str, dict[str, str]]
    source: str  # the file it was read from

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["artefacts"] = [asdict(v) for v in self.artefacts]
        return d

    @property
    def sha256(self) -> str:
        """Hash of the profile's content (not its path), recorded in the manifest."""
        d = self.to_dict()
        d.pop("source")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def variants(self, quant: str | None = None, optional: bool = False) -> tuple[Variant, ...]:
        """The variants to convert: optional ones only if asked; ``quant`` overrides every variant's."""
        chosen = [v for v in self.artefacts if optional or not v.optional]
        if quant is None:
            return tuple(chosen)
        out: list[Variant] = []
        for v in chosen:
            check_quant(v.format, quant, f"--quant for target {self.name!r}")
            options = v.options if quant == v.quant else {}
            nv = replace(v, quant=quant, options=options)
            if nv.key not in {o.key for o in out}:
                out.append(nv)
        return tuple(out)


def check_quant(fmt: str, quant: str, where: str) -> None:
    if quant not in quants(fmt):
        raise HydraEdgeError(f"{where}: format {fmt!r} has no quantisation {quant!r}; choose one of {list(quants(fmt))}")


def available() -> list[str]:
    """Names of the profiles ``--target NAME`` can find."""
    names = {p.stem for d in _search_dirs() for p in d.glob("*.toml")}
    return sorted(names)


def _search_dirs() -> list[Path]:
    dirs = [Path(os.environ[TARGETS_ENV])] if os.environ.get(TARGETS_ENV) else []
    return [d for d in (*dirs, SHIPPED) if d.is_dir()]


def resolve(target: str) -> Path:
    """A profile name or a path to a ``.toml`` file -> the file."""
    path = Path(target)
    if target.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise HydraEdgeError(f"target file {path} does not exist")
        return path
    for d in _search_dirs():
        if (d / f"{target}.toml").is_file():
            return d / f"{target}.toml"
    raise HydraEdgeError(
        f"unknown target {target!r}; choose one of {available()} or pass a path to a .toml profile"
    )


def _variant(d: dict[str, Any], where: str) -> Variant:
    fmt = d.get("format")
    if fmt not in FORMATS:
        raise HydraEdgeError(f"{where}: unknown format {fmt!r}; choose one of {sorted(FORMATS)}")
    check_quant(fmt, d.get("quant", ""), where)
    for key in ("runtime", "runtime_min_version"):
        if not isinstance(d.get(key), str):
            raise HydraEdgeError(f"{where}: {key!r} is missing; name the device runtime and its minimum version")
    known = {f for f in Variant.__dataclass_fields__}
    unknown = sorted(set(d) - known)
    if unknown:
        raise HydraEdgeError(f"{where}: unknown keys {unknown}; allowed: {sorted(known)}")
    return Variant(**d)


def load_target(target: str) -> Target:
    """Read and check a target profile, by name or path; every problem is one line naming the file."""
    path = resolve(target)
    d = read_json(path, "target profile", "see targets/rpi.toml for the format", loads=tomllib.loads)
    entries = d.get("artefacts")
    if not isinstance(entries, list) or not entries:
        raise HydraEdgeError(f"{path}: no [[artefacts]] entries; a target needs at least one format")
    variants = tuple(_variant(dict(e), f"{path} artefact {i + 1}") for i, e in enumerate(entries))
    if len({v.key for v in variants}) != len(variants):
        raise HydraEdgeError(f"{path}: two [[artefacts]] entries have the same format and quant")
    threads, golden = d.get("threads", 1), d.get("golden_inputs", 8)
    if not (isinstance(threads, int) and threads >= 1 and isinstance(golden, int) and golden >= 1):
        raise HydraEdgeError(f"{path}: 'threads' and 'golden_inputs' must be positive integers")
    signals = d.get("signals", {})
    return Target(
        name=str(d.get("name", path.stem)),
        description=str(d.get("description", "")),
        threads=threads,
        golden_inputs=golden,
        artefacts=variants,
        signals={kind: dict(v) for kind, v in signals.items()},
        source=str(path),
    )
