"""Every record is validated where it is read: each field of a valid manifest, calibration, lut.json,
target profile, policy and model config is replaced by a wrong type, NaN, infinity, a huge or a
negative number, or removed, and the reader answers one line naming the file and the field.

Valid records round-trip byte for byte, and records in the shape today's writers produced before
the schemas existed still read.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Callable

import msgspec
import pytest
from click.testing import CliRunner
from support.bounded import without_blocking
from support.record_fuzz import BAD, assert_one_line, fields, fuzz, mutate
from support.tables import calibration, fake_bundle

from hydra_edge.atomic import sha256_file
from hydra_edge.commands.lut import lut
from hydra_edge.convert.targets import load_target
from hydra_edge.errors import HydraEdgeError
from hydra_edge.lut.make import make_lut
from hydra_edge.lut.policy import Policy, load_policy
from hydra_edge.measure.journal import read_calibration
from hydra_edge.model.config import HydraConfig, parse_heads
from hydra_edge.records.calibration import Derating
from hydra_edge.records.codec import RECORD_MAX_BYTES
from hydra_edge.records.manifest import MANIFEST, bundle_files, read_manifest
from hydra_edge.records.target import read_profile
from hydra_edge.runtime.lut import LutError, read_table
from hydra_edge.runtime.switcher import Switcher

ROOT = Path(__file__).resolve().parents[1]
RECORDED = sorted((ROOT / "calibration" / "recorded").glob("*.json"))


def dumps_toml(d: dict[str, Any]) -> str:
    """A TOML document of inline values (enough for profiles and policies); NaN and inf as TOML writes them."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        if isinstance(v, (int, str)):
            return json.dumps(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items() if x is not None) + "}"
    return "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in d.items() if v is not None)


# --- fixtures: one valid record of each kind ------------------------------------------------------------


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return fake_bundle(tmp_path / "bundle", [3, 6, 12], top1={3: 80.0, 6: 90.0, 12: 91.0})


@pytest.fixture
def cal_file(tmp_path: Path, bundle: Path) -> Path:
    soak = Derating(heads=12, duration_s=60.0, samples=[{"t_s": 1.0, "latency_ms": 40.0}],
                    by_temperature=[(40.0, 1.0), (60.0, 1.3)], by_thermal_status={"NONE": 1.0},
                    by_throttled={"false": 1.0, "true": 1.5})
    return calibration(bundle, {3: 10.0, 6: 20.0, 12: 40.0}, soak=soak, power_w=3.0).write(tmp_path / "cal.json")


@pytest.fixture
def lut_file(tmp_path: Path, bundle: Path, cal_file: Path) -> Path:
    make_lut(bundle, cal_file, tmp_path / "lut", budget_ms=30.0)
    return tmp_path / "lut" / "lut.json"


# --- fuzz: every field of every record -------------------------------------------------------------------


def test_every_manifest_field_is_checked(bundle: Path) -> None:
    doc = json.loads((bundle / MANIFEST).read_text())
    doc["model"] = HydraConfig().to_dict()
    doc["artefacts"] = doc["artefacts"][:1]
    free = (r"\$\.data.*", r"\$\.tools.*", r"\$\.artefacts\[0\]\.notes.*", r"\$\.created_by", r"\$\.classes.*",
            r"\$\.checkpoint\.path", r"\$\.target\.(description|source|signals\.(files|commands)\..*)",
            r"\$\.artefacts\[0\]\.(host_runtime|golden\.reference|device_build|accuracy\.basis|nesting\.basis)",
            r"\$\.target\.artefacts\[0\]\.(options.*|device_build)")
    optional = (r"\$\.(created_by|classes|artefacts|schema|schema_version)", r"\$\.model\..*",
                r"\$\.artefacts\[0\]\.(device_build|notes|compact|nesting|verify_seconds)", r"\$\.target\.signals(\..*)?",
                r"\$\.target\.artefacts\[0\]\.(optional|device_build|options)", r"\$\.model\.heads\[\d+\]")
    negative = (r"\$\.artefacts\[0\]\.accuracy\.drop_pp", r"\$\.artefacts\[0\]\.nesting\.(max_)?cost_pp")
    path = bundle / MANIFEST

    def write(d: Any) -> Path:
        path.write_text(json.dumps(d))
        return path
    assert fuzz(doc, free, optional, negative, write, lambda: read_manifest(bundle)) > 150


