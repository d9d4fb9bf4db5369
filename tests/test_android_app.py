"""hydra-edge android-app: a real APK from a small android bundle, checked with apksigner and aapt; bad input refused.

The bundle is compact (3 heads as a recipe over the 12 heads' .pte): the APK must carry that one weight
set, and its DEX must reach the switcher library (Switcher, Rebuild) and no invoke-custom.

The APK is built as a user builds it (javac against Android's framework classes, dx, aapt, zipalign,
apksigner) and inspected, never launched: there is no phone or emulator here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.android_runtime import phone_table
from support.compact import android_bundle
from support.tables import fake_bundle

from hydra_edge.android import apk, dex
from hydra_edge.atomic import sha256_file
from hydra_edge.commands.android_app import android_app
from hydra_edge.records.manifest import bundle_files, read_manifest

pytestmark = pytest.mark.slow  # converts a bundle and builds an APK


def lut_for(bundle: Path, out: Path) -> Path:
    """lut.json for ``bundle`` whose 12 ms budget only the fewest heads meet."""
    return phone_table(bundle, out, budget_ms=12.0)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A depth-1 digits model (random weights) as an android bundle: 3 heads compact over 12 heads' .pte."""
    root = tmp_path_factory.mktemp("android")
    android_bundle(root, "compact")
    lut_for(root / "bundle", root / "lut.json")
    return root / "bundle"


@pytest.fixture(autouse=True)
def _own_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The signing key goes to a config folder of the test's own, not the user's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "config"))


def build(bundle: Path, lut: Path, out: Path) -> tuple[int, str]:
    result = CliRunner().invoke(android_app, ["--bundle", str(bundle), "--lut", str(lut), "--out", str(out)])
    return result.exit_code, result.output


def badging(path: Path) -> str:
    return subprocess.run(["aapt", "dump", "badging", str(path)], capture_output=True, text=True, check=True).stdout


