"""Compact bundles: one weight set per variant, every head count rebuilt byte for byte, tampering refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, List, Tuple

import numpy as np
import pytest
from click.testing import CliRunner
from support.bounded import without_blocking
from support.cli import invoke as calibrate_cli
from support.cli import one_line_error
from support.compact import HEADS
from support.record_fuzz import fuzz
from support.runner import run_runner
from support.switcher import IMAGE, POLICY, Board
from support.tables import calibration
from support.targets import SYSFS_TARGET

from hydra_edge.cli import main
from hydra_edge.convert import pipeline
from hydra_edge.convert.compact import Tensor, compact, largest
from hydra_edge.convert.formats import exporter
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.errors import HydraEdgeError
from hydra_edge.lut.make import make_lut
from hydra_edge.records.calibration import read_calibration
from hydra_edge.records.manifest import Manifest, bundle_files, read_manifest
from hydra_edge.records.recipe import read_recipe
from hydra_edge.runtime import engines
from hydra_edge.runtime.engines import load, load_bytes, load_golden, load_golden_pair
from hydra_edge.runtime.rebuild import rebuild
from hydra_edge.runtime.switcher import Switcher

pytestmark = pytest.mark.slow  # converts bundles in every format and layout

# (target, quant) of every format compacted, as the shipped profiles make them (rpi fp32: rpi-tflite-runtime's);
# int8 weights are quantised nested (exact slices of the largest head count's), so they compact like float ones,
# and an int8 .pte holds float tensors too
VARIANTS = [("jetson", "fp16"), ("jetson", "int8-qdq"), ("rpi", "fp32"), ("rpi", "int8-dynamic"),
            ("android", "int8-dynamic")]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{t}-{q}" for t, q in VARIANTS])
def any_root(request: pytest.FixtureRequest, converted: Callable[[str, str], Path]) -> Path:
    """Each compacted variant in turn: what holds for every format."""
    return converted(*request.param)


def stored_bytes(bundle: Path) -> int:
    return sum(f.stat().st_size for f in bundle.iterdir() if f.is_file() and not f.name.startswith("."))


def test_compact_bundle_keeps_one_weight_set_and_rebuilds_the_verified_bytes(any_root: Path) -> None:
    compact, full = read_manifest(any_root / "compact"), read_manifest(any_root / "full")
    assert [(a.id, a.file, a.sha256, a.bytes) for a in compact.artefacts] == \
        [(a.id, a.file, a.sha256, a.bytes) for a in full.artefacts]
    largest = compact.artefacts[-1]
    assert largest.heads == 12 and largest.compact is None and (any_root / "compact" / largest.file).is_file()
    for a in compact.artefacts[:-1]:
        assert a.compact is not None and not (any_root / "compact" / a.file).exists()
        recipe = read_recipe(any_root / "compact" / a.compact.recipe)
        assert recipe.source.file == largest.file and recipe.source.sha256 == largest.sha256
        assert a.notes["layout"].startswith("compact:")
        data = rebuild(any_root / "compact", a)
        assert hashlib.sha256(data).hexdigest() == a.sha256
        holes = {r.offset for r in recipe.ranges}
        tensors = exporter(a.format).tensor_map(data)
        # every float tensor but a few scalars is a slice, and so is every int8 weight quantised per channel,
        # with its scales (an int8 tensor quantised per tensor, and an ONNX QDQ int32 bias and its scale,
        # depend on the activations' scale, per head count)
        int32 = {t.name for t in tensors if t.dtype == np.int32}
        per_channel = {t.rows_of for t in tensors if t.rows_of}
        weights = {t.offset for t in tensors if t.dtype.kind == "f" or t.name in per_channel}
        assert {t.offset for t in tensors if t.offset in weights and t.nbytes >= 64 and t.rows_of not in int32} <= holes
        # what stays is the graph: a quarter of this tiny model's largest artefact at most (QDQ's graph is the
        # heaviest); on b16 it is 0.1-0.2 % (bench/one_weight_set.py)
        assert recipe.skeleton.bytes < 0.25 * largest.bytes
    assert stored_bytes(any_root / "compact") < 0.9 * stored_bytes(any_root / "full")
    # what deploy and calibrate push: the recipe, the skeleton and the source, never a missing full file
    pushed = set(bundle_files(any_root / "compact", compact.artefacts[:1]))
    h3 = compact.artefacts[0]
    assert pushed == {h3.compact.recipe, read_recipe(any_root / "compact" / h3.compact.recipe).skeleton.file,
                      largest.file, h3.golden["file"], h3.golden["inputs_file"]}


def test_a_compact_bundle_stores_the_golden_inputs_once(root: Path) -> None:
    compact, full = read_manifest(root / "compact"), read_manifest(root / "full")
    (shared,) = list((root / "compact").glob("golden-inputs.*.npz"))
    assert {(a.golden["inputs_file"], a.golden["inputs_sha256"]) for a in compact.artefacts} == {(shared.name,
                                                                                                  sha256(shared))}
    assert not list((root / "compact").glob("*.golden.npz"))
    for a, f in zip(compact.artefacts, full.artefacts):
        assert f.golden.get("inputs_file") is None
        outputs, pair = load_golden(root / "compact" / a.golden["file"]), load_golden(root / "full" / f.golden["file"])
        assert set(outputs) == {"reference", "outputs"}  # no copy of the inputs per head count
        assert all(np.array_equal(v, pair[k]) for k, v in load_golden_pair(root / "compact", a.golden).items())
        assert a.golden["tolerance"] == f.golden["tolerance"] and a.golden["inputs"] == f.golden["inputs"]


def test_expand_writes_the_manifests_files_and_runs_like_the_dedicated_artefacts(any_root: Path,
                                                                                 tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["expand", "--bundle", str(any_root / "compact"),
                                       "--out", str(tmp_path / "files")])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(any_root / "compact")
    for a in manifest.artefacts:
        expanded = tmp_path / "files" / a.file
        assert sha256(expanded) == a.sha256 == sha256(any_root / "full" / a.file)
        data = rebuild(any_root / "compact", a) if a.compact else (any_root / "compact" / a.file).read_bytes()
        assert data == expanded.read_bytes()
        x = load_golden_pair(any_root / "compact", a.golden)["inputs"]
        assert np.array_equal(load_bytes(data, a.file, format=a.format).run(x), load(any_root / "full" / a.file).run(x))
    expanded = read_manifest(tmp_path / "files")
    assert all(a.compact is None for a in expanded.artefacts)
    assert set(bundle_files(tmp_path / "files", expanded.artefacts)) == \
        {name for a in manifest.artefacts for name in (a.file, a.golden["file"], a.golden["inputs_file"])}


def test_rerun_skips_a_compact_bundle_and_layout_full_restores_the_files(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    shutil.copytree(root / "compact", out)
    opts = ConvertOptions(checkpoint=root / "m.pt", target="jetson", quant="fp16", heads=HEADS, out=out,
                          eval_limit=16, layout="compact")
    assert pipeline.convert(opts).converted == []
    result = CliRunner().invoke(main, ["convert", "-c", str(root / "m.pt"), "-t", "jetson", "--quant", "fp16",
                                       "--heads", HEADS, "-o", str(out), "--eval-limit", "16", "--layout", "full"])
    assert result.exit_code == 0 and "0 converted, 3 unchanged" in result.output, result.output
    manifest = read_manifest(out)
    assert all(a.compact is None and sha256(out / a.file) == a.sha256 for a in manifest.artefacts)
    assert not list(out.glob("*.skeleton")) and not list(out.glob("*.recipe.json"))
    # the golden pairs are self-contained again, as a full convert writes them
    assert not list(out.glob("golden-inputs.*")) and not list(out.glob("*.golden-outputs.npz"))
    for a in manifest.artefacts:
        assert a.golden.get("inputs_file") is None and sha256(out / a.golden["file"]) == a.golden["sha256"]
        assert set(load_golden(out / a.golden["file"])) == {"inputs", "reference", "outputs"}


def _h3(bundle: Path) -> tuple:
    manifest = read_manifest(bundle)
    a = manifest.artefacts[0]
    return manifest, a, read_recipe(bundle / a.compact.recipe)


def _piece(bundle: Path, which: str) -> Tuple[Path, int]:
    """The h3 artefact's skeleton, recipe or source: its path and the size the bundle expects."""
    _, a, recipe = _h3(bundle)
    if which == "recipe":
        return bundle / a.compact.recipe, (bundle / a.compact.recipe).stat().st_size
    piece = recipe.skeleton if which == "skeleton" else recipe.source
    return bundle / piece.file, piece.bytes


