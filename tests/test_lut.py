"""hydra-edge lut: policy, Pareto candidates, derating, cells, outputs, user errors.

The table needs only the bundle's manifest, so these tests write a manifest with made-up
artefact records (no conversion) and create Calibration objects directly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from support.tables import ANDROID_SIGNALS, PHONE_SIGNALS, PI_SIGNALS, calibration, fake_bundle, heads_grid, table

from hydra_edge.atomic import sha256_file
from hydra_edge.commands.lut import lut
from hydra_edge.errors import HydraEdgeError
from hydra_edge.lut import policy as policy_module
from hydra_edge.lut.make import OUTPUTS
from hydra_edge.lut.plot import markdown
from hydra_edge.lut.policy import Policy, load_policy, policy_from_dict
from hydra_edge.lut.table import NO_FORECAST, build_table
from hydra_edge.measure.pareto import Point, pareto
from hydra_edge.records import lut as record
from hydra_edge.records.calibration import Derating
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.lut import read_table


def test_pareto_keeps_only_faster_or_more_accurate() -> None:
    pts = [Point(3, "a", 10, 50, None), Point(6, "b", 25, 60, None), Point(9, "c", 20, 70, None),
           Point(12, "d", 40, 69, None)]
    front, dominated = pareto(pts)
    assert [p.heads for p in front] == [3, 9] and [p.heads for p in dominated] == [6, 12]


def test_each_cell_takes_the_most_accurate_head_count_within_its_budget(tmp_path: Path) -> None:
    doc = table(tmp_path, {3: 10, 6: 20, 9: 30, 12: 40}, budget_ms=35)
    # default deratings 1, 1.15, 1.4, 2 by temperature band; budget x 1, 1, 0.75, 0.5 by battery band
    assert heads_grid(doc) == [[9, 9, 6, 3], [9, 9, 6, 3], [6, 6, 3, 3], [3, 3, 3, 3]]
    assert doc["selection"]["meets_budget"][3] == [True, True, True, False]  # 20 ms > 17.5: none fits
    assert doc["selection"]["expected_ms"][0] == [30, 34.5, 28, 20]
    assert doc["thermal"]["derating_basis"] == ["default"] * 4 and doc["accuracy_basis"] == "heads"
    assert doc["battery"]["names"] == ["charging/mains", ">=50 %", "20-50 %", "<20 %"]
    assert doc["thermal"]["names"] == ["<60 °C", "60-70 °C", "70-80 °C", ">=80 °C"]


def test_dominated_head_counts_are_never_candidates(tmp_path: Path) -> None:
    doc = table(tmp_path, {3: 10, 6: 25, 9: 20, 12: 40}, budget_ms=100)
    assert [c["heads"] for c in doc["candidates"]] == [3, 9, 12] and doc["dominated"][0]["heads"] == 6


def test_soak_deratings_replace_defaults_and_never_fall_with_heat(tmp_path: Path) -> None:
    soak = Derating(heads=12, duration_s=600, samples=[], by_temperature=[(30, 1.0), (55, 1.1), (65, 1.3)],
                    by_throttled={"false": 1.0, "true": 1.8})
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=50, soak=soak)
    # 70-80 °C was never reached: the default 1.4; 1.8: a throttled Pi counts as >= 80 °C
    assert doc["thermal"]["derating"] == [1.1, 1.3, 1.4, 1.8]
    assert doc["thermal"]["derating_basis"] == ["soak", "soak", "default", "soak"] and doc["calibration"]["soak"]
    assert heads_grid(doc)[0] == [12, 3, 3, 3]


def test_a_soak_that_stayed_cool_leaves_the_hot_bands_at_their_defaults(tmp_path: Path) -> None:
    soak = Derating(heads=12, duration_s=600, samples=[], by_temperature=[(40, 1.0), (45, 1.02), (55, 1.05)])
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=50, soak=soak)
    assert doc["thermal"]["derating"] == [1.05, 1.15, 1.4, 2.0]
    assert doc["thermal"]["derating_basis"] == ["soak", "default", "default", "default"]


def test_android_targets_use_thermal_status(tmp_path: Path) -> None:
    soak = Derating(heads=12, duration_s=600, samples=[], by_temperature=[],
                    by_thermal_status={"NONE": 1.0, "LIGHT": 1.2, "MODERATE": 1.1})
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=45, soak=soak, signals=ANDROID_SIGNALS)
    t = doc["thermal"]
    assert t["source"] == "android" and t["names"][3] == "SEVERE" and t["edges"] == [1, 2, 3, 4, 5, 6]
    assert t["derating"][:4] == [1.0, 1.2, 1.2, 1.5] and t["margin"] == 0 and t["throttled_c"] is None
    assert heads_grid(doc)[0] == [12, 3, 3, 3, 3, 3, 3]


@pytest.mark.parametrize("signals, policy_source, named", [
    (PHONE_SIGNALS, "auto", True),  # targets/android.toml: the phone's forecast counts
    (ANDROID_SIGNALS, "auto", False),  # a profile without the headroom line (a phone that cannot forecast)
    ({**PHONE_SIGNALS, "headroom": "none"}, "auto", False),  # switched off by its flat key
    # a temperature table (for a target reading no thermal signal): headroom is an Android forecast
    ({"commands": {"headroom": PHONE_SIGNALS["commands"]["headroom"]}}, "temperature", False),
    (None, "auto", False),  # a board
])
def test_the_table_records_whether_the_phone_selects_on_its_thermal_headroom(
        tmp_path: Path, signals: dict | None, policy_source: str, named: bool) -> None:
    policy = policy_from_dict({"thermal": {"source": policy_source}})
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=45, policy=policy, signals=signals)
    assert doc["thermal"]["headroom"] is named
    assert ("Thermal headroom: a forecast at or past 1.0 runs as at least SEVERE" in markdown(doc)) is named
    path = tmp_path / "lut.json"
    path.write_bytes(record.encode(doc, "lut.json"))
    assert read_table(path).thermal_headroom is named


@pytest.mark.parametrize("signals, source, reads", [
    (ANDROID_SIGNALS, "temperature", "the Android thermal status"),  # SHUTDOWN (6) would read as 6 °C
    (PI_SIGNALS, "android", "°C"),
])
def test_lut_refuses_a_thermal_source_the_bundles_target_does_not_read(
        tmp_path: Path, signals: dict, source: str, reads: str) -> None:
    bundle = fake_bundle(tmp_path / "bundle", [3, 12], signals=signals)
    calibration(bundle, {3: 10, 12: 40}).write(tmp_path / "cal.json")
    (tmp_path / "policy.toml").write_text(f'[thermal]\nsource = "{source}"\n')
    result = CliRunner().invoke(lut, ["-b", str(bundle), "-c", str(tmp_path / "cal.json"), "-o", str(tmp_path / "out"),
                                      "--budget-ms", "50", "-p", str(tmp_path / "policy.toml")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "[thermal] source" in result.output and f"but the bundle's target ('pi') reads {reads}" in result.output
    assert "re-run hydra-edge lut" in result.output and not (tmp_path / "out").exists()


def retarget(bundle: Path, signals: dict) -> str:
    """Give ``bundle``'s manifest a target reading ``signals``; the new manifest's sha256."""
    manifest = read_manifest(bundle)
    manifest.target = {**manifest.target, "signals": signals}
    manifest.write(bundle)
    return sha256_file(bundle / "manifest.json")


@pytest.mark.parametrize("built_for, read_by, words", [
    (PI_SIGNALS, ANDROID_SIGNALS, "'temperature' bands the table in °C, but the target of"),
    (ANDROID_SIGNALS, PI_SIGNALS, "'android' bands the table in the Android thermal status"),
    (None, {"commands": {"battery": "dumpsys battery"}}, None),  # a target reading no thermal signal: any fits
])
def test_the_reader_refuses_a_table_on_a_thermal_source_the_bundles_target_does_not_read(
        tmp_path: Path, built_for: dict | None, read_by: dict, words: str | None) -> None:
    """A hand-edited manifest or a table from another hydra-edge: read_table checks it too, as the phone does."""
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=45, signals=built_for)
    doc["bundle"]["manifest_sha256"] = retarget(tmp_path / "bundle", read_by)
    path = tmp_path / "lut.json"
    path.write_bytes(record.encode(doc, "lut.json"))
    if words is None:
        assert read_table(path, tmp_path / "bundle").thermal_source == "temperature"
        return
    with pytest.raises(record.LutError) as e:
        read_table(path, tmp_path / "bundle")
    assert str(e.value).startswith(f"{path}: $.thermal.source: ") and words in str(e.value), e.value
    assert "\n" not in str(e.value) and "[thermal] source" in str(e.value)


@pytest.mark.parametrize("forecast, named", [
    (0.4, True), (0.0, True), (10.0, True),  # a forecast, at either end of the range one may take
    (None, False),  # the phone never forecast (no command before Android 14, a HAL answering NaN)
    (10.5, False), (-0.1, False), ("0.4", False), (True, False), ([0.4], False),  # the device's JSON, not a forecast
])
def test_the_table_names_headroom_only_where_the_phone_forecast_during_calibration(
        tmp_path: Path, forecast: object, named: bool) -> None:
    said: list[str] = []
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=45, signals=PHONE_SIGNALS, say=said.append, forecast=forecast)
    assert doc["thermal"]["headroom"] is named
    assert said == ([] if named else [NO_FORECAST])


def test_a_profile_without_headroom_says_nothing_of_a_forecast(tmp_path: Path) -> None:
    said: list[str] = []
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=45, signals=ANDROID_SIGNALS, say=said.append, forecast=None)
    assert doc["thermal"]["headroom"] is False and said == []


def test_lut_says_once_why_a_phone_that_never_forecast_gets_no_headroom(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path / "bundle", [3, 12], signals=PHONE_SIGNALS)
    calibration(bundle, {3: 10, 12: 40}).write(tmp_path / "cal.json")
    result = CliRunner().invoke(lut, ["--bundle", str(bundle), "--calibration", str(tmp_path / "cal.json"),
                                      "--budget-ms", "45", "--out", str(tmp_path / "lut")])
    assert result.exit_code == 0, result.output
    assert result.output.count(f"{NO_FORECAST}\n") == 1
    assert read_table(tmp_path / "lut" / "lut.json").thermal_headroom is False


def test_a_table_written_before_headroom_was_recorded_reads_as_not_naming_it(tmp_path: Path) -> None:
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=45, signals=PHONE_SIGNALS)
    del doc["thermal"]["headroom"]
    path = tmp_path / "lut.json"
    path.write_text(json.dumps(doc))
    assert read_table(path).thermal_headroom is False


@pytest.mark.parametrize("edit, says", [
    ({"headroom": True, "source": "temperature"}, "thermal headroom is an Android forecast; it needs source"),
    ({"headroom": None}, "expected `bool`, got `null`"),
    ({"headroom": "yes"}, "expected `bool`, got `str`"),
])
def test_a_bad_headroom_field_is_refused_in_one_line(tmp_path: Path, edit: dict, says: str) -> None:
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=45, signals=PHONE_SIGNALS)
    doc["thermal"].update(edit)
    path = tmp_path / "lut.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HydraEdgeError) as raised:
        read_table(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: $.thermal.headroom: ") and says in message and "\n" not in message


def test_measured_power_caps_energy_in_a_battery_band(tmp_path: Path) -> None:
    bands = ({"min_pct": 50.0, "budget_scale": 1.0}, {"min_pct": 0.0, "budget_scale": 1.0, "max_energy_mj": 100.0})
    pol = policy_from_dict({"battery": {"bands": list(bands)}})
    doc = table(tmp_path, {3: 10, 12: 40}, budget_ms=100, policy=pol, power_w=4.0)  # 40 and 160 mJ
    assert [row[0] for row in heads_grid(doc)] == [12, 12, 3]



@pytest.mark.parametrize("bands", [
    ({"min_pct": 50.0, "budget_scale": 0.5}, {"min_pct": 0.0, "budget_scale": 1.0}),  # more budget when lower
    ({"min_pct": 50.0, "budget_scale": 1.0, "max_energy_mj": 50.0}, {"min_pct": 0.0, "budget_scale": 1.0}),
])
def test_the_table_never_gives_more_heads_on_a_lower_battery_whatever_the_policy(tmp_path: Path, bands) -> None:
    pol = policy_from_dict({"battery": {"bands": list(bands)}})
    doc = table(tmp_path, {3: 10, 6: 20, 9: 30, 12: 40}, budget_ms=40, policy=pol, power_w=2.0)  # 20-80 mJ
    grid = heads_grid(doc)
    assert grid[2] == grid[1] != grid[0]  # the lower band runs no more than the band above it
    assert doc["selection"]["expected_ms"][2] == doc["selection"]["expected_ms"][1]
    record.encode(doc, "lut.json")  # the device's own checks accept it


def test_a_faster_candidate_never_runs_more_heads_than_a_slower_one(tmp_path: Path) -> None:
    # noisy measurements: 6 heads timed faster than 3 but less accurate, so both are on the Pareto front
    bundle = fake_bundle(tmp_path / "bundle", [3, 6, 12], top1={3: 60.0, 6: 50.0, 12: 70.0})
    cal = calibration(bundle, {3: 20, 6: 10, 12: 40})
    cal.write(tmp_path / "cal.json")
    doc = build_table(bundle, read_manifest(bundle), cal, tmp_path / "cal.json", Policy(budget_ms=100))
    assert [c["heads"] for c in doc["candidates"]] == [6, 12] and doc["dominated"][0]["heads"] == 3
    record.encode(doc, "lut.json")


@pytest.mark.parametrize("cell, other, says", [
    ((0, 3), (0, 2), "a hotter band"),  # the hottest band runs the most heads
    ((3, 0), (2, 0), "a lower battery band"),
])
def test_a_table_that_runs_more_heads_when_hotter_or_lower_on_battery_is_refused(
        tmp_path: Path, cell: tuple, other: tuple, says: str) -> None:
    doc = table(tmp_path, {3: 10, 6: 20, 9: 30, 12: 40}, budget_ms=35)
    b, t = cell
    doc["selection"]["cells"][b][t] = len(doc["candidates"]) - 1  # 12 heads
    path = tmp_path / "lut.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HydraEdgeError) as raised:
        read_table(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: $.selection.cells[{b}][{t}]: 12 heads in {says} than "
                              f"cells[{other[0]}][{other[1]}] (")
    assert message.endswith("; re-run hydra-edge lut") and "\n" not in message


def test_policy_docstring_example_is_the_defaults() -> None:
    example = re.search(r"::\n\n(.*?)\n\nThe default", policy_module.__doc__, re.S).group(1)
    import tomllib

    assert policy_from_dict(tomllib.loads(example)) == msgspec.structs.replace(Policy(), budget_ms=80.0)


@pytest.mark.parametrize("text, message", [
    ("[thermal]\nedges = [1]\n", "$.thermal: object contains unknown field `edges`"),
    ("[thermal]\nedges_c = [70, 60]\n", "strictly rising"),
    ("[thermal]\nderating = [1.0]\n", "one multiplier per band"),
    ("[battery]\nbands = [{min_pct = 20, budget_scale = 1}]\n", "end at min_pct = 0"),
    ("budget_ms = -1\n", "$.budget_ms: expected `float` > 0.0"),
    ("budget_ms = \n", "cannot read policy"),
    ('[thermal]\nmargin_c = "3"\n', "$.thermal.margin_c: expected `float`, got `str`"),
    ("min_dwell_s = inf\n", "p.toml: $.min_dwell_s: inf is not a finite number"),
    ("[battery]\nbands = [{min_pct = nan, budget_scale = 1}]\n", "$.battery.bands[0].min_pct: nan is not a finite number"),
    ("[thermal]\nderating = [1.0, 1.1, 1.2, 0.5]\n", "$.thermal.derating[3]: expected `float` >= 1.0"),
    ("min_dwell_s = -1\n", "$.min_dwell_s: expected `float` >= 0.0"),
    ("[battery]\nmargin_pct = -5\n", "$.battery.margin_pct: expected `float` >= 0.0"),
])
def test_bad_policy_files_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(HydraEdgeError, match=re.escape(message)):
        load_policy(tmp_path / "p.toml")


def test_command_writes_every_output_bound_to_bundle_and_calibration(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path / "bundle", [3, 6, 12])
    calibration(bundle, {3: 10, 6: 20, 12: 40}).write(tmp_path / "cal.json")
    (tmp_path / "policy.toml").write_text("min_dwell_s = 2.5\n[thermal]\nmargin_c = 4\n")
    result = CliRunner().invoke(lut, ["--bundle", str(bundle), "--calibration", str(tmp_path / "cal.json"),
                                      "--budget-ms", "30", "--policy", str(tmp_path / "policy.toml"),
                                      "--out", str(tmp_path / "lut")])
    assert result.exit_code == 0, result.output
    assert all((tmp_path / "lut" / name).is_file() for name in OUTPUTS)
    doc = json.loads((tmp_path / "lut" / "lut.json").read_text())
    assert doc["calibration"]["sha256"] == sha256_file(tmp_path / "cal.json") and doc["budget_ms"] == 30
    t = read_table(tmp_path / "lut" / "lut.json", bundle)
    assert t.heads == (3, 6, 12) and t.min_dwell_s == 2.5 and t.thermal_margin == 4
    assert (tmp_path / "lut" / "lut.png").read_bytes()[:4] == b"\x89PNG"
    assert "| charging/mains (≤30 ms) | 6 (20) | 6 (23) | 6 (28) | 3 (20) |" in result.output
    assert "hydra_lut_select" in (tmp_path / "lut" / "hydra_lut.h").read_text()
    manifest_sha = sha256_file(bundle / "manifest.json")  # apps check the bundle they ship, as the switcher does
    assert f'#define HYDRA_LUT_MANIFEST_SHA256 "{manifest_sha}"' in (tmp_path / "lut" / "hydra_lut.h").read_text()
    assert f'const val MANIFEST_SHA256 = "{manifest_sha}"' in (tmp_path / "lut" / "HydraLut.kt").read_text()


@pytest.mark.parametrize("case", ["other-bundle", "no-budget", "no-calibration", "nothing-measured", "other-heads",
                                  "other-sha256"])
def test_user_errors_are_one_line(tmp_path: Path, case: str) -> None:
    bundle = fake_bundle(tmp_path / "bundle", [3, 12])
    cal = calibration(bundle, {3: 10, 12: 40})
    args = ["-b", str(bundle), "-c", str(tmp_path / "cal.json"), "-o", str(tmp_path / "out"), "--budget-ms", "50"]
    if case == "other-bundle":
        cal.bundle["manifest_sha256"], expected = "f" * 64, "was measured on another bundle"
    elif case == "no-budget":
        args, expected = args[:-2], "no latency budget"
    elif case == "nothing-measured":
        cal.results[0].status = cal.results[1].status = "error"
        expected = "no successful measurement"
    elif case == "other-heads":  # a table built from it names an artefact the device then refuses
        cal.results[0].heads = 99
        expected = (f"{tmp_path / 'cal.json'}: artefact h3_onnx_fp32 was measured as 99 heads, but "
                    f"{bundle / 'manifest.json'} has it as 3 heads; calibrate this bundle again")
    elif case == "other-sha256":
        cal.results[1].sha256 = "e" * 64
        expected = (f"{tmp_path / 'cal.json'}: artefact h12_onnx_fp32 was measured as sha256 eeeeeeeeeeee, but "
                    f"{bundle / 'manifest.json'} has it as sha256 000000000000; calibrate this bundle again")
    if case == "no-calibration":
        expected = "no calibration at"
    else:
        cal.write(tmp_path / "cal.json")
    result = CliRunner().invoke(lut, args)
    assert result.exit_code == 1 and expected in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_each_dominated_head_count_is_said_with_the_candidate_that_beats_it_and_why(tmp_path: Path) -> None:
    """As in issue 36: 12 heads less accurate than fewer (undertrained); 6 heads timed slower than 9 (noise)."""
    top1 = {3: 70.8, 4: 78.1, 6: 74.0, 9: 80.0, 12: 62.5}
    bundle = fake_bundle(tmp_path / "bundle", sorted(top1), top1=top1)
    cal = calibration(bundle, {3: 10, 4: 12, 6: 30, 9: 25, 12: 40})
    cal.write(tmp_path / "cal.json")
    result = CliRunner().invoke(lut, ["--bundle", str(bundle), "--calibration", str(tmp_path / "cal.json"),
                                      "--budget-ms", "100", "--out", str(tmp_path / "lut")])
    assert result.exit_code == 0, result.output
    assert "- 12 heads: 62.5 % < 80.0 % at 9 heads, which is faster (25 ms against 40); train longer or with more " \
           "data" in result.output
    assert "- 6 heads: 74.0 % < 80.0 % at 9 heads, which is faster (25 ms against 30); its latency is likely timing " \
           "noise; calibrate again" in result.output
    assert (tmp_path / "lut" / "lut.md").read_text().count(" heads: ") == 2
    doc = table(tmp_path / "again", {3: 10, 6: 25, 9: 20, 12: 40}, budget_ms=100)  # no labels: accuracy is heads
    assert markdown(doc).splitlines()[markdown(doc).splitlines().index("Dominated (never chosen):") + 2] == \
        "- 6 heads: 25 ms, slower than 9 heads (20 ms), which has more; likely timing noise: calibrate again"