def test_every_calibration_field_is_checked(cal_file: Path) -> None:
    doc = json.loads(cal_file.read_text())
    doc["results"] = doc["results"][:1]
    free = (r"\$\.device.*", r"\$\.settings.*", r"\$\.results\[0\]\.(golden|state_before|state_after)\..*",
            r"\$\.soak\.samples.*", r"\$\.bundle\.(path|target)", r"\$\.results\[0\]\.error")
    optional = (r"\$\.(results|soak|schema|schema_version)", r"\$\.results\[0\]\.(golden|load_s|rebuild_s|latency|"
                r"peak_rss_mb|state_before|state_after|error)", r"\$\.results\[0\]\.latency\.(?!mean_ms).*",
                r"\$\.soak\.(by_thermal_status|by_throttled|bin_c)", r"\$\.bundle\.(target|path)",
                r"\$\.soak\.by_(thermal_status|throttled)\..*")
    negative = (r"\$\.soak\.by_temperature\[\d\]\[0\]",)

    def write(d: Any) -> Path:
        cal_file.write_text(json.dumps(d))
        return cal_file
    assert fuzz(doc, free, optional, negative, write, lambda: read_calibration(cal_file)) > 80


def test_every_lut_field_is_checked(lut_file: Path, bundle: Path) -> None:
    doc = json.loads(lut_file.read_text())
    free = (r"\$\.created_by", r"\$\.bundle\.(path|target)", r"\$\.calibration\.(path|device_id)",
            r"\$\.(thermal|battery)\.names.*", r"\$\.battery\.max_energy_mj\[\d\]", r"\$\.classes.*")
    optional = (r"\$\.policy\..*", r"\$\.candidates\[\d\]\.power_w", r"\$\.bundle\.target", r"\$\.policy",
                r"\$\.classes", r"\$\.thermal\.headroom")  # a table from before headroom counted: not named
    negative = (r"\$\.thermal\.(edges\[0\]|throttled_c)", r"\$\.policy\.thermal\.(edges_c\[0\]|throttled_c)")

    def write(d: Any) -> Path:
        lut_file.write_text(json.dumps(d))
        return lut_file
    assert fuzz(doc, free, optional, negative, write, lambda: read_table(lut_file, bundle), LutError) > 150


def test_every_target_profile_field_is_checked(tmp_path: Path) -> None:
    import tomllib

    doc = tomllib.loads((ROOT / "targets" / "jetson.toml").read_text())
    doc["signals"].update(stale_after_s=30.0, raise_after_s=10.0, assumed_hot=85.0, battery="none",
                          thermal_zones=["cpu-thermal"])
    path = tmp_path / "board.toml"
    free = (r"\$\.description", r"\$\.artefacts\[\d\]\.(device_build|options.*)", r"\$\.signals\.(files|commands)\..*")
    optional = (r"\$\.(name|description|threads|golden_inputs|signals)", r"\$\.signals\..*",
                r"\$\.artefacts\[\d\]\.(optional|device_build|options)")
    negative = (r"\$\.signals\.assumed_hot",)

    def write(d: Any) -> Path:
        path.write_text(dumps_toml(d))
        return path
    assert fuzz(doc, free, optional, negative, write, lambda: load_target(str(path))) > 60


def test_every_policy_field_is_checked(tmp_path: Path) -> None:
    doc = msgspec.structs.replace(Policy(), budget_ms=80.0).to_dict()
    doc["battery"]["bands"][1]["max_energy_mj"] = 200.0
    path = tmp_path / "policy.toml"
    negative = (r"\$\.thermal\.(edges_c\[0\]|throttled_c)",)

    def write(d: Any) -> Path:
        path.write_text(dumps_toml(d))
        return path
    optional = (r"\$\.[^.]+", r"\$\.(thermal|battery)\.[^.\[]+", r"\$\.battery\.bands\[\d\]\.max_energy_mj")
    assert fuzz(doc, (), optional, negative, write, lambda: load_policy(path)) > 40


