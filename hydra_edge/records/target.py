"""The target profile record: ``targets/<name>.toml``, and the copy a bundle manifest keeps of it.

What each key means is documented in ``targets/rpi.toml`` and ``hydra_edge.runtime.signals.state``;
this module only says what each may hold. Booleans are TOML booleans (``optional = "no"`` is an
error naming the key), numbers are finite and in range.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Mapping, Optional, Union

import msgspec
from msgspec import Meta

from ..errors import HydraEdgeError
from ..formats import FORMATS
from . import codec
from .fields import Name, PosFloat, Sha256, Threads, check

HINT = "see targets/rpi.toml for the format"

# A thermal or battery source; "none" or false: the board has none (e.g. a battery on mains power).
Source = Optional[Union[Literal["sysfs", "dumpsys", "none"], bool]]
# Android's thermal headroom forecast, read with ``cmd thermalservice headroom``; "none" or false: not read.
HeadroomSource = Optional[Union[Literal["cmd", "none"], bool]]


class Signals(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A profile's ``[signals]`` table: where the device's state is read and how long a reading counts."""

    # name -> device file; what is read (hydra_edge.runtime.signals.state): a key ending in _mC is a
    # temperature in m°C, a file under /sys/class/power_supply/ names the battery; others are notes
    files: Dict[str, str] = msgspec.field(default_factory=dict)
    # name -> command line, run as written when it starts vcgencmd, tegrastats, dumpsys or cmd thermalservice headroom
    commands: Dict[str, str] = msgspec.field(default_factory=dict)
    thermal: Source = None
    battery: Source = None
    headroom: HeadroomSource = None
    vcgencmd: bool = False
    tegrastats: bool = False
    thermal_zones: Optional[List[Name]] = None  # keep only these sensors
    stale_after_s: PosFloat = 30.0  # how long the last good sensor reading is trusted
    raise_after_s: Annotated[float, Meta(ge=0.0, le=1e6)] = 10.0  # a reading persists this long before heads rise
    assumed_hot: Optional[Annotated[float, Meta(ge=-273.15, le=1000.0)]] = None  # unknown, stale: None = hottest band

    def __post_init__(self) -> None:
        for key in ("thermal", "battery"):
            if getattr(self, key) is True:
                raise ValueError(f"`.{key}`: true names no source; use \"sysfs\", \"dumpsys\", \"none\" or false")
        if self.headroom is True:
            raise ValueError("`.headroom`: true names no source; use \"cmd\", \"none\" or false")


def signals(table: Mapping[str, Any], where: str) -> Signals:
    """A ``[signals]`` table (as a profile or manifest holds it) with every default filled in."""
    return codec.convert(dict(table), Signals, where, HINT)


class RuntimeRefused(HydraEdgeError, ValueError):
    """A variant names a runtime its artefacts do not run correctly in. A ValueError, so a profile
    or manifest being decoded reports it at its key and file; a HydraEdgeError, so a variant rebuilt
    for ``--quant`` is one line too."""


class Variant(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One artefact kind a target wants per head count: format, quantisation, device runtime."""

    format: Name
    quant: Name
    runtime: Name
    runtime_min_version: Name
    optional: bool = False  # converted only when asked for (``--optional``)
    device_build: Optional[str] = None  # command that turns the artefact into a device engine
    options: Dict[str, Any] = msgspec.field(default_factory=dict)  # exporter settings (calibration, exclusions)

    def __post_init__(self) -> None:
        # a format's second runtime that runs some of its artefacts correctly and not others
        fmt = FORMATS.get(self.format)
        alt = fmt.alternate if fmt else None
        quants = alt.quants if alt and alt.runtime == self.runtime else (self.quant,)
        if self.quant not in quants:
            raise RuntimeRefused(
                f"`.runtime`: {self.runtime} runs only {' or '.join(quants)} {self.format} artefacts correctly, not "
                f"{self.quant} (it refuses or miscomputes others): convert {quants[0]} for it (no other --quant), "
                "or name the format's own runtime")

    @property
    def key(self) -> str:
        return f"{self.format}_{self.quant}"

    def conversion_dict(self) -> Dict[str, Any]:
        """What decides the artefact's bytes; hashed into its fingerprint (runtime names are not)."""
        return {"format": self.format, "quant": self.quant, "options": self.options}


GoldenInputs = Annotated[int, Meta(ge=1, le=100000)]


class Profile(msgspec.Struct, forbid_unknown_fields=True):
    """A ``targets/*.toml`` file as written; ``signals`` stays the table it is (checked as ``Signals``)."""

    artefacts: Annotated[List[Variant], Meta(min_length=1)]
    name: Optional[Name] = None  # default: the file's stem
    description: str = ""
    threads: Threads = 1
    golden_inputs: GoldenInputs = 8
    signals: Dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.signals, Signals, ".signals")
        if len({v.key for v in self.artefacts}) != len(self.artefacts):
            raise ValueError("`.artefacts`: two entries have the same format and quant")


class TargetRecord(msgspec.Struct, forbid_unknown_fields=True):
    """The profile as a bundle manifest records it (``Target.to_dict()`` and its sha256)."""

    name: Name
    description: str
    threads: Threads
    golden_inputs: GoldenInputs
    artefacts: List[Variant]
    signals: Signals
    source: str
    sha256: Sha256


def read_profile(path: str) -> Profile:
    return codec.read_toml(path, Profile, "target profile", HINT)

