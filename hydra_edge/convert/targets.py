"""Target profiles: one TOML file per device family, read into frozen dataclasses.

The converter, the calibrator and the switcher all read the same profile, so a user adds a device
by adding a file. ``--target path/to/x.toml`` reads that file; ``--target NAME`` finds ``NAME.toml``
in the user folder (``$HYDRA_EDGE_TARGETS``, else ``$XDG_CONFIG_HOME/hydra-edge/targets``, by
default ``~/.config/hydra-edge/targets``), then among the profiles shipped with hydra-edge
(``targets/`` of the source tree). The schema (every key's type and range) is
``hydra_edge.records.target``; this module finds profiles and checks what needs the converter's
registries (formats, quantisations). Imports no torch: the device side reads profiles too.
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
from ..formats import FORMATS
from ..records.target import Variant, read_profile
from ..shipped import shipped
from .formats import quants

TARGETS_ENV = "HYDRA_EDGE_TARGETS"  # the user folder of profiles, searched before the shipped ones
SHIPPED = shipped("targets")
SHIPPED_ORIGIN, USER_ORIGIN, PATH_ORIGIN = "shipped", "user folder", "path"


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
        # a variant of that quant already in the profile comes first: its options (e.g. which ops QDQ
        # quantises) win over another variant's rewritten to the same format and quant without them
        for v in sorted(chosen, key=lambda v: v.quant != quant):
            check_quant(v.format, quant, f"--quant for target {self.name!r}")
            options = v.options if quant == v.quant else {}
            nv = msgspec.structs.replace(v, quant=quant, options=options)
            if nv.key not in {o.key for o in out}:
                out.append(nv)
        return tuple(out)


def check_quant(fmt: str, quant: str, where: str) -> None:
    if quant not in quants(fmt):
        raise HydraEdgeError(f"{where}: format {fmt!r} has no quantisation {quant!r}; choose one of {list(quants(fmt))}")


def user_folder() -> Path:
    """Where a user keeps profiles: ``$HYDRA_EDGE_TARGETS``, else the XDG config folder's ``hydra-edge/targets``."""
    if os.environ.get(TARGETS_ENV):
        return Path(os.environ[TARGETS_ENV]).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config) / "hydra-edge" / "targets"


@dataclass(frozen=True)
class Found:
    """A profile file ``--target`` can name, and where it comes from (shipped, user folder, path)."""

    name: str
    path: Path
    origin: str


def found() -> list[Found]:
    """Every profile ``--target NAME`` can find, by name; a user's profile hides a shipped one of its name."""
    seen: dict[str, Found] = {}
    for origin, folder in ((USER_ORIGIN, user_folder()), (SHIPPED_ORIGIN, SHIPPED)):
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            seen.setdefault(path.stem, Found(path.stem, path, origin))
    return sorted(seen.values(), key=lambda f: f.name)


def available() -> list[str]:
    """Names of the profiles ``--target NAME`` can find."""
    return [f.name for f in found()]


def locate(target: str) -> Found:
    """A profile name or a path to a ``.toml`` file -> the file, and where it comes from."""
    path = Path(target).expanduser()
    if target.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise HydraEdgeError(f"target file {path} does not exist")
        return Found(path.stem, path, PATH_ORIGIN)
    match = next((f for f in found() if f.name == target), None)
    if match is None:
        raise HydraEdgeError(f"unknown target {target!r}; choose one of {available()}, add {target}.toml to "
                             f"{user_folder()} or pass a path to a .toml profile")
    return match


def resolve(target: str) -> Path:
    """A profile name or a path to a ``.toml`` file -> the file."""
    return locate(target).path


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
