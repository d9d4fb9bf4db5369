"""Tables without a conversion: made-up bundles, calibrations and the lut.json built from them.

A bundle here holds only manifest.json, with one made-up ONNX record per head count, and a calibration
is a ``Calibration`` object written directly: enough for ``build_table`` and whatever reads a table
(the switcher, the apps' parity checks), in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import msgspec

from hydra_edge.atomic import sha256_file
from hydra_edge.convert.targets import load_target
from hydra_edge.lut.policy import Policy
from hydra_edge.lut.table import build_table
from hydra_edge.records.calibration import Calibration, Derating, HeadResult
from hydra_edge.records import lut as lut_record
from hydra_edge.records.manifest import ArtefactRecord, Manifest, read_manifest

PI_SIGNALS = {"files": {"temperature_mC": "/sys/class/thermal/thermal_zone0/temp"},
              "commands": {"throttled": "vcgencmd get_throttled"}}
ANDROID_SIGNALS = {"commands": {"thermal": "dumpsys thermalservice", "battery": "dumpsys battery"}}
# targets/android.toml's: the thermal headroom forecast besides the status and the battery
PHONE_SIGNALS = {"commands": {**ANDROID_SIGNALS["commands"], "headroom": "cmd thermalservice headroom 10"}}


def fake_bundle(folder: Path, heads: list[int], top1: dict[int, float] | None = None,
                signals: dict | None = None) -> Path:
    """A bundle folder holding only manifest.json, with one made-up ONNX record per head count."""
    records = [ArtefactRecord(
        id=f"h{h}_onnx_fp32", heads=h, format="onnx", quant="fp32", file=f"vit_h{h}_onnx_fp32.onnx", bytes=1,
        sha256="0" * 64, params=h, gmacs=0.1 * h, runtime="onnxruntime", runtime_min_version="1.17", threads=1,
        host_runtime="onnxruntime", convert_seconds=1.0,
        accuracy={"basis": "labels", "images": 10, "top1": None if top1 is None else top1[h], "fp32_top1": None,
                  "drop_pp": None, "agreement": 100.0, "max_abs_diff": 0.0},
        golden={"file": f"vit_h{h}_onnx_fp32.golden.npz", "sha256": "1" * 64, "inputs": 8, "reference": "fp32",
                "tolerance": {"max_abs_diff": 0.1, "min_top1_agreement": 0.875, "host_max_abs_diff": 0.05,
                              "host_top1_agreement": 1.0}},
        fingerprint=str(h),
    ) for h in heads]
    target = {**load_target("rpi").to_dict(), "name": "pi", "signals": signals or PI_SIGNALS, "sha256": "2" * 64}
    manifest = Manifest(checkpoint={"path": "model.pt", "sha256": "3" * 64}, model={}, data=None, target=target,
                        tools={}, max_drop=1.0, artefacts=records)
    manifest.write(folder)
    return folder


def calibration(bundle: Path, latency_ms: dict[int, float], soak: Derating | None = None,
                power_w: float | None = None, forecast: Any = None) -> Calibration:
    """Each head count timed at ``latency_ms``; its state before holds ``forecast`` as the device's
    ``android_thermal_headroom`` (None: the device gave none), its state after ``power_w``."""
    cal = Calibration(device_id="local:test", device={}, settings={}, soak=soak,
                      bundle={"path": str(bundle), "manifest_sha256": sha256_file(bundle / "manifest.json"),
                              "target": "pi"})
    recorded = read_manifest(bundle).by_id()  # each result names its artefact as the manifest records it
    for h, ms in latency_ms.items():
        artefact = recorded[f"h{h}_onnx_fp32"]
        cal.put(HeadResult(heads=h, artefact=artefact.id, sha256=artefact.sha256, status="ok", runner="python",
                           latency={"count": 10, "p50_ms": ms, "mean_ms": ms},
                           state_before=None if forecast is None else {"android_thermal_headroom": forecast},
                           state_after=None if power_w is None else {"power_w": power_w}))
    return cal


def table(tmp_path: Path, latency_ms: dict[int, float], budget_ms: float, policy: Policy | None = None,
          say: Callable[[str], None] = lambda line: None, forecast: Any = 0.4, **kw: Any) -> dict[str, Any]:
    """lut.json from a calibration in which the device forecast its thermal headroom (``forecast``, as a phone
    on Android 14 does), so a profile naming headroom gets a table naming it; ``forecast=None``: it never did."""
    bundle = fake_bundle(tmp_path / "bundle", sorted(latency_ms), signals=kw.pop("signals", None))
    cal = calibration(bundle, latency_ms, forecast=forecast, **kw)
    cal.write(tmp_path / "cal.json")
    return build_table(bundle, Manifest.from_dict(json.loads((bundle / "manifest.json").read_text())), cal,
                       tmp_path / "cal.json", msgspec.structs.replace(policy or Policy(), budget_ms=budget_ms), say)


def heads_grid(doc: dict[str, Any]) -> list[list[int]]:
    heads = [c["heads"] for c in doc["candidates"]]
    return [[heads[i] for i in row] for row in doc["selection"]["cells"]]


# Class names an emitter must carry exactly: quotes, a backslash, a C trigraph, a Kotlin template,
# characters outside the BMP, a comment's end and a tab.
ODD_NAMES = ["plain", 'say "hi"', "back\\slash", "??= trigraph", "$price", "Ärger 🐍", "end */ comment", "tab\there"]


def table_with_classes(tmp_path: Path, classes: list[str] | None) -> dict:
    """lut.json as built for a 3/12-head bundle whose manifest names ``classes``: what the C and Kotlin
    emitters and the records read class names from."""
    bundle = fake_bundle(tmp_path / "bundle", [3, 12])
    manifest = read_manifest(bundle)
    manifest.model, manifest.classes = {"num_classes": len(classes or [0])}, classes
    manifest.write(bundle)
    cal = calibration(bundle, {3: 1.0, 12: 5.0})
    cal.write(tmp_path / "cal.json")
    return build_table(bundle, read_manifest(bundle), cal, tmp_path / "cal.json",
                       msgspec.structs.replace(Policy(), budget_ms=10.0))


def lut_document(tmp: Path, spec: dict[str, Any]) -> Path:
    """A manifest-only Android bundle and the lut.json Python's own table builder makes for ``spec``."""
    soak = Derating(heads=max(int(h) for h in spec["latency_ms"]), duration_s=60, samples=[], by_temperature=[],
                    by_thermal_status=spec.get("by_thermal_status", {"NONE": 1.0, "LIGHT": 1.3, "MODERATE": 1.9,
                                                                     "SEVERE": 3.5}))
    doc = table(tmp, {int(h): ms for h, ms in spec["latency_ms"].items()}, spec["budget_ms"], soak=soak,
                signals=PHONE_SIGNALS if spec.get("headroom") else ANDROID_SIGNALS)
    assert doc["thermal"]["headroom"] is bool(spec.get("headroom"))
    bundle = tmp / "bundle"
    (bundle / "lut.json").write_bytes(lut_record.encode(doc, "lut.json"))
    return bundle
