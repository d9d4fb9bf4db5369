"""Target profiles: the shipped three load and say everything a device needs; bad ones fail in one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hydra_edge.cli import main
from hydra_edge.convert.targets import SHIPPED, available, load_target
from hydra_edge.errors import HydraEdgeError
from hydra_edge.formats import FORMATS


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
    # --quant int8-qdq on jetson keeps the profile's own int8-qdq options, not the fp16 variant rewritten
    (qdq,) = jetson.variants("int8-qdq")
    assert qdq.options["op_types_to_quantize"] == ["MatMul", "Gemm", "Conv"] and qdq.options["calibration_images"] == 128
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
            "from hydra_edge.records.manifest import read_manifest;"
            "[load_target(t) for t in ('rpi', 'android', 'jetson')];"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


PI_UPS = '[[artefacts]]\nformat = "onnx"\nquant = "fp32"\n' + RUNTIME


@pytest.fixture
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user folder of profiles as ``$HYDRA_EDGE_TARGETS`` names it: one new board, one that replaces rpi."""
    folder = tmp_path / "my-targets"
    folder.mkdir()
    (folder / "pi-ups.toml").write_text(PI_UPS)
    (folder / "rpi.toml").write_text(PI_UPS.replace("fp32", "int8-dynamic"))
    monkeypatch.setenv("HYDRA_EDGE_TARGETS", str(folder))
    return folder


def listed(output: str) -> dict[str, list[str]]:
    """``hydra-edge targets`` rows by target name: [from, artefacts, file]."""
    rows = [re.split(r"\s{2,}", line) for line in output.splitlines()[1:] if not line.startswith(("user folder:", "Error:"))]
    return {name: rest for name, *rest in rows}


def test_targets_lists_shipped_and_user_profiles_and_where_each_comes_from(user_folder: Path) -> None:
    result = CliRunner().invoke(main, ["targets"])
    assert result.exit_code == 0, result.output
    rows = listed(result.output)
    assert rows["android"][0] == "shipped" and rows["android"][2] == str(SHIPPED / "android.toml")
    assert rows["pi-ups"] == ["user folder", "onnx_fp32", str(user_folder / "pi-ups.toml")]
    assert rows["rpi"] == ["user folder", "onnx_int8-dynamic", str(user_folder / "rpi.toml")]  # hides the shipped rpi
    assert f"user folder: {user_folder}" in result.output
    assert load_target("pi-ups").source == str(user_folder / "pi-ups.toml")
    assert load_target("rpi").artefacts[0].quant == "int8-dynamic"


def test_targets_shows_a_profile_given_by_path(tmp_path: Path) -> None:
    board = tmp_path / "boards" / "board.toml"
    board.parent.mkdir()
    board.write_text(PI_UPS)
    result = CliRunner().invoke(main, ["targets", str(board), "jetson"])
    assert result.exit_code == 0, result.output
    assert listed(result.output) == {"board": ["path", "onnx_fp32", str(board)],
                                     "jetson": ["shipped", "onnx_fp16, onnx_int8-qdq", str(SHIPPED / "jetson.toml")]}


def test_the_user_folder_defaults_to_the_xdg_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYDRA_EDGE_TARGETS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "hydra-edge" / "targets"
    folder.mkdir(parents=True)
    (folder / "pi-ups.toml").write_text(PI_UPS)
    assert load_target("pi-ups").source == str(folder / "pi-ups.toml")
    with pytest.raises(HydraEdgeError, match=f"add nope.toml to {folder}"):
        load_target("nope")


def test_a_bad_user_profile_is_listed_and_named_in_one_line(user_folder: Path) -> None:
    (user_folder / "broken.toml").write_text(PI_UPS.replace('quant = "fp32"', "quant = 3"))
    result = CliRunner().invoke(main, ["targets"])
    assert result.exit_code == 1
    assert listed(result.output)["broken"][0] == "user folder" and "pi-ups" in listed(result.output)
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: {user_folder / 'broken.toml'}") and "$.artefacts[0].quant" in last
