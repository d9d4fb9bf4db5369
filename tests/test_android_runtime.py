"""The APK's own ExecuTorch runtime (its x86_64 build, patched only in its link tables) run on this host.

Every head count of a real android bundle, full and compact (the compact one rebuilt as the app rebuilds it),
is run in it on its golden inputs and checked under the manifest's tolerance, as android-app does before it
packages; a program that runtime refuses, aborts on or answers otherwise stops the build in one line naming
its head count.

The app's own classes (BundleStore, HeadSwitch, Engines, Probe, the switcher library) then start the demo in
that runtime on bundles whose largest head count is a program the runtime cannot run (cut short, garbled, a
delegate it lacks, another model's): the runtime ends the probe's process, never the app's, and the app runs
the fewest heads with the switcher's "load failed: ..." reason, as a board's switcher does. On a phone the
probe's process is ProbeService's (android:process=":probe"); here it is a child JVM, so what this shows is
the runtime's behaviour and the app's answer to it, not Android's service binding.
Bench mode runs the same way (MainActivity.runBench without its views: Bench, Engines, BundleStore, scripted
readings for the sensors), and calibrate --runner app reads its lines back through the adb stand-in.
What none of this can show: the arm64 kernels a phone runs, Android's framework.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.adbd import AdbDevice
from support.android_runtime import SPOILED, app_classpath, other_model_program, phone_table, shipped_parts, with_program
from support.compact import android_bundle

from hydra_edge.android import host_runtime
from hydra_edge.commands.calibrate import calibrate
from hydra_edge.measure.journal import read_calibration
from hydra_edge.records.manifest import read_manifest

pytestmark = pytest.mark.slow  # converts two android bundles, builds the switcher library, starts a stand-in phone


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same depth-1 digits model (3 and 12 heads) as full and compact android bundles."""
    out = {}
    for layout in ("full", "compact"):
        root = tmp_path_factory.mktemp(f"android-{layout}")
        out[layout] = android_bundle(root, layout)
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def verify(bundle: Path, cache: Path) -> tuple[dict, list[str]]:
    said: list[str] = []
    record = host_runtime.verify(bundle, read_manifest(bundle).artefacts, shipped_parts(), cache, said.append)
    return record, said


def test_every_head_count_runs_in_the_shipped_runtime_within_tolerance(bundles: dict[str, Path], cache: Path) -> None:
    parts = shipped_parts()
    with zipfile.ZipFile(parts.fbjni_aar) as aar:
        shipped = {"lib/x86_64/libexecutorch.so": hashlib.sha256(parts.executorch_library.read_bytes()).hexdigest(),
                   **{f"lib/x86_64/{n}": hashlib.sha256(aar.read(f"jni/x86_64/{n}")).hexdigest()
                      for n in ("libfbjni.so", "libc++_shared.so")}}
    for layout, bundle in bundles.items():
        record, said = verify(bundle, cache)
        manifest = read_manifest(bundle)
        assert record["checked"] and record["libraries"] == shipped, record
        counts = record["head_counts"]
        assert [h["heads"] for h in counts] == [3, 12]
        assert [h["compact"] for h in counts] == ([False, False] if layout == "full" else [True, False])
        for h, a in zip(counts, manifest.artefacts):
            assert (h["artefact"], h["sha256"]) == (a.id, a.sha256)
            tolerance = a.golden["tolerance"]
            assert 0 < h["max_abs_diff"] <= tolerance["max_abs_diff"] and h["top1_agreement"] >= tolerance["min_top1_agreement"]
        shown = [line for line in said if "heads:" in line]
        assert [line.split(":")[1].strip() for line in shown] == ["3 heads", "12 heads"], said
        assert "runtime's log" not in " ".join(said)
        assert "I/ExecuTorch" in (bundle / "logs" / "android-runtime.log").read_text()  # its chatter, kept
    # made once for both bundles, keyed by its inputs
    made = list((cache / "host-runtime").iterdir())
    assert len(made) == 1 and (made[0] / "ready").is_file(), made


