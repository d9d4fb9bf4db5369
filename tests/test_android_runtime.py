"""The APK's own ExecuTorch runtime (its x86_64 build, patched only in its link tables) run on this host.

Every head count of a real android bundle, full and compact (the compact one rebuilt as the app rebuilds it),
is run in it on its golden inputs and checked under the manifest's tolerance, as android-app does before it
packages; a program that runtime refuses, aborts on or answers otherwise stops the build in one line naming
its head count. What this cannot show: the arm64 kernels a phone runs, Android's framework.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from support.android_runtime import SPOILED, shipped_parts, with_program
from support.compact import android_bundle

from hydra_edge.android import host_runtime
from hydra_edge.records.manifest import read_manifest

pytestmark = pytest.mark.slow  # converts two android bundles


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
            # the same program in executorch 1.5.1 on the host gave the same answers, to float rounding
            assert h["max_abs_diff"] == pytest.approx(tolerance["host_max_abs_diff"], abs=1e-6)
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
