"""hydra-edge convert end to end on a tiny trained digits model: bundles, manifest, re-runs, errors."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support.cli import cli_argv
from support.processes import held_elsewhere
from support.targets import ONNX_FP32_TWO_THREADS

from hydra_edge.atomic import sha256_file
from hydra_edge.commands.convert import convert
from hydra_edge.convert import artefact, pipeline
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.convert.verify import within_drop
from hydra_edge.model.checkpoint import load_checkpoint
from hydra_edge.model.config import HydraConfig, preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.model.sizes import subnet_size
from hydra_edge.records.manifest import Manifest, read_manifest
from hydra_edge.runtime.engines import Engine, check_golden, load, load_golden
from hydra_edge.train.data import load_data
from hydra_edge.train.loop import TrainSettings, train

pytestmark = pytest.mark.slow  # converts bundles for every target

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Depth-1 digits HydraViT serving 3, 6 and 12 heads, trained a few seconds (one block: each block more only
    lengthens every export)."""
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3, 6, 12)))
    out = tmp_path_factory.mktemp("trained")
    return train(model, load_data("digits", model.config), TrainSettings(epochs=8, batch_size=64, warmup_epochs=1),
                 out).checkpoint


@pytest.fixture
def host_target(tmp_path: Path) -> Path:
    """A user-added profile (fast fp32 ONNX), passed as a path."""
    f = tmp_path / "profiles" / "host.toml"
    f.parent.mkdir()
    f.write_text(ONNX_FP32_TWO_THREADS)
    return f