WHAT = {"skeleton": "skeleton", "recipe": "recipe", "source": "source artefact"}


def _flip(which: str) -> Callable[[Path], str]:
    """One byte of the file changed, its size kept: only its sha256 tells."""
    def tamper(bundle: Path) -> str:
        path, _ = _piece(bundle, which)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        return f"{path}: {WHAT[which]} sha256"
    tamper.__name__ = f"flip_{which}"
    return tamper


def _truncate(which: str) -> Callable[[Path], str]:
    def tamper(bundle: Path) -> str:
        path, size = _piece(bundle, which)
        path.write_bytes(path.read_bytes()[:-100])
        return f"{path}: {WHAT[which]} sha256" if which == "recipe" else \
            f"{path}: {WHAT[which]} is {size - 100} bytes, the recipe says {size}"
    tamper.__name__ = f"truncate_{which}"
    return tamper


def _swap(which: str) -> Callable[[Path], str]:
    """The h3 piece replaced by the h6 artefact's (for the source, which both share: by the h6 skeleton)."""
    def tamper(bundle: Path) -> str:
        manifest, _, _ = _h3(bundle)
        path, size = _piece(bundle, which)
        h6 = manifest.artefacts[1]
        h6_recipe = read_recipe(bundle / h6.compact.recipe)
        other = bundle / (h6.compact.recipe if which == "recipe" else h6_recipe.skeleton.file)
        shutil.copyfile(other, path)
        if which == "recipe" or other.stat().st_size == size:  # .tflite skeletons: the same size at every k
            return f"{path}: {WHAT[which]} sha256"
        return f"{path}: {WHAT[which]} is {other.stat().st_size} bytes, the recipe says {size}"
    tamper.__name__ = f"swap_{which}"
    return tamper