def test_every_model_config_field_is_checked() -> None:
    doc = HydraConfig().to_dict()
    for path, keys in fields(doc):
        for name, bad in BAD.items():
            with pytest.raises(HydraEdgeError) as e:
                HydraConfig.from_dict(mutate(doc, keys, bad), "ckpt.pt config")
            assert "\n" not in str(e.value) and "ckpt.pt config" in str(e.value) and path in str(e.value), str(e.value)
    with pytest.raises(HydraEdgeError, match=r"\$: object contains unknown field `colour`"):
        HydraConfig.from_dict({**doc, "colour": "red"})


# --- what the issue reproduced ----------------------------------------------------------------------------


@pytest.mark.parametrize("where, name", [
    (("artefacts", 0, "file"), "$.artefacts[0].file"),
    (("artefacts", 0, "golden", "file"), "$.artefacts[0].golden.file"),
])
@pytest.mark.parametrize("escape", ["../../etc/hostname", "/etc/hostname", "a/../../x", "a\x00b"])
def test_paths_that_leave_the_bundle_are_refused(bundle: Path, where: tuple, name: str, escape: str) -> None:
    doc = json.loads((bundle / MANIFEST).read_text())
    (bundle / MANIFEST).write_text(json.dumps(mutate(doc, where, escape)))
    assert_one_line(lambda: read_manifest(bundle), bundle / MANIFEST, name)


@pytest.mark.parametrize("escape", ["../../etc/hostname", "/etc/hostname"])
def test_lut_candidate_paths_that_leave_the_bundle_are_refused(lut_file: Path, bundle: Path, escape: str) -> None:
    doc = json.loads(lut_file.read_text())
    doc["candidates"][0]["file"] = escape
    lut_file.write_text(json.dumps(doc))
    assert_one_line(lambda: read_table(lut_file, bundle), lut_file, "$.candidates[0].file", LutError)


@pytest.mark.parametrize("change, field", [
    (lambda d: d["candidates"][0].update(heads="six"), "$.candidates[0].heads"),
    (lambda d: d["candidates"][0].update(heads=99), "$.candidates[0].heads"),  # in range, not in the bundle
    (lambda d: d["candidates"][0].update(format="six"), "$.candidates[0].format"),  # no runtime loads it
    (lambda d: d["candidates"][0].update(format="tflite"), "$.candidates[0].format"),  # not the manifest's runtime
    (lambda d: d["candidates"][0].update(threads=4), "$.candidates[0].threads"),
    (lambda d: d["candidates"][0].update(artefact="h5_onnx_fp32"), "$.candidates[0].artefact"),
    (lambda d: d["selection"].update(min_dwell_s=-1), "$.selection.min_dwell_s"),
    (lambda d: d["thermal"].update(margin=-3), "$.thermal.margin"),
    (lambda d: d["battery"].update(margin_pct=-5), "$.battery.margin_pct"),
    (lambda d: d["thermal"].update(edges=d["thermal"]["edges"][::-1]), "$.thermal.edges"),
    (lambda d: d["battery"].update(min_pct=d["battery"]["min_pct"][::-1]), "$.battery.min_pct"),
    (lambda d: d["selection"]["cells"][0].append(0), "$.selection.cells"),
    (lambda d: d["selection"]["cells"][0].__setitem__(0, 7), "$.selection.cells[0][0]"),
    (lambda d: d["candidates"].reverse(), "$.candidates"),
    (lambda d: d.update(schema_version=2), "$.schema_version"),
])
def test_lut_json_nonsense_is_one_line(lut_file: Path, bundle: Path, change: Callable, field: str) -> None:
    doc = json.loads(lut_file.read_text())
    change(doc)
    lut_file.write_text(json.dumps(doc))
    assert_one_line(lambda: read_table(lut_file, bundle), lut_file, field, LutError)


def test_lut_nan_dwell_written_by_python_json_is_one_line(lut_file: Path) -> None:
    doc = json.loads(lut_file.read_text())
    doc["selection"]["min_dwell_s"] = math.nan
    lut_file.write_text(json.dumps(doc))  # Python's json writes the NaN token that JSON does not have
    assert_one_line(lambda: read_table(lut_file), lut_file, "$.selection.min_dwell_s", LutError)