def _run(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(convert, [str(a) for a in args])
    return result.exit_code, result.output


def _check_bundle(out: Path, n: int, fmt: str) -> Manifest:
    """The manifest round-trips, its hashes match the files, and each golden pair passes in its engine."""
    manifest = read_manifest(out)
    assert Manifest.from_dict(json.loads((out / "manifest.json").read_text())) == manifest
    assert Manifest.from_dict(manifest.to_dict()) == manifest
    assert len(manifest.artefacts) == n
    cfg = HydraConfig.from_dict(manifest.model)
    for a in manifest.artefacts:
        assert a.format == fmt and (out / a.file).stat().st_size == a.bytes
        assert sha256_file(out / a.file) == a.sha256 and sha256_file(out / a.golden["file"]) == a.golden["sha256"]
        assert a.params == subnet_size(cfg, a.heads).params and a.convert_seconds > 0
        assert a.accuracy["top1"] is not None
        e = a.accuracy["evidence"]  # the gate's evidence is recorded, and it passed at the recorded bound
        assert within_drop(a.accuracy, manifest.max_drop) and e["passed"] and e["bound_pp"] == manifest.max_drop
        assert e["images"] == a.accuracy["images"] and e["cost_pp"] == a.accuracy["drop_pp"]
        assert check_golden(load(out / a.file), load_golden(out / a.golden["file"]), a.golden["tolerance"]).ok
    return manifest


def test_rpi_bundle_is_verified_recorded_and_skipped_on_rerun(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundles" / "rpi"
    code, output = _run("-c", checkpoint, "--target", "rpi", "--out", out, "--heads", "3,12", "--layout", "full")
    assert code == 0, output
    manifest = _check_bundle(out, 2, "tflite")
    assert [a.file for a in manifest.artefacts] == ["vit_h3_tflite_int8-dynamic.tflite", "vit_h12_tflite_int8-dynamic.tflite"]
    a = manifest.artefacts[0]
    assert (a.runtime, a.runtime_min_version, a.threads) == ("ai-edge-litert", "2.3.0", 4)
    assert manifest.checkpoint["sha256"] == sha256_file(checkpoint) and manifest.model["depth"] == 1
    assert manifest.target["name"] == "rpi" and manifest.tools["litert-torch"] and manifest.data["source"] == "digits"
    # The artefact agrees with eager torch on held-out images, through the device's engine.
    model = load_checkpoint(checkpoint)
    x = load_golden(out / a.golden["file"])["inputs"]
    with torch.no_grad():
        ref = model.subnetwork(3)(torch.from_numpy(x)).numpy()
    assert (load(out / a.file).run(x).argmax(1) == ref.argmax(1)).mean() >= 0.75

    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    code, output = _run("-c", checkpoint, "--target", "rpi", "--out", out, "--heads", "3,12", "--layout", "full")
    assert code == 0 and "0 converted, 2 unchanged" in output
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "manifest.json"} == \
        {n: t for n, t in mtimes.items() if n != "manifest.json"}
    assert read_manifest(out).classes == [str(d) for d in range(10)]

    # A stricter --max-drop than the recorded evidence passes is not satisfied by skipping: that artefact
    # is made again. The evidence is edited so that 0.5 p.p. fails it: a predicted cost of 0.6 p.p. and an
    # interval (no image told fp32 from the artefact) that spans 0.5.
    doc = json.loads((out / "manifest.json").read_text())
    evidence = doc["artefacts"][0]["accuracy"]["evidence"]
    evidence.update(worse=0, better=0, cost_pp=0.0, logit_cost_pp=0.6)
    doc["artefacts"][0]["accuracy"]["drop_pp"] = 0.0
    (out / "manifest.json").write_text(json.dumps(doc))
    assert within_drop(doc["artefacts"][0]["accuracy"], 1.0) and not within_drop(doc["artefacts"][0]["accuracy"], 0.5)
    code, output = _run("-c", checkpoint, "--target", "rpi", "--out", out, "--heads", "3,12", "--max-drop", "0.5",
                        "--layout", "full")
    remade = "1 converted, 1 unchanged" in output
    assert remade or "vit_h3_tflite_int8-dynamic.tflite: top-1" in output, output  # made again, then judged
    assert not remade or read_manifest(out).artefacts[0].accuracy["evidence"]["logit_cost_pp"] != 0.6


def test_android_bundle_is_an_xnnpack_pte(checkpoint: Path, tmp_path: Path) -> None:
    code, output = _run("-c", checkpoint, "-t", "android", "-o", tmp_path, "--heads", "6", "--layout", "full")
    assert code == 0, output
    (a,) = _check_bundle(tmp_path, 1, "executorch").artefacts
    assert a.file == "vit_h6_executorch_int8-dynamic.pte" and a.notes["delegate"] == "XNNPACK"


def test_jetson_bundle_in_parallel_records_trtexec_lines(checkpoint: Path, tmp_path: Path) -> None:
    code, output = _run("-c", checkpoint, "-t", "jetson", "-o", tmp_path, "--jobs", "2", "--layout", "full")
    assert code == 0, output
    manifest = _check_bundle(tmp_path, 6, "onnx")
    builds = {a.file: a.device_build for a in manifest.artefacts}
    assert builds["vit_h3_onnx_fp16.onnx"] == "trtexec --onnx=vit_h3_onnx_fp16.onnx --saveEngine=vit_h3_onnx_fp16.engine --fp16"
    assert builds["vit_h12_onnx_int8-qdq.onnx"].endswith("--int8 --fp16")
    qdq = manifest.by_id()["h12_onnx_int8-qdq"]
    assert qdq.runtime == "tensorrt" and qdq.host_runtime.startswith("onnxruntime")
    assert qdq.notes["op_types_to_quantize"] == ["MatMul", "Gemm", "Conv"]


def test_interrupted_run_resumes(checkpoint: Path, host_target: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra_edge.convert import onnx as onnx_exporter

    real, calls = onnx_exporter.export, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the second artefact
        return real(*args, **kwargs)

    out = tmp_path / "out"
    opts = ConvertOptions(checkpoint=checkpoint, target=str(host_target), out=out, layout="full",
                          jobs=1)  # in this process, where the patched exporter is
    monkeypatch.setattr(onnx_exporter, "export", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.convert(opts)
    assert [a.heads for a in read_manifest(out).artefacts] == [3]
    assert sorted(p.name for p in out.iterdir() if p.name not in (".lock", "logs")) == ["manifest.json", "vit_h3_onnx_fp32.golden.npz",
                                                          "vit_h3_onnx_fp32.onnx"]
    monkeypatch.setattr(onnx_exporter, "export", real)
    result = pipeline.convert(opts)
    assert result.skipped == ["vit_h3_onnx_fp32.onnx"] and len(result.converted) == 2
    _check_bundle(out, 3, "onnx")
    assert len(pipeline.convert(ConvertOptions(**{**opts.__dict__, "force": True})).converted) == 3


def test_ctrl_c_before_the_temp_file_is_guarded_leaves_no_temp_file(checkpoint: Path, host_target: Path,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C can land after an artefact's temp file exists but before the block that removes it is
    entered (a parallel worker starting its next artefact as the interrupt arrives): the interrupted
    run still leaves no temp file in the bundle."""
    real, abandoned = artefact.atomic_path, []

    def interrupted_on_entry(path: Path):
        writer = real(path)
        writer.__enter__()  # the temp file now exists; nothing will close this writer
        abandoned.append(writer)  # kept alive, as in a worker that exits without collecting it
        raise KeyboardInterrupt

    out = tmp_path / "out"
    monkeypatch.setattr(artefact, "atomic_path", interrupted_on_entry)
    with pytest.raises(KeyboardInterrupt):
        pipeline.convert(ConvertOptions(checkpoint=checkpoint, target=str(host_target), out=out,
                                        layout="full", jobs=1))
    assert len(abandoned) == 1 and not list(out.glob(".*.tmp")), sorted(p.name for p in out.iterdir())
    assert read_manifest(out).artefacts == []


def test_max_drop_failure_names_the_artefact(checkpoint: Path, host_target: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real = artefact.load

    def broken(path, threads=1, format=None) -> Engine:  # a runtime that returns garbage for 6 heads
        engine = real(path, threads, format)
        if "vit_h6_" not in engine.path.name:  # not bare "h6": a staged file's random suffix may hold it
            return engine
        rng = np.random.default_rng(0)
        return Engine(engine.path, engine.format, threads, lambda x: rng.standard_normal((1, 10)).astype(np.float32))

    monkeypatch.setattr(artefact, "load", broken)
    out = tmp_path / "out"
    code, output = _run("-c", checkpoint, "-t", host_target, "-o", out, "-j", 1)  # in this process, patched
    assert code != 0
    assert "Error: vit_h6_onnx_fp32.onnx: top-1" in output and "against the fp32 subnetwork's" in output
    assert "(95 % interval" in output and "held-out images" not in output.split("95 % interval")[0][-5:]
    assert "over the allowed 1 p.p. (images decided); use another --quant, or raise --max-drop" in output
    assert output.rstrip().endswith(f"converter output: {out / 'logs' / 'vit_h6_onnx_fp32.log'}")
    assert (out / "logs" / "vit_h6_onnx_fp32.log").is_file()
    assert [a.heads for a in read_manifest(out).artefacts] == [3, 12]
    assert not list(out.glob("vit_h6*")) and not list(out.glob(".*.tmp"))


# A user's profile: static int8 QDQ, nested (the 12-head model's weight ranges) whatever nesting costs.
QDQ_NESTED = (ONNX_FP32_TWO_THREADS.replace('quant = "fp32"', 'quant = "int8-qdq"')
              + "[artefacts.options]\nnest_max_cost_pp = 100\n")


def _wider_heads_far_larger(checkpoint: Path, path: Path) -> Path:
    """The checkpoint with every other row of the attention's qkv weight made 1000x larger in the columns that
    only heads 4-12 read (a fine-tune that blew up its added heads). The 3-head subnetwork's fp32 weights are
    untouched, but nested int8 quantises its rows with the whole rows' ranges: in those rows its weights all
    round to zero, a real, moderate loss of top-1 that only the 3-head artefact shows."""
    obj = torch.load(checkpoint, weights_only=False)
    width = 3 * HydraConfig.from_dict(obj["config"]).head_dim
    for entry in ("state_dict", "state_dict_ema"):
        if entry in obj:
            obj[entry]["blocks.0.attn.qkv.weight"][::2, width:] *= 1000
    torch.save(obj, path)
    return path


def test_a_moderate_drop_passes_a_bound_above_its_interval_and_fails_one_below_in_one_line(
        checkpoint: Path, tmp_path: Path) -> None:
    """The gate on a drop between 1 and 10 p.p., from a real conversion: with --max-drop above its 95 %
    interval the artefact passes and is listed; with --max-drop below it the run fails in one line naming the
    artefact, the drop, its interval and the images, and the bundle does not list the artefact."""
    profile = tmp_path / "qdq.toml"
    profile.write_text(QDQ_NESTED)
    out = tmp_path / "bundle"
    args = ("-c", _wider_heads_far_larger(checkpoint, tmp_path / "wide.pt"), "-t", profile, "-o", out,
            "--heads", "3", "--layout", "full")
    code, output = _run(*args, "--max-drop", 20)
    assert code == 0, output
    (a,) = read_manifest(out).artefacts
    e = a.accuracy["evidence"]
    assert a.nesting is not None and a.nesting.nested and a.file == "vit_h3_onnx_int8-qdq.onnx"
    assert 1 <= e["cost_pp"] <= 10 and e["passed"] and e["decided_by"] == "images", e  # moderate, told by images
    assert 1 < e["low_pp"] and e["high_pp"] < 20, e  # so 1 p.p. is below the interval and 20 above it
    assert f"{e['cost_pp']:+.2f} [{e['low_pp']:+.1f},{e['high_pp']:+.1f}]" in output  # the summary table's drop

    code, output = _run(*args, "--max-drop", 1)  # stricter than the recorded evidence passes: made and judged again
    errors = [line for line in output.splitlines() if line.startswith("Error")]
    assert code == 1 and errors == [output.strip().splitlines()[-1]], output
    assert errors[0] == (
        f"Error: {a.file}: top-1 {a.accuracy['top1']:.2f}% against the fp32 subnetwork's "
        f"{a.accuracy['fp32_top1']:.2f}%, a drop of {e['cost_pp']:+.2f} p.p. (95 % interval {e['low_pp']:+.2f} to "
        f"{e['high_pp']:+.2f}) on {e['images']} images: {e['worse']} right only under fp32, {e['better']} only "
        f"under the artefact; over the allowed 1 p.p. (images decided); use another --quant, or raise --max-drop; "
        f"converter output: {out / 'logs' / 'vit_h3_onnx_int8-qdq.log'}")
    manifest = read_manifest(out)
    # what its own bound refuses is neither listed nor left in the bundle: not the new artefact, not the old one
    assert manifest.max_drop == 1 and manifest.artefacts == [] and not list(out.glob("vit_h3*")), list(out.iterdir())


def test_checkpoint_without_data_spec_uses_random_inputs_or_data(host_target: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = HydraViT(preset("digits", depth=1, heads=(3,)))
    model.save(tmp_path / "foreign.pt")  # no "data": a checkpoint from elsewhere
    code, output = _run("-c", tmp_path / "foreign.pt", "-t", host_target, "-o", tmp_path / "a")
    assert code == 0, output
    (a,) = read_manifest(tmp_path / "a").artefacts
    assert a.accuracy["top1"] is None and a.accuracy["basis"].startswith("random inputs")
    assert a.accuracy["agreement"] == 100.0 and read_manifest(tmp_path / "a").data is None
    code, output = _run("-c", tmp_path / "foreign.pt", "-t", host_target, "-o", tmp_path / "b", "--data", "digits")
    assert code == 0, output
    (b,) = read_manifest(tmp_path / "b").artefacts
    assert b.accuracy["top1"] is not None and b.accuracy["images"] == 360


@pytest.mark.parametrize("case", ["target", "heads", "not-hydravit", "not-checkpoint", "unwritable", "quant",
                                  "all-optional", "attention-option"])
def test_user_errors_are_one_line_and_write_nothing(checkpoint: Path, tmp_path: Path, case: str) -> None:
    out = tmp_path / "bundle"
    args = {"-c": checkpoint, "-t": "rpi", "-o": out}
    extra: list[str] = []
    if case == "target":
        args["-t"], expected = "pi5", "unknown target 'pi5'"
    elif case == "heads":
        extra, expected = ["--heads", "3-13"], "out of range: this model has 1..12 heads"
    elif case == "not-hydravit":
        torch.save({"state_dict": {"fc.weight": torch.zeros(2, 2)}}, tmp_path / "resnet.pt")
        args["-c"], expected = tmp_path / "resnet.pt", "is not a ViT checkpoint"
    elif case == "not-checkpoint":
        (tmp_path / "notes.pt").write_text("hello")
        args["-c"], expected = tmp_path / "notes.pt", "is not a PyTorch checkpoint"
    elif case == "unwritable":
        (tmp_path / "file").write_text("")
        out = args["-o"] = tmp_path / "file" / "bundle"
        expected = "cannot create output folder"
    elif case == "all-optional":  # once "0 converted", exit 0 and an empty manifest
        (tmp_path / "host.toml").write_text(ONNX_FP32_TWO_THREADS + "optional = true\n")
        args["-t"], expected = tmp_path / "host.toml", "the profile's artefacts are all optional; pass --optional"
    elif case == "attention-option":
        rpi = (Path(__file__).resolve().parents[1] / "targets" / "rpi.toml").read_text()
        (tmp_path / "pi4.toml").write_text(rpi.replace('runtime_min_version = "2.3.0"\n',
                                                       'runtime_min_version = "2.3.0"\n'
                                                       '[artefacts.options]\nattention_matmuls = "fp32"\n', 1))
        args["-t"], expected = tmp_path / "pi4.toml", "option attention_matmuls = 'fp32': give \"int8\""
    else:
        extra, expected = ["--quant", "fp16"], "no quantisation 'fp16'"
    code, output = _run(*[str(v) for kv in args.items() for v in kv], *extra)
    assert code != 0 and expected in output
    assert output.strip().count("\n") == 0 and output.startswith("Error: ")
    assert not out.exists()  # not even an empty folder holding .lock


def test_ctrl_c_during_parallel_conversion_keeps_every_finished_artefact(checkpoint: Path, host_target: Path,
                                                                         tmp_path: Path) -> None:
    """SIGINT the moment the first artefact lands (mid-commit for some worker, mid-export for others):
    every artefact file in the bundle is in the manifest, and a re-run converts only the rest."""
    out = tmp_path / "bundle"
    args = ("convert", "-c", checkpoint, "-t", host_target, "-o", out, "--heads", "3-8", "--eval-limit", 60,
            "--layout", "full")
    proc = subprocess.Popen(cli_argv(*args, "-j", 2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not list(out.glob("vit_h*.onnx")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        output, _ = proc.communicate(timeout=120)  # workers stop too: it must not hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "Traceback" not in output, output
    files = {p.name for p in out.glob("vit_h*.onnx")}
    listed = {a.file for a in read_manifest(out).artefacts}
    assert files == listed and 1 <= len(files) < 6, output
    assert not list(out.glob(".*.tmp"))
    result = pipeline.convert(ConvertOptions(checkpoint=checkpoint, target=str(host_target), out=out,
                                             heads="3-8", eval_limit=60, layout="full"))
    assert set(result.skipped) == listed and len(result.converted) == 6 - len(listed) and not result.failed
    _check_bundle(out, 6, "onnx")


def test_a_second_conversion_into_a_bundle_in_use_says_who_or_waits(checkpoint: Path, host_target: Path,
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    args = ("-c", checkpoint, "-t", host_target, "-o", out, "--heads", "3", "--eval-limit", 60)
    with held_elsewhere(out / ".lock") as other:
        code, output = _run(*args, "--no-wait")
        assert code == 1 and output.count("\n") == 1, output
        assert output.startswith(f"Error: bundle {out} is in use by pid {other.pid} on ") and "since" in output
        waiting = subprocess.Popen(cli_argv("convert", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert waiting.stderr is not None
        line = waiting.stderr.readline()
        assert line.startswith(f"waiting for bundle {out}: in use by pid {other.pid}"), line
        assert waiting.poll() is None and not (out / "manifest.json").exists()
    output, errors = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, errors
    assert [a.heads for a in read_manifest(out).artefacts] == [3]
