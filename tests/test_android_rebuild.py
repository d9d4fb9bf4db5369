"""The Android library rebuilds a compact bundle's head counts as ``hydra_edge.runtime.rebuild`` does.

Real compact bundles are converted here with the real convert code (a depth-1 digits model, the
fixture the compact tests share): a .tflite bundle (rpi, nested int8 weights with their per-row
scales and zero points) and a .pte bundle (android: nested int8 weights and fp32 constants). The
Kotlin ``RebuildCheck`` on the built jar gives every head count's bytes, which must be Python's
rebuild's bytes, the dedicated artefact's bytes and the manifest's sha256. Tampered copies (a recipe
byte flipped, paths leaving the bundle, a skeleton truncated or linked out, a FIFO, ranges out of
range, sizes beyond the schema's bounds, manifest sha256 edited) must be refused by both, in one
line naming the same file, and the Kotlin side must then write nothing. Latency corrections written
by either side are read by the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from hydra_edge.errors import HydraEdgeError
from hydra_edge.records import correction as correction_record
from hydra_edge.records.manifest import MANIFEST, Manifest, read_manifest
from hydra_edge.records.recipe import read_recipe
from hydra_edge.runtime.rebuild import artefact_bytes, rebuild

pytestmark = pytest.mark.slow  # converts two bundles and builds the Kotlin library (several minutes)

VARIANTS = [("rpi", "int8-dynamic"), ("android", "int8-dynamic")]


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{t}-{q}" for t, q in VARIANTS])
def variant(request: pytest.FixtureRequest, converted: Callable[[str, str], Path]) -> Path:
    """The folder holding the variant's ``full`` and ``compact`` bundles of the same artefacts."""
    return converted(*request.param)