def test_the_apk_is_signed_installable_and_carries_the_bundle_the_manifest_names(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.apk"
    code, output = build(bundle, bundle.parent / "lut.json", out)
    assert code == 0, output
    assert f"wrote {out}" in output and [p.name for p in tmp_path.iterdir()] == ["demo.apk"]
    assert "runtime check: 3 heads: max |diff|" in output and "runtime check: 12 heads: max |diff|" in output
    verify = subprocess.run(["apksigner", "verify", "--print-certs", "-v", str(out)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    assert "Verified using v2 scheme (APK Signature Scheme v2): true" in verify.stdout
    assert "Signer #1 certificate DN: CN=hydra-edge demo" in verify.stdout

    info = badging(out)
    assert "package: name='org.hydraedge.demo'" in info
    assert "sdkVersion:'26'" in info and "targetSdkVersion:'29'" in info
    assert "launchable-activity: name='org.hydraedge.demo.MainActivity'" in info
    assert "native-code: 'arm64-v8a' 'x86_64'" in info
    assert "uses-permission" not in info  # thermal status, battery and app-private files need none

    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        for abi in ("arm64-v8a", "x86_64"):
            assert {f"lib/{abi}/libexecutorch.so", f"lib/{abi}/libfbjni.so", f"lib/{abi}/libc++_shared.so"} <= names
        assert z.read("lib/arm64-v8a/libexecutorch.so")[:20] == b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\x03\x00\xb7\x00"
        dex_bytes = z.read("classes.dex")
        assert dex_bytes[:4] == b"dex\n"
        for cls in (b"Lorg/hydraedge/demo/MainActivity;", b"Lorg/pytorch/executorch/Module;",
                    b"Lcom/facebook/jni/HybridData;", b"Lkotlin/Unit;", b"Lorg/hydraedge/core/"):
            assert cls in dex_bytes, cls

        def sha(name: str) -> str:
            return hashlib.sha256(z.read(name)).hexdigest()

        manifest = json.loads(z.read("assets/bundle/manifest.json"))
        lut = json.loads(z.read("assets/lut.json"))
        assert sha("assets/bundle/manifest.json") == sha256_file(bundle / "manifest.json")
        assert lut["bundle"]["manifest_sha256"] == sha("assets/bundle/manifest.json")
        assert sha("assets/lut.json") == sha256_file(bundle.parent / "lut.json")
        for a in manifest["artefacts"]:
            stored = (a["file"], a["sha256"]) if a["compact"] is None else (a["compact"]["recipe"], a["compact"]["sha256"])
            assert sha(f"assets/bundle/{stored[0]}") == stored[1]
            assert sha(f"assets/bundle/{a['golden']['file']}") == a["golden"]["sha256"]
        largest = manifest["artefacts"][-1]
        assert largest["heads"] == 12 and z.read(f"assets/bundle/{largest['file']}")[4:8] == b"ET12"
        assert {c["sha256"] for c in lut["candidates"]} <= {a["sha256"] for a in manifest["artefacts"]}

        # every head count was run in the APK's own x86_64 runtime before packaging, and that is recorded
        check = json.loads(z.read("assets/runtime-check.json"))
        assert check["checked"] and [(h["heads"], h["compact"]) for h in check["head_counts"]] == [(3, True), (12, False)]
        assert check["libraries"] == {f"lib/x86_64/{so}": sha(f"lib/x86_64/{so}")
                                      for so in ("libexecutorch.so", "libfbjni.so", "libc++_shared.so")}
        assert all(h["max_abs_diff"] <= h["tolerance"]["max_abs_diff"] for h in check["head_counts"])

        # one weight set: the compact bundle's own files, never a whole file per head count
        compact = [a for a in manifest["artefacts"] if a["compact"] is not None]
        assert [a["heads"] for a in compact] == [3]
        assets = {n[len("assets/bundle/"):] for n in names if n.startswith("assets/bundle/")}
        assert assets == {"manifest.json", *bundle_files(bundle, read_manifest(bundle).artefacts)}
        assert len([p for p in bundle.rglob("*.pte")]) == 1  # convert wrote one weight set, and it is carried
        assert [n for n in assets if n.endswith(".pte")] == [largest["file"]]
        assert not any(a["file"] in assets for a in compact)
        recipe = json.loads(z.read(f"assets/bundle/{compact[0]['compact']['recipe']}"))
        assert recipe["source"]["file"] == largest["file"] and recipe["skeleton"]["file"] in assets

    # the DEX: the app goes through the switcher library, and nothing it reaches is an invoke-custom
    code = dex.read_dex(dex_bytes)
    called = {target for c in code.classes.values() if c.name.startswith("Lorg/hydraedge/demo/")
              for m in c.methods.values() for op, i in code.instructions(m) if 0x6E <= op <= 0x78
              for target in [code.methods[i]]}
    for cls, name in [("Switcher$Companion", "open"), ("Switcher", "poll"), ("Switcher", "observe"),
                      ("Switcher", "loadFailed"), ("Switcher", "reasons"), ("Rebuild", "artefactBytes")]:
        assert any(t[0] == f"Lorg/hydraedge/core/{cls};" and t[1] == name for t in called), (cls, name)
    sites = dex.call_sites(code)
    assert code.call_site_ids == len([s for s in sites if s[1].startswith("invoke-custom")])
    assert not [s for s in sites if not s[0][0].startswith("Lkotlin/")], sites  # app, library, ExecuTorch: none
    parents: dict = {}
    assert dex.reachable_call_sites(code, parents=parents) == []
    assert {"Lorg/hydraedge/demo/MainActivity;", "Lorg/hydraedge/core/Rebuild;", "Lkotlin/collections/CollectionsKt___CollectionsKt;"} \
        <= {k[0] for k in parents}  # the analysis did walk into the library and the stdlib


def test_the_dex_check_finds_a_lambda_the_app_reaches(tmp_path: Path) -> None:
    """The same check on a class with a Java lambda (javac: invokedynamic, dx: invoke-custom) is not empty,
    and names the path to it; a lambda in a stdlib-like class nobody calls is not reached."""
    src = tmp_path / "src"
    (src / "org" / "hydraedge" / "demo").mkdir(parents=True)
    (src / "kotlin").mkdir()
    (src / "kotlin" / "Unused.java").write_text(
        "package kotlin; public class Unused { public static Runnable r() { return () -> {}; } }")
    (src / "kotlin" / "Used.java").write_text(
        "package kotlin; public class Used { public static Runnable r() { return () -> {}; } }")
    (src / "org" / "hydraedge" / "demo" / "A.java").write_text(
        "package org.hydraedge.demo; public class A { public void go() { kotlin.Used.r().run(); } }")
    classes = tmp_path / "classes"
    subprocess.run(["javac", "--release", "8", "-d", str(classes), *map(str, src.rglob("*.java"))], check=True)
    out = tmp_path / "classes.dex"
    subprocess.run(["java", "-cp", str(apk.maven_part("dx")), "com.android.dx.command.Main", "--dex",
                    "--min-sdk-version=26", f"--output={out}", str(classes)], check=True)
    code = dex.read_dex(out.read_bytes())
    assert code.call_site_ids == 2 and len(dex.call_sites(code)) == 2
    parents: dict = {}
    found = dex.reachable_call_sites(code, parents=parents)
    assert [(k[0], op) for k, op in found] == [("Lkotlin/Used;", "invoke-custom")]
    assert dex.path_to(parents, found[0][0]) == ["org/hydraedge/demo/A.go", "kotlin/Used.r"]
    with pytest.raises(apk.HydraEdgeError, match="invoke-custom in kotlin/Used.r, reached by org/hydraedge/demo/A.go"):
        apk.check_dex(out)


def expect_refused(bundle: Path, lut: Path, out: Path, *words: str) -> None:
    code, output = build(bundle, lut, out)
    assert code != 0
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    for word in words:
        assert word in lines[0], output
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*")), list(out.parent.iterdir())


def test_a_bundle_for_another_target_is_refused(bundle: Path, tmp_path: Path) -> None:
    other = fake_bundle(tmp_path / "rpi", [3, 12])
    expect_refused(other, bundle.parent / "lut.json", tmp_path / "out" / "demo.apk", "'pi'", "onnx",
                   "--target android")


def test_a_table_for_another_bundle_is_refused(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["max_drop"] = 2.0  # another manifest: the table's manifest sha256 no longer matches
    (copy / "manifest.json").write_text(json.dumps(doc))
    expect_refused(copy, bundle.parent / "lut.json", tmp_path / "out" / "demo.apk", "another bundle", "hydra-edge lut")


def test_a_tampered_artefact_is_refused(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    pte = next(copy.glob("*.pte"))
    data = bytearray(pte.read_bytes())
    data[-100] ^= 0xFF
    pte.write_bytes(bytes(data))
    expect_refused(copy, bundle.parent / "lut.json", tmp_path / "out" / "demo.apk", pte.name, "sha256")


def test_a_missing_tool_is_named_with_its_package(bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in apk.TOOLS:
        if tool != "aapt":
            (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tools))
    expect_refused(bundle, bundle.parent / "lut.json", tmp_path / "out" / "demo.apk", "aapt not found",
                   "apt-get install aapt")
