"""The calibration record: what one device measured for one bundle, as versioned JSON.

The calibrator writes it (per head count, as results arrive, so nothing measured is lost) and
the lookup table reads it; neither parses the JSON by hand. Torch-free: boards may read it too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..atomic import read_json, write_json
from ..errors import HydraEdgeError

SCHEMA = "hydra-edge/calibration"
SCHEMA_VERSION = 1


@dataclass
class HeadResult:
    """One artefact timed on the device. Only ``status == "ok"`` results carry a latency that counts."""

    heads: int
    artefact: str  # the manifest's ArtefactRecord.id
    sha256: str  # checked on the device before it was loaded
    status: str  # "ok" | "golden_failed" (output outside tolerance: not timed) | "error" | "crashed" (killed the runner)
    runner: str  # "python" (calibration/runner.py) | "benchmark_model" | "executor_runner"
    golden: dict[str, Any] = field(default_factory=dict)  # max_abs_diff, top1_agreement, passed
    load_s: Optional[float] = None
    latency: Optional[dict[str, Any]] = None  # signals.benchmarks.LatencyStats as a dict (ms)
    peak_rss_mb: Optional[float] = None
    state_before: Optional[dict[str, Any]] = None  # signals.state.DeviceState.to_dict()
    state_after: Optional[dict[str, Any]] = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.latency is not None

    @property
    def latency_ms(self) -> float:
        """The latency the lookup table plans with: the median, else the mean (native runners)."""
        assert self.latency is not None
        return self.latency.get("p50_ms") or self.latency["mean_ms"]


@dataclass
class Derating:
    """Sustained load (``--soak``): how latency grows as the device heats up and throttles.

    ``samples`` are raw; the tables are what the lookup table uses, each a latency multiplier
    relative to the cool, unthrottled latency (1.0 = no slowdown).
    """

    heads: int
    duration_s: float
    samples: list[dict[str, Any]]  # t_s, latency_ms, max_temp_c, throttled, android_thermal_status, battery
    by_temperature: list[tuple[float, float]]  # (temperature °C lower bound of the bin, multiplier), ascending
    by_thermal_status: dict[str, float] = field(default_factory=dict)  # Android status name -> multiplier
    by_throttled: dict[str, float] = field(default_factory=dict)  # "false"/"true" -> multiplier (Raspberry Pi)
    bin_c: float = 5.0  # width of a by_temperature bin: bin i covers [lower, lower + bin_c)


@dataclass
class Calibration:
    device_id: str  # "ssh:pi@host:22", "adb:SERIAL", "local:NODE"
    device: dict[str, Any]  # signals.info.DeviceInfo.to_dict()
    bundle: dict[str, Any]  # path, manifest_sha256, target (name)
    settings: dict[str, Any]  # runs, warmup, threads, runner
    results: list[HeadResult] = field(default_factory=list)
    soak: Optional[Derating] = None
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def result(self, heads: int) -> Optional[HeadResult]:
        return next((r for r in self.results if r.heads == heads), None)

    def put(self, result: HeadResult) -> None:
        """Add or replace the result for its head count, keeping results ordered by heads."""
        self.results = sorted([r for r in self.results if r.heads != result.heads] + [result], key=lambda r: r.heads)

    def measured(self) -> list[HeadResult]:
        return [r for r in self.results if r.ok]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"schema": d.pop("schema"), "schema_version": d.pop("schema_version"), **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "calibration") -> "Calibration":
        if d.get("schema") != SCHEMA:
            raise HydraEdgeError(f"{where} is not a hydra-edge calibration (schema {d.get('schema')!r})")
        if d.get("schema_version") != SCHEMA_VERSION:
            raise HydraEdgeError(
                f"{where} has calibration schema version {d.get('schema_version')}, this hydra-edge reads "
                f"{SCHEMA_VERSION}; re-run hydra-edge calibrate"
            )
        d = dict(d)
        try:
            results = [HeadResult(**r) for r in d.pop("results")]
            soak = d.pop("soak", None)
            if soak is not None:
                soak = Derating(**{**soak, "by_temperature": [tuple(b) for b in soak["by_temperature"]]})
            return cls(**d, results=results, soak=soak)
        except (TypeError, KeyError) as e:
            raise HydraEdgeError(f"{where} is damaged or from another hydra-edge ({e})") from None

    def write(self, path: str | Path) -> Path:
        write_json(path, self.to_dict())
        return Path(path)


def read_calibration(path: str | Path) -> Calibration:
    """Read a calibration file, checking schema and version; one clear line when it is not one."""
    return Calibration.from_dict(read_json(path, "calibration", "run hydra-edge calibrate first"), str(path))
