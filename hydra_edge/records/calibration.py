"""The calibration record (schema ``hydra-edge/calibration`` v1): what one device measured for one bundle.

The calibrator writes it per head count, as results arrive, so nothing measured is lost; the
lookup table reads it. Latencies, loads and multipliers are finite and non-negative.

A calibration by rounds (``hydra_edge.calibration_plan``) also keeps each round (its order and the thermal
gate's wait), each head count's blocks of runs, its p90's interval and why its timing stopped. Records
written before hold none of these (the fields are unset, not written), and read as they always did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import msgspec

from ..atomic import write_bytes
from . import codec
from .fields import Finite, Heads, Name, NonNegative, NonNegFloat, PosFloat, Positive, Sha256, check, finite

SCHEMA = "hydra-edge/calibration"
SCHEMA_VERSION = 1
HINT = "re-run hydra-edge calibrate"

# timing: blocks of a head count whose rounds have not stopped yet (a resumed run continues from them)
Status = Literal["ok", "golden_failed", "error", "crashed", "timing"]
# its p90 known well enough, or its time cap spent first, or the most runs a head count keeps timed first
Stopped = Literal["interval", "cap", "runs"]


class Latency(msgspec.Struct, forbid_unknown_fields=True):
    """``hydra_edge.runtime.latency.LatencyStats`` as written (ms); native runners lack percentiles."""

    mean_ms: NonNegFloat
    count: Optional[NonNegative] = None
    std_ms: Optional[NonNegFloat] = None
    min_ms: Optional[NonNegFloat] = None
    max_ms: Optional[NonNegFloat] = None
    p50_ms: Optional[NonNegFloat] = None
    p90_ms: Optional[NonNegFloat] = None
    p99_ms: Optional[NonNegFloat] = None
    trimmed_mean_ms: Optional[NonNegFloat] = None
    # The p90's 95 % interval from the order statistics (calibration_plan.order_ranks); null ends: too few runs
    p90_low_ms: Optional[NonNegFloat] = None
    p90_high_ms: Optional[NonNegFloat] = None
    timed_s: Optional[NonNegFloat] = None  # the timed runs' own time


class Block(msgspec.Struct, forbid_unknown_fields=True):
    """One head count's runs in one round, as timed (ms); its warm-up untimed but in ``spent_s``."""

    round: Positive
    latencies_ms: List[NonNegFloat]
    spent_s: NonNegFloat


class Round(msgspec.Struct, forbid_unknown_fields=True):
    """One round: the order it visited the open head counts in, and the thermal gate's wait before it
    (``outcome``: ready, timeout, ungated or reading failed; ``why`` it waited or could not)."""

    round: Positive
    order: List[Heads]
    started_s: NonNegFloat  # since the runner began timing
    gate: Optional[Dict[str, Any]] = None  # waited_s, outcome, why, state


class BundleRef(msgspec.Struct, forbid_unknown_fields=True):
    manifest_sha256: Sha256
    path: str = ""
    target: Optional[str] = None


class HeadResult(msgspec.Struct, forbid_unknown_fields=True):
    """One artefact timed on the device. Only ``status == "ok"`` results carry a latency that counts."""

    heads: Heads
    artefact: Name  # the manifest's ArtefactRecord.id
    sha256: Sha256  # checked on the device before it was loaded
    status: Status  # golden_failed: output outside tolerance, not timed; crashed: killed the runner
    runner: Name  # "python" (calibration/runner.py) | "benchmark_model" | "executor_runner"
    golden: Dict[str, Any] = msgspec.field(default_factory=dict)  # max_abs_diff, top1_agreement, passed
    load_s: Optional[NonNegFloat] = None  # from the bundle's files to a ready engine, a rebuild included
    # The part of load_s a compact artefact's rebuild took; unset (not written) for a full file, so
    # results of full bundles keep their bytes.
    rebuild_s: Union[NonNegFloat, None, msgspec.UnsetType] = msgspec.UNSET
    latency: Optional[Dict[str, Any]] = None  # Latency
    peak_rss_mb: Optional[NonNegFloat] = None
    state_before: Optional[Dict[str, Any]] = None  # signals.state.DeviceState.to_dict()
    state_after: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    stopped: Union[Stopped, msgspec.UnsetType] = msgspec.UNSET  # by rounds only
    blocks: Union[List[Block], msgspec.UnsetType] = msgspec.UNSET

    def __post_init__(self) -> None:
        if self.latency is not None:
            check(self.latency, Latency, ".latency")
        for key in ("golden", "state_before", "state_after"):
            finite(getattr(self, key), f".{key}")

    def to_dict(self) -> Dict[str, Any]:
        return msgspec.to_builtins(self)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.latency is not None

    @property
    def latency_ms(self) -> float:
        """The latency the lookup table plans with: the median, else the mean (native runners)."""
        assert self.latency is not None
        return self.latency.get("p50_ms") or self.latency["mean_ms"]

    @property
    def p90_interval_ms(self) -> Optional[Tuple[float, float]]:
        """The p90's 95 % interval, where the record has one (a calibration by rounds with enough runs)."""
        low, high = ((self.latency or {}).get(k) for k in ("p90_low_ms", "p90_high_ms"))
        return None if low is None or high is None else (low, high)


