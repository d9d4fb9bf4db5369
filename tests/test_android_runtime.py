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
import random
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
from hydra_edge.calibration_plan import Q, StopRule, Tally, order_ranks
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
    plan = {"within": 0.05, "min_s": 0.05, "cap_s": 1.5, "block_s": 0.01, "block_warmup": 1, "first_round": 3}
    done = host_app(app, "BenchMain", [bundle, tmp_path / "rebuilt", tmp_path / "bench.jsonl", 5, 1, 0,
                                       json.dumps(plan)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    manifest = read_manifest(bundle)
    assert done.stdout.splitlines()[:2] == [f"timing {a.id}" for a in manifest.artefacts], done.stdout
    lines = (tmp_path / "bench.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["device", "loaded", "loaded"] and kinds[-1] == "done" and kinds.count("result") == 2, lines
    rounds = [e for e in events if e["event"] == "round"]
    assert [r["round"] for r in rounds] == list(range(3, 3 + len(rounds)))  # numbered from the plan's first
    assert all(r["gate"]["outcome"] == "ready" for r in rounds)  # a cool phone: each round starts at once
    results = {e["heads"]: e for e in events if e["event"] == "result"}
    for a in manifest.artefacts:  # timed in rounds until its p90 was known (or its 1.5 s ran out)
        event = results[a.heads]
        assert (event["heads"], event["artefact"], event["sha256"], event["runner"]) == (a.heads, a.id, a.sha256, "app")
        assert event["status"] == "ok" and event["golden"]["passed"], event
        assert event["stopped"] in ("interval", "cap", "runs"), event
        lat, blocks = event["latency"], event["blocks"]
        assert lat["count"] >= 5 and lat["count"] == sum(len(b["latencies_ms"]) for b in blocks)
        assert [b["round"] for b in blocks] == [r["round"] for r in rounds if a.heads in r["order"]]
        if event["stopped"] == "interval":
            assert (1 - 0.05) * lat["p90_ms"] <= lat["p90_low_ms"] <= lat["p90_ms"] <= lat["p90_high_ms"] \
                <= (1 + 0.05) * lat["p90_ms"]
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
    assert [r.round for r in record.rounds] == [r["round"] for r in rounds] and all(r.p90_interval_ms or
                                                                                   r.stopped == "cap" for r in record.results)
    assert "rounds" in record.settings


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


def _plan_cases(rng: random.Random, n: int) -> list[dict]:
    """Generated stop-rule inputs: plans within calibrate's bounds, blocks of 1-60 timings from skewed,
    heavy-tailed and tied distributions (equal timings, a clock's 1 µs steps), spent times with overheads."""
    cases = []
    for _ in range(n):
        base = rng.choice([1e-4, 1e-3, 0.02])
        draw = rng.choice([lambda: base * rng.lognormvariate(0, 0.05), lambda: base * rng.lognormvariate(0, 0.5),
                           lambda: base, lambda: round(base * rng.uniform(1, 1.2), 6),
                           lambda: base * (1 + rng.paretovariate(2.0))])
        blocks = []
        for _ in range(rng.randint(1, 40)):
            latencies = [draw() for _ in range(rng.randint(1, 60))]
            blocks.append({"latencies_s": latencies, "spent_s": sum(latencies) * rng.uniform(1.0, 1.5)})
        cases.append({"plan": {"within": rng.choice([0.01, 0.05, 0.1, 0.2]), "min_s": rng.choice([0, 0.01, 0.1, 1]),
                               "cap_s": rng.choice([0, 0.05, 0.5, 3])},
                      "min_runs": rng.choice([1, 5, 50, 100]), "blocks": blocks})
    spread = [{"latencies_s": [rng.choice([1e-3, 2e-3]) * rng.uniform(1, 1.5) for _ in range(997)], "spent_s": 1.0}
              for _ in range(32)]  # never within ±0.1 %: it stops at the most runs kept, on both sides
    return cases + [{"plan": {"within": 0.001, "min_s": 0, "cap_s": 1e9}, "min_runs": 1, "blocks": spread}]


def test_the_apps_plan_stops_and_bounds_each_head_count_as_pythons_does(
        app: tuple[host_runtime.HostRuntime, list[Path]], tmp_path: Path) -> None:
    """Bench mode's Rounds against calibration_plan: the interval's ranks for every run count to 5,000 at the
    rule's and the record's levels, and 1,000 generated block sequences (and one past the most runs kept) fed
    to both Tallies: the same verdict after every block, the same interval and p90."""
    cases = _plan_cases(random.Random(43), 1000)
    given = tmp_path / "cases.json"
    given.write_text(json.dumps({"ranks_up_to": 5000, "levels": ["0.97", "0.95"], "cases": cases}))
    _, classpath = app
    done = subprocess.run(["java", "-cp", ":".join(map(str, classpath)), "org.hydraedge.demo.PlanMain", str(given)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    java = json.loads(done.stdout)
    for level in ("0.97", "0.95"):
        python = [list(r) if (r := order_ranks(n, Q, float(level))) else None for n in range(5001)]
        differ = [n for n in range(5001) if python[n] != java["ranks"][level][n]]
        assert not differ, (level, differ[:5], [(python[n], java["ranks"][level][n]) for n in differ[:5]])
    stops = 0
    for case, theirs in zip(cases, java["cases"]):
        rule = StopRule(within=case["plan"]["within"], min_runs=case["min_runs"], min_s=case["plan"]["min_s"],
                        cap_s=case["plan"]["cap_s"])
        tally, verdicts = Tally(3), []
        for i, block in enumerate(case["blocks"]):
            tally.add(i + 1, block["latencies_s"], block["spent_s"])
            verdicts.append(tally.judge(rule))
        assert verdicts == theirs["stopped"], case
        ours = tally.latency()
        for key in ("count", "p50_ms", "p90_ms", "p99_ms", "min_ms", "max_ms", "p90_low_ms", "p90_high_ms"):
            assert ours[key] == theirs["latency"][key], (key, case)
        assert ours["timed_s"] == pytest.approx(theirs["latency"]["timed_s"], rel=1e-12)
        stops += verdicts[-1] is not None
    assert 200 < stops < 1001 and java["cases"][-1]["stopped"][-1] == "runs"  # every verdict was compared


@pytest.mark.parametrize("plan, why", [("[1]", ""),
                                       ('{"within": 0}', "within must be over 0"),
                                       ('{"cap_s": -1}', "every figure must be finite and not negative"),
                                       ('{"first_round": 0}', "first_round at least 1")])
def test_a_plan_that_is_no_plan_is_the_bench_files_fatal_line(plan: str, why: str, app: tuple[host_runtime.HostRuntime,
                                                                                                list[Path]],
                                                              bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(bundles["full"], bundle, ignore=shutil.ignore_patterns(".lock", "logs"))
    phone_table(bundle, bundle / "lut.json", budget_ms=50.0)
    done = host_app(app, "BenchMain", [bundle, tmp_path / "rebuilt", tmp_path / "bench.jsonl", 5, 1, 0, plan],
                    tmp_path)
    (line,) = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert line["event"] == "fatal" and line["message"].startswith("bench mode's plan is not one calibrate sends (")
    assert why in line["message"] and line["message"].endswith("start it with hydra-edge calibrate --runner app"), line
