"""Target profiles: the shipped three load and say everything a device needs; bad ones fail in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hydra_edge.convert.targets import available, load_target
from hydra_edge.errors import HydraEdgeError
from hydra_edge.runtime.engines import FORMATS


@pytest.mark.parametrize("name", ["rpi", "jetson", "android"])
def test_shipped_profiles_name_format_quant_runtime_threads_signals(name: str) -> None:
    target = load_target(name)
    assert target.name == name and target.threads >= 1 and target.golden_inputs >= 1
    for v in target.artefacts:
        assert v.format in FORMATS and v.quant and v.runtime and v.runtime_min_version
    assert target.signals["files"] and target.signals["commands"]
    assert len(target.sha256) == 64


def test_profiles_carry_what_the_issue_asks() -> None:
    rpi, android, jetson = (load_target(n) for n in ("rpi", "android", "jetson"))
    assert [(v.format, v.quant, v.runtime) for v in rpi.artefacts] == [("tflite", "int8-dynamic", "ai-edge-litert")]
    assert [(v.format, v.quant) for v in android.variants()] == [("executorch", "int8-dynamic")]
    assert [(v.format, v.optional) for v in android.variants(optional=True)] == [("executorch", False), ("tflite", True)]
    assert {v.quant for v in jetson.artefacts} == {"fp16", "int8-qdq"}
    assert all("trtexec --onnx={file}" in v.device_build for v in jetson.artefacts)
    assert "vcgencmd get_throttled" in rpi.signals["commands"].values()
    assert any("tegrastats" in c for c in jetson.signals["commands"].values())
    assert any("dumpsys" in c for c in android.signals["commands"].values())


def test_quant_override_replaces_and_dedupes() -> None:
    jetson = load_target("jetson")
    assert [(v.format, v.quant, v.options) for v in jetson.variants("fp32")] == [("onnx", "fp32", {})]
    with pytest.raises(HydraEdgeError, match="no quantisation 'fp16'"):
        load_target("rpi").variants("fp16")


def test_target_by_path_and_unknown_name(tmp_path: Path) -> None:
    f = tmp_path / "board.toml"
    f.write_text('name = "board"\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n'
                 'runtime = "onnxruntime"\nruntime_min_version = "1.17"\n')
    assert load_target(str(f)).artefacts[0].format == "onnx"
    with pytest.raises(HydraEdgeError, match=r"unknown target 'nope'.*rpi"):
        load_target("nope")
    assert {"rpi", "jetson", "android"} <= set(available())


RUNTIME = 'runtime = "onnxruntime"\nruntime_min_version = "1.17"\n'


@pytest.mark.parametrize("body, message", [
    ('[[artefacts]]\nformat = "coreml"\nquant = "fp32"\n' + RUNTIME, r"\$\.artefacts\[0\]: unknown format 'coreml'"),
    ('[[artefacts]]\nformat = "onnx"\nquant = "int4"\n' + RUNTIME, "no quantisation 'int4'"),
    ('[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n', r"\$\.artefacts\[0\]: object missing required field `runtime`"),
    ('threads = 2\n', "missing required field `artefacts`"),
    ('artefacts = []\n', r"\$\.artefacts: expected `array` of length >= 1"),
    ('threads = [\n', "cannot read target profile"),
    ('[[artefacts]]\nformat = "onnx"\nquant = "fp32"\noptional = "no"\n' + RUNTIME,
     r"\$\.artefacts\[0\]\.optional: expected `bool`, got `str`"),
    ('threads = 0\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME, r"\$\.threads: expected `int` >= 1"),
    ('[signals]\nstale_after_s = nan\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME,
     r"\$\.signals\.stale_after_s: nan is not a finite number"),
    ('[signals]\nstale_after_s = 0\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME,
     r"\$\.signals\.stale_after_s: expected `float` > 0"),
    ('[signals]\nthermal = true\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME,
     r"\$\.signals\.thermal: true names no source"),
    ('[signals]\nbattery = "solar"\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME,
     r"\$\.signals\.battery: invalid enum value 'solar'"),
    ('[signals]\nfiles = {temp = 3}\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME,
     r"\$\.signals\.files\[\.\.\.\]: expected `str`, got `int`"),
    ('colour = "red"\n[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME,
     r"\$: object contains unknown field `colour`"),
])
def test_bad_profiles_fail_in_one_line_naming_the_file(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(HydraEdgeError, match=message) as e:
        load_target(str(f))
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_profiles_and_manifests_are_read_without_torch() -> None:
    """The calibrator and switcher read profiles and manifests on boards that have no torch."""
    code = ("import sys; from hydra_edge.convert.targets import load_target;"
            "from hydra_edge.convert.manifest import read_manifest;"
            "[load_target(t) for t in ('rpi', 'android', 'jetson')];"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