def test_deeply_nested_json_is_one_line_not_a_recursion_error(tmp_path: Path, bundle: Path) -> None:
    deep = "[" * 100000 + "]" * 100000
    with pytest.raises(RecursionError):  # what Python's own json does with it
        json.loads(deep)
    path = tmp_path / "lut.json"
    for text in (deep, '{"schema": "hydra-edge/lut", "schema_version": 1, "x": ' + deep + "}"):
        path.write_text(text)
        assert_one_line(lambda: read_table(path), path, "", LutError)
        switcher = Switcher(bundle, path)  # was a RecursionError; now the one line it falls back on
        switcher.close()
        assert switcher.fallback and "\n" not in switcher.fallback and str(path) in switcher.fallback
    doc = json.loads((bundle / MANIFEST).read_text())
    (bundle / MANIFEST).write_text(json.dumps(doc)[:-1] + ', "notes": ' + deep + "}")
    assert_one_line(lambda: read_manifest(bundle), bundle / MANIFEST, "")


def test_a_missing_record_or_artefact_is_one_line(tmp_path: Path, bundle: Path) -> None:
    assert_one_line(lambda: read_calibration(tmp_path / "none.json"), tmp_path / "none.json", "")
    assert_one_line(lambda: read_table(tmp_path / "none.json"), tmp_path / "none.json", "", LutError)
    assert_one_line(lambda: load_policy(tmp_path / "none.toml"), tmp_path / "none.toml", "")
    manifest = read_manifest(bundle)
    with pytest.raises(HydraEdgeError, match=r"vit_h3_onnx_fp32\.onnx is missing \(artefact h3_onnx_fp32 file"):
        bundle_files(bundle, manifest.artefacts)
    for a in manifest.artefacts:
        (bundle / a.file).write_bytes(b"model")
    doc = json.loads((bundle / MANIFEST).read_text())
    for a in doc["artefacts"]:
        a["sha256"] = sha256_file(bundle / a["file"])
    (bundle / MANIFEST).write_text(json.dumps(doc))
    manifest = read_manifest(bundle)
    with pytest.raises(HydraEdgeError, match=r"golden\.npz is missing \(artefact h3_onnx_fp32 golden\.file"):
        bundle_files(bundle, manifest.artefacts)
    assert set(bundle_files(bundle, manifest.artefacts, golden=False)) == {a.file for a in manifest.artefacts}


def test_an_unknown_version_names_both_versions(bundle: Path, cal_file: Path) -> None:
    for path, read in ((bundle / MANIFEST, lambda: read_manifest(bundle)), (cal_file, lambda: read_calibration(cal_file))):
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "schema_version": 7}))
        with pytest.raises(HydraEdgeError, match=r"schema version 7, this hydra-edge reads version 1"):
            read()


@pytest.mark.parametrize("budget", ["inf", "nan", "-1", "0", "-inf", "1e400"])
def test_lut_budget_must_be_a_finite_positive_number(tmp_path: Path, bundle: Path, cal_file: Path,
                                                      budget: str) -> None:
    result = CliRunner().invoke(lut, ["--bundle", str(bundle), "--calibration", str(cal_file),
                                      f"--budget-ms={budget}", "--out", str(tmp_path / "out")])
    assert result.exit_code != 0 and "Traceback" not in result.output and "--budget-ms" in result.output
    assert not (tmp_path / "out").exists()