# what the runtime said before it ended the process (fbjni cannot see the C++ exception libexecutorch.so throws
# with its own C++ runtime, and asserts); the garbled program crashes inside Program::load, which the JVM reports
WHY = {"truncated": "E/ExecuTorch: File size is too small. Expected file size from extended header is",
       "garbled": "a native crash in executorch::runtime::Program::load (libexecutorch.so)",
       "foreign delegate": "E/ExecuTorch: Backend VulkanBackend is not registered."}


def test_the_patched_runtime_is_made_once_per_set_of_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    first = host_runtime.prepare(shipped_parts(), tmp_path, said.append)
    again = host_runtime.prepare(shipped_parts(), tmp_path, said.append)
    assert again == first and len(said) == 1 and said[0].startswith("runtime check: preparing")
    monkeypatch.setattr(host_runtime, "RENAMED", (*host_runtime.RENAMED, "fgetc"))  # another patching: another key
    other = host_runtime.prepare(shipped_parts(), tmp_path, said.append)
    assert other.folder != first.folder and len(said) == 2
    assert sorted(p.name for p in (tmp_path / "host-runtime").iterdir()) == sorted([first.folder.name, other.folder.name])
    assert (first.folder / "ready").is_file() and (other.folder / "ready").is_file()  # nothing half-made left


@pytest.mark.parametrize("kind", sorted(SPOILED))
def test_a_program_the_shipped_runtime_cannot_run_stops_the_build_naming_its_head_count(
        kind: str, bundles: dict[str, Path], cache: Path, tmp_path: Path) -> None:
    """Its manifest record matches it, so every other check passes; only running it in the runtime tells.
    The runtime ends the process (an abort, or a segfault for the garbled one): one line, the head count."""
    full = bundles["full"]
    twelve = read_manifest(full).artefacts[1]
    bundle = with_program(full, tmp_path / "bundle", 12, SPOILED[kind]((full / twelve.file).read_bytes()))
    with pytest.raises(host_runtime.RuntimeRefused) as refused:
        verify(bundle, cache)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"12 heads ({twelve.id}): the APK's ExecuTorch runtime ended the "
                                                f"process (signal SIGABRT: {WHY[kind]}")
    assert "leave this head count out (--heads)" in line and str(bundle / "logs" / "android-runtime.log") in line


