"""Converting several targets in one run: each head count's fp32 reference and nesting measurement
computed once and shared, bundles identical to converting each target alone, every core verifying,
the default --jobs said and bounded by cores and memory, interrupts leaving every bundle whole."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support.cli import cli_argv

from hydra_edge.commands.convert import convert
from hydra_edge.convert import artefact, pipeline, references, workers
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.records.manifest import Manifest, read_manifest
from hydra_edge.runtime.engines import load_golden

pytestmark = pytest.mark.slow  # converts several targets, interrupts workers


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Depth-2 digits HydraViT with random weights and no data spec: verified on random inputs."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "digits.pt"
    HydraViT(preset("digits", depth=2, heads=(3, 6, 12))).save(path)
    return path


def _artefacts(out: Path) -> dict[str, Any]:
    """What a bundle's artefacts are: bytes' hash, verification, nesting, golden tolerance and arrays."""
    manifest = read_manifest(out)
    return {a.file: (a.sha256, a.accuracy, a.nesting, a.golden["tolerance"],
                     {k: v.tolist() for k, v in load_golden(out / a.golden["file"]).items()})
            for a in manifest.artefacts}


def test_targets_together_compute_each_reference_once_and_match_separate_runs(
        checkpoint: Path, host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    verify_threads: set[int] = set()
    real_eager, real_measure, real_load = references.eager_logits, references.measure, artefact.load

    def eager(*args: Any) -> np.ndarray:
        calls["reference"] += 1
        return real_eager(*args)

    def measure(*args: Any) -> Any:
        calls["nesting"] += 1
        return real_measure(*args)

    def load(path: Any, threads: int = 1, format: str | None = None) -> Any:
        verify_threads.add(threads)
        return real_load(path, threads, format)

    monkeypatch.setattr(references, "eager_logits", eager)
    monkeypatch.setattr(references, "measure", measure)
    monkeypatch.setattr(artefact, "load", load)
    opts = ConvertOptions(checkpoint=checkpoint, target="", out=tmp_path / "together", heads="3,12",
                          jobs=1, layout="full")  # in this process, where the counters are
    results = pipeline.convert_targets(pipeline.targets_options(opts, ["jetson", str(host)]))
    # jetson: fp16 and int8-qdq (nested), host: fp32; two head counts: 6 artefacts, 2 references, 2 nestings
    assert [len(r.converted) for r in results] == [4, 2], [r.failed for r in results]
    assert calls == {"reference": 2, "nesting": 2}
    assert verify_threads == {workers.cores()}  # verification runs with every core this process has
    assert all(a.verify_seconds and a.verify_seconds > 0 for r in results for a in r.manifest.artefacts)

    for name, target in (("jetson", "jetson"), ("host", str(host))):
        pipeline.convert(replace(opts, target=target, out=tmp_path / "alone" / name))
        assert _artefacts(tmp_path / "together" / name) == _artefacts(tmp_path / "alone" / name)
    assert calls == {"reference": 2 + 4, "nesting": 2 + 2}  # alone: once per head count and target


def test_a_manifest_written_before_verify_seconds_still_reads(checkpoint: Path, host: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    pipeline.convert(ConvertOptions(checkpoint=checkpoint, target=str(host), out=out, heads="3", jobs=1))
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["artefacts"][0].pop("verify_seconds") > 0
    assert Manifest.from_dict(doc).artefacts[0].verify_seconds is None


def test_the_cli_converts_a_list_of_targets_and_says_how_many_workers(checkpoint: Path, host: Path,
                                                                      tmp_path: Path) -> None:
    result = CliRunner().invoke(convert, ["-c", str(checkpoint), "-t", f"jetson,{host}", "-o", str(tmp_path),
                                          "--heads", "3,12", "--layout", "full"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("converting 6 artefacts with "))
    n = int(line.split(" with ")[1].split()[0])
    assert 1 <= n <= workers.cores() and "default --jobs" in line
    assert [len(read_manifest(tmp_path / name).artefacts) for name in ("jetson", "host")] == [4, 2]


@pytest.mark.parametrize("targets, expected", [
    (["jetson,pi5"], "unknown target 'pi5'"),
    (["jetson", "jetson"], "target 'jetson' is given twice in --target"),
    (["jetson,"], "has an empty name; separate targets with single commas"),
])
def test_a_bad_target_list_fails_in_one_line_and_writes_nothing(checkpoint: Path, tmp_path: Path,
                                                                targets: list[str], expected: str) -> None:
    out = tmp_path / "bundles"
    args = ["-c", str(checkpoint), "-o", str(out)] + [arg for t in targets for arg in ("-t", t)]
    result = CliRunner().invoke(convert, args)
    assert result.exit_code != 0 and expected in result.output, result.output
    assert result.output.strip().count("\n") == 0 and result.output.startswith("Error: ")
    assert not out.exists()


def test_default_jobs_are_bounded_by_cores_memory_and_work(monkeypatch: pytest.MonkeyPatch) -> None:
    model = 350 * 2**20  # b16's fp32 weights
    monkeypatch.setattr(workers, "cores", lambda: 8)
    monkeypatch.setattr(workers, "available_bytes", lambda: 3 * workers.worker_bytes(model) + 1)
    assert workers.choose_jobs(None, 20, model).n == 3  # memory for 3 of the 8 cores
    assert workers.choose_jobs(None, 2, model).n == 2  # only 2 artefacts to make
    assert workers.choose_jobs(12, 20, model).n == 12  # an explicit --jobs wins
    monkeypatch.setattr(workers, "available_bytes", lambda: 2**20)
    assert workers.choose_jobs(None, 20, model).n == 1  # never below one
    monkeypatch.setattr(workers, "available_bytes", lambda: 2**50)
    assert workers.choose_jobs(None, 20, model).n == 8  # never more than the cores


def test_the_memory_allowance_covers_the_peak_measured_for_b16_and_for_digits() -> None:
    from hydra_edge.model.sizes import subnet_size

    gib = 2**30
    for name, peak in (("b16", 6.45 * gib), ("digits", 0.72 * gib)):  # the largest measured worker peaks (workers.py)
        cfg = preset(name)
        assert peak <= workers.worker_bytes(4 * subnet_size(cfg, cfg.num_heads).params) <= 1.1 * peak + 0.1 * gib


def test_ctrl_c_while_converting_several_targets_leaves_every_bundle_whole(checkpoint: Path, host: Path,
                                                                           tmp_path: Path) -> None:
    """SIGINT once the first artefact lands: in each bundle every artefact file is in its manifest,
    no temporary file is left, and a re-run converts only the rest."""
    args = ("convert", "-c", checkpoint, "-t", f"{host},jetson", "-o", tmp_path, "--heads", "3-6",
            "--layout", "full", "-j", 2)
    proc = subprocess.Popen(cli_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not list(tmp_path.glob("*/vit_h*.onnx")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "Traceback" not in output, output
    made = 0
    for name in ("host", "jetson"):
        files = {p.name for p in (tmp_path / name).glob("vit_h*.onnx")}
        assert files == {a.file for a in read_manifest(tmp_path / name).artefacts}, output
        assert not list((tmp_path / name).glob(".*.tmp"))
        made += len(files)
    assert 1 <= made < 12, output
    opts = ConvertOptions(checkpoint=checkpoint, target="", out=tmp_path, heads="3-6", layout="full")
    results = pipeline.convert_targets(pipeline.targets_options(opts, [str(host), "jetson"]))
    assert sum(len(r.skipped) for r in results) == made and sum(len(r.converted) for r in results) == 12 - made
    assert not any(r.failed for r in results)