def kotlin(classpath: str, bundle: Path, out: Path, *heads: int) -> List[Dict[str, Any]]:
    """RebuildCheck's lines: one per artefact (``heads`` only, if given), or one for a refused manifest."""
    done = subprocess.run(["java", "-cp", classpath, "org.hydraedge.core.RebuildCheck", str(bundle), str(out),
                           *map(str, heads)], capture_output=True, text=True, encoding="utf-8", timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def python(bundle: Path, heads: int) -> Tuple[Optional[bytes], Optional[str]]:
    """Python's bytes for the artefact with ``heads`` heads, or its one-line refusal."""
    try:
        manifest = read_manifest(bundle)
        (record,) = [a for a in manifest.artefacts if a.heads == heads]
        return artefact_bytes(bundle, record), None
    except HydraEdgeError as e:
        return None, str(e)


def test_the_bundles_hold_nested_int8_and_float_ranges_in_every_layout_of_axes(converted: Callable[[str, str], Path]) -> None:
    """What the byte-for-byte test below covers: int8 weights nested in the 12-head file, float tensors, per-row
    tensors, several spans on one axis (qkv) and tensors of one to four axes, in both formats."""
    for target, quant in VARIANTS:
        bundle = converted(target, quant) / "compact"
        manifest = read_manifest(bundle)
        compact = [a for a in manifest.artefacts if a.compact is not None]
        assert [a.heads for a in compact] == [3, 6] and manifest.artefacts[-1].compact is None
        assert all(a.nesting is not None and a.nesting.nested for a in manifest.artefacts)
        ranges = [r for a in compact for r in read_recipe(bundle / a.compact.recipe).ranges]
        assert {"|i1", "<f4"} <= {r.dtype for r in ranges}, target
        assert any(len(spans) > 1 for r in ranges for spans in r.index), target
        assert {len(r.shape) for r in ranges} >= {1, 2}, target


def test_kotlin_rebuilds_every_head_count_byte_for_byte_as_python(variant: Path, classpath: str,
                                                                  tmp_path: Path) -> None:
    bundle = variant / "compact"
    manifest = read_manifest(bundle)
    lines = kotlin(classpath, bundle, tmp_path / "out")
    assert [(line["id"], line["heads"], line["compact"]) for line in lines] == \
        [(a.id, a.heads, a.compact is not None) for a in manifest.artefacts]
    for a, line in zip(manifest.artefacts, lines):
        assert not line["refused"], line["message"]
        data = (tmp_path / "out" / f"{a.id}.bin").read_bytes()
        assert data == artefact_bytes(bundle, a) == (variant / "full" / a.file).read_bytes()
        assert hashlib.sha256(data).hexdigest() == line["sha256"] == a.sha256
        if a.compact is not None:
            assert not (bundle / a.file).exists() and data == rebuild(bundle, a)
    # one head count asked for: only it is rebuilt
    (line,) = kotlin(classpath, bundle, tmp_path / "one", 6)
    assert line["heads"] == 6 and [p.name for p in (tmp_path / "one").iterdir()] == [f"{line['id']}.bin"]


# -- tampering: each returns the heads to ask for and the file both refusals must name --------------------

def _h3(bundle: Path) -> Tuple[Manifest, Any, Any]:
    manifest = read_manifest(bundle)
    a = manifest.artefacts[0]
    return manifest, a, read_recipe(bundle / a.compact.recipe)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_recipe(bundle: Path, edit: Callable[[Dict[str, Any]], Any], record: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Path:
    """The h3 recipe edited and re-hashed into the manifest (``record`` edits its manifest record too): only
    the edit is wrong, never the recipe's sha256."""
    manifest, a, _ = _h3(bundle)
    path = bundle / a.compact.recipe
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    m = manifest.to_dict()
    m["artefacts"][0]["compact"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    if record is not None:
        record(m["artefacts"][0])
    (bundle / MANIFEST).write_text(json.dumps(m))  # as bytes: a bad record is what is tested
    return path


def flip_recipe_byte(bundle: Path) -> Tuple[int, Path]:
    _, a, _ = _h3(bundle)
    _flip(bundle / a.compact.recipe)
    return 3, bundle / a.compact.recipe


def _recipe_field(field: str, value: Callable[[Path, Dict[str, Any]], Any]) -> Callable[[Path], Tuple[int, Path]]:
    def tamper(bundle: Path) -> Tuple[int, Path]:
        def edit(doc: Dict[str, Any]) -> None:
            *parents, key = field.split(".")
            target = doc
            for p in parents:
                target = target[p]
            target[key] = value(bundle, doc)
        return 3, _edit_recipe(bundle, edit)
    tamper.__name__ = f"recipe_{field.replace('.', '_')}"
    return tamper


recipe_skeleton_up = _recipe_field("skeleton.file", lambda b, d: "../" + d["skeleton"]["file"])
recipe_skeleton_up.__name__ = "recipe_skeleton_path_with_dotdot"
recipe_source_absolute = _recipe_field("source.file", lambda b, d: str((b / d["source"]["file"]).resolve()))
recipe_source_absolute.__name__ = "recipe_source_absolute_path"
recipe_skeleton_deep_up = _recipe_field("skeleton.file", lambda b, d: "sub/../../" + b.name + "/" + d["skeleton"]["file"])
recipe_skeleton_deep_up.__name__ = "recipe_skeleton_path_leaving_through_a_folder"
recipe_artefact_nul = _recipe_field("artefact", lambda b, d: d["artefact"] + "\x00")
recipe_artefact_nul.__name__ = "recipe_artefact_with_nul"
recipe_huge_skeleton = _recipe_field("skeleton.bytes", lambda b, d: (1 << 53) + 1)
recipe_huge_skeleton.__name__ = "recipe_skeleton_size_beyond_the_schema"
recipe_huge_shape = _recipe_field("ranges", lambda b, d: [d["ranges"][0] | {"shape": [(1 << 40) + 1] + d["ranges"][0]["shape"][1:]},
                                                          *d["ranges"][1:]])
recipe_huge_shape.__name__ = "recipe_axis_beyond_the_schema"


def manifest_recipe_dotdot(bundle: Path) -> Tuple[int, Path]:
    doc = json.loads((bundle / MANIFEST).read_text())
    doc["artefacts"][0]["compact"]["recipe"] = "../" + doc["artefacts"][0]["compact"]["recipe"]
    (bundle / MANIFEST).write_text(json.dumps(doc))
    return 3, bundle / MANIFEST


def truncate_skeleton(bundle: Path) -> Tuple[int, Path]:
    _, _, recipe = _h3(bundle)
    path = bundle / recipe.skeleton.file
    path.write_bytes(path.read_bytes()[:-100])
    return 3, path


def flip_skeleton(bundle: Path) -> Tuple[int, Path]:
    _, _, recipe = _h3(bundle)
    _flip(bundle / recipe.skeleton.file)
    return 3, bundle / recipe.skeleton.file


def flip_source(bundle: Path) -> Tuple[int, Path]:
    _, _, recipe = _h3(bundle)
    _flip(bundle / recipe.source.file)
    return 3, bundle / recipe.source.file


def truncate_source(bundle: Path) -> Tuple[int, Path]:
    _, _, recipe = _h3(bundle)
    path = bundle / recipe.source.file
    path.write_bytes(path.read_bytes()[:-1])
    return 3, path


def skeleton_linked_out(bundle: Path) -> Tuple[int, Path]:
    """The right bytes, through a link to a file beside the bundle."""
    _, _, recipe = _h3(bundle)
    path = bundle / recipe.skeleton.file
    outside = bundle.parent / "private.skeleton"
    path.rename(outside)
    path.symlink_to(outside)
    return 3, path


def skeleton_fifo(bundle: Path) -> Tuple[int, Path]:
    _, _, recipe = _h3(bundle)
    path = bundle / recipe.skeleton.file
    path.unlink()
    os.mkfifo(path)
    return 3, path


def recipe_missing(bundle: Path) -> Tuple[int, Path]:
    _, a, _ = _h3(bundle)
    (bundle / a.compact.recipe).unlink()
    return 3, bundle / a.compact.recipe


def range_beyond_source(bundle: Path) -> Tuple[int, Path]:
    """The last range reads past the source: refused before the skeleton or source is read (both removed)."""
    _, _, recipe = _h3(bundle)
    path = _edit_recipe(bundle, lambda d: d["ranges"][-1].update(source_offset=recipe.source.bytes))
    (bundle / recipe.skeleton.file).unlink()
    (bundle / recipe.source.file).unlink()
    return 3, path


def range_beyond_skeleton(bundle: Path) -> Tuple[int, Path]:
    """The last hole moved past the skeleton's end (sizes kept): no skeleton byte feeds the run before it."""
    _, _, recipe = _h3(bundle)
    return 3, _edit_recipe(bundle, lambda d: d["ranges"][-1].update(offset=d["ranges"][-1]["offset"] + recipe.skeleton.bytes))


def huge_skeleton_in_bounds(bundle: Path) -> Tuple[int, Path]:
    """A 1 TiB skeleton the manifest agrees with: refused at the file's size, never allocated."""
    _, a, recipe = _h3(bundle)
    grow = (1 << 40) - recipe.skeleton.bytes
    _edit_recipe(bundle, lambda d: d["skeleton"].update(bytes=1 << 40), lambda r: r.update(bytes=a.bytes + grow))
    return 3, bundle / recipe.skeleton.file


def huge_manifest_size(bundle: Path) -> Tuple[int, Path]:
    manifest, a, _ = _h3(bundle)
    doc = manifest.to_dict()
    doc["artefacts"][0]["bytes"] = 1 << 53
    Manifest.from_dict(doc).write(bundle)
    return 3, bundle / a.compact.recipe


def huge_recipe_file(bundle: Path) -> Tuple[int, Path]:
    """A recipe over the 8 MiB any record may hold (valid JSON, its sha256 the manifest's)."""
    _, a, _ = _h3(bundle)
    path = bundle / a.compact.recipe
    path.write_bytes(path.read_bytes() + b" " * (8 << 20))
    doc = read_manifest(bundle).to_dict()
    doc["artefacts"][0]["compact"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    Manifest.from_dict(doc).write(bundle)
    return 3, path


def manifest_sha256_edited(bundle: Path) -> Tuple[int, Path]:
    manifest, a, _ = _h3(bundle)
    doc = manifest.to_dict()
    doc["artefacts"][0]["sha256"] = "0" * 64
    Manifest.from_dict(doc).write(bundle)
    return 3, bundle / a.compact.recipe


def manifest_sha256_edited_whole(bundle: Path) -> Tuple[int, Path]:
    """The 12-head artefact, kept whole: its own sha256 edited."""
    manifest = read_manifest(bundle)
    doc = manifest.to_dict()
    doc["artefacts"][-1]["sha256"] = "0" * 64
    Manifest.from_dict(doc).write(bundle)
    return 12, bundle / manifest.artefacts[-1].file


TAMPER = [flip_recipe_byte, recipe_skeleton_up, recipe_source_absolute, recipe_skeleton_deep_up, recipe_artefact_nul,
          manifest_recipe_dotdot, truncate_skeleton, flip_skeleton, flip_source, truncate_source, skeleton_linked_out,
          skeleton_fifo, recipe_missing, range_beyond_source, range_beyond_skeleton, recipe_huge_skeleton,
          recipe_huge_shape, huge_skeleton_in_bounds, huge_manifest_size, huge_recipe_file, manifest_sha256_edited,
          manifest_sha256_edited_whole]


@pytest.mark.parametrize("tamper", TAMPER, ids=lambda t: t.__name__)
def test_kotlin_refuses_what_python_refuses_in_one_line_naming_the_file(variant: Path, classpath: str,
                                                                         tmp_path: Path,
                                                                         tamper: Callable[[Path], Tuple[int, Path]]) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(variant / "compact", bundle)
    heads, named = tamper(bundle)
    data, refusal = python(bundle, heads)
    assert data is None and refusal is not None and "\n" not in refusal
    assert str(named) in refusal, refusal
    lines = kotlin(classpath, bundle, tmp_path / "out", heads)
    (line,) = lines
    assert line.get("refused") is True or line.get("manifest") == "refused", line
    assert "\n" not in line["message"] and str(named) in line["message"], (line["message"], refusal)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # not even part of a file


# -- latency corrections, both ways ------------------------------------------------------------------------

def _corrections() -> List[Dict[str, Any]]:
    return [
        {"created_by": "hydra-edge 0.1.0", "saved_at": 1.75e9 + 0.123, "manifest_sha256": "a" * 64, "lut_sha256": "b" * 64,
         "budget_ms": 41.5, "learned": [{"heads": 12, "p90_ms": 60.25, "slowdown": 1.4633, "samples": 50},
                                         {"heads": 3, "p90_ms": 0.0, "slowdown": 0.0, "samples": 1}]},
        {"created_by": "", "saved_at": 0.0, "manifest_sha256": "0123456789abcdef" * 4, "lut_sha256": "f" * 64,
         "budget_ms": 1e-300, "learned": []},
        {"created_by": "ünï \"quoted\"", "saved_at": 1e12, "manifest_sha256": "c" * 64, "lut_sha256": "d" * 64,
         "budget_ms": 1e12, "learned": [{"heads": h, "p90_ms": h / 3, "slowdown": 1e12 / h, "samples": 1 << 40}
                                         for h in range(1, 129)]},
    ]


def test_a_correction_written_by_either_side_is_read_by_the_other(classpath: str, tmp_path: Path) -> None:
    for i, spec in enumerate(_corrections()):
        # Python writes, Kotlin reads
        by_python = tmp_path / f"python-{i}.correction.json"
        by_python.write_bytes(correction_record.encode(correction_record.CorrectionDocument(
            **{**spec, "learned": [correction_record.LearnedLatency(**e) for e in spec["learned"]]}), str(by_python)))
        # Kotlin writes, Python reads
        spec_file, by_kotlin = tmp_path / f"spec-{i}.json", tmp_path / f"kotlin-{i}.correction.json"
        spec_file.write_text(json.dumps(spec))
        done = subprocess.run(["java", "-cp", classpath, "org.hydraedge.core.CorrectionCheck", "write", str(spec_file),
                               str(by_kotlin)], capture_output=True, text=True, encoding="utf-8", timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        back = correction_record.read(by_kotlin)
        assert msgspec_builtins(back) == {**spec, "schema": correction_record.SCHEMA, "schema_version": 1}
        done = subprocess.run(["java", "-cp", classpath, "org.hydraedge.core.CorrectionCheck", "read", str(by_python),
                               str(by_kotlin)], capture_output=True, text=True, encoding="utf-8", timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        for line in map(json.loads, done.stdout.splitlines()):
            assert line.pop("refused") is False, line
            assert line == spec
    # and a record one side refuses, the other refuses at the same field
    bad = json.loads((tmp_path / "python-0.correction.json").read_text())
    bad["learned"][1]["samples"] = 0
    (tmp_path / "bad.correction.json").write_text(json.dumps(bad))
    with pytest.raises(correction_record.CorrectionError, match=r"\$\.learned\[1\]\.samples"):
        correction_record.read(tmp_path / "bad.correction.json")
    done = subprocess.run(["java", "-cp", classpath, "org.hydraedge.core.CorrectionCheck", "read",
                           str(tmp_path / "bad.correction.json")], capture_output=True, text=True, encoding="utf-8", timeout=60)
    (line,) = map(json.loads, done.stdout.splitlines())
    assert line["refused"] is True and line["path"] == "$.learned[1].samples"


def msgspec_builtins(doc: Any) -> Dict[str, Any]:
    import msgspec

    return msgspec.to_builtins(doc)