def _range_beyond_source(bundle: Path) -> str:
    """A recipe (re-hashed into the manifest) whose last range reads past its source; pieces removed to show
    it is refused before any of their bytes is read."""
    manifest, a, recipe = _h3(bundle)
    path = bundle / a.compact.recipe
    doc = json.loads(path.read_text())
    doc["ranges"][-1]["source_offset"] = recipe.source.bytes
    path.write_text(json.dumps(doc))
    doc = manifest.to_dict()
    doc["artefacts"][0]["compact"]["sha256"] = sha256(path)
    Manifest.from_dict(doc).write(bundle)
    (bundle / recipe.skeleton.file).unlink()
    (bundle / recipe.source.file).unlink()
    return f"{path}: range {len(recipe.ranges) - 1} reads source bytes [{recipe.source.bytes}, "


def _change_manifest_sha(bundle: Path) -> str:
    manifest, a, _ = _h3(bundle)
    doc = manifest.to_dict()
    doc["artefacts"][0]["sha256"] = "0" * 64
    Manifest.from_dict(doc).write(bundle)
    return f"{bundle / a.compact.recipe}: artefact {a.file} rebuilt by the recipe sha256"


TAMPER = [change(which) for change in (_flip, _truncate, _swap) for which in ("skeleton", "recipe", "source")]


@pytest.mark.parametrize("tamper", [*TAMPER, _range_beyond_source, _change_manifest_sha],
                         ids=lambda tamper: tamper.__name__.strip("_"))
