"""Target profiles: one TOML file per device family in ``targets/``, read into frozen dataclasses.

The converter, the calibrator and the switcher all read the same profile, so a user adds a device
by adding a file. ``--target rpi`` finds ``targets/rpi.toml``; ``--target path/to/x.toml`` reads
that file. The schema (every key's type and range) is ``hydra_edge.records.target``; this module
finds profiles and checks what needs the converter's registries (formats, quantisations).
Imports no torch: the device side reads profiles too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..errors import HydraEdgeError
from ..records.target import Variant, read_profile
from ..runtime.engines import FORMATS
from ..shipped import shipped
from .formats import quants

TARGETS_ENV = "HYDRA_EDGE_TARGETS"  # a folder of extra profiles, searched before the shipped ones
SHIPPED = shipped("targets")


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    threads: int
    golden_inputs: int
    artefacts: tuple[Variant, ...]
    signals: dict[str, Any]  # the [signals] table as written (hydra_edge.records.target.Signals)
    source: str  # the file it was read from

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "threads": self.threads,
                "golden_inputs": self.golden_inputs, "artefacts": [msgspec.to_builtins(v) for v in self.artefacts],
                "signals": self.signals, "source": self.source}

    @property
    def sha256(self) -> str:
        """Hash of the profile's content (not its path), recorded in the manifest."""
        d = self.to_dict()
        d.pop("source")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def variants(self, quant: str | None = None, optional: bool = False) -> tuple[Variant, ...]:
        """The variants to convert: optional ones only if asked; ``quant`` overrides every variant's."""
        chosen = [v for v in self.artefacts if optional or not v.optional]
        if not chosen:  # else convert would write an empty bundle and say "0 converted"
            raise HydraEdgeError(f"target {self.name!r}: the profile's artefacts are all optional; pass --optional "
                                 "to convert them, or mark one optional = false in the profile")
        if quant is None:
            return tuple(chosen)
        out: list[Variant] = []
        for v in chosen:
            check_quant(v.format, quant, f"--quant for target {self.name!r}")
            options = v.options if quant == v.quant else {}
            nv = msgspec.structs.replace(v, quant=quant, options=options)
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


def _check_variant(v: Variant, where: str) -> None:
    if v.format not in FORMATS:
        raise HydraEdgeError(f"{where}: unknown format {v.format!r}; choose one of {sorted(FORMATS)}")
    check_quant(v.format, v.quant, where)


def load_target(target: str) -> Target:
    """Read and check a target profile, by name or path; every problem is one line naming the file."""
    path = resolve(target)
    profile = read_profile(str(path))
    for i, v in enumerate(profile.artefacts):
        _check_variant(v, f"{path}: $.artefacts[{i}]")
    return Target(
        name=profile.name or path.stem,
        description=profile.description,
        threads=profile.threads,
        golden_inputs=profile.golden_inputs,
        artefacts=tuple(profile.artefacts),
        signals=profile.signals,
        source=str(path),
    )