def test_outputs_outside_the_manifests_tolerance_stop_the_build_naming_the_head_count(
        bundles: dict[str, Path], cache: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(bundles["full"], bundle)
    doc = json.loads((bundle / "manifest.json").read_text())
    doc["artefacts"][0]["golden"]["tolerance"]["max_abs_diff"] = 1e-6
    (bundle / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(host_runtime.RuntimeRefused, match=r"^3 heads \(h3_executorch_int8-dynamic\): in the APK's "
                       r"ExecuTorch runtime its outputs leave the manifest's tolerance: max \|diff\| 0\.00\d+ "
                       r"\(allowed 1e-06\)"):
        verify(bundle, cache)


def test_another_host_says_so_in_one_line_and_goes_on(bundles: dict[str, Path], cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_runtime.platform, "machine", lambda: "aarch64")
    record, said = verify(bundles["full"], cache)
    assert record == {"runtime": shipped_parts().describe(), "checked": False,
                      "skipped": "this host is Linux aarch64; the APK's runtime runs on an x86_64 Linux host"}
    assert said == ["runtime check: skipped: this host is Linux aarch64; the APK's runtime runs on an x86_64 Linux "
                    "host (the APK is built unchecked in its own runtime)"]


@pytest.fixture(scope="module")
def app(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[host_runtime.HostRuntime, list[Path]]:
    """The runtime, and the app's classes with the host drivers (tests/support/android_app) to run beside it."""
    runtime = host_runtime.prepare(shipped_parts(), cache, lambda line: None)
    return runtime, app_classpath(runtime, tmp_path_factory.mktemp("app-classes"))


# the runtime's last error line before the probe's process ended (the garbled program crashes without one)
ENDED = {"truncated": ": E/ExecuTorch: File size is too small. Expected file size from extended header is",
         "garbled": ")", "foreign delegate": ": E/ExecuTorch: Backend VulkanBackend is not registered.)",
         "another model's": ": E/ExecuTorch: Error resizing tensor at input 0)"}
PROGRAMS = {**SPOILED, "another model's": lambda program: other_model_program(), "intact": lambda program: program}


@pytest.mark.parametrize("kind", list(PROGRAMS))
def test_a_program_the_runtime_refuses_ends_the_probes_process_and_the_app_runs_the_fewest_heads(
        kind: str, app: tuple[host_runtime.HostRuntime, list[Path]], bundles: dict[str, Path], tmp_path: Path) -> None:
    runtime, classpath = app
    full = bundles["full"]
    twelve = read_manifest(full).artefacts[1]
    bundle = with_program(full, tmp_path / "bundle", 12, PROGRAMS[kind]((full / twelve.file).read_bytes()))
    phone_table(bundle, bundle / "lut.json", budget_ms=50.0)  # a cool, charging phone runs 12 heads
    probe = "\t".join(runtime.command("org/hydraedge/demo/ProbeMain", [], classpath))
    done = subprocess.run(runtime.command("org/hydraedge/demo/LoadFailover", [bundle, tmp_path / "rebuilt"], classpath),
                          env={**os.environ, "HYDRA_EDGE_PROBE": probe}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]  # the app's process lives on
    lines = done.stdout.splitlines()
    if kind == "intact":
        assert lines[0].startswith("ran 12 heads: class ") and lines[1:] == ["switch 12 heads: start"], lines
        return
    why = f"the ExecuTorch runtime ended its process loading {twelve.file} (exit 134{ENDED[kind]}"
    assert lines[0].startswith("ran 3 heads: class "), lines
    predicted, expected = lines[0].split("class ")[1].split(" (fp32 says ")
    assert predicted == expected.rstrip(")")  # the fewest heads really ran, in the same runtime
    assert lines[1].startswith(f"failed 12 heads cannot run: {why}"), lines
    assert lines[2] == "switch 12 heads: start" and lines[3].startswith(f"switch 12 -> 3 heads: load failed: {why}")
    assert len(lines) == 4, lines


def host_app(app: tuple[host_runtime.HostRuntime, list[Path]], main: str, args: list[object],
             cwd: Path) -> subprocess.CompletedProcess:
    """``main`` (a driver in tests/support/android_app) in the shipped runtime, its probes in child processes."""
    runtime, classpath = app
    probe = "\t".join(runtime.command("org/hydraedge/demo/ProbeMain", [], classpath))
    return subprocess.run(runtime.command(f"org/hydraedge/demo/{main}", [str(a) for a in args], classpath),
                          env={**os.environ, "HYDRA_EDGE_PROBE": probe}, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("layout", ["full", "compact"])
def test_bench_mode_runs_in_the_shipped_runtime_and_calibrate_reads_it_through_the_stand_in_phone(
        layout: str, app: tuple[host_runtime.HostRuntime, list[Path]], bundles: dict[str, Path], adb_device: AdbDevice,
        tmp_path: Path) -> None:
    """The app's bench mode writes its JSON lines on the host (a compact bundle's 3 heads rebuilt first), and
    calibrate --runner app takes them from the stand-in phone's bench file into a record, as from a phone."""
    bundle = tmp_path / "bundle"
    shutil.copytree(bundles[layout], bundle, ignore=shutil.ignore_patterns(".lock", "logs"))
    phone_table(bundle, bundle / "lut.json", budget_ms=50.0)  # the app's copied folder holds its table too
    done = host_app(app, "BenchMain", [bundle, tmp_path / "rebuilt", tmp_path / "bench.jsonl", 5, 1, 0], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    manifest = read_manifest(bundle)
    assert done.stdout.splitlines()[:2] == [f"timing {a.id}" for a in manifest.artefacts], done.stdout
    lines = (tmp_path / "bench.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["device", "result", "result", "done"], lines
    for event, a in zip(events[1:3], manifest.artefacts):
        assert (event["heads"], event["artefact"], event["sha256"], event["runner"]) == (a.heads, a.id, a.sha256, "app")
        assert event["status"] == "ok" and event["golden"]["passed"] and event["latency"]["count"] == 5, event
        assert event["state_before"]["android_thermal_status"] == 0 and event["state_before"]["charging"] is True
    if layout == "compact":  # rebuilt once, as the app's cache dir keeps it, then probed and timed
        assert [p.name for p in (tmp_path / "rebuilt").iterdir()] == [f"{manifest.artefacts[0].sha256}.pte"]

    phone = adb_device.phone
    phone.stop_app()
    shutil.rmtree(phone.dir, ignore_errors=True)
    phone.installed("org.hydraedge.demo").parent.mkdir(parents=True)
    phone.installed("org.hydraedge.demo").write_bytes(b"an installed app")
    (phone.dir / "bench-lines").write_text("".join(line + "\n" for line in lines))  # what am start's app writes
    try:
        result = CliRunner().invoke(calibrate, [str(a) for a in (
            "--bundle", bundle, "--serial", adb_device.serial, "--adb-port", adb_device.server.port,
            "--out", tmp_path / "phone.json", "--runner", "app", "--runs", 5, "--warmup", 1)])
    finally:
        phone.stop_app()
    assert result.exit_code == 0, result.output
    record = read_calibration(tmp_path / "phone.json")
    assert [(r.heads, r.status, r.runner) for r in record.results] == [(3, "ok", "app"), (12, "ok", "app")]
    assert record.device["model"].startswith("desktop JVM") and record.settings["runner"] == "app"


def test_the_demo_loop_acts_on_the_runtimes_own_timings_and_reads_its_correction_back(
        app: tuple[host_runtime.HostRuntime, list[Path]], bundles: dict[str, Path], tmp_path: Path) -> None:
    """The demo's steps (DemoLoop) on a compact bundle whose table believes 12 heads take 0.002 ms: the runtime's
    real timings miss the 0.01 ms budget, the latency loop caps the app at 3 heads after 10 s of misses, 3 heads
    are rebuilt on first use, and the correction it saved starts the next run at 3 heads."""
    bundle = tmp_path / "bundle"
    shutil.copytree(bundles["compact"], bundle, ignore=shutil.ignore_patterns(".lock", "logs"))
    phone_table(bundle, bundle / "lut.json", budget_ms=0.01, latencies_ms=(0.001, 0.002))
    three = read_manifest(bundle).artefacts[0]
    first = host_app(app, "DemoMain", [bundle, tmp_path / "rebuilt", 16], tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    frames = [line for line in first.stdout.splitlines() if line.startswith("frame ")]
    switches = [line for line in first.stdout.splitlines() if line.startswith("switch ")]
    assert [f.split(":")[0] for f in frames] == ["frame 12 heads", "frame 3 heads"], first.stdout
    assert all(f.split("class ")[1].split(" (fp32 says ")[0] == f.split("fp32 says ")[1].split(")")[0] for f in frames)
    assert switches[0] == "switch 12 heads: start" and len(switches) == 2, switches
    assert switches[1].startswith("switch 12 -> 3 heads: latency p90 ") and "over budget 0.01 ms for 10 s at 12 heads" \
        in switches[1], switches
    assert [p.name for p in (tmp_path / "rebuilt").iterdir()] == [f"{three.sha256}.pte"]  # rebuilt on first use
    correction = json.loads((bundle / "lut.correction.json").read_text())
    assert [c["heads"] for c in correction["learned"]] == [12] and correction["learned"][0]["p90_ms"] > 0.01

    again = host_app(app, "DemoMain", [bundle, tmp_path / "rebuilt", 2], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    lines = again.stdout.splitlines()
    assert lines[0].startswith("frame 3 heads:"), lines
    started = [line for line in lines if line.startswith("switch ")]
    assert len(started) == 1 and started[0].startswith("switch 3 heads: start; latency correction saved ") and \
        started[0].endswith("over budget 0.01 ms: at most 3 heads"), started