def test_tampering_is_one_line_naming_the_file_and_loads_nothing(any_root: Path, tmp_path: Path,
                                                                  tamper: Callable[[Path], str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(any_root / "compact", bundle)
    expected = tamper(bundle)
    loaded: List[object] = []
    monkeypatch.setattr(engines, "load_bytes", lambda *a, **k: loaded.append(a))
    from hydra_edge.runtime.rebuild import load_record

    with pytest.raises(HydraEdgeError) as e:
        load_record(bundle, read_manifest(bundle).artefacts[0], 1)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)
    assert loaded == []
    result = CliRunner().invoke(main, ["expand", "--bundle", str(bundle), "--out", str(tmp_path / "files")])
    assert result.exit_code == 1 and result.output.strip().endswith(str(e.value))
    assert not (tmp_path / "files" / read_manifest(bundle).artefacts[0].file).exists()


def _quantised(w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output row, as the converters quantise a linear weight [out, in]."""
    scale = (np.abs(w).max(1) / 127).astype("<f4")
    return np.round(w / scale[:, None]).astype(np.int8), scale


@pytest.mark.parametrize("transposed", [False, True], ids=["out-in", "in-out"])
def test_a_per_channel_scale_is_a_slice_through_the_rows_of_its_weight(transposed: bool) -> None:
    """Nested int8: subnetwork k's int8 weight is the largest one's at k's rows and columns, and its scale
    vector the largest one's at k's rows. A scale is no model parameter, so it is matched through the weight
    it belongs to (on whichever axis the format keeps rows); a subnetwork quantised on its own (its own
    scales) has no weight to take."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    rows, cols = np.array([0, 1, 3, 4]), np.arange(3)  # two row runs, as qkv's three
    index = lambda name, k: (rows, cols) if k == 2 else (slice(None), slice(None))  # noqa: E731
    q, scale = _quantised(w)
    layout = (lambda a: a.T) if transposed else (lambda a: a)  # noqa: E731

    def artefact(q: np.ndarray, scale: np.ndarray) -> Tuple[bytes, List[Tensor]]:
        stored = np.ascontiguousarray(layout(q))
        return b"head" + stored.tobytes() + scale.tobytes() + b"tail", [
            Tensor("w", 4, stored.shape, np.dtype("|i1")),
            Tensor("w scale", 4 + stored.nbytes, scale.shape, np.dtype("<f4"), rows_of="w", axis=int(transposed))]

    source, source_tensors = artefact(q, scale)
    nested, tensors = artefact(q[np.ix_(rows, cols)], scale[rows])
    done = compact(2, "k.bin", nested, tensors, largest("12.bin", source, source_tensors, 6, {"w": w}, index),
                   index, "k.skeleton")
    assert [r.offset for r in done.recipe.ranges] == [t.offset for t in tensors]
    assert done.skeleton == b"headtail"
    own, tensors = artefact(*_quantised(w[np.ix_(rows, cols)]))
    with pytest.raises(ValueError, match="no weight of k.bin is a slice of 12.bin's"):
        compact(2, "k.bin", own, tensors, largest("12.bin", source, source_tensors, 6, {"w": w}, index),
                index, "k.skeleton")


@pytest.fixture(scope="module")
def switch_bundles(root: Path) -> Path:
    """The switcher test's host profile (fp32 ONNX, sysfs signals), compact and full, each with its lut.json."""
    (root / "host.toml").write_text(SYSFS_TARGET)
    (root / "policy.toml").write_text(POLICY)
    for layout in ("host-compact", "host-full"):
        out = root / layout
        pipeline.convert(ConvertOptions(checkpoint=root / "m.pt", target=str(root / "host.toml"),
                                        heads=HEADS, out=out, eval_limit=16, layout=layout[5:]))
        calibration(out, {3: 10, 6: 20, 12: 40}).write(root / f"{layout}.json")
        make_lut(out, root / f"{layout}.json", out, budget_ms=41, policy=root / "policy.toml")
    return root


@pytest.mark.parametrize("temp_c, heads", [(50, 12), (65, 6), (85, 3)])
def test_switcher_on_a_compact_bundle_predicts_as_on_a_full_one(switch_bundles: Path, tmp_path: Path,
                                                                 temp_c: float, heads: int) -> None:
    outputs = []
    for layout in ("host-compact", "host-full"):
        board = Board(tmp_path / layout)
        board.temp(temp_c)
        with Switcher(switch_bundles / layout, root=str(board.root), prefetch=False) as sw:
            outputs.append(sw.predict(IMAGE))
    assert [o.heads for o in outputs] == [heads, heads]
    assert np.array_equal(outputs[0].logits, outputs[1].logits)
    assert read_manifest(switch_bundles / "host-compact").artefacts[0].compact is not None


def test_every_recipe_field_is_checked(root: Path, tmp_path: Path) -> None:
    a = read_manifest(root / "compact").artefacts[0]
    doc = json.loads((root / "compact" / a.compact.recipe).read_text())
    doc["ranges"] = doc["ranges"][:1]
    path = tmp_path / "r.recipe.json"

    def write(d: object) -> Path:
        path.write_text(json.dumps(d))
        return path
    assert fuzz(doc, (), (r"\$\.(schema|schema_version)",), (), write, lambda: read_recipe(path)) > 20


def test_the_calibration_runner_times_a_compact_bundle_from_the_files_pushed(root: Path, pushed: Path,
                                                                             tmp_path: Path) -> None:
    manifest = read_manifest(root / "compact")
    board = tmp_path / "bundle"  # exactly what calibrate and deploy push: bundle_files and the manifest
    for name, local in {**bundle_files(root / "compact", manifest.artefacts), "manifest.json": root / "compact" /
                        "manifest.json"}.items():
        (board / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, board / name)
    events, modules = run_runner(pushed, "--bundle", board, "--runs", 3, "--warmup", 1)
    assert modules["code"] in (None, 0) and all(f.startswith(str(pushed)) for f in modules["files"])
    results = [e for e in events if e["event"] == "result"]  # in the order their timing stopped
    assert sorted((e["heads"], e["status"], e["golden"]["passed"]) for e in results) == \
        [(3, "ok", True), (6, "ok", True), (12, "ok", True)]


def test_a_source_changed_in_place_after_a_rebuild_is_still_refused(root: Path, tmp_path: Path) -> None:
    """The source's sha256 is checked once per file identity; a change that keeps size and mtime is caught
    by the rebuilt bytes' sha256."""
    bundle = tmp_path / "b"
    shutil.copytree(root / "compact", bundle)
    manifest, a, recipe = _h3(bundle)
    assert hashlib.sha256(rebuild(bundle, a)).hexdigest() == a.sha256
    source = bundle / recipe.source.file
    stat = source.stat()
    with open(source, "r+b") as f:
        f.seek(recipe.ranges[-1].source_offset)
        byte = f.read(1)
        f.seek(recipe.ranges[-1].source_offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(HydraEdgeError, match=f"^{bundle / a.compact.recipe}: artefact {a.file} rebuilt by the recipe"):
        rebuild(bundle, a)


@pytest.mark.parametrize("layout", ["compact", "full"])
def test_calibrate_local_passes_the_golden_checks_and_records_rebuild_time(root: Path, device_python: Path,
                                                                          tmp_path: Path, layout: str) -> None:
    """A compact artefact's rebuild is timed on its own (part of its load); a full file has none."""
    out = tmp_path / "cal.json"
    result = calibrate_cli("--bundle", root / layout, "--local", "--python", device_python, "--out", out,
                           "--runs", 3, "--warmup", 1)
    assert result.exit_code == 0, result.output
    assert "rebuild s" in result.output
    cal = read_calibration(out)
    assert [(r.heads, r.status, r.golden["passed"]) for r in cal.results] == [(3, "ok", True), (6, "ok", True),
                                                                             (12, "ok", True)]
    compact = {a.heads: a.compact is not None for a in read_manifest(root / layout).artefacts}
    assert compact == {3: layout == "compact", 6: layout == "compact", 12: False}
    for r in cal.results:
        assert isinstance(r.rebuild_s, float) == compact[r.heads]
        assert not compact[r.heads] or 0 < r.rebuild_s < r.load_s
    assert ("rebuild_s" in out.read_text()) == (layout == "compact")  # a full bundle's record is as before


def test_a_tampered_shared_golden_inputs_file_is_refused_in_one_line(root: Path, device_python: Path, pushed: Path,
                                                                     tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(root / "compact", bundle)
    (shared,) = list(bundle.glob("golden-inputs.*.npz"))
    inputs = load_golden(shared)["inputs"]
    np.savez(shared, inputs=inputs + 1)  # a valid file with other inputs: only its sha256 tells
    line = one_line_error(calibrate_cli("--bundle", bundle, "--local", "--python", device_python,
                                        "--out", tmp_path / "cal.json"))
    assert f"{shared} is not the file the manifest names (its sha256 differs; artefact h3_onnx_fp16 " \
           "golden.inputs_file" in line
    # on the device (a bundle pushed by hand), the runner refuses it too, before loading anything
    events, _ = run_runner(pushed, "--bundle", bundle, "--runs", 1, "--warmup", 0)
    results = [e for e in events if e["event"] == "result"]
    assert [(e["status"], e["error"]) for e in results] == \
        [("error", f"{shared.name} is missing or its sha256 differs from the manifest; push the bundle again")] * 3


@pytest.mark.parametrize("change, message", [
    (lambda g: g.pop("inputs_sha256"), "golden.inputs_sha256: missing, and `.inputs_file` needs it"),
    (lambda g: g.pop("inputs_file"), "golden.inputs_file: missing, and `.inputs_sha256` needs it"),
    (lambda g: g.update(inputs_file="../inputs.npz"), "golden.inputs_file: '../inputs.npz' leaves the bundle"),
])
def test_a_golden_record_names_its_shared_inputs_with_their_sha256(root: Path, change: Callable[[dict], object],
                                                                   message: str) -> None:
    doc = read_manifest(root / "compact").to_dict()
    change(doc["artefacts"][0]["golden"])
    with pytest.raises(HydraEdgeError, match=r"^manifest\.json: \$\.artefacts\[0\]\." + message.replace(".", r"\.")):
        Manifest.from_dict(doc)


def test_a_tflite_buffer_beyond_the_file_is_refused_in_one_line_naming_the_tensor(
        converted: Callable[[str, str], Path]) -> None:
    """Buffers may lie after the flatbuffer (Buffer.offset/size: ai-edge-quantizer's layout, which the int8
    artefacts have); one said to lie beyond the file is refused, saying why (conversion catches it and keeps
    the full files, with the line as the manifest's note)."""
    from ai_edge_litert.tools import flatbuffer_utils

    bundle = converted("rpi", "fp32") / "full"
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray((bundle / "vit_h3_tflite_fp32.tflite").read_bytes()))
    big = max(range(len(model.buffers)), key=lambda i: len(model.buffers[i].data if model.buffers[i].data is not None
                                                              else []))
    model.buffers[big].data, model.buffers[big].offset, model.buffers[big].size = None, 2**31, 4096
    data = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    with pytest.raises(ValueError, match=rf"^tensor subgraph 0 tensor \d+: its data, bytes {2**31}..{2**31 + 4096}, "
                                         rf"lies beyond the file's {len(data)} bytes: the \.tflite is truncated"):
        exporter("tflite").tensor_map(data)


FORMAT_VARIANTS = [("jetson", "fp16"), ("rpi", "fp32"), ("android", "int8-dynamic")]  # onnx, tflite, executorch


@pytest.mark.parametrize("variant", FORMAT_VARIANTS, ids=["onnx", "tflite", "executorch"])
def test_a_whole_artefact_swapped_after_its_check_still_loads_the_checked_bytes(
        converted: Callable[[str, str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        variant: Tuple[str, str]) -> None:
    """The 12-head file is replaced by the 6-head one (by rename, as an update would) the moment its sha256
    has been computed: what loads is what was hashed, the 12-head model, never the file now at its path."""
    root = converted(*variant)
    bundle = tmp_path / "b"
    shutil.copytree(root / "compact", bundle)
    h6, h12 = read_manifest(root / "full").artefacts[1], read_manifest(bundle).artefacts[-1]
    assert h12.heads == 12 and h12.compact is None
    shutil.copyfile(root / "full" / h6.file, tmp_path / "h6")
    real, swapped = hashlib.sha256, []

    class SwapOnceHashed:
        """hashlib's sha256, whose digest, once it is the 12-head artefact's, renames the 6-head file over it."""

        def __init__(self, *data: bytes) -> None:
            self.digest = real(*data)

        def update(self, data: bytes) -> None:
            self.digest.update(data)

        def hexdigest(self) -> str:
            got = self.digest.hexdigest()
            if got == h12.sha256 and not swapped:
                os.replace(tmp_path / "h6", bundle / h12.file)
                swapped.append(got)
            return got

    monkeypatch.setattr(hashlib, "sha256", SwapOnceHashed)
    from hydra_edge.runtime.rebuild import load_record

    engine = load_record(bundle, h12, 1)
    monkeypatch.undo()
    assert swapped and sha256(bundle / h12.file) == h6.sha256
    x = load_golden_pair(root / "compact", h12.golden)["inputs"]
    expected = load(root / "full" / h12.file, format=h12.format).run(x)
    assert not np.array_equal(load(root / "full" / h6.file, format=h6.format).run(x), expected)
    assert np.array_equal(engine.run(x), expected)


def _copy(root: Path, tmp_path: Path) -> Path:
    bundle = tmp_path / "b"
    shutil.copytree(root / "compact", bundle)
    return bundle


def _bundle_file(bundle: Path, which: str) -> Tuple[Path, object]:
    """A file of the bundle and the record whose load reads it: the h3 artefact's recipe, skeleton or source,
    or the whole 12-head artefact (the same file as the source)."""
    manifest, h3, recipe = _h3(bundle)
    if which == "artefact":
        return bundle / manifest.artefacts[-1].file, manifest.artefacts[-1]
    return (bundle / h3.compact.recipe if which == "recipe" else _piece(bundle, which)[0]), h3


def _expand_line(bundle: Path, out: Path) -> str:
    """``expand``'s one error line (it must fail) and nothing written to ``out``."""
    result = CliRunner().invoke(main, ["expand", "--bundle", str(bundle), "--out", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]
    (line,) = result.output.strip().splitlines()
    return line


@pytest.mark.parametrize("which", ["recipe", "skeleton", "source", "artefact"])
def test_a_fifo_in_place_of_a_bundle_file_is_one_line_and_never_blocks(root: Path, tmp_path: Path,
                                                                       which: str) -> None:
    from hydra_edge.runtime.rebuild import load_record

    bundle = _copy(root, tmp_path)
    path, record = _bundle_file(bundle, which)
    path.unlink()
    os.mkfifo(path)
    error = without_blocking(lambda: load_record(bundle, record, 1), path)
    assert isinstance(error, HydraEdgeError) and "\n" not in str(error) and str(path) in str(error), error
    line = without_blocking(lambda: _expand_line(bundle, tmp_path / "files"), path)
    assert isinstance(line, str) and str(path) in line, line


@pytest.mark.parametrize("which", ["recipe", "skeleton", "source", "artefact"])
def test_a_bundle_file_linked_to_outside_the_bundle_is_refused_though_its_bytes_are_right(
        root: Path, tmp_path: Path, which: str) -> None:
    from hydra_edge.runtime.rebuild import load_record

    bundle = _copy(root, tmp_path)
    path, record = _bundle_file(bundle, which)
    outside = tmp_path / "elsewhere" / path.name
    outside.parent.mkdir()
    path.rename(outside)
    outside.chmod(0o600)
    path.symlink_to(outside)
    with pytest.raises(HydraEdgeError, match=f"^{path} is a link to {outside}, outside the bundle"):
        load_record(bundle, record, 1)
    assert f"{path} is a link to {outside}, outside the bundle (" in _expand_line(bundle, tmp_path / "files")


def _recipe_changed(bundle: Path, change: Callable[[dict], object]) -> Path:
    """The h3 recipe changed by ``change``, and the manifest changed to match (its sha256)."""
    manifest, a, _ = _h3(bundle)
    path = bundle / a.compact.recipe
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    doc = manifest.to_dict()
    doc["artefacts"][0]["compact"]["sha256"] = sha256(path)
    Manifest.from_dict(doc).write(bundle)
    return path


def _more_axes(r: dict, axes: int = 65) -> None:
    """The range's tensor given leading axes of size 1, up to ``axes``: the same bytes in as many dimensions."""
    extra = axes - len(r["shape"])
    r["shape"], r["index"] = [1] * extra + r["shape"], [[[0, 1]]] * extra + r["index"]


def _as_f1(r: dict) -> None:
    """The range's dtype made ``<f1``, its last axis widened to keep its bytes: what numpy cannot read."""
    n = int(r["dtype"][2:])
    r["dtype"], r["shape"][-1] = "<f1", r["shape"][-1] * n
    r["index"][-1] = [[start * n, stop * n] for start, stop in r["index"][-1]]


@pytest.mark.parametrize("change, message", [
    (lambda d: _as_f1(d["ranges"][0]), r": \$\.ranges\[0\]\.dtype: expected `str` matching"),
    (lambda d: _more_axes(d["ranges"][0]), r": \$\.ranges\[0\]\.shape: expected `array` of length <= 32"),
    (lambda d: d.update(heads=6), r": rebuilds vit_h3_onnx_fp16\.onnx \(6 heads, \d+ bytes\), the manifest names "
                                  r"vit_h3_onnx_fp16\.onnx \(3 heads, \d+ bytes\)"),
], ids=["f1", "65-axes", "heads"])
def test_a_recipe_the_rebuild_cannot_follow_is_one_line_in_load_and_expand(root: Path, tmp_path: Path,
                                                                           change: Callable[[dict], object],
                                                                           message: str) -> None:
    from hydra_edge.runtime.rebuild import load_record

    bundle = _copy(root, tmp_path)
    path = _recipe_changed(bundle, change)
    with pytest.raises(HydraEdgeError, match="^" + re.escape(str(path)) + message) as e:
        load_record(bundle, read_manifest(bundle).artefacts[0], 1)
    assert "\n" not in str(e.value)
    assert _expand_line(bundle, tmp_path / "files").endswith(str(e.value))


def test_every_recipe_dtype_is_one_numpy_reads() -> None:
    """What the recipe's schema lets through, the rebuild can make: every dtype it accepts is numpy's, of the
    size it says."""
    import itertools

    from hydra_edge.records.recipe import Range

    dtypes = ["".join(c) for c in itertools.product("<>|", "fiub", "1248")]
    accepted = [d for d in dtypes if _is_range_dtype(d, Range)]
    assert "<f1" not in accepted and {"<f2", "<f4", "|i1", "|u1", "<i4", "|b1"} <= set(accepted)
    assert all(np.dtype(d).itemsize == int(d[2]) for d in accepted)


def _is_range_dtype(dtype: str, range_type: type) -> bool:
    import msgspec

    try:
        msgspec.convert({"offset": 0, "source_offset": 0, "dtype": dtype, "shape": [1], "index": [[[0, 1]]]},
                        range_type)
    except msgspec.ValidationError:
        return False
    return True


@pytest.mark.parametrize("which", [0, -1], ids=["artefact", "largest"])
def test_compaction_reading_a_fifo_for_an_artefact_is_one_line_and_never_blocks(root: Path, tmp_path: Path,
                                                                                which: int) -> None:
    from hydra_edge.convert.layout import apply_layout

    bundle = tmp_path / "b"
    shutil.copytree(root / "full", bundle)
    manifest = read_manifest(bundle)
    path = bundle / manifest.artefacts[which].file
    path.unlink()
    os.mkfifo(path)
    error = without_blocking(lambda: apply_layout(bundle, manifest, "compact", str(root / "m.pt"),
                                                  lambda *report: None), path, 60)
    assert isinstance(error, HydraEdgeError) and f"{path} is a FIFO" in str(error), error


def _another_slice(doc: dict) -> None:
    """The recipe's first range made to take a neighbouring slice of its source tensor: the last span of an axis
    that ends before the tensor does moves one row on. Same shape, same bytes count, other weights: a recipe
    every file check and the range checks accept, whose rebuilt bytes are not the verified artefact's."""
    for r in doc["ranges"]:
        for axis, spans in enumerate(r["index"]):
            if spans[-1][1] < r["shape"][axis]:
                spans[-1] = [spans[-1][0] + 1, spans[-1][1] + 1]
                return
    raise AssertionError("no range takes less than its whole source tensor")


def test_a_recipe_that_passes_every_file_check_but_rebuilds_other_bytes_is_refused_on_the_device(
        root: Path, device_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file of the bundle has the sha256 the manifest (or its recipe) records, so the host pushes it and
    the device reads it: only the rebuilt bytes' sha256, checked on the device by the rebuild that the
    calibration runner, the board app's switcher and ``expand`` share, tells. It refuses in one line naming
    the recipe and the artefact, and nothing runs: the runner records an error and times nothing, the
    switcher's load hands no bytes to a runtime, ``expand`` writes nothing."""
    from hydra_edge.runtime.rebuild import load_record

    bundle = _copy(root, tmp_path)
    recipe = _recipe_changed(bundle, _another_slice)
    manifest = read_manifest(bundle)
    h3 = manifest.artefacts[0]
    # the device-side check's line, after the recipe's path (on the device, the folder calibrate pushed it to)
    said = (rf"/{re.escape(recipe.name)}: artefact {re.escape(h3.file)} rebuilt by the recipe sha256 is "
            rf"[0-9a-f]{{12}}\.\.\., expected {h3.sha256[:12]}\.\.\.; re-push the bundle or re-run hydra-edge convert")
    # the host side passes: every file it pushes has its recorded sha256, the recipe is well formed
    bundle_files(bundle, manifest.artefacts)
    read_recipe(recipe)
    # the calibration runner on the device (calibrate --local pushes, the runner rebuilds)
    out = tmp_path / "cal.json"
    result = calibrate_cli("--bundle", bundle, "--local", "--python", device_python, "--out", out, "--runs", 3,
                           "--warmup", 1)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    results = {r.heads: r for r in read_calibration(out).results}
    assert [(k, r.status) for k, r in results.items()] == [(3, "error"), (6, "ok"), (12, "ok")]
    error = results[3].error or ""
    assert re.fullmatch(".+" + said, error), error
    assert results[3].latency is None and not results[3].golden  # nothing was timed nor checked against golden
    # the board app's switcher loads through load_record: no bytes reach a runtime
    loaded: List[object] = []
    monkeypatch.setattr(engines, "load_bytes", lambda *a, **k: loaded.append(a))
    with pytest.raises(HydraEdgeError) as e:
        load_record(bundle, h3, 1)
    assert re.fullmatch(re.escape(str(bundle)) + said, str(e.value)) and loaded == [], str(e.value)
    monkeypatch.undo()
    # expand: the same line, nothing written
    assert _expand_line(bundle, tmp_path / "files") == f"Error: {e.value}"