Multiplier = PosFloat


class Derating(msgspec.Struct, forbid_unknown_fields=True):
    """Sustained load (``--soak``): how latency grows as the device heats up and throttles.

    ``samples`` are raw; the tables are what the lookup table uses, each a latency multiplier
    relative to the cool, unthrottled latency (1.0 = no slowdown).
    """

    heads: Heads
    duration_s: NonNegFloat
    samples: List[Dict[str, Any]]  # t_s, latency_ms, max_temp_c, throttled, android_thermal_status, battery
    by_temperature: List[Tuple[Finite, Multiplier]]  # (lower bound °C of the bin, multiplier), ascending
    by_thermal_status: Dict[str, Multiplier] = msgspec.field(default_factory=dict)  # Android status -> multiplier
    by_throttled: Dict[str, Multiplier] = msgspec.field(default_factory=dict)  # "false"/"true" (Raspberry Pi)
    bin_c: PosFloat = 5.0  # width of a by_temperature bin: bin i covers [lower, lower + bin_c)

    def __post_init__(self) -> None:
        finite(self.samples, ".samples")
        lows = [low for low, _ in self.by_temperature]
        if lows != sorted(set(lows)):
            raise ValueError("`.by_temperature`: bins must rise strictly by temperature")


class Calibration(msgspec.Struct, forbid_unknown_fields=True):
    device_id: Name  # "ssh:pi@host:22", "adb:SERIAL", "local:NODE"
    device: Dict[str, Any]  # signals.info.DeviceInfo.to_dict()
    bundle: Dict[str, Any]  # BundleRef: path, manifest_sha256, target (name)
    settings: Dict[str, Any]  # runs, warmup, threads, runner
    results: List[HeadResult] = msgspec.field(default_factory=list)
    soak: Optional[Derating] = None
    rounds: Union[List[Round], msgspec.UnsetType] = msgspec.UNSET
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        check(self.bundle, BundleRef, ".bundle")
        finite(self.device, ".device")
        finite(self.settings, ".settings")
        heads = [r.heads for r in self.results]
        if len(set(heads)) != len(heads):
            raise ValueError("`.results`: two results for the same head count")

    def result(self, heads: int) -> Optional[HeadResult]:
        return next((r for r in self.results if r.heads == heads), None)

    def put(self, result: HeadResult) -> None:
        """Add or replace the result for its head count, keeping results ordered by heads."""
        self.results = sorted([r for r in self.results if r.heads != result.heads] + [result], key=lambda r: r.heads)

    def add_block(self, heads: int, artefact: str, sha256: str, runner: str, block: Block) -> None:
        """Add a block to its head count's ``timing`` result (started with this block if there is none)."""
        result = self.result(heads)
        if result is None or result.status != "timing" or result.artefact != artefact:
            result = HeadResult(heads, artefact, sha256, "timing", runner, blocks=[])
            self.put(result)
        assert isinstance(result.blocks, list)
        result.blocks.append(block)

    def add_round(self, round_: Round) -> None:
        self.rounds = [*(self.rounds or []), round_]

    def measured(self) -> List[HeadResult]:
        return [r for r in self.results if r.ok]

    def to_dict(self) -> Dict[str, Any]:
        d = msgspec.to_builtins(self)
        return {"schema": d.pop("schema"), "schema_version": d.pop("schema_version"), **d}

    @classmethod
    def from_dict(cls, d: Dict[str, Any], where: str = "calibration") -> "Calibration":
        return codec.decode(msgspec.json.encode(d), cls, where, "calibration", HINT, (SCHEMA, SCHEMA_VERSION))

    def write(self, path: Union[str, Path]) -> Path:
        write_bytes(path, codec.encode(self.to_dict(), Calibration, str(path), HINT))
        return Path(path)


def read_calibration(path: Union[str, Path]) -> Calibration:
    """Read a calibration file, checking schema, version and every field; one line when it is not one."""
    hint = HINT if Path(path).exists() else "run hydra-edge calibrate first"
    return codec.read(path, Calibration, "calibration", hint, (SCHEMA, SCHEMA_VERSION))