def test_a_policy_budget_of_infinity_never_reaches_lut_json(tmp_path: Path, bundle: Path, cal_file: Path) -> None:
    (tmp_path / "p.toml").write_text("budget_ms = inf\n")
    result = CliRunner().invoke(lut, ["--bundle", str(bundle), "--calibration", str(cal_file),
                                      "--policy", str(tmp_path / "p.toml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "$.budget_ms: inf is not a finite number" in result.output
    assert not (tmp_path / "out").exists()


def test_nan_latencies_are_refused_when_written_and_when_read(tmp_path: Path, cal_file: Path) -> None:
    cal = read_calibration(cal_file)
    cal.results[0].latency["p50_ms"] = math.nan
    with pytest.raises(HydraEdgeError, match=r"\$\.results\[0\]\.latency\.p50_ms: nan is not a finite number"):
        cal.write(tmp_path / "nan.json")
    assert not (tmp_path / "nan.json").exists()
    doc = json.loads(cal_file.read_text())
    doc["results"][0]["latency"]["mean_ms"] = math.inf
    cal_file.write_text(json.dumps(doc))
    assert_one_line(lambda: read_calibration(cal_file), cal_file, "$.results[0].latency.mean_ms")


@pytest.mark.parametrize("text", ["1-1000000000", "0-3", "3-13", "13", "-3", "six", "3,,6"])
def test_head_specs_are_bounded_before_they_are_expanded(text: str) -> None:
    with pytest.raises(HydraEdgeError) as e:
        parse_heads(text, 12)
    assert "\n" not in str(e.value) and ("1..12" in str(e.value) or "3-12" in str(e.value))


def test_head_specs_that_fit_still_parse() -> None:
    assert parse_heads("3-5,12", 12) == (3, 4, 5, 12) and parse_heads("12", 12) == (12,)


def test_convert_options_refuse_nonsense() -> None:
    from hydra_edge.commands.convert import convert

    for option in (["--max-drop", "nan"], ["--max-drop", "-1"], ["--jobs", "0"], ["--eval-limit", "-3"]):
        result = CliRunner().invoke(convert, ["-c", "x.pt", "-t", "rpi", "-o", "out", *option])
        assert result.exit_code == 2 and option[0] in result.output and "Traceback" not in result.output


# --- round trips and old records --------------------------------------------------------------------------


def test_records_round_trip_byte_for_byte(tmp_path: Path, bundle: Path, cal_file: Path, lut_file: Path) -> None:
    first = (bundle / MANIFEST).read_bytes()
    read_manifest(bundle).write(bundle)
    assert (bundle / MANIFEST).read_bytes() == first
    first = cal_file.read_bytes()
    read_calibration(cal_file).write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == first
    from hydra_edge.records import lut as lut_record

    first = lut_file.read_bytes()
    assert lut_record.encode(msgspec.to_builtins(lut_record.read(lut_file)), "lut.json") == first


@pytest.mark.parametrize("recorded", RECORDED, ids=[p.name for p in RECORDED])
def test_recorded_calibrations_still_read_and_round_trip(tmp_path: Path, recorded: Path) -> None:
    cal = read_calibration(recorded)
    assert cal.measured() and all(r.latency_ms > 0 for r in cal.measured())
    cal.write(tmp_path / "a.json")
    read_calibration(tmp_path / "a.json").write(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads(recorded.read_text())


def test_records_written_by_the_previous_writer_still_read(bundle: Path, cal_file: Path, lut_file: Path) -> None:
    """Before the schemas, records were json.dumps(indent=2) of plain dicts (ASCII-escaped, ints where typed)."""
    manifest = read_manifest(bundle)
    (bundle / MANIFEST).write_text(json.dumps(json.loads((bundle / MANIFEST).read_text()), indent=2) + "\n")
    assert read_manifest(bundle) == manifest
    doc = json.loads(lut_file.read_text())
    doc["selection"]["min_dwell_s"] = 5  # an int where a float is meant
    doc["thermal"]["names"][0] = "<60 °C"
    lut_file.write_text(json.dumps(doc, indent=2) + "\n")
    assert read_table(lut_file, bundle).min_dwell_s == 5.0
    assert "\\u00b0" in lut_file.read_text()  # "°" as the old writer escaped it


def test_schemas_import_without_torch_or_host_modules() -> None:
    """Boards import the records package: no torch, no converter, no click."""
    code = ("import sys; import hydra_edge.records.manifest, hydra_edge.records.calibration, hydra_edge.records.lut,"
            "hydra_edge.runtime.lut;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'click') or m.startswith('hydra_edge.convert')"
            " or m.startswith('hydra_edge.measure') or m.startswith('hydra_edge.lut')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_lookup_table_and_fail_safe_need_only_the_standard_library_and_msgspec() -> None:
    """What their docstrings promise boards: no numpy, no torch; msgspec comes with the records."""
    code = ("import sys; before = set(sys.modules); import hydra_edge.runtime.lut, hydra_edge.runtime.failsafe;"
            "used = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names);"
            "used.discard('typing_extensions');"  # msgspec imports it where it is installed
            "assert used == {'hydra_edge', 'msgspec'}, used")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- the readers that use a record's paths ---------------------------------------------------------------


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


def test_calibrate_never_copies_a_file_outside_the_bundle(tmp_path: Path, bundle: Path) -> None:
    """A manifest entry once made calibrate copy /etc/hostname to the device."""
    from hydra_edge.commands.calibrate import calibrate

    doc = json.loads((bundle / MANIFEST).read_text())
    doc["artefacts"][0]["file"] = "/etc/hostname"
    (bundle / MANIFEST).write_text(json.dumps(doc))
    result = CliRunner().invoke(calibrate, ["--bundle", str(bundle), "--local", "--out", str(tmp_path / "cal")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(error_lines(result.output)) == 1
    assert "$.artefacts[0].file: '/etc/hostname' leaves the bundle" in error_lines(result.output)[0]


def test_an_artefact_format_no_runtime_loads_is_one_line_naming_the_field(tmp_path: Path, bundle: Path) -> None:
    """A manifest saying ``"format": "six"`` once crashed calibrate with a KeyError."""
    from hydra_edge.commands.calibrate import calibrate

    doc = json.loads((bundle / MANIFEST).read_text())
    doc["artefacts"][0]["format"] = "six"
    (bundle / MANIFEST).write_text(json.dumps(doc))
    assert_one_line(lambda: read_manifest(bundle), bundle / MANIFEST, "$.artefacts[0].format")
    result = CliRunner().invoke(calibrate, ["--bundle", str(bundle), "--local", "--out", str(tmp_path / "cal")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(error_lines(result.output)) == 1 and "$.artefacts[0].format" in error_lines(result.output)[0]


def test_the_records_know_the_formats_the_runtime_loads() -> None:
    from hydra_edge.formats import FORMATS
    from hydra_edge.records.fields import Format

    assert set(typing.get_args(Format)) == set(FORMATS)
    assert [msgspec.convert(name, Format) for name in FORMATS] == list(FORMATS)  # each decodes as itself


def bundle_with_files(folder: Path, name: str, sha256: str) -> Path:
    """A one-artefact bundle whose golden pair exists and whose artefact ``name`` has ``sha256``."""
    fake_bundle(folder, [3])
    doc = json.loads((folder / MANIFEST).read_text())
    (folder / doc["artefacts"][0]["golden"]["file"]).write_bytes(b"golden")
    doc["artefacts"][0].update(file=name, sha256=sha256)
    doc["artefacts"][0]["golden"]["sha256"] = sha256_file(folder / doc["artefacts"][0]["golden"]["file"])
    (folder / MANIFEST).write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("link", ["file", "folder"])
def test_a_bundle_link_leading_outside_is_never_pushed(tmp_path: Path, link: str) -> None:
    """An artefact that is a link to a file outside the bundle (``-> /etc/hostname``), or lies in a
    folder link (``sub -> /etc``), is refused by calibrate and deploy even with the right sha256."""
    from hydra_edge.commands.calibrate import calibrate

    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "hostname").write_text("secret-host\n")
    name = "vit.onnx" if link == "file" else "sub/hostname"
    bundle = bundle_with_files(tmp_path / "bundle", name, sha256_file(outside / "hostname"))
    if link == "file":
        (bundle / name).symlink_to(outside / "hostname")
    else:
        (bundle / "sub").symlink_to(outside)
    record = read_manifest(bundle).artefacts[0]
    with pytest.raises(HydraEdgeError) as e:
        bundle_files(bundle, [record], golden=False)
    assert str(e.value).startswith(f"{bundle / name} is a link to {outside / 'hostname'}, outside the bundle")
    result = CliRunner().invoke(calibrate, ["--bundle", str(bundle), "--local", "--out", str(tmp_path / "cal")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(error_lines(result.output)) == 1 and "outside the bundle" in error_lines(result.output)[0]


def test_a_bundle_file_is_pushed_only_with_the_manifest_sha256(tmp_path: Path) -> None:
    """A link inside the bundle is fine; a file changed since convert (its sha256 differs) is refused."""
    bundle = bundle_with_files(tmp_path / "bundle", "vit.onnx", "0" * 64)
    (bundle / "real.onnx").write_bytes(b"model")
    (bundle / "vit.onnx").symlink_to("real.onnx")
    doc = json.loads((bundle / MANIFEST).read_text())
    doc["artefacts"][0]["sha256"] = sha256_file(bundle / "real.onnx")
    (bundle / MANIFEST).write_text(json.dumps(doc))
    record = read_manifest(bundle).artefacts[0]
    assert bundle_files(bundle, [record]) == {"vit.onnx": bundle / "vit.onnx",
                                              record.golden["file"]: bundle / record.golden["file"]}
    (bundle / "real.onnx").write_bytes(b"tampered")
    with pytest.raises(HydraEdgeError) as e:
        bundle_files(bundle, [record])
    assert str(e.value) == (f"{bundle / 'vit.onnx'} is not the file the manifest names (its sha256 differs; artefact "
                            f"h3_onnx_fp32 file in {bundle / MANIFEST}); re-run hydra-edge convert to restore the bundle")


def test_calibrate_names_a_missing_artefact_in_one_line(tmp_path: Path, bundle: Path) -> None:
    from hydra_edge.commands.calibrate import calibrate

    result = CliRunner().invoke(calibrate, ["--bundle", str(bundle), "--local", "--out", str(tmp_path / "cal")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(error_lines(result.output)) == 1 and "vit_h3_onnx_fp32.onnx is missing" in error_lines(result.output)[0]


# --- bounded reads: a FIFO, a folder or a huge file where a record belongs -------------------------------


def not_a_file(path: Path, kind: str) -> None:
    """``path`` replaced by a FIFO, a folder, or a file larger than any record (sparse: costs no disk)."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(RECORD_MAX_BYTES + 1)


KINDS = {"fifo": "is a FIFO", "folder": "is a folder", "huge": f"is larger than {RECORD_MAX_BYTES} bytes"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("record", ["manifest", "calibration", "lut", "target"])
def test_a_record_that_is_no_plain_file_or_too_large_is_one_line_and_never_blocks(
        tmp_path: Path, bundle: Path, cal_file: Path, lut_file: Path, record: str, kind: str) -> None:
    target = tmp_path / "t.toml"
    target.write_text("name = 'pi'\n")
    path, read = {"manifest": (bundle / MANIFEST, lambda: read_manifest(bundle)),
                  "calibration": (cal_file, lambda: read_calibration(cal_file)),
                  "lut": (lut_file, lambda: read_table(lut_file)),
                  "target": (target, lambda: read_profile(str(target)))}[record]
    not_a_file(path, kind)
    error = without_blocking(read, path)
    assert isinstance(error, HydraEdgeError), error
    assert "\n" not in str(error) and f"{path} {KINDS[kind]}" in str(error), str(error)


def test_a_final_newline_is_not_part_of_a_sha256_or_a_dtype() -> None:
    """A regex ending in "$" matches before a final newline: "<f4\\n" would pass the recipe's schema and
    then fail inside numpy with a traceback instead of one line at its field."""
    from hydra_edge.records.fields import Sha256
    from hydra_edge.records.recipe import Dtype

    for kind, good in ((Sha256, "0" * 64), (Dtype, "<f4")):
        assert msgspec.json.decode(json.dumps(good).encode(), type=kind) == good
        with pytest.raises(msgspec.ValidationError, match="matching regex"):
            msgspec.json.decode(json.dumps(good + "\n").encode(), type=kind)


def test_a_table_keyed_by_whole_numbers_reads_its_keys_from_json_strings_and_a_bad_key_is_one_line():
    """JSON's keys are strings: a record keyed by head count (a run's history, ``{"3": 30}``) reads them as the
    numbers they are, and a key that is none is one line naming the table and saying it is a key."""
    from typing import Dict

    from hydra_edge.records import codec

    assert codec.decode(b'{"3": 30, "12": 26}', Dict[int, int], "h.json", "history", "fix it") == {3: 30, 12: 26}
    with pytest.raises(HydraEdgeError) as e:
        codec.decode(b'{"drawn": {"three": 30}}', Dict[str, Dict[int, int]], "h.json", "history", "fix it")
    assert str(e.value) == "h.json: $[...]: expected `int`, got `str` (a key); fix it"
